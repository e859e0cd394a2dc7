//! Subscriptions catch up, follow live appends, and resume after a crash or
//! a lost connection without losing or repeating an event.

use std::time::Duration;

use llmgw_eventstore::{
    AnyStore, Checkpoint, EventStore, ExpectedVersion, OpenOptions, RecordedEvent, Subscription,
    Writer,
};
use sqlx::{Connection, Executor};

use crate::support::{Backend, TestStore, both_backends, event, stream};

both_backends!(
    a_subscriber_catches_up_then_follows_live_appends,
    a_killed_subscriber_resumes_from_its_checkpoint_without_gap_or_repeat,
    a_subscriber_sees_appends_made_through_another_store,
    a_subscriber_reads_pages_of_text_then_waits_for_the_next_append,
);

/// A bound on how long a test may wait for an event before it fails; the
/// subscription itself is what wakes the test, not this timer.
const PATIENCE: Duration = Duration::from_secs(20);

async fn next(sub: &mut Subscription<AnyStore>) -> RecordedEvent {
    tokio::time::timeout(PATIENCE, sub.next())
        .await
        .expect("an event within the patience bound")
        .expect("subscription error")
}

async fn append_n(store: &AnyStore, w: &Writer, from: u64, n: u64) {
    let events = (from..from + n).map(|i| event("E", i)).collect();
    store
        .append(w, &[stream("s", ExpectedVersion::Any, events)])
        .await
        .unwrap();
}

async fn lead(store: &AnyStore) -> Writer {
    Writer::Leader(
        store
            .acquire_lease("ctl", Duration::from_secs(60))
            .await
            .unwrap()
            .token,
    )
}

async fn a_subscriber_catches_up_then_follows_live_appends(b: Backend) {
    let t = TestStore::new(b).await;
    let w = lead(&t.store).await;
    append_n(&t.store, &w, 0, 3).await;
    let mut sub = t.store.subscribe(0);
    for want in 1..=3 {
        assert_eq!(next(&mut sub).await.position, want);
    }
    assert!(sub.next_now().await.unwrap().is_none());
    assert!(sub.is_caught_up());

    let (store, w2) = (t.store.clone(), w.clone());
    let writer = tokio::spawn(async move {
        for i in 0..3 {
            append_n(&store, &w2, 10 + i, 1).await;
        }
    });
    for want in 4..=6 {
        let e = next(&mut sub).await;
        assert_eq!(
            (e.position, e.payload["n"].as_u64()),
            (want, Some(10 + want - 4))
        );
    }
    writer.await.unwrap();
    assert_eq!(sub.position(), 6);
}

async fn a_killed_subscriber_resumes_from_its_checkpoint_without_gap_or_repeat(b: Backend) {
    let t = TestStore::new(b).await;
    let w = lead(&t.store).await;
    append_n(&t.store, &w, 0, 10).await;
    let mut seen = Vec::new();
    {
        let mut sub = t.store.subscribe(0);
        for _ in 0..4 {
            let e = next(&mut sub).await;
            seen.push(e.position);
            t.store
                .save_checkpoint("proj", &Checkpoint::after(&e))
                .await
                .unwrap();
        }
        // Killed here: the subscription and everything it buffered is gone.
    }
    let resumed = t.store.resume_checkpoint("proj").await.unwrap();
    assert_eq!(resumed.position, 4);
    let mut sub = t.store.subscribe(resumed.position);
    append_n(&t.store, &w, 10, 3).await;
    while seen.len() < 13 {
        seen.push(next(&mut sub).await.position);
    }
    assert_eq!(seen, (1..=13).collect::<Vec<_>>());
}

async fn a_subscriber_sees_appends_made_through_another_store(b: Backend) {
    let t = TestStore::new(b).await;
    let other = t.another(OpenOptions::default()).await;
    let mut sub = t.store.subscribe(0);
    assert!(sub.next_now().await.unwrap().is_none());
    let w = lead(&other).await;
    let waiter = tokio::spawn(async move {
        let mut got = Vec::new();
        for _ in 0..2 {
            got.push(next(&mut sub).await.position);
        }
        got
    });
    append_n(&other, &w, 0, 2).await;
    assert_eq!(waiter.await.unwrap(), vec![1, 2]);
}

/// A page as `next_page` decodes it for a test: position, type and `n`.
async fn page(sub: &mut Subscription<AnyStore>, limit: usize) -> Vec<(u64, String, Option<u64>)> {
    let decode = |e: llmgw_eventstore::EventRef<'_>| {
        let payload: serde_json::Value = serde_json::from_str(e.payload).unwrap();
        (e.position, e.event_type.to_owned(), payload["n"].as_u64())
    };
    tokio::time::timeout(PATIENCE, sub.next_page(limit, decode))
        .await
        .expect("a page within the patience bound")
        .expect("subscription error")
}

/// What the views' runner follows with: pages of at most the limit, each
/// event decoded from its text; what `next` read ahead and did not hand out
/// is read again, and at the head a page waits for the next append.
async fn a_subscriber_reads_pages_of_text_then_waits_for_the_next_append(b: Backend) {
    let t = TestStore::new(b).await;
    let w = lead(&t.store).await;
    append_n(&t.store, &w, 0, 5).await;
    let mut sub = t.store.subscribe(0);
    // `next` reads all five ahead and hands out one.
    assert_eq!(next(&mut sub).await.position, 1);
    let first = page(&mut sub, 3).await;
    assert_eq!(
        first,
        (2..=4)
            .map(|p| (p, "E".to_owned(), Some(p - 1)))
            .collect::<Vec<_>>()
    );
    assert!(!sub.is_caught_up(), "a full page may not be the head");
    assert_eq!(page(&mut sub, 3).await, vec![(5, "E".to_owned(), Some(4))]);
    assert!(sub.is_caught_up());
    assert_eq!(sub.position(), 5);

    let (store, w2) = (t.store.clone(), w.clone());
    let waiting = tokio::spawn(async move {
        let got = page(&mut sub, 3).await;
        (got, sub.position())
    });
    append_n(&store, &w2, 40, 2).await;
    let (got, position) = waiting.await.unwrap();
    assert_eq!(
        got,
        vec![(6, "E".to_owned(), Some(40)), (7, "E".to_owned(), Some(41))]
    );
    assert_eq!(position, 7);
}

#[tokio::test]
async fn postgres_subscriber_survives_its_connections_being_killed() {
    let t = TestStore::new(Backend::Postgres).await;
    let AnyStore::Postgres(_) = &t.store else {
        unreachable!()
    };
    let w = lead(&t.store).await;
    append_n(&t.store, &w, 0, 3).await;
    let mut sub = t.store.subscribe(0);
    for want in 1..=3 {
        assert_eq!(next(&mut sub).await.position, want);
    }
    // The views' runner follows in pages: the same must hold for them.
    let mut pages = t.store.subscribe(0);
    let positions =
        |p: Vec<(u64, String, Option<u64>)>| -> Vec<u64> { p.into_iter().map(|e| e.0).collect() };
    let first = positions(page(&mut pages, 10).await);
    assert_eq!(first, vec![1, 2, 3]);
    // Listen connection and pooled connections alike are terminated.
    let url = match &t.address {
        llmgw_eventstore::StoreAddress::Postgres(u) => u.clone(),
        _ => unreachable!(),
    };
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    let killed: Vec<(bool,)> = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(!killed.is_empty());
    admin.execute("SELECT 1").await.unwrap();

    let fresh = t.another(OpenOptions::default()).await;
    append_n(&fresh, &w, 3, 3).await;
    let mut read = Vec::new();
    for _ in 0..3 {
        read.push(next(&mut sub).await.position);
    }
    assert_eq!(read, vec![4, 5, 6]);
    let mut paged: Vec<u64> = Vec::new();
    while paged.len() < 3 {
        paged.extend(positions(page(&mut pages, 10).await));
    }
    assert_eq!(paged, vec![4, 5, 6]);
}
