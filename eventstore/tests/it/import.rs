//! Importing an export verbatim: the copy is the source, field for field and
//! hash for hash; anything that does not continue the store exactly is
//! refused whole, and the lease is required as for an append.

use std::time::Duration;

use llmgw_eventstore::{
    AnyStore, EventStore, ExpectedVersion, ImportOptions, Imported, RecordedEvent, StoreError,
    Writer, hash,
};
use serde_json::json;

use crate::support::{Backend, TestStore, all_events, both_backends, event, stream};

both_backends!(
    an_import_reproduces_every_field_and_the_chain_head,
    a_refused_import_writes_nothing,
    files_that_continue_or_overlap_the_store_are_checked_by_hash,
    a_range_starts_an_empty_store_only_from_an_anchor_taken_on_trust,
    an_import_needs_the_append_lease,
);

const TTL: Duration = Duration::from_secs(30);

/// A log written under three leases and by an observer, over a few streams.
async fn source(b: Backend, n: u64) -> TestStore {
    let t = TestStore::new(b).await;
    for round in 0..3u64 {
        let lease = t.store.acquire_lease("ctl", TTL).await.unwrap();
        let w = Writer::Leader(lease.token.clone());
        for i in 0..n / 4 {
            let s = ["node-a", "model-b", "replica-c"][(i % 3) as usize];
            t.store
                .append(
                    &w,
                    &[stream(
                        s,
                        ExpectedVersion::Any,
                        vec![event("E", round * 100 + i)],
                    )],
                )
                .await
                .unwrap();
        }
        t.store.release_lease(&lease.token).await.unwrap();
    }
    let observer = Writer::Observer {
        instance: "gw-1".into(),
    };
    let rest = n - 3 * (n / 4);
    let events = (0..rest).map(|i| event("UsageRecorded", i)).collect();
    t.store
        .append(
            &observer,
            &[stream("usage-k", ExpectedVersion::Any, events)],
        )
        .await
        .unwrap();
    t
}

/// Imports under a lease of its own, as `llmgw events import` does.
async fn import(
    store: &AnyStore,
    events: &[RecordedEvent],
    options: ImportOptions,
) -> Result<Imported, StoreError> {
    let lease = store.acquire_lease("import", TTL).await.unwrap();
    let result = store
        .import(&lease.token, &options, events.iter().cloned().map(Ok))
        .await;
    store.release_lease(&lease.token).await.unwrap();
    result
}

/// Options for a file that follows `prev`, naming its last hash.
fn from(prev: &[RecordedEvent]) -> ImportOptions {
    ImportOptions {
        prev_hash: prev.last().map(|e| e.hash),
        ..ImportOptions::default()
    }
}

/// Recomputes every hash from `events[i]` on, as a forger would after an edit.
fn rechain(events: &mut [RecordedEvent], i: usize) {
    let mut prev = if i == 0 {
        hash::GENESIS
    } else {
        events[i - 1].hash
    };
    for e in &mut events[i..] {
        e.hash = hash::chain(&prev, e);
        prev = e.hash;
    }
}

fn other(b: Backend) -> Backend {
    match b {
        Backend::Postgres => Backend::Sqlite,
        Backend::Sqlite => Backend::Postgres,
    }
}

async fn an_import_reproduces_every_field_and_the_chain_head(b: Backend) {
    let src = source(b, 40).await;
    let events = all_events(&src.store).await;
    let max_epoch = events.iter().map(|e| e.epoch).max().unwrap();
    assert_eq!(max_epoch, 3, "three leases wrote the source");
    for target in [b, other(b)] {
        let t = TestStore::new(target).await;
        let done = import(&t.store, &events, ImportOptions::default())
            .await
            .unwrap();
        assert_eq!(
            (done.written, done.present, done.positions),
            (40, 0, Some((1, 40)))
        );
        assert_eq!(all_events(&t.store).await, events, "{target:?}");
        assert_eq!(
            t.store.head().await.unwrap(),
            src.store.head().await.unwrap()
        );
        assert_eq!(done.head_hash, src.store.head().await.unwrap().1);
        let report = t.store.verify(1, None).await.unwrap();
        assert!(report.is_ok() && report.checked == 40, "{report:?}");

        // The next lease is newer than every imported event, and the log
        // goes on from the imported streams' versions.
        let lease = t.store.acquire_lease("ctl", TTL).await.unwrap();
        assert!(lease.token.epoch > max_epoch, "{lease:?}");
        let node_a = events.iter().filter(|e| e.stream_id == "node-a").count() as u64;
        t.store
            .append(
                &Writer::Leader(lease.token),
                &[stream(
                    "node-a",
                    ExpectedVersion::Exact(node_a),
                    vec![event("E", 999)],
                )],
            )
            .await
            .unwrap();
        assert!(t.store.verify(1, None).await.unwrap().is_ok());
        // Imported events are as immutable as appended ones.
        assert!(
            t.raw("DELETE FROM es_events WHERE position = 3")
                .await
                .is_err()
        );
    }
}

/// Every refusal names its reason and leaves the events, the head and the
/// stream versions as they were, even when it comes thousands of events
/// into the file.
async fn a_refused_import_writes_nothing(b: Backend) {
    let src = source(b, 2600).await;
    let events = all_events(&src.store).await;
    let t = TestStore::new(b).await;
    import(&t.store, &events[..6], ImportOptions::default())
        .await
        .unwrap();
    let before = all_events(&t.store).await;
    let head = t.store.head().await.unwrap();

    let refuse = |what: &'static str, result: Result<Imported, StoreError>, says: &str| {
        let err = result.expect_err(what).to_string();
        assert!(err.contains(says), "{what}: {err}");
    };

    // An edit at 3 with every later hash recomputed: consistent in itself,
    // but it no longer meets the store's own event at 6.
    let mut edited = events[..12].to_vec();
    edited[2].payload = json!({"n": 666});
    rechain(&mut edited, 2);
    refuse(
        "rechained edit",
        import(&t.store, &edited, ImportOptions::default()).await,
        "position 6: the file's event differs from this store's",
    );
    refuse(
        "gap",
        import(&t.store, &events[7..12], from(&events[..7])).await,
        "this store's head is 6 and the file starts at position 8: positions 7..=7 are missing",
    );
    let foreign = source(b, 20).await;
    let theirs = all_events(&foreign.store).await;
    refuse(
        "foreign start",
        import(&t.store, &theirs[6..], from(&theirs[..6])).await,
        "position 7: does not follow this store's head at 6",
    );
    refuse(
        "foreign start, no predecessor named",
        import(&t.store, &theirs[6..], ImportOptions::default()).await,
        "a foreign start",
    );
    // A later event altered in the middle of the third chunk.
    let mut late = events[6..].to_vec();
    late[2400].metadata = json!({"actor": "mallory"});
    refuse(
        "altered late event",
        import(&t.store, &late, from(&events[..6])).await,
        "position 2407: its hash does not match",
    );
    // A line that is not an event, after two full chunks were written.
    let lease = t.store.acquire_lease("import", TTL).await.unwrap();
    let lines = events[6..]
        .iter()
        .cloned()
        .map(Ok)
        .take(2200)
        .chain(std::iter::once(Err(StoreError::ImportRefused(
            "line 2207: not an exported event".into(),
        ))));
    refuse(
        "unreadable line",
        t.store
            .import(&lease.token, &from(&events[..6]), lines)
            .await,
        "line 2207: not an exported event",
    );
    t.store.release_lease(&lease.token).await.unwrap();
    // A stream that does not continue the store's version, rehashed from
    // the store's head so that only the version check can catch it.
    let mut skew = events[6..7].to_vec();
    skew[0].stream_version += 1;
    let mut prev = head.1;
    for e in &mut skew {
        e.hash = hash::chain(&prev, e);
        prev = e.hash;
    }
    refuse(
        "stream version",
        import(&t.store, &skew, ImportOptions::default()).await,
        &format!("position 7: stream {} is at version", skew[0].stream_id),
    );
    // An event id the store already holds, under a new position.
    let mut again = vec![events[6].clone()];
    again[0].event_id = events[0].event_id;
    again[0].hash = hash::chain(&head.1, &again[0]);
    refuse(
        "duplicate id",
        import(&t.store, &again, ImportOptions::default()).await,
        "is already in this store, at position 1",
    );

    assert_eq!(all_events(&t.store).await, before);
    assert_eq!(t.store.head().await.unwrap(), head);
    // The stream versions did not move either: the next import still fits.
    let done = import(&t.store, &events[6..], ImportOptions::default())
        .await
        .unwrap();
    assert_eq!(done.written, 2594);
    assert_eq!(all_events(&t.store).await, events);
}

async fn files_that_continue_or_overlap_the_store_are_checked_by_hash(b: Backend) {
    let src = source(b, 12).await;
    let events = all_events(&src.store).await;
    let t = TestStore::new(b).await;
    import(&t.store, &events[..6], ImportOptions::default())
        .await
        .unwrap();
    // 4..12 overlaps 4..6: checked at 6 by hash, 7..12 written.
    let done = import(&t.store, &events[3..], ImportOptions::default())
        .await
        .unwrap();
    assert_eq!(
        (done.written, done.present, done.positions),
        (6, 3, Some((7, 12)))
    );
    // Everything again: nothing written.
    let done = import(&t.store, &events, ImportOptions::default())
        .await
        .unwrap();
    assert_eq!((done.written, done.present), (0, 12));
    // A file that ends inside the store is checked where it ends.
    let done = import(&t.store, &events[..5], ImportOptions::default())
        .await
        .unwrap();
    assert_eq!((done.written, done.present), (0, 5));
    let mut edited = events[..5].to_vec();
    edited[1].payload = json!({"n": 1});
    rechain(&mut edited, 1);
    let err = import(&t.store, &edited, ImportOptions::default())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("position 5: the file's event differs"),
        "{err}"
    );
    // An anchor held from the source catches a rechained edit even where
    // the store has nothing to compare with.
    let fresh = TestStore::new(b).await;
    let anchored = ImportOptions {
        anchors: vec![(12, events[11].hash)],
        ..ImportOptions::default()
    };
    let mut edited = events.clone();
    edited[8].payload = json!({"n": 1});
    rechain(&mut edited, 8);
    let err = import(&fresh.store, &edited, anchored.clone())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not the anchor's"), "{err}");
    let err = import(&fresh.store, &events[..10], anchored.clone())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("the file ends at position 10, before the anchor at 12"),
        "{err}"
    );
    assert_eq!(fresh.store.head().await.unwrap().0, 0);
    import(&fresh.store, &events, anchored).await.unwrap();
    assert_eq!(all_events(&fresh.store).await, events);
}

async fn a_range_starts_an_empty_store_only_from_an_anchor_taken_on_trust(b: Backend) {
    let src = source(b, 12).await;
    let events = all_events(&src.store).await;
    let t = TestStore::new(b).await;
    let range = &events[4..];
    let err = import(&t.store, range, from(&events[..4]))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("this store is empty and the file starts at position 5")
            && err.to_string().contains("--from-anchor"),
        "{err}"
    );
    let trusting = ImportOptions {
        from_anchor: true,
        ..ImportOptions::default()
    };
    let err = import(&t.store, range, trusting.clone()).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("does not name the hash of position 4"),
        "{err}"
    );
    let mut wrong = from(&events[..3]);
    wrong.from_anchor = true;
    let err = import(&t.store, range, wrong).await.unwrap_err();
    assert!(
        err.to_string().contains("its hash does not follow"),
        "{err}"
    );
    assert_eq!(t.store.head().await.unwrap().0, 0);

    let mut options = from(&events[..4]);
    options.from_anchor = true;
    let done = import(&t.store, &range[..5], options).await.unwrap();
    assert_eq!((done.from_anchor, done.positions), (Some(4), Some((5, 9))));
    assert_eq!(t.store.base().await.unwrap(), (4, events[3].hash));
    assert_eq!(t.store.hash_at(4).await.unwrap(), Some(events[3].hash));
    // The rest continues it like any other store.
    import(&t.store, &range[5..], ImportOptions::default())
        .await
        .unwrap();
    assert_eq!(all_events(&t.store).await, range);
    assert_eq!(
        t.store.head().await.unwrap(),
        src.store.head().await.unwrap()
    );
    let report = t.store.verify(1, None).await.unwrap();
    assert!(
        report.is_ok() && (report.from, report.checked) == (5, 8),
        "{report:?}"
    );
    // A subscription from the beginning starts where the log does.
    let mut sub = t.store.subscribe(0);
    assert_eq!(sub.next_now().await.unwrap().unwrap().position, 5);
    // Where the log begins cannot be moved once it holds events.
    assert!(
        t.raw("UPDATE es_control SET base_position = 0")
            .await
            .is_err()
    );
}

async fn an_import_needs_the_append_lease(b: Backend) {
    let src = source(b, 8).await;
    let events = all_events(&src.store).await;
    let t = TestStore::new(b).await;
    let held = t.store.acquire_lease("ctl", TTL).await.unwrap();
    let mut stale = held.token.clone();
    stale.holder = "import".into();
    let err = t
        .store
        .import(
            &stale,
            &ImportOptions::default(),
            events.iter().cloned().map(Ok),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    t.store.release_lease(&held.token).await.unwrap();
    // A lease that was given up no longer admits an import either.
    let err = t
        .store
        .import(
            &held.token,
            &ImportOptions::default(),
            events.iter().cloned().map(Ok),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    assert_eq!(t.store.head().await.unwrap().0, 0);

    // When the events carry a newer epoch than the store's, the store's
    // epoch moves up to it and the importer's lease ends with the import.
    let lease = t.store.acquire_lease("import", TTL).await.unwrap();
    assert!(lease.token.epoch < 3, "{lease:?}");
    t.store
        .import(
            &lease.token,
            &ImportOptions::default(),
            events.iter().cloned().map(Ok),
        )
        .await
        .unwrap();
    let info = t.store.lease_info().await.unwrap();
    assert!(info.epoch >= 3 && !info.held, "{info:?}");
}
