//! Free disk where the weights go, per filesystem: placement's `min_disk_gb`
//! check reads the weights cache's, listed first. Shared filesystems (NFS,
//! Lustre, …) are flagged, so that their space is not counted as the
//! node's own.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
    scan_cache_first(None, dirs)
}

/// As [`scan`], with the filesystem of the weights cache first, named by
/// the cache: fetched weights land there, so it is the room placement's
/// `min_disk_gb` is checked against (the control plane reads the first
/// entry: [`weights_free_gb`]). A cache not made yet (`agent inventory`
/// before the first `agent run`) is measured where it would be made, at
/// its nearest existing parent.
pub fn scan_cache_first(cache: Option<&Path>, dirs: &[PathBuf]) -> Vec<Storage> {
    let mut devices = HashSet::new();
    let mut out = Vec::new();
    if let Some(cache) = cache.filter(|c| !c.as_os_str().is_empty())
        && let Some(at) = nearest_existing(cache)
    {
        measure(&mut devices, &mut out, cache, &at);
    }
    for dir in dirs.iter().filter(|d| !d.as_os_str().is_empty()) {
        measure(&mut devices, &mut out, dir, dir);
    }
    out
}

/// `dir`'s filesystem, measured `at`, named `dir`; nothing when it is
/// listed already or cannot be read.
fn measure(devices: &mut HashSet<u64>, out: &mut Vec<Storage>, dir: &Path, at: &Path) {
    let Ok(meta) = std::fs::metadata(at) else {
        return;
    };
    if !devices.insert(meta.dev()) {
        return;
    }
    let Ok(fs) = rustix::fs::statfs(at) else {
        return;
    };
    let block = fs.f_bsize as u64;
    out.push(Storage {
        path: dir.display().to_string(),
        free_bytes: fs.f_bavail.saturating_mul(block),
        total_bytes: fs.f_blocks.saturating_mul(block),
        shared: is_network_fs(fs.f_type as u32),
    });
}

/// `dir`, or the nearest of its parents that exists.
fn nearest_existing(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .map(|a| {
            if a.as_os_str().is_empty() {
                Path::new(".")
            } else {
                a
            }
        })
        .find(|a| a.exists())
        .map(Path::to_path_buf)
}

/// The free disk the control plane checks `min_disk_gb` against, in GB
/// (10^9 bytes), from what an agent lists: its first filesystem's, the
/// weights cache's; None (no check) when that is a shared filer, whose
/// space is not the node's own, or when none is listed. The control
/// plane's own reading (control/src/convert.rs, `disk_free_gb`) is this
/// rule on the wire's figures; `agent inventory` prints this one.
pub fn weights_free_gb(storage: &[Storage]) -> Option<u64> {
    storage
        .first()
        .filter(|s| !s.shared)
        .map(|s| s.free_bytes / 1_000_000_000)
}
