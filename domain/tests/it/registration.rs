//! What an agent's registration means: reports, stops, adoptions, starts
//! and failures, as a plan from the state and the shards it runs.

use llmgw_domain::catalog::{CatalogEvent, Engine, Model, Profile};
use llmgw_domain::nodes::{Inventory, NodeEvent};
use llmgw_domain::placement::Held;
use llmgw_domain::registration::{
    Adopting, NOT_RUNNING, RunningShard, STOPPED_ON_EXIT, StopReason, adopted_placement, plan,
};
use llmgw_domain::replicas::{Placement, ReplicaCommand, ReplicaEvent, ShardPlacement, ShardState};
use llmgw_domain::{Command, Event, State};

fn cluster() -> State {
    let mut s = State::default();
    let mut m = Model::named("chat");
    m.profiles = vec![Profile::cpu("sim", Engine::Sim)];
    s.evolve(&Event::Catalog(CatalogEvent::ModelAdded { model: m }));
    for (id, mgmt) in [("n1", "10.0.0.1"), ("n2", "")] {
        s.evolve(&Event::Node(NodeEvent::NodeRegistered {
            node_id: id.into(),
            inventory: Inventory {
                hostname: format!("{id}.example"),
                mgmt_addr: mgmt.into(),
                ..Inventory::default()
            },
        }));
    }
    s
}

/// Replica `id` of `chat`, one shard `<id>-<rank>` per node in `nodes`.
fn placed(state: &mut State, id: &str, nodes: &[&str]) -> Placement {
    let p = Placement {
        replica_id: id.into(),
        model: "chat".into(),
        profile: "sim".into(),
        profile_fp: "fp".into(),
        pool: "cpu".into(),
        fabric: None,
        shards: nodes
            .iter()
            .enumerate()
            .map(|(rank, node)| ShardPlacement {
                shard_id: format!("{id}-{rank}").into(),
                rank: rank as u32,
                node_id: (*node).into(),
                gpu_indices: vec![],
                hcas: vec![],
                port: 20000 + rank as u16,
                memory_mb: 0,
            })
            .collect(),
        why: "test".into(),
    };
    state.evolve(&Event::Replica(ReplicaEvent::ReplicaPlaced(p.clone())));
    p
}

fn shard_state(state: &mut State, replica: &str, shard: &str, to: ShardState) {
    state.evolve(&Event::Replica(ReplicaEvent::ShardStateChanged {
        replica_id: replica.into(),
        shard_id: shard.into(),
        state: to,
        error: None,
        exit_code: None,
        log_tail: None,
    }));
}

fn running(replica: &str, rank: u32, nnodes: u32) -> RunningShard {
    RunningShard {
        replica_id: replica.into(),
        shard_id: format!("{replica}-{rank}").into(),
        rank,
        nnodes,
        gpu_indices: vec![rank, rank + 4],
        hcas: vec![],
        port: 20000 + rank as u16,
        state: Some(ShardState::Ready),
        model: "chat".into(),
        profile: "sim".into(),
        profile_fp: "fp".into(),
        pool: "cpu".into(),
        fabric: String::new(),
    }
}

fn report(replica: &str, shard: &str, state: ShardState) -> Command {
    Command::Replica(ReplicaCommand::ReportShard {
        replica_id: replica.into(),
        shard_id: shard.into(),
        state,
        error: None,
        exit_code: None,
        log_tail: None,
    })
}

#[test]
fn a_known_live_shard_is_reported_in_the_state_its_agent_gives() {
    let mut s = cluster();
    placed(&mut s, "r1", &["n1"]);
    let mut unknown_state = running("r1", 0, 1);
    unknown_state.state = None;

    let p = plan(
        &s,
        &"n1".into(),
        &[running("r1", 0, 1)],
        &[],
        Adopting::new(),
    );
    assert_eq!(p.commands, vec![report("r1", "r1-0", ShardState::Ready)]);
    assert!(p.stops.is_empty() && p.starts.is_empty() && p.adoptions.is_empty());

    // A state this server cannot read is not reported, nor stopped.
    let p = plan(&s, &"n1".into(), &[unknown_state], &[], Adopting::new());
    assert_eq!(p, Default::default());
}

#[test]
fn a_shard_of_a_replica_the_log_stopped_is_stopped_and_its_resources_held() {
    let mut s = cluster();
    placed(&mut s, "r1", &["n1"]);
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaStopped {
        replica_id: "r1".into(),
        reason: "scaled down".into(),
    }));

    let p = plan(
        &s,
        &"n1".into(),
        &[running("r1", 0, 1)],
        &[],
        Adopting::new(),
    );
    assert!(p.commands.is_empty());
    assert_eq!(p.stops.len(), 1);
    let stop = &p.stops[0];
    assert_eq!(
        (stop.node_id.as_str(), stop.shard_id.as_str(), stop.why),
        ("n1", "r1-0", StopReason::ReplicaStopped)
    );
    assert_eq!(
        stop.held,
        Held {
            node_id: "n1".into(),
            replica_id: "r1".into(),
            port: 20000,
            gpus: vec![0, 4],
        }
    );
}

#[test]
fn a_live_replica_stops_a_shard_it_does_not_count() {
    let mut s = cluster();
    placed(&mut s, "r1", &["n1"]);
    let mut stray = running("r1", 0, 1);
    stray.shard_id = "r1-old".into();

    let p = plan(&s, &"n1".into(), &[stray], &[], Adopting::new());
    assert_eq!(p.stops.len(), 1);
    assert_eq!(p.stops[0].why, StopReason::ReplicaStopped);
}

#[test]
fn an_unknown_shard_whose_model_or_profile_left_the_catalog_is_stopped() {
    let s = cluster();
    let mut gone_model = running("r1", 0, 1);
    gone_model.model = "retired".into();
    let mut gone_profile = running("r2", 0, 1);
    gone_profile.profile = "old-profile".into();

    let p = plan(
        &s,
        &"n1".into(),
        &[gone_model, gone_profile],
        &[],
        Adopting::new(),
    );
    let stopped: Vec<_> = p
        .stops
        .iter()
        .map(|s| (s.shard_id.as_str(), s.why))
        .collect();
    assert_eq!(
        stopped,
        vec![
            ("r1-0", StopReason::LeftCatalog),
            ("r2-0", StopReason::LeftCatalog)
        ]
    );
    assert!(p.adoptions.is_empty() && p.adopting.is_empty());
}

#[test]
fn an_unknown_single_node_shard_is_adopted_at_once() {
    let s = cluster();
    let p = plan(
        &s,
        &"n1".into(),
        &[running("r9", 0, 1)],
        &[],
        Adopting::new(),
    );
    assert_eq!(p.adoptions.len(), 1);
    let a = &p.adoptions[0];
    assert_eq!(a.placement.replica_id, "r9");
    assert_eq!(a.placement.why, "adopted: reported running by its agents");
    assert_eq!(a.placement.shards[0].node_id, "n1");
    assert_eq!(a.placement.shards[0].gpu_indices, vec![0, 4]);
    // Reported only once adopted.
    assert!(p.commands.is_empty());
    assert_eq!(a.reports(), vec![report("r9", "r9-0", ShardState::Ready)]);
    assert!(p.adopting.is_empty());
}

#[test]
fn a_multi_node_replica_is_adopted_when_its_last_rank_registers() {
    let s = cluster();
    // Rank 1's node registers first, twice (a reconnect): one report kept.
    let first = plan(
        &s,
        &"n2".into(),
        &[running("r9", 1, 2)],
        &[],
        Adopting::new(),
    );
    assert!(first.adoptions.is_empty());
    let again = plan(
        &s,
        &"n2".into(),
        &[running("r9", 1, 2)],
        &[],
        first.adopting,
    );
    assert!(again.adoptions.is_empty());
    assert_eq!(again.adopting["r9"].len(), 1);

    let last = plan(
        &s,
        &"n1".into(),
        &[running("r9", 0, 2)],
        &[],
        again.adopting,
    );
    assert!(
        last.adopting.is_empty(),
        "a complete group is no longer kept"
    );
    assert_eq!(last.adoptions.len(), 1);
    let a = &last.adoptions[0];
    let ranks: Vec<_> = a
        .placement
        .shards
        .iter()
        .map(|s| (s.rank, s.node_id.as_str()))
        .collect();
    assert_eq!(ranks, vec![(0, "n1"), (1, "n2")], "rank 0 first");
    assert_eq!(a.placement, adopted_placement(&a.shards).unwrap());
    // Refused, every rank on every node stops.
    let stops: Vec<_> = a
        .stops()
        .iter()
        .map(|s| (s.node_id.to_string(), s.why))
        .collect();
    assert_eq!(
        stops,
        vec![
            ("n2".to_string(), StopReason::AdoptionRefused),
            ("n1".to_string(), StopReason::AdoptionRefused)
        ]
    );
}

#[test]
fn a_pending_shard_the_agent_does_not_run_is_started_again() {
    let mut s = cluster();
    let p = placed(&mut s, "r1", &["n2", "n1"]);

    let plan_n1 = plan(&s, &"n1".into(), &[], &[], Adopting::new());
    assert_eq!(plan_n1.starts.len(), 1);
    let start = &plan_n1.starts[0];
    assert_eq!(start.shard, p.shards[1]);
    assert_eq!(start.placement, p);
    assert_eq!(start.profile.name, "sim");
    // Rank 0 is on n2, which has no management address: its hostname.
    assert_eq!(start.leader_addr, "n2.example");
    assert!(plan_n1.commands.is_empty());

    let plan_n2 = plan(&s, &"n2".into(), &[], &[], Adopting::new());
    assert_eq!(plan_n2.starts[0].shard, p.shards[0]);
    assert_eq!(plan_n2.starts[0].leader_addr, "n2.example");

    // A pending shard of a model that left the catalog is not started.
    s.evolve(&Event::Catalog(CatalogEvent::ModelRemoved {
        name: "chat".into(),
    }));
    assert!(
        plan(&s, &"n1".into(), &[], &[], Adopting::new())
            .starts
            .is_empty()
    );
}

#[test]
fn a_shard_that_had_got_further_and_is_not_running_has_failed() {
    let mut s = cluster();
    placed(&mut s, "r1", &["n1"]);
    shard_state(&mut s, "r1", "r1-0", ShardState::Loading);
    placed(&mut s, "r2", &["n1"]);
    shard_state(&mut s, "r2", "r2-0", ShardState::Ready);
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaReady {
        replica_id: "r2".into(),
    }));
    // Elsewhere, and not live: neither is this node's concern.
    placed(&mut s, "r3", &["n2"]);
    shard_state(&mut s, "r3", "r3-0", ShardState::Ready);
    placed(&mut s, "r4", &["n1"]);
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaStopped {
        replica_id: "r4".into(),
        reason: "scaled down".into(),
    }));

    let p = plan(&s, &"n1".into(), &[], &[], Adopting::new());
    let failed = |r: &str| {
        Command::Replica(ReplicaCommand::ReportShard {
            replica_id: r.into(),
            shard_id: format!("{r}-0").into(),
            state: ShardState::Failed,
            error: Some(NOT_RUNNING.into()),
            exit_code: None,
            log_tail: None,
        })
    };
    assert_eq!(p.commands, vec![failed("r1"), failed("r2")]);
    assert!(p.starts.is_empty() && p.stops.is_empty());
}

/// `llmgw up` stopped: its agent stopped its engines and says so when it
/// comes back. Those replicas stop (placed again at once, no failure on
/// record); one it does not name still failed.
#[test]
fn shards_stopped_on_a_clean_exit_stop_their_replicas_instead_of_failing() {
    let mut s = cluster();
    placed(&mut s, "r1", &["n1"]);
    shard_state(&mut s, "r1", "r1-0", ShardState::Ready);
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaReady {
        replica_id: "r1".into(),
    }));
    placed(&mut s, "r2", &["n1"]);
    shard_state(&mut s, "r2", "r2-0", ShardState::Loading);
    placed(&mut s, "r3", &["n1"]);
    shard_state(&mut s, "r3", "r3-0", ShardState::Ready);

    let stopped = ["r1-0".into(), "r2-0".into()];
    let p = plan(&s, &"n1".into(), &[], &stopped, Adopting::new());
    let stop = |r: &str| {
        Command::Replica(ReplicaCommand::Stop {
            replica_id: r.into(),
            reason: STOPPED_ON_EXIT.into(),
        })
    };
    let failed = Command::Replica(ReplicaCommand::ReportShard {
        replica_id: "r3".into(),
        shard_id: "r3-0".into(),
        state: ShardState::Failed,
        error: Some(NOT_RUNNING.into()),
        exit_code: None,
        log_tail: None,
    });
    assert_eq!(p.commands, vec![stop("r1"), stop("r2"), failed]);
    assert!(p.starts.is_empty() && p.stops.is_empty());

    // A replica over two nodes: its rank on the other node is stopped too
    // (alone it serves nothing, and it holds a GPU and a port).
    placed(&mut s, "r4", &["n1", "n2"]);
    shard_state(&mut s, "r4", "r4-0", ShardState::Ready);
    let p = plan(&s, &"n1".into(), &[], &["r4-0".into()], Adopting::new());
    assert!(p.commands.contains(&stop("r4")), "{:?}", p.commands);
    let others: Vec<_> = p
        .stops
        .iter()
        .map(|s| (s.node_id.as_str(), s.shard_id.as_str(), s.why))
        .collect();
    assert_eq!(others, [("n2", "r4-1", StopReason::ReplicaStopped)]);
}

#[test]
fn reports_come_before_failures_and_leave_groups_of_other_replicas_alone() {
    let mut s = cluster();
    placed(&mut s, "r1", &["n1"]);
    placed(&mut s, "r2", &["n1"]);
    shard_state(&mut s, "r2", "r2-0", ShardState::Starting);
    let mut gathered = Adopting::new();
    gathered.insert("r7".into(), vec![("n2".into(), running("r7", 1, 2))]);

    let p = plan(
        &s,
        &"n1".into(),
        &[running("r1", 0, 1)],
        &[],
        gathered.clone(),
    );
    assert_eq!(p.commands.len(), 2);
    assert_eq!(p.commands[0], report("r1", "r1-0", ShardState::Ready));
    assert!(matches!(
        &p.commands[1],
        Command::Replica(ReplicaCommand::ReportShard { replica_id, state: ShardState::Failed, .. }) if replica_id == "r2"
    ));
    assert_eq!(p.adopting, gathered);
}
