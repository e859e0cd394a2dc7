//! What the agent knows of each running shard, on disk, so that a restarted
//! agent adopts its engines instead of starting second copies.
//!
//! `<work_dir>/shard-<id>.json` holds the shard's spec, its process groups
//! and the main process's command line. The command line is the
//! fingerprint: pids are reused, so a live pid whose `/proc/<pid>/cmdline`
//! differs is somebody else's process and is never signalled.
//!
//! `<work_dir>/stopped-on-exit.json` names the shards an agent stopped
//! itself on a clean exit, for its next run to tell the control plane
//! (which would otherwise take them for failed).

use std::path::{Path, PathBuf};

use llmgw_api::v1;
use serde::{Deserialize, Serialize};

/// The parts of a StartShard a restarted agent needs: to describe the
/// shard back to the control plane and to judge it ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    pub replica_id: String,
    pub shard_id: String,
    pub rank: i32,
    pub nnodes: i32,
    pub gpu_indices: Vec<i32>,
    pub hcas: Vec<String>,
    pub http_port: i32,
    pub model: String,
    pub profile: String,
    pub engine: String,
    pub served_model_name: String,
    pub pool: String,
    pub fabric: String,
    pub leader_addr: String,
    pub leader_port: i32,
    pub profile_fp: String,
}

impl Spec {
    pub fn of(s: &v1::StartShard) -> Spec {
        let p = s.profile.clone().unwrap_or_default();
        Spec {
            replica_id: s.replica_id.clone(),
            shard_id: s.shard_id.clone(),
            rank: s.rank,
            nnodes: s.nnodes,
            gpu_indices: s.gpu_indices.clone(),
            hcas: s.hcas.clone(),
            http_port: s.http_port,
            model: s.model.clone(),
            profile: p.name,
            engine: p.engine,
            served_model_name: p.served_model_name,
            pool: s.pool.clone(),
            fabric: s.fabric.clone(),
            leader_addr: s.leader_addr.clone(),
            leader_port: s.leader_port,
            profile_fp: s.profile_fp.clone(),
        }
    }

    /// The StartShard this spec came from, as far as it was kept.
    pub fn start(&self) -> v1::StartShard {
        v1::StartShard {
            replica_id: self.replica_id.clone(),
            shard_id: self.shard_id.clone(),
            rank: self.rank,
            nnodes: self.nnodes,
            leader_addr: self.leader_addr.clone(),
            leader_port: self.leader_port,
            gpu_indices: self.gpu_indices.clone(),
            hcas: self.hcas.clone(),
            http_port: self.http_port,
            profile: Some(v1::EngineProfile {
                name: self.profile.clone(),
                engine: self.engine.clone(),
                served_model_name: self.served_model_name.clone(),
                ..v1::EngineProfile::default()
            }),
            pool: self.pool.clone(),
            fabric: self.fabric.clone(),
            profile_fp: self.profile_fp.clone(),
            model: self.model.clone(),
            ..v1::StartShard::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub spec: Spec,
    /// Each command's process group, the main one last.
    pub pids: Vec<u32>,
    /// The main process's argv: the fingerprint.
    pub cmdline: Vec<String>,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
}

/// What a state file found at start-up asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Alive and identified: adopt it.
    Adopt(Box<Record>),
    /// Its processes are gone: forget it.
    Gone(String),
    /// Alive, but its record cannot say what it is: kill it.
    Unidentifiable { shard_id: String, pids: Vec<u32> },
    /// Unreadable, or its pid now belongs to another program: delete the
    /// file and signal nothing.
    Stale(String),
}

#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("shard id {0:?} cannot name a state file")]
    BadId(String),
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub fn path(dir: &Path, shard_id: &str) -> Result<PathBuf, StateFileError> {
    if shard_id.is_empty()
        || shard_id.contains('/')
        || shard_id.contains('\0')
        || shard_id.starts_with('.')
    {
        return Err(StateFileError::BadId(shard_id.to_owned()));
    }
    Ok(dir.join(format!("shard-{shard_id}.json")))
}

/// The shard's output file, beside its state file.
pub fn log_path(dir: &Path, shard_id: &str) -> Result<PathBuf, StateFileError> {
    path(dir, shard_id).map(|p| p.with_extension("log"))
}

/// Written whole to a temporary name and renamed, so a reader never sees
/// half a record.
pub fn write(dir: &Path, record: &Record) -> Result<(), StateFileError> {
    let target = path(dir, &record.spec.shard_id)?;
    let tmp = target.with_extension("json.tmp");
    let io = |source| StateFileError::Io {
        path: target.clone(),
        source,
    };
    let bytes = serde_json::to_vec_pretty(record).map_err(|e| io(std::io::Error::other(e)))?;
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
    }
    std::fs::rename(&tmp, &target).map_err(io)
}

pub fn remove(dir: &Path, shard_id: &str) {
    if let Ok(p) = path(dir, shard_id) {
        let _ = std::fs::remove_file(p);
    }
}

/// The file naming the shards a clean exit stopped.
const STOPPED_ON_EXIT: &str = "stopped-on-exit.json";

/// Written by a clean exit: the shards it stopped, and those an earlier
/// exit stopped that no control plane has heard of yet (none, once none
/// is left, and the file goes).
pub fn write_stopped_on_exit(dir: &Path, shard_ids: &[String]) -> Result<(), StateFileError> {
    let path = dir.join(STOPPED_ON_EXIT);
    if shard_ids.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(StateFileError::Io { path, source: e })
            }
            _ => Ok(()),
        };
    }
    let bytes = serde_json::to_vec(shard_ids).unwrap_or_default();
    std::fs::write(&path, bytes).map_err(|source| StateFileError::Io { path, source })
}

/// The shards the last clean exit stopped. The file stays until a clean
/// exit after a registration replaces it: a run that stops or dies before
/// it registers has told no one (an unreadable file tells nothing: those
/// replicas are then taken for failed, as after a crash).
pub fn read_stopped_on_exit(dir: &Path) -> Vec<String> {
    let path = dir.join(STOPPED_ON_EXIT);
    let Ok(bytes) = std::fs::read(&path) else {
        return Vec::new();
    };
    serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        tracing::warn!(file = %path.display(), error = %e, "unreadable list of shards stopped on exit; ignored");
        Vec::new()
    })
}

/// Deletes the logs of shards that have no state file (their engines are
/// gone) and were last written before `before`, so a node that has run
/// many shards does not keep every engine's log for ever. A live shard's
/// log is never touched: its state file is beside it. Returns the shard
/// ids whose logs went.
pub fn prune_logs(dir: &Path, before: std::time::SystemTime) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut pruned = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(shard_id) = name
            .strip_prefix("shard-")
            .and_then(|n| n.strip_suffix(".log"))
        else {
            continue;
        };
        let live = path(dir, shard_id).is_ok_and(|p| p.exists());
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t < before);
        if !live && old && std::fs::remove_file(entry.path()).is_ok() {
            pruned.push(shard_id.to_owned());
        }
    }
    pruned.sort();
    pruned
}

/// argv of a live process, from `/proc/<pid>/cmdline`.
pub fn cmdline_of(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

fn alive(pid: u32) -> bool {
    rustix::process::Pid::from_raw(pid as i32)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

/// Every state file in `dir`, judged.
pub fn scan(dir: &Path) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_prefix("shard-")
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let record: Option<Record> = std::fs::read(e.path())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let Some(r) = record else {
            found.push(Found::Stale(id.to_owned()));
            continue;
        };
        let Some(&main) = r.pids.last() else {
            found.push(Found::Stale(id.to_owned()));
            continue;
        };
        if !alive(main) {
            found.push(Found::Gone(id.to_owned()));
            continue;
        }
        if cmdline_of(main).as_ref() != Some(&r.cmdline) {
            // The pid was reused by another program.
            found.push(Found::Stale(id.to_owned()));
            continue;
        }
        if r.spec.shard_id != id || r.spec.replica_id.is_empty() || r.spec.engine.is_empty() {
            found.push(Found::Unidentifiable {
                shard_id: id.to_owned(),
                pids: r.pids.clone(),
            });
            continue;
        }
        found.push(Found::Adopt(Box::new(r)));
    }
    found
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    fn aged(path: &std::path::Path, age: Duration) {
        std::fs::write(path, "x").unwrap();
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(SystemTime::now() - age)
            .unwrap();
    }

    /// Only an old log with no state file beside it goes: a live shard's
    /// log stays however old, and so does a recent one.
    #[test]
    fn prune_keeps_live_and_recent_logs() {
        let dir = tempfile::tempdir().unwrap();
        let day = Duration::from_secs(86_400);
        aged(&dir.path().join("shard-gone.log"), 9 * day);
        aged(&dir.path().join("shard-live.log"), 9 * day);
        aged(&dir.path().join("shard-live.json"), 9 * day);
        aged(&dir.path().join("shard-fresh.log"), Duration::ZERO);
        aged(&dir.path().join("notes.log"), 9 * day);
        let pruned = super::prune_logs(dir.path(), SystemTime::now() - 7 * day);
        assert_eq!(pruned, vec!["gone".to_owned()]);
        for kept in ["shard-live.log", "shard-fresh.log", "notes.log"] {
            assert!(dir.path().join(kept).exists(), "{kept}");
        }
    }
}
