//! A store writes a group in one statement (on SQLite, one trip) when the log's head is as it
//! last left it (`known.rs`): what it remembers (the head, the lease, its
//! streams' versions) must never stand in for the log. Each test lets a
//! store learn the head, changes the log or the lease behind its back or
//! repeats an append, and checks that the answer is the one a locked
//! transaction gives.

use std::time::Duration;

use llmgw_eventstore::{
    AnyStore, Appended, EventStore, ExpectedVersion, OpenOptions, StoreError, Writer,
};

use crate::support::{Backend, TestStore, all_events, both_backends, event, stream};

both_backends!(
    another_store_writing_in_between_is_seen,
    an_expired_lease_is_refused_though_the_head_did_not_move,
    a_retry_is_answered_as_a_retry_not_as_a_conflict,
    a_repeated_append_gets_its_original_positions,
    the_chain_holds_across_both_ways_of_writing,
);

const LONG: Duration = Duration::from_secs(60);

/// The outage drill's situation at the store (`llmgw-cli` tests
/// `outage::`): a usage append written in one statement commits, its
/// answer is lost with the connection, and the append is tried again with
/// the same event id. It must be answered as already in the log, with its
/// original position, and be in the log once. (The drill once lost the
/// answer to a `COMMIT`; a group written in one statement sends none, so
/// its trap never fired: the relay now loses whatever answer ends the
/// transaction.)
#[tokio::test]
async fn an_append_committed_without_an_answer_is_recognised_when_tried_again() {
    use llmgw_eventstore::StoreAddress;
    let db = llmgw_testkit::TestDb::create().await;
    let direct = AnyStore::open(
        &StoreAddress::parse(&db.url).unwrap(),
        OpenOptions::migrating(),
    )
    .await
    .unwrap();
    let relay = llmgw_testkit::Relay::to_postgres(&db.url).await;
    let store = AnyStore::open(
        &StoreAddress::parse(&relay.url(&db.url)).unwrap(),
        OpenOptions::default(),
    )
    .await
    .unwrap();
    let usage = Writer::Observer {
        instance: "gw-1".into(),
    };
    // The first append learns the head; the second is written in one
    // statement, as the drill's usage appends are once the log is warm.
    for n in 0..2 {
        store
            .append(
                &usage,
                &[stream(
                    "usage",
                    ExpectedVersion::Any,
                    vec![event("Usage", n)],
                )],
            )
            .await
            .unwrap();
    }
    assert_eq!(
        store.group_stats().one_statement,
        1,
        "the fast path is in use"
    );

    relay.lose_commit_reply(b"UsageLost");
    let batch = [stream(
        "usage",
        ExpectedVersion::Any,
        vec![event("UsageLost", 2)],
    )];
    // The store may ask again itself on a fresh connection (its kept one
    // died under it), or hand the lost connection's error to the caller,
    // who tries again with the same event id, as the usage batcher does.
    let answer = match store.append(&usage, &batch).await {
        Ok(answer) => answer,
        Err(e) => {
            assert!(e.is_transient(), "{e:?}");
            store.append(&usage, &batch).await.unwrap()
        }
    };
    assert_eq!(relay.replies_lost(), 1, "the commit's answer was lost");
    assert!(answer.deduplicated, "answered as new: {answer:?}");
    assert_eq!((answer.first_position, answer.last_position), (3, 3));
    let log = all_events(&direct).await;
    assert_eq!(
        log.iter()
            .map(|e| e.event_type.as_str())
            .collect::<Vec<_>>(),
        ["Usage", "Usage", "UsageLost"],
        "in the log once"
    );
    // And the store goes on from there.
    let next = store
        .append(
            &usage,
            &[stream(
                "usage",
                ExpectedVersion::Any,
                vec![event("Usage", 3)],
            )],
        )
        .await
        .unwrap();
    assert_eq!((next.first_position, next.deduplicated), (4, false));
}

/// Event `E` number `n` appended alone to stream `s`: the append these
/// tests make over and over.
async fn append_one(
    store: &AnyStore,
    w: &Writer,
    s: &str,
    expected: ExpectedVersion,
    n: u64,
) -> Result<Appended, StoreError> {
    store
        .append(w, &[stream(s, expected, vec![event("E", n)])])
        .await
}

async fn leader(t: &TestStore, holder: &str, ttl: Duration) -> Writer {
    Writer::Leader(t.store.acquire_lease(holder, ttl).await.unwrap().token)
}

async fn another_store_writing_in_between_is_seen(b: Backend) {
    let t = TestStore::new(b).await;
    let other = t.another(OpenOptions::default()).await;
    let w = leader(&t, "ctl", LONG).await;
    for n in 0..3 {
        append_one(&t.store, &w, "s", ExpectedVersion::Any, n)
            .await
            .unwrap();
    }
    // The other store (same lease, another process) appends to the same
    // stream: the first store's idea of the head and of `s` is now stale.
    let theirs = append_one(&other, &w, "s", ExpectedVersion::Exact(3), 9)
        .await
        .unwrap();
    assert_eq!((theirs.first_position, theirs.stream_versions[0].1), (4, 4));
    let err = append_one(&t.store, &w, "s", ExpectedVersion::Exact(3), 10)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::VersionConflict { actual: 4, .. }),
        "{err:?}"
    );
    let mine = append_one(&t.store, &w, "s", ExpectedVersion::Exact(4), 11)
        .await
        .unwrap();
    assert_eq!((mine.first_position, mine.stream_versions[0].1), (5, 5));
    // And the other way round, on a stream only the first store has used.
    append_one(&other, &w, "t", ExpectedVersion::Any, 12)
        .await
        .unwrap();
    let next = append_one(&t.store, &w, "s", ExpectedVersion::Any, 13)
        .await
        .unwrap();
    assert_eq!((next.first_position, next.stream_versions[0].1), (7, 6));
    assert_eq!(all_events(&t.store).await.len(), 7);
    assert!(t.store.verify(1, None).await.unwrap().is_ok());
}

async fn an_expired_lease_is_refused_though_the_head_did_not_move(b: Backend) {
    let t = TestStore::new(b).await;
    let short = Duration::from_millis(300);
    let w = leader(&t, "ctl", short).await;
    for n in 0..2 {
        append_one(&t.store, &w, "s", ExpectedVersion::Any, n)
            .await
            .unwrap();
    }
    while t.store.lease_info().await.unwrap().held {
        tokio::task::yield_now().await;
    }
    // Nothing else was written: only the lease tells this append apart
    // from the last one.
    let err = append_one(&t.store, &w, "s", ExpectedVersion::Any, 2)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err:?}");
    // A successor, same head: the old token is still refused, the new one
    // is admitted.
    let successor = leader(&t, "ctl-b", LONG).await;
    let err = append_one(&t.store, &w, "s", ExpectedVersion::Any, 3)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err:?}");
    let done = append_one(&t.store, &successor, "s", ExpectedVersion::Any, 4)
        .await
        .unwrap();
    assert_eq!(done.first_position, 3);
    let events = all_events(&t.store).await;
    assert_eq!(events.len(), 3);
    assert!(events[2].epoch > events[1].epoch);
}

async fn a_retry_is_answered_as_a_retry_not_as_a_conflict(b: Backend) {
    let t = TestStore::new(b).await;
    let w = leader(&t, "ctl", LONG).await;
    let first = vec![stream("s", ExpectedVersion::Exact(0), vec![event("E", 0)])];
    let done = t.store.append(&w, &first).await.unwrap();
    // The same append again (its answer was lost, say): the store knows `s`
    // is at 1, so by its versions alone this would be a conflict; the log
    // says it is a retry.
    let again = t.store.append(&w, &first).await.unwrap();
    assert!(again.deduplicated);
    assert_eq!(
        (again.first_position, again.last_position),
        (done.first_position, done.last_position)
    );
    // A real conflict is still one.
    let err = append_one(&t.store, &w, "s", ExpectedVersion::Exact(0), 1)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::VersionConflict { actual: 1, .. }),
        "{err:?}"
    );
    assert_eq!(t.store.head().await.unwrap().0, 1);
}

async fn a_repeated_append_gets_its_original_positions(b: Backend) {
    let t = TestStore::new(b).await;
    let w = leader(&t, "ctl", LONG).await;
    append_one(&t.store, &w, "s", ExpectedVersion::Any, 0)
        .await
        .unwrap();
    let batch = vec![stream(
        "s",
        ExpectedVersion::Any,
        vec![event("E", 1), event("E", 2)],
    )];
    let done = t.store.append(&w, &batch).await.unwrap();
    assert_eq!((done.first_position, done.last_position), (2, 3));
    // Everything about it is known but that its ids are in the log.
    let again = t.store.append(&w, &batch).await.unwrap();
    assert!(again.deduplicated);
    assert_eq!((again.first_position, again.last_position), (2, 3));
    assert_eq!(again.stream_versions, vec![("s".to_owned(), 3)]);
    // And the store goes on writing after it.
    let next = append_one(&t.store, &w, "s", ExpectedVersion::Exact(3), 3)
        .await
        .unwrap();
    assert_eq!(next.first_position, 4);
}

async fn the_chain_holds_across_both_ways_of_writing(b: Backend) {
    let t = TestStore::new(b).await;
    let other = t.another(OpenOptions::default()).await;
    let w = leader(&t, "ctl", LONG).await;
    let observer = Writer::Observer {
        instance: "router-1".into(),
    };
    // Interleaved: runs of appends by one store to two streams, three to a
    // stream in turn (the later ones of a run in one statement), broken by
    // the other store and by an observer.
    for n in 0..30u64 {
        let (store, writer) = match n % 7 {
            3 => (&other, &w),
            5 => (&t.store, &observer),
            _ => (&t.store, &w),
        };
        let s = format!("s{}", n / 3 % 2);
        append_one(store, writer, &s, ExpectedVersion::Any, n)
            .await
            .unwrap();
    }
    let events = all_events(&t.store).await;
    assert_eq!(events.len(), 30);
    assert!(
        events
            .windows(2)
            .all(|w| w[0].recorded_at <= w[1].recorded_at)
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.position, i as u64 + 1);
    }
    assert!(t.store.verify(1, None).await.unwrap().is_ok());
    assert!(
        t.store.group_stats().one_statement >= 5,
        "the one-trip way was in use: {:?}",
        t.store.group_stats()
    );
}
