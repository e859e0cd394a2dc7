//! Random interleavings of concurrent appenders with random batch sizes and
//! expected versions. Whatever the interleaving: positions are exactly
//! 1..=head, each stream's versions are dense, every acknowledged append is
//! read back once where it was acknowledged, every rejected append left no
//! row, and retries are idempotent.

use std::collections::{HashMap, HashSet};

use llmgw_eventstore::{
    AnyStore, Appended, EventStore, ExpectedVersion, NewEvent, StoreError, StreamAppend, Writer,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use uuid::Uuid;

use crate::support::{Backend, TestStore, all_events};

const STREAMS: [&str; 3] = ["model-a", "node-b", "key-c"];

#[derive(Debug, Clone)]
struct Part {
    stream: usize,
    expected: ExpectedVersion,
    events: usize,
}

#[derive(Debug, Clone)]
struct Op {
    parts: Vec<Part>,
    retry: bool,
}

fn expected() -> impl Strategy<Value = ExpectedVersion> {
    prop_oneof![
        3 => Just(ExpectedVersion::Any),
        1 => Just(ExpectedVersion::NoStream),
        2 => (0u64..6).prop_map(ExpectedVersion::Exact),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let part = (
        0..STREAMS.len(),
        expected(),
        prop_oneof![4 => 1usize..4, 1 => 20usize..60],
    )
        .prop_map(|(stream, expected, events)| Part {
            stream,
            expected,
            events,
        });
    (prop::collection::vec(part, 1..3), prop::bool::weighted(0.3)).prop_map(|(mut parts, retry)| {
        let mut seen = HashSet::new();
        parts.retain(|p| seen.insert(p.stream));
        Op { parts, retry }
    })
}

fn plan() -> impl Strategy<Value = Vec<Vec<Op>>> {
    prop::collection::vec(prop::collection::vec(op(), 1..6), 2..5)
}

#[derive(Debug)]
enum Outcome {
    Acked(Vec<Uuid>, Appended),
    Rejected(Vec<Uuid>),
}

async fn run_writer(store: AnyStore, writer: Writer, ops: Vec<Op>) -> Vec<Outcome> {
    let mut out = Vec::new();
    for op in ops {
        let batch: Vec<StreamAppend> = op
            .parts
            .iter()
            .map(|p| {
                let events = (0..p.events)
                    .map(|i| NewEvent::new("Probe", 1, serde_json::json!({ "i": i })))
                    .collect();
                StreamAppend::new(STREAMS[p.stream], p.expected, events)
            })
            .collect();
        let ids: Vec<Uuid> = batch
            .iter()
            .flat_map(|s| s.events.iter().map(|e| e.event_id))
            .collect();
        match store.append(&writer, &batch).await {
            Ok(appended) => {
                if op.retry {
                    let again = store
                        .append(&writer, &batch)
                        .await
                        .expect("a retry succeeds");
                    assert!(again.deduplicated);
                    assert_eq!(
                        (
                            again.first_position,
                            again.last_position,
                            &again.stream_versions
                        ),
                        (
                            appended.first_position,
                            appended.last_position,
                            &appended.stream_versions
                        )
                    );
                }
                out.push(Outcome::Acked(ids, appended));
            }
            Err(StoreError::VersionConflict { .. }) => out.push(Outcome::Rejected(ids)),
            Err(other) => panic!("unexpected append error: {other}"),
        }
    }
    out
}

async fn check(backend: Backend, plan: Vec<Vec<Op>>) {
    let t = TestStore::new(backend).await;
    let lease = t
        .store
        .acquire_lease("ctl", std::time::Duration::from_secs(120))
        .await
        .unwrap();
    let writer = Writer::Leader(lease.token);
    let tasks: Vec<_> = plan
        .into_iter()
        .map(|ops| tokio::spawn(run_writer(t.store.clone(), writer.clone(), ops)))
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.extend(task.await.expect("writer task"));
    }

    let all = all_events(&t.store).await;
    let head = t.store.head().await.unwrap().0;
    assert_eq!(
        all.iter().map(|e| e.position).collect::<Vec<_>>(),
        (1..=head).collect::<Vec<_>>()
    );

    let by_id: HashMap<Uuid, u64> = all.iter().map(|e| (e.event_id, e.position)).collect();
    assert_eq!(by_id.len(), all.len(), "every event id is stored once");
    let mut acked = 0;
    for outcome in &outcomes {
        match outcome {
            Outcome::Acked(ids, appended) => {
                let positions: Vec<u64> = ids.iter().map(|id| by_id[id]).collect();
                let want: Vec<u64> = (appended.first_position..=appended.last_position).collect();
                assert_eq!(
                    positions, want,
                    "acknowledged events sit where acknowledged"
                );
                acked += ids.len();
            }
            Outcome::Rejected(ids) => {
                assert!(
                    ids.iter().all(|id| !by_id.contains_key(id)),
                    "a rejected append left rows"
                );
            }
        }
    }
    assert_eq!(acked as u64, head);

    for s in STREAMS {
        let versions: Vec<u64> = all
            .iter()
            .filter(|e| e.stream_id == s)
            .map(|e| e.stream_version)
            .collect();
        assert_eq!(
            versions,
            (1..=versions.len() as u64).collect::<Vec<_>>(),
            "{s} is dense"
        );
    }
    assert!(t.store.verify(1, None).await.unwrap().is_ok());
}

fn run(backend: Backend, cases: u32) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&plan(), |plan| {
            rt.block_on(check(backend, plan));
            Ok(())
        })
        .expect("store invariants hold");
}

#[test]
fn postgres_concurrent_appends_keep_the_log_dense() {
    run(Backend::Postgres, 12);
}

#[test]
fn sqlite_concurrent_appends_keep_the_log_dense() {
    run(Backend::Sqlite, 12);
}
