//! What the gateway routes by: names and aliases to canonical models, their
//! fallbacks and routing profile, and the endpoints ready to serve them.

use std::collections::BTreeMap;

use llmgw_domain::Event;
use llmgw_domain::catalog::{CatalogEvent, Engine, Model, Price};
use llmgw_domain::ids::{NodeId, ReplicaId};
use llmgw_domain::nodes::NodeEvent;
use llmgw_domain::replicas::{Placement, ReplicaEvent};
use serde::{Deserialize, Serialize};

use crate::{Stamp, View};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterModel {
    pub name: String,
    pub aliases: Vec<String>,
    pub fallbacks: Vec<String>,
    pub routing_profile: Option<String>,
    pub on_demand: bool,
    pub price: Option<Price>,
    /// The catalog's description, for `/v1/models`; empty when none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Profile name → its current fingerprint.
    pub profiles: BTreeMap<String, String>,
    /// When the catalog first added it (ms since the epoch): `/v1/models`'
    /// `created`. An update keeps it; removing and adding again resets it.
    #[serde(default)]
    pub added_ms: i64,
    /// The catalog's context length in tokens (threads are trimmed to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u32>,
}

/// A ready replica's rank 0, where requests go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub replica_id: ReplicaId,
    pub model: String,
    pub url: String,
    pub pool: String,
    pub weight: u32,
    pub priority: i32,
    pub engine: Engine,
    pub profile: String,
    pub profile_fp: String,
    /// False when the replica runs a profile that has since been edited:
    /// it still serves, and the reconciler replaces it.
    pub current: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RouterView {
    pub models: BTreeMap<String, RouterModel>,
    pub aliases: BTreeMap<String, String>,
    pub endpoints: BTreeMap<ReplicaId, Endpoint>,
    /// What endpoints are derived from.
    placements: BTreeMap<ReplicaId, Placement>,
    /// Model → profile → what an endpoint of it carries.
    profiles: BTreeMap<String, BTreeMap<String, ProfileFacts>>,
    node_addrs: BTreeMap<NodeId, String>,
    lost_nodes: std::collections::BTreeSet<NodeId>,
    ready: std::collections::BTreeSet<ReplicaId>,
    /// The engine each replica was placed with: what it runs while its
    /// profile is edited to another engine, renamed or removed (it serves
    /// until its replacement does).
    #[serde(default)]
    placed_engines: BTreeMap<ReplicaId, Engine>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ProfileFacts {
    weight: u32,
    priority: i32,
    engine: Engine,
    fingerprint: String,
}

impl RouterView {
    /// The canonical model a name or alias asks for.
    pub fn resolve(&self, name: &str) -> Option<&RouterModel> {
        self.models
            .get(name)
            .or_else(|| self.aliases.get(name).and_then(|c| self.models.get(c)))
    }

    /// Ready endpoints of a canonical model.
    pub fn endpoints_for<'a>(&'a self, model: &'a str) -> impl Iterator<Item = &'a Endpoint> + 'a {
        self.endpoints.values().filter(move |e| e.model == model)
    }

    fn set_model(&mut self, m: &Model, at_ms: i64) {
        let added_ms = self.models.get(&m.name).map_or(at_ms, |old| old.added_ms);
        self.remove_model(&m.name);
        for a in &m.aliases {
            self.aliases.insert(a.clone(), m.name.clone());
        }
        let profiles = self.profiles.entry(m.name.clone()).or_default();
        for p in &m.profiles {
            profiles.insert(
                p.name.clone(),
                ProfileFacts {
                    weight: p.weight,
                    priority: p.priority,
                    engine: p.engine,
                    fingerprint: m.profile_fp(p),
                },
            );
        }
        self.models.insert(
            m.name.clone(),
            RouterModel {
                name: m.name.clone(),
                aliases: m.aliases.clone(),
                fallbacks: m.fallbacks.clone(),
                routing_profile: m.routing_profile.clone(),
                on_demand: m.on_demand(),
                price: m.price,
                description: m.description.clone(),
                profiles: m
                    .profiles
                    .iter()
                    .map(|p| (p.name.clone(), m.profile_fp(p)))
                    .collect(),
                added_ms,
                context_length: m.context_length,
            },
        );
    }

    /// The node a placed replica's rank 0 runs on (where its endpoint
    /// answers), for labelling the endpoint's metrics.
    pub fn node_of(&self, replica_id: &ReplicaId) -> Option<&NodeId> {
        let p = self.placements.get(replica_id)?;
        p.shards.iter().find(|s| s.rank == 0).map(|s| &s.node_id)
    }

    fn remove_model(&mut self, name: &str) {
        if let Some(old) = self.models.remove(name) {
            for a in &old.aliases {
                self.aliases.remove(a);
            }
        }
        self.profiles.remove(name);
    }

    /// Rebuilds the endpoints of every ready replica: cheap, and keeps the
    /// rule for "routable" in one place.
    fn refresh(&mut self) {
        let mut endpoints = BTreeMap::new();
        for id in &self.ready {
            let Some(p) = self.placements.get(id) else {
                continue;
            };
            let Some(rank0) = p.shards.iter().find(|s| s.rank == 0) else {
                continue;
            };
            if self.lost_nodes.contains(&rank0.node_id) {
                continue;
            }
            let addr = self
                .node_addrs
                .get(&rank0.node_id)
                .cloned()
                .unwrap_or_else(|| rank0.node_id.to_string());
            let facts = self.profiles.get(&p.model).and_then(|m| m.get(&p.profile));
            let current = facts.is_some_and(|f| f.fingerprint == p.profile_fp);
            // An edited, renamed or removed profile's replica runs what it
            // was placed with (the profile's engine now may be another).
            let engine = match (facts, self.placed_engines.get(id)) {
                (Some(f), _) if current => f.engine,
                (_, Some(e)) => *e,
                (Some(f), None) => f.engine,
                (None, None) => Engine::Sim,
            };
            endpoints.insert(
                id.clone(),
                Endpoint {
                    replica_id: id.clone(),
                    model: p.model.clone(),
                    url: format!(
                        "http://{}:{}",
                        llmgw_domain::nodes::url_host(&addr),
                        rank0.port
                    ),
                    pool: p.pool.clone(),
                    weight: facts.map_or(1, |f| f.weight),
                    priority: facts.map_or(0, |f| f.priority),
                    engine,
                    profile: p.profile.clone(),
                    profile_fp: p.profile_fp.clone(),
                    current,
                },
            );
        }
        self.endpoints = endpoints;
    }
}

impl View for RouterView {
    const NAME: &'static str = "router";

    fn apply_event(&mut self, stamp: Stamp, event: &Event) {
        let touches_endpoints = match event {
            Event::Catalog(
                CatalogEvent::ModelAdded { model } | CatalogEvent::ModelUpdated { model },
            ) => {
                self.set_model(model, stamp.recorded_at_ms);
                true
            }
            Event::Catalog(CatalogEvent::ModelRemoved { name }) => {
                self.remove_model(name);
                true
            }
            Event::Node(NodeEvent::NodeRegistered { node_id, inventory })
            | Event::Node(NodeEvent::NodeInventoryChanged { node_id, inventory }) => {
                self.node_addrs
                    .insert(node_id.clone(), inventory.address().to_owned());
                // A removed node that joins again starts afresh.
                if matches!(event, Event::Node(NodeEvent::NodeRegistered { .. })) {
                    self.lost_nodes.remove(node_id);
                }
                true
            }
            // Its replicas are rebuilt elsewhere; until they stop, none is
            // routed to.
            Event::Node(NodeEvent::NodeRemoved { node_id, .. }) => {
                self.lost_nodes.insert(node_id.clone())
            }
            // A lost node's serving replicas are still routed: only its
            // agent is known to be silent, and its engines may well serve
            // (a dead machine's refuse, and the breakers and the next
            // replica or model take over). Each is drained once its
            // replacement serves, as on a draining node. (Logs from before
            // kept them out from the loss; a snapshot of then still names
            // such nodes, forgotten at their recovery.)
            Event::Node(NodeEvent::NodeRecovered { node_id }) => self.lost_nodes.remove(node_id),
            Event::Replica(ReplicaEvent::ReplicaPlaced(p) | ReplicaEvent::ReplicaAdopted(p)) => {
                let facts = self.profiles.get(&p.model).and_then(|m| m.get(&p.profile));
                if let Some(f) = facts.filter(|f| f.fingerprint == p.profile_fp) {
                    self.placed_engines.insert(p.replica_id.clone(), f.engine);
                }
                self.placements.insert(p.replica_id.clone(), p.clone());
                false
            }
            Event::Replica(ReplicaEvent::ReplicaReady { replica_id }) => {
                self.ready.insert(replica_id.clone())
            }
            Event::Replica(
                ReplicaEvent::ReplicaFailed { replica_id, .. }
                | ReplicaEvent::ReplicaDraining { replica_id, .. },
            ) => self.ready.remove(replica_id),
            Event::Replica(ReplicaEvent::ReplicaStopped { replica_id, .. }) => {
                self.placements.remove(replica_id);
                self.placed_engines.remove(replica_id);
                self.ready.remove(replica_id)
            }
            _ => false,
        };
        if touches_endpoints {
            self.refresh();
        }
    }
}
