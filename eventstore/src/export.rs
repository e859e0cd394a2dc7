//! `llmgw events export`: the log as JSON lines, one stored event per line,
//! exactly as stored, so that [`crate::EventStore::import`] can reproduce
//! it. A range that starts after position 1 names the hash before it on
//! its first line (`prev_hash`), so an import can check where it joins.

use std::io::Write;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::signing::{Checked, PublicKey, Signature, SigningKey};
use crate::{DEFAULT_PAGE, EventStore, RecordedEvent, Result, StoreError, hash};

/// The last line of an export, `{"trailer": {…}}`: where it came from and
/// what it holds, so that a file cut short, or one whose end was altered,
/// no longer matches it, and an auditor can compare it with the source.
/// Unknown fields are refused: the signature covers the trailer, and a
/// field it would not cover could be added to a signed file unnoticed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trailer {
    /// The trailer's own format version.
    pub format: u32,
    /// The machine that wrote the export.
    pub host: String,
    /// The source log's first event as `HASH@POSITION`: which log this is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_start: Option<String>,
    /// The positions the file holds and how many events.
    pub from: u64,
    pub to: u64,
    pub events: u64,
    /// The hash of the file's last event.
    #[serde(with = "hex_opt", default, skip_serializing_if = "Option::is_none")]
    pub last_hash: Option<[u8; 32]>,
    /// The source's head and chain head when the export was written.
    pub head: u64,
    #[serde(with = "hex_opt", default, skip_serializing_if = "Option::is_none")]
    pub head_hash: Option<[u8; 32]>,
    pub exported_at: DateTime<Utc>,
    /// The hash of the file's header line (`{"header": …}`, which
    /// `events capture` writes first), so that the header cannot be
    /// swapped or dropped unnoticed.
    #[serde(with = "hex_opt", default, skip_serializing_if = "Option::is_none")]
    pub header_hash: Option<[u8; 32]>,
    /// The server's signature over everything above, when it has a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<Signature>,
}

/// What a trailer's signature is over: "llmgw export trailer", then the
/// trailer without its signature as canonical JSON.
const TRAILER_CONTEXT: &str = "export trailer";

impl Trailer {
    fn unsigned_value(&self) -> Value {
        let mut value = serde_json::to_value(self).expect("a trailer serialises");
        if let Value::Object(m) = &mut value {
            m.remove("signature");
        }
        value
    }

    /// Signs the trailer with `key` (replacing any signature).
    pub fn sign(&mut self, key: &SigningKey) {
        self.signature = Some(Signature::over(
            key,
            TRAILER_CONTEXT,
            &self.unsigned_value(),
        ));
    }

    /// Checks the signature, if there is one: `Ok(None)` when the trailer
    /// is not signed. With `trusted`, the signer must be that key.
    pub fn check_signature(
        &self,
        trusted: Option<&PublicKey>,
    ) -> std::result::Result<Option<Checked>, String> {
        match &self.signature {
            None => Ok(None),
            Some(s) => s
                .check(TRAILER_CONTEXT, &self.unsigned_value(), trusted)
                .map(Some),
        }
    }
}

/// The hash of a header line's value, as a trailer names it.
pub fn header_hash(header: &Value) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut bytes = Vec::new();
    hash::write_canonical(header, &mut bytes);
    Sha256::digest(&bytes).into()
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrailerLine {
    trailer: Trailer,
}

#[derive(Serialize, Deserialize)]
struct HeaderLine {
    header: Value,
}

/// One line of an export file.
#[derive(Debug, Clone, PartialEq)]
pub enum ExportLine {
    /// A capture's first line: what it is and how to replay it (opaque
    /// to the store, covered by the trailer's `header_hash`).
    Header(Value),
    Event(Box<RecordedEvent>),
    Trailer(Box<Trailer>),
}

/// Reads one line of an export: an event, the trailer, or a header.
pub fn parse_line(text: &str) -> std::result::Result<ExportLine, serde_json::Error> {
    let start = text.trim_start();
    if start.starts_with("{\"trailer\"") {
        let line: TrailerLine = serde_json::from_str(text)?;
        return Ok(ExportLine::Trailer(Box::new(line.trailer)));
    }
    if start.starts_with("{\"header\"") {
        let line: HeaderLine = serde_json::from_str(text)?;
        return Ok(ExportLine::Header(line.header));
    }
    serde_json::from_str(text).map(|e| ExportLine::Event(Box::new(e)))
}

/// Writes a header as a capture's first line.
pub fn write_header(sink: &mut impl Write, header: &Value) -> Result<()> {
    let mut line = serde_json::to_vec(&HeaderLine {
        header: header.clone(),
    })
    .map_err(|e| StoreError::Export(e.into()))?;
    line.push(b'\n');
    sink.write_all(&line).map_err(StoreError::Export)
}

/// Writes the trailer as the export's last line.
pub fn write_trailer(sink: &mut impl Write, trailer: &Trailer) -> Result<()> {
    let mut line = serde_json::to_vec(&TrailerLine {
        trailer: trailer.clone(),
    })
    .map_err(|e| StoreError::Export(e.into()))?;
    line.push(b'\n');
    sink.write_all(&line).map_err(StoreError::Export)?;
    sink.flush().map_err(StoreError::Export)
}

mod hex_opt {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(crate) fn serialize<S: Serializer>(v: &Option<[u8; 32]>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(h) => s.serialize_str(&crate::hash::to_hex(h)),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<[u8; 32]>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => crate::hash::from_hex(&text)
                .map(Some)
                .ok_or_else(|| D::Error::custom("expected 64 hex digits")),
            None => Ok(None),
        }
    }
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub events: u64,
    /// The first and last position written, if any.
    pub positions: Option<(u64, u64)>,
    /// The hash of the last event written: the file's chain head.
    pub last_hash: Option<[u8; 32]>,
}

/// Writes the events in `[from, to]` (`to` defaults to the head) to `sink`.
pub async fn export<S: EventStore>(
    store: &S,
    from: u64,
    to: Option<u64>,
    sink: &mut impl Write,
) -> Result<Exported> {
    if from == 0 {
        return Err(StoreError::Invalid("positions start at 1".into()));
    }
    let to = match to {
        Some(t) => t,
        None => store.head().await?.0,
    };
    let io = StoreError::Export;
    let mut done = Exported {
        events: 0,
        positions: None,
        last_hash: None,
    };
    let mut after = from - 1;
    // The chain is checked on the way out: a store edited behind its back
    // was exported as if whole, and the file then blamed for it.
    // A log imported from a later start begins at its base, whose hash
    // was taken on trust.
    let (base, base_hash) = store.base().await?;
    let mut prev = if from - 1 <= base {
        Some(base_hash)
    } else {
        store.hash_at(from - 1).await?
    };
    let mut line = Vec::with_capacity(1024);
    while after < to {
        let page = store.read_all_raw(after, DEFAULT_PAGE).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = last.position;
        for e in page.iter().take_while(|e| e.position <= to) {
            if let Some(p) = prev
                && crate::hash::chain(&p, e) != e.hash
            {
                return Err(StoreError::Invalid(format!(
                    "the store's chain breaks at position {}: its hash does not match its content and the hash before it (the store was altered; `llmgw events verify` says more): a log that does not verify is neither exported nor copied",
                    e.position
                )));
            }
            prev = Some(e.hash);
            line.clear();
            if done.events == 0 && e.position > 1 {
                serde_json::to_writer(&mut line, &first_line(store, e).await?)
            } else {
                serde_json::to_writer(&mut line, e)
            }
            .map_err(|e| StoreError::Export(e.into()))?;
            line.push(b'\n');
            sink.write_all(&line).map_err(io)?;
            done.events += 1;
            done.positions = Some(match done.positions {
                Some((f, _)) => (f, e.position),
                None => (e.position, e.position),
            });
            done.last_hash = Some(e.hash);
        }
    }
    sink.flush().map_err(io)?;
    Ok(done)
}

/// The first line of a range that starts after position 1: the event,
/// its fields in the order of every other line's, then `prev_hash`.
#[derive(Serialize)]
struct FirstLine<'e> {
    #[serde(flatten)]
    event: &'e RecordedEvent,
    prev_hash: String,
}

/// The first event of a range that starts after position 1, with the
/// hash of the event before it as `prev_hash`.
async fn first_line<'e, S: EventStore>(store: &S, e: &'e RecordedEvent) -> Result<FirstLine<'e>> {
    let prev = store.hash_at(e.position - 1).await?.ok_or_else(|| {
        StoreError::Invalid(format!(
            "no event at position {} to link the export to",
            e.position - 1
        ))
    })?;
    Ok(FirstLine {
        event: e,
        prev_hash: hash::to_hex(&prev),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Its keys in the order of every other line's, `prev_hash` last: a
    /// ranged export's first line had them in alphabetical order.
    #[test]
    fn a_ranged_exports_first_line_keeps_the_order_of_the_others() {
        let e = RecordedEvent {
            position: 7,
            stream_id: "node-a".into(),
            stream_version: 2,
            event_id: uuid::Uuid::nil(),
            event_type: "NodeCordoned".into(),
            schema_version: 1,
            payload: serde_json::json!({"node_id": "a"}),
            metadata: serde_json::json!({"actor": "alice"}),
            epoch: 1,
            recorded_at: DateTime::<Utc>::UNIX_EPOCH,
            hash: [7; 32],
        };
        let plain = serde_json::to_string(&e).unwrap();
        let first = serde_json::to_string(&FirstLine {
            event: &e,
            prev_hash: hash::to_hex(&[1; 32]),
        })
        .unwrap();
        let plain = plain.strip_suffix('}').unwrap();
        assert_eq!(
            first,
            format!("{plain},\"prev_hash\":\"{}\"}}", hash::to_hex(&[1; 32]))
        );
        let back: RecordedEvent = serde_json::from_str(&first).unwrap();
        assert_eq!(back, e);
    }
}
