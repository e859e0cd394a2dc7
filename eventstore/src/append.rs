//! The backend-independent half of an append: validating the batch, resolving
//! retries, checking expected versions and laying out positions and hashes,
//! for a group of appends written in one transaction ([`crate::group`]).
//! Backends run [`plan_group`] inside their locked transaction.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::{Appended, ExpectedVersion, Result, StoreError, StreamAppend, Writer, hash};

const MAX_STREAM_ID: usize = 256;
const MAX_EVENT_TYPE: usize = 128;

/// One caller's batch, validated and in canonical form, owned so that it can
/// wait in the group-commit queue: everything about it that does not depend
/// on the log's head, computed by the caller before it queues.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) writer: Writer,
    pub(crate) streams: Vec<PreparedStream>,
    pub(crate) event_ids: Vec<Uuid>,
    pub(crate) stream_ids: Vec<String>,
}

#[derive(Debug)]
pub(crate) struct PreparedStream {
    pub(crate) stream_id: String,
    pub(crate) expected: ExpectedVersion,
    pub(crate) events: Vec<PreparedEvent>,
}

#[derive(Debug)]
pub(crate) struct PreparedEvent {
    pub(crate) event_id: Uuid,
    pub(crate) event_type: String,
    pub(crate) schema_version: u32,
    /// Canonical JSON, as hashed and stored.
    pub(crate) payload: String,
    /// Canonical JSON, with an observer's instance already added.
    pub(crate) metadata: String,
}

impl Prepared {
    pub(crate) fn len(&self) -> usize {
        self.event_ids.len()
    }
}

/// An event already in the log that shares an id with the batch.
#[derive(Debug, Clone)]
pub(crate) struct Existing {
    pub(crate) event_id: Uuid,
    pub(crate) position: u64,
    pub(crate) stream_id: String,
    pub(crate) stream_version: u64,
}

/// One event laid out for writing: its place and hash.
#[derive(Debug)]
pub(crate) struct Row<'a> {
    pub(crate) position: u64,
    pub(crate) stream_id: &'a str,
    pub(crate) stream_version: u64,
    pub(crate) event: &'a PreparedEvent,
    pub(crate) hash: [u8; 32],
}

/// What a group's transaction writes, and each caller's answer once it
/// commits.
#[derive(Debug)]
pub(crate) struct Planned<'a> {
    pub(crate) rows: Vec<Row<'a>>,
    /// Every stream the rows touch, with its version after them.
    pub(crate) stream_versions: Vec<(&'a str, u64)>,
    pub(crate) head: u64,
    pub(crate) head_hash: [u8; 32],
    /// One per request, in order.
    pub(crate) outcomes: Vec<Result<Appended>>,
}

pub(crate) fn prepare(writer: &Writer, batch: &[StreamAppend]) -> Result<Prepared> {
    let invalid = |m: String| Err(StoreError::Invalid(m));
    if batch.is_empty() {
        return invalid("an append needs at least one stream".into());
    }
    match writer {
        Writer::Leader(t) if t.holder.is_empty() => return invalid("empty lease holder".into()),
        Writer::Observer { instance } if instance.is_empty() => {
            return invalid("an observer needs an instance name".into());
        }
        _ => {}
    }
    let mut streams = HashSet::new();
    let mut ids = HashSet::new();
    let mut event_ids = Vec::new();
    let mut stream_ids = Vec::new();
    let mut prepared = Vec::with_capacity(batch.len());
    for s in batch {
        check_stream_id(&s.stream_id).map_err(StoreError::Invalid)?;
        if !streams.insert(s.stream_id.as_str()) {
            return invalid(format!("stream {} appears twice in one batch", s.stream_id));
        }
        if s.events.is_empty() {
            return invalid(format!("stream {} has no events", s.stream_id));
        }
        stream_ids.push(s.stream_id.clone());
        let mut events = Vec::with_capacity(s.events.len());
        for e in &s.events {
            check_event(&e.event_type, e.schema_version, &e.payload, &e.metadata)
                .map_err(StoreError::Invalid)?;
            if !ids.insert(e.event_id) {
                return invalid(format!(
                    "event id {} appears twice in one batch",
                    e.event_id
                ));
            }
            event_ids.push(e.event_id);
            let metadata = match writer {
                Writer::Observer { instance } => {
                    let mut m = e.metadata.clone();
                    if let Value::Object(map) = &mut m {
                        map.insert("writer".into(), Value::String(instance.clone()));
                    }
                    hash::canonical_string(&m)
                }
                Writer::Leader(_) => hash::canonical_string(&e.metadata),
            };
            events.push(PreparedEvent {
                event_id: e.event_id,
                event_type: e.event_type.clone(),
                schema_version: e.schema_version,
                payload: hash::canonical_string(&e.payload),
                metadata,
            });
        }
        prepared.push(PreparedStream {
            stream_id: s.stream_id.clone(),
            expected: s.expected,
            events,
        });
    }
    Ok(Prepared {
        writer: writer.clone(),
        streams: prepared,
        event_ids,
        stream_ids,
    })
}

/// What every stored stream id satisfies; the reason when it does not.
pub(crate) fn check_stream_id(stream_id: &str) -> std::result::Result<(), String> {
    if stream_id.is_empty() || stream_id.len() > MAX_STREAM_ID {
        return Err(format!("stream id must be 1 to {MAX_STREAM_ID} bytes"));
    }
    if stream_id.chars().any(char::is_control) {
        return Err(format!(
            "stream id {stream_id:?} contains a control character"
        ));
    }
    Ok(())
}

/// What every stored event satisfies, appended or imported.
pub(crate) fn check_event(
    event_type: &str,
    schema_version: u32,
    payload: &Value,
    metadata: &Value,
) -> std::result::Result<(), String> {
    if event_type.is_empty() || event_type.len() > MAX_EVENT_TYPE {
        return Err(format!("event type must be 1 to {MAX_EVENT_TYPE} bytes"));
    }
    if schema_version == 0 {
        return Err(format!("{event_type}: schema versions start at 1"));
    }
    if !metadata.is_object() {
        return Err(format!("{event_type}: metadata must be a JSON object"));
    }
    if has_nul(payload) || has_nul(metadata) {
        return Err(format!(
            "{event_type}: JSON text with a NUL character cannot be stored"
        ));
    }
    Ok(())
}

fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(a) => a.iter().any(has_nul),
        Value::Object(m) => m.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// A retry of an append that already committed returns its original result;
/// a batch that only partly overlaps the log is refused.
pub(crate) fn resolve_retry(
    prepared: &Prepared,
    existing: &[Existing],
) -> Result<Option<Appended>> {
    if existing.is_empty() {
        return Ok(None);
    }
    if existing.len() < prepared.event_ids.len() {
        let known: HashSet<Uuid> = existing.iter().map(|e| e.event_id).collect();
        let first = prepared
            .event_ids
            .iter()
            .find(|id| known.contains(id))
            .copied()
            .unwrap_or(existing[0].event_id);
        return Err(StoreError::DuplicateEventId { event_id: first });
    }
    let mut versions: HashMap<&str, u64> = HashMap::new();
    for e in existing {
        let v = versions.entry(&e.stream_id).or_default();
        *v = (*v).max(e.stream_version);
    }
    let stream_versions = prepared
        .stream_ids
        .iter()
        .map(|s| (s.clone(), versions.get(s.as_str()).copied().unwrap_or(0)))
        .collect();
    Ok(Some(Appended {
        first_position: existing.iter().map(|e| e.position).min().unwrap_or(0),
        last_position: existing.iter().map(|e| e.position).max().unwrap_or(0),
        stream_versions,
        deduplicated: true,
    }))
}

/// The control row as read under the append lock.
#[derive(Debug, Clone)]
pub(crate) struct Locked {
    pub(crate) position: u64,
    pub(crate) hash: [u8; 32],
    pub(crate) epoch: u64,
    pub(crate) holder: Option<String>,
    /// The lease has not expired (by the database's clock where it has one).
    pub(crate) live: bool,
    pub(crate) now: DateTime<Utc>,
}

impl Locked {
    /// Whether `writer` may append now: the fence, checked under the lock.
    pub(crate) fn admits(&self, writer: &Writer) -> bool {
        match writer {
            Writer::Leader(t) => {
                self.live && t.epoch == self.epoch && self.holder.as_deref() == Some(&t.holder)
            }
            Writer::Observer { .. } => true,
        }
    }
}

/// Decides each request of a group in order, as if each were its own
/// transaction run one after the other: its fence, a retry of events already
/// in the log (or earlier in the group), its expected versions against the
/// log as the earlier requests leave it. A refused request writes nothing
/// and does not affect the others.
///
/// `existing` holds the log's events with any of the group's ids and
/// `versions` the log's versions of the group's streams, both read under the
/// lock.
pub(crate) fn plan_group<'a>(
    group: &'a [Prepared],
    lock: &Locked,
    existing: &[Existing],
    versions: &HashMap<String, u64>,
) -> Planned<'a> {
    let mut known: HashMap<Uuid, Existing> =
        existing.iter().map(|e| (e.event_id, e.clone())).collect();
    let mut versions: HashMap<&str, u64> = versions.iter().map(|(s, v)| (s.as_str(), *v)).collect();
    let mut touched: Vec<&'a str> = Vec::new();
    let mut touched_set: HashSet<&'a str> = HashSet::new();
    let mut rows = Vec::new();
    let mut outcomes = Vec::with_capacity(group.len());
    let mut position = lock.position;
    let mut prev = lock.hash;
    let recorded_at_micros = lock.now.timestamp_micros();
    for request in group {
        let mine: Vec<Existing> = request
            .event_ids
            .iter()
            .filter_map(|id| known.get(id).cloned())
            .collect();
        if !lock.admits(&request.writer) {
            // A retry of an append that committed before the lease was
            // lost still gets its original positions.
            outcomes.push(match resolve_retry(request, &mine) {
                Ok(Some(done)) => Ok(done),
                Ok(None) => Err(StoreError::Fenced {
                    current_holder: lock.holder.clone(),
                    current_epoch: lock.epoch,
                }),
                Err(e) => Err(e),
            });
            continue;
        }
        match resolve_retry(request, &mine) {
            Ok(None) => {}
            Ok(Some(done)) => {
                outcomes.push(Ok(done));
                continue;
            }
            Err(e) => {
                outcomes.push(Err(e));
                continue;
            }
        }
        let conflict = request.streams.iter().find_map(|s| {
            let actual = versions.get(s.stream_id.as_str()).copied().unwrap_or(0);
            (!s.expected.admits(actual)).then(|| StoreError::VersionConflict {
                stream: s.stream_id.clone(),
                expected: s.expected,
                actual,
            })
        });
        if let Some(conflict) = conflict {
            outcomes.push(Err(conflict));
            continue;
        }
        let first_position = position + 1;
        let mut stream_versions = Vec::with_capacity(request.streams.len());
        for s in &request.streams {
            if touched_set.insert(s.stream_id.as_str()) {
                touched.push(s.stream_id.as_str());
            }
            let version = versions.entry(s.stream_id.as_str()).or_insert(0);
            for e in &s.events {
                position += 1;
                *version += 1;
                let h = hash::chain_canonical(
                    &prev,
                    &hash::Canonical {
                        position,
                        stream_id: &s.stream_id,
                        stream_version: *version,
                        event_id: e.event_id,
                        event_type: &e.event_type,
                        schema_version: e.schema_version,
                        payload: &e.payload,
                        metadata: &e.metadata,
                        epoch: lock.epoch,
                        recorded_at_micros,
                    },
                );
                prev = h;
                known.insert(
                    e.event_id,
                    Existing {
                        event_id: e.event_id,
                        position,
                        stream_id: s.stream_id.clone(),
                        stream_version: *version,
                    },
                );
                rows.push(Row {
                    position,
                    stream_id: &s.stream_id,
                    stream_version: *version,
                    event: e,
                    hash: h,
                });
            }
            stream_versions.push((s.stream_id.clone(), *version));
        }
        outcomes.push(Ok(Appended {
            first_position,
            last_position: position,
            stream_versions,
            deduplicated: false,
        }));
    }
    let stream_versions = touched
        .into_iter()
        .map(|s| (s, versions.get(s).copied().unwrap_or(0)))
        .collect();
    Planned {
        rows,
        stream_versions,
        head: position,
        head_hash: prev,
        outcomes,
    }
}

/// Timestamps are kept to the microsecond on both backends.
pub(crate) fn micros(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}
