//! The reconciler's plan: what a pass does for a given cluster.

use llmgw_domain::catalog::{CatalogEvent, Engine, Model, Profile, Scaling};
use llmgw_domain::clocks::Clocks;
use llmgw_domain::ids::{ReplicaId, ShardId};
use llmgw_domain::nodes::{FabricAttachment, Gpu, Inventory, NodeEvent};
use llmgw_domain::reconcile::{
    Action, Backoff, Runtime, Settings, ShardOnNode, adopted, asked_at_change, backoff, desired,
    grown, plan,
};
use llmgw_domain::replicas::{ReplicaEvent, ReplicaStatus, ShardState};
use llmgw_domain::{Event, State, UnixMillis};

fn sim_model(min: u32, max: u32) -> Model {
    let mut m = Model::named("chat");
    m.scaling = Scaling {
        min,
        max,
        idle_timeout_s: Some(60),
    };
    m.profiles = vec![Profile::cpu("sim", Engine::Sim)];
    m
}

fn register(state: &mut State, id: &str) {
    state.evolve(&Event::Node(NodeEvent::NodeRegistered {
        node_id: id.into(),
        inventory: Inventory {
            hostname: id.into(),
            gpus: Vec::<Gpu>::new(),
            engines: [("sim".to_string(), "1".to_string())].into(),
            ..Inventory::default()
        },
    }));
}

fn register_with_memory(state: &mut State, id: &str, memory_total_mb: u64) {
    state.evolve(&Event::Node(NodeEvent::NodeRegistered {
        node_id: id.into(),
        inventory: Inventory {
            hostname: id.into(),
            memory_total_mb,
            engines: [("sim".to_string(), "1".to_string())].into(),
            ..Inventory::default()
        },
    }));
}

fn cluster(min: u32, max: u32, nodes: &[&str]) -> State {
    let mut s = State::default();
    s.evolve(&Event::Catalog(CatalogEvent::ModelAdded {
        model: sim_model(min, max),
    }));
    for n in nodes {
        register(&mut s, n);
    }
    s
}

/// Runs passes, applying each plan's effects the way the control plane
/// does, until nothing is left to do; returns every action taken.
fn settle(state: &mut State, rt: &mut Runtime) -> Vec<Action> {
    let mut all = Vec::new();
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    for _ in 0..20 {
        let p = plan(state, rt, &Settings::default(), |_| {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            format!("r{n:05}").into()
        });
        if p.actions.is_empty() {
            break;
        }
        for a in &p.actions {
            let events = match a {
                Action::Place { placement, .. } => {
                    vec![ReplicaEvent::ReplicaPlaced(placement.clone())]
                }
                Action::Fail { replica_id, reason } => vec![ReplicaEvent::ReplicaFailed {
                    replica_id: replica_id.clone(),
                    reason: reason.clone(),
                }],
                Action::Stop {
                    replica_id, reason, ..
                } => vec![ReplicaEvent::ReplicaStopped {
                    replica_id: replica_id.clone(),
                    reason: reason.clone(),
                }],
                Action::Drain { replica_id, .. } | Action::Evict { replica_id, .. } => {
                    rt.drain_since.replicas.insert(replica_id.clone(), rt.now);
                    vec![ReplicaEvent::ReplicaDraining {
                        replica_id: replica_id.clone(),
                        why: None,
                    }]
                }
                Action::FinishNodeDrain { node_id } => {
                    state.evolve(&Event::Node(NodeEvent::NodeDrained {
                        node_id: node_id.clone(),
                    }));
                    vec![]
                }
            };
            for e in events {
                state.evolve(&Event::Replica(e));
            }
        }
        all.extend(p.actions);
        rt.now += 60_000;
    }
    all
}

/// An operator drains `node` (cordoned, then drained) now.
fn drain_node(state: &mut State, rt: &mut Runtime, node: &str) {
    state.evolve(&Event::Node(NodeEvent::NodeCordoned {
        node_id: node.into(),
        by: "ops".into(),
        reason: "drain".into(),
    }));
    state.evolve(&Event::Node(NodeEvent::NodeDrainRequested {
        node_id: node.into(),
        by: "ops".into(),
    }));
    rt.drain_since.nodes.insert(node.into(), rt.now);
}

/// One replica's shards report ready (the others' do not).
fn ready_one(state: &mut State, replica: &ReplicaId) {
    let shards: Vec<ShardId> = state.replicas.replicas[replica]
        .shards
        .keys()
        .cloned()
        .collect();
    for shard in shards {
        let events = state
            .replicas
            .decide(llmgw_domain::replicas::ReplicaCommand::ReportShard {
                replica_id: replica.clone(),
                shard_id: shard,
                state: ShardState::Ready,
                error: None,
                exit_code: None,
                log_tail: None,
            })
            .expect("accepted");
        for e in events {
            state.evolve(&Event::Replica(e));
        }
    }
}

fn ready_all(state: &mut State) {
    let ids: Vec<(ReplicaId, ShardId)> = state
        .replicas
        .replicas
        .values()
        .filter(|r| r.is_live())
        .flat_map(|r| {
            r.shards
                .keys()
                .map(|s| (r.placement.replica_id.clone(), s.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    for (r, s) in ids {
        let events = state
            .replicas
            .decide(llmgw_domain::replicas::ReplicaCommand::ReportShard {
                replica_id: r,
                shard_id: s,
                state: ShardState::Ready,
                error: None,
                exit_code: None,
                log_tail: None,
            })
            .expect("accepted");
        for e in events {
            state.evolve(&Event::Replica(e));
        }
    }
}

fn live(state: &State) -> usize {
    state
        .replicas
        .replicas
        .values()
        .filter(|r| r.is_live())
        .count()
}

#[test]
fn one_placement_per_model_per_pass_up_to_min() {
    let mut s = cluster(3, 3, &["a", "b", "c"]);
    let p = plan(&s, &Runtime::default(), &Settings::default(), |_| {
        "r1".into()
    });
    assert_eq!(p.actions.len(), 1, "one placement per pass");
    let actions = settle(&mut s, &mut Runtime::default());
    assert_eq!(actions.len(), 3);
    assert_eq!(live(&s), 3);
    let nodes: std::collections::BTreeSet<_> = s
        .replicas
        .replicas
        .values()
        .map(|r| r.placement.shards[0].node_id.clone())
        .collect();
    assert_eq!(nodes.len(), 3, "CPU replicas spread over the nodes");
    // Idempotent: a settled cluster plans nothing.
    let again = plan(&s, &Runtime::default(), &Settings::default(), |_| {
        "x".into()
    });
    assert!(again.actions.is_empty());
}

/// A lost node's serving replica goes on serving until its replacement
/// does, as on a draining node: its engines may well be fine (only its
/// agent is silent), and failing it at once left the model with nothing
/// to route to for as long as an engine takes to load. One not serving
/// yet is failed, as before.
#[test]
fn a_lost_nodes_serving_replica_is_replaced_before_it_goes() {
    let mut s = cluster(1, 1, &["a", "b"]);
    let mut rt = Runtime::default();
    settle(&mut s, &mut rt);
    ready_all(&mut s);
    let first = s.replicas.replicas.values().next().expect("one").clone();
    let old = first.placement.replica_id.clone();
    let node = first.placement.shards[0].node_id.clone();
    s.evolve(&Event::Node(NodeEvent::NodeLost {
        node_id: node.clone(),
    }));
    let p = plan(&s, &rt, &Settings::default(), |_| "r-new".into());
    assert!(
        matches!(&p.actions[..], [Action::Place { placement, .. }] if placement.shards[0].node_id != node),
        "a replacement elsewhere, nothing failed: {:?}",
        p.actions
    );
    settle(&mut s, &mut rt);
    assert_eq!(
        s.replicas.replicas[&old].status,
        ReplicaStatus::Ready,
        "still serving while its replacement loads"
    );
    // The replacement serves: the old one is drained, saying why.
    ready_all(&mut s);
    let p = plan(&s, &rt, &Settings::default(), |_| "r-x".into());
    assert!(
        matches!(&p.actions[..], [Action::Drain { replica_id, why, .. }]
            if *replica_id == old && why == &format!("replaced: its node {node} is lost")),
        "{:?}",
        p.actions
    );
    settle(&mut s, &mut rt);
    let live: Vec<_> = s
        .replicas
        .replicas
        .values()
        .filter(|r| r.is_live())
        .collect();
    assert_eq!(live.len(), 1);
    assert_ne!(live[0].placement.shards[0].node_id, node);

    // A replica still starting there has nothing to keep: failed at once.
    let mut s = cluster(1, 1, &["a", "b"]);
    let mut rt = Runtime::default();
    settle(&mut s, &mut rt);
    let starting = s.replicas.replicas.values().next().expect("one").clone();
    let node = starting.placement.shards[0].node_id.clone();
    s.evolve(&Event::Node(NodeEvent::NodeLost {
        node_id: node.clone(),
    }));
    let actions = settle(&mut s, &mut rt);
    assert!(
        matches!(&actions[0], Action::Fail { reason, .. } if reason == &format!("node {node} is lost")),
        "{actions:?}"
    );
}

#[test]
fn a_removed_nodes_replica_is_failed_and_rebuilt_elsewhere() {
    let mut s = cluster(1, 1, &["a", "b"]);
    let mut rt = Runtime::default();
    settle(&mut s, &mut rt);
    ready_all(&mut s);
    let first = s.replicas.replicas.values().next().expect("one").clone();
    let node = first.placement.shards[0].node_id.clone();
    s.evolve(&Event::Node(NodeEvent::NodeRemoved {
        node_id: node.clone(),
        certificates: vec![],
    }));
    let actions = settle(&mut s, &mut rt);
    assert!(
        matches!(&actions[0], Action::Fail { reason, .. } if reason == &format!("node {node} was removed")),
        "{actions:?}"
    );
    let rebuilt: Vec<_> = s
        .replicas
        .replicas
        .values()
        .filter(|r| r.is_live())
        .collect();
    assert_eq!(rebuilt.len(), 1);
    assert_ne!(rebuilt[0].placement.shards[0].node_id, node);
}

#[test]
fn a_node_drain_is_rolling_the_replacement_serves_first() {
    let mut s = cluster(1, 1, &["a", "b"]);
    let mut rt = Runtime::default();
    settle(&mut s, &mut rt);
    ready_all(&mut s);
    let original = s.replicas.replicas.keys().next().expect("one").clone();
    let node = s.replicas.replicas[&original].placement.shards[0]
        .node_id
        .clone();
    drain_node(&mut s, &mut rt, &node);
    let p = plan(&s, &rt, &Settings::default(), |_| "r900".into());
    assert_eq!(p.actions.len(), 1, "{:?}", p.actions);
    assert!(
        matches!(&p.actions[0], Action::Place { placement, .. } if placement.shards[0].node_id != node)
    );
    if let Action::Place { placement: pl, .. } = &p.actions[0] {
        s.evolve(&Event::Replica(ReplicaEvent::ReplicaPlaced(pl.clone())));
    }
    // Not ready yet: the original keeps serving, however long the engine
    // loads (a real one takes minutes, past any drain grace).
    let p = plan(&s, &rt, &Settings::default(), |_| "r901".into());
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    rt.now += 10 * Settings::default().drain_grace_ms;
    let p = plan(&s, &rt, &Settings::default(), |_| "r901".into());
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    ready_all(&mut s);
    let p = plan(&s, &rt, &Settings::default(), |_| "r902".into());
    assert_eq!(
        p.actions,
        vec![Action::Drain {
            replica_id: original.clone(),
            shards: vec![ShardOnNode {
                node_id: node.clone(),
                shard_id: format!("{original}-0").into(),
            }],
            why: format!("replaced: its node {node} drains"),
        }]
    );
    let actions = settle(&mut s, &mut rt);
    assert!(actions.contains(&Action::FinishNodeDrain { node_id: node }));
    assert!(!s.replicas.replicas[&original].is_live());
}

/// A drain with no room for a replacement leaves the original serving and
/// the node draining, and with room for some, stops only as many
/// originals as have replacements serving: a drain never takes a model
/// below what it serves.
#[test]
fn a_drain_without_room_for_replacements_keeps_the_originals_serving() {
    let serving = |s: &State| {
        s.replicas
            .replicas
            .values()
            .filter(|r| r.status == llmgw_domain::replicas::ReplicaStatus::Ready)
            .count()
    };
    // One node: nowhere to go.
    let mut s = cluster(1, 1, &["a"]);
    let mut rt = Runtime::default();
    settle(&mut s, &mut rt);
    ready_all(&mut s);
    drain_node(&mut s, &mut rt, "a");
    rt.now += 10 * Settings::default().drain_grace_ms;
    let actions = settle(&mut s, &mut rt);
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Drain { .. } | Action::FinishNodeDrain { .. })),
        "{actions:?}"
    );
    assert_eq!(serving(&s), 1);

    // Two replicas on "a"; "b" cordoned while they were placed, then
    // opened with room for one.
    let mut model = sim_model(2, 2);
    model.profiles[0].memory_mb = 1000;
    let mut s = State::default();
    s.evolve(&Event::Catalog(CatalogEvent::ModelAdded { model }));
    register_with_memory(&mut s, "a", 2500);
    let mut rt = Runtime::default();
    settle(&mut s, &mut rt);
    ready_all(&mut s);
    assert_eq!(serving(&s), 2);
    register_with_memory(&mut s, "b", 1500);
    drain_node(&mut s, &mut rt, "a");
    settle(&mut s, &mut rt);
    ready_all(&mut s);
    rt.now += 10 * Settings::default().drain_grace_ms;
    let actions = settle(&mut s, &mut rt);
    let drained = actions
        .iter()
        .filter(|a| matches!(a, Action::Drain { .. }))
        .count();
    assert_eq!(
        drained, 1,
        "one replacement, one original stopped: {actions:?}"
    );
    assert_eq!(serving(&s), 2, "still two serving");
}

/// On a draining node with nowhere to go, a replica still starting is
/// drained (it serves nothing, and may hold the room a replacement needs)
/// while the serving one stays.
#[test]
fn a_drain_stops_first_what_serves_nothing() {
    let mut s = cluster(2, 2, &["a"]);
    let mut rt = Runtime::default();
    settle(&mut s, &mut rt);
    let ids: Vec<ReplicaId> = s.replicas.replicas.keys().cloned().collect();
    assert_eq!(ids.len(), 2);
    let serving = ids[0].clone();
    ready_one(&mut s, &serving);
    drain_node(&mut s, &mut rt, "a");
    let p = plan(&s, &rt, &Settings::default(), |_| "r-new".into());
    let drained: Vec<&ReplicaId> = p
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Drain { replica_id, .. } => Some(replica_id),
            _ => None,
        })
        .collect();
    assert_eq!(drained, vec![&ids[1]], "{:?}", p.actions);
}

/// One pass as the control plane runs it: this pass's full models noted,
/// what load asks for worked out, then the plan, its placements applied.
fn pass_with(s: &mut State, rt: &mut Runtime, full: bool, id: &str) -> Vec<Action> {
    rt.full = if full {
        ["chat".to_string()].into()
    } else {
        Default::default()
    };
    if full {
        rt.busy.insert("chat".into(), rt.now);
    }
    rt.grown = grown(s, rt, &Settings::default());
    let p = plan(s, rt, &Settings::default(), |_| id.into());
    for a in &p.actions {
        match a {
            Action::Place { placement, .. } => s.evolve(&Event::Replica(
                ReplicaEvent::ReplicaPlaced(placement.clone()),
            )),
            Action::Drain { replica_id, .. } => {
                s.evolve(&Event::Replica(ReplicaEvent::ReplicaDraining {
                    replica_id: replica_id.clone(),
                    why: None,
                }))
            }
            _ => {}
        }
    }
    p.actions
}

/// `scaling.max` above the floor is reached under load: a full model gets
/// one replica more once every replica it has serves, up to max, holds
/// them while it was full within its idle time, and drains the extra ones
/// after.
#[test]
fn load_grows_a_model_one_replica_at_a_time_up_to_max_and_idle_shrinks_it() {
    let mut s = cluster(1, 3, &["a", "b", "c"]);
    let mut rt = Runtime::default();
    assert!(matches!(
        &pass_with(&mut s, &mut rt, false, "r1")[..],
        [Action::Place { .. }]
    ));
    ready_all(&mut s);
    assert!(
        pass_with(&mut s, &mut rt, false, "x").is_empty(),
        "not full: the floor"
    );
    rt.now += 1_000;
    assert!(matches!(
        &pass_with(&mut s, &mut rt, true, "r2")[..],
        [Action::Place { .. }]
    ));
    assert_eq!(
        desired(&s.catalog.models["chat"], &rt, &Settings::default()),
        2
    );
    // Still full while r2 starts: it is waited for, not doubled.
    rt.now += 1_000;
    assert!(pass_with(&mut s, &mut rt, true, "x").is_empty());
    ready_all(&mut s);
    rt.now += 1_000;
    assert!(matches!(
        &pass_with(&mut s, &mut rt, true, "r3")[..],
        [Action::Place { .. }]
    ));
    ready_all(&mut s);
    rt.now += 1_000;
    assert!(pass_with(&mut s, &mut rt, true, "x").is_empty(), "max is 3");
    assert_eq!(live(&s), 3);
    // In use below full (the load spread over three): held however long,
    // not drained and grown again over and over.
    for _ in 0..5 {
        rt.now += 50_000;
        rt.busy.insert("chat".into(), rt.now);
        assert!(pass_with(&mut s, &mut rt, false, "x").is_empty());
    }
    // A new leader takes the three over rather than draining them.
    let mut fresh = Runtime {
        now: rt.now,
        ..Runtime::default()
    };
    assert_eq!(
        adopted(&s, &fresh, &Settings::default()),
        [("chat".to_string(), 3)].into()
    );
    fresh.grown = adopted(&s, &fresh, &Settings::default());
    assert_eq!(
        desired(&s.catalog.models["chat"], &fresh, &Settings::default()),
        3
    );
    // Not used at all: held within the idle time (60 s here)...
    rt.now += 30_000;
    assert!(pass_with(&mut s, &mut rt, false, "x").is_empty());
    // ...then the extra replicas drain, newest first, back to min.
    rt.now += 31_000;
    let drained = pass_with(&mut s, &mut rt, false, "x");
    assert!(
        matches!(&drained[..], [Action::Drain { replica_id, .. }] if replica_id.as_str() == "r3"),
        "{drained:?}"
    );
    assert_eq!(
        desired(&s.catalog.models["chat"], &rt, &Settings::default()),
        1
    );
    // A replica load asked for is waited for while it starts, however
    // long (its empty engine reads as room, no sign of quiet).
    let mut slow = cluster(1, 2, &["a", "b"]);
    let mut rt = Runtime::default();
    pass_with(&mut slow, &mut rt, false, "s1");
    ready_all(&mut slow);
    assert!(matches!(
        &pass_with(&mut slow, &mut rt, true, "s2")[..],
        [Action::Place { .. }]
    ));
    rt.now += 120_000;
    assert!(
        pass_with(&mut slow, &mut rt, false, "x").is_empty(),
        "s2 is waited for"
    );
    ready_all(&mut slow);
    let drained = pass_with(&mut slow, &mut rt, false, "x");
    assert!(
        matches!(&drained[..], [Action::Drain { replica_id, .. }] if replica_id.as_str() == "s2"),
        "{drained:?}"
    );
    // An on-demand model in use but never full holds nothing of load's:
    // once its demand is taken back (evicted for another model), nothing
    // asks for it again, and a new leader adopts no single replica of it.
    let mut od = cluster(0, 2, &["a"]);
    let mut rt = Runtime::default();
    rt.demand.insert("chat".into(), rt.now);
    pass_with(&mut od, &mut rt, false, "o1");
    ready_all(&mut od);
    rt.busy.insert("chat".into(), rt.now);
    assert!(pass_with(&mut od, &mut rt, false, "x").is_empty());
    assert!(rt.grown.is_empty(), "{:?}", rt.grown);
    rt.demand.clear();
    assert_eq!(
        desired(&od.catalog.models["chat"], &rt, &Settings::default()),
        0
    );
    assert!(adopted(&od, &rt, &Settings::default()).is_empty());
    // A model with no room above its floor never grows.
    let mut fixed = cluster(2, 2, &["a", "b", "c"]);
    let mut rt = Runtime::default();
    pass_with(&mut fixed, &mut rt, false, "f1");
    pass_with(&mut fixed, &mut rt, false, "f2");
    ready_all(&mut fixed);
    assert!(pass_with(&mut fixed, &mut rt, true, "x").is_empty());
    assert!(rt.grown.is_empty());
}

#[test]
fn scale_down_drains_before_it_stops_and_on_demand_idles_out() {
    let mut s = cluster(0, 2, &["a"]);
    let mut rt = Runtime::default();
    assert_eq!(
        desired(&s.catalog.models["chat"], &rt, &Settings::default()),
        0
    );
    rt.demand.insert("chat".into(), UnixMillis(0));
    let p = plan(&s, &rt, &Settings::default(), |_| "r1".into());
    assert!(matches!(&p.actions[..], [Action::Place { .. }]));
    if let Action::Place { placement: pl, .. } = &p.actions[0] {
        s.evolve(&Event::Replica(ReplicaEvent::ReplicaPlaced(pl.clone())));
    }
    ready_all(&mut s);
    rt.now = UnixMillis(61_000); // past the 60 s idle timeout
    let p = plan(&s, &rt, &Settings::default(), |_| "r2".into());
    assert_eq!(
        p.actions,
        vec![Action::Drain {
            replica_id: "r1".into(),
            shards: vec![ShardOnNode {
                node_id: "a".into(),
                shard_id: "r1-0".into(),
            }],
            why: "not asked for within its idle time".into(),
        }]
    );
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaDraining {
        replica_id: "r1".into(),
        why: None,
    }));
    rt.drain_since.replicas.insert("r1".into(), rt.now);
    assert!(
        plan(&s, &rt, &Settings::default(), |_| "r3".into())
            .actions
            .is_empty(),
        "in-flight work gets its grace"
    );
    // An engine seen idle stops at once, without waiting out the grace.
    let mut idle = rt.clone();
    idle.idle.insert("r1".into());
    let p = plan(&s, &idle, &Settings::default(), |_| "r3".into());
    assert!(
        matches!(&p.actions[..], [Action::Stop { failed: false, reason, .. }] if reason.contains("nothing was left running")),
        "{:?}",
        p.actions
    );
    rt.now += Settings::default().drain_grace_ms;
    let p = plan(&s, &rt, &Settings::default(), |_| "r3".into());
    assert!(
        matches!(&p.actions[..], [Action::Stop { failed: false, reason, .. }] if reason.contains("grace ran out")),
        "{:?}",
        p.actions
    );
}

/// An on-demand model's replica on a draining node whose replacement
/// failed to start, once not asked for within its idle time, is drained
/// for that: nothing replaced it, and the event says so (it said
/// "replaced: its node … drains", sending the operator after a
/// replacement that never ran). Nothing new is placed for it.
#[test]
fn an_idle_on_demand_replica_on_a_draining_node_is_drained_as_idle_not_replaced() {
    let mut s = cluster(0, 1, &["a", "b"]);
    let mut rt = Runtime::default();
    rt.demand.insert("chat".into(), UnixMillis(0));
    let p = plan(&s, &rt, &Settings::default(), |_| "r1".into());
    let [Action::Place { placement, .. }] = &p.actions[..] else {
        panic!("placed on demand: {:?}", p.actions);
    };
    let node = placement.shards[0].node_id.clone();
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaPlaced(
        placement.clone(),
    )));
    ready_all(&mut s);
    drain_node(&mut s, &mut rt, &node);
    // Still asked for: a replacement goes elsewhere, and fails to start.
    let p = plan(&s, &rt, &Settings::default(), |_| "r2".into());
    let [Action::Place { placement, .. }] = &p.actions[..] else {
        panic!("a replacement first: {:?}", p.actions);
    };
    assert_ne!(placement.shards[0].node_id, node);
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaPlaced(
        placement.clone(),
    )));
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaFailed {
        replica_id: "r2".into(),
        reason: "exited".into(),
    }));
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaStopped {
        replica_id: "r2".into(),
        reason: "failed; it is rebuilt".into(),
    }));
    rt.now = UnixMillis(61_000); // past the 60 s idle timeout
    let p = plan(&s, &rt, &Settings::default(), |_| "r3".into());
    assert_eq!(
        p.actions,
        vec![Action::Drain {
            replica_id: "r1".into(),
            shards: vec![ShardOnNode {
                node_id: node,
                shard_id: "r1-0".into(),
            }],
            why: "not asked for within its idle time".into(),
        }]
    );
}

#[test]
fn backoff_doubles_from_the_base_up_to_the_cap_with_jitter() {
    let (base, max) = (10_000, 600_000);
    assert_eq!(backoff(1, base, max, 0.5), 10_000);
    assert_eq!(backoff(2, base, max, 0.5), 20_000);
    assert_eq!(backoff(4, base, max, 0.5), 80_000);
    assert_eq!(backoff(30, base, max, 0.5), 600_000);
    assert_eq!(backoff(1, base, max, 0.0), 8_000);
    assert!(backoff(1, base, max, 0.999) < 12_000);
    // A model backing off is not placed, and the plan says until when.
    let s = cluster(1, 1, &["a"]);
    let mut rt = Runtime::default();
    rt.not_before.insert("chat".into(), UnixMillis(5));
    let p = plan(&s, &rt, &Settings::default(), |_| "r".into());
    assert!(p.actions.is_empty());
    assert_eq!(
        p.backing_off,
        vec![Backoff {
            model: "chat".into(),
            until: Some(UnixMillis(5))
        }]
    );
    // Once the time has come, it is placed and no longer held back.
    rt.now = UnixMillis(5);
    let p = plan(&s, &rt, &Settings::default(), |_| "r".into());
    assert!(matches!(&p.actions[..], [Action::Place { .. }]));
    assert!(p.backing_off.is_empty());
}

#[test]
fn a_failed_replica_holds_its_model_back_in_the_pass_that_stops_it() {
    let mut s = cluster(1, 1, &["a"]);
    let mut rt = Runtime::default();
    settle(&mut s, &mut rt);
    let id = s.replicas.replicas.keys().next().expect("one").clone();
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaFailed {
        replica_id: id.clone(),
        reason: "exited".into(),
    }));
    let p = plan(&s, &rt, &Settings::default(), |_| "r2".into());
    assert!(
        matches!(&p.actions[..], [Action::Stop { replica_id, failed: true, .. }] if *replica_id == id),
        "{:?}",
        p.actions
    );
    // The failure's time is not in the clocks yet: held back, until unknown.
    assert_eq!(
        p.backing_off,
        vec![Backoff {
            model: "chat".into(),
            until: None
        }]
    );
}

/// A removed model's serving replica is drained, so that what it is
/// answering finishes (it stops once idle, or at the drain grace), not
/// cut; one that serves nothing yet stops at once.
#[test]
fn replicas_whose_model_left_the_catalog_are_drained_then_stopped() {
    let mut s = cluster(2, 2, &["a", "b"]);
    let mut rt = Runtime::default();
    settle(&mut s, &mut rt);
    let ids: Vec<ReplicaId> = s.replicas.replicas.keys().cloned().collect();
    // One serves, the other is still starting.
    let ready = ids[0].clone();
    ready_one(&mut s, &ready);
    s.evolve(&Event::Catalog(CatalogEvent::ModelRemoved {
        name: "chat".into(),
    }));
    let p = plan(&s, &rt, &Settings::default(), |_| "r".into());
    assert!(
        p.actions
            .iter()
            .any(|a| matches!(a, Action::Drain { replica_id, .. } if *replica_id == ready)),
        "{:?}",
        p.actions
    );
    assert!(
        p.actions
            .iter()
            .any(|a| matches!(a, Action::Stop { replica_id, reason, .. }
            if *replica_id == ids[1] && reason.contains("left the catalog"))),
        "{:?}",
        p.actions
    );
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaDraining {
        replica_id: ready.clone(),
        why: None,
    }));
    rt.drain_since.replicas.insert(ready.clone(), rt.now);
    // Draining, not cut: nothing until idle or the grace.
    let p = plan(&s, &rt, &Settings::default(), |_| "r".into());
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::Stop { replica_id, .. } if *replica_id == ready)),
        "{:?}",
        p.actions
    );
    rt.idle.insert(ready.clone());
    let p = plan(&s, &rt, &Settings::default(), |_| "r".into());
    assert!(
        p.actions
            .iter()
            .any(|a| matches!(a, Action::Stop { replica_id, .. } if *replica_id == ready)),
        "{:?}",
        p.actions
    );
}

/// A profile renamed (the old one gone, the model kept) is rolled like an
/// edited one: the new profile's replica serves before the old stops.
#[test]
fn a_renamed_profile_is_replaced_before_its_replica_stops() {
    let mut s = cluster(1, 1, &["a", "b"]);
    let mut rt = Runtime::default();
    settle(&mut s, &mut rt);
    ready_all(&mut s);
    let original = s.replicas.replicas.keys().next().unwrap().clone();
    let mut renamed = sim_model(1, 1);
    renamed.profiles[0].name = "sim-v2".into();
    s.evolve(&Event::Catalog(CatalogEvent::ModelUpdated {
        model: renamed,
    }));
    let p = plan(&s, &rt, &Settings::default(), |_| "r-new".into());
    assert!(
        matches!(&p.actions[..], [Action::Place { placement, .. }] if placement.profile == "sim-v2"),
        "placed first, nothing stopped: {:?}",
        p.actions
    );
    let actions = settle(&mut s, &mut rt);
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Drain { replica_id, .. } if *replica_id == original)),
        "not before the new one serves: {actions:?}"
    );
    ready_all(&mut s);
    let actions = settle(&mut s, &mut rt);
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Drain { replica_id, why, .. }
            if *replica_id == original && why == "replaced: what it runs changed (its profile or the model's context length)")),
        "{actions:?}"
    );
}

/// Two on-demand models that each need most of the one node's memory:
/// `old` placed at 0 and ready, `new` not placed.
fn full_node() -> State {
    let mut s = State::default();
    for name in ["old", "new"] {
        let mut m = Model::named(name);
        m.scaling = Scaling {
            min: 0,
            max: 1,
            idle_timeout_s: Some(3600),
        };
        let mut p = Profile::cpu("sim", Engine::Sim);
        p.memory_mb = 10_000;
        m.profiles = vec![p];
        s.evolve(&Event::Catalog(CatalogEvent::ModelAdded { model: m }));
    }
    s.evolve(&Event::Node(NodeEvent::NodeRegistered {
        node_id: "a".into(),
        inventory: Inventory {
            hostname: "a".into(),
            memory_total_mb: 16_000,
            engines: [("sim".to_string(), "1".to_string())].into(),
            ..Inventory::default()
        },
    }));
    let mut rt = Runtime::default();
    rt.demand.insert("old".into(), UnixMillis(0));
    let p = plan(&s, &rt, &Settings::default(), |_| "r-old".into());
    let [Action::Place { placement: pl, .. }] = &p.actions[..] else {
        panic!("{:?}", p.actions)
    };
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaPlaced(pl.clone())));
    ready_all(&mut s);
    s
}

/// `old` placed at 0, last asked for at `used`; `new` asked for at `now`.
fn asked(now: i64, used: i64) -> Runtime {
    let mut rt = Runtime {
        now: UnixMillis(now),
        ..Runtime::default()
    };
    rt.placed_at.insert("r-old".into(), UnixMillis(0));
    rt.demand.insert("old".into(), UnixMillis(used));
    rt.demand.insert("new".into(), UnixMillis(now));
    rt
}

fn evictions(s: &State, rt: &Runtime, settings: &Settings) -> Vec<Action> {
    plan(s, rt, settings, |_| "r-new".into())
        .actions
        .into_iter()
        .filter(|a| matches!(a, Action::Evict { .. }))
        .collect()
}

#[test]
fn an_idle_on_demand_replica_is_evicted_for_one_asked_for_which_then_serves() {
    let mut s = full_node();
    let settings = Settings::default();
    let ten_minutes = 10 * 60_000;
    let mut rt = asked(ten_minutes, 1_000);
    let p = plan(&s, &rt, &settings, |_| "r-new".into());
    assert_eq!(
        p.actions,
        vec![Action::Evict {
            replica_id: "r-old".into(),
            model: "old".into(),
            for_model: "new".into(),
            shards: vec![ShardOnNode {
                node_id: "a".into(),
                shard_id: "r-old-0".into(),
            }],
        }]
    );
    assert_eq!(p.unplaced.len(), 1, "new fits nowhere until old is gone");
    // The control plane forgets old's demand as it evicts it (it is wanted
    // again when asked again). Drained like any other; while it drains
    // nothing else is evicted.
    rt.demand.remove("old");
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaDraining {
        replica_id: "r-old".into(),
        why: None,
    }));
    rt.drain_since.replicas.insert("r-old".into(), rt.now);
    assert!(evictions(&s, &rt, &settings).is_empty());
    rt.idle.insert("r-old".into());
    let p = plan(&s, &rt, &settings, |_| "r-new".into());
    assert!(
        matches!(&p.actions[..], [Action::Stop { replica_id, .. }] if replica_id == "r-old"),
        "{:?}",
        p.actions
    );
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaStopped {
        replica_id: "r-old".into(),
        reason: "drained".into(),
    }));
    let p = plan(&s, &rt, &settings, |_| "r-new".into());
    assert!(
        matches!(&p.actions[..], [Action::Place { placement, .. }] if placement.model == "new"),
        "{:?}",
        p.actions
    );
}

#[test]
fn a_busy_fresh_unused_adopted_or_always_on_replica_is_never_evicted() {
    let settings = Settings::default();
    let s = full_node();
    let ten_minutes = 10 * 60_000;
    // Busy: asked for 10 s ago.
    assert!(evictions(&s, &asked(ten_minutes, ten_minutes - 10_000), &settings).is_empty());
    // Fresh: placed 2 minutes ago, idle for one.
    assert!(evictions(&s, &asked(2 * 60_000, 60_000), &settings).is_empty());
    // Never asked for since it was placed: unknown use is not idle.
    let mut rt = asked(ten_minutes, 0);
    rt.placed_at.insert("r-old".into(), UnixMillis(500));
    assert!(evictions(&s, &rt, &settings).is_empty());
    let mut rt = asked(ten_minutes, 1_000);
    rt.demand.remove("old");
    assert!(evictions(&s, &rt, &settings).is_empty());
    // Adopted (or placed before the log this server read): no age known.
    let mut rt = asked(ten_minutes, 1_000);
    rt.placed_at.clear();
    assert!(evictions(&s, &rt, &settings).is_empty());
    // Its model is always on (min 1).
    let mut always = s.clone();
    let mut m = always.catalog.models["old"].clone();
    m.scaling.min = 1;
    always.evolve(&Event::Catalog(CatalogEvent::ModelUpdated { model: m }));
    assert!(evictions(&always, &asked(ten_minutes, 1_000), &settings).is_empty());
    // A request that has waited a while still counts: it is waiting.
    let mut rt = asked(ten_minutes, 1_000);
    rt.demand
        .insert("new".into(), UnixMillis(ten_minutes - 30_000));
    assert_eq!(evictions(&s, &rt, &settings).len(), 1);
    // The model asked for must have been asked for, not wanted for its min.
    let mut rt = asked(ten_minutes, 1_000);
    rt.demand.remove("new");
    assert!(evictions(&s, &rt, &settings).is_empty());
    // The guards hold, and it goes.
    assert_eq!(
        evictions(&s, &asked(ten_minutes, 1_000), &settings).len(),
        1
    );
}

/// Two nodes on one fabric and a model whose profile spans both.
fn two_node_cluster() -> State {
    let mut s = State::default();
    let mut m = Model::named("big");
    m.scaling.min = 1;
    let mut p = Profile::cpu("tp2", Engine::Vllm);
    p.gpu_class = Some("h100-80g".into());
    p.tp = 2;
    p.nodes = 2;
    p.gpus_per_node = 1;
    m.profiles = vec![p];
    s.evolve(&Event::Catalog(CatalogEvent::ModelAdded { model: m }));
    for (id, addr) in [("n1", "10.0.0.1"), ("n2", "10.0.0.2")] {
        s.evolve(&Event::Node(NodeEvent::NodeRegistered {
            node_id: id.into(),
            inventory: Inventory {
                hostname: format!("{id}.example"),
                mgmt_addr: addr.into(),
                gpus: vec![Gpu {
                    index: 0,
                    uuid: format!("GPU-{id}"),
                    class: "h100-80g".into(),
                    memory_mb: 81_559,
                    nvlink_peers: vec![],
                    problems: vec![],
                }],
                fabrics: vec![FabricAttachment {
                    fabric: "ib".into(),
                    hcas: vec!["mlx5_0".into()],
                    rate_gbps: 200,
                }],
                memory_total_mb: 64_000,
                disk_free_gb: Some(500),
                engines: [("vllm".to_string(), "0.11.0".to_string())].into(),
                ..Inventory::default()
            },
        }));
    }
    s
}

#[test]
fn a_placement_carries_its_starts_rank_0_first_with_where_rank_0_listens() {
    let s = two_node_cluster();
    let p = plan(&s, &Runtime::default(), &Settings::default(), |_| {
        "r1".into()
    });
    let [Action::Place { placement, starts }] = &p.actions[..] else {
        panic!("{:?}", p.actions)
    };
    assert_eq!(placement.shards.len(), 2);
    let ranks: Vec<u32> = starts.iter().map(|st| st.shard.rank).collect();
    assert_eq!(ranks, vec![0, 1], "rank 0 holds the rendezvous");
    let rank0 = &placement.shards.iter().find(|sh| sh.rank == 0).unwrap();
    let rank0_addr = if rank0.node_id == "n1" {
        "10.0.0.1"
    } else {
        "10.0.0.2"
    };
    for st in starts {
        assert_eq!(&st.placement, placement);
        assert_eq!(st.model.name, "big");
        assert_eq!(st.profile.name, "tp2");
        assert_eq!(st.leader_addr, rank0_addr, "every rank dials rank 0");
        assert!(placement.shards.contains(&st.shard));
    }
}

#[test]
fn a_stop_and_a_drain_name_every_shard_with_its_node() {
    let mut s = two_node_cluster();
    let mut rt = Runtime::default();
    settle(&mut s, &mut rt);
    ready_all(&mut s);
    let r = s.replicas.replicas.values().next().unwrap().clone();
    let id = r.placement.replica_id.clone();
    let expected: Vec<ShardOnNode> = r
        .placement
        .shards
        .iter()
        .map(|sh| ShardOnNode {
            node_id: sh.node_id.clone(),
            shard_id: sh.shard_id.clone(),
        })
        .collect();
    assert_eq!(expected.len(), 2);
    assert_ne!(expected[0].node_id, expected[1].node_id);
    // Scaled to nothing: drained, on both nodes.
    let mut none = s.clone();
    let mut m = none.catalog.models["big"].clone();
    m.scaling.min = 0;
    none.evolve(&Event::Catalog(CatalogEvent::ModelUpdated { model: m }));
    let p = plan(&none, &rt, &Settings::default(), |_| "r2".into());
    assert_eq!(
        p.actions,
        vec![Action::Drain {
            replica_id: id.clone(),
            shards: expected.clone(),
            why: "not asked for within its idle time".into(),
        }]
    );
    // Failed: stopped, on both nodes.
    s.evolve(&Event::Replica(ReplicaEvent::ReplicaFailed {
        replica_id: id.clone(),
        reason: "exited".into(),
    }));
    let p = plan(&s, &rt, &Settings::default(), |_| "r2".into());
    assert_eq!(
        p.actions,
        vec![Action::Stop {
            replica_id: id,
            reason: "failed; it is rebuilt".into(),
            failed: true,
            shards: expected,
        }]
    );
}

/// A model whose floor is lowered to 0 while it runs is kept for its idle
/// time from the change, then idles out; it was drained at once, "not
/// asked for within its idle time", though never asked for (requests to a
/// model with a floor are not asks). The clocks tell the change from the
/// log; it is taken once (an ask dropped later, as an eviction drops it,
/// stays dropped), and one that does not run is not started by it, nor is
/// a newer ask moved back.
#[test]
fn a_running_model_made_on_demand_is_kept_for_its_idle_time_from_the_change() {
    let mut s = cluster(1, 1, &["a"]);
    let mut rt = Runtime::default();
    let p = plan(&s, &rt, &Settings::default(), |_| "r1".into());
    if let Action::Place { placement: pl, .. } = &p.actions[0] {
        s.evolve(&Event::Replica(ReplicaEvent::ReplicaPlaced(pl.clone())));
    }
    ready_all(&mut s);
    let mut clocks = Clocks::default();
    let added = Event::Catalog(CatalogEvent::ModelAdded {
        model: sim_model(1, 1),
    });
    clocks.observe(&s, &added, UnixMillis(1_000));
    assert!(clocks.made_on_demand.is_empty(), "added with a floor");
    let lowered = Event::Catalog(CatalogEvent::ModelUpdated {
        model: sim_model(0, 1),
    });
    s.evolve(&lowered);
    let changed = UnixMillis(100_000);
    clocks.observe(&s, &lowered, changed);
    assert_eq!(clocks.made_on_demand.get("chat"), Some(&changed));
    let mut taken = std::collections::BTreeMap::new();
    rt.now = changed + 1_000;
    asked_at_change(&s, &clocks.made_on_demand, &mut taken, &mut rt.demand);
    assert_eq!(rt.demand.get("chat"), Some(&changed));
    assert!(
        plan(&s, &rt, &Settings::default(), |_| "r2".into())
            .actions
            .is_empty(),
        "kept within its idle time of the change"
    );
    rt.now = changed + 61_000; // past the 60 s idle timeout
    let p = plan(&s, &rt, &Settings::default(), |_| "r2".into());
    assert!(
        matches!(&p.actions[..], [Action::Drain { why, .. }] if why == "not asked for within its idle time"),
        "{:?}",
        p.actions
    );
    // Taken once: an ask dropped since is not brought back.
    rt.demand.clear();
    asked_at_change(&s, &clocks.made_on_demand, &mut taken, &mut rt.demand);
    assert!(rt.demand.is_empty(), "{:?}", rt.demand);
    // Nothing runs: a change is no ask.
    let idle = cluster(0, 1, &["a"]);
    let mut demand = std::collections::BTreeMap::new();
    asked_at_change(
        &idle,
        &clocks.made_on_demand,
        &mut Default::default(),
        &mut demand,
    );
    assert!(demand.is_empty(), "{demand:?}");
    // A floor raised again is no longer a change to on-demand.
    let raised = Event::Catalog(CatalogEvent::ModelUpdated {
        model: sim_model(1, 1),
    });
    clocks.observe(&s, &raised, changed + 70_000);
    assert!(clocks.made_on_demand.is_empty());
}

/// After a restore from an older backup the log knew the node but not the
/// replica its engine served: a new leader placed onto the node before its
/// agent came back, the engine's port clashed with that placement, and
/// the serving engine was stopped instead of adopted. A node the leader
/// has not heard from takes nothing new, and the model's explanation says
/// why; heard (its registration carried out), it is placed on at once.
#[test]
fn nothing_is_placed_on_a_node_the_leader_has_not_heard_from() {
    let s = cluster(1, 1, &["a"]);
    let mut rt = Runtime {
        unheard: ["a".into()].into(),
        ..Runtime::default()
    };
    let p = plan(&s, &rt, &Settings::default(), |_| "r1".into());
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(p.unplaced.len(), 1);
    let why = p.unplaced[0].summary();
    assert!(
        why.contains("a: not heard from since this server took office"),
        "{why}"
    );
    rt.unheard.clear();
    let p = plan(&s, &rt, &Settings::default(), |_| "r1".into());
    assert!(
        matches!(&p.actions[..], [Action::Place { placement, .. }] if placement.shards[0].node_id == "a"),
        "{:?}",
        p.actions
    );
}

/// The rule holds placement back only from the nodes not heard from: a
/// model goes at once to a node that has registered (the first to come
/// back after a failover, or a new cluster's first), and an id the log
/// does not hold changes nothing.
#[test]
fn a_node_heard_from_is_placed_on_while_another_is_not() {
    let s = cluster(1, 1, &["a", "b"]);
    let rt = Runtime {
        unheard: ["a".into(), "gone".into()].into(),
        ..Runtime::default()
    };
    let p = plan(&s, &rt, &Settings::default(), |_| "r1".into());
    assert!(
        matches!(&p.actions[..], [Action::Place { placement, .. }] if placement.shards[0].node_id == "b"),
        "{:?}",
        p.actions
    );
    let only_stale = Runtime {
        unheard: ["gone".into()].into(),
        ..Runtime::default()
    };
    let p = plan(&s, &only_stale, &Settings::default(), |_| "r1".into());
    assert!(
        matches!(&p.actions[..], [Action::Place { placement, .. }] if placement.shards[0].node_id == "a"),
        "{:?}",
        p.actions
    );
}

/// A new leader's on-demand model that fits on a node not heard from yet
/// waits for it (its agent is back within seconds) rather than evicting
/// an idle replica elsewhere, which would take that down for nothing.
#[test]
fn an_unheard_node_that_would_take_a_model_is_waited_for_not_evicted_for() {
    let mut s = full_node();
    s.evolve(&Event::Node(NodeEvent::NodeRegistered {
        node_id: "b".into(),
        inventory: Inventory {
            hostname: "b".into(),
            memory_total_mb: 16_000,
            engines: [("sim".to_string(), "1".to_string())].into(),
            ..Inventory::default()
        },
    }));
    let settings = Settings::default();
    let mut rt = asked(10 * 60_000, 1_000);
    rt.unheard.insert("b".into());
    let p = plan(&s, &rt, &settings, |_| "r-new".into());
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(p.unplaced.len(), 1);
    rt.unheard.clear();
    let p = plan(&s, &rt, &settings, |_| "r-new".into());
    assert!(
        matches!(&p.actions[..], [Action::Place { placement, .. }] if placement.shards[0].node_id == "b"),
        "{:?}",
        p.actions
    );
}
