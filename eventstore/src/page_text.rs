//! The page of events SQLite hands the text read (`read_all_text_raw`) as
//! one value: for each event, in position order,
//!
//! ```text
//! <position> <stream_version> <schema_version> <recorded_at µs> <event_id> <type bytes> <stream bytes> <payload bytes> <type><stream><payload>
//! ```
//!
//! with nothing between events. Every text field is preceded by its length
//! in bytes, so no content, however odd, can be mistaken for a delimiter.

use uuid::Uuid;

use crate::{EventText, Result, StoreError};

/// The events of one page; `after` is where the page was asked to start,
/// for naming the place of a malformed one.
pub(crate) fn parse(page: &str, after: u64) -> Result<Vec<EventText>> {
    let mut events: Vec<EventText> = Vec::new();
    let mut rest = page;
    while !rest.is_empty() {
        let at = events.last().map_or(after + 1, |e| e.position + 1);
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
        let mut text = |n: usize| -> Result<String> {
            let t = rest
                .get(..n)
                .ok_or_else(|| corrupt("a text is cut short"))?;
            rest = &rest[n..];
            Ok(t.to_owned())
        };
        let event_type = text(type_len)?;
        let stream_id = text(stream_len)?;
        let payload = text(payload_len)?;
        events.push(EventText {
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
    if !events.is_sorted_by_key(|e| e.position) {
        events.sort_by_key(|e| e.position);
    }
    Ok(events)
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
        let events = parse(&page, 6).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(
            (events[0].position, events[0].stream_id.as_str()),
            (7, "s 1")
        );
        assert_eq!(events[0].payload, r#"{"x": "y z"}"#);
        assert_eq!(events[0].stream_version, 3);
        assert_eq!(
            events[0].recorded_at.timestamp_micros(),
            1_700_000_000_000_000
        );
        assert_eq!(
            (
                events[1].event_type.as_str(),
                events[1].stream_id.as_str(),
                events[1].payload.as_str()
            ),
            (odd, "ß", odd)
        );
    }

    #[test]
    fn a_cut_page_is_corrupt_not_a_panic() {
        let page = record(7, "E", "s", "{}");
        for cut in 1..page.len() {
            if let Some(part) = page.get(..cut) {
                assert!(
                    matches!(parse(part, 6), Err(StoreError::Corrupt { position: 7, .. })),
                    "{part:?}"
                );
            }
        }
    }
}
