//! The mirror's directory: `<dir>/<model>/<version>/<file>` for what it
//! holds, `<dir>/.incoming/<model>/<version>/` for what is arriving (with
//! a lock file while a process fetches it and a `.failed.json` record
//! after a failure), and a manifest (`.llmgw-manifest.json`: sizes and
//! sha256 of every file) inside each version. A version appears under its
//! name only by renaming its whole incoming directory, so a half-fetched
//! version is never served, and the state is read from the disk each time,
//! so `mirror add` in another process and `mirror serve` agree.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub(crate) const MANIFEST: &str = ".llmgw-manifest.json";
const INCOMING: &str = ".incoming";

/// A model, version or file name: 1 to 128 letters, digits and `._-`,
/// starting with a letter or digit. Nothing else can name a path, so no
/// `..`, no `/`, no hidden file.
pub(crate) fn segment_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

pub(crate) fn check_segments(parts: &[&str]) -> Result<(), String> {
    match parts.iter().find(|p| !segment_ok(p)) {
        Some(bad) => Err(format!(
            "{bad:?} is not a valid name: 1 to 128 letters, digits and . _ -, starting with a letter or digit"
        )),
        None => Ok(()),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct FileEntry {
    pub name: String,
    pub size: u64,
    /// Lowercase hex; absent for a file put there by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// What a version holds, written when it arrives.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub model: String,
    pub version: String,
    #[serde(default)]
    pub sources: Vec<String>,
    pub files: Vec<FileEntry>,
    #[serde(default)]
    pub fetched_at: String,
    /// Whether each file matched the sha256 its upstream published.
    #[serde(default)]
    pub upstream_verified: bool,
}

/// Why a fetch failed, kept until the version is fetched again or deleted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Failure {
    pub sources: Vec<String>,
    pub reason: String,
    pub at: String,
}

/// One version as listed: held, arriving or failed.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Entry {
    pub model: String,
    pub version: String,
    /// `present`, `fetching` or `failed`.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileEntry>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_done: Option<u64>,
    /// 0 when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct Store {
    dir: PathBuf,
}

/// Subdirectories with valid names, sorted.
fn subdirs(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| segment_ok(n))
        .collect();
    out.sort();
    out
}

/// Regular files (not links) with valid names, sorted, with their sizes.
fn files(dir: &Path) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let meta = e.path().symlink_metadata().ok()?;
            let name = e.file_name().into_string().ok()?;
            (meta.is_file() && segment_ok(&name)).then_some((name, meta.len()))
        })
        .collect();
    out.sort();
    out
}

pub(crate) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

impl Store {
    pub(crate) fn new(dir: PathBuf) -> Self {
        Store { dir }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn version_dir(&self, m: &str, v: &str) -> PathBuf {
        self.dir.join(m).join(v)
    }

    pub(crate) fn incoming_dir(&self, m: &str, v: &str) -> PathBuf {
        self.dir.join(INCOMING).join(m).join(v)
    }

    fn failure_path(&self, m: &str, v: &str) -> PathBuf {
        self.dir
            .join(INCOMING)
            .join(m)
            .join(format!("{v}.failed.json"))
    }

    pub(crate) fn lock_path(&self, m: &str, v: &str) -> PathBuf {
        self.dir.join(INCOMING).join(m).join(format!("{v}.lock"))
    }

    /// A held file, refusing links anywhere below the mirror's directory:
    /// the byte path serves what is in the tree and nothing it points at.
    pub(crate) fn held_file(&self, m: &str, v: &str, f: &str) -> Option<(PathBuf, u64)> {
        check_segments(&[m, v, f]).ok()?;
        let mut path = self.dir.clone();
        for part in [m, v] {
            path.push(part);
            if !path.symlink_metadata().ok()?.is_dir() {
                return None;
            }
        }
        path.push(f);
        let meta = path.symlink_metadata().ok()?;
        meta.is_file().then_some((path, meta.len()))
    }

    pub(crate) fn manifest(&self, m: &str, v: &str) -> Option<Manifest> {
        let text = std::fs::read(self.version_dir(m, v).join(MANIFEST)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// A held version's files with their sizes and (where known) sha256.
    pub(crate) fn held(&self, m: &str, v: &str) -> Option<Vec<FileEntry>> {
        check_segments(&[m, v]).ok()?;
        let dir = self.version_dir(m, v);
        if !dir.symlink_metadata().ok()?.is_dir() {
            return None;
        }
        let manifest = self.manifest(m, v);
        let sums = |name: &str, size: u64| {
            manifest.as_ref().and_then(|mf| {
                mf.files
                    .iter()
                    .find(|e| e.name == name && e.size == size)
                    .and_then(|e| e.sha256.clone())
            })
        };
        Some(
            files(&dir)
                .into_iter()
                .map(|(name, size)| FileEntry {
                    sha256: sums(&name, size),
                    name,
                    size,
                })
                .collect(),
        )
    }

    pub(crate) fn failure(&self, m: &str, v: &str) -> Option<Failure> {
        let text = std::fs::read(self.failure_path(m, v)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    pub(crate) fn record_failure(&self, m: &str, v: &str, f: &Failure) -> std::io::Result<()> {
        let path = self.failure_path(m, v);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(f).unwrap_or_default())?;
        std::fs::rename(tmp, path)
    }

    pub(crate) fn clear_failure(&self, m: &str, v: &str) {
        let _ = std::fs::remove_file(self.failure_path(m, v));
    }

    /// Bytes already in a version's incoming directory.
    pub(crate) fn incoming_bytes(&self, m: &str, v: &str) -> u64 {
        files(&self.incoming_dir(m, v)).iter().map(|f| f.1).sum()
    }

    /// Every version held, arriving or failed. `running` says whether a
    /// fetch of this process is under way, with its progress; a fetch
    /// another process holds the lock of counts as arriving too.
    pub(crate) fn list(&self, running: &dyn Fn(&str, &str) -> Option<Entry>) -> Vec<Entry> {
        let mut out = Vec::new();
        for m in subdirs(&self.dir) {
            for v in subdirs(&self.dir.join(&m)) {
                if let Some(files) = self.held(&m, &v) {
                    out.push(Entry {
                        sources: self
                            .manifest(&m, &v)
                            .map(|mf| mf.sources)
                            .unwrap_or_default(),
                        model: m.clone(),
                        version: v,
                        state: "present",
                        files,
                        bytes_done: None,
                        bytes_total: None,
                        reason: None,
                    });
                }
            }
        }
        let incoming = self.dir.join(INCOMING);
        for m in subdirs(&incoming) {
            let mut versions: Vec<String> = std::fs::read_dir(incoming.join(&m))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .map(|n| {
                    n.strip_suffix(".failed.json")
                        .map_or(n.clone(), str::to_owned)
                })
                .filter(|n| segment_ok(n) && !n.ends_with(".lock"))
                .collect();
            versions.sort();
            versions.dedup();
            for v in versions {
                if let Some(e) = self.arriving(&m, &v, running) {
                    out.push(e);
                }
            }
        }
        out.sort_by(|a, b| (&a.model, &a.version).cmp(&(&b.model, &b.version)));
        out
    }

    /// A version that is not held: fetching (here or in another process),
    /// or failed with its reason (a fetch nobody runs any more failed).
    pub(crate) fn arriving(
        &self,
        m: &str,
        v: &str,
        running: &dyn Fn(&str, &str) -> Option<Entry>,
    ) -> Option<Entry> {
        if let Some(e) = running(m, v) {
            return Some(e);
        }
        if self.held(m, v).is_some() {
            return None;
        }
        let dir = self.incoming_dir(m, v);
        let failure = self.failure(m, v);
        if failure.is_none() && !dir.is_dir() {
            return None;
        }
        let done = self.incoming_bytes(m, v);
        let base = Entry {
            model: m.to_owned(),
            version: v.to_owned(),
            state: "fetching",
            files: Vec::new(),
            sources: failure
                .as_ref()
                .map(|f| f.sources.clone())
                .unwrap_or_default(),
            bytes_done: Some(done),
            bytes_total: Some(0),
            reason: None,
        };
        if super::fetch::locked_elsewhere(&self.lock_path(m, v)) {
            return Some(base);
        }
        Some(Entry {
            state: "failed",
            bytes_total: None,
            reason: Some(failure.map_or_else(
                || "the fetch stopped before it finished (the process running it ended); fetch it again to resume".to_owned(),
                |f| f.reason,
            )),
            ..base
        })
    }

    /// Removes a whole version (held, or the remains of a failed fetch).
    /// The held directory is first renamed out of the tree, so a reader
    /// never sees half a version.
    pub(crate) fn remove_version(&self, m: &str, v: &str) -> std::io::Result<bool> {
        let mut found = false;
        let held = self.version_dir(m, v);
        if held.symlink_metadata().is_ok() {
            let trash = self
                .dir
                .join(INCOMING)
                .join(format!(".trash-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(self.dir.join(INCOMING))?;
            std::fs::rename(&held, &trash)?;
            std::fs::remove_dir_all(&trash)?;
            found = true;
        }
        let incoming = self.incoming_dir(m, v);
        if incoming.exists() {
            std::fs::remove_dir_all(&incoming)?;
            found = true;
        }
        if self.failure(m, v).is_some() {
            self.clear_failure(m, v);
            found = true;
        }
        let _ = std::fs::remove_file(self.lock_path(m, v));
        // An emptied model directory goes too; a non-empty one stays.
        let _ = std::fs::remove_dir(self.dir.join(m));
        let _ = std::fs::remove_dir(self.dir.join(INCOMING).join(m));
        Ok(found)
    }
}
