//! What the leader has observed of its agents and the log does not keep:
//! when each node was last heard from, processes that hold GPUs and ports
//! the log no longer counts as live, ports other programs hold, shards
//! gathered for adoption, downloads in progress, and where each node's
//! provisioned engines stand.
//!
//! Memory, not the log: a new leader starts from a fresh look (every known
//! node's clock reset when it takes office, the rest re-reported as agents
//! register). The decisions these feed are the domain's (placement leaves
//! held resources alone, and nodes not heard from in this office;
//! registration adopts from the gathered groups); this module only keeps
//! the facts, under one lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use llmgw_api::admin::ProvisionRow;
use llmgw_domain::ids::{NodeId, ReplicaId, ShardId};
use llmgw_domain::placement::Held;
use llmgw_domain::registration::Adopting;
use tokio::time::Instant;

/// How long a port another program holds is left alone on its node.
const FOREIGN_PORT_TTL: Duration = Duration::from_secs(600);

/// The observed state, one lock over plain maps: each use is a short
/// read or write, none waits on anything while holding it.
#[derive(Debug, Default)]
pub(crate) struct Observed(Mutex<Inner>);

#[derive(Debug, Default)]
struct Inner {
    last_seen: HashMap<NodeId, Instant>,
    /// Nodes heard from in this office (a registration carried out, or a
    /// heartbeat): the others' `last_seen` is the office's start, which
    /// the reachability timers count from but no page should show as a
    /// heartbeat, and what they run is not known yet (nothing new is
    /// placed there).
    heard: std::collections::HashSet<NodeId>,
    /// Processes agents reported that the log does not count as live, by
    /// node (replaced at each registration of the node).
    held: BTreeMap<NodeId, Vec<Held>>,
    /// Ports another program holds, by (node, port), until when they are
    /// left alone.
    foreign_ports: BTreeMap<(NodeId, u16), Instant>,
    /// Shards of multi-node replicas awaiting their other ranks' reports
    /// before adoption.
    adopting: Adopting,
    /// Downloads shards wait on: shard id → (bytes done, bytes total).
    fetches: BTreeMap<ShardId, (u64, u64)>,
    /// The engines each node was asked to install, as it last reported
    /// them (heartbeats carry them when they change).
    provision: BTreeMap<NodeId, Vec<ProvisionRow>>,
}

impl Observed {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new office: every known node was heard from just now (so none is
    /// marked unreachable before it has had time to reconnect).
    pub(crate) fn reset_clocks<'a>(&self, nodes: impl Iterator<Item = &'a NodeId>) {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.last_seen.clear();
        inner.heard.clear();
        for n in nodes {
            inner.last_seen.insert(n.clone(), now);
        }
    }

    pub(crate) fn seen(&self, node: &NodeId) {
        let mut inner = self.lock();
        inner.last_seen.insert(node.clone(), Instant::now());
        inner.heard.insert(node.clone());
    }

    /// Starts a node's clock without its being heard from: a node the
    /// views hold that no clock counted yet, or one whose registration is
    /// being carried out (it is heard once what it runs is known).
    pub(crate) fn start_clock(&self, node: &NodeId) {
        self.lock().last_seen.insert(node.clone(), Instant::now());
    }

    pub(crate) fn last_seen(&self, node: &NodeId) -> Option<Instant> {
        self.lock().last_seen.get(node).copied()
    }

    /// When the node was last heard from in this office; None before it
    /// has been (a new leader has not heard from it yet).
    pub(crate) fn last_heard(&self, node: &NodeId) -> Option<Instant> {
        let inner = self.lock();
        inner
            .heard
            .contains(node)
            .then(|| inner.last_seen.get(node).copied())
            .flatten()
    }

    /// Of `nodes`, those not heard from in this office: what they run is
    /// not known yet, so the reconciler places nothing new on them.
    pub(crate) fn unheard<'a>(
        &self,
        nodes: impl Iterator<Item = &'a NodeId>,
    ) -> std::collections::BTreeSet<NodeId> {
        let inner = self.lock();
        nodes
            .filter(|n| !inner.heard.contains(*n))
            .cloned()
            .collect()
    }

    /// What a node's processes hold that the log does not count, as of its
    /// last registration.
    pub(crate) fn set_held(&self, node: &NodeId, held: Vec<Held>) {
        self.lock().held.insert(node.clone(), held);
    }

    /// A shard its node says has stopped: what its process held is free
    /// (a node back from lost stops its orphans; its GPUs were held until
    /// it registered again, and a model that fits only there waited).
    pub(crate) fn released(&self, node: &NodeId, replica: &ReplicaId) {
        let mut inner = self.lock();
        if let Some(held) = inner.held.get_mut(node) {
            held.retain(|h| h.replica_id != *replica);
        }
        // A rank awaiting adoption that stopped holds nothing either.
        if let Some(group) = inner.adopting.get_mut(replica) {
            group.retain(|(n, _)| n != node);
            if group.is_empty() {
                inner.adopting.remove(replica);
            }
        }
    }

    /// Everything placement must leave alone beyond the log's replicas:
    /// processes being stopped, ranks running that await their replica's
    /// other ranks before adoption (a placement onto their GPUs or port
    /// would clash with the adoption, and the running engine would be
    /// stopped for it), and ports other programs hold (until they have
    /// been left alone for a while: they may be freed).
    pub(crate) fn held(&self) -> Vec<Held> {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.foreign_ports.retain(|_, until| *until > now);
        let mut held: Vec<_> = inner.held.values().flatten().cloned().collect();
        held.extend(inner.adopting.iter().flat_map(|(replica, ranks)| {
            ranks.iter().map(|(node, s)| Held {
                node_id: node.clone(),
                replica_id: replica.clone(),
                port: s.port,
                gpus: s.gpu_indices.clone(),
            })
        }));
        held.extend(inner.foreign_ports.keys().map(|(node, port)| Held {
            node_id: node.clone(),
            replica_id: "(another program)".into(),
            port: *port,
            gpus: Vec::new(),
        }));
        held
    }

    /// A port another program holds on a node.
    pub(crate) fn port_taken(&self, node: &NodeId, port: u16) {
        self.lock()
            .foreign_ports
            .insert((node.clone(), port), Instant::now() + FOREIGN_PORT_TTL);
    }

    /// Runs `f` on the groups awaiting adoption, which it replaces with
    /// what `f` returns beside its result; registrations of one replica's
    /// nodes may run at once, so the groups are taken and put back under
    /// the lock.
    pub(crate) fn adopting<R>(&self, f: impl FnOnce(Adopting) -> (R, Adopting)) -> R {
        let mut inner = self.lock();
        let (out, left) = f(std::mem::take(&mut inner.adopting));
        inner.adopting = left;
        out
    }

    /// Out of office: groups gathered under it are forgotten (the agents
    /// report them again to the next leader).
    pub(crate) fn forget_adoptions(&self) {
        self.lock().adopting.clear();
    }

    /// A shard's download: its progress while pending, nothing after.
    pub(crate) fn fetching(&self, shard_id: &ShardId, progress: Option<(u64, u64)>) {
        let mut inner = self.lock();
        match progress {
            Some(p) => inner.fetches.insert(shard_id.clone(), p),
            None => inner.fetches.remove(shard_id),
        };
    }

    pub(crate) fn fetch_of(&self, shard_id: &ShardId) -> Option<(u64, u64)> {
        self.lock().fetches.get(shard_id).copied()
    }

    /// Where a node's provisioned engines stand, as it reported.
    pub(crate) fn set_provision(&self, node: &NodeId, rows: Vec<ProvisionRow>) {
        self.lock().provision.insert(node.clone(), rows);
    }

    pub(crate) fn provision_of(&self, node: &NodeId) -> Vec<ProvisionRow> {
        self.lock().provision.get(node).cloned().unwrap_or_default()
    }
}
