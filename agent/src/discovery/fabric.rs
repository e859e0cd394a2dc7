//! Whether the adapters the configuration names for each fabric are here
//! and can carry traffic.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::discovery::ib::Hca;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricCheck {
    pub fabric: String,
    pub usable: Vec<String>,
    /// The slowest usable adapter's fastest active port.
    pub rate_gbps: u32,
    pub problems: Vec<String>,
}

impl FabricCheck {
    pub fn ok(&self) -> bool {
        !self.usable.is_empty()
    }

    /// Usable or not, and why, in the words `agent inventory` prints and
    /// the agent logs.
    pub fn describe(&self) -> String {
        let state = if self.ok() {
            format!("ok at {} Gb/s", self.rate_gbps)
        } else {
            "NOT USABLE".to_owned()
        };
        if self.problems.is_empty() {
            state
        } else {
            format!("{state}; {}", self.problems.join("; "))
        }
    }
}

/// What a registration leaves out of the fabrics configured, one line a
/// fabric: one none of whose adapters is usable is not registered, one
/// with some is registered with those. A setting is honoured or said to
/// be not, never dropped without a word; not refused either, since an
/// adapter may come up after the agent.
pub fn left_out(checks: &[FabricCheck]) -> Vec<String> {
    checks
        .iter()
        .filter(|c| !c.problems.is_empty())
        .map(|c| {
            let registered = if c.ok() {
                format!("registered with {} only", c.usable.join(", "))
            } else {
                "not registered: no replica that needs it is placed on this node".to_owned()
            };
            format!("fabric {}: {}; {registered}", c.fabric, c.describe())
        })
        .collect()
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("adapter {hca} is named under two fabrics ({first} and {second})")]
pub struct DoubleMembership {
    pub hca: String,
    pub first: String,
    pub second: String,
}

/// One check per declared fabric, by fabric name. An adapter declared
/// under two fabrics is refused: it can carry only one fabric's traffic.
pub fn check(
    declared: &BTreeMap<String, Vec<String>>,
    discovered: &[Hca],
) -> Result<Vec<FabricCheck>, DoubleMembership> {
    let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
    for (fabric, hcas) in declared {
        for h in hcas {
            if let Some(first) = owner.insert(h, fabric).filter(|f| *f != fabric.as_str()) {
                return Err(DoubleMembership {
                    hca: h.clone(),
                    first: first.to_owned(),
                    second: fabric.clone(),
                });
            }
        }
    }
    let found: BTreeSet<&str> = discovered.iter().map(|h| h.name.as_str()).collect();
    let names = if found.is_empty() {
        "none".to_owned()
    } else {
        found.iter().copied().collect::<Vec<_>>().join(", ")
    };
    Ok(declared
        .iter()
        .map(|(fabric, wanted)| {
            let mut c = FabricCheck {
                fabric: fabric.clone(),
                usable: Vec::new(),
                rate_gbps: 0,
                problems: Vec::new(),
            };
            for want in wanted {
                let Some(hca) = discovered.iter().find(|h| &h.name == want) else {
                    c.problems
                        .push(format!("{want} is not on this node (found: {names})"));
                    continue;
                };
                let active = hca.active_ports();
                if active.is_empty() {
                    let ports: Vec<String> = hca
                        .ports
                        .iter()
                        .map(|p| format!("port {} {}/{}", p.num, p.state, p.phys_state))
                        .collect();
                    let ports = if ports.is_empty() {
                        "no ports".to_owned()
                    } else {
                        ports.join(", ")
                    };
                    c.problems
                        .push(format!("{want} has no active port ({ports})"));
                    continue;
                }
                c.usable.push(want.clone());
                let best = active.iter().map(|p| p.rate_gbps).max().unwrap_or(0);
                c.rate_gbps = if c.rate_gbps == 0 {
                    best
                } else {
                    c.rate_gbps.min(best)
                };
            }
            c
        })
        .collect())
}
