//! Engines the control plane asks for, installed by the agent itself.
//!
//! Nothing already on the machine is trusted: an engine counts as
//! installed only when this module fetched each of its archives, checked
//! each one's SHA-256, unpacked it without letting it write outside its
//! directory, and saw the binary load its libraries (`ldd`) and run
//! (`--version`, bounded). Builds live in `<root>/<engine>/<version>-<variant>/`
//! (a node that gains a driver installs the CUDA build beside the CPU
//! one), written under `.partial` and renamed whole, with a marker file,
//! so a half-finished install never looks installed. An installed build
//! is checked again on every pass (`ldd` and `--version`), not fetched
//! again.
//!
//! `recipe` chooses the build, `source` fetches and checks it, `unpack`
//! unpacks it, `system` runs the node's tools, `service` is the loop that
//! re-checks and retries.

pub mod recipe;
pub mod service;
pub mod source;
pub mod system;
pub mod unpack;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::discovery::host::Host;
pub use recipe::Build;
pub use service::{Provisioner, Schedule};
pub use system::System;

/// Where builds go unless configured.
pub const DEFAULT_ROOT: &str = "/opt/llmgw/engines";
/// Written last into a build's directory: only its existence is checked.
pub const MARKER: &str = ".llmgw-installed";
/// A download's whole budget (a CUDA build is hundreds of MB).
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Where GitHub's API and release downloads are.
pub const GITHUB_API: &str = "https://api.github.com";
pub const GITHUB_DOWNLOAD: &str = "https://github.com";
/// The repository a recipe's releases come from.
const LLAMACPP_REPO: &str = "ggml-org/llama.cpp";

/// An engine the control plane wants on the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Want {
    pub engine: String,
    pub version: String,
    /// `github` (or empty), or an `http(s)://` URL template
    /// (`source::origin`).
    pub source: String,
    /// Archive file name → SHA-256 hex; with a template, the only
    /// checksums there are (beside a manifest's), and they win.
    pub sha256: BTreeMap<String, String>,
    /// An llmgw mirror's manifest of the version: the checksums of
    /// archives the mirror holds (`source::manifest_checksums`).
    #[serde(default)]
    pub manifest: String,
}

/// What the control plane last asked for, kept in the agent's work
/// directory, so that a restarted agent checks its installed builds
/// before it registers (and registers with them) rather than after.
pub const WANTS_FILE: &str = "provision.json";

/// Writes `wants` to `dir/provision.json` (whole, by a rename).
pub fn save_wants(dir: &Path, wants: &[Want]) -> std::io::Result<()> {
    let tmp = dir.join(format!("{WANTS_FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(wants)?)?;
    std::fs::rename(&tmp, dir.join(WANTS_FILE))
}

/// What `save_wants` wrote; nothing when there is no file or it cannot
/// be read (the control plane says it again on the next stream).
pub fn load_wants(dir: &Path) -> Vec<Want> {
    std::fs::read(dir.join(WANTS_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Installing,
    Ready,
    Failed,
    Unsupported,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Installing => "installing",
            State::Ready => "ready",
            State::Failed => "failed",
            State::Unsupported => "unsupported",
        }
    }
}

/// Where one wanted engine stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub engine: String,
    pub version: String,
    pub variant: String,
    pub state: State,
    /// For a person: progress, the reason for a failure, or the version
    /// the binary printed.
    pub detail: String,
    /// The binary, once ready.
    pub binary: Option<PathBuf>,
}

type OnStatus = Arc<dyn Fn(&Status) + Send + Sync>;

/// Installs and checks engines on this node.
#[derive(Clone)]
pub struct Installer {
    pub root: PathBuf,
    pub host: Host,
    pub http: reqwest::Client,
    pub system: System,
    pub github_api: String,
    pub github_download: String,
    /// Hears every change, progress included.
    pub on_status: Option<OnStatus>,
}

impl std::fmt::Debug for Installer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Installer")
            .field("root", &self.root)
            .field("host", &self.host)
            .field("system", &self.system)
            .finish_non_exhaustive()
    }
}

impl Installer {
    pub fn new(root: PathBuf, host: Host) -> Self {
        Installer {
            root,
            host,
            http: reqwest::Client::builder()
                .timeout(HTTP_TIMEOUT)
                .build()
                .unwrap_or_default(),
            system: System::default(),
            github_api: GITHUB_API.into(),
            github_download: GITHUB_DOWNLOAD.into(),
            on_status: None,
        }
    }

    /// Brings each wanted engine to ready where it can, one at a time;
    /// every final status is also told to `on_status`.
    pub async fn converge(&self, wants: &[Want]) -> Vec<Status> {
        let mut out = Vec::with_capacity(wants.len());
        for w in wants {
            let st = self.one(w).await;
            self.tell(&st);
            out.push(st);
        }
        out
    }

    fn tell(&self, st: &Status) {
        if let Some(f) = &self.on_status {
            f(st);
        }
    }

    async fn one(&self, w: &Want) -> Status {
        let mut st = Status {
            engine: w.engine.clone(),
            version: w.version.clone(),
            variant: String::new(),
            state: State::Unsupported,
            detail: String::new(),
            binary: None,
        };
        let build = match recipe::choose(&w.engine, &w.version, &self.host) {
            None => {
                st.detail = format!(
                    "this agent does not know how to install {}; install it by hand and name it in the agent's configuration",
                    w.engine
                );
                return st;
            }
            Some(Err(e)) => {
                st.detail = e;
                return st;
            }
            Some(Ok(b)) => b,
        };
        st.variant = build.variant.clone();
        if !recipe::valid_version(&w.version) {
            st.detail = format!("{:?} is not a version this agent installs", w.version);
            return st;
        }
        let fail = |mut st: Status, why: String| {
            st.state = State::Failed;
            st.detail = why;
            st.binary = None;
            st
        };
        let dir = self
            .root
            .join(&w.engine)
            .join(format!("{}-{}", w.version, build.variant));
        st.state = State::Installing;
        if dir.join(MARKER).exists() {
            if let Err(e) = self.packages(&build, &st).await {
                return fail(st, e);
            }
            match self.verify(&dir, &build).await {
                Ok((bin, version)) => return self.ready(st, &build, bin, version),
                Err(e) => tracing::warn!(
                    engine = %w.engine, version = %w.version, error = %e,
                    "an installed engine no longer runs; installing it again"
                ),
            }
        }
        if let Err(e) = self.install(w, &build, &dir, &st).await {
            return fail(st, e);
        }
        match self.verify(&dir, &build).await {
            Ok((bin, version)) => self.ready(st, &build, bin, version),
            Err(e) => fail(st, e),
        }
    }

    fn ready(&self, mut st: Status, build: &Build, bin: PathBuf, version: String) -> Status {
        let name = bin
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        st.state = State::Ready;
        st.detail = format!("{name} {version}").trim().to_owned();
        let lacking: Vec<&str> = build
            .cpu_flags
            .iter()
            .copied()
            .filter(|f| !self.host.has_cpu_flag(f))
            .collect();
        if !lacking.is_empty() {
            st.detail.push_str(&format!(
                "; this CPU lacks {}, so it will run several times slower (a VM needs CPU type \"host\")",
                lacking.join(", ")
            ));
        }
        st.binary = Some(bin);
        st
    }

    fn progress(&self, st: &Status, detail: String) {
        let mut p = st.clone();
        p.state = State::Installing;
        p.detail = detail;
        self.tell(&p);
    }

    async fn packages(&self, build: &Build, st: &Status) -> Result<(), String> {
        let family = self.host.family();
        let pkgs = build.packages.get(family).cloned().unwrap_or_default();
        let progress = |d: String| self.progress(st, d);
        self.system.packages(family, &pkgs, &progress).await
    }

    async fn install(
        &self,
        w: &Want,
        build: &Build,
        dir: &Path,
        st: &Status,
    ) -> Result<(), String> {
        self.packages(build, st).await?;
        let origin = source::origin(&w.source)?;
        let mut sums = match origin {
            _ if !w.manifest.is_empty() => {
                self.progress(
                    st,
                    format!(
                        "asking the mirror for the checksums of {} {}",
                        w.engine, w.version
                    ),
                );
                source::manifest_checksums(&self.http, &w.manifest).await?
            }
            source::Origin::GitHub if w.sha256.is_empty() => {
                self.progress(
                    st,
                    format!(
                        "asking GitHub for the checksums of {} {}",
                        w.engine, w.version
                    ),
                );
                source::github_checksums(&self.http, &self.github_api, LLAMACPP_REPO, &w.version)
                    .await?
            }
            _ => BTreeMap::new(),
        };
        sums.extend(
            w.sha256
                .iter()
                .map(|(k, v)| (k.clone(), v.to_ascii_lowercase())),
        );
        let name = dir
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let tmp = dir.with_file_name(format!("{name}.partial"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        // Removed whatever happens: a half-finished install is never kept.
        struct Scratch<'a>(&'a Path);
        impl Drop for Scratch<'_> {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(self.0);
            }
        }
        let _scratch = Scratch(&tmp);
        let arch = match self.host.arch.as_str() {
            "amd64" => "x64",
            a => a,
        };
        for asset in &build.assets {
            let Some(sum) = sums.get(asset) else {
                return Err(format!(
                    "{} {} publishes no checksum for {asset}, so it cannot be verified",
                    w.engine, w.version
                ));
            };
            let url = match &origin {
                source::Origin::GitHub => format!(
                    "{}/{LLAMACPP_REPO}/releases/download/{}/{asset}",
                    self.github_download.trim_end_matches('/'),
                    w.version
                ),
                source::Origin::Template(t) => {
                    source::expand(t, asset, &w.version, &build.variant, arch)
                }
            };
            let archive = tmp.join(format!("{asset}.download"));
            let progress = |d: String| self.progress(st, d);
            source::download(&self.http, &url, asset, &archive, sum, &progress).await?;
            self.progress(st, format!("unpacking {asset}"));
            let (a, t) = (archive.clone(), tmp.clone());
            tokio::task::spawn_blocking(move || unpack::tar_gz(&a, &t))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("unpacking {asset}: {e}"))?;
            let _ = std::fs::remove_file(&archive);
        }
        self.progress(st, format!("checking that {} runs", build.binary));
        let (bin, _) = self.verify(&tmp, build).await?;
        let marker = serde_json::json!({
            "engine": w.engine,
            "version": w.version,
            "variant": build.variant,
            "binary": bin.strip_prefix(&tmp).unwrap_or(&bin),
            "sha256": build.assets.iter().map(|a| (a.clone(), sums[a].clone())).collect::<BTreeMap<_, _>>(),
            "installed_unix_ms": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        });
        let text = serde_json::to_string_pretty(&marker).map_err(|e| e.to_string())?;
        std::fs::write(tmp.join(MARKER), text).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(dir);
        std::fs::rename(&tmp, dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(())
    }

    /// The build's binary in `dir`, once it loads its libraries and runs:
    /// its path and the line it printed about its version.
    async fn verify(&self, dir: &Path, build: &Build) -> Result<(PathBuf, String), String> {
        let (d, name) = (dir.to_path_buf(), build.binary.clone());
        let bin = tokio::task::spawn_blocking(move || find_file(&d, &name))
            .await
            .ok()
            .flatten()
            .ok_or_else(|| format!("the build has no {} in it", build.binary))?;
        let missing = self.system.missing_libraries(&bin).await;
        if !missing.is_empty() {
            return Err(format!(
                "{} cannot run on this system: {}",
                build.binary,
                missing.join("; ")
            ));
        }
        let version = self.system.version(&bin, &build.binary).await?;
        Ok((bin, version))
    }
}

/// The first file named `name` under `dir`, in a sorted walk; links are
/// not followed.
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in &entries {
        let t = e.file_type().ok()?;
        if !t.is_dir() && e.file_name() == name {
            return Some(e.path());
        }
    }
    entries
        .iter()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .find_map(|e| find_file(&e.path(), name))
}
