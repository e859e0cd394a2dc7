//! Where a replica of a model goes: the highest-priority profile that fits,
//! on nodes chosen by rules an operator can read back with `explain`.
//!
//! Pure: the caller passes the cluster as the log built it and the ids to
//! use, and gets either a placement or the reason every node was refused.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::catalog::{Model, Profile};
use crate::ids::{NodeId, ReplicaId, ShardId};
use crate::nodes::{Node, Nodes, Reachability};
use crate::replicas::{Placement, Replicas, ShardPlacement};

/// What placement may hand out besides GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaceOptions {
    /// Engine ports, inclusive.
    pub port_range: (u16, u16),
}

impl Default for PlaceOptions {
    fn default() -> Self {
        PlaceOptions {
            port_range: (20000, 20999),
        }
    }
}

/// One node's verdict for one profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub node: NodeId,
    pub fits: bool,
    /// Why it was refused, or what it offers when it fits.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileVerdict {
    pub profile: String,
    pub priority: i32,
    /// `placed`, or why the profile as a whole did not fit.
    pub outcome: String,
    pub candidates: Vec<Candidate>,
}

/// Every profile tried, in order, with every node's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explanation {
    pub model: String,
    pub profiles: Vec<ProfileVerdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chosen: Option<Placement>,
}

impl Explanation {
    /// One line: what was chosen, or why nothing was.
    pub fn summary(&self) -> String {
        if let Some(p) = &self.chosen {
            return format!("{} profile {}: {}", self.model, p.profile, p.why);
        }
        if self.profiles.is_empty() {
            return format!("{} has no profiles and is never started", self.model);
        }
        let why: Vec<String> = self.profiles.iter().map(ProfileVerdict::summary).collect();
        format!("{} fits nowhere ({})", self.model, why.join("; "))
    }
}

impl ProfileVerdict {
    /// Its outcome, and the nodes' one reason when every node refused it
    /// for the same one (a label or GPU class no node has is the common
    /// case, and "no node fits" alone says nothing).
    fn summary(&self) -> String {
        let mut reasons = self
            .candidates
            .iter()
            .map(|c| (!c.fits).then_some(&c.reason));
        let Some(Some(first)) = reasons.next() else {
            return format!("{}: {}", self.profile, self.outcome);
        };
        if !reasons.all(|r| r == Some(first)) {
            return format!("{}: {}", self.profile, self.outcome);
        }
        match self.candidates.as_slice() {
            [one] => format!("{}: {}, {}: {first}", self.profile, self.outcome, one.node),
            all => format!(
                "{}: {}, all {} nodes: {first}",
                self.profile,
                self.outcome,
                all.len()
            ),
        }
    }
}

/// What is already handed out on one node.
#[derive(Debug, Default)]
struct Used<'a> {
    /// Each taken GPU and the replica holding it (named in explanations).
    gpus: BTreeMap<u32, &'a ReplicaId>,
    ports: BTreeSet<u16>,
    memory_mb: u64,
    shards: usize,
}

/// A process an agent reports that the log no longer counts as live (a
/// stop not yet carried out): its GPUs and port stay taken until it is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub node_id: NodeId,
    pub replica_id: ReplicaId,
    pub port: u16,
    pub gpus: Vec<u32>,
}

fn usage<'a>(replicas: &'a Replicas, held: &'a [Held]) -> BTreeMap<&'a NodeId, Used<'a>> {
    let mut used: BTreeMap<&NodeId, Used<'a>> = BTreeMap::new();
    for h in held {
        let u = used.entry(&h.node_id).or_default();
        for g in &h.gpus {
            u.gpus.insert(*g, &h.replica_id);
        }
        u.ports.insert(h.port);
    }
    for r in replicas.replicas.values().filter(|r| r.is_live()) {
        for s in &r.placement.shards {
            let u = used.entry(&s.node_id).or_default();
            for g in &s.gpu_indices {
                u.gpus.insert(*g, &r.placement.replica_id);
            }
            u.ports.insert(s.port);
            u.memory_mb += s.memory_mb;
            u.shards += 1;
        }
    }
    used
}

/// A node that passed every per-node rule for a profile.
#[derive(Debug)]
struct Fit<'a> {
    node: &'a Node,
    /// Free, healthy GPUs of the profile's class, lowest index first.
    free_gpus: Vec<u32>,
    /// The GPUs this shard would take.
    take: Vec<u32>,
    port: u16,
    holds_weights: bool,
    shards: usize,
    memory_free_mb: Option<u64>,
}

/// The file name an agent caches a fetched source under:
/// `<16 hex of sha256(source)>-<base name>`. It must agree with the
/// agent's `fetch::cache_path_for` (both are tested on the same vectors).
pub fn cache_name(source: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(source.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let base = source
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("");
    let base = if base.is_empty() || base == "." {
        "weights"
    } else {
        base
    };
    format!("{hex}-{base}")
}

/// The files in `weights` that an agent's cache generated (named
/// `<16 hex>-…`) for no source the catalog still names: what a weights
/// collection may remove. Downloads in progress (`.part`) are never listed.
pub fn unwanted_cached(weights: &[String], catalog: &crate::catalog::Catalog) -> Vec<String> {
    let keep: std::collections::BTreeSet<String> = catalog
        .models
        .values()
        .filter(|m| !m.source.is_empty())
        .map(|m| cache_name(&m.source))
        .collect();
    let generated = |name: &str| {
        let b = name.as_bytes();
        b.len() > 17
            && b[..16]
                .iter()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
            && b[16] == b'-'
    };
    weights
        .iter()
        .filter(|w| {
            let name = w.trim_end_matches('/').rsplit('/').next().unwrap_or("");
            generated(name) && !name.ends_with(".part") && !keep.contains(name)
        })
        .cloned()
        .collect()
}

/// Whether a node's inventory already holds a model's weights: the source
/// itself, a file of the same name in a model directory, or the agent's
/// cached copy.
pub fn holds_weights(node: &Node, source: &str) -> bool {
    Weights::of(source).held_by(node)
}

/// A model's weights under the names a node's inventory may list them by,
/// worked out once per placement rather than once per node (the cache name
/// is a SHA-256).
struct Weights<'a> {
    source: &'a str,
    base: &'a str,
    cached: String,
}

impl<'a> Weights<'a> {
    fn of(source: &'a str) -> Self {
        let base = source
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or("");
        let cached = if source.is_empty() {
            String::new()
        } else {
            cache_name(source)
        };
        Weights {
            source,
            base,
            cached,
        }
    }

    fn held_by(&self, node: &Node) -> bool {
        if self.source.is_empty() {
            return false;
        }
        node.inventory.weights.iter().any(|w| {
            let name = w.trim_end_matches('/').rsplit('/').next();
            w == self.source
                || (!self.base.is_empty() && name == Some(self.base))
                || name == Some(self.cached.as_str())
        })
    }
}

/// A refusal's reason, spelled out only when the caller will show it: the
/// reconciler places quietly and asks for the reasons only when nothing
/// fits, so 10,000 nodes cost no 10,000 strings.
fn why(explain: bool, reason: impl FnOnce() -> String) -> String {
    if explain { reason() } else { String::new() }
}

/// What a placement is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// The choice alone (the reconciler).
    Quiet,
    /// The choice with every node's verdict.
    Explain,
    /// Whether any node could take it as built (`fits_as_built`).
    AsBuilt,
}

/// Which of a node's facts a placement weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// All of them, as they are now.
    Now,
    /// Only what no wait changes (labels, GPU classes and counts, memory):
    /// as if the node were ready, uncordoned, healthy, with room on its
    /// disk and its engines installed (`fits_as_built`).
    AsBuilt,
}

fn check_node<'a>(
    node: &'a Node,
    weights: &Weights<'_>,
    profile: &Profile,
    used: Option<&Used<'_>>,
    options: PlaceOptions,
    explain: bool,
    look: Look,
) -> Result<Fit<'a>, String> {
    let now = look == Look::Now;
    match node.reachability {
        _ if !now => {}
        Reachability::Ready => {}
        Reachability::Unreachable => return Err("unreachable: no recent heartbeat".into()),
        Reachability::Lost => return Err("lost".into()),
    }
    if node.draining && now {
        return Err("draining".into());
    }
    if node.cordoned && now {
        return Err("cordoned".into());
    }
    for (k, v) in &profile.node_selector {
        match node.inventory.labels.get(k) {
            Some(have) if have == v => {}
            Some(have) => {
                return Err(why(explain, || {
                    format!("label {k}={have}, the profile wants {k}={v}")
                }));
            }
            None => {
                return Err(why(explain, || {
                    format!("no label {k}, the profile wants {k}={v}")
                }));
            }
        }
    }
    let engine = profile.engine.name();
    if now && !node.inventory.engines.contains_key(engine) {
        return Err(why(explain, || {
            format!("engine {engine} is not installed or not seen to run")
        }));
    }
    let holds = weights.held_by(node);
    if let Some(free) = node.inventory.disk_free_gb
        && now
        && profile.min_disk_gb > 0
        && !holds
        && free < u64::from(profile.min_disk_gb)
    {
        return Err(why(explain, || {
            format!(
                "needs {} GB of disk for the weights, has {free} GB free and does not hold them",
                profile.min_disk_gb
            )
        }));
    }
    let empty = Used::default();
    let used = used.unwrap_or(&empty);
    // Host RAM, for a GPU profile too (an engine's own process, pinned
    // buffers, a CPU swap space): honoured wherever it is given.
    let mut memory_free_mb = None;
    if profile.memory_mb > 0 && node.inventory.memory_total_mb > 0 {
        let free = node
            .inventory
            .memory_total_mb
            .saturating_sub(used.memory_mb);
        if free < profile.memory_mb {
            return Err(why(explain, || {
                format!(
                    "needs {} MB of RAM, {free} MB of {} MB are free",
                    profile.memory_mb, node.inventory.memory_total_mb
                )
            }));
        }
        memory_free_mb = Some(free);
    }
    let (free_gpus, take) = match &profile.gpu_class {
        None => (Vec::new(), Vec::new()),
        Some(class) => {
            let of_class: Vec<_> = node
                .inventory
                .gpus
                .iter()
                .filter(|g| &g.class == class)
                .collect();
            if of_class.is_empty() {
                if !explain {
                    return Err(String::new());
                }
                let classes: BTreeSet<&str> = node
                    .inventory
                    .gpus
                    .iter()
                    .map(|g| g.class.as_str())
                    .collect();
                return Err(if classes.is_empty() {
                    format!("no GPUs, the profile wants {class}")
                } else {
                    format!(
                        "no {class} GPUs (has {})",
                        classes.into_iter().collect::<Vec<_>>().join(", ")
                    )
                });
            }
            let mut notes = Vec::new();
            let mut free = Vec::new();
            for g in &of_class {
                if let Some(r) = used.gpus.get(&g.index) {
                    if explain {
                        notes.push(format!("GPU {} held by {r}", g.index));
                    }
                } else if !g.problems.is_empty() && now {
                    if explain {
                        notes.push(format!("GPU {}: {}", g.index, g.problems.join(", ")));
                    }
                } else {
                    free.push(g.index);
                }
            }
            free.sort_unstable();
            let want = profile.gpus_per_node as usize;
            if free.len() < want {
                if !explain {
                    return Err(String::new());
                }
                let mut reason = format!("needs {want} free {class} GPUs, has {}", free.len());
                if !notes.is_empty() {
                    reason.push_str(&format!(" ({})", notes.join("; ")));
                }
                return Err(reason);
            }
            let take = choose_gpus(node, &free, want).ok_or_else(|| {
                why(explain, || {
                    format!("no {want} free {class} GPUs within one NVLink domain")
                })
            })?;
            (free, take)
        }
    };
    let port = (options.port_range.0..=options.port_range.1)
        .find(|p| !used.ports.contains(p))
        .ok_or_else(|| "every port in the engine port range is taken".to_owned())?;
    Ok(Fit {
        node,
        free_gpus,
        take,
        port,
        holds_weights: holds,
        shards: used.shards,
        memory_free_mb,
    })
}

/// `want` GPUs out of `free`: inside one NVLink domain when the node
/// reports its topology (a tensor-parallel group across domains crawls over
/// PCIe), else the lowest indices.
fn choose_gpus(node: &Node, free: &[u32], want: usize) -> Option<Vec<u32>> {
    let gpus = &node.inventory.gpus;
    if want <= 1 || gpus.iter().all(|g| g.nvlink_peers.is_empty()) {
        return Some(free[..want].to_vec());
    }
    // Domains are the connected components of the NVLink graph.
    let mut domain: BTreeMap<u32, u32> = gpus.iter().map(|g| (g.index, g.index)).collect();
    fn root(d: &BTreeMap<u32, u32>, mut i: u32) -> u32 {
        while let Some(&p) = d.get(&i) {
            if p == i {
                break;
            }
            i = p;
        }
        i
    }
    for g in gpus {
        for p in &g.nvlink_peers {
            if !domain.contains_key(p) {
                continue;
            }
            let (a, b) = (root(&domain, g.index), root(&domain, *p));
            if a != b {
                domain.insert(a.max(b), a.min(b));
            }
        }
    }
    let mut by_domain: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &i in free {
        by_domain.entry(root(&domain, i)).or_default().push(i);
    }
    // The smallest domain that holds the group, so big domains stay whole.
    by_domain
        .into_values()
        .filter(|members| members.len() >= want)
        .min_by_key(|members| (members.len(), members[0]))
        .map(|members| members[..want].to_vec())
}

/// Places one replica of `model`, or explains why it fits nowhere, with
/// every node's verdict for every profile tried (what `explain` shows).
///
/// `replica_id` names the replica; shard ids are `{replica_id}-{rank}`.
pub fn place(
    model: &Model,
    nodes: &Nodes,
    replicas: &Replicas,
    held: &[Held],
    replica_id: &ReplicaId,
    options: PlaceOptions,
) -> Explanation {
    decide(
        model,
        nodes,
        replicas,
        held,
        replica_id,
        options,
        How::Explain,
    )
}

/// The placement [`place`] would choose, without the per-node verdicts:
/// what the reconciler needs on every pass. When it is `None`, [`place`]
/// says why.
pub fn place_quiet(
    model: &Model,
    nodes: &Nodes,
    replicas: &Replicas,
    held: &[Held],
    replica_id: &ReplicaId,
    options: PlaceOptions,
) -> Option<Placement> {
    decide(
        model,
        nodes,
        replicas,
        held,
        replica_id,
        options,
        How::Quiet,
    )
    .chosen
}

/// Whether `model` would fit some node of `nodes` were every node ready,
/// uncordoned, healthy, with room on its disk, its engines installed and
/// nothing placed: false means that no wait helps (the nodes' labels, GPU
/// classes and counts, or memory rule it out), only an operator. True
/// while fewer nodes have registered than a profile spans (none, at
/// first): the rest may be on their way.
pub fn fits_as_built(model: &Model, nodes: &Nodes, options: PlaceOptions) -> bool {
    let spans = model.profiles.iter().map(|p| p.nodes.max(1)).max();
    if spans.is_none_or(|n| nodes.nodes.len() < n as usize) {
        return true;
    }
    let id = ReplicaId::from("as-built");
    let none = Replicas::default();
    decide(model, nodes, &none, &[], &id, options, How::AsBuilt)
        .chosen
        .is_some()
}

/// Unless asked to explain, the profiles carry no candidates and the
/// refusals no reasons; the choice is the same either way.
fn decide(
    model: &Model,
    nodes: &Nodes,
    replicas: &Replicas,
    held: &[Held],
    replica_id: &ReplicaId,
    options: PlaceOptions,
    how: How,
) -> Explanation {
    let explain = how == How::Explain;
    let look = if how == How::AsBuilt {
        Look::AsBuilt
    } else {
        Look::Now
    };
    let used = usage(replicas, held);
    // Nodes already running this model: another replica goes elsewhere
    // when it can, so that one node lost does not take them all.
    let with_model: BTreeSet<&NodeId> = replicas
        .replicas
        .values()
        .filter(|r| r.is_live() && r.placement.model == model.name)
        .flat_map(|r| r.placement.shards.iter().map(|s| &s.node_id))
        .collect();
    let weights = Weights::of(&model.source);
    let mut order: Vec<&Profile> = model.profiles.iter().collect();
    // Highest priority first; the catalog's order breaks ties.
    order.sort_by_key(|p| std::cmp::Reverse(p.priority));
    let mut explanation = Explanation {
        model: model.name.clone(),
        profiles: Vec::new(),
        chosen: None,
    };
    for profile in order {
        let mut candidates = Vec::new();
        let mut fits = Vec::new();
        // Both maps are sorted by node id: walk them side by side rather
        // than search the usage once per node (at 10,000 nodes the searches
        // cost as much as the checks).
        let mut used_in_order = used.iter().peekable();
        for (key, node) in &nodes.nodes {
            let node_used = if *key == node.id {
                while used_in_order.next_if(|(id, _)| **id < key).is_some() {}
                used_in_order
                    .peek()
                    .filter(|(id, _)| **id == key)
                    .map(|(_, u)| *u)
            } else {
                used.get(&node.id)
            };
            let verdict = check_node(node, &weights, profile, node_used, options, explain, look);
            match verdict {
                Ok(fit) => {
                    if explain {
                        candidates.push(Candidate {
                            node: node.id.clone(),
                            fits: true,
                            reason: offer(&fit),
                        });
                    }
                    fits.push(fit);
                }
                Err(reason) => {
                    if explain {
                        candidates.push(Candidate {
                            node: node.id.clone(),
                            fits: false,
                            reason,
                        });
                    }
                }
            }
        }
        let outcome = if profile.nodes <= 1 {
            // A node whose address has no port left for it (others there
            // hold the rest) is passed over for the next best.
            let mut fits = fits;
            loop {
                let chosen = single_node(model, profile, &fits, replica_id, &with_model);
                let Ok(mut placement) = chosen else {
                    break chosen;
                };
                match share_host_ports(&mut placement, nodes, &used, options) {
                    Ok(()) => break Ok(placement),
                    Err(why) => {
                        // Every node there has the same ports taken.
                        let node = &placement.shards[0].node_id;
                        let at = nodes.nodes.get(node).map(|n| n.inventory.address());
                        fits.retain(|f| {
                            f.node.id != *node && Some(f.node.inventory.address()) != at
                        });
                        if fits.is_empty() {
                            break Err(why);
                        }
                    }
                }
            }
        } else {
            multi_node(model, profile, fits, replica_id, &mut candidates).and_then(
                |mut placement| {
                    share_host_ports(&mut placement, nodes, &used, options)?;
                    Ok(placement)
                },
            )
        };
        match outcome {
            Ok(placement) => {
                if explain {
                    shared_ports_said(&placement, &mut candidates);
                }
                explanation.profiles.push(ProfileVerdict {
                    profile: profile.name.clone(),
                    priority: profile.priority,
                    outcome: "placed".into(),
                    candidates,
                });
                explanation.chosen = Some(placement);
                break;
            }
            Err(outcome) => explanation.profiles.push(ProfileVerdict {
                profile: profile.name.clone(),
                priority: profile.priority,
                outcome,
                candidates,
            }),
        }
    }
    explanation
}

/// Nodes that share an address share its ports: two agents on one machine
/// were handed the same port, and the second engine could not bind. Each
/// shard's port was chosen among its own node's; here it moves to the
/// lowest port free on every node at its address (and not taken by an
/// earlier shard of this placement there). Only the chosen shards pay the
/// scan of the other nodes, not every candidate.
fn share_host_ports(
    placement: &mut Placement,
    nodes: &Nodes,
    used: &BTreeMap<&NodeId, Used<'_>>,
    options: PlaceOptions,
) -> Result<(), String> {
    for i in 0..placement.shards.len() {
        let (earlier, rest) = placement.shards.split_at_mut(i);
        let shard = &mut rest[0];
        let Some(host) = nodes
            .nodes
            .get(&shard.node_id)
            .map(|n| n.inventory.address())
        else {
            continue;
        };
        let mut taken: BTreeSet<u16> = nodes
            .nodes
            .values()
            .filter(|n| n.id != shard.node_id && n.inventory.address() == host)
            .filter_map(|n| used.get(&n.id))
            .flat_map(|u| u.ports.iter().copied())
            .collect();
        taken.extend(
            earlier
                .iter()
                .filter(|s| {
                    nodes
                        .nodes
                        .get(&s.node_id)
                        .is_some_and(|n| n.inventory.address() == host)
                })
                .map(|s| s.port),
        );
        if !taken.contains(&shard.port) {
            continue;
        }
        let own = used.get(&shard.node_id).map(|u| &u.ports);
        shard.port = (options.port_range.0..=options.port_range.1)
            .find(|p| !taken.contains(p) && !own.is_some_and(|o| o.contains(p)))
            .ok_or_else(|| {
                format!("every port in the engine port range is taken at {host}, which several nodes share")
            })?;
    }
    Ok(())
}

/// A chosen node's verdict names the port the placement gives it: moved
/// off the node's own lowest free one when another node at its address
/// holds that.
fn shared_ports_said(placement: &Placement, candidates: &mut [Candidate]) {
    for shard in &placement.shards {
        let Some(c) = candidates
            .iter_mut()
            .find(|c| c.fits && c.node == shard.node_id)
        else {
            continue;
        };
        let Some((before, own)) = c.reason.rsplit_once("port ") else {
            continue;
        };
        if own != shard.port.to_string() {
            c.reason = format!(
                "{before}port {} ({own} is another node's at its address)",
                shard.port
            );
        }
    }
}

fn offer(fit: &Fit<'_>) -> String {
    let mut parts = Vec::new();
    if !fit.take.is_empty() {
        parts.push(format!(
            "GPUs {:?} of {} free",
            fit.take,
            fit.free_gpus.len()
        ));
    }
    if let Some(m) = fit.memory_free_mb {
        parts.push(format!("{m} MB RAM free"));
    }
    if fit.holds_weights {
        parts.push("holds the weights".into());
    }
    parts.push(format!("port {}", fit.port));
    parts.join(", ")
}

fn shard(
    replica_id: &ReplicaId,
    rank: u32,
    fit: &Fit<'_>,
    hcas: Vec<String>,
    profile: &Profile,
) -> ShardPlacement {
    ShardPlacement {
        shard_id: ShardId::from(format!("{replica_id}-{rank}")),
        rank,
        node_id: fit.node.id.clone(),
        gpu_indices: fit.take.clone(),
        hcas,
        port: fit.port,
        memory_mb: profile.memory_mb,
    }
}

fn single_node(
    model: &Model,
    profile: &Profile,
    fits: &[Fit<'_>],
    replica_id: &ReplicaId,
    with_model: &BTreeSet<&NodeId>,
) -> Result<Placement, String> {
    // Weights on disk first (a fetch costs minutes), then: GPU replicas
    // bin-pack onto the fullest node that fits, keeping whole nodes free for
    // big replicas; CPU replicas spread, onto a node without a replica of
    // this model (replicas apart survive a node's loss), then the least
    // loaded. Between nodes equal by those, one without the model. Only
    // the best is used: a minimum, not a sort, and keys that borrow the
    // node id rather than clone it.
    let with = |f: &Fit<'_>| with_model.contains(&f.node.id);
    let best = if profile.is_cpu() {
        fits.iter()
            .min_by_key(|f| (!f.holds_weights, with(f), f.shards, f.node.id.as_str()))
    } else {
        fits.iter().min_by_key(|f| {
            (
                !f.holds_weights,
                f.free_gpus.len(),
                with(f),
                f.node.id.as_str(),
            )
        })
    };
    let Some(best) = best else {
        return Err("no node fits".into());
    };
    let why = format!(
        "on {} ({}){}",
        best.node.id,
        match (profile.is_cpu(), with_model.is_empty() || with(best)) {
            (true, true) => "least loaded",
            (true, false) => "without a replica of the model, least loaded",
            (false, _) => "fullest node that fits",
        },
        if best.holds_weights {
            ", which holds the weights"
        } else {
            ""
        }
    );
    Ok(Placement {
        replica_id: replica_id.clone(),
        model: model.name.clone(),
        profile: profile.name.clone(),
        profile_fp: model.profile_fp(profile),
        pool: profile.gpu_class.clone().unwrap_or_else(|| "cpu".into()),
        fabric: None,
        shards: vec![shard(replica_id, 0, best, Vec::new(), profile)],
        why,
    })
}

fn multi_node(
    model: &Model,
    profile: &Profile,
    fits: Vec<Fit<'_>>,
    replica_id: &ReplicaId,
    candidates: &mut [Candidate],
) -> Result<Placement, String> {
    let want = profile.nodes as usize;
    // A multi-node replica lives on one fabric: group by fabric and never
    // mix. A node without a fabric is an island.
    let mut by_fabric: BTreeMap<&str, Vec<&Fit<'_>>> = BTreeMap::new();
    for fit in &fits {
        if fit.node.inventory.fabrics.is_empty() {
            if let Some(c) = candidates.iter_mut().find(|c| c.node == fit.node.id) {
                c.fits = false;
                c.reason = "a multi-node profile needs a fabric; this node has none".into();
            }
            continue;
        }
        for f in &fit.node.inventory.fabrics {
            by_fabric.entry(f.fabric.as_str()).or_default().push(fit);
        }
    }
    let mut best: Option<(&str, Vec<&Fit<'_>>)> = None;
    for (fabric, mut members) in by_fabric {
        if members.len() < want {
            continue;
        }
        // The emptiest nodes, weights on disk first.
        members.sort_by_key(|f| {
            (
                !f.holds_weights,
                std::cmp::Reverse(f.free_gpus.len()),
                f.node.id.as_str(),
            )
        });
        members.truncate(want);
        let score = |m: &[&Fit<'_>]| m.iter().filter(|f| f.holds_weights).count();
        if best
            .as_ref()
            .is_none_or(|(_, b)| score(&members) > score(b))
        {
            best = Some((fabric, members));
        }
    }
    let Some((fabric, members)) = best else {
        return Err(format!(
            "needs {want} nodes on one fabric, {} fit on their own",
            fits.len()
        ));
    };
    let shards = members
        .iter()
        .enumerate()
        .map(|(rank, fit)| {
            let hcas = fit
                .node
                .inventory
                .fabrics
                .iter()
                .filter(|f| f.fabric == fabric)
                .flat_map(|f| f.hcas.clone())
                .collect();
            shard(replica_id, rank as u32, fit, hcas, profile)
        })
        .collect();
    let names: Vec<&str> = members.iter().map(|f| f.node.id.as_str()).collect();
    Ok(Placement {
        replica_id: replica_id.clone(),
        model: model.name.clone(),
        profile: profile.name.clone(),
        profile_fp: model.profile_fp(profile),
        pool: profile.gpu_class.clone().unwrap_or_else(|| "cpu".into()),
        fabric: Some(fabric.to_owned()),
        shards,
        why: format!("on fabric {fabric}: {} (emptiest nodes)", names.join(", ")),
    })
}
