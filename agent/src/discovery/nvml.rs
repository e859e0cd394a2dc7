//! GPUs through NVML, loaded at run time: the same binary runs on machines
//! without a driver, where loading fails and discovery falls back to
//! nvidia-smi. NVML adds what nvidia-smi's CSV does not give: the NVLink
//! peers of each card, which keep a tensor-parallel group in one domain.

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};

use super::gpu::{Gpu, Health};

/// NVML_NVLINK_MAX_LINKS: links per card the API can describe.
const MAX_LINKS: u32 = 18;

/// Why NVML gave no inventory (the caller falls back, loudly).
#[derive(Debug, thiserror::Error)]
#[error("NVML: {0}")]
pub struct NvmlError(String);

fn e(what: &str) -> impl Fn(nvml_wrapper::error::NvmlError) -> NvmlError + '_ {
    move |err| NvmlError(format!("{what}: {err}"))
}

/// Every GPU NVML sees, with NVLink peers as GPU indices.
pub fn discover() -> Result<Vec<Gpu>, NvmlError> {
    let nvml = Nvml::init().map_err(e("loading libnvidia-ml"))?;
    let driver = nvml.sys_driver_version().unwrap_or_default();
    let cuda = nvml
        .sys_cuda_driver_version()
        .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
        .unwrap_or_default();
    let count = nvml.device_count().map_err(e("counting devices"))?;
    let mut gpus = Vec::new();
    // Each card's bus id, and the bus ids its active links reach.
    let mut links: Vec<(String, Vec<String>)> = Vec::new();
    for i in 0..count {
        let d = nvml.device_by_index(i).map_err(e("opening a device"))?;
        let memory = d.memory_info().map_err(e("reading memory"))?;
        let pci = d.pci_info().map_err(e("reading the PCI address"))?;
        let cc = d.cuda_compute_capability().ok();
        // Optional figures must not break discovery.
        let ecc = d
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .unwrap_or(0);
        let mut peers = Vec::new();
        for link in 0..MAX_LINKS {
            let l = d.link_wrapper_for(link);
            if l.is_active().unwrap_or(false)
                && let Ok(remote) = l.remote_pci_info()
            {
                peers.push(remote.bus_id);
            }
        }
        links.push((pci.bus_id.clone(), peers));
        gpus.push(
            Gpu {
                index: i,
                uuid: d.uuid().unwrap_or_default(),
                name: d.name().unwrap_or_default(),
                memory_total_mb: memory.total / (1024 * 1024),
                memory_used_mb: memory.used / (1024 * 1024),
                utilization_percent: d.utilization_rates().map_or(0, |u| u64::from(u.gpu)),
                compute_capability: cc
                    .map(|c| format!("{}.{}", c.major, c.minor))
                    .unwrap_or_default(),
                numa_node: d.numa_node_id().map_or(-1, |n| n as i32),
                pci_bus_id: pci.bus_id,
                driver_version: driver.clone(),
                cuda_version: cuda.clone(),
                nvlink_peers: Vec::new(),
                health: Health {
                    ecc_errors: ecc,
                    temperature_c: d.temperature(TemperatureSensor::Gpu).map_or(0, u64::from),
                    problems: Vec::new(),
                },
                class: String::new(),
            }
            .finish(),
        );
    }
    for (gpu, peers) in gpus.iter_mut().zip(peer_indices(&links)) {
        gpu.nvlink_peers = peers;
    }
    Ok(gpus)
}

/// NVLink peers as GPU indices, from each card's bus id and the bus ids its
/// links reach. Links to a switch or to a card outside this machine's list
/// are not peers; a peer reached by several links counts once.
pub fn peer_indices(links: &[(String, Vec<String>)]) -> Vec<Vec<u32>> {
    let norm = |b: &str| {
        b.trim()
            .to_lowercase()
            .trim_start_matches("0000")
            .to_owned()
    };
    links
        .iter()
        .enumerate()
        .map(|(me, (_, remotes))| {
            let mut peers: Vec<u32> = remotes
                .iter()
                .filter_map(|r| {
                    links
                        .iter()
                        .position(|(bus, _)| norm(bus) == norm(r))
                        .filter(|i| *i != me)
                        .map(|i| i as u32)
                })
                .collect();
            peers.sort_unstable();
            peers.dedup();
            peers
        })
        .collect()
}
