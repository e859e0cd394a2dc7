//! What is looked at again while the agent runs, off the stream's loop
//! (an SGLang import or an nvidia-smi call takes a while): the installed
//! engines and the GPUs' health.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use llmgw_api::v1;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Agent, Running};
use crate::discovery::{self, gpu::Gpu};
use crate::engines::Registry;
use crate::engines::probe::PROBE_TIMEOUT;

/// How often the engines and GPUs are looked at again, by default.
pub(super) const DEFAULT_RECHECK: Duration = Duration::from_secs(60);
/// An nvidia-smi (or NVML) that has not answered by then has a driver in
/// trouble: the cards are reported unreadable.
const GPU_TIMEOUT: Duration = Duration::from_secs(30);

/// What a look at the GPUs found.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum GpuLook {
    Seen(Vec<Gpu>),
    /// The driver did not answer, or answered with an error.
    Unreadable(String),
}

/// The latest look.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Rechecked {
    pub engines: BTreeMap<String, String>,
    /// None until a look at the GPUs was taken (never with GPUs skipped).
    pub gpus: Option<(Instant, GpuLook)>,
}

/// A card as placement knows it: which one and its class. A look that
/// reads one the registration did not have (a driver that came up after
/// the agent, memory that can be read now) registers again, since only a
/// registration carries cards; problems go with heartbeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Card {
    index: u32,
    uuid: String,
    class: String,
}

impl Card {
    pub(super) fn of(g: &Gpu) -> Card {
        Card {
            index: g.index,
            uuid: g.uuid.clone(),
            class: g.class.clone(),
        }
    }
}

/// The cards of `seen` that `registered` lacks, said for a log line; None
/// when there are none. Only cards read whole count: one whose memory
/// cannot be read has no class yet, and registering it again each time
/// it flickers would gain nothing (its problem goes with heartbeats).
pub(super) fn unregistered(registered: &[Card], seen: &[Gpu]) -> Option<String> {
    let new: Vec<String> = seen
        .iter()
        .filter(|g| g.health.unreadable.is_empty())
        .filter(|g| !registered.contains(&Card::of(g)))
        .map(|g| format!("GPU {} {} ({})", g.index, g.class, g.uuid))
        .collect();
    (!new.is_empty()).then(|| new.join(", "))
}

/// A GPU's problems, knowing whether one of our shards ran on it.
fn wire_health(gpus: &[Gpu], ours: impl Fn(u32) -> bool) -> Vec<v1::GpuHealth> {
    gpus.iter()
        .map(|g| v1::GpuHealth {
            index: g.index as i32,
            problems: g.problems_given(ours(g.index)),
        })
        .collect()
}

/// Every GPU's figures, for the control plane's metrics page.
pub(super) fn wire_figures(gpus: &[Gpu]) -> Vec<v1::GpuFigures> {
    gpus.iter()
        .map(|g| v1::GpuFigures {
            index: g.index as i32,
            memory_used_mb: g.memory_used_mb as i64,
            memory_total_mb: g.memory_total_mb as i64,
            temperature_c: g.health.temperature_c as i32,
            utilization_percent: g.utilization_percent as i32,
            ecc_errors: g.health.ecc_errors as i64,
        })
        .collect()
}

/// Problems without their figures: a foreign process using a few more MiB
/// is not news worth an event.
fn kinds(h: &[v1::GpuHealth]) -> Vec<(i32, Vec<String>)> {
    h.iter()
        .map(|g| {
            let k = g
                .problems
                .iter()
                .map(|p| p.chars().filter(|c| !c.is_ascii_digit()).collect())
                .collect();
            (g.index, k)
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

    /// Forgets a shard, noting when its GPUs were let go.
    pub(super) fn take_shard(&mut self, id: &str) -> Option<Running> {
        let r = self.shards.remove(id)?;
        let now = Instant::now();
        for g in &r.start.gpu_indices {
            self.released.insert((*g).max(0) as u32, now);
        }
        Some(r)
    }

    /// The GPUs' problems as registration reads them (fresh).
    pub(super) fn registered_health(&mut self, gpus: &[Gpu]) -> Vec<v1::GpuHealth> {
        let ours = self.our_gpus();
        self.registered_at = Instant::now();
        self.sent_gpus = wire_health(gpus, |i| ours.contains(&i));
        self.sent_gpus.clone()
    }

    /// Every GPU's problems when any changed since they were last sent,
    /// from a look newer than the registration.
    pub(super) fn changed_health(&mut self) -> Option<Vec<v1::GpuHealth>> {
        let (taken, look) = self.rechecked.borrow().gpus.clone()?;
        if taken <= self.registered_at {
            return None;
        }
        let health = match look {
            GpuLook::Seen(gpus) => {
                let ours = self.our_gpus();
                // Our engine's memory, seen before the engine let go.
                wire_health(&gpus, |i| {
                    ours.contains(&i) || self.released.get(&i).is_some_and(|t| *t >= taken)
                })
            }
            GpuLook::Unreadable(why) => self
                .sent_gpus
                .iter()
                .map(|h| v1::GpuHealth {
                    index: h.index,
                    problems: vec![format!("the driver cannot read it: {why}")],
                })
                .collect(),
        };
        if kinds(&health) == kinds(&self.sent_gpus) {
            return None;
        }
        self.sent_gpus = health.clone();
        Some(health)
    }

    /// The cards the latest look newer than the registration read that
    /// the registration did not have.
    pub(super) fn unregistered(&self) -> Option<String> {
        match &self.rechecked.borrow().gpus {
            Some((taken, GpuLook::Seen(gpus))) if *taken > self.registered_at => {
                unregistered(&self.registered_cards, gpus)
            }
            _ => None,
        }
    }

    /// The GPUs' figures from the latest look newer than the registration,
    /// else the registration's; none while the driver cannot be read.
    pub(super) fn gpu_figures(&self) -> Vec<v1::GpuFigures> {
        match &self.rechecked.borrow().gpus {
            Some((taken, look)) if *taken > self.registered_at => match look {
                GpuLook::Seen(gpus) => wire_figures(gpus),
                GpuLook::Unreadable(_) => Vec::new(),
            },
            _ => self.registered_figures.clone(),
        }
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
            // A look still running (a hung driver) is waited on again
            // rather than started twice.
            let mut pending = None;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = tx.closed() => return,
                }
                let previous = tx.borrow().engines.clone();
                let engines = engines.reprobe(PROBE_TIMEOUT, &previous).await;
                let gpus = if options.skip_gpus {
                    None
                } else {
                    let mut look = pending.take().unwrap_or_else(|| {
                        let o = options.clone();
                        tokio::task::spawn_blocking(move || discovery::gpus(&o))
                    });
                    let found = match tokio::time::timeout(GPU_TIMEOUT, &mut look).await {
                        Ok(Ok(Ok((gpus, _)))) => GpuLook::Seen(gpus),
                        Ok(Ok(Err(e))) => GpuLook::Unreadable(e.to_string()),
                        Ok(Err(e)) => GpuLook::Unreadable(e.to_string()),
                        Err(_) => {
                            pending = Some(look);
                            GpuLook::Unreadable(format!("no answer within {GPU_TIMEOUT:?}"))
                        }
                    };
                    Some((Instant::now(), found))
                };
                tx.send_if_modified(|old| {
                    let now = Rechecked { engines, gpus };
                    let changed = *old != now;
                    *old = now;
                    changed
                });
            }
        });
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::{Card, unregistered};
    use crate::discovery::gpu::Gpu;

    fn h100(index: u32, memory_total_mb: u64) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_total_mb,
            ..Gpu::default()
        }
        .finish()
    }

    #[test]
    fn cards_read_whole_that_the_registration_lacks_are_new() {
        let (a, b) = (h100(0, 81559), h100(1, 81559));
        assert_eq!(
            unregistered(&[], &[a.clone(), b.clone()]).as_deref(),
            Some("GPU 0 h100-80g (GPU-0), GPU 1 h100-80g (GPU-1)"),
            "a driver that came up after the agent"
        );
        let registered = [Card::of(&a), Card::of(&b)];
        assert_eq!(unregistered(&registered, &[a.clone(), b.clone()]), None);
        assert_eq!(
            unregistered(&registered, std::slice::from_ref(&a)),
            None,
            "a card gone is a heartbeat's problem"
        );
        let mut sick = b.clone();
        sick.health.ecc_errors = 3;
        assert_eq!(
            unregistered(&registered, &[a.clone(), sick.finish()]),
            None,
            "a problem is a heartbeat's"
        );
        // Registered while its memory could not be read (class h100-0g):
        // read whole now, it is a card of another class.
        let mut blind = h100(1, 0);
        blind.health.unreadable = vec!["memory unreadable: memory.total [Unknown Error]".into()];
        let blind = blind.finish();
        let registered = [Card::of(&a), Card::of(&blind)];
        assert_eq!(
            unregistered(&registered, &[a.clone(), b]).as_deref(),
            Some("GPU 1 h100-80g (GPU-1)")
        );
        assert_eq!(
            unregistered(&[Card::of(&a)], &[a, blind]),
            None,
            "a card still unreadable has no class to register"
        );
    }
}
