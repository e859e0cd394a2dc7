//! Reading an export file line by line, for `events import` and `events
//! verify --file`: every event checked against the one before it as it is
//! read (so a refusal names its line), and the trailer against the events.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use anyhow::Context;
use llmgw_eventstore::signing::{Checked, PublicKey};
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

/// `--public-key`: 64 hex digits, or a file holding them or a PEM public
/// key (`openssl pkey -pubout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyArg(pub(crate) PublicKey);

impl std::str::FromStr for KeyArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(k) = PublicKey::parse(s) {
            return Ok(KeyArg(k));
        }
        let text = std::fs::read_to_string(s)
            .map_err(|e| format!("{s:?} is neither 64 hex digits nor a readable file: {e}"))?;
        PublicKey::parse(&text)
            .map(KeyArg)
            .map_err(|e| format!("{s}: {e}"))
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
    /// The capture header, if the file begins with one.
    pub(crate) header: Option<serde_json::Value>,
    /// What the trailer's signature check found (`None`: not signed).
    pub(crate) signature: Option<Checked>,
    /// The key the signature must be by (`--public-key`).
    trusted: Option<PublicKey>,
    /// The hashes of the last events read, for the anchors the log records
    /// (an anchor names a position just before its own).
    recent: std::collections::VecDeque<(u64, [u8; 32])>,
    /// The last `AnchorRecorded` read, and whether its hash was checked.
    pub(crate) last_anchor: Option<LogAnchor>,
    /// Every event's hash, in order: a file compared with its store names
    /// the first position where they part (32 bytes an event).
    pub(crate) hashes: Vec<[u8; 32]>,
}

/// An anchor the log recorded (`AnchorRecorded`), as a check found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogAnchor {
    pub(crate) anchor: Anchor,
    /// The position of the event that recorded it, and when.
    pub(crate) event: u64,
    pub(crate) recorded_at: chrono::DateTime<chrono::Utc>,
    /// False when the anchored position was not there to compare with.
    pub(crate) checked: bool,
}

/// The longest line an export may hold. The largest real event, a usage
/// batch at its 100,000 requests, is ~9 MiB in columns (~30 MiB in the
/// older list of objects); a line past this is no export, and reading it
/// whole held the whole of it (a 400 MB line took 970 MB before its
/// refusal).
pub(crate) const MAX_LINE: usize = 64 << 20;

/// How many recent hashes a file check keeps for the log's anchors.
const RECENT: usize = 4096;

/// The anchor an `AnchorRecorded` event names, if `e` is one.
pub(crate) fn recorded_anchor(e: &RecordedEvent) -> Option<Anchor> {
    if e.event_type != "AnchorRecorded" {
        return None;
    }
    Some(Anchor {
        position: e.payload["position"].as_u64()?,
        hash: hash::from_hex(e.payload["hash"].as_str()?)?,
    })
}

impl ExportFile {
    /// `trusted`: the public key the trailer must be signed with.
    pub(crate) fn open(
        input: &Path,
        anchors: &[Anchor],
        trusted: Option<PublicKey>,
    ) -> anyhow::Result<Self> {
        let reader: Box<dyn Read + Send> = if input.as_os_str() == "-" {
            Box::new(std::io::stdin())
        } else {
            // Said here, not found as a bad first line: what cannot be
            // read is no evidence of tampering.
            if input.is_dir() {
                anyhow::bail!("{} is a directory, not an export", input.display());
            }
            Box::new(
                std::fs::File::open(input)
                    .with_context(|| format!("cannot open {}", input.display()))?,
            )
        };
        Ok(ExportFile {
            reader: Box::new(BufReader::with_capacity(1 << 20, reader)),
            line: 0,
            check: ChainCheck::new(
                None,
                &anchors
                    .iter()
                    .map(|a| (a.position, a.hash))
                    .collect::<Vec<_>>(),
            ),
            prev_hash: None,
            first: None,
            trailer: None,
            header: None,
            signature: None,
            trusted,
            recent: std::collections::VecDeque::with_capacity(RECENT),
            last_anchor: None,
            hashes: Vec::new(),
        })
    }

    /// The next event, checked; `None` at the end of the file (with the
    /// trailer, if there was one, checked too).
    pub(crate) fn next_event(&mut self) -> Result<Option<RecordedEvent>, String> {
        let mut bytes = Vec::new();
        loop {
            bytes.clear();
            self.line += 1;
            let n = read_line(&mut self.reader, &mut bytes, MAX_LINE)
                .map_err(|e| format!("line {}: {e}", self.line))?;
            let text = std::str::from_utf8(&bytes).map_err(|e| {
                format!("line {}: not an exported event: not UTF-8 ({e})", self.line)
            })?;
            if n == 0 {
                self.check
                    .finish()
                    .map_err(|r| format!("at the end of the file: {r}"))?;
                if let (Some(key), None) = (&self.trusted, &self.signature) {
                    return Err(format!(
                        "at the end of the file: it is not signed (no signed trailer), and --public-key asks for a signature by {}",
                        key.short()
                    ));
                }
                return Ok(None);
            }
            if text.trim().is_empty() {
                continue;
            }
            let parsed = parse_line(text).map_err(|e| {
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
                    self.signature = t
                        .check_signature(self.trusted.as_ref())
                        .map_err(|r| format!("line {} (the trailer): {r}", self.line))?;
                    self.trailer = Some(*t);
                    continue;
                }
                ExportLine::Header(h) => {
                    self.check
                        .header(&h)
                        .map_err(|r| format!("line {}: {r}", self.line))?;
                    self.header = Some(h);
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
                self.start(text, &event)?;
            }
            self.check
                .push(&event)
                .map_err(|r| format!("line {} (position {}): {r}", self.line, event.position))?;
            self.anchored(&event)
                .map_err(|r| format!("line {} (position {}): {r}", self.line, event.position))?;
            return Ok(Some(event));
        }
    }

    /// Keeps the event's hash; checks the anchor it records, if it is one.
    fn anchored(&mut self, e: &RecordedEvent) -> Result<(), String> {
        if let Some(a) = recorded_anchor(e) {
            let found = self
                .recent
                .iter()
                .rev()
                .find(|(p, _)| *p == a.position)
                .map(|(_, h)| *h);
            if let Some(h) = found
                && h != a.hash
            {
                return Err(format!(
                    "the anchor recorded here names {a}, but the file's hash at {} is {}: the log before it was rewritten",
                    a.position,
                    hash::to_hex(&h[..6])
                ));
            }
            self.last_anchor = Some(LogAnchor {
                anchor: a,
                event: e.position,
                recorded_at: e.recorded_at,
                checked: found.is_some(),
            });
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((e.position, e.hash));
        self.hashes.push(e.hash);
        Ok(())
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
        self.check.set_predecessor(self.prev_hash);
        self.first = Some(event.clone());
        Ok(())
    }
}

/// One line of `reader` into `line` (its newline kept), at most `max`
/// bytes: a longer one is refused once `max` bytes are read, without
/// reading on. How many bytes were read; 0 at the end.
fn read_line(reader: &mut impl BufRead, line: &mut Vec<u8>, max: usize) -> Result<usize, String> {
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let n = reader
        .take(limit)
        .read_until(b'\n', line)
        .map_err(|e| format!("cannot read: {e}"))?;
    if n > max {
        return Err(format!(
            "longer than {} MiB, which no exported event is: the file is not an export, or was damaged",
            max >> 20
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_longer_than_the_limit_is_refused_without_reading_it_all() {
        let text = format!("short\n{}\nafter\n", "x".repeat(3 << 20));
        let mut reader = std::io::Cursor::new(text.into_bytes());
        let mut line = Vec::new();
        assert_eq!(read_line(&mut reader, &mut line, 2 << 20), Ok(6));
        line.clear();
        let refused = read_line(&mut reader, &mut line, 2 << 20).unwrap_err();
        assert!(refused.contains("longer than 2 MiB"), "{refused}");
        // Read as far as the limit, and no further.
        assert_eq!(line.len(), (2 << 20) + 1);
        assert_eq!(reader.position(), 6 + (2 << 20) + 1);
    }

    #[test]
    fn a_line_at_the_limit_and_the_last_without_a_newline_are_read() {
        let mut reader = std::io::Cursor::new(b"abcd\nxy".to_vec());
        let mut line = Vec::new();
        assert_eq!(read_line(&mut reader, &mut line, 5), Ok(5));
        line.clear();
        assert_eq!(read_line(&mut reader, &mut line, 5), Ok(2));
        assert_eq!(line, b"xy");
        line.clear();
        assert_eq!(read_line(&mut reader, &mut line, 5), Ok(0));
    }
}
