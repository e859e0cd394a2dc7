//! Views fed from a real store: followed live, rebuilt from zero, restarted
//! from a snapshot.

#![allow(clippy::unwrap_used, reason = "in tests an unwrap is an assertion")]

mod views;

use std::time::Duration;

use llmgw_domain::catalog::{CatalogCommand, Engine, Model, Profile};
use llmgw_domain::nodes::{Inventory, NodeCommand};
use llmgw_domain::replicas::{Placement, ReplicaCommand, ShardPlacement, ShardState};
use llmgw_domain::tenancy::{Band, Key, Limits, Period, Scope, TenancyCommand};
use llmgw_domain::usage::{FinishedRequest, record};
use llmgw_domain::{Command, Event, State};
use llmgw_eventstore::{
    AnyStore, EventStore, ExpectedVersion, NewEvent, OpenOptions, Snapshot, StoreAddress,
    StreamAppend, Writer,
};
use llmgw_projections::{Projections, Runner};
use llmgw_testkit::{Backend, Scratch};

pub(crate) fn gpu_model(name: &str) -> Model {
    let mut m = Model::named(name);
    m.aliases = vec![format!("{name}-latest")];
    m.scaling.min = 1;
    m.profiles.push(Profile {
        name: "h100x1".into(),
        engine: Engine::Vllm,
        gpu_class: Some("h100-80g".into()),
        tp: 1,
        pp: 1,
        nodes: 1,
        gpus_per_node: 1,
        priority: 0,
        weight: 2,
        startup_timeout_s: None,
        min_disk_gb: 0,
        memory_mb: 0,
        node_selector: Default::default(),
        args: vec![],
        env: Default::default(),
    });
    m
}

/// A small cluster's life as commands: catalog, nodes, replicas, tenancy.
pub(crate) fn story(round: u32) -> Vec<Command> {
    let node = format!("node-{round}");
    let replica = format!("r{round}");
    let model = gpu_model(&format!("model-{round}"));
    let fp = model.profiles[0].fingerprint();
    let mut inventory = Inventory {
        hostname: node.clone(),
        mgmt_addr: format!("10.0.0.{round}"),
        ..Inventory::default()
    };
    inventory.memory_total_mb = 1024;
    vec![
        Command::Catalog(CatalogCommand::AddModel(model.clone())),
        Command::Node(NodeCommand::Register {
            node_id: node.clone().into(),
            inventory,
        }),
        Command::Replica(ReplicaCommand::Place(Placement {
            replica_id: replica.clone().into(),
            model: model.name.clone(),
            profile: "h100x1".into(),
            profile_fp: fp,
            pool: "h100-80g".into(),
            fabric: None,
            shards: vec![ShardPlacement {
                shard_id: format!("{replica}-0").into(),
                rank: 0,
                node_id: node.clone().into(),
                gpu_indices: vec![0],
                hcas: vec![],
                port: 20000,
                memory_mb: 0,
            }],
            why: "test".into(),
        })),
        Command::Replica(ReplicaCommand::ReportShard {
            replica_id: replica.clone().into(),
            shard_id: format!("{replica}-0").into(),
            state: ShardState::Ready,
            error: None,
            exit_code: None,
            log_tail: None,
        }),
        Command::Tenancy(TenancyCommand::CreateOrg {
            org_id: format!("o{round}"),
            name: "org".into(),
        }),
        Command::Tenancy(TenancyCommand::CreateTeam {
            team_id: format!("t{round}"),
            org_id: format!("o{round}"),
            name: "team".into(),
        }),
        Command::Tenancy(TenancyCommand::CreateProject {
            project_id: format!("p{round}"),
            team_id: format!("t{round}"),
            name: "proj".into(),
        }),
        Command::Tenancy(TenancyCommand::SetLimits {
            scope: Scope::Team,
            scope_id: format!("t{round}"),
            limits: Limits {
                rpm: Some(100),
                budget_micros: Some(1000),
                period: Some(Period::Day),
                ..Limits::default()
            },
        }),
        Command::Tenancy(TenancyCommand::IssueKey(Key {
            key_id: format!("k{round}"),
            project_id: format!("p{round}"),
            name: "key".into(),
            hash: format!("{round:064x}"),
            prefix: "llmgw-ab".into(),
            band: Band::Gold,
            routing_profile: None,
            revoked: false,
            owner: None,
            claim_by: None,
            expires_at: None,
            previous: None,
        })),
    ]
}

pub(crate) fn usage(round: u32, i: u64) -> Event {
    Event::Usage(
        record(FinishedRequest {
            request_id: format!("req-{round}-{i}"),
            key_id: format!("k{round}").into(),
            project_id: format!("p{round}").into(),
            model_asked: format!("model-{round}-latest").into(),
            model_served: format!("model-{round}").into(),
            prompt_tokens: 100 + i,
            completion_tokens: 20,
            status: if i.is_multiple_of(7) { 500 } else { 200 },
            latency_ms: 50 + i as u32,
            ttft_ms: Some(10),
            band: Band::Gold,
            at: llmgw_domain::UnixMillis(1_780_000_000_000 + i as i64 * 3_600_000),
            price: llmgw_domain::catalog::Price {
                prompt_per_1k: 1000,
                completion_per_1k: 3000,
            },
        })
        .unwrap(),
    )
}

/// Decides each command against the state and appends its events.
pub(crate) async fn append_story(
    store: &AnyStore,
    w: &Writer,
    state: &mut State,
    commands: Vec<Command>,
    extra: Vec<Event>,
) {
    let mut events = Vec::new();
    for c in commands {
        for e in state.decide(c).expect("story commands are valid") {
            state.evolve(&e);
            events.push(e);
        }
    }
    events.extend(extra);
    for e in events {
        let (kind, version, payload) = e.encode();
        store
            .append(
                w,
                &[StreamAppend::new(
                    e.stream_id(),
                    ExpectedVersion::Any,
                    vec![NewEvent::new(kind, version, payload)],
                )],
            )
            .await
            .unwrap();
    }
}

async fn fresh(b: Backend) -> (AnyStore, Writer, Scratch) {
    let (address, scratch) = Scratch::new(b).await;
    let store = AnyStore::open(
        &StoreAddress::parse(&address).unwrap(),
        OpenOptions::migrating(),
    )
    .await
    .unwrap();
    let lease = store
        .acquire_lease("ctl", Duration::from_secs(60))
        .await
        .unwrap();
    (store, Writer::Leader(lease.token), scratch)
}

async fn replay_from_zero(store: &AnyStore) -> Projections {
    let mut p = Projections::default();
    loop {
        let page = store.read_all(p.checkpoint.position, 1000).await.unwrap();
        if page.is_empty() {
            return p;
        }
        for e in &page {
            p.apply(e);
        }
    }
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Postgres).await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Sqlite).await } )* }
    };
}

both_backends!(
    usage_batches_as_rows_or_in_columns_make_the_same_views,
    views_followed_live_equal_views_rebuilt_from_zero,
    a_restart_resumes_from_a_matching_snapshot_only,
    snapshots_are_taken_on_a_floor_of_events_or_time_not_on_every_catch_up,
    the_sampled_lag_counts_unapplied_events_and_is_zero_when_caught_up,
);

async fn views_followed_live_equal_views_rebuilt_from_zero(b: Backend) {
    let (store, w, _scratch) = fresh(b).await;
    let mut state = State::default();
    append_story(&store, &w, &mut state, story(1), vec![]).await;
    let mut runner = Runner::start(store.clone(), "views").await.unwrap();
    assert_eq!(runner.lag(), 0);
    let views = runner.views();
    let mut position = runner.watch_position();
    let follower = tokio::spawn(async move { runner.follow().await });
    for round in 2..=4 {
        let extra = (0..5).map(|i| usage(round, i)).collect();
        append_story(&store, &w, &mut state, story(round), extra).await;
    }
    let head = store.head().await.unwrap().0;
    tokio::time::timeout(Duration::from_secs(20), position.wait_for(|p| *p >= head))
        .await
        .unwrap()
        .unwrap();
    follower.abort();
    let live = views.read().unwrap().clone();
    let rebuilt = replay_from_zero(&store).await;
    assert_eq!(live, rebuilt);
    assert_eq!(
        live.router.endpoints.len(),
        4,
        "one ready endpoint per round"
    );
    assert_eq!(live.usage.models["model-3"].requests, 5);
    assert!(
        live.router
            .endpoints
            .keys()
            .all(|id| live.router.node_of(id).is_some()),
        "every endpoint names the node it answers on"
    );
}

/// A log that crosses the upgrade to columns (a batch stored as a list
/// of rows, schema version 1, then one in columns) holds the same usage as
/// one written in columns throughout, caught up from text pages or applied
/// from stored events.
async fn usage_batches_as_rows_or_in_columns_make_the_same_views(b: Backend) {
    use llmgw_domain::usage::{UsageBatchRecorded, UsageEvent, UsageRecorded};
    let rows = |round: u32| -> Vec<UsageRecorded> {
        (0..5)
            .map(|i| match usage(round, i) {
                Event::Usage(u) => u.rows()[0].clone(),
                _ => unreachable!("usage"),
            })
            .collect()
    };
    let batch = |round: u32| {
        Event::Usage(UsageEvent::UsageBatchRecorded(UsageBatchRecorded {
            gateway: "gw".into(),
            rows: rows(round),
        }))
    };
    let (across, w, _across) = fresh(b).await;
    let v1 = serde_json::json!({"gateway": "gw", "rows": rows(1)});
    let v1 = NewEvent::new("UsageBatchRecorded", 1, v1);
    let stream = StreamAppend::new("usage-batches-gw", ExpectedVersion::Any, vec![v1]);
    across.append(&w, &[stream]).await.unwrap();
    append_story(&across, &w, &mut State::default(), vec![], vec![batch(2)]).await;
    let (columns, w, _columns) = fresh(b).await;
    let both = vec![batch(1), batch(2)];
    append_story(&columns, &w, &mut State::default(), vec![], both).await;

    let runner = Runner::start(across.clone(), "views").await.unwrap();
    let caught_up = runner.views().read().unwrap().clone();
    let applied = replay_from_zero(&across).await;
    let want = replay_from_zero(&columns).await;
    assert_eq!((caught_up.skipped, applied.skipped), (0, 0));
    assert_eq!(caught_up.usage, want.usage);
    assert_eq!(applied.usage, want.usage);
    assert_eq!(want.usage.models["model-1"].requests, 5);
    assert_eq!(want.usage.models["model-2"].requests, 5);
}

async fn a_restart_resumes_from_a_matching_snapshot_only(b: Backend) {
    let (store, w, _scratch) = fresh(b).await;
    let mut state = State::default();
    append_story(&store, &w, &mut state, story(1), vec![]).await;
    let mut runner = Runner::start(store.clone(), "views").await.unwrap();
    runner.save_snapshot().await.unwrap();
    append_story(&store, &w, &mut state, story(2), vec![usage(2, 1)]).await;

    // A matching snapshot is used, and the tail after it applied.
    let snap = store.load_snapshot("views").await.unwrap().unwrap();
    let restarted = Runner::start(store.clone(), "views").await.unwrap();
    assert_eq!(restarted.started_from(), snap.checkpoint.position);
    assert!(snap.checkpoint.position > 0);
    let got = restarted.views().read().unwrap().clone();
    let rebuilt = replay_from_zero(&store).await;
    assert_eq!(got, rebuilt, "snapshot plus tail equals a full replay");

    // One whose writer skipped events of a kind it did not know and this
    // build reads (an older build during an upgrade, meeting usage batches
    // in columns) is not; one that skipped only kinds this build does not
    // know either still is, so an unreadable event costs no rebuild at
    // every start.
    let with_unknown = |kind: &str, version: u32| {
        let mut state: serde_json::Value = serde_json::from_str(&snap.state).unwrap();
        state["skipped"] = 1.into();
        state["unknown"] = serde_json::json!([[kind, version]]);
        Snapshot {
            state: state.to_string(),
            ..snap.clone()
        }
    };
    let readable = with_unknown("UsageBatchRecorded", 2);
    store.save_snapshot("views", readable).await.unwrap();
    let restarted = Runner::start(store.clone(), "views").await.unwrap();
    assert_eq!(restarted.started_from(), 0, "rebuilt from the log");
    assert_eq!(restarted.views().read().unwrap().clone(), rebuilt);
    let unreadable = with_unknown("UsageBatchRecorded", 3);
    store.save_snapshot("views", unreadable).await.unwrap();
    let restarted = Runner::start(store.clone(), "views").await.unwrap();
    assert_eq!(restarted.started_from(), snap.checkpoint.position);
    assert_eq!(restarted.views().read().unwrap().skipped, 1);

    // One that names another event at its position, or another format, is not.
    for bad in [
        Snapshot {
            checkpoint: llmgw_eventstore::Checkpoint {
                position: 2,
                event_id: Some(NewEvent::new("x", 1, serde_json::json!({})).event_id),
            },
            ..snap.clone()
        },
        Snapshot {
            state_version: 99,
            ..snap.clone()
        },
        // Nor one whose text is not these views (a cache lost: rebuilt).
        Snapshot {
            state: r#"{"router": 17}"#.into(),
            ..snap.clone()
        },
    ] {
        store.save_snapshot("views", bad).await.unwrap();
        let rebuilt_runner = Runner::start(store.clone(), "views").await.unwrap();
        let got = rebuilt_runner.views().read().unwrap().clone();
        assert_eq!(got, rebuilt);
    }
}

/// Ten events caught up write no snapshot; crossing the floor of events
/// does, as does the time floor once passed; a restart starts from the
/// last one.
async fn snapshots_are_taken_on_a_floor_of_events_or_time_not_on_every_catch_up(b: Backend) {
    let (store, w, _scratch) = fresh(b).await;
    let mut state = State::default();
    let usage_of = |round: u32, n: u64| (0..n).map(|i| usage(round, i)).collect::<Vec<_>>();
    append_story(&store, &w, &mut state, vec![], usage_of(1, 10)).await;
    let floor = llmgw_projections::SnapshotFloor {
        events: 50,
        interval: Duration::from_secs(3600),
    };
    let mut runner = Runner::start(store.clone(), "views")
        .await
        .unwrap()
        .snapshot_floor(floor);
    assert_eq!(runner.started_from(), 0);
    append_story(&store, &w, &mut state, vec![], usage_of(2, 10)).await;
    runner.catch_up().await.unwrap();
    runner.snapshot_written().await;
    assert_eq!(runner.position(), 20);
    assert!(
        store.load_snapshot("views").await.unwrap().is_none(),
        "20 events, under the floor of 50: no snapshot"
    );

    append_story(&store, &w, &mut state, vec![], usage_of(3, 40)).await;
    runner.catch_up().await.unwrap();
    runner.snapshot_written().await;
    let snap = store
        .load_snapshot("views")
        .await
        .unwrap()
        .expect("a snapshot");
    assert_eq!(snap.checkpoint.position, 60, "taken once 60 events were in");

    // The time floor: past it, the next event caught up is snapshotted.
    let mut runner = runner.snapshot_floor(llmgw_projections::SnapshotFloor {
        events: 1_000_000,
        interval: Duration::ZERO,
    });
    append_story(&store, &w, &mut state, vec![], usage_of(4, 1)).await;
    runner.catch_up().await.unwrap();
    runner.snapshot_written().await;
    let snap = store.load_snapshot("views").await.unwrap().unwrap();
    assert_eq!(snap.checkpoint.position, 61);

    // A restart starts from it and replays only the tail.
    append_story(&store, &w, &mut state, vec![], usage_of(5, 3)).await;
    let restarted = Runner::start(store.clone(), "views").await.unwrap();
    assert_eq!((restarted.started_from(), restarted.position()), (61, 64));
    let got = restarted.views().read().unwrap().clone();
    assert_eq!(got, replay_from_zero(&store).await);
}

/// The lag is read from the store, not from the runner: views at position 1
/// of 3 are two events behind; at the head, nothing.
async fn the_sampled_lag_counts_unapplied_events_and_is_zero_when_caught_up(b: Backend) {
    let (store, w, _scratch) = fresh(b).await;
    let mut state = State::default();
    let usage_events = (0..3).map(|i| usage(1, i)).collect();
    append_story(&store, &w, &mut state, vec![], usage_events).await;
    let lag = llmgw_projections::Lag::new();
    lag.sample(&store, 1).await.unwrap();
    assert_eq!(lag.events(), 2);
    assert!(lag.seconds() >= 0.0);
    lag.sample(&store, 3).await.unwrap();
    assert_eq!((lag.events(), lag.seconds()), (0, 0.0));
}
