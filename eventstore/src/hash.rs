//! The hash chain: each event's hash covers the previous hash and the event's
//! canonical bytes, so altering any stored event breaks every later link.
//!
//! The canonical bytes must come out the same from the value the writer held
//! and from the value read back after PostgreSQL's `jsonb` has reordered keys
//! and reformatted numbers; hence sorted keys and serde's own number printing,
//! never the stored text.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::RecordedEvent;

pub const GENESIS: [u8; 32] = [0; 32];

/// The fields of an event that its hash covers, with payload and metadata
/// already in canonical form.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Canonical<'a> {
    pub(crate) position: u64,
    pub(crate) stream_id: &'a str,
    pub(crate) stream_version: u64,
    pub(crate) event_id: uuid::Uuid,
    pub(crate) event_type: &'a str,
    pub(crate) schema_version: u32,
    pub(crate) payload: &'a str,
    pub(crate) metadata: &'a str,
    pub(crate) epoch: u64,
    pub(crate) recorded_at_micros: i64,
}

/// The hash of a stored event, given the hash of the one before it.
pub fn chain(prev: &[u8; 32], event: &RecordedEvent) -> [u8; 32] {
    let payload = canonical_string(&event.payload);
    let metadata = canonical_string(&event.metadata);
    chain_canonical(
        prev,
        &Canonical {
            position: event.position,
            stream_id: &event.stream_id,
            stream_version: event.stream_version,
            event_id: event.event_id,
            event_type: &event.event_type,
            schema_version: event.schema_version,
            payload: &payload,
            metadata: &metadata,
            epoch: event.epoch,
            recorded_at_micros: event.recorded_at.timestamp_micros(),
        },
    )
}

/// sha256(prev ‖ `[position,stream,version,id,type,schema,payload,metadata,epoch,µs]`).
pub(crate) fn chain_canonical(prev: &[u8; 32], e: &Canonical<'_>) -> [u8; 32] {
    let mut out = Vec::with_capacity(128 + e.payload.len() + e.metadata.len());
    out.push(b'[');
    push_display(&mut out, e.position);
    out.push(b',');
    write_str(&mut out, e.stream_id);
    out.push(b',');
    push_display(&mut out, e.stream_version);
    out.push(b',');
    out.push(b'"');
    out.extend_from_slice(
        e.event_id
            .hyphenated()
            .encode_lower(&mut uuid::Uuid::encode_buffer())
            .as_bytes(),
    );
    out.push(b'"');
    out.push(b',');
    write_str(&mut out, e.event_type);
    out.push(b',');
    push_display(&mut out, e.schema_version);
    out.push(b',');
    out.extend_from_slice(e.payload.as_bytes());
    out.push(b',');
    out.extend_from_slice(e.metadata.as_bytes());
    out.push(b',');
    push_display(&mut out, e.epoch);
    out.push(b',');
    push_display(&mut out, e.recorded_at_micros);
    out.push(b']');
    let mut h = Sha256::new();
    h.update(prev);
    h.update(&out);
    h.finalize().into()
}

fn push_display(out: &mut Vec<u8>, v: impl std::fmt::Display) {
    use std::io::Write;
    let _ = write!(out, "{v}");
}

/// JSON with object keys sorted by their bytes and no insignificant
/// whitespace, whatever map order serde_json was built with.
pub fn write_canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, k);
                out.push(b':');
                write_canonical(&map[k], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        // Scalars: serde_json prints them deterministically from their value.
        scalar => serde_json::to_writer(&mut *out, scalar).expect("writing to a Vec"),
    }
}

pub fn canonical_string(v: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(v, &mut out);
    String::from_utf8(out).expect("canonical JSON is UTF-8")
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("writing to a Vec");
}

pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 0xf) as usize] as char);
    }
    s
}

pub fn from_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in text.as_bytes().chunks(2).enumerate() {
        let pair = std::str::from_utf8(chunk).ok()?;
        out[i] = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

pub(crate) fn to_array(bytes: &[u8], position: u64) -> crate::Result<[u8; 32]> {
    bytes.try_into().map_err(|_| crate::StoreError::Corrupt {
        position,
        reason: format!("hash has {} bytes, not 32", bytes.len()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_spacing_do_not_change_the_bytes() {
        let a: Value =
            serde_json::from_str(r#"{"b": 1, "a": {"y": [1, 2.5], "x": null}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":null,"y":[1,2.5]},"b":1}"#).unwrap();
        assert_eq!(canonical_string(&a), canonical_string(&b));
        assert_eq!(
            canonical_string(&a),
            r#"{"a":{"x":null,"y":[1,2.5]},"b":1}"#
        );
    }

    #[test]
    fn numbers_survive_a_reformatting_round_trip() {
        // PostgreSQL prints 1e20 as 100000000000000000000 and 1.5e-7 as 0.00000015.
        let ours = json!({"big": 1e20, "small": 1.5e-7, "gib": 44.99});
        let theirs: Value = serde_json::from_str(
            r#"{"gib": 44.99, "big": 100000000000000000000, "small": 0.00000015}"#,
        )
        .unwrap();
        assert_eq!(canonical_string(&ours), canonical_string(&theirs));
    }

    #[test]
    fn hex_round_trips() {
        let h = [0xabu8; 32];
        assert_eq!(from_hex(&to_hex(&h)), Some(h));
        assert_eq!(from_hex("zz"), None);
    }
}
