//! What this machine offers: GPUs, InfiniBand adapters, memory.

pub mod fabric;
pub mod gpu;
pub mod host;
pub mod ib;
pub mod memory;
pub mod nvml;
pub mod smi;
pub mod storage;
pub mod weights;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where discovery looks, so that tests can point it at fixtures.
#[derive(Debug, Clone)]
pub struct Options {
    /// Prefix of /etc, /proc and /sys (`/` on a real machine).
    pub root: PathBuf,
    /// nvidia-smi to run; None looks it up on PATH (absent = CPU node).
    pub nvidia_smi: Option<PathBuf>,
    pub skip_gpus: bool,
    /// Ask NVML first (for NVLink peers); nvidia-smi when it cannot load.
    /// An explicit `nvidia_smi` is a deliberate choice and skips NVML, so
    /// that fixtures are read, never the machine's own cards.
    pub prefer_nvml: bool,
    pub model_dirs: Vec<PathBuf>,
    /// Where fetched weights go: its filesystem is listed first in
    /// `storage` (what `min_disk_gb` is checked against).
    pub cache_dir: Option<PathBuf>,
    /// Fabric name → the adapters configured for it.
    pub fabrics: BTreeMap<String, Vec<String>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            root: PathBuf::from("/"),
            nvidia_smi: None,
            skip_gpus: false,
            prefer_nvml: true,
            model_dirs: Vec::new(),
            cache_dir: None,
            fabrics: BTreeMap::new(),
        }
    }
}

/// What the scheduler sees of this machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    /// `none`, `nvml` or `nvidia-smi`: "no GPUs" apart from "not discovered".
    pub source: String,
    pub gpus: Vec<gpu::Gpu>,
    pub hcas: Vec<ib::Hca>,
    pub host: host::Host,
    /// 0 (omitted) means unknown.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory_total_mb: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<weights::LocalWeights>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage: Vec<storage::Storage>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fabrics: Vec<fabric::FabricCheck>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("gpu discovery: {0}")]
    Gpus(#[from] smi::SmiError),
    #[error("infiniband discovery: {0}")]
    Ib(#[from] ib::IbError),
    #[error("fabric configuration: {0}")]
    Fabric(#[from] fabric::DoubleMembership),
}

/// Takes the inventory. Memory, host, weights and disks come first, so
/// that a later failure (a broken driver, an unreadable sysfs) still leaves
/// them: the inventory so far is returned with the error, and a node whose
/// nvidia-smi fails still reports its RAM and its weights. GPUs that cannot
/// be read stop nothing after them: the adapters and fabrics are still
/// read (a driver not up yet at boot must not take the node's fabrics
/// away too), and the GPUs' error is the one returned.
pub fn discover(o: &Options) -> (Inventory, Option<DiscoveryError>) {
    let mut inv = Inventory {
        source: "none".into(),
        gpus: Vec::new(),
        hcas: Vec::new(),
        host: host::discover(&o.root),
        memory_total_mb: memory::total_mb(&o.root.join("proc/meminfo")),
        weights: weights::scan(&o.model_dirs),
        storage: storage::scan_cache_first(o.cache_dir.as_deref(), &o.model_dirs),
        fabrics: Vec::new(),
    };
    let mut error: Option<DiscoveryError> = None;
    if !o.skip_gpus {
        match gpus(o) {
            Ok((gpus, source)) => {
                inv.gpus = gpus;
                inv.source = source.into();
            }
            Err(e) => error = Some(e.into()),
        }
    }
    match ib::discover(Some(&o.root.join("sys/class/infiniband"))) {
        Ok(hcas) => inv.hcas = hcas,
        Err(e) => return (inv, error.or(Some(e.into()))),
    }
    match fabric::check(&o.fabrics, &inv.hcas) {
        Ok(f) => inv.fabrics = f,
        Err(e) => return (inv, error.or(Some(e.into()))),
    }
    (inv, error)
}

static NVML_FAILURE_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// NVML when asked for and usable, else nvidia-smi. `nvidia-smi` is the
/// source once it was asked, even when it found no card (or is not on
/// PATH): "looked, none here" rather than "not looked".
pub fn gpus(o: &Options) -> Result<(Vec<gpu::Gpu>, &'static str), smi::SmiError> {
    if o.prefer_nvml && o.nvidia_smi.is_none() {
        match nvml::discover() {
            Ok(gpus) => return Ok((gpus, "nvml")),
            // Said once: discovery runs again at every registration, and
            // a CPU node (no driver) would repeat it at each reconnect.
            Err(e) if !NVML_FAILURE_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) => {
                tracing::warn!(
                    error = %e,
                    "NVML discovery failed, falling back to nvidia-smi; NVLink topology will be unavailable"
                );
            }
            Err(e) => tracing::debug!(error = %e, "NVML discovery failed again"),
        }
    }
    Ok((smi::discover(o.nvidia_smi.as_deref())?, "nvidia-smi"))
}
