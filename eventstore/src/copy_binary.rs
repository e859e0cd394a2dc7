//! The replay read on PostgreSQL: a page of events as `COPY … TO STDOUT
//! (FORMAT binary)`, taken apart as it arrives.
//!
//! Why COPY: a `SELECT` result costs the server a row description, a data
//! row message and a text rendering per column; the string aggregate the
//! page was read with before cost it building one large text. COPY sends
//! each row as fixed-width binary fields and the payload's text, which is
//! the cheapest the server can produce (the benchmark's ceiling is this same
//! COPY of the whole log). The columns, in order:
//!
//! ```text
//! position int8, stream_version int8, schema_version int4,
//! recorded_at timestamptz, event_id uuid, event_type text, stream_id text,
//! payload::text
//! ```
//!
//! The binary format: an 11-byte signature, a 4-byte flags word and a
//! 4-byte header-extension length (and that many bytes); then per row a
//! 2-byte field count and per field a 4-byte length and its bytes; then a
//! field count of -1. All integers big-endian; `timestamptz` is
//! microseconds since 2000-01-01 UTC.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::text_page::{Row, TextPage};
use crate::{Result, StoreError};

/// The page's query, for events after `after`, at most `limit` of them.
/// COPY takes no parameters: both are integers, written into the text.
pub(crate) fn statement(after: i64, limit: usize) -> String {
    format!(
        "COPY (SELECT position, stream_version, schema_version, recorded_at, event_id,
                      event_type, stream_id, payload::text
                 FROM es_events WHERE position > {after} ORDER BY position LIMIT {limit})
         TO STDOUT (FORMAT binary)"
    )
}

const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";
const FIELDS: i16 = 8;
/// 2000-01-01T00:00:00Z in Unix microseconds: PostgreSQL's epoch.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// Takes the COPY data apart in whatever pieces it arrives in: complete
/// rows become events at once (their texts copied into the page's one
/// text), a row cut between two pieces waits for the rest.
#[derive(Debug)]
pub(crate) struct Parser {
    after: u64,
    buf: Vec<u8>,
    header: bool,
    ended: bool,
    page: TextPage,
}

impl Parser {
    /// A parser filling `page` (emptied first; its memory is reused).
    pub(crate) fn new(after: u64, limit: usize, mut page: TextPage) -> Parser {
        page.clear();
        // Room for the texts of `limit` usual events (a few hundred bytes
        // each): the text grows by doubling past that.
        let events = limit.min(100_000);
        page.reserve(events, events * 256);
        Parser {
            after,
            buf: Vec::new(),
            header: false,
            ended: false,
            page,
        }
    }

    fn corrupt(&self, what: &str) -> StoreError {
        StoreError::Corrupt {
            position: self.page.last_position().map_or(self.after + 1, |p| p + 1),
            reason: format!("reading a page of events (COPY): {what}"),
        }
    }

    /// The next piece of the COPY data.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<()> {
        if self.buf.is_empty() {
            let used = self.parse(chunk)?;
            self.buf.extend_from_slice(&chunk[used..]);
        } else {
            self.buf.extend_from_slice(chunk);
            let buf = std::mem::take(&mut self.buf);
            let used = self.parse(&buf)?;
            self.buf = buf;
            self.buf.drain(..used);
        }
        Ok(())
    }

    /// The events, once the data has ended.
    pub(crate) fn finish(self) -> Result<TextPage> {
        if !self.ended || !self.buf.is_empty() {
            return Err(self.corrupt("the data is cut short"));
        }
        // ORDER BY position orders the rows; make sure, as the text page does.
        let mut page = self.page;
        page.sort();
        Ok(page)
    }

    /// Parses what is complete in `data`; returns the bytes used.
    fn parse(&mut self, data: &[u8]) -> Result<usize> {
        let mut at = 0;
        if !self.header {
            let Some(fixed) = data.get(..SIGNATURE.len() + 8) else {
                return Ok(0);
            };
            if &fixed[..SIGNATURE.len()] != SIGNATURE {
                return Err(self.corrupt("not binary COPY data"));
            }
            let ext = be_i32(&fixed[SIGNATURE.len() + 4..]);
            let len = fixed.len() + usize::try_from(ext).map_err(|_| self.corrupt("header"))?;
            if data.len() < len {
                return Ok(0);
            }
            self.header = true;
            at = len;
        }
        while at < data.len() {
            if self.ended {
                return Err(self.corrupt("data after the end"));
            }
            match self.row(&data[at..])? {
                Some(used) => at += used,
                None => break,
            }
        }
        Ok(at)
    }

    /// One row from the start of `data`: the bytes it took, or `None` when
    /// `data` holds only part of it.
    fn row(&mut self, data: &[u8]) -> Result<Option<usize>> {
        let Some(count) = data.get(..2) else {
            return Ok(None);
        };
        let count = i16::from_be_bytes([count[0], count[1]]);
        if count == -1 {
            self.ended = true;
            return Ok(Some(2));
        }
        if count != FIELDS {
            return Err(self.corrupt(&format!("{count} columns, not {FIELDS}")));
        }
        let mut at = 2;
        let mut fields: [&[u8]; FIELDS as usize] = [&[]; FIELDS as usize];
        for field in &mut fields {
            let Some(len) = data.get(at..at + 4) else {
                return Ok(None);
            };
            let len = be_i32(len);
            // No column here is nullable.
            let len = usize::try_from(len).map_err(|_| self.corrupt("a NULL"))?;
            at += 4;
            let Some(bytes) = data.get(at..at + len) else {
                return Ok(None);
            };
            *field = bytes;
            at += len;
        }
        let int = |b: &[u8], what: &str| -> Result<i64> {
            match b.len() {
                8 => Ok(i64::from_be_bytes(b.try_into().unwrap_or_default())),
                4 => Ok(i64::from(be_i32(b))),
                _ => Err(self.corrupt(what)),
            }
        };
        let text = |b, what: &str| std::str::from_utf8(b).map_err(|_| self.corrupt(what));
        let position = int(fields[0], "a position")?;
        let stream_version = int(fields[1], "a stream version")?;
        let schema_version = int(fields[2], "a schema version")?;
        let recorded_at = int(fields[3], "a time")?;
        let event_id = Uuid::from_slice(fields[4]).map_err(|_| self.corrupt("an event id"))?;
        let row = Row {
            position: position as u64,
            stream_version: stream_version as u64,
            schema_version: schema_version as u32,
            recorded_at: DateTime::<Utc>::from_timestamp_micros(
                recorded_at.saturating_add(PG_EPOCH_MICROS),
            )
            .unwrap_or_default(),
            event_id,
            event_type: 0..0,
            stream_id: 0..0,
            payload: 0..0,
        };
        let (event_type, stream_id, payload) = (
            text(fields[5], "an event type")?,
            text(fields[6], "a stream id")?,
            text(fields[7], "a payload")?,
        );
        self.page.push(row, event_type, stream_id, payload);
        Ok(Some(at))
    }
}

/// The first four bytes of `b` (which has at least four) as a big-endian
/// `i32`.
fn be_i32(b: &[u8]) -> i32 {
    i32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(out: &mut Vec<u8>, bytes: &[u8]) {
        out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
        out.extend_from_slice(bytes);
    }

    fn row(out: &mut Vec<u8>, position: i64, kind: &str, stream: &str, payload: &str) {
        out.extend_from_slice(&FIELDS.to_be_bytes());
        field(out, &position.to_be_bytes());
        field(out, &3i64.to_be_bytes());
        field(out, &1i32.to_be_bytes());
        // 2023-11-14T22:13:20Z
        field(
            out,
            &(1_700_000_000_000_000 - PG_EPOCH_MICROS).to_be_bytes(),
        );
        field(out, Uuid::from_u128(position as u128).as_bytes());
        field(out, kind.as_bytes());
        field(out, stream.as_bytes());
        field(out, payload.as_bytes());
    }

    fn data() -> Vec<u8> {
        let mut out = SIGNATURE.to_vec();
        out.extend_from_slice(&0i32.to_be_bytes());
        out.extend_from_slice(&0i32.to_be_bytes());
        row(&mut out, 7, "E", "s 1", r#"{"x": "y z"}"#);
        row(&mut out, 8, "ü\u{1f}", "ß", "{}");
        out.extend_from_slice(&(-1i16).to_be_bytes());
        out
    }

    #[test]
    fn rows_are_read_whatever_pieces_they_arrive_in() {
        let data = data();
        for piece in [1, 2, 3, 7, 19, data.len()] {
            let mut p = Parser::new(6, 10, TextPage::default());
            for chunk in data.chunks(piece) {
                p.feed(chunk).unwrap();
            }
            let page = p.finish().unwrap();
            let events: Vec<_> = page.iter().collect();
            assert_eq!(events.len(), 2, "pieces of {piece}");
            let e = &events[0];
            assert_eq!(
                (e.position, e.stream_id, e.payload),
                (7, "s 1", r#"{"x": "y z"}"#)
            );
            assert_eq!((e.stream_version, e.schema_version), (3, 1));
            assert_eq!(e.recorded_at.timestamp_micros(), 1_700_000_000_000_000);
            assert_eq!(e.event_id, Uuid::from_u128(7));
            assert_eq!(
                (events[1].event_type, events[1].stream_id),
                ("ü\u{1f}", "ß")
            );
        }
    }

    #[test]
    fn a_reused_page_holds_only_the_new_rows() {
        let data = data();
        let mut page = TextPage::default();
        for _ in 0..3 {
            let mut p = Parser::new(6, 10, page);
            p.feed(&data).unwrap();
            page = p.finish().unwrap();
            let seen: Vec<_> = page.iter().map(|e| (e.position, e.payload)).collect();
            assert_eq!(seen, [(7, r#"{"x": "y z"}"#), (8, "{}")]);
        }
    }

    #[test]
    fn cut_data_is_corrupt_not_a_panic() {
        let data = data();
        for cut in 0..data.len() {
            let mut p = Parser::new(6, 10, TextPage::default());
            let fed = p.feed(&data[..cut]);
            assert!(
                matches!(
                    fed.and_then(|()| p.finish()),
                    Err(StoreError::Corrupt { .. })
                ),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_null_or_a_wrong_width_is_corrupt() {
        let mut data = data();
        // The first row's position field: its length, then its 8 bytes.
        let first = SIGNATURE.len() + 8 + 2;
        data[first..first + 4].copy_from_slice(&(-1i32).to_be_bytes());
        let mut p = Parser::new(6, 10, TextPage::default());
        assert!(matches!(
            p.feed(&data),
            Err(StoreError::Corrupt { position: 7, .. })
        ));
    }
}
