//! The page of events SQLite hands the text read (`read_all_text_raw`) as
//! one value: for each event, in position order,
//!
//! ```text
//! <position> <stream_version> <schema_version> <recorded_at µs> <event_id> <type bytes> <stream bytes> <payload bytes> <type><stream><payload>
//! ```
//!
//! with nothing between events. Every text field is preceded by its length
//! in bytes, so no content, however odd, can be mistaken for a delimiter.
//! The page's texts stay where they are: the [`TextPage`] is this text with
//! each event's place in it.

use uuid::Uuid;

use crate::text_page::{Row, TextPage};
use crate::{Result, StoreError};

/// The events of one page; `after` is where the page was asked to start,
/// for naming the place of a malformed one.
pub(crate) fn parse(page: String, after: u64) -> Result<TextPage> {
    let mut rows: Vec<Row> = Vec::new();
    let mut rest = page.as_str();
    while !rest.is_empty() {
        let at = rows.last().map_or(after + 1, |e| e.position + 1);
        let corrupt = |what: &str| StoreError::Corrupt {
            position: at,
            reason: format!("reading a page of events: {what}"),
        };
        let mut word = || -> Result<&str> {
            let (w, r) = rest
                .split_once(' ')
                .ok_or_else(|| corrupt("a field is cut short"))?;
            rest = r;
            Ok(w)
        };
        let number = |w: &str| w.parse::<i64>().map_err(|_| corrupt("a number"));
        let position = number(word()?)?;
        let stream_version = number(word()?)?;
        let schema_version = number(word()?)?;
        let recorded_at = number(word()?)?;
        let event_id: Uuid = word()?.parse().map_err(|_| corrupt("an event id"))?;
        let type_len = number(word()?)? as usize;
        let stream_len = number(word()?)? as usize;
        let payload_len = number(word()?)? as usize;
        // Where each text lies in `page`: `get` checks that it is there and
        // on character boundaries.
        let mut text = |n: usize| -> Result<std::ops::Range<usize>> {
            let start = page.len() - rest.len();
            rest.get(..n)
                .ok_or_else(|| corrupt("a text is cut short"))?;
            rest = &rest[n..];
            Ok(start..start + n)
        };
        let event_type = text(type_len)?;
        let stream_id = text(stream_len)?;
        let payload = text(payload_len)?;
        rows.push(Row {
            position: position as u64,
            stream_id,
            stream_version: stream_version as u64,
            event_id,
            event_type,
            schema_version: schema_version as u32,
            recorded_at: chrono::DateTime::from_timestamp_micros(recorded_at).unwrap_or_default(),
            payload,
        });
    }
    // The query orders the rows it aggregates; SQLite keeps that order, but
    // the SQL standard does not promise it, so make sure.
    let mut page = TextPage::from_parts(page, rows);
    page.sort();
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(position: u64, kind: &str, stream: &str, payload: &str) -> String {
        format!(
            "{position} 3 1 1700000000000000 {} {} {} {} {kind}{stream}{payload}",
            Uuid::nil(),
            kind.len(),
            stream.len(),
            payload.len()
        )
    }

    #[test]
    fn fields_are_taken_by_length_whatever_they_contain() {
        let odd = "a b ü 9 \u{1f} {";
        let page = format!(
            "{}{}",
            record(7, "E", "s 1", r#"{"x": "y z"}"#),
            record(8, odd, "ß", odd)
        );
        let page = parse(page, 6).unwrap();
        let events: Vec<_> = page.iter().collect();
        assert_eq!(events.len(), 2);
        assert_eq!((events[0].position, events[0].stream_id), (7, "s 1"));
        assert_eq!(events[0].payload, r#"{"x": "y z"}"#);
        assert_eq!(events[0].stream_version, 3);
        assert_eq!(
            events[0].recorded_at.timestamp_micros(),
            1_700_000_000_000_000
        );
        assert_eq!(
            (events[1].event_type, events[1].stream_id, events[1].payload),
            (odd, "ß", odd)
        );
    }

    #[test]
    fn a_cut_page_is_corrupt_not_a_panic() {
        let page = record(7, "E", "s", "{}");
        for cut in 1..page.len() {
            if let Some(part) = page.get(..cut) {
                assert!(
                    matches!(
                        parse(part.to_owned(), 6),
                        Err(StoreError::Corrupt { position: 7, .. })
                    ),
                    "{part:?}"
                );
            }
        }
    }
}
