//! Model weights already on local disk, so placement can prefer the nodes
//! that hold them and skip the disk check.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

const EXTENSIONS: [&str; 5] = ["gguf", "safetensors", "bin", "pt", "pth"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalWeights {
    pub path: String,
    pub size_bytes: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

fn is_weights(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| EXTENSIONS.iter().any(|w| w.eq_ignore_ascii_case(e)))
}

/// Each direct child of each directory that is, or holds, weights. A
/// directory counts only if some file in it has a weight extension (an
/// empty or README-only one is a partial download), and its size is all
/// its files. Symlinks are not followed. Sorted by path.
pub fn scan(dirs: &[PathBuf]) -> Vec<LocalWeights> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for dir in dirs.iter().filter(|d| !d.as_os_str().is_empty()) {
        let Ok(children) = std::fs::read_dir(dir) else {
            continue;
        };
        let shared =
            rustix::fs::statfs(dir).is_ok_and(|fs| super::storage::is_network_fs(fs.f_type as u32));
        for child in children.filter_map(Result::ok) {
            let path = child.path();
            if !seen.insert(path.clone()) {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let found = if meta.is_dir() {
                let (size, any) = walk(&path);
                any.then_some(size)
            } else {
                is_weights(&path).then_some(meta.len())
            };
            if let Some(size_bytes) = found {
                out.push(LocalWeights {
                    path: path.display().to_string(),
                    size_bytes,
                    shared,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

fn walk(dir: &Path) -> (u64, bool) {
    let (mut size, mut any) = (0, false);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, false);
    };
    for e in entries.filter_map(Result::ok) {
        let p = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            let (s, a) = walk(&p);
            size += s;
            any |= a;
        } else {
            size += meta.len();
            any |= is_weights(&p);
        }
    }
    (size, any)
}
