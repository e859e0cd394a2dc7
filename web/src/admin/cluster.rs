//! The cluster as the dashboard shows it: nodes and their GPUs, live
//! replicas, the catalog's models against what runs, and for a model that
//! is short of replicas the placement explanation — computed here with
//! the same pure function the control plane's `explain` uses, so any
//! server (a standby, the admin listener) can answer it.

use std::collections::BTreeMap;

use llmgw_api::admin::NodeRow as ApiNode;
use llmgw_domain::catalog::Model;
use llmgw_domain::nodes::Reachability;
use llmgw_domain::placement::{self, PlaceOptions};
use llmgw_domain::reconcile::{Runtime, Settings, desired};
use llmgw_domain::replicas::{ReplicaStatus, ShardState};
use llmgw_projections::ClusterView;

use super::fmt;

#[derive(Debug, Clone)]
pub(crate) struct GpuRow {
    pub index: u32,
    pub class: String,
    pub memory: String,
    /// The live replica holding it, or empty.
    pub holder: String,
    /// Why placement avoids it, or empty.
    pub problems: String,
}

#[derive(Debug, Clone)]
pub(crate) struct NodeRow {
    pub id: String,
    pub hostname: String,
    pub state: &'static str,
    pub ready: bool,
    pub cordoned: bool,
    pub draining: bool,
    /// From the leader's agent streams; `—` where this server has none.
    pub last_seen: String,
    pub memory: String,
    pub gpus: Vec<GpuRow>,
    /// Engines the node was asked to install, from the leader's streams.
    pub provision: Vec<ProvisionBadge>,
}

/// One provisioned engine: `llamacpp b1 ready`, and why when not.
#[derive(Debug, Clone)]
pub(crate) struct ProvisionBadge {
    pub label: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Clone)]
pub(crate) struct ReplicaRow {
    pub id: String,
    pub model: String,
    pub profile: String,
    pub state: &'static str,
    pub ready: bool,
    /// `node-1: GPU 0, 1 (ready)` per shard.
    pub shards: Vec<String>,
    pub error: String,
}

#[derive(Debug, Clone)]
pub(crate) struct ModelRow {
    pub name: String,
    pub ready: usize,
    pub live: usize,
    pub wanted: u32,
    pub max: u32,
    pub on_demand: bool,
    pub price: String,
    /// Fewer replicas starting or ready than wanted.
    pub short: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct CandidateRow {
    pub node: String,
    pub fits: bool,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub(crate) struct ProfileRow {
    pub profile: String,
    pub priority: i32,
    pub outcome: String,
    pub candidates: Vec<CandidateRow>,
}

/// Why a model has fewer replicas than it wants (or, for an idle
/// on-demand model, whether a request would find room).
#[derive(Debug, Clone)]
pub(crate) struct Why {
    pub model: String,
    pub headline: String,
    pub summary: String,
    /// Placement would succeed now: the control plane places it on its
    /// next pass (or it waits out a failure's backoff).
    pub fits: bool,
    pub profiles: Vec<ProfileRow>,
}

fn state_name(r: Reachability) -> &'static str {
    match r {
        Reachability::Ready => "ready",
        Reachability::Unreachable => "unreachable",
        Reachability::Lost => "lost",
    }
}

fn replica_state(s: ReplicaStatus) -> &'static str {
    match s {
        ReplicaStatus::Starting => "starting",
        ReplicaStatus::Ready => "ready",
        ReplicaStatus::Draining => "draining",
        ReplicaStatus::Failed => "failed",
        ReplicaStatus::Stopped => "stopped",
    }
}

fn shard_state(s: ShardState) -> &'static str {
    match s {
        ShardState::Pending => "pending",
        ShardState::Starting => "starting",
        ShardState::Loading => "loading",
        ShardState::Ready => "ready",
        ShardState::Draining => "draining",
        ShardState::Stopped => "stopped",
        ShardState::Failed => "failed",
    }
}

pub(crate) fn nodes(c: &ClusterView, api: &[ApiNode]) -> Vec<NodeRow> {
    let seen: BTreeMap<&str, Option<f64>> = api
        .iter()
        .map(|n| (n.id.as_str(), n.last_heartbeat_s))
        .collect();
    let provision: BTreeMap<&str, &[llmgw_api::admin::ProvisionRow]> = api
        .iter()
        .map(|n| (n.id.as_str(), n.provision.as_slice()))
        .collect();
    c.nodes
        .nodes
        .values()
        .map(|n| {
            let held = c.allocations.get(&n.id);
            NodeRow {
                id: n.id.to_string(),
                hostname: n.inventory.hostname.clone(),
                state: state_name(n.reachability),
                ready: n.reachability == Reachability::Ready,
                cordoned: n.cordoned,
                draining: n.draining,
                last_seen: seen
                    .get(n.id.as_str())
                    .copied()
                    .flatten()
                    .map_or_else(|| "—".to_owned(), fmt::ago),
                memory: if n.inventory.memory_total_mb == 0 {
                    "—".into()
                } else {
                    fmt::gib(n.inventory.memory_total_mb)
                },
                gpus: n
                    .inventory
                    .gpus
                    .iter()
                    .map(|g| GpuRow {
                        index: g.index,
                        class: g.class.clone(),
                        memory: fmt::gib(g.memory_mb),
                        holder: held
                            .and_then(|h| h.get(&g.index))
                            .map(ToString::to_string)
                            .unwrap_or_default(),
                        problems: g.problems.join("; "),
                    })
                    .collect(),
                provision: provision
                    .get(n.id.as_str())
                    .copied()
                    .unwrap_or_default()
                    .iter()
                    .map(|p| ProvisionBadge {
                        label: format!("{} {} {}", p.engine, p.version, p.state),
                        ok: p.state == "ready",
                        detail: if p.state == "ready" {
                            String::new()
                        } else {
                            p.detail.clone()
                        },
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Replicas that may still hold GPUs (stopped ones are history: the
/// event log has them).
pub(crate) fn replicas(c: &ClusterView) -> Vec<ReplicaRow> {
    c.replicas
        .replicas
        .values()
        .filter(|r| r.is_live())
        .map(|r| {
            let mut shards: Vec<_> = r.shards.values().collect();
            shards.sort_by_key(|s| s.placement.rank);
            ReplicaRow {
                id: r.placement.replica_id.to_string(),
                model: r.placement.model.clone(),
                profile: r.placement.profile.clone(),
                state: replica_state(r.status),
                ready: r.status == ReplicaStatus::Ready,
                shards: shards
                    .iter()
                    .map(|s| {
                        let gpus = if s.placement.gpu_indices.is_empty() {
                            "CPU".to_owned()
                        } else {
                            let list: Vec<String> =
                                s.placement.gpu_indices.iter().map(u32::to_string).collect();
                            format!("GPU {}", list.join(", "))
                        };
                        format!("{}: {gpus} ({})", s.placement.node_id, shard_state(s.state))
                    })
                    .collect(),
                error: shards
                    .iter()
                    .find_map(|s| s.error.clone())
                    .unwrap_or_default(),
            }
        })
        .collect()
}

/// Replicas of a model that count towards what it wants, as the
/// reconciler counts them: starting or ready.
fn counting(c: &ClusterView, model: &str) -> (usize, usize) {
    let of = || {
        c.replicas
            .replicas
            .values()
            .filter(move |r| r.placement.model == model)
    };
    let live = of()
        .filter(|r| matches!(r.status, ReplicaStatus::Starting | ReplicaStatus::Ready))
        .count();
    // Ready on nodes that answer, as `ctl status` and `ctl models` count.
    let ready = of()
        .filter(|r| {
            r.status == ReplicaStatus::Ready
                && r.placement.shards.iter().all(|s| {
                    c.nodes
                        .nodes
                        .get(&s.node_id)
                        .is_some_and(|n| n.reachability == llmgw_domain::nodes::Reachability::Ready)
                })
        })
        .count();
    (live, ready)
}

/// What a model wants with no request waiting: the page cannot see the
/// control plane's demand, so an on-demand model wants none.
fn wanted(model: &Model) -> u32 {
    desired(model, &Runtime::default(), &Settings::default())
}

fn price(model: &Model) -> String {
    match model.price {
        None => "—".into(),
        Some(p) if p.is_zero() => "free".into(),
        Some(p) => format!(
            "{} in / {} out per 1k",
            fmt::money(p.prompt_per_1k),
            fmt::money(p.completion_per_1k)
        ),
    }
}

pub(crate) fn models(c: &ClusterView) -> Vec<ModelRow> {
    c.catalog
        .models
        .values()
        .map(|m| {
            let (live, ready) = counting(c, &m.name);
            let wanted = wanted(m);
            ModelRow {
                name: m.name.clone(),
                ready,
                live,
                wanted,
                max: m.scaling.max,
                on_demand: m.on_demand(),
                price: price(m),
                short: (live as u32) < wanted,
            }
        })
        .collect()
}

/// The placement explanation for every model short of replicas, and for
/// every idle on-demand model (would a request find room?). Agents'
/// processes the log already counts as stopped are not visible here, so
/// a GPU they still hold for a moment may look free.
pub(crate) fn explanations(c: &ClusterView, place: PlaceOptions) -> Vec<Why> {
    c.catalog
        .models
        .values()
        .filter_map(|m| {
            let (live, _) = counting(c, &m.name);
            let wanted = wanted(m);
            let headline = if (live as u32) < wanted {
                format!("wants {wanted} replica(s), has {live} starting or ready")
            } else if m.on_demand() && live == 0 {
                "on demand, idle: where a request would start it".to_owned()
            } else {
                return None;
            };
            let e = placement::place(m, &c.nodes, &c.replicas, &[], &"explain".into(), place);
            Some(Why {
                model: m.name.clone(),
                headline,
                summary: e.summary(),
                fits: e.chosen.is_some(),
                profiles: e
                    .profiles
                    .into_iter()
                    .map(|p| ProfileRow {
                        profile: p.profile,
                        priority: p.priority,
                        outcome: p.outcome,
                        candidates: p
                            .candidates
                            .into_iter()
                            .map(|c| CandidateRow {
                                node: c.node.into_string(),
                                fits: c.fits,
                                reason: c.reason,
                            })
                            .collect(),
                    })
                    .collect(),
            })
        })
        .collect()
}
