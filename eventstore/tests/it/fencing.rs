//! A deposed leader's append either committed before its successor's epoch
//! began or was refused: it is never written after.

use std::time::Duration;

use llmgw_eventstore::{
    AnyStore, AppendPoint, EventStore, ExpectedVersion, OpenOptions, StoreError, Writer,
};

use crate::support::{Backend, Pause, TestStore, all_events, both_backends, event, stream};

both_backends!(
    a_writer_paused_holding_the_lock_commits_before_the_takeover,
    a_writer_paused_before_its_fence_check_is_refused_after_a_takeover,
);

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(30);

async fn wait_until_expired(store: &AnyStore) {
    while store.lease_info().await.expect("lease info").held {
        tokio::task::yield_now().await;
    }
}

/// Waits until some session of this database is blocked on a lock, so that
/// the takeover is known to be queued behind the paused append.
async fn wait_for_lock_waiter(store: &AnyStore) {
    let AnyStore::Postgres(pg) = store else {
        return;
    };
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(pg.pool())
        .await
        .expect("pg_stat_activity");
        if waiting > 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
}

async fn a_writer_paused_holding_the_lock_commits_before_the_takeover(b: Backend) {
    let (pause, mut ctl) = Pause::at(AppendPoint::AfterFence);
    let options = OpenOptions {
        append_hook: Some(pause),
        ..OpenOptions::migrating()
    };
    let t = TestStore::with_options(b, options).await;
    let successor = t.another(OpenOptions::default()).await;
    let a = t.store.acquire_lease("ctl-a", SHORT).await.unwrap();

    let writer = Writer::Leader(a.token.clone());
    let store_a = t.store.clone();
    let w = writer.clone();
    let append_a = tokio::spawn(async move {
        store_a
            .append(
                &w,
                &[stream(
                    "s",
                    ExpectedVersion::Any,
                    vec![event("E", 1), event("E", 2)],
                )],
            )
            .await
    });
    ctl.reached.recv().await.expect("A reached its pause");
    // A's lease runs out while it holds the control row.
    wait_until_expired(&successor).await;
    let s = successor.clone();
    let takeover = tokio::spawn(async move { s.acquire_lease("ctl-b", LONG).await });
    wait_for_lock_waiter(&successor).await;
    ctl.resume.send(()).await.expect("resume A");

    let appended = append_a
        .await
        .unwrap()
        .expect("A passed its fence, so it commits");
    let b_lease = takeover.await.unwrap().expect("B takes the expired lease");
    assert_eq!(b_lease.token.epoch, a.token.epoch + 1);
    assert!(
        appended.last_position <= b_lease.head_at_grant,
        "A's events ({}..{}) must precede B's epoch (head {} at grant)",
        appended.first_position,
        appended.last_position,
        b_lease.head_at_grant
    );
    let events = all_events(&t.store).await;
    assert_eq!(events.len(), 2);
    assert!(events.iter().all(|e| e.epoch == a.token.epoch));

    // Its next append is refused and leaves nothing.
    let err = t
        .store
        .append(
            &writer,
            &[stream("s", ExpectedVersion::Any, vec![event("E", 3)])],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Fenced { current_epoch, .. } if current_epoch == b_lease.token.epoch)
    );
    assert_eq!(t.store.head().await.unwrap().0, 2);
}

async fn a_writer_paused_before_its_fence_check_is_refused_after_a_takeover(b: Backend) {
    let (pause, mut ctl) = Pause::at(AppendPoint::BeforeFence);
    let options = OpenOptions {
        append_hook: Some(pause),
        ..OpenOptions::migrating()
    };
    let t = TestStore::with_options(b, options).await;
    let successor = t.another(OpenOptions::default()).await;
    let a = t.store.acquire_lease("ctl-a", SHORT).await.unwrap();

    let store_a = t.store.clone();
    let token = a.token.clone();
    let append_a = tokio::spawn(async move {
        store_a
            .append(
                &Writer::Leader(token),
                &[stream("s", ExpectedVersion::Any, vec![event("E", 1)])],
            )
            .await
    });
    ctl.reached.recv().await.expect("A reached its pause");
    wait_until_expired(&successor).await;
    let b_lease = successor
        .acquire_lease("ctl-b", LONG)
        .await
        .expect("takeover");
    // B writes under its own epoch while A is still paused.
    successor
        .append(
            &Writer::Leader(b_lease.token.clone()),
            &[stream("s", ExpectedVersion::Any, vec![event("E", 2)])],
        )
        .await
        .unwrap();
    ctl.resume.send(()).await.expect("resume A");

    match append_a.await.unwrap() {
        Err(StoreError::Fenced {
            current_holder,
            current_epoch,
        }) => {
            assert_eq!(
                (current_holder.as_deref(), current_epoch),
                (Some("ctl-b"), b_lease.token.epoch)
            );
        }
        other => panic!("A must be fenced, got {other:?}"),
    }
    let events = all_events(&t.store).await;
    assert_eq!(events.len(), 1, "only B's event is in the log");
    assert_eq!(events[0].epoch, b_lease.token.epoch);
}
