//! `llmgw events import`: the inverse of `events export`, verbatim.
//!
//! The store writes every event as it was (position, time, epoch, hash) in
//! one transaction, and refuses a file that does not continue its log
//! exactly (see `EventStore::import`). This side reads the file as a
//! stream and checks each line's place in the chain as it goes, so that a
//! refusal names the line, not only the position.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use llmgw_eventstore::{
    AnyStore, ChainCheck, EventStore, ImportOptions, RecordedEvent, StoreAddress, StoreError, hash,
};
use serde::Deserialize;

use crate::Outcome;

const TTL: Duration = Duration::from_secs(60);

/// `HASH@POSITION`: the hash a log has at a position, as an auditor holds
/// it from the source.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Anchor {
    pub(crate) position: u64,
    pub(crate) hash: [u8; 32],
}

impl std::str::FromStr for Anchor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not HASH@POSITION (64 hex digits, then @ and a position)");
        let (h, p) = s.split_once('@').ok_or_else(bad)?;
        Ok(Anchor {
            position: p.trim().parse().ok().filter(|p| *p > 0).ok_or_else(bad)?,
            hash: hash::from_hex(&h.trim().to_ascii_lowercase()).ok_or_else(bad)?,
        })
    }
}

impl std::fmt::Display for Anchor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", hash::to_hex(&self.hash), self.position)
    }
}

/// What an export's first line may say besides the event.
#[derive(Debug, Deserialize)]
struct FirstLine {
    #[serde(default)]
    prev_hash: Option<String>,
}

/// The export's lines as events, each checked against the one before.
struct Lines {
    reader: Box<dyn BufRead + Send>,
    line: usize,
    check: ChainCheck,
    pending: Option<RecordedEvent>,
    done: bool,
}

impl Lines {
    /// The next event, or the reason the file cannot be imported.
    fn next_event(&mut self) -> Result<Option<RecordedEvent>, StoreError> {
        let refused = StoreError::ImportRefused;
        let mut text = String::new();
        loop {
            text.clear();
            self.line += 1;
            let n = self
                .reader
                .read_line(&mut text)
                .map_err(|e| refused(format!("line {}: cannot read: {e}", self.line)))?;
            if n == 0 {
                return self
                    .check
                    .finish()
                    .map(|()| None)
                    .map_err(|r| refused(format!("at the end of the file: {r}")));
            }
            if !text.trim().is_empty() {
                break;
            }
        }
        let event: RecordedEvent = serde_json::from_str(&text).map_err(|e| {
            let cut = if e.is_eof() {
                " (the file was cut short?)"
            } else {
                ""
            };
            refused(format!(
                "line {}: not an exported event{cut}: {e}",
                self.line
            ))
        })?;
        self.check.push(&event).map_err(|r| {
            refused(format!(
                "line {} (position {}): {r}",
                self.line, event.position
            ))
        })?;
        Ok(Some(event))
    }
}

impl Iterator for Lines {
    type Item = Result<RecordedEvent, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if let Some(first) = self.pending.take() {
            return Some(Ok(first));
        }
        match self.next_event() {
            Ok(Some(e)) => Some(Ok(e)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

fn open(input: &Path) -> anyhow::Result<Box<dyn BufRead + Send>> {
    let reader: Box<dyn Read + Send> = if input.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(
            std::fs::File::open(input)
                .with_context(|| format!("cannot open {}", input.display()))?,
        )
    };
    Ok(Box::new(BufReader::with_capacity(1 << 20, reader)))
}

/// A SQLite file the import is about to create: removed again if the
/// import is refused, so that a refusal leaves nothing behind.
pub(crate) fn new_sqlite_file(address: &str) -> Option<PathBuf> {
    match StoreAddress::parse(address).ok()? {
        StoreAddress::Sqlite(path) if !path.exists() => Some(path),
        _ => None,
    }
}

pub(super) async fn run(
    store: &AnyStore,
    input: &Path,
    from_anchor: bool,
    anchors: &[Anchor],
) -> anyhow::Result<Outcome> {
    let anchors: Vec<(u64, [u8; 32])> = anchors.iter().map(|a| (a.position, a.hash)).collect();
    // The first line may name the hash before it: read it before the rest.
    let mut lines = Lines {
        reader: open(input)?,
        line: 0,
        check: ChainCheck::default(),
        pending: None,
        done: false,
    };
    let mut first_text = String::new();
    let prev_hash =
        loop {
            first_text.clear();
            lines.line += 1;
            if lines.reader.read_line(&mut first_text)? == 0 {
                println!("nothing to import");
                return Ok(Outcome::Ok);
            }
            if first_text.trim().is_empty() {
                continue;
            }
            let said: FirstLine = serde_json::from_str(&first_text)
                .with_context(|| format!("line {}: not an exported event", lines.line))?;
            break match said.prev_hash {
                Some(h) => Some(hash::from_hex(&h).with_context(|| {
                    format!("line {}: prev_hash is not 64 hex digits", lines.line)
                })?),
                None => None,
            };
        };
    lines.check = ChainCheck::new(prev_hash, &anchors);
    let first: RecordedEvent = serde_json::from_str(&first_text)
        .with_context(|| format!("line {}: not an exported event", lines.line))?;
    if let Err(r) = lines.check.push(&first) {
        bail!("line {} (position {}): {r}", lines.line, first.position);
    }
    lines.pending = Some(first);

    let holder = format!("import-{}", std::process::id());
    let lease = store
        .acquire_lease(&holder, TTL)
        .await
        .map_err(|e| match e {
            StoreError::LeaseHeld { .. } => anyhow::Error::new(e)
                .context("an import appends under the append lease; stop the server that holds it"),
            other => other.into(),
        })?;
    let options = ImportOptions {
        prev_hash,
        from_anchor,
        anchors,
    };
    let result = store.import(&lease.token, &options, lines).await;
    // The import ends the lease itself when the events carry a newer epoch.
    store.release_lease(&lease.token).await?;
    let done = result?;
    let head = Anchor {
        position: done.head,
        hash: done.head_hash,
    };
    match done.positions {
        Some((f, l)) => println!(
            "imported {} events at positions {f}..={l}; {} were already present; the chain head is {head}",
            done.written, done.present
        ),
        None => println!(
            "imported nothing; all {} events were already present; the chain head is {head}",
            done.present
        ),
    }
    if let Some(p) = done.from_anchor {
        println!(
            "the log begins after position {p}, whose hash the file named and nothing here could check (--from-anchor)"
        );
    }
    Ok(Outcome::Ok)
}
