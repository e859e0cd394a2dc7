//! Which engines this node can run, and their versions. A key present
//! means the node can run the engine (placement reads the key set);
//! `unknown` means present with no readable version.
//!
//! Binaries are looked up, never executed: an engine's "binary" is often a
//! wrapper script, and running it at agent start could start a server.
//! Only SGLang is asked, by importing the module in its Python.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Registry;

/// Present, version unreadable.
pub const UNKNOWN: &str = "unknown";
/// How long one probe may take (an import of a large Python package).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(8);

/// How an engine is looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Present when this executable is (on PATH, for a bare name).
    Binary(PathBuf),
    /// Present when this command succeeds; its output holds the version.
    Run { program: PathBuf, args: Vec<String> },
}

/// An executable file at `p`, or on PATH for a bare name.
pub fn find_executable(p: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |c: &Path| {
        std::fs::metadata(c).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if p.components().count() > 1 {
        return runnable(p).then(|| p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(p))
        .find(|c| runnable(c))
}

/// The first version-looking word of `text` (`0.4.1`, `0.4.post1`), its
/// trailing `,;)` dropped; `unknown` when there is none (a bare number
/// such as a build id is not a version).
pub fn first_version(text: &str) -> String {
    for line in text.lines() {
        let b = line.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let boundary = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
            if boundary && b[i].is_ascii_digit() {
                let mut j = i;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
                if j + 1 < b.len() && b[j] == b'.' && b[j + 1].is_ascii_digit() {
                    let end = line[i..]
                        .find(char::is_whitespace)
                        .map_or(line.len(), |k| i + k);
                    return line[i..end].trim_end_matches([',', ';', ')']).to_owned();
                }
                i = j;
            } else {
                i += 1;
            }
        }
    }
    UNKNOWN.into()
}

/// The version `probe` finds, or None when the engine is not here.
pub async fn run(probe: &Probe, timeout: Duration) -> Option<String> {
    match probe {
        Probe::Binary(bin) => find_executable(bin).map(|_| UNKNOWN.to_owned()),
        Probe::Run { program, args } => {
            let program = find_executable(program)?;
            let child = tokio::process::Command::new(program)
                .args(args)
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output();
            let out = tokio::time::timeout(timeout, child).await.ok()?.ok()?;
            if !out.status.success() {
                return None;
            }
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            Some(first_version(&text))
        }
    }
}

impl Registry {
    /// Every engine this node has, by name, probed concurrently.
    pub async fn probe(&self, timeout: Duration) -> BTreeMap<String, String> {
        let probes = self
            .names()
            .into_iter()
            .filter_map(|n| Some((n, self.get(n).ok()?.probe()?)));
        let found =
            futures_util::future::join_all(probes.map(|(name, p)| async move {
                run(&p, timeout).await.map(|v| (name.to_owned(), v))
            }))
            .await;
        found.into_iter().flatten().collect()
    }
}
