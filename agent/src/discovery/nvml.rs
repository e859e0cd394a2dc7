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
    let nvml = Nvml::init().map_err(e("nvml init"))?;
    let driver = nvml.sys_driver_version().unwrap_or_default();
    let cuda = nvml
        .sys_cuda_driver_version()
        .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
        .unwrap_or_default();
    let count = nvml.device_count().map_err(e("nvml device count"))?;
    let mut gpus = Vec::new();
    // Each card's bus id, and the bus ids its active links reach.
    let mut links: Vec<(String, Vec<String>)> = Vec::new();
    for i in 0..count {
        let d = nvml
            .device_by_index(i)
            .map_err(|err| NvmlError(format!("nvml device {i}: {err}")))?;
        // Memory is what a GPU's class and health are made of. An NVML
        // without the call (an old driver) is not usable here, and
        // nvidia-smi answers instead; a card that fails to answer it is
        // kept, with the failure as a problem. Other figures that cannot
        // be read are left empty.
        let mut unreadable = Vec::new();
        let (memory_total_mb, memory_used_mb) = match d.memory_info() {
            Ok(m) => (m.total / (1024 * 1024), m.used / (1024 * 1024)),
            Err(
                err @ (nvml_wrapper::error::NvmlError::FailedToLoadSymbol(_)
                | nvml_wrapper::error::NvmlError::FunctionNotFound
                | nvml_wrapper::error::NvmlError::NotSupported),
            ) => return Err(NvmlError(format!("nvml device {i} memory: {err}"))),
            Err(err) => {
                unreadable.push(format!("memory unreadable: {err}"));
                (0, 0)
            }
        };
        let bus_id = d.pci_info().map(|p| p.bus_id).unwrap_or_default();
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
        links.push((bus_id.clone(), peers));
        gpus.push(
            Gpu {
                index: i,
                uuid: d.uuid().unwrap_or_default(),
                name: d.name().unwrap_or_default(),
                memory_total_mb,
                memory_used_mb,
                utilization_percent: d.utilization_rates().map_or(0, |u| u64::from(u.gpu)),
                compute_capability: cc
                    .map(|c| format!("{}.{}", c.major, c.minor))
                    .unwrap_or_default(),
                numa_node: d.numa_node_id().map_or(-1, |n| n as i32),
                pci_bus_id: bus_id,
                driver_version: driver.clone(),
                cuda_version: cuda.clone(),
                nvlink_peers: Vec::new(),
                health: Health {
                    ecc_errors: ecc,
                    temperature_c: d.temperature(TemperatureSensor::Gpu).map_or(0, u64::from),
                    unreadable,
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

/// A PCI bus id in one spelling whatever its source: lowercase, the PCI
/// domain's leading zeros dropped (NVML writes `00000000:1B:00.0`, sysfs
/// `0000:1b:00.0`; both are `1b:00.0`, and domain 1 is `1:1b:00.0`).
pub fn normalize_bus_id(bus: &str) -> String {
    let b = bus.trim().to_lowercase();
    let b = match b.find(':') {
        Some(i) if i > 0 => format!("{}{}", b[..i].trim_start_matches('0'), &b[i..]),
        _ => b,
    };
    b.strip_prefix(':').map_or(b.clone(), str::to_owned)
}

/// NVLink peers as GPU indices, from each card's bus id and the bus ids its
/// links reach, in the order the links were read. Links to a switch or to
/// a card outside this machine's list are not peers; a peer reached by
/// several links counts once.
pub fn peer_indices(links: &[(String, Vec<String>)]) -> Vec<Vec<u32>> {
    let buses: Vec<String> = links.iter().map(|(b, _)| normalize_bus_id(b)).collect();
    links
        .iter()
        .enumerate()
        .map(|(me, (_, remotes))| {
            let mut peers: Vec<u32> = Vec::new();
            for r in remotes {
                let r = normalize_bus_id(r);
                if let Some(i) = buses.iter().position(|b| *b == r)
                    && i != me
                    && !peers.contains(&(i as u32))
                {
                    peers.push(i as u32);
                }
            }
            peers
        })
        .collect()
}
