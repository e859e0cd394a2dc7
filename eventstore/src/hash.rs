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

pub fn chain(prev: &[u8; 32], event: &RecordedEvent) -> [u8; 32] {
    let mut bytes = Vec::with_capacity(256);
    canonical_event(event, &mut bytes);
    let mut h = Sha256::new();
    h.update(prev);
    h.update(&bytes);
    h.finalize().into()
}

fn canonical_event(e: &RecordedEvent, out: &mut Vec<u8>) {
    out.push(b'[');
    push_display(out, e.position);
    out.push(b',');
    write_str(out, &e.stream_id);
    out.push(b',');
    push_display(out, e.stream_version);
    out.push(b',');
    write_str(out, &e.event_id.hyphenated().to_string());
    out.push(b',');
    write_str(out, &e.event_type);
    out.push(b',');
    push_display(out, e.schema_version);
    out.push(b',');
    write_canonical(&e.payload, out);
    out.push(b',');
    write_canonical(&e.metadata, out);
    out.push(b',');
    push_display(out, e.epoch);
    out.push(b',');
    push_display(out, e.recorded_at.timestamp_micros());
    out.push(b']');
}

fn push_display(out: &mut Vec<u8>, v: impl std::fmt::Display) {
    out.extend_from_slice(v.to_string().as_bytes());
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
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}

pub fn canonical_string(v: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(v, &mut out);
    String::from_utf8(out).expect("canonical JSON is UTF-8")
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(Value::String(s.to_owned()).to_string().as_bytes());
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
