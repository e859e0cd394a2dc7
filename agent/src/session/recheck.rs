//! What is looked at again while the agent runs, off the stream's loop
//! (an SGLang import or an nvidia-smi call takes a while): the installed
//! engines and the GPUs' health.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use llmgw_api::v1;
use tokio::sync::watch;

use super::Agent;
use crate::discovery::{self, gpu::Gpu};
use crate::engines::Registry;
use crate::engines::probe::PROBE_TIMEOUT;

/// The latest look.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Rechecked {
    pub engines: BTreeMap<String, String>,
    /// None until a rediscovery succeeded (or with GPUs skipped).
    pub gpus: Option<Vec<Gpu>>,
}

/// A GPU's problems, knowing which cards our own shards run on.
pub(super) fn problems(g: &Gpu, ours: &BTreeSet<u32>) -> Vec<String> {
    g.problems_given(ours.contains(&g.index))
}

pub(super) fn wire_health(gpus: &[Gpu], ours: &BTreeSet<u32>) -> Vec<v1::GpuHealth> {
    gpus.iter()
        .map(|g| v1::GpuHealth {
            index: g.index as i32,
            problems: problems(g, ours),
        })
        .collect()
}

impl Agent {
    /// The GPU indices our shards hold, started or adopted.
    pub(super) fn our_gpus(&self) -> BTreeSet<u32> {
        self.shards
            .values()
            .flat_map(|r| r.start.gpu_indices.iter().map(|i| (*i).max(0) as u32))
            .collect()
    }

    /// Probes the engines now (registration carries them), then every
    /// `recheck` in the background the engines again and the GPUs.
    pub(super) async fn start_rechecks(&self) -> watch::Receiver<Rechecked> {
        let engines: Arc<Registry> = self.engines.clone();
        let every = self.config.recheck;
        let options = self.config.discovery.clone();
        let first = engines.probe(PROBE_TIMEOUT).await;
        tracing::info!(engines = ?first, "engines on this node");
        let (tx, rx) = watch::channel(Rechecked {
            engines: first,
            gpus: None,
        });
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = tx.closed() => return,
                }
                let engines = engines.probe(PROBE_TIMEOUT).await;
                let gpus = if options.skip_gpus {
                    None
                } else {
                    let o = options.clone();
                    match tokio::task::spawn_blocking(move || discovery::gpus(&o)).await {
                        Ok(Ok((gpus, _))) => Some(gpus),
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "GPU rediscovery failed; their health is as last reported");
                            None
                        }
                        Err(_) => None,
                    }
                };
                tx.send_if_modified(|old| {
                    let now = Rechecked {
                        engines,
                        gpus: gpus.or_else(|| old.gpus.clone()),
                    };
                    let changed = *old != now;
                    *old = now;
                    changed
                });
            }
        });
        rx
    }
}

/// How often the engines and GPUs are looked at again, by default.
pub(super) const DEFAULT_RECHECK: Duration = Duration::from_secs(60);
