//! The reconciler's decision: desired against actual, as a list of actions.
//!
//! Pure and idempotent: it reads the state the log built plus a few facts
//! (backoff and drain clocks read from the log, on-demand requests kept in
//! memory) and returns what to do. Running it twice on the same input gives
//! the same plan; carrying out a plan changes the log, so the next pass sees
//! the result. At most one placement per model per pass, because the next
//! placement must see the GPUs the previous one took. Nothing is placed on
//! a node the leader has not heard from in its office ([`Runtime::unheard`]):
//! what runs there is known first, so an engine the log does not know is
//! adopted, never stopped for a clash with a placement made meanwhile.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use crate::State;
use crate::catalog::Model;
use crate::clocks::Drains;
use crate::ids::{NodeId, ReplicaId, ShardId};
use crate::nodes::{Nodes, Reachability};
use crate::placement::{self, Candidate, Explanation, Held, PlaceOptions};
use crate::registration::{self, Start};
use crate::replicas::{Placement, Replica, ReplicaStatus, ShardPlacement};
use crate::{Millis, UnixMillis};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub place: PlaceOptions,
    /// How long a draining replica may finish in-flight work.
    pub drain_grace_ms: Millis,
    /// Idle time after which an on-demand model without `idle_timeout_s` is
    /// stopped.
    pub default_idle_ms: Millis,
    /// Eviction guards: a replica younger than this is never evicted to
    /// make room for an on-demand model...
    pub min_lifetime_ms: Millis,
    /// ...nor one whose model was asked for less than this long ago.
    pub evict_idle_ms: Millis,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            place: PlaceOptions::default(),
            drain_grace_ms: 30_000,
            default_idle_ms: 15 * 60_000,
            min_lifetime_ms: 5 * 60_000,
            evict_idle_ms: 60_000,
        }
    }
}

/// The facts of a pass beyond the state: the clocks read from the log
/// (`crate::clocks`) and what the control plane keeps in memory.
#[derive(Debug, Clone, Default)]
pub struct Runtime {
    /// Wall-clock milliseconds, comparable with the times the log recorded.
    pub now: UnixMillis,
    /// Model → no placement before this time (after failures).
    pub not_before: BTreeMap<String, UnixMillis>,
    /// On-demand model → when it was last asked for.
    pub demand: BTreeMap<String, UnixMillis>,
    /// When each replica's and each node's drain began.
    pub drain_since: Drains,
    /// Draining replicas whose engines were seen with nothing running or
    /// waiting since their drain began: they stop without waiting out the
    /// grace.
    pub idle: BTreeSet<ReplicaId>,
    /// Processes agents report that the log no longer counts as live.
    pub held: Vec<Held>,
    /// Live replica → when it was placed, read from the log.
    pub placed_at: BTreeMap<ReplicaId, UnixMillis>,
    /// Models whose engines are full this pass (the gateway's saturation at
    /// its ceilings: requests waiting, or the KV cache near full, on every
    /// replica), read from the engines' own figures, so traffic through
    /// every server counts.
    pub full: BTreeSet<String>,
    /// Model → when it was last seen in use (full, or serving anything).
    pub busy: BTreeMap<String, UnixMillis>,
    /// Model → the replicas load has asked for (see [`grown`]); held in
    /// memory, so a new leader takes over what it finds ([`adopted`]).
    pub grown: BTreeMap<String, u32>,
    /// Nodes the log holds that this leader has not heard from since it
    /// took office (its registration not yet carried out). What they run
    /// is unknown until their agents register: an engine a restored log
    /// does not know would clash with a placement made meanwhile, and be
    /// stopped for it. Nothing new goes there until they register, or the
    /// clocks mark them unreachable (then nothing goes there anyway).
    pub unheard: BTreeSet<NodeId>,
}

/// Why a pass places nothing on a node in [`Runtime::unheard`].
pub const UNHEARD: &str =
    "not heard from since this server took office: what it runs is known once its agent registers";

/// The nodes a pass may place on: the log's, less those this leader has
/// not heard from yet. Borrowed unless one of those is in the log (for a
/// few seconds after a leader takes office).
fn placeable<'a>(state: &'a State, rt: &Runtime) -> Cow<'a, Nodes> {
    if !rt.unheard.iter().any(|n| state.nodes.nodes.contains_key(n)) {
        return Cow::Borrowed(&state.nodes);
    }
    let mut nodes = state.nodes.clone();
    nodes.nodes.retain(|id, _| !rt.unheard.contains(id));
    Cow::Owned(nodes)
}

/// An explanation made over [`placeable`]'s nodes, with each node left out
/// given its verdict (said, not silently missing, while a model waits).
fn with_unheard(mut e: Explanation, state: &State, rt: &Runtime) -> Explanation {
    let away: Vec<&NodeId> = (rt.unheard.iter())
        .filter(|n| state.nodes.nodes.contains_key(*n))
        .collect();
    for verdict in &mut e.profiles {
        verdict.candidates.extend(away.iter().map(|n| Candidate {
            node: (*n).clone(),
            fits: false,
            reason: UNHEARD.into(),
        }));
        verdict.candidates.sort_by(|a, b| a.node.cmp(&b.node));
    }
    e
}

/// What one action's messages to agents need, decided with the plan so
/// that the executor sends what it is told and reads no state of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Append `ReplicaPlaced`, then send `starts`, one per shard, rank 0
    /// first (it holds the rendezvous the others join).
    Place {
        placement: Placement,
        starts: Vec<Start>,
    },
    /// A shard's node is lost: the replica cannot serve.
    Fail {
        replica_id: ReplicaId,
        reason: String,
    },
    /// Append `ReplicaStopped`, then stop every shard (the append is
    /// fenced: a deposed leader's stop goes no further).
    Stop {
        replica_id: ReplicaId,
        reason: String,
        /// Whether this stop follows a failure (the model backs off).
        failed: bool,
        /// Where the stops go.
        shards: Vec<ShardOnNode>,
    },
    /// Take the replica out of routing and let in-flight work finish:
    /// append `ReplicaDraining`, then tell each shard's node.
    Drain {
        replica_id: ReplicaId,
        shards: Vec<ShardOnNode>,
        /// Why, recorded in its `ReplicaDraining`.
        why: String,
    },
    /// A draining node has nothing live left on it.
    FinishNodeDrain { node_id: NodeId },
    /// Take an idle replica out of routing to make room for an on-demand
    /// model that fits nowhere else: drained like any other (it stops as
    /// soon as its engine is idle), after which `for_model` is placed. The
    /// executor forgets the demand for `model` (the victim's), so that it
    /// is wanted again only when asked again.
    Evict {
        replica_id: ReplicaId,
        model: String,
        for_model: String,
        shards: Vec<ShardOnNode>,
    },
}

/// One shard of a replica and the node it runs on: where a stop or a
/// drain is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardOnNode {
    pub node_id: NodeId,
    pub shard_id: ShardId,
}

/// The shards of `placement`, in its order, with their nodes.
pub fn shards_of(placement: &Placement) -> Vec<ShardOnNode> {
    placement
        .shards
        .iter()
        .map(|s| ShardOnNode {
            node_id: s.node_id.clone(),
            shard_id: s.shard_id.clone(),
        })
        .collect()
}

/// The starts of a new placement's shards, rank 0 first; empty when its
/// model or profile is not in `state`'s catalog.
pub fn starts_of(state: &State, placement: &Placement) -> Vec<Start> {
    let mut shards: Vec<&ShardPlacement> = placement.shards.iter().collect();
    shards.sort_by_key(|s| s.rank);
    shards
        .into_iter()
        .filter_map(|s| registration::start(state, placement, s))
        .collect()
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub actions: Vec<Action>,
    /// Models that want a replica and fit nowhere, with why.
    pub unplaced: Vec<Explanation>,
    /// Models that want a replica and are held back after failures.
    pub backing_off: Vec<Backoff>,
}

/// A model not placed in this pass because its replicas failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    pub model: String,
    /// No placement before this time; `None` when a replica failed in this
    /// very pass and the log has not recorded its failure's time yet (the
    /// next pass knows).
    pub until: Option<UnixMillis>,
}

/// How many replicas a model should have now: its floor (`scaling.min`,
/// or one while an on-demand model is asked for), or what load has grown
/// it to, never above `scaling.max`.
pub fn desired(model: &Model, rt: &Runtime, settings: &Settings) -> u32 {
    floor(model, rt, settings)
        .max(rt.grown.get(&model.name).copied().unwrap_or(0))
        .min(model.scaling.max)
}

fn floor(model: &Model, rt: &Runtime, settings: &Settings) -> u32 {
    if model.profiles.is_empty() {
        return 0;
    }
    let asked = rt
        .demand
        .get(&model.name)
        .is_some_and(|at| rt.now - *at < idle_ms(model, settings));
    model
        .scaling
        .min
        .max(u32::from(asked))
        .min(model.scaling.max)
}

/// A model changed to start on demand (its `min` lowered to 0) while its
/// replicas ran counts as asked for at the change: kept for its idle time
/// from then, as the change's reason says, not drained at once as "not
/// asked for within its idle time" (it was never asked for: requests to a
/// model with a floor are not asks). Each change (`made_on_demand`, from
/// the clocks) is taken once (`taken` remembers them): an ask the
/// reconciler drops later (an eviction) is not brought back by it.
pub fn asked_at_change(
    state: &State,
    made_on_demand: &BTreeMap<String, UnixMillis>,
    taken: &mut BTreeMap<String, UnixMillis>,
    demand: &mut BTreeMap<String, UnixMillis>,
) {
    for (name, at) in made_on_demand {
        if taken.get(name) == Some(at) {
            continue;
        }
        taken.insert(name.clone(), *at);
        let runs =
            (state.replicas.replicas.values()).any(|r| r.is_live() && r.placement.model == *name);
        if runs && demand.get(name).is_none_or(|asked| asked < at) {
            demand.insert(name.clone(), *at);
        }
    }
}

fn idle_ms(model: &Model, settings: &Settings) -> Millis {
    model
        .scaling
        .idle_timeout_s
        .map_or(settings.default_idle_ms, |s| Millis::from(s) * 1000)
}

/// A model's replicas that serve or start and stay: not on a draining
/// node nor running an edited profile (those are being replaced, and
/// their replacements are counted instead).
fn staying<'a>(state: &'a State, model: &'a Model) -> impl Iterator<Item = &'a Replica> {
    state
        .replicas
        .replicas
        .values()
        .filter(|r| r.placement.model == model.name)
        .filter(|r| matches!(r.status, ReplicaStatus::Starting | ReplicaStatus::Ready))
        .filter(move |r| {
            on_draining_node(state, r).is_none()
                && model.profiles.iter().any(|p| {
                    p.name == r.placement.profile && model.profile_fp(p) == r.placement.profile_fp
                })
        })
}

/// What load asks of each model with room above its floor: one replica
/// more while its engines are full and every replica it has is serving
/// (one at a time: a replica still starting is waited for), the same while
/// the model was in use (full or serving anything) within its idle time,
/// and nothing after (its extra replicas are then drained, newest first).
/// A load that goes on below full keeps them: shrinking at "not full"
/// would drain a replica the load still needs and grow it back, over and
/// over. `rt.busy` must already hold this pass's use.
pub fn grown(state: &State, rt: &Runtime, settings: &Settings) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for model in state.catalog.models.values() {
        let floor = floor(model, rt, settings);
        if model.scaling.max <= floor.max(1) && !rt.grown.contains_key(&model.name) {
            continue;
        }
        let before = rt.grown.get(&model.name).copied().unwrap_or(0);
        let live: Vec<&Replica> = staying(state, model).collect();
        let serving = live.iter().all(|r| r.status == ReplicaStatus::Ready);
        let count = live.len() as u32;
        let quiet = rt
            .busy
            .get(&model.name)
            .is_none_or(|at| rt.now - *at >= idle_ms(model, settings));
        if quiet {
            // A replica asked for and still starting is waited for: its
            // empty engine reads as room, which is no sign of quiet.
            if !serving && before > 0 {
                out.insert(model.name.clone(), before);
            }
            continue;
        }
        // Growth only: the floor is desired's own (kept here, an on-demand
        // model evicted for another would be placed again at once, and a
        // lowered min would not take).
        let target = if rt.full.contains(&model.name)
            && serving
            && count >= floor.max(before)
            && count > 0
        {
            (count + 1).min(model.scaling.max)
        } else {
            before
        };
        if target > 0 {
            out.insert(model.name.clone(), target);
        }
    }
    out
}

/// What a new leader takes over of load's growth: each model with room
/// above its floor that runs more replicas than its floor keeps them (its
/// idle time counted from now), rather than having them drained at its
/// first pass while the load that grew them goes on.
pub fn adopted(state: &State, rt: &Runtime, settings: &Settings) -> BTreeMap<String, u32> {
    state
        .catalog
        .models
        .values()
        .filter_map(|model| {
            let floor = floor(model, rt, settings);
            let count = staying(state, model).count() as u32;
            // Above one too: an on-demand model's single replica is the
            // demand's to keep, not load's.
            (model.scaling.max > floor.max(1) && count > floor.max(1))
                .then(|| (model.name.clone(), count.min(model.scaling.max)))
        })
        .collect()
}

/// The jittered exponential backoff after `failures` failures in a row:
/// `base · 2^(failures-1)`, capped at `max`, times a factor in [0.8, 1.2)
/// from `unit` (a random number in [0, 1) the caller draws), so that models
/// failing together do not retry together.
pub fn backoff(failures: u32, base_ms: Millis, max_ms: Millis, unit: f64) -> Millis {
    let exp = failures.saturating_sub(1).min(30);
    let raw = base_ms.saturating_mul(1 << exp).min(max_ms);
    let factor = 0.8 + 0.4 * unit.clamp(0.0, 1.0);
    ((raw as f64 * factor) as Millis).min(max_ms)
}

/// Why a replica's node is gone: lost, or removed by an operator (no
/// longer in the log's nodes at all).
fn on_lost_node(state: &State, r: &Replica) -> Option<String> {
    r.placement
        .shards
        .iter()
        .find_map(|s| match state.nodes.nodes.get(&s.node_id) {
            None => Some(format!("node {} was removed", s.node_id)),
            Some(n) if n.reachability == Reachability::Lost => {
                Some(format!("node {} is lost", n.id))
            }
            Some(_) => None,
        })
}

/// Why a replica beyond what its model wants now is drained, `placed`
/// being how many it has.
fn scale_down_why(model: &Model, want: u32, placed: usize) -> String {
    if want == 0 && model.profiles.is_empty() {
        "its model has no profile left to run".to_owned()
    } else if want == 0 {
        "not asked for within its idle time".to_owned()
    } else {
        format!("{want} replicas wanted now, {placed} placed")
    }
}

/// The lost node (known still, not removed) a replica has a shard on.
fn on_lost_node_kept(state: &State, r: &Replica) -> Option<NodeId> {
    r.placement.shards.iter().find_map(|s| {
        state
            .nodes
            .nodes
            .get(&s.node_id)
            .filter(|n| n.reachability == Reachability::Lost)
            .map(|n| n.id.clone())
    })
}

fn on_draining_node(state: &State, r: &Replica) -> Option<NodeId> {
    r.placement.shards.iter().find_map(|s| {
        state
            .nodes
            .nodes
            .get(&s.node_id)
            .filter(|n| n.draining)
            .map(|n| n.id.clone())
    })
}

/// The replica to evict so that `model`, asked for now, can be placed: one
/// whose removal lets the placement succeed and that passes every guard
/// (each is a way to lose work quietly): `model` itself is on demand and
/// wanted because it was asked for; the victim is ready, of another on-demand model, on one
/// node, was placed (not adopted: its age would be unknown) at least
/// `min_lifetime_ms` ago, has been asked for since it was placed (unknown
/// use is not idle) but not for `evict_idle_ms`. The longest idle goes
/// first. None while any replica drains: one eviction at a time, so that
/// a second victim is not taken while the first one's GPUs are freed.
fn evictable<'a>(
    state: &State,
    nodes: &Nodes,
    replicas: &'a crate::replicas::Replicas,
    rt: &Runtime,
    settings: &Settings,
    model: &Model,
    new_id: &ReplicaId,
) -> Option<&'a Replica> {
    // Wanted because it was asked for (not for its minimum): the request
    // may still be waiting, however long ago it was made.
    if !model.on_demand() || !rt.demand.contains_key(&model.name) {
        return None;
    }
    if replicas
        .replicas
        .values()
        .any(|r| r.status == ReplicaStatus::Draining)
    {
        return None;
    }
    let mut candidates: Vec<(UnixMillis, &Replica)> = replicas
        .replicas
        .values()
        .filter(|r| r.status == ReplicaStatus::Ready && r.placement.model != model.name)
        .filter(|r| {
            state
                .catalog
                .models
                .get(&r.placement.model)
                .is_some_and(Model::on_demand)
        })
        .filter(|r| {
            let first = r.placement.shards.first().map(|s| &s.node_id);
            r.placement.shards.iter().all(|s| Some(&s.node_id) == first)
        })
        .filter_map(|r| {
            let placed = *rt.placed_at.get(r.placement.replica_id.as_str())?;
            let used = *rt.demand.get(&r.placement.model)?;
            (rt.now - placed >= settings.min_lifetime_ms
                && used >= placed
                && rt.now - used >= settings.evict_idle_ms)
                .then_some((used, r))
        })
        .collect();
    candidates.sort_by_key(|(used, r)| (*used, r.placement.replica_id.clone()));
    candidates.into_iter().find_map(|(_, victim)| {
        let mut without = replicas.clone();
        without.replicas.remove(&victim.placement.replica_id);
        placement::place_quiet(model, nodes, &without, &rt.held, new_id, settings.place)
            .map(|_| victim)
    })
}

/// One pass. `new_id` names a replica if one is placed.
pub fn plan(
    state: &State,
    rt: &Runtime,
    settings: &Settings,
    mut new_id: impl FnMut(&Model) -> ReplicaId,
) -> Plan {
    let mut plan = Plan::default();
    let mut touched: BTreeSet<ReplicaId> = BTreeSet::new();
    // A model whose replica failed waits out its backoff before a rebuild,
    // starting with this pass.
    let mut failing: BTreeSet<String> = BTreeSet::new();
    for r in state.replicas.replicas.values().filter(|r| r.is_live()) {
        let id = &r.placement.replica_id;
        let profile = state
            .catalog
            .models
            .get(&r.placement.model)
            .and_then(|m| m.profiles.iter().find(|p| p.name == r.placement.profile));
        // A model removed: a serving replica is drained (its requests in
        // flight finish, within drain_grace), one not serving yet stops;
        // a draining one goes on draining, below. A profile removed from a
        // model that stays is replaced first, like an edited one (below).
        if profile.is_none()
            && !state.catalog.models.contains_key(&r.placement.model)
            && r.status != ReplicaStatus::Draining
        {
            if r.status == ReplicaStatus::Ready {
                plan.actions.push(Action::Drain {
                    replica_id: id.clone(),
                    shards: shards_of(&r.placement),
                    why: "its model left the catalog".into(),
                });
            } else {
                plan.actions.push(Action::Stop {
                    replica_id: id.clone(),
                    reason: "its model left the catalog".into(),
                    failed: false,
                    shards: shards_of(&r.placement),
                });
            }
            touched.insert(id.clone());
            continue;
        }
        match r.status {
            ReplicaStatus::Failed => {
                failing.insert(r.placement.model.clone());
                plan.actions.push(Action::Stop {
                    replica_id: id.clone(),
                    reason: "failed; it is rebuilt".into(),
                    failed: true,
                    shards: shards_of(&r.placement),
                });
                touched.insert(id.clone());
            }
            ReplicaStatus::Draining => {
                let since = rt
                    .drain_since
                    .replicas
                    .get(id.as_str())
                    .copied()
                    .unwrap_or(rt.now);
                let reason = if rt.idle.contains(id) {
                    Some("drained; nothing was left running on it")
                } else if rt.now - since >= settings.drain_grace_ms {
                    Some("drained; its grace ran out")
                } else {
                    None
                };
                if let Some(reason) = reason {
                    plan.actions.push(Action::Stop {
                        replica_id: id.clone(),
                        reason: reason.into(),
                        failed: false,
                        shards: shards_of(&r.placement),
                    });
                    touched.insert(id.clone());
                }
            }
            ReplicaStatus::Starting | ReplicaStatus::Ready => {
                // A serving replica on a lost node goes on serving until
                // its replacement does (below, as on a draining node): its
                // engines may well be fine, only its agent is silent, and
                // an engine loads for minutes. One not serving yet, or on a
                // node removed, has nothing to keep.
                let keeps_serving =
                    r.status == ReplicaStatus::Ready && on_lost_node_kept(state, r).is_some();
                if let Some(reason) = on_lost_node(state, r)
                    && !keeps_serving
                {
                    plan.actions.push(Action::Fail {
                        replica_id: id.clone(),
                        reason,
                    });
                    touched.insert(id.clone());
                }
            }
            ReplicaStatus::Stopped => {}
        }
    }

    // Replicas as this pass leaves them: a placement takes resources the
    // next model's placement must see.
    let mut placed_now: Option<crate::replicas::Replicas> = None;
    let nodes = placeable(state, rt);
    for model in state.catalog.models.values() {
        let want = desired(model, rt, settings);
        let live: Vec<&Replica> = state
            .replicas
            .replicas
            .values()
            .filter(|r| r.placement.model == model.name)
            .filter(|r| matches!(r.status, ReplicaStatus::Starting | ReplicaStatus::Ready))
            .filter(|r| !touched.contains(&r.placement.replica_id))
            .collect();
        let draining_any = state
            .replicas
            .replicas
            .values()
            .any(|r| r.placement.model == model.name && r.status == ReplicaStatus::Draining);
        let current_fp = |r: &Replica| {
            model
                .profiles
                .iter()
                .find(|p| p.name == r.placement.profile)
                .is_some_and(|p| model.profile_fp(p) == r.placement.profile_fp)
        };
        // Replicas to move: on a draining or lost node, or running an
        // edited profile.
        let (moving, keep): (Vec<&Replica>, Vec<&Replica>) = live.iter().partition(|r| {
            on_draining_node(state, r).is_some()
                || on_lost_node_kept(state, r).is_some()
                || !current_fp(r)
        });
        let backing_off = failing.contains(&model.name)
            || rt.not_before.get(&model.name).is_some_and(|t| *t > rt.now);
        if (keep.len() as u32) < want && backing_off {
            plan.backing_off.push(Backoff {
                model: model.name.clone(),
                until: rt
                    .not_before
                    .get(&model.name)
                    .copied()
                    .filter(|t| *t > rt.now),
            });
        } else if (keep.len() as u32) < want {
            let id = new_id(model);
            let replicas = placed_now.as_ref().unwrap_or(&state.replicas);
            // Quiet: the per-node verdicts on a big fleet cost more than the
            // choice, and are wanted only when nothing fits.
            let placed =
                placement::place_quiet(model, &nodes, replicas, &rt.held, &id, settings.place);
            match placed {
                Some(p) => {
                    placed_now
                        .get_or_insert_with(|| state.replicas.clone())
                        .evolve(&crate::replicas::ReplicaEvent::ReplicaPlaced(p.clone()));
                    plan.actions.push(Action::Place {
                        starts: starts_of(state, &p),
                        placement: p,
                    });
                }
                None => {
                    // A node not heard from yet that would take it is
                    // waited for (its agent is back within seconds):
                    // evicting would take a replica down for nothing.
                    let awaits_node = matches!(nodes, Cow::Owned(_))
                        && placement::place_quiet(
                            model,
                            &state.nodes,
                            replicas,
                            &rt.held,
                            &id,
                            settings.place,
                        )
                        .is_some();
                    if !awaits_node
                        && let Some(victim) =
                            evictable(state, &nodes, replicas, rt, settings, model, &id)
                    {
                        plan.actions.push(Action::Evict {
                            replica_id: victim.placement.replica_id.clone(),
                            model: victim.placement.model.clone(),
                            for_model: model.name.clone(),
                            shards: shards_of(&victim.placement),
                        });
                    }
                    let why =
                        placement::place(model, &nodes, replicas, &rt.held, &id, settings.place);
                    plan.unplaced.push(with_unheard(why, state, rt));
                }
            }
        }
        if draining_any {
            continue;
        }
        let ready_keep = keep
            .iter()
            .filter(|r| r.status == ReplicaStatus::Ready)
            .count() as u32;
        // One that serves nothing goes first: it may hold the room its
        // replacement needs, and stopping it loses nothing.
        let first = moving
            .iter()
            .find(|r| r.status != ReplicaStatus::Ready)
            .or(moving.first());
        if let Some(first) = first {
            // Rolling, the replacement serving first: an original stops
            // only while what serves without it is still `want` (or it
            // serves nothing). Without room for a replacement it keeps
            // serving, and its node stays draining: a drain, or a profile
            // edited, never takes a model down (engines load for minutes;
            // a grace on the wait took single replicas down after it).
            let serving_moving = moving
                .iter()
                .filter(|r| r.status == ReplicaStatus::Ready)
                .count() as u32;
            let first_serves = u32::from(first.status == ReplicaStatus::Ready);
            if ready_keep + serving_moving - first_serves >= want || first_serves == 0 {
                // Nothing wanted (an on-demand model idle): it stops for
                // that, as it would on a node not draining, and nothing
                // replaces it; "replaced" would send the operator looking
                // for a replacement that was never placed.
                let why = if want == 0 {
                    scale_down_why(model, want, keep.len() + moving.len())
                } else if let Some(node) = on_lost_node_kept(state, first) {
                    format!("replaced: its node {node} is lost")
                } else {
                    match on_draining_node(state, first) {
                        Some(node) if current_fp(first) => {
                            format!("replaced: its node {node} drains")
                        }
                        Some(node) => {
                            format!("replaced: what it runs changed (its profile or the model's context length), and its node {node} drains")
                        }
                        None => "replaced: what it runs changed (its profile or the model's context length)".into(),
                    }
                };
                plan.actions.push(Action::Drain {
                    replica_id: first.placement.replica_id.clone(),
                    shards: shards_of(&first.placement),
                    why,
                });
            }
        } else if keep.len() as u32 > want {
            // Scale down: the newest replica that is not yet serving, else
            // the newest one (replica ids sort by creation time).
            let victim = keep
                .iter()
                .rev()
                .find(|r| r.status == ReplicaStatus::Starting)
                .or_else(|| keep.last());
            if let Some(v) = victim {
                let why = scale_down_why(model, want, keep.len());
                plan.actions.push(Action::Drain {
                    replica_id: v.placement.replica_id.clone(),
                    shards: shards_of(&v.placement),
                    why,
                });
            }
        }
    }

    for node in state.nodes.nodes.values().filter(|n| n.draining) {
        let busy = state
            .replicas
            .replicas
            .values()
            .filter(|r| r.is_live())
            .any(|r| r.placement.shards.iter().any(|s| s.node_id == node.id));
        if !busy {
            plan.actions.push(Action::FinishNodeDrain {
                node_id: node.id.clone(),
            });
        }
    }
    plan
}
