//! The model catalog: what can be served, on what, and how requests for a
//! name resolve. The whole catalog is validated before any change is
//! appended, so a typo in one model's fallback fails the edit, not the
//! outage.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Rejection;

/// An inference engine llmgw can launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Vllm,
    Sglang,
    Llamacpp,
    Sim,
}

impl Engine {
    /// Whether a profile without a GPU class may use this engine. vLLM is
    /// refused so that a forgotten `gpu_class` cannot land a GPU model on a
    /// GPU-less machine.
    pub fn serves_on_cpu(self) -> bool {
        !matches!(self, Engine::Vllm)
    }

    pub fn name(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Llamacpp => "llamacpp",
            Engine::Sim => "sim",
        }
    }
}

/// One way to run a model: an engine on a shape of hardware.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    pub name: String,
    pub engine: Engine,
    /// `h100-80g`, `l40s-45g` …; absent means CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_class: Option<String>,
    #[serde(default = "one")]
    pub tp: u32,
    #[serde(default = "one")]
    pub pp: u32,
    #[serde(default = "one")]
    pub nodes: u32,
    #[serde(default)]
    pub gpus_per_node: u32,
    /// Higher is tried first when placing.
    #[serde(default)]
    pub priority: i32,
    /// Capacity relative to other profiles, as measured by `ctl bench`.
    #[serde(default = "one")]
    pub weight: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout_s: Option<u32>,
    #[serde(default)]
    pub min_disk_gb: u32,
    /// RAM a CPU profile needs; 0 means no constraint.
    #[serde(default)]
    pub memory_mb: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

fn one() -> u32 {
    1
}

impl Profile {
    /// A digest of everything that shapes the running process, so that a
    /// replica started from an edited profile can be told apart.
    pub fn fingerprint(&self) -> String {
        short_digest(self)
    }

    pub fn is_cpu(&self) -> bool {
        self.gpu_class.is_none()
    }

    /// One rank on the CPU (no `gpu_class`), every other field at its
    /// default: the smallest profile, for builders and tests.
    pub fn cpu(name: &str, engine: Engine) -> Self {
        Profile {
            name: name.to_owned(),
            engine,
            gpu_class: None,
            tp: 1,
            pp: 1,
            nodes: 1,
            gpus_per_node: 0,
            priority: 0,
            weight: 1,
            startup_timeout_s: None,
            min_disk_gb: 0,
            memory_mb: 0,
            node_selector: BTreeMap::new(),
            args: Vec::new(),
            env: BTreeMap::new(),
        }
    }
}

/// How many replicas to keep. `min: 0` means on-demand: a request starts
/// the model and it stops after `idle_timeout_s`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scaling {
    #[serde(default)]
    pub min: u32,
    #[serde(default = "one")]
    pub max: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_s: Option<u32>,
}

impl Default for Scaling {
    fn default() -> Self {
        Scaling {
            min: 0,
            max: 1,
            idle_timeout_s: None,
        }
    }
}

/// Micro-units per 1,000 tokens, prompt and completion priced apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Price {
    pub prompt_per_1k: u64,
    pub completion_per_1k: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Model {
    pub name: String,
    /// A path, a hub id or a URL.
    #[serde(default)]
    pub source: String,
    /// `sha256:<hex>` of the file a URL source names; a fetch that does not
    /// match is discarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// Tried in order when this model has no capacity or the budget is spent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u32>,
    #[serde(default)]
    pub scaling: Scaling,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    /// A model without profiles is catalogued but never started.
    #[serde(default)]
    pub profiles: Vec<Profile>,
}

impl Model {
    /// A model with defaults and no profiles, for tests and builders.
    pub fn named(name: &str) -> Self {
        Model {
            name: name.to_owned(),
            source: String::new(),
            checksum: None,
            aliases: Vec::new(),
            fallbacks: Vec::new(),
            routing_profile: None,
            context_length: None,
            scaling: Scaling::default(),
            description: String::new(),
            price: None,
            profiles: Vec::new(),
        }
    }

    pub fn on_demand(&self) -> bool {
        self.scaling.min == 0 && !self.profiles.is_empty()
    }

    /// What a replica of this model on `profile` is started with, as a
    /// fingerprint: a replica whose own differs is outdated and replaced.
    /// The model's context length goes to the engine, so it counts; a
    /// model without one has its profile's own fingerprint, as before the
    /// length was passed (running replicas stay current).
    pub fn profile_fp(&self, profile: &Profile) -> String {
        match self.context_length {
            None => profile.fingerprint(),
            Some(c) => short_digest(&(profile, c)),
        }
    }
}

/// The first 8 bytes of the SHA-256 of `value`'s JSON, in hex: a
/// fingerprint that changes with anything in it.
fn short_digest(value: &impl Serialize) -> String {
    let bytes = serde_json::to_vec(value).expect("profiles serialise");
    let digest = Sha256::digest(bytes);
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CatalogCommand {
    AddModel(Model),
    UpdateModel(Model),
    RemoveModel {
        name: String,
    },
    /// Adds or updates every model of a configuration file at once, so
    /// that models may name each other (fallbacks) in any order. Only the
    /// result is validated; unchanged models produce no event.
    ApplyModels(Vec<Model>),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum CatalogEvent {
    ModelAdded { model: Model },
    ModelUpdated { model: Model },
    ModelRemoved { name: String },
}

/// The catalog as the events built it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    pub models: BTreeMap<String, Model>,
}

impl Catalog {
    /// The canonical model a name or alias refers to.
    pub fn resolve(&self, name: &str) -> Option<&Model> {
        self.models.get(name).or_else(|| {
            self.models
                .values()
                .find(|m| m.aliases.iter().any(|a| a == name))
        })
    }

    pub fn decide(&self, command: CatalogCommand) -> Result<Vec<CatalogEvent>, Rejection> {
        let mut next = self.clone();
        let event = match command {
            CatalogCommand::ApplyModels(models) => {
                let mut names = BTreeSet::new();
                let mut events = Vec::new();
                for model in models {
                    refuse_unhonoured(&model)?;
                    if !names.insert(model.name.clone()) {
                        return Err(Rejection::invalid(format!(
                            "model {} is listed twice",
                            model.name
                        )));
                    }
                    let event = match self.models.get(&model.name) {
                        Some(current) if *current == model => continue,
                        Some(_) => CatalogEvent::ModelUpdated { model },
                        None => CatalogEvent::ModelAdded { model },
                    };
                    next.evolve(&event);
                    events.push(event);
                }
                next.validate()?;
                return Ok(events);
            }
            CatalogCommand::AddModel(model) => {
                refuse_unhonoured(&model)?;
                if self.models.contains_key(&model.name) {
                    return Err(Rejection::conflict(format!(
                        "model {} already exists; update it instead",
                        model.name
                    )));
                }
                CatalogEvent::ModelAdded { model }
            }
            CatalogCommand::UpdateModel(model) => {
                refuse_unhonoured(&model)?;
                match self.models.get(&model.name) {
                    None => {
                        return Err(Rejection::not_found(format!(
                            "no model named {}",
                            model.name
                        )));
                    }
                    Some(current) if *current == model => return Ok(Vec::new()),
                    Some(_) => CatalogEvent::ModelUpdated { model },
                }
            }
            CatalogCommand::RemoveModel { name } => {
                if !self.models.contains_key(&name) {
                    return Err(Rejection::not_found(format!("no model named {name}")));
                }
                CatalogEvent::ModelRemoved { name }
            }
        };
        next.evolve(&event);
        next.validate()?;
        Ok(vec![event])
    }

    pub fn evolve(&mut self, event: &CatalogEvent) {
        match event {
            CatalogEvent::ModelAdded { model } | CatalogEvent::ModelUpdated { model } => {
                self.models.insert(model.name.clone(), model.clone());
            }
            CatalogEvent::ModelRemoved { name } => {
                self.models.remove(name);
            }
        }
    }

    /// Every rule at once, over the whole catalog.
    pub fn validate(&self) -> Result<(), Rejection> {
        let mut owner: HashMap<&str, &str> = HashMap::new();
        for m in self.models.values() {
            validate_model(m)?;
            owner.insert(&m.name, &m.name);
        }
        for m in self.models.values() {
            for a in &m.aliases {
                if let Some(other) = owner.insert(a, &m.name) {
                    return Err(Rejection::invalid(if other == a && a == &m.name {
                        format!("model {a} names itself as an alias: remove it from its aliases")
                    } else if other == a {
                        format!("alias {a} of {} is the name of another model", m.name)
                    } else {
                        format!("alias {a} is claimed by both {other} and {}", m.name)
                    }));
                }
            }
        }
        // Fallbacks resolve to canonical names and form no cycle.
        let mut edges: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for m in self.models.values() {
            for f in &m.fallbacks {
                let Some(&target) = owner.get(f.as_str()) else {
                    return Err(Rejection::invalid(format!(
                        "model {}: fallback {f} is not a model or alias in the catalog",
                        m.name
                    )));
                };
                if target == m.name {
                    return Err(Rejection::invalid(format!(
                        "model {} falls back to itself",
                        m.name
                    )));
                }
                edges.entry(&m.name).or_default().push(target);
            }
        }
        if let Some(cycle) = find_cycle(&edges) {
            return Err(Rejection::invalid(format!(
                "fallbacks form a cycle: {}",
                cycle.join(" → ")
            )));
        }
        Ok(())
    }
}

fn find_cycle<'a>(edges: &BTreeMap<&'a str, Vec<&'a str>>) -> Option<Vec<&'a str>> {
    fn visit<'a>(
        n: &'a str,
        edges: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<&'a str>> {
        if let Some(i) = path.iter().position(|p| *p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n);
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n);
        for next in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n);
        None
    }
    let mut done = BTreeSet::new();
    for n in edges.keys() {
        if let Some(c) = visit(n, edges, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

const MAX_CONTEXT: u32 = 10_000_000;
const MAX_DISK_GB: u32 = 1_000_000;
const MAX_MEMORY_MB: u64 = 64 * 1024 * 1024;

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-:/@".contains(c))
}

/// What a model given now may not carry: a field the log's format keeps
/// (the original product named it, and older logs may hold it) that
/// nothing acts on, or a value older versions took and passed over.
/// Refused here rather than in [`Catalog::validate`], so that a catalog
/// already holding one still takes other changes (a leader taking office
/// applies its file to it).
fn refuse_unhonoured(m: &Model) -> Result<(), Rejection> {
    let bad = |why: String| Err(Rejection::invalid(format!("model {}: {why}", m.name)));
    if let Some(p) = &m.routing_profile {
        return bad(format!(
            "routing_profile {p:?} is not supported: every model is routed alike (by load, session and prefix); remove it"
        ));
    }
    // Only a download is checked: a hub id or a path a node already holds
    // is not fetched, so a checksum there would be passed over.
    let fetched = ["hf:", "http://", "https://", "mirror:"]
        .iter()
        .any(|p| m.source.starts_with(p));
    if m.checksum.is_some() && !fetched {
        return bad(format!(
            "checksum applies to a source that is downloaded (hf:, http(s)://, mirror:), not {:?}",
            m.source
        ));
    }
    if m.scaling.max == 0 {
        return bad("scaling max 0 could never serve it; remove the model instead".into());
    }
    if let Some(idle) = m.scaling.idle_timeout_s
        && m.scaling.min == m.scaling.max
    {
        return bad(format!(
            "scaling idle_timeout_s {idle} would never act: it stops an on-demand model (min 0) or drains replicas added under load (max above min), and min = max = {} has neither; remove it",
            m.scaling.min
        ));
    }
    Ok(())
}

fn validate_model(m: &Model) -> Result<(), Rejection> {
    let bad = |why: String| Err(Rejection::invalid(format!("model {}: {why}", m.name)));
    if !valid_name(&m.name) {
        return Err(Rejection::invalid(format!(
            "model name {:?} must be 1 to 128 of letters, digits and . _ - : / @",
            m.name
        )));
    }
    for a in &m.aliases {
        if !valid_name(a) {
            return bad(format!("alias {a:?} is not a valid name"));
        }
    }
    if let Some(c) = &m.checksum {
        let hex = c.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return bad(format!("checksum {c:?} must be sha256: and 64 hex digits"));
        }
    }
    if let Some(rest) = m.source.strip_prefix("mirror:") {
        // As the mirror names its files; anything else could never be
        // fetched, and a node would be the first to say so.
        let name = |s: &str| {
            !s.is_empty()
                && s.len() <= 128
                && s.as_bytes()[0].is_ascii_alphanumeric()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        };
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() != 3 || !parts.iter().all(|p| name(p)) {
            return bad(format!(
                "source {:?}: a mirror source is mirror:<model>/<version>/<file>, each of letters, digits and . _ -, starting with a letter or digit",
                m.source
            ));
        }
    }
    if m.scaling.min > m.scaling.max {
        return bad(format!(
            "scaling min {} exceeds max {}",
            m.scaling.min, m.scaling.max
        ));
    }
    if let Some(c) = m.context_length
        && (c == 0 || c > MAX_CONTEXT)
    {
        return bad(format!("context length {c} is outside 1..={MAX_CONTEXT}"));
    }
    let mut names = BTreeSet::new();
    for p in &m.profiles {
        let bad = |why: String| {
            Err(Rejection::invalid(format!(
                "model {} profile {}: {why}",
                m.name, p.name
            )))
        };
        if !valid_name(&p.name) {
            return bad("the profile needs a name of letters, digits and . _ - : / @".into());
        }
        if !names.insert(&p.name) {
            return bad("two profiles share this name".into());
        }
        if p.tp == 0 || p.pp == 0 || p.nodes == 0 {
            return bad("tp, pp and nodes must each be at least 1".into());
        }
        match &p.gpu_class {
            None => {
                if !p.engine.serves_on_cpu() {
                    return bad(format!(
                        "{} cannot serve on a CPU; give the profile a gpu_class",
                        p.engine.name()
                    ));
                }
                if p.gpus_per_node != 0 {
                    return bad("a CPU profile (no gpu_class) cannot ask for GPUs".into());
                }
                // One process on one node: the agent refused more at every
                // placement, for ever, after the catalog took it.
                if p.pp > 1 || p.nodes > 1 {
                    return bad(format!(
                        "a CPU profile (no gpu_class) runs on one node in one stage: pp {} and nodes {} must be 1",
                        p.pp, p.nodes
                    ));
                }
                if p.tp > 1 && p.engine == Engine::Sim {
                    return bad(format!(
                        "the sim engine splits nothing on a CPU: tp {} would be ignored; leave it out",
                        p.tp
                    ));
                }
            }
            Some(class) => {
                if class.trim().is_empty() {
                    return bad("gpu_class is empty".into());
                }
                let gpus = u64::from(p.nodes) * u64::from(p.gpus_per_node);
                let ranks = u64::from(p.tp) * u64::from(p.pp);
                if gpus != ranks {
                    return bad(format!(
                        "nodes × gpus_per_node = {} × {} = {gpus}, but tp × pp = {} × {} = {ranks}",
                        p.nodes, p.gpus_per_node, p.tp, p.pp
                    ));
                }
            }
        }
        // As the agent's llama.cpp adapter refuses them, at start rather
        // than at every placement.
        if p.engine == Engine::Llamacpp && (p.tp > 1 || p.nodes > 1) {
            return bad(format!(
                "llamacpp runs on one node without tensor parallelism: tp {} and nodes {} must be 1 (vllm or sglang do more)",
                p.tp, p.nodes
            ));
        }
        if p.min_disk_gb > MAX_DISK_GB {
            return bad(format!(
                "min_disk_gb {} is not a plausible size",
                p.min_disk_gb
            ));
        }
        if p.memory_mb > MAX_MEMORY_MB {
            return bad(format!("memory_mb {} is not a plausible size", p.memory_mb));
        }
        if p.weight == 0 {
            return bad("weight must be at least 1".into());
        }
        // The agent read 0 as "no limit": a start that hangs was waited
        // on for ever, where the setting reads as "fail at once".
        if p.startup_timeout_s == Some(0) {
            return bad(
                "startup_timeout_s 0: give the seconds a start may take (leave it out for 600)"
                    .into(),
            );
        }
    }
    Ok(())
}
