//! `llmgw events export`: the log as JSON lines, one stored event per line,
//! exactly as stored, so that [`crate::EventStore::import`] can reproduce
//! it. A range that starts after position 1 names the hash before it on
//! its first line (`prev_hash`), so an import can check where it joins.

use std::io::Write;

use serde_json::Value;

use crate::{DEFAULT_PAGE, EventStore, RecordedEvent, Result, StoreError, hash};

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
    let mut line = Vec::with_capacity(1024);
    while after < to {
        let page = store.read_all_raw(after, DEFAULT_PAGE).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = last.position;
        for e in page.iter().take_while(|e| e.position <= to) {
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

/// The first event of a range that starts after position 1, with the
/// hash of the event before it as `prev_hash`.
async fn first_line<S: EventStore>(store: &S, e: &RecordedEvent) -> Result<Value> {
    let prev = store.hash_at(e.position - 1).await?.ok_or_else(|| {
        StoreError::Invalid(format!(
            "no event at position {} to link the export to",
            e.position - 1
        ))
    })?;
    let mut value = serde_json::to_value(e).map_err(|e| StoreError::Export(e.into()))?;
    if let Value::Object(m) = &mut value {
        m.insert("prev_hash".into(), hash::to_hex(&prev).into());
    }
    Ok(value)
}
