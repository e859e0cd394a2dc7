//! What the control plane wants installed (`Provision`), handed to the
//! provisioning loop, and where each engine stands, sent with heartbeats
//! when it changed.

use std::sync::Arc;

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

impl Agent {
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
        if self.provisioner.is_none() {
            if wants.is_empty() {
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
