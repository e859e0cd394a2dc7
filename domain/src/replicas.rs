//! Replicas and their shards. A replica is ready only when every shard is
//! ready; one failed shard fails the whole replica, because a tensor- or
//! pipeline-parallel group cannot serve with a rank missing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Rejection;
use crate::ids::{NodeId, ReplicaId, ShardId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardState {
    Pending,
    Starting,
    /// Loading weights: separate from Starting because a 70B load
    /// legitimately takes minutes.
    Loading,
    Ready,
    Draining,
    Stopped,
    Failed,
}

/// Where one rank of a replica runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardPlacement {
    pub shard_id: ShardId,
    pub rank: u32,
    pub node_id: NodeId,
    #[serde(default)]
    pub gpu_indices: Vec<u32>,
    #[serde(default)]
    pub hcas: Vec<String>,
    pub port: u16,
    /// RAM a CPU shard holds, so placement never hands it out twice.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory_mb: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// A placement decision, with the reason it was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub replica_id: ReplicaId,
    pub model: String,
    pub profile: String,
    pub profile_fp: String,
    pub pool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<String>,
    pub shards: Vec<ShardPlacement>,
    #[serde(default)]
    pub why: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaStatus {
    Starting,
    Ready,
    Draining,
    Failed,
    Stopped,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub placement: ShardPlacement,
    pub state: ShardState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub placement: Placement,
    pub status: ReplicaStatus,
    pub shards: BTreeMap<ShardId, Shard>,
    /// Adopted after a control-plane restart rather than placed by it.
    pub adopted: bool,
    /// Why it failed or stopped (its failure first: a lost node's replica
    /// is failed, then stopped), for whoever lists it; None while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
}

impl Replica {
    /// Whether its processes may still hold GPUs and ports.
    pub fn is_live(&self) -> bool {
        !matches!(self.status, ReplicaStatus::Stopped)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ReplicaCommand {
    Place(Placement),
    /// Shards an agent reports running after a control-plane restart.
    Adopt(Placement),
    ReportShard {
        replica_id: ReplicaId,
        shard_id: ShardId,
        state: ShardState,
        error: Option<String>,
        exit_code: Option<i32>,
        log_tail: Option<String>,
    },
    /// The replica cannot serve (a shard's node is lost).
    Fail {
        replica_id: ReplicaId,
        reason: String,
    },
    Drain {
        replica_id: ReplicaId,
        /// Why, for whoever reads the log (None: not said).
        why: Option<String>,
    },
    Stop {
        replica_id: ReplicaId,
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum ReplicaEvent {
    ReplicaPlaced(Placement),
    ReplicaAdopted(Placement),
    ShardStateChanged {
        replica_id: ReplicaId,
        shard_id: ShardId,
        state: ShardState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        log_tail: Option<String>,
    },
    ReplicaReady {
        replica_id: ReplicaId,
    },
    ReplicaFailed {
        replica_id: ReplicaId,
        reason: String,
    },
    ReplicaDraining {
        replica_id: ReplicaId,
        /// Why (an eviction, idle, a scale-down, a roll, the model
        /// removed); absent in events from before it was kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        why: Option<String>,
    },
    ReplicaStopped {
        replica_id: ReplicaId,
        reason: String,
    },
}

impl ReplicaEvent {
    pub fn replica_id(&self) -> &ReplicaId {
        match self {
            ReplicaEvent::ReplicaPlaced(p) | ReplicaEvent::ReplicaAdopted(p) => &p.replica_id,
            ReplicaEvent::ShardStateChanged { replica_id, .. }
            | ReplicaEvent::ReplicaReady { replica_id }
            | ReplicaEvent::ReplicaFailed { replica_id, .. }
            | ReplicaEvent::ReplicaDraining { replica_id, .. }
            | ReplicaEvent::ReplicaStopped { replica_id, .. } => replica_id,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replicas {
    pub replicas: BTreeMap<ReplicaId, Replica>,
}

/// The longest log tail kept in an event: enough to see why a process died.
pub const MAX_LOG_TAIL: usize = 8 * 1024;

impl Replicas {
    pub fn decide(&self, command: ReplicaCommand) -> Result<Vec<ReplicaEvent>, Rejection> {
        use ReplicaCommand as C;
        use ReplicaEvent as E;
        let known = |id: &str| {
            self.replicas
                .get(id)
                .ok_or_else(|| Rejection::not_found(format!("no replica {id}")))
        };
        Ok(match command {
            C::Place(p) | C::Adopt(p) if self.replicas.contains_key(&p.replica_id) => {
                return Err(Rejection::conflict(format!(
                    "replica id {} is already in use; ids are never reused",
                    p.replica_id
                )));
            }
            C::Place(p) => {
                self.check_placement(&p)?;
                vec![E::ReplicaPlaced(p)]
            }
            C::Adopt(p) => {
                self.check_placement(&p)?;
                vec![E::ReplicaAdopted(p)]
            }
            C::ReportShard {
                replica_id,
                shard_id,
                state,
                error,
                exit_code,
                log_tail,
            } => {
                let replica = known(&replica_id)?;
                let Some(shard) = replica.shards.get(&shard_id) else {
                    return Err(Rejection::not_found(format!(
                        "replica {replica_id} has no shard {shard_id}"
                    )));
                };
                if shard.state == state && shard.error == error {
                    return Ok(vec![]);
                }
                if replica.status == ReplicaStatus::Stopped {
                    // A late report from a replica already torn down.
                    return Ok(vec![]);
                }
                let log_tail = log_tail.map(|t| tail(&t, MAX_LOG_TAIL));
                let mut events = vec![E::ShardStateChanged {
                    replica_id: replica_id.clone(),
                    shard_id: shard_id.clone(),
                    state,
                    error: error.clone(),
                    exit_code,
                    log_tail,
                }];
                let all_ready = replica.shards.iter().all(|(id, s)| {
                    if *id == shard_id {
                        state == ShardState::Ready
                    } else {
                        s.state == ShardState::Ready
                    }
                });
                match replica.status {
                    ReplicaStatus::Starting if all_ready => {
                        events.push(E::ReplicaReady { replica_id });
                    }
                    ReplicaStatus::Starting | ReplicaStatus::Ready | ReplicaStatus::Draining
                        if state == ShardState::Failed =>
                    {
                        let why = error.unwrap_or_else(|| "exited".into());
                        events.push(E::ReplicaFailed {
                            replica_id,
                            reason: format!("shard {shard_id} failed: {why}"),
                        });
                    }
                    _ => {}
                }
                events
            }
            C::Fail { replica_id, reason } => match known(&replica_id)?.status {
                ReplicaStatus::Starting | ReplicaStatus::Ready | ReplicaStatus::Draining => {
                    vec![E::ReplicaFailed { replica_id, reason }]
                }
                _ => vec![],
            },
            C::Drain { replica_id, why } => match known(&replica_id)?.status {
                ReplicaStatus::Starting | ReplicaStatus::Ready => {
                    vec![E::ReplicaDraining { replica_id, why }]
                }
                _ => vec![],
            },
            C::Stop { replica_id, reason } => match known(&replica_id)?.status {
                ReplicaStatus::Stopped => vec![],
                _ => vec![E::ReplicaStopped { replica_id, reason }],
            },
        })
    }

    fn check_placement(&self, p: &Placement) -> Result<(), Rejection> {
        if p.shards.is_empty() {
            return Err(Rejection::invalid(format!(
                "replica {} has no shards",
                p.replica_id
            )));
        }
        let mut ranks: Vec<u32> = p.shards.iter().map(|s| s.rank).collect();
        ranks.sort_unstable();
        if ranks != (0..p.shards.len() as u32).collect::<Vec<_>>() {
            return Err(Rejection::invalid(format!(
                "replica {}: shard ranks must be 0..{}",
                p.replica_id,
                p.shards.len()
            )));
        }
        // No GPU or port handed out twice among live replicas.
        for other in self.replicas.values().filter(|r| r.is_live()) {
            for mine in &p.shards {
                for theirs in &other.placement.shards {
                    if mine.node_id != theirs.node_id {
                        continue;
                    }
                    if mine.port == theirs.port {
                        return Err(Rejection::conflict(format!(
                            "port {} on {} is held by replica {}",
                            mine.port, mine.node_id, other.placement.replica_id
                        )));
                    }
                    if let Some(g) = mine
                        .gpu_indices
                        .iter()
                        .find(|g| theirs.gpu_indices.contains(g))
                    {
                        return Err(Rejection::conflict(format!(
                            "GPU {g} on {} is held by replica {}",
                            mine.node_id, other.placement.replica_id
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn evolve(&mut self, event: &ReplicaEvent) {
        use ReplicaEvent as E;
        match event {
            E::ReplicaPlaced(p) | E::ReplicaAdopted(p) => {
                let shards = p
                    .shards
                    .iter()
                    .map(|s| {
                        (
                            s.shard_id.clone(),
                            Shard {
                                placement: s.clone(),
                                state: ShardState::Pending,
                                error: None,
                            },
                        )
                    })
                    .collect();
                self.replicas.insert(
                    p.replica_id.clone(),
                    Replica {
                        placement: p.clone(),
                        status: ReplicaStatus::Starting,
                        shards,
                        adopted: matches!(event, E::ReplicaAdopted(_)),
                        ended: None,
                    },
                );
            }
            E::ShardStateChanged {
                replica_id,
                shard_id,
                state,
                error,
                ..
            } => {
                if let Some(s) = self
                    .replicas
                    .get_mut(replica_id)
                    .and_then(|r| r.shards.get_mut(shard_id))
                {
                    s.state = *state;
                    s.error = error.clone();
                }
            }
            E::ReplicaReady { replica_id } => self.set(replica_id, ReplicaStatus::Ready),
            E::ReplicaFailed { replica_id, reason } => {
                self.set(replica_id, ReplicaStatus::Failed);
                self.ended(replica_id, reason);
            }
            E::ReplicaDraining { replica_id, .. } => self.set(replica_id, ReplicaStatus::Draining),
            E::ReplicaStopped { replica_id, reason } => {
                self.set(replica_id, ReplicaStatus::Stopped);
                self.ended(replica_id, reason);
            }
        }
    }

    /// Keeps the first reason it ended for.
    fn ended(&mut self, replica_id: &ReplicaId, reason: &str) {
        if let Some(r) = self.replicas.get_mut(replica_id)
            && r.ended.is_none()
        {
            r.ended = Some(reason.to_owned());
        }
    }

    fn set(&mut self, replica_id: &ReplicaId, status: ReplicaStatus) {
        if let Some(r) = self.replicas.get_mut(replica_id) {
            r.status = status;
        }
    }
}

/// The last `max` bytes of `s`, cut at a character boundary.
fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_owned()
}
