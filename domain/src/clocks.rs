//! The reconciler's clocks, read from the log: when each drain began, and
//! each model's failures in a row and when the last one happened. They are
//! derived from events and the times the log recorded them, so every
//! server that reads the log derives the same clocks, and a new leader
//! continues its predecessor's backoffs and drain grace periods instead of
//! restarting them.

use std::collections::BTreeMap;

use crate::catalog::CatalogEvent;
use crate::event::Event;
use crate::ids::{NodeId, ReplicaId};
use crate::nodes::NodeEvent;
use crate::reconcile::backoff;
use crate::replicas::ReplicaEvent;
use crate::{Millis, State, UnixMillis};

/// When each drain began: a replica's and a node's apart, since a node's
/// name and a replica's id are different things even where they are the
/// same string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drains {
    pub replicas: BTreeMap<ReplicaId, UnixMillis>,
    pub nodes: BTreeMap<NodeId, UnixMillis>,
}

impl Drains {
    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty() && self.nodes.is_empty()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Clocks {
    pub drain_since: Drains,
    /// Model → its replicas' failures since it last had one ready for
    /// [`STEADY_MS`], and when the last failure was recorded.
    pub failures: BTreeMap<String, (u32, UnixMillis)>,
    /// Model → when a replica of it last became ready.
    ready_at: BTreeMap<String, UnixMillis>,
    /// Live replica → when it was placed (adopted ones are not here: their
    /// age is unknown, and unknown is never old enough to evict).
    pub placed_at: BTreeMap<ReplicaId, UnixMillis>,
    /// Model → when a change lowered its floor (`scaling.min`) to 0: it
    /// starts on demand from then. Gone once its floor is raised again.
    pub made_on_demand: BTreeMap<String, UnixMillis>,
    /// Model → its floor as the catalog last said it (to tell the change
    /// that lowers it to 0).
    floors: BTreeMap<String, u32>,
}

impl Clocks {
    /// Whether events of this type move a clock: the others need not even
    /// be decoded for it.
    pub fn cares(event_type: &str) -> bool {
        matches!(
            event_type,
            "ReplicaPlaced"
                | "ModelAdded"
                | "ModelUpdated"
                | "ModelRemoved"
                | "ReplicaDraining"
                | "ReplicaStopped"
                | "ReplicaFailed"
                | "ReplicaReady"
                | "NodeDrainRequested"
                | "NodeDrained"
                | "NodeUncordoned"
                | "NodeRemoved"
        )
    }

    /// Notes `event`, which the log recorded at `at`. `state` knows the
    /// replica's model (replicas are never forgotten, so the state before
    /// or after the event will do).
    pub fn observe(&mut self, state: &State, event: &Event, at: UnixMillis) {
        let model = |id: &str| {
            state
                .replicas
                .replicas
                .get(id)
                .map(|r| r.placement.model.clone())
        };
        match event {
            Event::Replica(ReplicaEvent::ReplicaDraining { replica_id, .. }) => {
                self.drain_since
                    .replicas
                    .entry(replica_id.clone())
                    .or_insert(at);
            }
            Event::Replica(ReplicaEvent::ReplicaPlaced(p)) => {
                self.placed_at.insert(p.replica_id.clone(), at);
            }
            Event::Catalog(
                CatalogEvent::ModelAdded { model } | CatalogEvent::ModelUpdated { model },
            ) => {
                let min = model.scaling.min;
                let before = self.floors.insert(model.name.clone(), min);
                if min > 0 {
                    self.made_on_demand.remove(&model.name);
                } else if before.is_some_and(|b| b > 0) {
                    self.made_on_demand.insert(model.name.clone(), at);
                }
            }
            Event::Catalog(CatalogEvent::ModelRemoved { name }) => {
                self.floors.remove(name);
                self.made_on_demand.remove(name);
            }
            Event::Replica(ReplicaEvent::ReplicaStopped { replica_id, .. }) => {
                self.drain_since.replicas.remove(replica_id.as_str());
                self.placed_at.remove(replica_id.as_str());
            }
            Event::Replica(ReplicaEvent::ReplicaFailed { replica_id, reason }) => {
                if let Some(m) = model(replica_id)
                    && !not_the_models_fault(reason)
                {
                    // Ready a while since its last failure, it is a new
                    // run of failures; ready only a moment (an engine that
                    // dies seconds after it loads), the same run goes on,
                    // and its backoff grows instead of restarting each time.
                    // (Ready since the last failure, that is: another
                    // replica ready long ago does not end the run.)
                    let (n, last) = match (self.failures.get(&m), self.ready_at.get(&m)) {
                        (Some((_, last)), Some(ready))
                            if ready >= last && at - *ready >= STEADY_MS =>
                        {
                            (0, None)
                        }
                        (Some((n, last)), _) => (*n, Some(*last)),
                        (None, _) => (0, None),
                    };
                    // Several replicas failing at once (a machine, a
                    // shared cause) are one failure, not a run of them.
                    let n = match last {
                        Some(last) if at - last < SAME_INCIDENT_MS => n,
                        _ => n + 1,
                    };
                    self.failures.insert(m, (n, at));
                }
            }
            Event::Replica(ReplicaEvent::ReplicaReady { replica_id }) => {
                if let Some(m) = model(replica_id) {
                    self.ready_at.insert(m, at);
                }
            }
            Event::Node(NodeEvent::NodeDrainRequested { node_id, .. }) => {
                self.drain_since.nodes.entry(node_id.clone()).or_insert(at);
            }
            Event::Node(
                NodeEvent::NodeDrained { node_id }
                | NodeEvent::NodeUncordoned { node_id, .. }
                | NodeEvent::NodeRemoved { node_id, .. },
            ) => {
                self.drain_since.nodes.remove(node_id.as_str());
            }
            _ => {}
        }
    }

    /// When `model` may be placed again: its last failure plus the backoff
    /// for that many failures in a row (jittered by the model and the
    /// count, so that every server computes the same time and models that
    /// fail together do not retry together). None when it has not failed
    /// since it last served.
    pub fn not_before(&self, model: &str, base_ms: Millis, max_ms: Millis) -> Option<UnixMillis> {
        let (n, at) = self.failures.get(model)?;
        // Ready since its last failure: nothing holds it back now (the
        // count is kept for a failure that follows soon).
        if self.ready_at.get(model).is_some_and(|ready| ready >= at) {
            return None;
        }
        Some(*at + backoff(*n, base_ms, max_ms, unit(model, *n)))
    }

    /// Every model's backoff as [`Clocks::not_before`] gives it.
    pub fn backoffs(&self, base_ms: Millis, max_ms: Millis) -> BTreeMap<String, UnixMillis> {
        self.failures
            .keys()
            .filter_map(|m| Some((m.clone(), self.not_before(m, base_ms, max_ms)?)))
            .collect()
    }
}

/// How long a model's replica must have been ready for its next failure
/// to start a new run of failures (backoff from the base again) rather
/// than go on with the last run's.
pub const STEADY_MS: Millis = 60_000;

/// Failures of one model's replicas this close together are one incident:
/// a machine, or one cause, taking several down at once counted as
/// several failures in a row (a backoff of 23 s for two engines killed
/// together, 39 s for three).
pub const SAME_INCIDENT_MS: Millis = 500;

/// A failure that says nothing of the model, which waits out no backoff
/// for it: its node was lost or removed (its engines may well be fine),
/// or the port it was given was taken by another program (the agent says
/// "port N is not free on this node", agent/src/session/shards.rs, and
/// the port is held out of placement there), so a new placement goes
/// elsewhere at once.
fn not_the_models_fault(reason: &str) -> bool {
    let node_gone = reason.starts_with("node ")
        && (reason.ends_with(" is lost") || reason.ends_with(" was removed"));
    node_gone || reason.contains("is not free on this node")
}

/// A number in [0, 1) that depends only on `model` and `failures`
/// (FNV-1a), standing in for a random draw every server must agree on.
fn unit(model: &str, failures: u32) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in model.bytes().chain(failures.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicas::{Placement, ShardPlacement};

    fn placed(state: &mut State, id: &str, model: &str) {
        let p = Placement {
            replica_id: id.into(),
            model: model.into(),
            profile: "sim".into(),
            profile_fp: String::new(),
            pool: "cpu".into(),
            fabric: None,
            shards: vec![ShardPlacement {
                shard_id: format!("{id}-0").into(),
                rank: 0,
                node_id: "n1".into(),
                gpu_indices: vec![],
                hcas: vec![],
                port: 20000,
                memory_mb: 0,
            }],
            why: String::new(),
        };
        state
            .replicas
            .evolve(&ReplicaEvent::ReplicaPlaced(p.clone()));
    }

    fn failed(id: &str) -> Event {
        Event::Replica(ReplicaEvent::ReplicaFailed {
            replica_id: id.into(),
            reason: "exited".into(),
        })
    }

    #[test]
    fn failures_in_a_row_back_off_from_the_last_and_a_ready_replica_forgives() {
        let mut state = State::default();
        let mut c = Clocks::default();
        for (i, id) in ["r1", "r2", "r3"].iter().enumerate() {
            placed(&mut state, id, "chat");
            c.observe(&state, &failed(id), UnixMillis(1_000 * (i as Millis + 1)));
        }
        assert_eq!(c.failures["chat"], (3, UnixMillis(3_000)));
        let t = c.not_before("chat", 100, 10_000).unwrap();
        // 100 · 2² = 400 ms, jittered into [320, 480).
        assert!((3_320..3_480).contains(&t.0), "{t}");
        assert_eq!(
            c.not_before("chat", 100, 10_000),
            Some(t),
            "the same every time"
        );
        // Another server reading the same log computes the same time.
        let mut again = Clocks::default();
        for (i, id) in ["r1", "r2", "r3"].iter().enumerate() {
            again.observe(&state, &failed(id), UnixMillis(1_000 * (i as Millis + 1)));
        }
        assert_eq!(again.not_before("chat", 100, 10_000), Some(t));
        placed(&mut state, "r4", "chat");
        c.observe(
            &state,
            &Event::Replica(ReplicaEvent::ReplicaReady {
                replica_id: "r4".into(),
            }),
            UnixMillis(5_000),
        );
        assert_eq!(c.not_before("chat", 100, 10_000), None);
        assert!(c.backoffs(100, 10_000).is_empty());
        // Dying seconds after it became ready goes on with the run (an
        // engine that crashes once loaded was retried every few seconds
        // for ever); a failure after a steady minute starts a new one.
        placed(&mut state, "r5", "chat");
        c.observe(&state, &failed("r4"), UnixMillis(7_000));
        assert_eq!(c.failures["chat"], (4, UnixMillis(7_000)));
        assert!(c.not_before("chat", 100, 10_000).is_some());
        c.observe(
            &state,
            &Event::Replica(ReplicaEvent::ReplicaReady {
                replica_id: "r5".into(),
            }),
            UnixMillis(8_000),
        );
        c.observe(&state, &failed("r5"), UnixMillis(8_000 + STEADY_MS));
        assert_eq!(c.failures["chat"], (1, UnixMillis(8_000 + STEADY_MS)));
        // A replica ready long ago does not end the run of another that
        // keeps failing: only a ready after the last failure does.
        placed(&mut state, "r6", "chat");
        c.observe(&state, &failed("r6"), UnixMillis(200_000));
        assert_eq!(c.failures["chat"], (2, UnixMillis(200_000)));
    }

    /// A lost node or a taken port is not the model's failure, and
    /// replicas failing together count once.
    #[test]
    fn failures_that_are_not_the_models_or_come_together_count_once_or_not_at_all() {
        let mut state = State::default();
        let mut c = Clocks::default();
        let with = |id: &str, reason: &str| {
            Event::Replica(ReplicaEvent::ReplicaFailed {
                replica_id: id.into(),
                reason: reason.into(),
            })
        };
        for id in ["r1", "r2", "r3", "r4", "r5"] {
            placed(&mut state, id, "chat");
        }
        c.observe(&state, &with("r1", "node n1 is lost"), UnixMillis(1_000));
        c.observe(
            &state,
            &with("r2", "node n1 was removed"),
            UnixMillis(1_000),
        );
        c.observe(
            &state,
            &with(
                "r3",
                "shard r3-0 failed: port 20000 is not free on this node; something else listens there",
            ),
            UnixMillis(2_000),
        );
        assert!(c.failures.is_empty(), "{:?}", c.failures);
        assert_eq!(c.not_before("chat", 100, 10_000), None);
        // Two engines killed together: one failure.
        c.observe(&state, &failed("r4"), UnixMillis(10_000));
        c.observe(
            &state,
            &failed("r5"),
            UnixMillis(10_000 + SAME_INCIDENT_MS - 1),
        );
        assert_eq!(c.failures["chat"].0, 1);
    }

    #[test]
    fn a_drain_runs_from_its_first_record_until_it_ends() {
        let state = State::default();
        let mut c = Clocks::default();
        let drain = Event::Replica(ReplicaEvent::ReplicaDraining {
            replica_id: "r1".into(),
            why: None,
        });
        c.observe(&state, &drain, UnixMillis(1_000));
        c.observe(&state, &drain, UnixMillis(2_000));
        assert_eq!(c.drain_since.replicas["r1"], UnixMillis(1_000));
        c.observe(
            &state,
            &Event::Replica(ReplicaEvent::ReplicaStopped {
                replica_id: "r1".into(),
                reason: "drained".into(),
            }),
            UnixMillis(3_000),
        );
        assert!(!c.drain_since.replicas.contains_key("r1"));
        let node = Event::Node(NodeEvent::NodeDrainRequested {
            node_id: "n1".into(),
            by: "op".into(),
        });
        c.observe(&state, &node, UnixMillis(4_000));
        c.observe(
            &state,
            &Event::Node(NodeEvent::NodeDrained {
                node_id: "n1".into(),
            }),
            UnixMillis(5_000),
        );
        assert!(c.drain_since.is_empty());
        c.observe(&state, &node, UnixMillis(6_000));
        assert_eq!(
            c.drain_since.nodes["n1"],
            UnixMillis(6_000),
            "a new drain, a new clock"
        );
        assert!(
            c.drain_since.replicas.is_empty(),
            "a node's drain is no replica's"
        );
    }

    #[test]
    fn the_jitter_differs_between_models() {
        let a: Vec<u64> = (1..20).map(|n| (unit("a", n) * 1e6) as u64).collect();
        let b: Vec<u64> = (1..20).map(|n| (unit("b", n) * 1e6) as u64).collect();
        assert_ne!(a, b);
        assert!((1..1000).all(|n| (0.0..1.0).contains(&unit("chat", n))));
    }
}
