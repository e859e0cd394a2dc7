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
            fabrics: BTreeMap::new(),
        }
    }
}

/// What the scheduler sees of this machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    #[error("discovering GPUs")]
    Gpus(#[from] smi::SmiError),
    #[error("discovering InfiniBand adapters")]
    Ib(#[from] ib::IbError),
    #[error("checking fabrics")]
    Fabric(#[from] fabric::DoubleMembership),
}

/// Takes the inventory. A GPU failure is an error; memory, host and disks
/// are read whatever happens to the GPUs.
pub fn discover(o: &Options) -> Result<Inventory, DiscoveryError> {
    let (gpus, source) = if o.skip_gpus {
        (Vec::new(), "none")
    } else {
        match (o.prefer_nvml && o.nvidia_smi.is_none()).then(nvml::discover) {
            Some(Ok(gpus)) => (gpus, "nvml"),
            other => {
                if let Some(Err(e)) = other {
                    tracing::warn!(error = %e, "NVML is not usable here; asking nvidia-smi (no NVLink peers)");
                }
                let gpus = smi::discover(o.nvidia_smi.as_deref())?;
                let source = if gpus.is_empty() {
                    "none"
                } else {
                    "nvidia-smi"
                };
                (gpus, source)
            }
        }
    };
    let hcas = ib::discover(Some(&o.root.join("sys/class/infiniband")))?;
    let fabrics = fabric::check(&o.fabrics, &hcas)?;
    Ok(Inventory {
        source: source.into(),
        gpus,
        hcas,
        host: host::discover(&o.root),
        memory_total_mb: memory::total_mb(&o.root.join("proc/meminfo")),
        weights: weights::scan(&o.model_dirs),
        storage: storage::scan(&o.model_dirs),
        fabrics,
    })
}
