//! Free disk where the weights go, per filesystem: placement's `min_disk_gb`
//! check reads it. Shared filesystems (NFS, Lustre, …) are flagged, so that
//! their space is not counted as the node's own.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Storage {
    pub path: String,
    /// What a non-root writer can use: the root reserve is excluded.
    pub free_bytes: u64,
    pub total_bytes: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

/// Filesystem magic numbers of network filesystems.
const NETWORK_FS: [u32; 6] = [
    0x6969,      // NFS
    0x0BD0_0BD0, // Lustre
    0x4750_4653, // GPFS
    0x00C3_6400, // CephFS
    0x6573_5546, // FUSE (GlusterFS and others)
    0xFF53_4D42, // SMB/CIFS
];

pub fn is_network_fs(f_type: u32) -> bool {
    NETWORK_FS.contains(&f_type)
}

/// One entry per filesystem among `dirs`, the first configured path naming
/// it. A directory that cannot be read (a mount that has not come back) is
/// unknown, not a full disk, and is left out.
pub fn scan(dirs: &[PathBuf]) -> Vec<Storage> {
    let mut devices = HashSet::new();
    let mut out = Vec::new();
    for dir in dirs.iter().filter(|d| !d.as_os_str().is_empty()) {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        if !devices.insert(meta.dev()) {
            continue;
        }
        let Ok(fs) = rustix::fs::statfs(dir) else {
            continue;
        };
        let block = fs.f_bsize as u64;
        out.push(Storage {
            path: dir.display().to_string(),
            free_bytes: fs.f_bavail.saturating_mul(block),
            total_bytes: fs.f_blocks.saturating_mul(block),
            shared: is_network_fs(fs.f_type as u32),
        });
    }
    out
}
