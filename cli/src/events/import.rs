//! `llmgw events import`: the inverse of `events export`.
//!
//! The file's hash chain is checked before anything is appended: an export
//! that was altered, reordered or cut in the middle is refused whole.
//! Events keep their ids, so a second run appends nothing. They keep their
//! order too: a batch never holds two runs of the same stream, so the
//! relative order of every event is what it was in the export.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use llmgw_eventstore::{
    AnyStore, EventStore, ExpectedVersion, NewEvent, RecordedEvent, StoreError, StreamAppend,
    Writer, hash,
};

use crate::Outcome;

const BATCH: usize = 500;
const TTL: Duration = Duration::from_secs(60);

type Line = RecordedEvent;

pub(super) async fn run(store: &AnyStore, input: &Path) -> anyhow::Result<Outcome> {
    let lines = super::read_lines(input)?;
    let events = parse(&lines)?;
    if events.is_empty() {
        println!("nothing to import");
        return Ok(Outcome::Ok);
    }
    let holder = format!("import-{}", std::process::id());
    let lease = store
        .acquire_lease(&holder, TTL)
        .await
        .map_err(|e| match e {
            StoreError::LeaseHeld { .. } => anyhow::Error::new(e)
                .context("an import appends under the append lease; stop the server that holds it"),
            other => other.into(),
        })?;
    let writer = Writer::Leader(lease.token.clone());
    let result = append_all(store, &writer, &events).await;
    store.release_lease(&lease.token).await?;
    let tally = result?;
    match (tally.first, tally.last) {
        (Some(f), Some(l)) => println!(
            "imported {} events at positions {f}..={l}; {} were already present",
            tally.written, tally.present
        ),
        _ => println!(
            "imported nothing; all {} events were already present",
            tally.present
        ),
    }
    Ok(Outcome::Ok)
}

fn parse(lines: &[String]) -> anyhow::Result<Vec<Line>> {
    let mut events: Vec<Line> = Vec::new();
    for (i, text) in lines.iter().enumerate() {
        if text.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(text)
            .with_context(|| format!("line {}: not an exported event", i + 1))?;
        // The chain links each event to the one before; the first event of a
        // range that starts after position 1 can only be checked from there on.
        let prev = match events.last() {
            Some(p) if line.position != p.position + 1 => bail!(
                "line {}: position {} follows {}; an export is one unbroken range",
                i + 1,
                line.position,
                p.position
            ),
            Some(p) => Some(p.hash),
            None if line.position == 1 => Some(hash::GENESIS),
            None => None,
        };
        if let Some(prev) = prev
            && hash::chain(&prev, &line) != line.hash
        {
            bail!(
                "line {} (position {}): its hash does not match its content; the export was altered",
                i + 1,
                line.position
            );
        }
        events.push(line);
    }
    let mut next_version: HashMap<&str, u64> = HashMap::new();
    for e in &events {
        let want = next_version
            .entry(e.stream_id.as_str())
            .or_insert(e.stream_version);
        if e.stream_version != *want {
            bail!(
                "position {}: stream {} jumps from version {} to {}",
                e.position,
                e.stream_id,
                *want - 1,
                e.stream_version
            );
        }
        *want += 1;
    }
    Ok(events)
}

#[derive(Debug, Default)]
struct Tally {
    written: u64,
    present: u64,
    first: Option<u64>,
    last: Option<u64>,
}

/// Groups events into batches of whole runs and appends them in order.
async fn append_all(store: &AnyStore, writer: &Writer, events: &[Line]) -> anyhow::Result<Tally> {
    let mut tally = Tally::default();
    let mut batch: Vec<StreamAppend> = Vec::new();
    let mut i = 0;
    while i < events.len() {
        let stream = &events[i].stream_id;
        let run_len = events[i..]
            .iter()
            .take_while(|e| &e.stream_id == stream)
            .count()
            .min(BATCH);
        let size: usize = batch.iter().map(|s| s.events.len()).sum();
        if batch.iter().any(|s| &s.stream_id == stream) || size + run_len > BATCH {
            flush(store, writer, &mut batch, &mut tally).await?;
        }
        let run = &events[i..i + run_len];
        let new_events = run
            .iter()
            .map(|e| {
                NewEvent::new(e.event_type.clone(), e.schema_version, e.payload.clone())
                    .with_id(e.event_id)
                    .with_metadata(e.metadata.clone())
            })
            .collect();
        let expected = ExpectedVersion::Exact(run[0].stream_version - 1);
        batch.push(StreamAppend::new(stream.clone(), expected, new_events));
        i += run_len;
    }
    flush(store, writer, &mut batch, &mut tally).await?;
    Ok(tally)
}

async fn flush(
    store: &AnyStore,
    writer: &Writer,
    batch: &mut Vec<StreamAppend>,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let appended = store
        .append(writer, batch)
        .await
        .context("appending imported events")?;
    let n: u64 = batch.iter().map(|s| s.events.len() as u64).sum();
    if appended.deduplicated {
        tally.present += n;
    } else {
        tally.written += n;
        tally.first.get_or_insert(appended.first_position);
        tally.last = Some(appended.last_position);
    }
    batch.clear();
    Ok(())
}
