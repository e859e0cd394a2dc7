//! Nodes, their GPUs and fabrics, what is allocated where, replicas and
//! shards, cordons and drains: what placement and the dashboard read.

use std::collections::{BTreeMap, BTreeSet};

use llmgw_domain::Event;
use llmgw_domain::catalog::Catalog;
use llmgw_domain::ids::{NodeId, ReplicaId};
use llmgw_domain::join::Joining;
use llmgw_domain::nodes::Nodes;
use llmgw_domain::replicas::Replicas;
use serde::{Deserialize, Serialize};

use crate::{Stamp, View};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The catalog, so that placement can be explained from any server.
    pub catalog: Catalog,
    pub nodes: Nodes,
    pub replicas: Replicas,
    /// Node → GPU index → the live replica holding it.
    pub allocations: BTreeMap<NodeId, BTreeMap<u32, ReplicaId>>,
    /// Fabric → the nodes attached to it.
    pub fabrics: BTreeMap<String, BTreeSet<NodeId>>,
    /// Join tokens, the certificates nodes got by joining, and the deny
    /// list of removed nodes' certificates, checked when a stream opens.
    #[serde(default, skip_serializing_if = "Joining::is_empty")]
    pub joining: Joining,
    /// How many `ModelDemanded` this view has read: a leader's reconciler
    /// passes when it moves, so a cold start asked of a standby is not
    /// left until the next interval.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub demands_read: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ClusterView {
    fn reallocate(&mut self, replica_id: &ReplicaId) {
        for gpus in self.allocations.values_mut() {
            gpus.retain(|_, r| r != replica_id);
        }
        if let Some(r) = self
            .replicas
            .replicas
            .get(replica_id)
            .filter(|r| r.is_live())
        {
            for s in &r.placement.shards {
                let gpus = self.allocations.entry(s.node_id.clone()).or_default();
                for g in &s.gpu_indices {
                    gpus.insert(*g, replica_id.clone());
                }
            }
        }
        self.allocations.retain(|_, gpus| !gpus.is_empty());
    }

    fn refabric(&mut self, node_id: &NodeId) {
        for members in self.fabrics.values_mut() {
            members.remove(node_id);
        }
        if let Some(n) = self.nodes.nodes.get(node_id) {
            for f in &n.inventory.fabrics {
                self.fabrics
                    .entry(f.fabric.clone())
                    .or_default()
                    .insert(node_id.clone());
            }
        }
        self.fabrics.retain(|_, m| !m.is_empty());
    }
}

impl View for ClusterView {
    const NAME: &'static str = "cluster";

    fn apply_event(&mut self, _stamp: Stamp, event: &Event) {
        match event {
            Event::Catalog(e) => self.catalog.evolve(e),
            Event::Node(e) => {
                self.nodes.evolve(e);
                self.joining.evolve_node(e);
                self.refabric(e.node_id());
            }
            Event::Join(e) => self.joining.evolve(e),
            Event::Replica(e) => {
                self.replicas.evolve(e);
                self.reallocate(e.replica_id());
            }
            Event::Demand(_) => self.demands_read += 1,
            _ => {}
        }
    }
}
