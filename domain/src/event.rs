//! Every event, its stable type name, its schema version and its stream.
//!
//! Stored as `(event_type, schema_version, payload)`: the type name is the
//! variant's name, which is therefore part of the log's format and never
//! renamed. A change of shape bumps the type's schema version here and
//! either adds an upcaster (in the event store's registry) from the old
//! shape, or keeps reading the old shape straight into today's event
//! (`OLDER` below: a usage batch's list of rows, version 1, is read so).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::audit::AuditEvent;
use crate::catalog::CatalogEvent;
use crate::demand::DemandEvent;
use crate::join::JoinEvent;
use crate::nodes::NodeEvent;
use crate::replicas::ReplicaEvent;
use crate::tenancy::{Scope, TenancyEvent};
use crate::usage::UsageEvent;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum LeadershipEvent {
    LeadershipAcquired {
        holder: String,
        epoch: u64,
        /// Where the new leader's admin API answers, so that a standby can
        /// forward operators' commands to it (absent in older logs).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        admin: Option<String>,
        /// Where the new leader takes agent streams, so that a standby can
        /// name it when it refuses one (absent in older logs).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<String>,
        /// The timings the new leader decides with, so that an incident's
        /// timeline can be read against them (absent in older logs).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        settings: Option<ControlSettings>,
    },
    LeadershipReleased {
        holder: String,
        epoch: u64,
    },
    /// The leader's periodic anchor: the log's chain head when it was
    /// taken, `hash` (64 hex digits) at `position`, also written to the
    /// operator's external sink where one is configured. In the log it
    /// tells an auditor which anchors the sink should hold.
    AnchorRecorded {
        position: u64,
        hash: String,
    },
}

/// The control plane's timings as a leader runs with them (milliseconds),
/// recorded when it takes office.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlSettings {
    pub lease_ttl_ms: u64,
    pub reconcile_interval_ms: u64,
    /// No heartbeat for this long: no new placement on the node.
    pub unreachable_after_ms: u64,
    /// No heartbeat for this long: the node's work is rebuilt elsewhere.
    pub lost_after_ms: u64,
    pub base_backoff_ms: u64,
    pub max_backoff_ms: u64,
    pub drain_grace_ms: u64,
    /// Anchors every this many events, and at least this often (absent:
    /// no anchors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor_every_events: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor_every_ms: Option<u64>,
    /// The engines the leader has every node install, as
    /// `engine@version (source)` (absent in older logs, and with none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engines: Vec<String>,
    /// The fleet's mirror the leader sends agents to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_url: Option<String>,
}

/// The stream of a gateway's usage batches is this and its writer name
/// (a key's single-row records of older logs are `usage-<key>`).
pub const USAGE_BATCHES_PREFIX: &str = "usage-batches-";

/// Any event of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Catalog(CatalogEvent),
    Node(NodeEvent),
    Replica(ReplicaEvent),
    Tenancy(TenancyEvent),
    Usage(UsageEvent),
    Leadership(LeadershipEvent),
    Demand(DemandEvent),
    Audit(AuditEvent),
    Join(JoinEvent),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Area {
    Catalog,
    Node,
    Replica,
    Tenancy,
    Usage,
    Leadership,
    Demand,
    Audit,
    Join,
    /// A usage batch at schema version 1, a list of rows.
    UsageRowsV1,
}

/// Older schema versions this build still reads, and how.
const OLDER: &[(&str, u32, Area)] = &[("UsageBatchRecorded", 1, Area::UsageRowsV1)];

/// Every type name with its area and current schema version.
const TYPES: &[(&str, Area, u32)] = &[
    ("ModelAdded", Area::Catalog, 1),
    ("ModelUpdated", Area::Catalog, 1),
    ("ModelRemoved", Area::Catalog, 1),
    ("NodeRegistered", Area::Node, 1),
    ("NodeInventoryChanged", Area::Node, 1),
    ("NodeUnreachable", Area::Node, 1),
    ("NodeLost", Area::Node, 1),
    ("NodeRecovered", Area::Node, 1),
    ("NodeCordoned", Area::Node, 1),
    ("NodeUncordoned", Area::Node, 1),
    ("NodeDrainRequested", Area::Node, 1),
    ("NodeDrained", Area::Node, 1),
    ("NodeRemoved", Area::Node, 1),
    ("ReplicaPlaced", Area::Replica, 1),
    ("ReplicaAdopted", Area::Replica, 1),
    ("ShardStateChanged", Area::Replica, 1),
    ("ReplicaReady", Area::Replica, 1),
    ("ReplicaFailed", Area::Replica, 1),
    ("ReplicaDraining", Area::Replica, 1),
    ("ReplicaStopped", Area::Replica, 1),
    ("OrgCreated", Area::Tenancy, 1),
    ("TeamCreated", Area::Tenancy, 1),
    ("ProjectCreated", Area::Tenancy, 1),
    ("LimitsSet", Area::Tenancy, 1),
    ("KeyIssued", Area::Tenancy, 1),
    ("KeyRevoked", Area::Tenancy, 1),
    ("KeyRotated", Area::Tenancy, 1),
    ("UserSignedUp", Area::Tenancy, 1),
    ("UserApproved", Area::Tenancy, 1),
    ("UserSuspended", Area::Tenancy, 1),
    ("UserPromoted", Area::Tenancy, 1),
    ("PasswordChanged", Area::Tenancy, 1),
    ("PasswordReset", Area::Tenancy, 1),
    ("UserErased", Area::Tenancy, 1),
    ("KeyClaimOffered", Area::Tenancy, 1),
    ("KeyClaimed", Area::Tenancy, 1),
    ("ThreadsSet", Area::Tenancy, 1),
    ("MemorySet", Area::Tenancy, 1),
    ("UsageRecorded", Area::Usage, 1),
    ("UsageBatchRecorded", Area::Usage, 2),
    ("LeadershipAcquired", Area::Leadership, 1),
    ("LeadershipReleased", Area::Leadership, 1),
    ("AnchorRecorded", Area::Leadership, 1),
    ("ModelDemanded", Area::Demand, 1),
    ("CommandRefused", Area::Audit, 1),
    ("JoinTokenIssued", Area::Join, 1),
    ("NodeJoined", Area::Join, 1),
];

/// Why a stored event could not be turned back into an [`Event`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("unknown event type {0}")]
    UnknownType(String),
    #[error(
        "{event_type} is at schema version {found}, but this build reads version {current}; upcast it first"
    )]
    Version {
        event_type: String,
        found: u32,
        current: u32,
    },
    #[error("{event_type}: {reason}")]
    Payload { event_type: String, reason: String },
}

impl Event {
    /// All type names this build knows, with their schema versions.
    pub fn types() -> impl Iterator<Item = (&'static str, u32)> {
        TYPES.iter().map(|(t, _, v)| (*t, *v))
    }

    /// The current schema version of a type name.
    pub fn schema_version_of(event_type: &str) -> Option<u32> {
        TYPES
            .iter()
            .find(|(t, ..)| *t == event_type)
            .map(|(.., v)| *v)
    }

    /// Whether events of `event_type` record usage (a request each, or a
    /// batch of hundreds): the bulk of a busy log, read by the tenancy
    /// views and by nothing that decides ([`crate::State::evolve`] passes
    /// them by), so a reader that only decides need not decode them. A
    /// match, not a look-up in the type table: it is asked of every event.
    pub fn is_usage(event_type: &str) -> bool {
        matches!(event_type, "UsageRecorded" | "UsageBatchRecorded")
    }

    /// Whether this build reads events of `event_type` at `schema_version`
    /// (its current version, or an older one it still reads).
    pub fn reads(event_type: &str, schema_version: u32) -> bool {
        Self::area_of(event_type, schema_version).is_ok()
    }

    /// `(type name, schema version, payload)` as stored.
    pub fn encode(&self) -> (String, u32, Value) {
        let tagged = match self {
            Event::Catalog(e) => serde_json::to_value(e),
            Event::Node(e) => serde_json::to_value(e),
            Event::Replica(e) => serde_json::to_value(e),
            Event::Tenancy(e) => serde_json::to_value(e),
            Event::Usage(e) => serde_json::to_value(e),
            Event::Leadership(e) => serde_json::to_value(e),
            Event::Demand(e) => serde_json::to_value(e),
            Event::Audit(e) => serde_json::to_value(e),
            Event::Join(e) => serde_json::to_value(e),
        }
        .expect("events serialise");
        let Value::Object(mut map) = tagged else {
            unreachable!("adjacently tagged enums serialise to objects")
        };
        let Some(Value::String(event_type)) = map.remove("type") else {
            unreachable!("adjacently tagged enums carry their tag")
        };
        let payload = map
            .remove("data")
            .unwrap_or(Value::Object(Default::default()));
        let version =
            Self::schema_version_of(&event_type).expect("every variant is listed in TYPES");
        (event_type, version, payload)
    }

    /// The event of a stored row; the row must already be upcast to the
    /// current schema version, or be at one this build still reads
    /// (a usage batch's rows, version 1).
    pub fn decode(
        event_type: &str,
        schema_version: u32,
        payload: &Value,
    ) -> Result<Event, DecodeError> {
        let area = Self::area_of(event_type, schema_version)?;
        decode_area(area, event_type, payload).map_err(|e| payload_error(event_type, e))
    }

    /// The event of a stored row whose payload is still JSON text, read
    /// straight into the typed event (no `serde_json::Value` on the way:
    /// replaying the log spends most of its time here). Same rules as
    /// [`Event::decode`].
    pub fn decode_json(
        event_type: &str,
        schema_version: u32,
        payload: &str,
    ) -> Result<Event, DecodeError> {
        let area = Self::area_of(event_type, schema_version)?;
        let mut de = serde_json::Deserializer::from_str(payload);
        decode_area(area, event_type, &mut de)
            .and_then(|event| de.end().map(|()| event))
            .map_err(|e| payload_error(event_type, e))
    }

    fn area_of(event_type: &str, schema_version: u32) -> Result<Area, DecodeError> {
        let Some(&(_, area, current)) = TYPES.iter().find(|(t, ..)| *t == event_type) else {
            return Err(DecodeError::UnknownType(event_type.to_owned()));
        };
        if let Some(&(.., older)) = OLDER
            .iter()
            .find(|(t, v, _)| *t == event_type && *v == schema_version)
        {
            return Ok(older);
        }
        if schema_version != current {
            return Err(DecodeError::Version {
                event_type: event_type.to_owned(),
                found: schema_version,
                current,
            });
        }
        Ok(area)
    }

    /// The stream an event belongs to: one per model, node, replica,
    /// tenancy object and key's usage.
    pub fn stream_id(&self) -> String {
        use TenancyEvent as T;
        match self {
            Event::Catalog(e) => match e {
                CatalogEvent::ModelAdded { model } | CatalogEvent::ModelUpdated { model } => {
                    format!("model-{}", model.name)
                }
                CatalogEvent::ModelRemoved { name } => format!("model-{name}"),
            },
            Event::Node(e) => format!("node-{}", e.node_id()),
            Event::Replica(e) => format!("replica-{}", e.replica_id()),
            Event::Tenancy(e) => match e {
                T::OrgCreated { org_id, .. } => format!("org-{org_id}"),
                T::TeamCreated { team_id, .. } => format!("team-{team_id}"),
                T::ProjectCreated { project_id, .. }
                | T::ThreadsSet { project_id, .. }
                | T::MemorySet { project_id, .. } => format!("project-{project_id}"),
                T::LimitsSet {
                    scope, scope_id, ..
                } => match scope {
                    Scope::Org => format!("org-{scope_id}"),
                    Scope::Team => format!("team-{scope_id}"),
                    Scope::Project => format!("project-{scope_id}"),
                    Scope::Key => format!("key-{scope_id}"),
                },
                T::KeyIssued(k) => format!("key-{}", k.key_id),
                T::KeyRevoked { key_id, .. }
                | T::KeyRotated { key_id, .. }
                | T::KeyClaimOffered { key_id, .. }
                | T::KeyClaimed { key_id } => format!("key-{key_id}"),
                T::UserSignedUp { user_id }
                | T::UserApproved { user_id, .. }
                | T::UserSuspended { user_id, .. }
                | T::UserPromoted { user_id, .. }
                | T::PasswordChanged { user_id }
                | T::PasswordReset { user_id, .. }
                | T::UserErased { user_id, .. } => format!("user-{user_id}"),
            },
            Event::Usage(UsageEvent::UsageRecorded(u)) => format!("usage-{}", u.key_id),
            Event::Usage(UsageEvent::UsageBatchRecorded(b)) => {
                format!("{USAGE_BATCHES_PREFIX}{}", b.gateway)
            }
            Event::Leadership(LeadershipEvent::AnchorRecorded { .. }) => "anchors".to_owned(),
            Event::Leadership(_) => "leadership".to_owned(),
            Event::Demand(DemandEvent::ModelDemanded { model }) => format!("demand-{model}"),
            Event::Audit(e) => e.stream_id(),
            Event::Join(e) => e.stream_id(),
        }
    }
}

fn payload_error(event_type: &str, e: serde_json::Error) -> DecodeError {
    DecodeError::Payload {
        event_type: event_type.to_owned(),
        reason: e.to_string(),
    }
}

/// Deserialises an area's adjacently tagged enum from the type name and a
/// deserializer of the payload alone, as if it were `{"type": …, "data": …}`
/// but without building that document.
use serde::de::IntoDeserializer;

fn decode_area<'de, D>(area: Area, event_type: &str, payload: D) -> Result<Event, D::Error>
where
    D: serde::Deserializer<'de>,
    D::Error: serde::de::Error,
{
    let tagged = |payload| {
        serde::de::value::MapAccessDeserializer::new(Tagged {
            event_type,
            payload: Some(payload),
            next: 0,
        })
    };
    Ok(match area {
        Area::Catalog => Event::Catalog(Deserialize::deserialize(tagged(payload))?),
        Area::Node => Event::Node(Deserialize::deserialize(tagged(payload))?),
        Area::Replica => Event::Replica(Deserialize::deserialize(tagged(payload))?),
        Area::Tenancy => Event::Tenancy(Deserialize::deserialize(tagged(payload))?),
        Area::Usage => Event::Usage(Deserialize::deserialize(tagged(payload))?),
        Area::Leadership => Event::Leadership(Deserialize::deserialize(tagged(payload))?),
        Area::Demand => Event::Demand(Deserialize::deserialize(tagged(payload))?),
        Area::Audit => Event::Audit(Deserialize::deserialize(tagged(payload))?),
        Area::Join => Event::Join(Deserialize::deserialize(tagged(payload))?),
        // The old shape is the payload itself, untagged.
        Area::UsageRowsV1 => {
            let rows = crate::usage::BatchRowsV1::deserialize(payload)?;
            Event::Usage(UsageEvent::UsageBatchRecorded(rows.into()))
        }
    })
}

/// The two entries `type` then `data` of an adjacently tagged enum: serde
/// reads the tag first and then the content straight from `payload`.
struct Tagged<'a, D> {
    event_type: &'a str,
    payload: Option<D>,
    next: u8,
}

impl<'de, D> serde::de::MapAccess<'de> for Tagged<'_, D>
where
    D: serde::Deserializer<'de>,
    D::Error: serde::de::Error,
{
    type Error = D::Error;

    fn next_key_seed<K>(&mut self, seed: K) -> Result<Option<K::Value>, Self::Error>
    where
        K: serde::de::DeserializeSeed<'de>,
    {
        let key = match self.next {
            0 => "type",
            1 => "data",
            _ => return Ok(None),
        };
        seed.deserialize(key.into_deserializer()).map(Some)
    }

    fn next_value_seed<V>(&mut self, seed: V) -> Result<V::Value, Self::Error>
    where
        V: serde::de::DeserializeSeed<'de>,
    {
        self.next += 1;
        if self.next == 1 {
            return seed.deserialize(self.event_type.into_deserializer());
        }
        match self.payload.take() {
            Some(payload) => seed.deserialize(payload),
            None => Err(serde::de::Error::custom("the payload was read twice")),
        }
    }
}
