//! InfiniBand (and RoCE) adapters from sysfs, `/sys/class/infiniband`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Port {
    pub num: u32,
    pub state: String,
    pub phys_state: String,
    pub rate_gbps: u32,
    /// `InfiniBand`, or `Ethernet` for RoCE.
    pub link_layer: String,
    /// Only a hint: OpenSM uses fe80:: on every fabric, so membership is
    /// always configured, never inferred.
    pub gid_prefix: String,
    pub lid: u32,
    pub sm_lid: u32,
}

impl Port {
    pub fn active(&self) -> bool {
        self.state.eq_ignore_ascii_case("ACTIVE")
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hca {
    pub name: String,
    pub ports: Vec<Port>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pci_addr: String,
    pub numa_node: i32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub firmware_version: String,
}

impl Hca {
    pub fn active_ports(&self) -> Vec<&Port> {
        self.ports.iter().filter(|p| p.active()).collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IbError {
    #[error("reading {root}: {source}")]
    Root {
        root: String,
        #[source]
        source: std::io::Error,
    },
}

/// Every adapter under `root` (default `/sys/class/infiniband`), by name.
/// No root means no fabric: a single-node island, not an error. An adapter
/// that cannot be read is skipped so that it does not hide the others.
pub fn discover(root: Option<&Path>) -> Result<Vec<Hca>, IbError> {
    let root = root.map_or_else(|| PathBuf::from("/sys/class/infiniband"), Path::to_path_buf);
    let entries = match std::fs::read_dir(&root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(IbError::Root {
                root: root.display().to_string(),
                source,
            });
        }
    };
    let mut hcas: Vec<Hca> = entries
        .filter_map(Result::ok)
        .filter_map(|e| read_hca(&e.path(), &e.file_name().to_string_lossy()).ok())
        .collect();
    hcas.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(hcas)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn read_hca(dir: &Path, name: &str) -> Result<Hca, String> {
    let mut hca = Hca {
        name: name.to_owned(),
        numa_node: -1,
        firmware_version: read(&dir.join("fw_ver")),
        ..Hca::default()
    };
    if let Ok(target) = std::fs::canonicalize(dir.join("device")) {
        hca.pci_addr = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Ok(n) = read(&target.join("numa_node")).parse() {
            hca.numa_node = n;
        }
    }
    let ports =
        std::fs::read_dir(dir.join("ports")).map_err(|e| format!("{name}: no ports: {e}"))?;
    for p in ports.filter_map(Result::ok) {
        let Ok(num) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let d = p.path();
        hca.ports.push(Port {
            num,
            state: parse_enumerated_state(&read(&d.join("state"))),
            phys_state: parse_enumerated_state(&read(&d.join("phys_state"))),
            rate_gbps: parse_rate(&read(&d.join("rate"))),
            link_layer: read(&d.join("link_layer")),
            gid_prefix: parse_gid_prefix(&read(&d.join("gids").join("0"))),
            lid: parse_maybe_hex(&read(&d.join("lid"))),
            sm_lid: parse_maybe_hex(&read(&d.join("sm_lid"))),
        });
    }
    hca.ports.sort_by_key(|p| p.num);
    Ok(hca)
}

/// `4: ACTIVE` → `ACTIVE`; text without a colon is returned as it is.
pub fn parse_enumerated_state(s: &str) -> String {
    match s.split_once(':') {
        Some((_, rest)) => rest.trim().to_owned(),
        None => s.to_owned(),
    }
}

/// `200 Gb/sec (4X HDR)` → 200; the first field, truncated; else 0.
pub fn parse_rate(s: &str) -> u32 {
    s.split_whitespace()
        .next()
        .and_then(|f| f.parse::<f64>().ok())
        .map_or(0, |r| r as u32)
}

/// `0x1a` → 26, `26` → 26; failure or empty → 0.
pub fn parse_maybe_hex(s: &str) -> u32 {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).unwrap_or(0),
        None => s.parse().unwrap_or(0),
    }
}

/// The first four groups of a GID, lowercased; "" with fewer.
pub fn parse_gid_prefix(s: &str) -> String {
    let lower = s.to_lowercase();
    let groups: Vec<&str> = lower.split(':').collect();
    if groups.len() < 4 {
        return String::new();
    }
    groups[..4].join(":")
}
