//! vLLM's KV-cache event batches as they arrive: msgpack written by
//! msgspec. Older vLLM writes structs as arrays (`array_like`: a batch
//! `[ts, events, dp_rank?]`, an event `[tag, field…]`); newer vLLM as maps
//! (`{"ts": …, "events": …}`, an event `{"type": tag, field: …}`). Both
//! are read; fields vLLM added later (`lora_name`, `extra_keys`,
//! `group_idx`, …) are optional. Block hashes are opaque: an integer, or
//! bytes (vLLM's sha256 hashes), reduced to 64 bits here.

use std::hash::{DefaultHasher, Hash, Hasher};

use rmpv::Value;

/// An engine's name for a block: only compared, never computed.
pub(crate) type EngineHash = u64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    Stored {
        hashes: Vec<EngineHash>,
        parent: Option<EngineHash>,
        tokens: Vec<u32>,
        block_size: usize,
        /// Keyed by more than tokens (a LoRA, extra keys) or kept off the
        /// GPU: the router cannot compute such a block's key.
        other: bool,
    },
    Removed {
        hashes: Vec<EngineHash>,
        other: bool,
    },
    Cleared,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("undecodable kv events batch: {0}")]
pub(crate) struct WireError(String);

fn bad(what: impl Into<String>) -> WireError {
    WireError(what.into())
}

/// The events of one batch's payload.
pub(crate) fn decode_batch(payload: &[u8]) -> Result<Vec<Event>, WireError> {
    let v = rmpv::decode::read_value(&mut &payload[..]).map_err(|e| bad(e.to_string()))?;
    let events = match &v {
        Value::Array(fields) => fields.get(1),
        Value::Map(_) => field(&v, "events"),
        _ => None,
    }
    .and_then(Value::as_array)
    .ok_or_else(|| bad("a batch without events"))?;
    events.iter().map(decode_event).collect()
}

fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

/// An event's fields: by position after the tag, or by name.
enum Fields<'a> {
    Array(&'a [Value]),
    Map(&'a Value),
}

impl<'a> Fields<'a> {
    fn get(&self, names: &[&str], name: &str) -> Option<&'a Value> {
        match self {
            Fields::Array(a) => {
                let i = names.iter().position(|n| *n == name)?;
                a.get(i + 1)
            }
            Fields::Map(v) => field(v, name),
        }
    }
}

/// A tagged event as (tag, field by position or name).
fn decode_event(v: &Value) -> Result<Event, WireError> {
    const STORED: [&str; 6] = [
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
    ];
    const REMOVED: [&str; 2] = ["block_hashes", "medium"];
    let (tag, fields) = match v {
        Value::Array(a) => (
            a.first()
                .and_then(Value::as_str)
                .ok_or_else(|| bad("an event without a tag"))?,
            Fields::Array(a),
        ),
        Value::Map(_) => (
            field(v, "type")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("an event without a type"))?,
            Fields::Map(v),
        ),
        _ => return Err(bad("an event neither array nor map")),
    };
    let get = |names: &[&str], name: &str| fields.get(names, name);
    let present = |x: Option<&Value>| x.is_some_and(|x| !x.is_nil());
    let off_gpu = |x: Option<&Value>| {
        x.and_then(Value::as_str)
            .is_some_and(|m| !m.eq_ignore_ascii_case("gpu"))
    };
    match tag {
        "BlockStored" => {
            let hashes = hashes(get(&STORED, "block_hashes"))?;
            let parent = match get(&STORED, "parent_block_hash") {
                None | Some(Value::Nil) => None,
                Some(h) => Some(hash(h)?),
            };
            let tokens = get(&STORED, "token_ids")
                .and_then(Value::as_array)
                .ok_or_else(|| bad("BlockStored without token_ids"))?
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| bad("a token id that is not a 32-bit number"))?;
            let block_size = get(&STORED, "block_size")
                .and_then(Value::as_u64)
                .filter(|b| *b > 0)
                .ok_or_else(|| bad("BlockStored without a block size"))?
                as usize;
            let other = present(get(&STORED, "lora_id"))
                || off_gpu(get(&STORED, "medium"))
                || present(field(v, "lora_name"))
                || field(v, "extra_keys")
                    .and_then(Value::as_array)
                    .is_some_and(|k| k.iter().any(|k| !k.is_nil()));
            Ok(Event::Stored {
                hashes,
                parent,
                tokens,
                block_size,
                other,
            })
        }
        "BlockRemoved" => Ok(Event::Removed {
            hashes: hashes(get(&REMOVED, "block_hashes"))?,
            other: off_gpu(get(&REMOVED, "medium")),
        }),
        "AllBlocksCleared" => Ok(Event::Cleared),
        other => Err(bad(format!("unknown event {other:?}"))),
    }
}

fn hashes(v: Option<&Value>) -> Result<Vec<EngineHash>, WireError> {
    v.and_then(Value::as_array)
        .ok_or_else(|| bad("an event without block_hashes"))?
        .iter()
        .map(hash)
        .collect()
}

fn hash(v: &Value) -> Result<EngineHash, WireError> {
    match v {
        Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|i| i as u64))
            .ok_or_else(|| bad("a block hash out of range")),
        Value::Binary(b) => {
            let mut h = DefaultHasher::new();
            b.hash(&mut h);
            Ok(h.finish())
        }
        _ => Err(bad("a block hash neither integer nor bytes")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, v).unwrap();
        out
    }

    #[test]
    fn array_like_and_map_batches_both_read() {
        let arrays = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Array(vec![
                    "BlockStored".into(),
                    Value::Array(vec![7.into(), 8.into()]),
                    Value::Nil,
                    Value::Array((1..=4).map(Value::from).collect()),
                    2.into(),
                    Value::Nil,
                    "GPU".into(),
                ]),
                Value::Array(vec![
                    "BlockRemoved".into(),
                    Value::Array(vec![7.into()]),
                    Value::Nil,
                ]),
                Value::Array(vec!["AllBlocksCleared".into()]),
            ]),
            0.into(),
        ]);
        let stored = Event::Stored {
            hashes: vec![7, 8],
            parent: None,
            tokens: vec![1, 2, 3, 4],
            block_size: 2,
            other: false,
        };
        assert_eq!(
            decode_batch(&encode(&arrays)).unwrap(),
            vec![
                stored.clone(),
                Event::Removed {
                    hashes: vec![7],
                    other: false
                },
                Event::Cleared
            ]
        );
        let map = |pairs: Vec<(&str, Value)>| {
            Value::Map(
                pairs
                    .into_iter()
                    .map(|(k, v)| (Value::from(k), v))
                    .collect(),
            )
        };
        let maps = map(vec![
            ("ts", Value::F64(1.5)),
            (
                "events",
                Value::Array(vec![map(vec![
                    ("type", "BlockStored".into()),
                    ("block_hashes", Value::Array(vec![7.into(), 8.into()])),
                    ("parent_block_hash", Value::Nil),
                    (
                        "token_ids",
                        Value::Array((1..=4).map(Value::from).collect()),
                    ),
                    ("block_size", 2.into()),
                    ("lora_id", Value::Nil),
                    ("medium", "GPU".into()),
                    ("lora_name", Value::Nil),
                ])]),
            ),
        ]);
        assert_eq!(decode_batch(&encode(&maps)).unwrap(), vec![stored]);
        // Bytes hashes (vLLM's sha256) are opaque but stable.
        let b = Value::Binary(vec![1; 32]);
        assert_eq!(hash(&b).unwrap(), hash(&b).unwrap());
        assert!(decode_batch(b"\x01").is_err());
    }
}
