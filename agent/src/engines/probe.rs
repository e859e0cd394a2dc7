//! Which engines this node can run, and their versions. A key present
//! means the node can run the engine (placement reads the key set);
//! `unknown` means present with no readable version.
//!
//! An engine counts only when it was seen to run, or the agent's
//! configuration names it. A configured binary is looked up, never
//! executed: it is often a wrapper script, and running it at agent start
//! could start a server. One merely found (on PATH, under /opt/llama.cpp)
//! must answer a bounded `--version`, so that a broken or foreign file
//! there is not taken for an engine; a provisioned build was seen to run
//! by the provisioner. SGLang is asked by importing the module in its
//! Python.

use crate::secrets::WithoutSecrets;
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
    /// Installed and seen to run by the provisioner, at this version.
    Seen(String),
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

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Version(String),
    Absent,
    /// It did not answer in time (a cold import on a busy node): not a
    /// reason to think the engine went away.
    TimedOut,
}

/// What `probe` finds of its engine within `timeout`.
pub async fn look(probe: &Probe, timeout: Duration) -> Found {
    match probe {
        Probe::Seen(version) => Found::Version(version.clone()),
        Probe::Binary(bin) => match find_executable(bin) {
            Some(_) => Found::Version(UNKNOWN.to_owned()),
            None => Found::Absent,
        },
        Probe::Run { program, args } => {
            let Some(program) = find_executable(program) else {
                return Found::Absent;
            };
            let run = async {
                // ETXTBSY: the file was just written and a process forked
                // meanwhile still holds it open for writing until its own
                // exec; that passes in moments.
                let mut busy = 0;
                loop {
                    let out = tokio::process::Command::new(&program)
                        .envs_without_secrets()
                        .args(args)
                        .stdin(std::process::Stdio::null())
                        .kill_on_drop(true)
                        .output()
                        .await;
                    match out {
                        Err(e)
                            if e.raw_os_error()
                                == Some(rustix::io::Errno::TXTBSY.raw_os_error())
                                && busy < 10 =>
                        {
                            busy += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        other => return other,
                    }
                }
            };
            let out = match tokio::time::timeout(timeout, run).await {
                Err(_) => return Found::TimedOut,
                Ok(Err(_)) => return Found::Absent,
                Ok(Ok(out)) => out,
            };
            if !out.status.success() {
                return Found::Absent;
            }
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            Found::Version(first_version(&text))
        }
    }
}

impl Registry {
    /// Every engine this node has, by name, probed concurrently.
    pub async fn probe(&self, timeout: Duration) -> BTreeMap<String, String> {
        self.reprobe(timeout, &BTreeMap::new()).await
    }

    /// As `probe`, keeping what `previous` said of an engine whose probe
    /// did not answer in time.
    pub async fn reprobe(
        &self,
        timeout: Duration,
        previous: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let probes = self
            .names()
            .into_iter()
            .filter_map(|n| Some((n, self.get(n).ok()?.probe()?)));
        let found = futures_util::future::join_all(
            probes.map(|(name, p)| async move { (name, look(&p, timeout).await) }),
        )
        .await;
        found
            .into_iter()
            .filter_map(|(name, f)| match f {
                Found::Version(v) => Some((name.to_owned(), v)),
                Found::Absent => None,
                Found::TimedOut => previous.get(name).map(|v| (name.to_owned(), v.clone())),
            })
            .collect()
    }
}
