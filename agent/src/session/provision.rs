//! What the control plane wants installed (`Provision`), handed to the
//! provisioning loop, and where each engine stands, sent with heartbeats
//! when it changed.

use std::sync::Arc;
use std::time::Duration;

use llmgw_api::v1;

use super::Agent;
use crate::provision::{Installer, Provisioner, Schedule, Status, System, Want};

/// Where the agent installs engines and how it runs the node's tools.
#[derive(Debug, Clone)]
pub struct ProvisionSettings {
    /// `<root>/<engine>/<version>-<variant>/`.
    pub root: std::path::PathBuf,
    pub system: System,
    pub schedule: Schedule,
    /// GitHub's API and downloads (other addresses in tests).
    pub github_api: String,
    pub github_download: String,
}

impl Default for ProvisionSettings {
    fn default() -> Self {
        ProvisionSettings {
            root: crate::provision::DEFAULT_ROOT.into(),
            system: System::default(),
            schedule: Schedule::default(),
            github_api: crate::provision::GITHUB_API.into(),
            github_download: crate::provision::GITHUB_DOWNLOAD.into(),
        }
    }
}

pub(super) fn wire(statuses: &[Status]) -> Vec<v1::ProvisionStatus> {
    statuses
        .iter()
        .map(|s| v1::ProvisionStatus {
            engine: s.engine.clone(),
            version: s.version.clone(),
            variant: s.variant.clone(),
            state: s.state.as_str().into(),
            detail: s.detail.clone(),
        })
        .collect()
}

/// How long a restarted agent waits for its installed builds to be
/// checked before it registers (a build still to be fetched is not
/// waited for).
const RESUME_WAIT: Duration = Duration::from_secs(30);

impl Agent {
    /// A restarted agent: what the control plane last asked for is
    /// checked now, so that the registration carries the builds that run
    /// (and a start right after it finds them).
    pub(super) async fn resume_provisioning(&mut self) {
        let Some(dir) = self.config.work_dir.clone() else {
            return;
        };
        let wants = crate::provision::load_wants(&dir);
        if wants.is_empty() {
            return;
        }
        let root = self.config.discovery.root.clone();
        self.host = tokio::task::spawn_blocking(move || crate::discovery::host::discover(&root))
            .await
            .unwrap_or_default();
        let n = wants.len();
        self.start_provisioner();
        let Some(p) = &self.provisioner else { return };
        let mut watch = p.watch();
        p.want(wants);
        let checked = watch.wait_for(|s| {
            s.len() == n
                && s.iter()
                    .all(|s| s.state != crate::provision::State::Installing)
        });
        if tokio::time::timeout(RESUME_WAIT, checked).await.is_err() {
            tracing::info!("registering while engines are still being installed");
        }
    }

    fn start_provisioner(&mut self) {
        if self.provisioner.is_some() {
            return;
        }
        let s = self.config.provision.clone();
        let mut installer = Installer::new(s.root, self.host.clone());
        installer.system = s.system;
        installer.github_api = s.github_api;
        installer.github_download = s.github_download;
        let engines = self.engines.clone();
        let on_ready = Arc::new(
            move |engine: &str, built: Option<(std::path::PathBuf, String)>| {
                match &built {
                    Some((bin, version)) => {
                        tracing::info!(engine, version = %version, binary = %bin.display(), "a provisioned engine is ready")
                    }
                    None => tracing::warn!(engine, "a provisioned engine is no longer ready"),
                }
                engines.use_installed(engine, built);
            },
        );
        self.provisioner = Some(Provisioner::spawn(installer, s.schedule, on_ready));
    }

    /// The whole list of what is wanted; the loop starts with the first
    /// list that asks for anything.
    pub(super) fn provision(&mut self, p: v1::Provision) {
        let wants: Vec<Want> = p
            .engines
            .into_iter()
            .map(|w| Want {
                engine: w.engine,
                version: w.version,
                source: w.source,
                sha256: w.sha256.into_iter().collect(),
                manifest: w.manifest,
            })
            .collect();
        if let Some(dir) = &self.config.work_dir
            && (!wants.is_empty() || dir.join(crate::provision::WANTS_FILE).exists())
            && let Err(e) = crate::provision::save_wants(dir, &wants)
        {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot keep the wanted engines for a restart");
        }
        if self.provisioner.is_none() {
            if wants.is_empty() {
                return;
            }
            self.start_provisioner();
        }
        tracing::info!(engines = ?wants.iter().map(|w| format!("{} {}", w.engine, w.version)).collect::<Vec<_>>(), "the control plane wants these engines");
        if let Some(p) = &self.provisioner {
            p.want(wants);
        }
    }

    /// Every wanted engine's status when any changed since last sent.
    pub(super) fn changed_provision(&mut self) -> Option<Vec<v1::ProvisionStatus>> {
        let now = wire(&self.provisioner.as_ref()?.statuses());
        if now == self.sent_provision {
            return None;
        }
        self.sent_provision = now.clone();
        Some(now)
    }
}
