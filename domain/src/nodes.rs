//! Nodes: registration, inventory, reachability, and the operator's cordon
//! and drain. Only real changes become events: a heartbeat or a repeated
//! registration with nothing new appends nothing, and neither ever clears a
//! cordon an operator set.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Rejection;
use crate::ids::NodeId;

/// One GPU as the agent saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    /// `h100-80g`: name and memory in GiB as the driver reports it.
    pub class: String,
    pub memory_mb: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlink_peers: Vec<u32>,
    /// Reasons to keep it out of placement (ECC errors, foreign memory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// A fabric the node is attached to, with the adapters on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricAttachment {
    pub fabric: String,
    pub hcas: Vec<String>,
    #[serde(default)]
    pub rate_gbps: u32,
}

/// What a node offers, as the scheduler sees it. Telemetry (utilisation,
/// temperatures, used memory) is deliberately absent: it changes every
/// heartbeat and lives in memory and in Prometheus, not in the log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub hostname: String,
    #[serde(default)]
    pub mgmt_addr: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    #[serde(default)]
    pub fabrics: Vec<FabricAttachment>,
    /// 0 means unknown.
    #[serde(default)]
    pub memory_total_mb: u64,
    /// Free disk for weights (GB, the node's own filesystems); None when
    /// not reported, which is unknown rather than full.
    #[serde(default)]
    pub disk_free_gb: Option<u64>,
    /// Engine name → version, for engines seen to run.
    #[serde(default)]
    pub engines: BTreeMap<String, String>,
    /// Model sources whose weights are on local disk.
    #[serde(default)]
    pub weights: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reachability {
    Ready,
    /// No heartbeat for a while: no new placement, work left in place.
    Unreachable,
    /// Gone: its work is rebuilt elsewhere.
    Lost,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub id: NodeId,
    pub inventory: Inventory,
    pub reachability: Reachability,
    pub cordoned: bool,
    pub draining: bool,
}

impl Node {
    /// Whether new work may be placed here.
    pub fn schedulable(&self) -> bool {
        self.reachability == Reachability::Ready && !self.cordoned && !self.draining
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum NodeCommand {
    /// A (re-)registration carrying the full inventory.
    Register {
        node_id: NodeId,
        inventory: Inventory,
    },
    /// The inventory as re-read while running.
    ReportInventory {
        node_id: NodeId,
        inventory: Inventory,
    },
    /// A heartbeat arrived: revives an unreachable or lost node.
    Heartbeat {
        node_id: NodeId,
    },
    MarkUnreachable {
        node_id: NodeId,
    },
    MarkLost {
        node_id: NodeId,
    },
    Cordon {
        node_id: NodeId,
        by: String,
        reason: String,
    },
    Uncordon {
        node_id: NodeId,
        by: String,
    },
    Drain {
        node_id: NodeId,
        by: String,
    },
    /// Nothing live is left on a draining node: it stays cordoned.
    FinishDrain {
        node_id: NodeId,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum NodeEvent {
    NodeRegistered {
        node_id: NodeId,
        inventory: Inventory,
    },
    NodeInventoryChanged {
        node_id: NodeId,
        inventory: Inventory,
    },
    NodeUnreachable {
        node_id: NodeId,
    },
    NodeLost {
        node_id: NodeId,
    },
    NodeRecovered {
        node_id: NodeId,
    },
    NodeCordoned {
        node_id: NodeId,
        by: String,
        reason: String,
    },
    NodeUncordoned {
        node_id: NodeId,
        by: String,
    },
    NodeDrainRequested {
        node_id: NodeId,
        by: String,
    },
    NodeDrained {
        node_id: NodeId,
    },
    /// An operator removed the node: it leaves the cluster (its replicas
    /// are rebuilt elsewhere) and its certificates are refused; the
    /// fingerprints are those it got by joining (`crate::join`).
    NodeRemoved {
        node_id: NodeId,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        certificates: Vec<String>,
    },
}

impl NodeEvent {
    pub fn node_id(&self) -> &NodeId {
        match self {
            NodeEvent::NodeRegistered { node_id, .. }
            | NodeEvent::NodeInventoryChanged { node_id, .. }
            | NodeEvent::NodeUnreachable { node_id }
            | NodeEvent::NodeLost { node_id }
            | NodeEvent::NodeRecovered { node_id }
            | NodeEvent::NodeCordoned { node_id, .. }
            | NodeEvent::NodeUncordoned { node_id, .. }
            | NodeEvent::NodeDrainRequested { node_id, .. }
            | NodeEvent::NodeDrained { node_id }
            | NodeEvent::NodeRemoved { node_id, .. } => node_id,
        }
    }
}

/// Every node the log knows of.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nodes {
    pub nodes: BTreeMap<NodeId, Node>,
}

impl Nodes {
    pub fn decide(&self, command: NodeCommand) -> Result<Vec<NodeEvent>, Rejection> {
        use NodeCommand as C;
        use NodeEvent as E;
        let known = |id: &str| {
            self.nodes
                .get(id)
                .ok_or_else(|| Rejection::not_found(format!("no node {id} has registered")))
        };
        Ok(match command {
            C::Register { node_id, inventory } => {
                // Control characters too: an id is printed to terminals
                // and logs, where an escape sequence would act.
                if node_id.is_empty()
                    || node_id.len() > 128
                    || node_id.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    return Err(Rejection::invalid(
                        "a node id must be 1 to 128 characters without spaces or control characters",
                    ));
                }
                check_inventory(&inventory)?;
                match self.nodes.get(&node_id) {
                    None => vec![E::NodeRegistered { node_id, inventory }],
                    Some(node) => {
                        let mut events = Vec::new();
                        if node.inventory != inventory {
                            events.push(E::NodeInventoryChanged {
                                node_id: node_id.clone(),
                                inventory,
                            });
                        }
                        if node.reachability != Reachability::Ready {
                            events.push(E::NodeRecovered { node_id });
                        }
                        events
                    }
                }
            }
            C::ReportInventory { node_id, inventory } => {
                check_inventory(&inventory)?;
                if known(&node_id)?.inventory == inventory {
                    vec![]
                } else {
                    vec![E::NodeInventoryChanged { node_id, inventory }]
                }
            }
            C::Heartbeat { node_id } => match known(&node_id)?.reachability {
                Reachability::Ready => vec![],
                _ => vec![E::NodeRecovered { node_id }],
            },
            C::MarkUnreachable { node_id } => match known(&node_id)?.reachability {
                Reachability::Ready => vec![E::NodeUnreachable { node_id }],
                _ => vec![],
            },
            C::MarkLost { node_id } => match known(&node_id)?.reachability {
                Reachability::Lost => vec![],
                _ => vec![E::NodeLost { node_id }],
            },
            C::Cordon {
                node_id,
                by,
                reason,
            } => {
                if known(&node_id)?.cordoned {
                    vec![]
                } else {
                    vec![E::NodeCordoned {
                        node_id,
                        by,
                        reason,
                    }]
                }
            }
            // Ends a drain too: one whose replicas have nowhere to go
            // never finishes, and the operator needs a way back.
            C::Uncordon { node_id, by } => {
                let node = known(&node_id)?;
                if node.cordoned || node.draining {
                    vec![E::NodeUncordoned { node_id, by }]
                } else {
                    vec![]
                }
            }
            C::Drain { node_id, by } => {
                let node = known(&node_id)?;
                let mut events = Vec::new();
                if !node.cordoned {
                    events.push(E::NodeCordoned {
                        node_id: node_id.clone(),
                        by: by.clone(),
                        reason: "drain".into(),
                    });
                }
                if !node.draining {
                    events.push(E::NodeDrainRequested { node_id, by });
                }
                events
            }
            C::FinishDrain { node_id } => {
                if known(&node_id)?.draining {
                    vec![E::NodeDrained { node_id }]
                } else {
                    vec![]
                }
            }
        })
    }

    pub fn evolve(&mut self, event: &NodeEvent) {
        use NodeEvent as E;
        if let E::NodeRegistered { node_id, inventory } = event {
            self.nodes.insert(
                node_id.clone(),
                Node {
                    id: node_id.clone(),
                    inventory: inventory.clone(),
                    reachability: Reachability::Ready,
                    cordoned: false,
                    draining: false,
                },
            );
            return;
        }
        if let E::NodeRemoved { node_id, .. } = event {
            self.nodes.remove(node_id);
            return;
        }
        let Some(node) = self.nodes.get_mut(event.node_id()) else {
            return;
        };
        match event {
            E::NodeRegistered { .. } | E::NodeRemoved { .. } => {}
            E::NodeInventoryChanged { inventory, .. } => node.inventory = inventory.clone(),
            E::NodeUnreachable { .. } => node.reachability = Reachability::Unreachable,
            E::NodeLost { .. } => node.reachability = Reachability::Lost,
            E::NodeRecovered { .. } => node.reachability = Reachability::Ready,
            E::NodeCordoned { .. } => node.cordoned = true,
            E::NodeUncordoned { .. } => {
                node.cordoned = false;
                node.draining = false;
            }
            E::NodeDrainRequested { .. } => node.draining = true,
            E::NodeDrained { .. } => node.draining = false,
        }
    }
}

fn check_inventory(inv: &Inventory) -> Result<(), Rejection> {
    let mut seen = std::collections::BTreeSet::new();
    for g in &inv.gpus {
        if !seen.insert(g.index) {
            return Err(Rejection::invalid(format!(
                "GPU index {} is reported twice",
                g.index
            )));
        }
    }
    let mut hcas = BTreeMap::new();
    for f in &inv.fabrics {
        for h in &f.hcas {
            if let Some(other) = hcas.insert(h.as_str(), f.fabric.as_str()) {
                return Err(Rejection::invalid(format!(
                    "adapter {h} is named under two fabrics ({other} and {})",
                    f.fabric
                )));
            }
        }
    }
    Ok(())
}

impl Inventory {
    /// Where the node's engines are reached: its management address, or
    /// its host name when it reported none.
    pub fn address(&self) -> &str {
        if self.mgmt_addr.is_empty() {
            &self.hostname
        } else {
            &self.mgmt_addr
        }
    }
}

/// A node's address as the host of a URL: an IPv6 address bracketed
/// (`http://2001:db8::5:8000` names no port), anything else as it is.
pub fn url_host(addr: &str) -> std::borrow::Cow<'_, str> {
    if addr.contains(':') && !addr.starts_with('[') {
        format!("[{addr}]").into()
    } else {
        addr.into()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_ipv6_address_is_bracketed_and_nothing_else() {
        use super::url_host;
        assert_eq!(url_host("2001:db8::5"), "[2001:db8::5]");
        assert_eq!(url_host("[::1]"), "[::1]");
        assert_eq!(url_host("10.0.0.5"), "10.0.0.5");
        assert_eq!(url_host("gpu-a-01"), "gpu-a-01");
    }
}
