//! Reading an export file line by line, for `events import` and `events
//! verify --file`: every event checked against the one before it as it is
//! read (so a refusal names its line), and the trailer against the events.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use anyhow::Context;
use llmgw_eventstore::{ChainCheck, ExportLine, RecordedEvent, Trailer, hash, parse_line};
use serde::Deserialize;

/// `HASH@POSITION`: the hash a log has at a position, as an auditor holds
/// it from the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// An export being read: its events in order, each checked as it comes.
pub(crate) struct ExportFile {
    reader: Box<dyn BufRead + Send>,
    line: usize,
    pub(crate) check: ChainCheck,
    /// The predecessor hash the first line names, once it has been read.
    pub(crate) prev_hash: Option<[u8; 32]>,
    pub(crate) first: Option<RecordedEvent>,
    pub(crate) trailer: Option<Trailer>,
    anchors: Vec<(u64, [u8; 32])>,
}

impl ExportFile {
    pub(crate) fn open(input: &Path, anchors: &[Anchor]) -> anyhow::Result<Self> {
        let reader: Box<dyn Read + Send> = if input.as_os_str() == "-" {
            Box::new(std::io::stdin())
        } else {
            Box::new(
                std::fs::File::open(input)
                    .with_context(|| format!("cannot open {}", input.display()))?,
            )
        };
        Ok(ExportFile {
            reader: Box::new(BufReader::with_capacity(1 << 20, reader)),
            line: 0,
            check: ChainCheck::default(),
            prev_hash: None,
            first: None,
            trailer: None,
            anchors: anchors.iter().map(|a| (a.position, a.hash)).collect(),
        })
    }

    /// The next event, checked; `None` at the end of the file (with the
    /// trailer, if there was one, checked too).
    pub(crate) fn next_event(&mut self) -> Result<Option<RecordedEvent>, String> {
        let mut text = String::new();
        loop {
            text.clear();
            self.line += 1;
            let n = self
                .reader
                .read_line(&mut text)
                .map_err(|e| format!("line {}: cannot read: {e}", self.line))?;
            if n == 0 {
                return self
                    .check
                    .finish()
                    .map(|()| None)
                    .map_err(|r| format!("at the end of the file: {r}"));
            }
            if text.trim().is_empty() {
                continue;
            }
            let parsed = parse_line(&text).map_err(|e| {
                let cut = if e.is_eof() {
                    " (the file was cut short?)"
                } else {
                    ""
                };
                format!("line {}: not an exported event{cut}: {e}", self.line)
            })?;
            let event = match parsed {
                ExportLine::Trailer(t) => {
                    if self.trailer.is_some() {
                        return Err(format!("line {}: a second trailer", self.line));
                    }
                    self.check
                        .check_trailer(&t)
                        .map_err(|r| format!("line {} (the trailer): {r}", self.line))?;
                    self.trailer = Some(t);
                    continue;
                }
                ExportLine::Event(_) if self.trailer.is_some() => {
                    return Err(format!(
                        "line {}: an event after the export's trailer",
                        self.line
                    ));
                }
                ExportLine::Event(e) => *e,
            };
            if self.first.is_none() {
                self.start(&text, &event)?;
            }
            self.check
                .push(&event)
                .map_err(|r| format!("line {} (position {}): {r}", self.line, event.position))?;
            return Ok(Some(event));
        }
    }

    /// The first event: the predecessor hash its line names starts the
    /// chain check.
    fn start(&mut self, text: &str, event: &RecordedEvent) -> Result<(), String> {
        let said: FirstLine = serde_json::from_str(text)
            .map_err(|e| format!("line {}: not an exported event: {e}", self.line))?;
        self.prev_hash = match said.prev_hash {
            Some(h) => Some(
                hash::from_hex(&h)
                    .ok_or_else(|| format!("line {}: prev_hash is not 64 hex digits", self.line))?,
            ),
            None => None,
        };
        self.check = ChainCheck::new(self.prev_hash, &self.anchors);
        self.first = Some(event.clone());
        Ok(())
    }
}
