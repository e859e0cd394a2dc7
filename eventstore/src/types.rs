use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// What the writer believes a stream's version to be before its append.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "version")]
pub enum ExpectedVersion {
    /// Append whatever the stream's version is.
    Any,
    /// The stream must not exist yet.
    NoStream,
    /// The stream's version must be exactly this (0 means no stream yet).
    Exact(u64),
}

impl ExpectedVersion {
    pub(crate) fn admits(self, actual: u64) -> bool {
        match self {
            ExpectedVersion::Any => true,
            ExpectedVersion::NoStream => actual == 0,
            ExpectedVersion::Exact(v) => actual == v,
        }
    }
}

impl fmt::Display for ExpectedVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpectedVersion::Any => f.write_str("any version"),
            ExpectedVersion::NoStream => f.write_str("no stream"),
            ExpectedVersion::Exact(v) => write!(f, "version {v}"),
        }
    }
}

/// An event to append. `event_id` makes retries idempotent: derive it from the
/// command that produced the event, not from a fresh random id per attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewEvent {
    pub event_id: Uuid,
    pub event_type: String,
    pub schema_version: u32,
    pub payload: Value,
    #[serde(default = "empty_object")]
    pub metadata: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

impl NewEvent {
    pub fn new(event_type: impl Into<String>, schema_version: u32, payload: Value) -> Self {
        NewEvent {
            event_id: Uuid::now_v7(),
            event_type: event_type.into(),
            schema_version,
            payload,
            metadata: empty_object(),
        }
    }

    pub fn with_id(mut self, event_id: Uuid) -> Self {
        self.event_id = event_id;
        self
    }

    pub fn with_metadata(mut self, metadata: Value) -> Self {
        self.metadata = metadata;
        self
    }
}

/// Events for one stream, appended only if the stream is at `expected`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamAppend {
    pub stream_id: String,
    pub expected: ExpectedVersion,
    pub events: Vec<NewEvent>,
}

impl StreamAppend {
    pub fn new(
        stream_id: impl Into<String>,
        expected: ExpectedVersion,
        events: Vec<NewEvent>,
    ) -> Self {
        StreamAppend {
            stream_id: stream_id.into(),
            expected,
            events,
        }
    }
}

/// Who is appending, checked by the database inside the append transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Writer {
    /// A decision: allowed only while `lease` is the current, unexpired lease.
    Leader(LeaseToken),
    /// An observed fact (usage) that any server may record, leader or not.
    /// Not fenced: refusing it during a handover would lose the observation.
    /// The instance is recorded in each event's metadata under `"writer"`.
    Observer { instance: String },
}

/// Proof of holding the append lease: the holder's name and the epoch the
/// database handed out when it was acquired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseToken {
    pub holder: String,
    pub epoch: u64,
}

/// A lease as granted or renewed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub token: LeaseToken,
    pub expires_at: DateTime<Utc>,
    /// The head of the log when the lease was granted: every event at or below
    /// it was written under an earlier epoch.
    pub head_at_grant: u64,
}

/// The lease as the store sees it now (`llmgw lease show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// The last holder; still named after it released or let the lease expire.
    pub holder: Option<String>,
    pub epoch: u64,
    /// None once released (or before anyone ever held it).
    pub expires_at: Option<DateTime<Utc>>,
    pub held: bool,
    pub head: u64,
}

impl LeaseInfo {
    /// The refusal of an append or renewal by a writer that is not the holder.
    pub(crate) fn fenced(self) -> crate::StoreError {
        crate::StoreError::Fenced {
            current_holder: self.holder,
            current_epoch: self.epoch,
        }
    }

    /// The refusal of an acquisition while someone else holds the lease.
    pub(crate) fn held(self) -> crate::StoreError {
        crate::StoreError::LeaseHeld {
            holder: self.holder.unwrap_or_default(),
            epoch: self.epoch,
            expires_at: self.expires_at.unwrap_or_default(),
        }
    }
}

/// An event as stored, with its place in the log and in its stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedEvent {
    pub position: u64,
    pub stream_id: String,
    pub stream_version: u64,
    pub event_id: Uuid,
    pub event_type: String,
    pub schema_version: u32,
    pub payload: Value,
    pub metadata: Value,
    /// The lease epoch current when the event was written.
    pub epoch: u64,
    pub recorded_at: DateTime<Utc>,
    /// sha256(previous hash ‖ canonical bytes of this event).
    #[serde(with = "hex_bytes")]
    pub hash: [u8; 32],
}

/// An event as a reader of the payload needs it (replaying views, catching
/// up a decision state): its place, identity, type and time, and the payload
/// as the stored JSON text, not yet parsed, so that the reader can decode it
/// straight into its own types. No metadata, epoch or hash: reading and
/// parsing those is most of the cost of a [`RecordedEvent`] that replay never
/// looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct EventText {
    pub position: u64,
    pub stream_id: String,
    pub stream_version: u64,
    pub event_id: Uuid,
    pub event_type: String,
    pub schema_version: u32,
    pub recorded_at: DateTime<Utc>,
    /// JSON text (PostgreSQL's rendering of the `jsonb`, or SQLite's stored
    /// canonical text): the same value, not necessarily the same bytes.
    pub payload: String,
}

/// What an append did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub first_position: u64,
    pub last_position: u64,
    /// Each stream of the batch with its version after the append.
    pub stream_versions: Vec<(String, u64)>,
    /// True when every event id was already in the log: nothing was written
    /// and the original positions are returned.
    pub deduplicated: bool,
}

/// Where a projection has got to. The event id lets a restarted projection
/// notice that it is ahead of the log that survived a failover or restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub position: u64,
    pub event_id: Option<Uuid>,
}

impl Default for Checkpoint {
    fn default() -> Self {
        Checkpoint::START
    }
}

impl Checkpoint {
    pub const START: Checkpoint = Checkpoint {
        position: 0,
        event_id: None,
    };

    pub fn after(event: &RecordedEvent) -> Self {
        Checkpoint {
            position: event.position,
            event_id: Some(event.event_id),
        }
    }
}

/// Counts for `llmgw events stats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub count: u64,
    pub head: u64,
    pub streams: u64,
    pub by_type: Vec<(String, u64)>,
}

impl Stats {
    pub(crate) fn from_counts(by_type: Vec<(String, i64)>, streams: i64, head: u64) -> Self {
        Stats {
            count: by_type.iter().map(|(_, n)| *n as u64).sum(),
            head,
            streams: streams as u64,
            by_type: by_type.into_iter().map(|(t, n)| (t, n as u64)).collect(),
        }
    }
}

/// The outcome of `verify`: the range checked and the first position whose
/// stored hash does not match its content, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub from: u64,
    pub to: u64,
    /// Events whose hash matched, before any break.
    pub checked: u64,
    pub first_mismatch: Option<u64>,
    /// The break is a position that is not there (a row deleted), not
    /// an event that does not match its hash.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub missing: bool,
    /// True when the range reached the head and the control row's chain head
    /// matched the last event's hash.
    pub head_matches: Option<bool>,
}

impl VerifyReport {
    pub fn is_ok(&self) -> bool {
        self.first_mismatch.is_none() && self.head_matches != Some(false)
    }
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(crate) fn serialize<S: Serializer>(bytes: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::hash::to_hex(bytes))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let text = String::deserialize(d)?;
        crate::hash::from_hex(&text).ok_or_else(|| D::Error::custom("expected 64 hex digits"))
    }
}

/// A projection's state as of a checkpoint. `state_version` is the view's
/// own format version: a snapshot written by another version is ignored.
///
/// `state` is the views as JSON text, serialised straight from them and
/// decoded straight into them: a snapshot of a large fleet is tens of
/// megabytes, and a `serde_json::Value` tree of it took several times
/// that in memory at the moment it was taken. Both stores keep it
/// zlib-compressed (`snapshot_zip.rs`) and give back the text they were
/// given; one they cannot decompress is no snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub checkpoint: Checkpoint,
    pub state_version: u32,
    pub state: String,
}
