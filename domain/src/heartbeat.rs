//! What a heartbeat changes: a node that was not ready is back, and the
//! inventory facts that moved since registration (memory, free disk,
//! weights on disk, engines, GPUs' problems).
//!
//! Heartbeats are the hot path of a fleet, so a heartbeat that changes
//! nothing asks for nothing: most beats leave the log alone. Telemetry
//! (used memory, temperatures) is not here; it would make every beat an
//! event.

use std::collections::BTreeMap;

use crate::Command;
use crate::nodes::{Node, NodeCommand, Reachability};

/// What a heartbeat says, in the domain's terms. A field is `None` when the
/// beat does not speak of it (agents send some facts only when they
/// changed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heartbeat {
    /// Total RAM, when reported.
    pub memory_total_mb: Option<u64>,
    /// Free disk where the node's fetched weights go (its weights cache's
    /// filesystem), when it reported storage (itself `None` when that is
    /// a filer shared with other nodes).
    pub disk_free_gb: Option<Option<u64>>,
    /// Model sources on local disk, when they changed.
    pub weights: Option<Vec<String>>,
    /// Engine name → version, when they changed.
    pub engines: Option<BTreeMap<String, String>>,
    /// The node's look at its GPUs, when it changed.
    pub gpus: Option<Vec<GpuLook>>,
}

/// One GPU as the node sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLook {
    pub index: u32,
    /// Reasons to keep it out of placement; empty when it is fine.
    pub problems: Vec<String>,
}

/// The problem a registered GPU gets when the node no longer sees it.
pub const GPU_NOT_SEEN: &str = "not seen by the node's last look at its GPUs";

/// Whether free disk moved enough to record: a gigabyte where little is
/// left (placement weighs it there), two elsewhere. Free space hovering at
/// a whole gigabyte's edge, on a disk other work shares, appended an
/// inventory change every few heartbeats.
fn disk_moved(was: Option<u64>, now: Option<u64>) -> bool {
    const SCARCE_GB: u64 = 10;
    match (was, now) {
        (Some(was), Some(now)) => {
            let moved = was.abs_diff(now);
            moved >= 2 || (moved == 1 && was.min(now) < SCARCE_GB)
        }
        (was, now) => was != now,
    }
}

/// The commands a heartbeat of `node` asks for: none when nothing changed.
/// The decider re-checks each against the log, so a view a moment behind
/// costs at most a no-op.
pub fn plan(node: &Node, hb: &Heartbeat) -> Vec<Command> {
    let mut commands = Vec::new();
    if node.reachability != Reachability::Ready {
        commands.push(Command::Node(NodeCommand::Heartbeat {
            node_id: node.id.clone(),
        }));
    }
    let cur = &node.inventory;
    // A card's problems as the node sees them now: ECC errors that
    // appeared, another process on a card, or such a process gone.
    let mut gpus = cur.gpus.clone();
    if let Some(looks) = &hb.gpus {
        for g in &mut gpus {
            g.problems = match looks.iter().find(|l| l.index == g.index) {
                Some(l) => l.problems.clone(),
                // Registered, but gone from the node's own look.
                None => vec![GPU_NOT_SEEN.into()],
            };
        }
    }
    let changed = hb.memory_total_mb.is_some_and(|m| m != cur.memory_total_mb)
        || hb
            .disk_free_gb
            .is_some_and(|d| disk_moved(cur.disk_free_gb, d))
        || hb.weights.as_ref().is_some_and(|w| *w != cur.weights)
        || hb.engines.as_ref().is_some_and(|e| *e != cur.engines)
        || gpus != cur.gpus;
    if changed {
        let mut inv = cur.clone();
        inv.gpus = gpus;
        inv.memory_total_mb = hb.memory_total_mb.unwrap_or(inv.memory_total_mb);
        inv.disk_free_gb = hb.disk_free_gb.unwrap_or(inv.disk_free_gb);
        inv.weights = hb.weights.clone().unwrap_or(inv.weights);
        inv.engines = hb.engines.clone().unwrap_or(inv.engines);
        commands.push(Command::Node(NodeCommand::ReportInventory {
            node_id: node.id.clone(),
            inventory: inv,
        }));
    }
    commands
}
