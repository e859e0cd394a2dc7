//! The replay read (`read_all_text`, on PostgreSQL a binary COPY taken
//! apart as it arrives) hands over exactly what the full read does: every
//! event, in order, with its place, whatever its text holds.

use std::time::Duration;

use llmgw_eventstore::{
    DecodingReader, EventRef, EventStore, EventText, ExpectedVersion, NewEvent, RecordedEvent,
    Writer,
};
use serde_json::{Value, json};

use crate::support::{Backend, TestStore, all_events, both_backends, stream};

both_backends!(
    odd_text_reads_back_as_the_full_read_has_it,
    a_decoding_reader_gives_the_same_events_whatever_its_page,
);

/// Text that a delimiter, an escape or a length in characters rather than
/// bytes would get wrong.
const ODD: [&str; 6] = [
    "tab\there, newline\nthere, \\backslash\\ and \"quotes\" 'too'",
    "ünïcode ✓ 日本語 🦀",
    "",
    " leading and trailing ",
    "\\N",
    "\u{1}\u{1f}\u{7f}",
];

fn odd_event(n: usize) -> NewEvent {
    let text = ODD[n % ODD.len()];
    NewEvent::new(
        if n.is_multiple_of(2) {
            "Odd Type ✓"
        } else {
            "E"
        },
        1,
        json!({ "n": n, "text": text, "nested": { text: [text, n] } }),
    )
}

async fn fill(t: &TestStore) {
    let w = Writer::Leader(
        t.store
            .acquire_lease("ctl", Duration::from_secs(60))
            .await
            .unwrap()
            .token,
    );
    for n in 0..30 {
        // Stream ids may not hold control characters; anything else goes.
        let id = format!("stream {} \"quoted\" 'ü' \\N {}", n % 3, ODD[1]);
        t.store
            .append(&w, &[stream(&id, ExpectedVersion::Any, vec![odd_event(n)])])
            .await
            .unwrap();
    }
}

fn same(text: &EventText, full: &RecordedEvent) {
    assert_eq!(text.position, full.position);
    assert_eq!(text.stream_id, full.stream_id);
    assert_eq!(text.stream_version, full.stream_version);
    assert_eq!(text.event_id, full.event_id);
    assert_eq!(text.event_type, full.event_type);
    assert_eq!(text.schema_version, full.schema_version);
    assert_eq!(text.recorded_at, full.recorded_at);
    let payload: Value = serde_json::from_str(&text.payload).unwrap();
    assert_eq!(payload, full.payload, "position {}", full.position);
}

async fn odd_text_reads_back_as_the_full_read_has_it(b: Backend) {
    let t = TestStore::new(b).await;
    fill(&t).await;
    let full = all_events(&t.store).await;
    assert_eq!(full.len(), 30);
    let text = t.store.read_all_text(0, 100).await.unwrap();
    assert_eq!(text.len(), full.len());
    for (x, f) in text.iter().zip(&full) {
        same(x, f);
    }
    // A page from the middle, and one past the head.
    let middle = t.store.read_all_text(7, 5).await.unwrap();
    assert_eq!(
        middle.iter().map(|e| e.position).collect::<Vec<_>>(),
        (8..=12).collect::<Vec<_>>()
    );
    assert!(t.store.read_all_text(30, 5).await.unwrap().is_empty());
}

async fn a_decoding_reader_gives_the_same_events_whatever_its_page(b: Backend) {
    let t = TestStore::new(b).await;
    fill(&t).await;
    let full = all_events(&t.store).await;
    fn keep(e: EventRef<'_>) -> EventText {
        e.to_event_text()
    }
    // Pages that divide the log, that do not, of one event, and larger
    // than the log.
    for page in [1, 3, 7, 10, 30, 1000] {
        for after in [0, 4] {
            let mut reader = DecodingReader::new(t.store.clone(), after, page, keep);
            let mut read = Vec::new();
            loop {
                let p = reader.next_page().await.unwrap();
                assert!(p.len() <= page);
                if p.is_empty() {
                    break;
                }
                read.extend(p.iter().cloned());
                // A page handed back is filled again: nothing of what it
                // held may show in a later page.
                reader.recycle(p);
            }
            let expected = &full[after as usize..];
            assert_eq!(read.len(), expected.len(), "page {page} after {after}");
            for (x, f) in read.iter().zip(expected) {
                same(x, f);
            }
        }
    }
}
