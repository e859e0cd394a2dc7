//! Group commit: concurrent appends written in one transaction, each caller
//! answered as if its append had been written alone.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llmgw_eventstore::{
    AppendHook, AppendPoint, Appended, EventStore, ExpectedVersion, OpenOptions, StoreError,
    StreamAppend, Writer,
};
use tokio::sync::watch;

use crate::support::{Backend, TestStore, all_events, both_backends, event, stream};

both_backends!(
    concurrent_appends_each_get_their_own_dense_positions,
    a_group_answers_each_append_with_its_own_result,
    a_deposed_leaders_appends_in_a_group_are_all_refused,
);

/// Holds the first group at its fence check until opened, counts appends
/// that have joined the queue, and records the size of every group written.
#[derive(Debug)]
struct Gate {
    open: watch::Sender<bool>,
    held: watch::Sender<usize>,
    queued: watch::Sender<usize>,
    groups: Mutex<Vec<usize>>,
}

impl Gate {
    fn closed() -> Arc<Gate> {
        Arc::new(Gate {
            open: watch::Sender::new(false),
            held: watch::Sender::new(0),
            queued: watch::Sender::new(0),
            groups: Mutex::new(Vec::new()),
        })
    }

    async fn wait_held(&self) {
        let mut held = self.held.subscribe();
        held.wait_for(|n| *n > 0).await.expect("gate alive");
    }

    async fn wait_queued(&self, n: usize) {
        let mut queued = self.queued.subscribe();
        queued.wait_for(|q| *q >= n).await.expect("gate alive");
    }

    fn open(&self) {
        self.open.send_replace(true);
    }

    fn groups(&self) -> Vec<usize> {
        self.groups.lock().unwrap().clone()
    }
}

impl AppendHook for Gate {
    fn at(&self, point: AppendPoint) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            match point {
                AppendPoint::Queued => {
                    self.queued.send_modify(|n| *n += 1);
                }
                AppendPoint::Writing { appends } => self.groups.lock().unwrap().push(appends),
                AppendPoint::BeforeFence => {
                    self.held.send_modify(|n| *n += 1);
                    let mut open = self.open.subscribe();
                    open.wait_for(|o| *o).await.expect("gate alive");
                }
                AppendPoint::AfterFence => {}
            }
        })
    }
}

async fn gated(b: Backend) -> (TestStore, Arc<Gate>) {
    let gate = Gate::closed();
    let options = OpenOptions {
        append_hook: Some(gate.clone()),
        ..OpenOptions::migrating()
    };
    (TestStore::with_options(b, options).await, gate)
}

fn spawn_append(
    store: &llmgw_eventstore::AnyStore,
    writer: &Writer,
    batch: Vec<StreamAppend>,
) -> tokio::task::JoinHandle<Result<Appended, StoreError>> {
    let (store, writer) = (store.clone(), writer.clone());
    tokio::spawn(async move { store.append(&writer, &batch).await })
}

async fn concurrent_appends_each_get_their_own_dense_positions(b: Backend) {
    let t = TestStore::new(b).await;
    let lease = t
        .store
        .acquire_lease("ctl", Duration::from_secs(60))
        .await
        .unwrap();
    let writer = Writer::Leader(lease.token);
    let tasks: Vec<_> = (0..8u64)
        .map(|w| {
            let (store, writer) = (t.store.clone(), writer.clone());
            tokio::spawn(async move {
                let mut mine = Vec::new();
                for i in 0..10u64 {
                    let e = event("E", w * 100 + i);
                    let id = e.event_id;
                    let done = store
                        .append(
                            &writer,
                            &[stream(&format!("s{w}"), ExpectedVersion::Exact(i), vec![e])],
                        )
                        .await
                        .unwrap();
                    assert_eq!(done.first_position, done.last_position);
                    assert_eq!(done.stream_versions, vec![(format!("s{w}"), i + 1)]);
                    mine.push((done.first_position, id));
                }
                mine
            })
        })
        .collect();
    let mut answered = Vec::new();
    for task in tasks {
        answered.extend(task.await.unwrap());
    }
    let events = all_events(&t.store).await;
    assert_eq!(events.len(), 80);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.position, i as u64 + 1, "positions are dense");
    }
    // Each caller was told where its own event went.
    for (position, id) in answered {
        assert_eq!(events[position as usize - 1].event_id, id);
    }
    assert!(t.store.verify(1, None).await.unwrap().is_ok());
}

async fn a_group_answers_each_append_with_its_own_result(b: Backend) {
    let (t, gate) = gated(b).await;
    let writer = Writer::Observer {
        instance: "gw-1".into(),
    };
    // The first append is held at its fence check while the others queue
    // behind it, so they are written together as the next group.
    let first = event("E", 1);
    let first_retry = first.clone();
    let a = spawn_append(
        &t.store,
        &writer,
        vec![stream("s", ExpectedVersion::NoStream, vec![first])],
    );
    gate.wait_held().await;
    // In queue order: a wrong expected version; a new stream; the same
    // stream again expecting the version the previous append leaves; a retry
    // of the held append; a batch that reuses one id of an earlier one.
    let c_event = event("E", 3);
    let c_id = c_event.clone();
    let queued = [
        vec![stream("s", ExpectedVersion::Exact(5), vec![event("E", 2)])],
        vec![stream("t", ExpectedVersion::NoStream, vec![c_event])],
        vec![stream("t", ExpectedVersion::Exact(1), vec![event("E", 4)])],
        vec![stream("s", ExpectedVersion::Any, vec![first_retry])],
        vec![stream("u", ExpectedVersion::Any, vec![event("E", 5), c_id])],
    ];
    let mut tasks = Vec::new();
    for (i, batch) in queued.into_iter().enumerate() {
        tasks.push(spawn_append(&t.store, &writer, batch));
        // One at a time, so that the queue's order is the one listed.
        gate.wait_queued(i + 2).await;
    }
    gate.open();

    let a = a.await.unwrap().unwrap();
    assert_eq!((a.first_position, a.last_position), (1, 1));
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    assert_eq!(
        gate.groups(),
        vec![1, 5],
        "the five queued appends made one group"
    );
    assert_eq!(
        t.store.group_stats(),
        llmgw_eventstore::GroupStats {
            groups: 2,
            appends: 6,
            // A hook is installed: every group goes the locked way.
            one_statement: 0,
        },
        "the store counts the groups it wrote and the appends they held"
    );
    match &answers[0] {
        Err(StoreError::VersionConflict {
            stream,
            expected: ExpectedVersion::Exact(5),
            actual: 1,
        }) => assert_eq!(stream, "s"),
        other => panic!("expected a version conflict, got {other:?}"),
    }
    let c = answers[1].as_ref().unwrap();
    assert_eq!((c.first_position, c.last_position), (2, 2));
    assert_eq!(c.stream_versions, vec![("t".to_owned(), 1)]);
    let d = answers[2].as_ref().unwrap();
    assert_eq!((d.first_position, d.last_position), (3, 3));
    assert_eq!(d.stream_versions, vec![("t".to_owned(), 2)]);
    let retry = answers[3].as_ref().unwrap();
    assert!(retry.deduplicated);
    assert_eq!((retry.first_position, retry.last_position), (1, 1));
    assert!(matches!(
        answers[4],
        Err(StoreError::DuplicateEventId { .. })
    ));

    let events = all_events(&t.store).await;
    assert_eq!(events.len(), 3, "only the accepted appends were written");
    assert_eq!(
        events[1].recorded_at, events[2].recorded_at,
        "one transaction"
    );
    assert!(t.store.verify(1, None).await.unwrap().is_ok());
}

async fn a_deposed_leaders_appends_in_a_group_are_all_refused(b: Backend) {
    let (t, gate) = gated(b).await;
    let successor = t.another(OpenOptions::default()).await;
    let old = t
        .store
        .acquire_lease("ctl-a", Duration::from_millis(300))
        .await
        .unwrap();
    let deposed = Writer::Leader(old.token.clone());
    let observer = Writer::Observer {
        instance: "gw-1".into(),
    };
    // An observer's append is held at its fence check while the old
    // leader's appends queue behind it.
    let held = spawn_append(
        &t.store,
        &observer,
        vec![stream("usage", ExpectedVersion::Any, vec![event("U", 0)])],
    );
    gate.wait_held().await;
    let mut tasks = Vec::new();
    for i in 1..=3 {
        tasks.push(spawn_append(
            &t.store,
            &deposed,
            vec![stream(
                &format!("s{i}"),
                ExpectedVersion::Any,
                vec![event("E", i)],
            )],
        ));
        gate.wait_queued(i as usize + 1).await;
    }
    let seen = spawn_append(
        &t.store,
        &observer,
        vec![stream("usage", ExpectedVersion::Any, vec![event("U", 1)])],
    );
    gate.wait_queued(5).await;
    // Meanwhile the lease runs out and another server takes it.
    while successor.lease_info().await.unwrap().held {
        tokio::task::yield_now().await;
    }
    let new = successor
        .acquire_lease("ctl-b", Duration::from_secs(60))
        .await
        .unwrap();
    gate.open();

    held.await.unwrap().unwrap();
    for task in tasks {
        match task.await.unwrap() {
            Err(StoreError::Fenced {
                current_holder,
                current_epoch,
            }) => {
                assert_eq!(current_holder.as_deref(), Some("ctl-b"));
                assert_eq!(current_epoch, new.token.epoch);
            }
            other => panic!("a deposed leader's append must be fenced, got {other:?}"),
        }
    }
    let observed = seen.await.unwrap().unwrap();
    assert_eq!(gate.groups(), vec![1, 4]);
    assert_eq!((observed.first_position, observed.last_position), (2, 2));
    let events = all_events(&t.store).await;
    assert_eq!(events.len(), 2, "nothing of the deposed leader was written");
    assert!(events.iter().all(|e| e.stream_id == "usage"));
}
