//! The backend-independent half of an append: validating the batch, resolving
//! retries, checking expected versions and laying out positions and hashes.
//! Backends run these steps inside their locked transaction.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::{Appended, NewEvent, Result, StoreError, StreamAppend, Writer, hash};

const MAX_STREAM_ID: usize = 256;
const MAX_EVENT_TYPE: usize = 128;

/// A validated batch and the keys the backend must look up.
#[derive(Debug)]
pub(crate) struct Prepared<'a> {
    pub(crate) batch: &'a [StreamAppend],
    pub(crate) event_ids: Vec<Uuid>,
    pub(crate) stream_ids: Vec<String>,
}

/// An event already in the log that shares an id with the batch.
#[derive(Debug, Clone)]
pub(crate) struct Existing {
    pub(crate) event_id: Uuid,
    pub(crate) position: u64,
    pub(crate) stream_id: String,
    pub(crate) stream_version: u64,
}

/// One event laid out for writing: its place, its canonical JSON and hash.
#[derive(Debug)]
pub(crate) struct Row<'a> {
    pub(crate) position: u64,
    pub(crate) stream_id: &'a str,
    pub(crate) stream_version: u64,
    pub(crate) event: &'a NewEvent,
    pub(crate) payload: String,
    pub(crate) metadata: String,
    pub(crate) hash: [u8; 32],
}

/// The rows to write and the control row's new head.
#[derive(Debug)]
pub(crate) struct Planned<'a> {
    pub(crate) rows: Vec<Row<'a>>,
    pub(crate) head: u64,
    pub(crate) head_hash: [u8; 32],
    pub(crate) appended: Appended,
}

pub(crate) fn prepare<'a>(writer: &Writer, batch: &'a [StreamAppend]) -> Result<Prepared<'a>> {
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
    for s in batch {
        check_stream_id(&s.stream_id).map_err(StoreError::Invalid)?;
        if !streams.insert(s.stream_id.as_str()) {
            return invalid(format!("stream {} appears twice in one batch", s.stream_id));
        }
        if s.events.is_empty() {
            return invalid(format!("stream {} has no events", s.stream_id));
        }
        stream_ids.push(s.stream_id.clone());
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
        }
    }
    Ok(Prepared {
        batch,
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
    prepared: &Prepared<'_>,
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

/// The log's head as read under the append lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head {
    pub(crate) position: u64,
    pub(crate) hash: [u8; 32],
    pub(crate) epoch: u64,
    pub(crate) now: DateTime<Utc>,
}

pub(crate) fn plan<'a>(
    prepared: &Prepared<'a>,
    writer: &Writer,
    head: Head,
    versions: &HashMap<String, u64>,
) -> Result<Planned<'a>> {
    let mut rows = Vec::with_capacity(prepared.event_ids.len());
    let mut stream_versions = Vec::with_capacity(prepared.batch.len());
    let mut position = head.position;
    let mut prev = head.hash;
    let recorded_at_micros = head.now.timestamp_micros();
    for s in prepared.batch {
        let actual = versions.get(&s.stream_id).copied().unwrap_or(0);
        if !s.expected.admits(actual) {
            return Err(StoreError::VersionConflict {
                stream: s.stream_id.clone(),
                expected: s.expected,
                actual,
            });
        }
        let mut version = actual;
        for e in &s.events {
            position += 1;
            version += 1;
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
            let payload = hash::canonical_string(&e.payload);
            let h = hash::chain_canonical(
                &prev,
                &hash::Canonical {
                    position,
                    stream_id: &s.stream_id,
                    stream_version: version,
                    event_id: e.event_id,
                    event_type: &e.event_type,
                    schema_version: e.schema_version,
                    payload: &payload,
                    metadata: &metadata,
                    epoch: head.epoch,
                    recorded_at_micros,
                },
            );
            prev = h;
            rows.push(Row {
                position,
                stream_id: &s.stream_id,
                stream_version: version,
                event: e,
                payload,
                metadata,
                hash: h,
            });
        }
        stream_versions.push((s.stream_id.clone(), version));
    }
    Ok(Planned {
        appended: Appended {
            first_position: head.position + 1,
            last_position: position,
            stream_versions,
            deduplicated: false,
        },
        rows,
        head: position,
        head_hash: prev,
    })
}

/// Timestamps are kept to the microsecond on both backends.
pub(crate) fn micros(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}
