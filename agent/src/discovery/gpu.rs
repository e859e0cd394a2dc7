//! GPUs as discovered, their class and their health.

use serde::{Deserialize, Serialize};

/// More resident memory than this, on a GPU nothing of ours runs on, is
/// another process's: up to it is driver overhead.
pub const RESIDENT_MEMORY_TOLERANCE_MB: u64 = 512;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub ecc_errors: u64,
    pub temperature_c: u64,
    /// What the driver could not read of the card (it stays out of
    /// placement while it cannot be judged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl Health {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_mb: u64,
    pub memory_used_mb: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub utilization_percent: u64,
    /// "9.0"; FP8 needs 8.9 or higher.
    pub compute_capability: String,
    pub numa_node: i32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pci_bus_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub driver_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cuda_version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlink_peers: Vec<u32>,
    pub health: Health,
    /// Derived from name and memory; see [`class`].
    pub class: String,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Gpu {
    /// Fills in the derived fields: class and health problems.
    pub fn finish(mut self) -> Self {
        self.class = class(&self.name, self.memory_total_mb);
        self.health.problems = problems(&self.health, self.memory_used_mb);
        self
    }

    /// Its problems knowing whether one of our own engines runs on it:
    /// then the memory in use is ours, not another process's.
    pub fn problems_given(&self, ours: bool) -> Vec<String> {
        problems(&self.health, if ours { 0 } else { self.memory_used_mb })
    }
}

/// `{model}-{GiB}g`, e.g. `h100-80g`. Two cards share a tensor-parallel
/// group only with the same class. The memory is the driver's figure
/// rounded half away from zero: an L40S reports 44.99 GiB and is `l40s-45g`,
/// whatever its "48GB" (decimal) label says.
pub fn class(name: &str, memory_total_mb: u64) -> String {
    let lower = name.to_lowercase();
    let stripped = lower.strip_prefix("nvidia ").unwrap_or(&lower);
    let stripped = stripped.strip_prefix("tesla ").unwrap_or(stripped);
    let model = stripped
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .find(|t| {
            t.chars().any(|c| c.is_ascii_digit())
                && !t.ends_with("gb")
                && !matches!(*t, "sxm4" | "sxm5" | "pcie")
        })
        .map(str::to_owned)
        .unwrap_or_else(|| {
            let mut out = String::new();
            let mut gap = false;
            for c in stripped.chars() {
                if c.is_ascii_alphanumeric() {
                    if gap && !out.is_empty() {
                        out.push('-');
                    }
                    out.push(c);
                    gap = false;
                } else {
                    gap = true;
                }
            }
            out
        });
    let gib = (memory_total_mb as f64 / 1024.0).round() as u64;
    format!("{model}-{gib}g")
}

/// What keeps a GPU out of placement, in a fixed order.
pub fn problems(health: &Health, memory_used_mb: u64) -> Vec<String> {
    let mut p: Vec<String> = health.unreadable.clone();
    if health.ecc_errors > 0 {
        p.push(format!("{} uncorrected ECC errors", health.ecc_errors));
    }
    if memory_used_mb > RESIDENT_MEMORY_TOLERANCE_MB {
        p.push(format!(
            "{memory_used_mb} MiB already allocated by another process"
        ));
    }
    p
}

/// The distinct classes, sorted.
pub fn classes(gpus: &[Gpu]) -> Vec<String> {
    let mut c: Vec<String> = gpus.iter().map(|g| g.class.clone()).collect();
    c.sort();
    c.dedup();
    c
}
