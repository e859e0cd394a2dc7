//! Engine command lines: pure functions from a shard's spec to the
//! processes that run it. Nothing here starts a process (the supervisor
//! does), so every argument and variable is testable as data.

pub mod check;
pub mod llamacpp;
pub mod probe;
mod sglang;
mod sim;
mod vllm;

use std::collections::BTreeMap;
use std::path::PathBuf;

pub use llamacpp::{LlamaCpp, gguf_in as llamacpp_gguf_in};
pub use probe::Probe;
pub use sglang::Sglang;
pub use sim::Sim;
pub use vllm::{LaunchMode, Vllm};

/// The parts of a catalog profile a command is built from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    pub engine: String,
    pub tp: u32,
    pub pp: u32,
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// Passed untouched, always last.
    pub args: Vec<String>,
    /// Overrides generated variables.
    pub env: BTreeMap<String, String>,
    pub model_path: String,
    pub served_model_name: String,
    /// The context the engine is started with, in tokens; 0 leaves the
    /// engine's own.
    pub context_length: u32,
}

/// One rank of a replica, as placed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardSpec {
    pub replica_id: String,
    pub shard_id: String,
    /// 0 is the leader.
    pub rank: u32,
    pub nnodes: u32,
    /// The dist-init endpoint, always on the management network: NCCL
    /// bootstraps over TCP, then moves to RDMA.
    pub leader_addr: String,
    pub leader_port: u16,
    pub gpu_indices: Vec<u32>,
    /// The chosen fabric's adapters only.
    pub hcas: Vec<String>,
    pub mgmt_interface: String,
    pub http_port: u16,
    pub profile: Profile,
    /// The address engines listen on; empty means every interface.
    pub bind_addr: String,
}

impl ShardSpec {
    pub fn leader(&self) -> bool {
        self.rank == 0
    }

    /// Where the engine's HTTP server binds.
    pub fn host(&self) -> &str {
        if self.bind_addr.is_empty() {
            "0.0.0.0"
        } else {
            &self.bind_addr
        }
    }

    /// The leader's rendezvous address.
    fn dist_init(&self) -> String {
        host_port(&self.leader_addr, self.leader_port)
    }
}

/// `host:port`, an IPv6 host bracketed (`2001:db8::5:8000` names no
/// port): what a socket address, a URL or a rendezvous flag takes.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A process to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// Log label.
    pub name: String,
    pub path: PathBuf,
    pub args: Vec<String>,
    /// The variables llmgw sets, over the process environment.
    pub env: BTreeMap<String, String>,
    /// Hold the next command until the leader's port accepts TCP.
    pub wait_for_leader_port: bool,
}

impl Command {
    /// The complete environment: `base` overlaid with ours, as `K=V` sorted
    /// as whole strings, for reproducible logs.
    pub fn materialize_env(&self, base: impl IntoIterator<Item = (String, String)>) -> Vec<String> {
        let mut all: BTreeMap<String, String> = base.into_iter().collect();
        all.extend(self.env.clone());
        let mut out: Vec<String> = all.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.sort();
        out
    }
}

/// A GPU as validation sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    /// "9.0".
    pub compute_capability: String,
    pub memory_total_mb: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EngineError(pub String);

pub trait Engine: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &'static str;
    fn validate(&self, p: &Profile, gpus: &[GpuInfo]) -> Result<(), EngineError>;
    /// In start order; all but the last are sidecars kept alive for the
    /// shard's life; the last one's exit is the shard's.
    fn commands(&self, s: &ShardSpec) -> Result<Vec<Command>, EngineError>;
    /// Whether this rank answers the OpenAI API (only those are health-checked).
    fn serves_http(&self, s: &ShardSpec) -> bool;
    fn health_path(&self) -> &'static str {
        "/health"
    }
    fn metrics_path(&self) -> &'static str {
        "/metrics"
    }
    /// How to tell whether this node has the engine; None for engines
    /// that are always here (the sim engine is llmgw itself).
    fn probe(&self) -> Option<Probe> {
        None
    }
    /// A build the provisioner installed and saw run, `(binary,
    /// version)`, or None when it no longer is; false for an engine the
    /// agent does not install.
    fn use_installed(&self, _installed: Option<(PathBuf, String)>) -> bool {
        false
    }
}

/// The variables every engine gets.
pub(crate) fn base_env(s: &ShardSpec) -> BTreeMap<String, String> {
    let join = |v: &[String]| v.join(",");
    let mut env = BTreeMap::new();
    // Always set, empty without GPUs: it pins a shard to its cards.
    let gpus: Vec<String> = s.gpu_indices.iter().map(u32::to_string).collect();
    env.insert("CUDA_VISIBLE_DEVICES".into(), join(&gpus));
    if s.hcas.is_empty() {
        // NCCL stops waiting for a fabric.
        env.insert("NCCL_IB_DISABLE".into(), "1".into());
    } else {
        // Only the chosen fabric: an adapter on another makes the job hang.
        env.insert("NCCL_IB_HCA".into(), join(&s.hcas));
        env.insert("NCCL_IB_DISABLE".into(), "0".into());
    }
    if !s.mgmt_interface.is_empty() {
        // Pins bootstrap; otherwise NCCL probes IB-over-IP that cannot
        // route between fabrics.
        env.insert("NCCL_SOCKET_IFNAME".into(), s.mgmt_interface.clone());
        env.insert("GLOO_SOCKET_IFNAME".into(), s.mgmt_interface.clone());
    }
    env.extend(s.profile.env.clone());
    env
}

/// The checks every engine makes, first failure first.
pub(crate) fn validate_common(p: &Profile, gpus: &[GpuInfo]) -> Result<(), EngineError> {
    let err = |m: String| Err(EngineError(format!("profile {:?}: {m}", p.name)));
    if p.model_path.is_empty() {
        return err("model path is empty".into());
    }
    if p.tp == 0 {
        return err("tensor parallel degree must be positive".into());
    }
    if p.nodes > 1 && p.gpus_per_node == 0 {
        return err(format!(
            "gpus_per_node is required for a {}-node profile",
            p.nodes
        ));
    }
    let per_node = if p.gpus_per_node == 0 {
        p.tp
    } else {
        p.gpus_per_node
    };
    let (nodes, pp) = (p.nodes.max(1), p.pp.max(1));
    // In u64: absurd figures are refused, not overflowed.
    if u64::from(per_node) * u64::from(nodes) != u64::from(p.tp) * u64::from(pp) {
        return err(format!(
            "{nodes} nodes x {per_node} GPUs does not match TP {} x PP {pp}",
            p.tp
        ));
    }
    if !gpus.is_empty() && (gpus.len() as u32) < per_node {
        return err(format!(
            "needs {per_node} GPUs per node, node has {}",
            gpus.len()
        ));
    }
    if let Some(other) = gpus.iter().find(|g| g.name != gpus[0].name) {
        return err(format!(
            "GPUs are not uniform ({:?} and {:?}); a tensor-parallel group may not mix GPU types",
            gpus[0].name, other.name
        ));
    }
    Ok(())
}

pub(crate) fn require_compute_capability(
    p: &Profile,
    gpus: &[GpuInfo],
    min: f64,
    why: &str,
) -> Result<(), EngineError> {
    for g in gpus {
        // An unreadable figure does not block.
        let Ok(cap) = g.compute_capability.parse::<f64>() else {
            continue;
        };
        if cap < min {
            return Err(EngineError(format!(
                "profile {:?}: {why} needs compute capability {min:.1}, GPU {} ({}) has {cap:.1}",
                p.name, g.index, g.name
            )));
        }
    }
    Ok(())
}

/// vLLM's and SGLang's checks: the common ones, then FP8 quantization only
/// on compute capability 8.9 or newer (older GPUs refuse it, or silently
/// fall back).
pub(crate) fn validate_gpu_engine(p: &Profile, gpus: &[GpuInfo]) -> Result<(), EngineError> {
    validate_common(p, gpus)?;
    if quantization_of(&p.args) == "fp8" {
        require_compute_capability(p, gpus, 8.9, "fp8 quantization")?;
    }
    Ok(())
}

/// The value of the first `--quantization v` or `--quantization=v`.
pub(crate) fn quantization_of(args: &[String]) -> String {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--quantization" {
            return it.next().cloned().unwrap_or_default();
        }
        if let Some(v) = a.strip_prefix("--quantization=") {
            return v.to_owned();
        }
    }
    String::new()
}

/// The catalog's context length as `flag N`, unless the profile's own
/// args set it (they are passed last and would win anyway).
fn context_args(p: &Profile, names: &[&str]) -> Vec<String> {
    if p.context_length == 0 || has_flag(&p.args, names) {
        return Vec::new();
    }
    vec![names[0].to_owned(), p.context_length.to_string()]
}

/// An argument equal to one of `names` or starting with `name=`.
pub(crate) fn has_flag(args: &[String], names: &[&str]) -> bool {
    args.iter().any(|a| {
        names
            .iter()
            .any(|n| a == n || a.starts_with(&format!("{n}=")))
    })
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// The engines by name.
#[derive(Debug)]
pub struct Registry {
    engines: BTreeMap<&'static str, Box<dyn Engine>>,
}

impl Registry {
    pub fn new(vllm: Vllm, sglang: Sglang, llamacpp: LlamaCpp, sim: Sim) -> Self {
        let mut r = Registry {
            engines: BTreeMap::new(),
        };
        for e in [
            Box::new(vllm) as Box<dyn Engine>,
            Box::new(sglang),
            Box::new(llamacpp),
            Box::new(sim),
        ] {
            r.add(e);
        }
        r
    }

    /// Replaces an engine of the same name.
    pub fn add(&mut self, e: Box<dyn Engine>) {
        self.engines.insert(e.name(), e);
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.engines.keys().copied().collect()
    }

    /// Hands a provisioned build to its engine; false for an unknown
    /// engine or one that takes none.
    pub fn use_installed(&self, name: &str, installed: Option<(PathBuf, String)>) -> bool {
        self.engines
            .get(name)
            .is_some_and(|e| e.use_installed(installed))
    }

    pub fn get(&self, name: &str) -> Result<&dyn Engine, EngineError> {
        self.engines.get(name).map(|e| e.as_ref()).ok_or_else(|| {
            EngineError(format!(
                "unknown engine {name:?} (have {})",
                self.names().join(", ")
            ))
        })
    }
}
