//! What an agent's registration means: a plan, carried out by the control
//! plane afterwards.
//!
//! An agent registers with the shards it runs. Against the state the log
//! built, each is reported (the log places it and its replica is live),
//! stopped (the log stopped its replica, or its model or profile left the
//! catalog) or gathered for adoption (the log does not know it: the
//! control plane restarted, or this is a new leader). A replica spread
//! over several nodes is adopted once every rank has been reported. Shards
//! the log places on the node that the agent does not run are started (a
//! pending one: starts are idempotent), stopped (its agent says it stopped
//! them itself on a clean exit, as `llmgw up` does: nothing failed) or
//! declared failed (one that had got further died with its agent).
//!
//! Pure, like [`crate::reconcile::plan`]: the same state, node, shards and
//! gathered groups give the same plan. The caller sends the stops and
//! starts and decides the commands, outside any lock on the state.

use std::collections::{BTreeMap, BTreeSet};

use crate::catalog::{Model, Profile};
use crate::ids::{NodeId, ReplicaId, ShardId};
use crate::placement::Held;
use crate::replicas::{Placement, ReplicaCommand, ReplicaStatus, ShardPlacement, ShardState};
use crate::{Command, State};

/// A shard an agent says it runs, in the domain's terms (the control plane
/// converts it from the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningShard {
    pub replica_id: ReplicaId,
    pub shard_id: ShardId,
    pub rank: u32,
    /// How many nodes its replica spans (at least 1).
    pub nnodes: u32,
    pub gpu_indices: Vec<u32>,
    pub hcas: Vec<String>,
    pub port: u16,
    /// `None` for a state this server does not know.
    pub state: Option<ShardState>,
    pub model: String,
    pub profile: String,
    pub profile_fp: String,
    pub pool: String,
    /// Empty when it runs on no fabric.
    pub fabric: String,
}

/// Shards of replicas the log does not know, gathered across
/// registrations until every rank has been reported: replica id → (node,
/// shard), in the order they arrived.
pub type Adopting = BTreeMap<ReplicaId, Vec<(NodeId, RunningShard)>>;

/// Why a running shard must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The log stopped its replica (or no longer counts the shard in it).
    ReplicaStopped,
    /// Its model, or the model's profile, is no longer in the catalog.
    LeftCatalog,
    /// Its replica could not be adopted (the adoption was refused).
    AdoptionRefused,
}

/// A running shard to stop, and what its process holds until it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    pub node_id: NodeId,
    pub shard_id: ShardId,
    pub why: StopReason,
    /// Its GPUs and port, which placement leaves alone meanwhile.
    pub held: Held,
}

/// Everything a start message is built from: the replica, the shard, what
/// it runs and where rank 0 listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub placement: Placement,
    pub shard: ShardPlacement,
    pub model: Model,
    pub profile: Profile,
    /// Rank 0's node's management address (its hostname when it has
    /// none); empty when that node is unknown.
    pub leader_addr: String,
}

/// A replica rebuilt from what its agents report running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoption {
    pub placement: Placement,
    /// Every rank, with its node, as reported.
    pub shards: Vec<(NodeId, RunningShard)>,
}

/// What a registration asks for, in the order it is carried out:
/// adoptions, then the commands; stops and starts are sends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Reports of known shards, then shards declared failed.
    pub commands: Vec<Command>,
    pub stops: Vec<Stop>,
    pub starts: Vec<Start>,
    /// Replicas whose every rank is now reported.
    pub adoptions: Vec<Adoption>,
    /// The groups still waiting for ranks, to keep for the next
    /// registration.
    pub adopting: Adopting,
}

/// The error a shard the log expects on a node gets when its agent comes
/// back without it.
pub const NOT_RUNNING: &str = "not running on its node after the agent reconnected";

/// Why a replica stops when its agent comes back saying it stopped the
/// replica's shard itself, on a clean exit.
pub const STOPPED_ON_EXIT: &str = "its agent stopped it on a clean exit";

/// The plan for `node`'s registration with `running`, the shards its
/// agent says it stopped on a clean exit (`stopped_on_exit`), given the
/// groups gathered from earlier registrations.
pub fn plan(
    state: &State,
    node: &NodeId,
    running: &[RunningShard],
    stopped_on_exit: &[ShardId],
    mut adopting: Adopting,
) -> Plan {
    let mut plan = Plan::default();
    let mut seen = BTreeSet::new();
    for rs in running {
        seen.insert(rs.shard_id.as_str());
        match state.replicas.replicas.get(&rs.replica_id) {
            Some(r) if r.is_live() && r.shards.contains_key(&rs.shard_id) => {
                if let Some(s) = rs.state {
                    plan.commands.push(report(rs, s));
                }
            }
            Some(_) => plan.stops.push(stop(node, rs, StopReason::ReplicaStopped)),
            None if !in_catalog(state, rs) => {
                plan.stops.push(stop(node, rs, StopReason::LeftCatalog));
            }
            None => {
                let group = adopting.entry(rs.replica_id.clone()).or_default();
                // A node that registers again replaces its earlier report.
                group.retain(|(n, s)| !(n == node && s.shard_id == rs.shard_id));
                group.push((node.clone(), rs.clone()));
                if group.len() >= rs.nnodes.max(1) as usize
                    && let Some(shards) = adopting.remove(&rs.replica_id)
                    && let Some(placement) = adopted_placement(&shards)
                {
                    plan.adoptions.push(Adoption { placement, shards });
                }
            }
        }
    }
    for r in state.replicas.replicas.values().filter(|r| r.is_live()) {
        let mut stopped = false;
        for shard in r.shards.values() {
            if *node != shard.placement.node_id || seen.contains(shard.placement.shard_id.as_str())
            {
                continue;
            }
            // Stopped on purpose: the replica is stopped, not failed, so
            // that its model is placed again at once (a failure would hold
            // it back for the backoff) and no failure is recorded that did
            // not happen. Once for the replica, however many its shards.
            let serving_or_starting =
                matches!(r.status, ReplicaStatus::Starting | ReplicaStatus::Ready);
            if serving_or_starting
                && shard.state != ShardState::Pending
                && stopped_on_exit.contains(&shard.placement.shard_id)
            {
                if !stopped {
                    stopped = true;
                    plan.commands.push(Command::Replica(ReplicaCommand::Stop {
                        replica_id: r.placement.replica_id.clone(),
                        reason: STOPPED_ON_EXIT.into(),
                    }));
                    // Its ranks on other nodes are no use alone: they stop
                    // too, holding their GPUs and ports until they have.
                    plan.stops.extend(
                        (r.placement.shards.iter())
                            .filter(|s| s.node_id != *node)
                            .map(|s| Stop {
                                node_id: s.node_id.clone(),
                                shard_id: s.shard_id.clone(),
                                why: StopReason::ReplicaStopped,
                                held: Held {
                                    node_id: s.node_id.clone(),
                                    replica_id: r.placement.replica_id.clone(),
                                    port: s.port,
                                    gpus: s.gpu_indices.clone(),
                                },
                            }),
                    );
                }
                continue;
            }
            match (r.status, shard.state) {
                (ReplicaStatus::Starting, ShardState::Pending) => {
                    plan.starts
                        .extend(start(state, &r.placement, &shard.placement));
                }
                (ReplicaStatus::Starting | ReplicaStatus::Ready, _) => {
                    plan.commands
                        .push(Command::Replica(ReplicaCommand::ReportShard {
                            replica_id: r.placement.replica_id.clone(),
                            shard_id: shard.placement.shard_id.clone(),
                            state: ShardState::Failed,
                            error: Some(NOT_RUNNING.into()),
                            exit_code: None,
                            log_tail: None,
                        }));
                }
                _ => {}
            }
        }
    }
    plan.adopting = adopting;
    plan
}

impl Adoption {
    /// Once adopted, what its shards report.
    pub fn reports(&self) -> Vec<Command> {
        self.shards
            .iter()
            .filter_map(|(_, s)| s.state.map(|st| report(s, st)))
            .collect()
    }

    /// When the adoption is refused, its shards stop.
    pub fn stops(&self) -> Vec<Stop> {
        self.shards
            .iter()
            .map(|(n, s)| stop(n, s, StopReason::AdoptionRefused))
            .collect()
    }
}

/// What starting `shard` of `placement` takes; `None` when its model or
/// profile is no longer in the catalog (nothing to start).
pub fn start(state: &State, placement: &Placement, shard: &ShardPlacement) -> Option<Start> {
    let model = state.catalog.models.get(&placement.model)?;
    let profile = model
        .profiles
        .iter()
        .find(|p| p.name == placement.profile)?;
    let leader_addr = placement
        .shards
        .iter()
        .find(|s| s.rank == 0)
        .and_then(|s| state.nodes.nodes.get(&s.node_id))
        .map(|n| {
            if n.inventory.mgmt_addr.is_empty() {
                n.inventory.hostname.clone()
            } else {
                n.inventory.mgmt_addr.clone()
            }
        })
        .unwrap_or_default();
    Some(Start {
        placement: placement.clone(),
        shard: shard.clone(),
        model: model.clone(),
        profile: profile.clone(),
        leader_addr,
    })
}

/// A replica rebuilt from the ranks its agents report, rank 0 first.
pub fn adopted_placement(shards: &[(NodeId, RunningShard)]) -> Option<Placement> {
    let (_, first) = shards.first()?;
    let mut out: Vec<ShardPlacement> = shards
        .iter()
        .map(|(node, s)| ShardPlacement {
            shard_id: s.shard_id.clone(),
            rank: s.rank,
            node_id: node.clone(),
            gpu_indices: s.gpu_indices.clone(),
            hcas: s.hcas.clone(),
            port: s.port,
            memory_mb: 0,
        })
        .collect();
    out.sort_by_key(|s| s.rank);
    Some(Placement {
        replica_id: first.replica_id.clone(),
        model: first.model.clone(),
        profile: first.profile.clone(),
        profile_fp: first.profile_fp.clone(),
        pool: first.pool.clone(),
        fabric: (!first.fabric.is_empty()).then(|| first.fabric.clone()),
        shards: out,
        why: "adopted: reported running by its agents".into(),
    })
}

fn in_catalog(state: &State, rs: &RunningShard) -> bool {
    state
        .catalog
        .models
        .get(&rs.model)
        .is_some_and(|m| m.profiles.iter().any(|p| p.name == rs.profile))
}

fn report(rs: &RunningShard, state: ShardState) -> Command {
    Command::Replica(ReplicaCommand::ReportShard {
        replica_id: rs.replica_id.clone(),
        shard_id: rs.shard_id.clone(),
        state,
        error: None,
        exit_code: None,
        log_tail: None,
    })
}

fn stop(node: &NodeId, rs: &RunningShard, why: StopReason) -> Stop {
    Stop {
        node_id: node.clone(),
        shard_id: rs.shard_id.clone(),
        why,
        held: Held {
            node_id: node.clone(),
            replica_id: rs.replica_id.clone(),
            port: rs.port,
            gpus: rs.gpu_indices.clone(),
        },
    }
}
