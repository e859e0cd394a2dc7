//! A page of events as replay reads them: the texts of every event (type,
//! stream id, payload) in one `String`, and each event's fixed fields with
//! where its texts lie in it. Readers borrow each event as an [`EventRef`]
//! and decode straight from those slices.
//!
//! Why: replay spends its client time per event, and three owned `String`s
//! per event (each a malloc, a copy and a free) were the largest part of
//! it after decoding. A page is now two allocations whatever its length:
//! the text (on SQLite the page's own text as the database built it, not
//! even copied) and the rows.

use std::ops::Range;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::EventText;

/// One event of a [`TextPage`], borrowed from it: what [`EventText`] holds,
/// with the texts as slices of the page.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EventRef<'a> {
    pub position: u64,
    pub stream_id: &'a str,
    pub stream_version: u64,
    pub event_id: Uuid,
    pub event_type: &'a str,
    pub schema_version: u32,
    pub recorded_at: DateTime<Utc>,
    /// JSON text, as in [`EventText::payload`].
    pub payload: &'a str,
}

impl EventRef<'_> {
    /// The event with its texts copied out of the page.
    pub fn to_event_text(&self) -> EventText {
        EventText {
            position: self.position,
            stream_id: self.stream_id.to_owned(),
            stream_version: self.stream_version,
            event_id: self.event_id,
            event_type: self.event_type.to_owned(),
            schema_version: self.schema_version,
            recorded_at: self.recorded_at,
            payload: self.payload.to_owned(),
        }
    }
}

/// The fixed fields of one event and where its texts lie in the page's text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) position: u64,
    pub(crate) stream_version: u64,
    pub(crate) event_id: Uuid,
    pub(crate) schema_version: u32,
    pub(crate) recorded_at: DateTime<Utc>,
    pub(crate) event_type: Range<usize>,
    pub(crate) stream_id: Range<usize>,
    pub(crate) payload: Range<usize>,
}

/// Events in position order, their texts in one allocation. See the module
/// documentation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TextPage {
    text: String,
    rows: Vec<Row>,
}

impl TextPage {
    /// Empties the page, keeping its memory for the next one.
    pub fn clear(&mut self) {
        self.text.clear();
        self.rows.clear();
    }

    /// Makes room for `events` more events of about `bytes` of text.
    pub(crate) fn reserve(&mut self, events: usize, bytes: usize) {
        self.rows.reserve(events);
        self.text.reserve(bytes);
    }

    /// A page over `text`, whose rows' ranges are already known to lie in
    /// it on character boundaries (SQLite's page, taken apart in place).
    pub(crate) fn from_parts(text: String, rows: Vec<Row>) -> TextPage {
        TextPage { text, rows }
    }

    /// Adds an event whose texts are copied in; `row`'s ranges are ignored.
    pub(crate) fn push(&mut self, mut row: Row, event_type: &str, stream_id: &str, payload: &str) {
        row.event_type = self.append(event_type);
        row.stream_id = self.append(stream_id);
        row.payload = self.append(payload);
        self.rows.push(row);
    }

    fn append(&mut self, s: &str) -> Range<usize> {
        let start = self.text.len();
        self.text.push_str(s);
        start..self.text.len()
    }

    /// Replaces event `i`'s payload (an upcast): the new text is added to
    /// the page's, the old one stays unused.
    pub(crate) fn set_payload(&mut self, i: usize, schema_version: u32, payload: &str) {
        let range = self.append(payload);
        if let Some(row) = self.rows.get_mut(i) {
            row.payload = range;
            row.schema_version = schema_version;
        }
    }

    /// Orders the events by position (the queries do; this makes sure).
    pub(crate) fn sort(&mut self) {
        if !self.rows.is_sorted_by_key(|r| r.position) {
            self.rows.sort_by_key(|r| r.position);
        }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The position of the page's last event.
    pub fn last_position(&self) -> Option<u64> {
        self.rows.last().map(|r| r.position)
    }

    /// Event `i`, borrowed.
    pub fn get(&self, i: usize) -> Option<EventRef<'_>> {
        self.rows.get(i).map(|r| self.event(r))
    }

    /// The events in order, borrowed.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = EventRef<'_>> {
        self.rows.iter().map(|r| self.event(r))
    }

    /// The events, each with its own texts.
    pub fn into_events(self) -> Vec<EventText> {
        self.iter().map(|e| e.to_event_text()).collect()
    }

    fn event(&self, r: &Row) -> EventRef<'_> {
        // The ranges were made on this text's character boundaries; an
        // empty text in their place could only come of a bug here.
        let text = |range: &Range<usize>| self.text.get(range.clone()).unwrap_or_default();
        EventRef {
            position: r.position,
            stream_id: text(&r.stream_id),
            stream_version: r.stream_version,
            event_id: r.event_id,
            event_type: text(&r.event_type),
            schema_version: r.schema_version,
            recorded_at: r.recorded_at,
            payload: text(&r.payload),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(position: u64) -> Row {
        Row {
            position,
            stream_version: 1,
            event_id: Uuid::from_u128(u128::from(position)),
            schema_version: 1,
            recorded_at: DateTime::default(),
            event_type: 0..0,
            stream_id: 0..0,
            payload: 0..0,
        }
    }

    #[test]
    fn events_read_back_as_pushed_in_position_order_and_upcast_in_place() {
        let mut page = TextPage::default();
        page.push(row(9), "B", "ß", r#"{"b":"ü"}"#);
        page.push(row(7), "", "s 1", "{}");
        page.sort();
        page.set_payload(1, 2, r#"{"b":"ü","new":1}"#);
        let seen: Vec<_> = page
            .iter()
            .map(|e| {
                (
                    e.position,
                    e.event_type,
                    e.stream_id,
                    e.payload,
                    e.schema_version,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (7, "", "s 1", "{}", 1),
                (9, "B", "ß", r#"{"b":"ü","new":1}"#, 2)
            ]
        );
        assert_eq!(page.last_position(), Some(9));
        let owned = page.clone().into_events();
        assert_eq!(owned[1].stream_id, "ß");
        assert_eq!(owned[1].event_id, Uuid::from_u128(9));
        assert_eq!(
            page.get(0).map(|e| e.to_event_text()),
            Some(owned[0].clone())
        );
    }
}
