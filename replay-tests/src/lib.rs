//! Recorded incidents as event logs (JSON lines in `fixtures/`), replayed
//! into the projections and compared as insta snapshots.
//!
//! What belongs here: the incidents' recordings, the code that recorded
//! them (`src/bin/record-incidents.rs`, driving the real domain decisions
//! into a real SQLite store), and the replay tests. What must not:
//! production code.
//!
//! A fixture is a log as `llmgw events export` writes it, so a real
//! incident becomes a test by exporting, trimming to the interesting range
//! and committing it (see `fixtures/README.md`).

pub mod incidents;

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use llmgw_eventstore::{RecordedEvent, hash};
use llmgw_projections::Projections;

/// The fixtures directory of this crate.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Reads an exported log and checks its hash chain, as `events import` does.
pub fn read_log(path: &Path) -> anyhow::Result<Vec<RecordedEvent>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut events: Vec<RecordedEvent> = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let e: RecordedEvent =
            serde_json::from_str(line).with_context(|| format!("{}:{}", path.display(), i + 1))?;
        let prev = match events.last() {
            Some(p) => Some(p.hash),
            None if e.position == 1 => Some(hash::GENESIS),
            None => None,
        };
        if let Some(prev) = prev
            && hash::chain(&prev, &e) != e.hash
        {
            bail!("{}:{}: hash does not match", path.display(), i + 1);
        }
        events.push(e);
    }
    Ok(events)
}

/// Every view after the whole log.
pub fn replay(events: &[RecordedEvent]) -> Projections {
    let mut p = Projections::default();
    for e in events {
        p.apply(e);
    }
    p
}
