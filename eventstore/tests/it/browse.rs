//! Browsing the log newest first with filters: every filter agrees with
//! the same filter applied to the whole log, and paging by position walks
//! it exactly once.

use std::time::Duration;

use chrono::{DateTime, Utc};
use llmgw_eventstore::{EventFilter, EventStore, ExpectedVersion, RecordedEvent, Writer};
use serde_json::json;

use crate::support::{Backend, TestStore, all_events, both_backends, event, stream};

both_backends!(
    browsing_filters_match_the_whole_log_newest_first,
    browsing_pages_by_position_visit_every_match_once,
    a_narrow_range_bounds_a_rare_filter,
);

const STREAMS: [&str; 5] = ["node-a", "node-ab", "Node-a", "key-k1", "audit-node-a"];
const TYPES: [&str; 3] = ["NodeRegistered", "KeyIssued", "CommandRefused"];
const ACTORS: [&str; 3] = ["alice", "bob", "cp-1"];

/// 30 events over 5 streams, 3 types and 3 actors, in 6 appends (so that
/// there are distinct recorded times to filter on).
async fn filled(b: Backend) -> (TestStore, Vec<RecordedEvent>) {
    let t = TestStore::new(b).await;
    let lease = t
        .store
        .acquire_lease("ctl-1", Duration::from_secs(30))
        .await
        .unwrap();
    let w = Writer::Leader(lease.token);
    let mut n = 0u64;
    for _ in 0..6 {
        let batch: Vec<_> = STREAMS
            .iter()
            .map(|s| {
                let i = n as usize;
                n += 1;
                let e = event(TYPES[i % 3], n).with_metadata(json!({
                    "writer": "ctl-1",
                    "actor": ACTORS[i / 2 % 3],
                    "actor_kind": "operator",
                }));
                stream(s, ExpectedVersion::Any, vec![e])
            })
            .collect();
        t.store.append(&w, &batch).await.unwrap();
    }
    let all = all_events(&t.store).await;
    (t, all)
}

fn matches(f: &EventFilter, e: &RecordedEvent) -> bool {
    f.event_type.as_ref().is_none_or(|t| *t == e.event_type)
        && (f.streams.is_empty() || f.streams.contains(&e.stream_id))
        && f.stream_prefix
            .as_ref()
            .is_none_or(|p| e.stream_id.starts_with(p.as_str()))
        && f.actor
            .as_ref()
            .is_none_or(|a| e.metadata.get("actor").and_then(|v| v.as_str()) == Some(a))
        && f.from.is_none_or(|t| e.recorded_at >= t)
        && f.to.is_none_or(|t| e.recorded_at < t)
}

fn positions(events: &[RecordedEvent]) -> Vec<u64> {
    events.iter().map(|e| e.position).collect()
}

fn filters(all: &[RecordedEvent]) -> Vec<EventFilter> {
    let time = |i: usize| -> DateTime<Utc> { all[i].recorded_at };
    let one = |f: fn(&mut EventFilter)| {
        let mut filter = EventFilter::default();
        f(&mut filter);
        filter
    };
    vec![
        EventFilter::default(),
        one(|f| f.event_type = Some("KeyIssued".into())),
        one(|f| f.streams = vec!["node-a".into()]),
        one(|f| f.streams = vec!["node-a".into(), "audit-node-a".into()]),
        // A prefix is a prefix (node-ab too), and case-sensitive (not Node-a).
        one(|f| f.stream_prefix = Some("node-a".into())),
        one(|f| f.stream_prefix = Some("nothing-".into())),
        one(|f| f.actor = Some("bob".into())),
        one(|f| f.actor = Some("nobody".into())),
        one(|f| {
            f.event_type = Some("CommandRefused".into());
            f.actor = Some("alice".into());
        }),
        one(|f| f.streams = vec!["key-k1".into(), "node-ab".into()]),
        EventFilter {
            from: Some(time(10)),
            to: Some(time(25)),
            ..EventFilter::default()
        },
        EventFilter {
            streams: vec!["node-a".into()],
            to: Some(time(20)),
            ..EventFilter::default()
        },
    ]
}

async fn browsing_filters_match_the_whole_log_newest_first(b: Backend) {
    let (t, all) = filled(b).await;
    assert_eq!(all.len(), 30);
    for f in filters(&all) {
        let got = t
            .store
            .read_backward_raw(&f, 1..u64::MAX, 100)
            .await
            .unwrap();
        let want: Vec<u64> = all
            .iter()
            .rev()
            .filter(|e| matches(&f, e))
            .map(|e| e.position)
            .collect();
        assert_eq!(positions(&got), want, "{f:?}");
        // As stored: the same records a forward read returns.
        for e in &got {
            assert_eq!(e, &all[e.position as usize - 1]);
        }
    }
    let three = t
        .store
        .read_backward_raw(&EventFilter::default(), 1..u64::MAX, 3)
        .await
        .unwrap();
    assert_eq!(positions(&three), vec![30, 29, 28], "the newest first");
}

async fn browsing_pages_by_position_visit_every_match_once(b: Backend) {
    let (t, all) = filled(b).await;
    for f in filters(&all) {
        let mut seen = Vec::new();
        let mut before = u64::MAX;
        loop {
            let page = t.store.read_backward_raw(&f, 1..before, 4).await.unwrap();
            assert!(page.len() <= 4);
            let Some(last) = page.last() else { break };
            before = last.position;
            seen.extend(positions(&page));
        }
        let want: Vec<u64> = all
            .iter()
            .rev()
            .filter(|e| matches(&f, e))
            .map(|e| e.position)
            .collect();
        assert_eq!(seen, want, "{f:?}");
    }
}

async fn a_narrow_range_bounds_a_rare_filter(b: Backend) {
    let (t, _) = filled(b).await;
    let f = EventFilter {
        streams: vec!["key-k1".into()],
        ..EventFilter::default()
    };
    // key-k1 holds positions 4, 9, 14, 19, 24, 29.
    let got = t.store.read_backward_raw(&f, 10..20, 100).await.unwrap();
    assert_eq!(positions(&got), vec![19, 14], "the range is half open");
    let none = t.store.read_backward_raw(&f, 25..29, 100).await.unwrap();
    assert!(none.is_empty());
    let empty = t.store.read_backward_raw(&f, 20..20, 100).await.unwrap();
    assert!(empty.is_empty());
}
