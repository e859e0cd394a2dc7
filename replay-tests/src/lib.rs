//! Recorded incidents as event logs (JSON lines in `fixtures/`), replayed
//! into the projections and compared as insta snapshots.
//!
//! What belongs here: the incidents' recordings, the code that recorded
//! them (`src/bin/record-incidents.rs`, driving the real domain decisions
//! into a real SQLite store), and the replay tests. What must not:
//! production code.
//!
//! A fixture is a log as `llmgw events export` writes it. A real incident
//! becomes a test with `llmgw events capture` (see `fixtures/README.md`),
//! which writes the fixture with a header, a test that replays it through
//! [`timeline::Timeline`], and the story of it as the test's first snapshot.

pub mod incidents;
pub mod timeline;

/// `fixtures/README.md`, whose Rust example runs as a doctest, so the guide
/// cannot drift from the helpers it teaches.
#[doc = include_str!("../fixtures/README.md")]
#[cfg(doctest)]
pub struct FixturesReadme;

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use llmgw_eventstore::{ChainCheck, ExportLine, RecordedEvent, parse_line};
use llmgw_projections::Projections;

/// The fixtures directory of this crate.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Reads an exported log and checks it as `events import` does: each hash
/// over its content and the one before, and the trailer, if the export
/// still ends with one, over the events.
pub fn read_log(path: &Path) -> anyhow::Result<Vec<RecordedEvent>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut events: Vec<RecordedEvent> = Vec::new();
    let mut check = ChainCheck::default();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = || format!("{}:{}", path.display(), i + 1);
        match parse_line(line).with_context(at)? {
            ExportLine::Trailer(t) => check
                .check_trailer(&t)
                .map_err(|r| anyhow!("{}: {r}", at()))?,
            ExportLine::Header(h) => check.header(&h).map_err(|r| anyhow!("{}: {r}", at()))?,
            ExportLine::Event(e) => {
                check.push(&e).map_err(|r| anyhow!("{}: {r}", at()))?;
                events.push(*e);
            }
        }
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
