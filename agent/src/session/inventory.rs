//! What the agent tells the control plane about its node: the inventory
//! at registration, the shards it runs, and heartbeats with changed-only
//! sections.

use std::collections::BTreeMap;

use llmgw_api::v1;

use super::{Agent, wire_state};
use crate::discovery;
use crate::supervisor::State;

fn wire_weights(w: &[discovery::weights::LocalWeights]) -> Vec<v1::LocalWeights> {
    w.iter()
        .map(|w| v1::LocalWeights {
            path: w.path.clone(),
            size_bytes: w.size_bytes as i64,
            shared: w.shared,
        })
        .collect()
}

fn storage(s: &[discovery::storage::Storage]) -> Vec<v1::Storage> {
    s.iter()
        .map(|s| v1::Storage {
            path: s.path.clone(),
            free_bytes: s.free_bytes as i64,
            total_bytes: s.total_bytes as i64,
            shared: s.shared,
        })
        .collect()
}

impl Agent {
    /// The whole inventory, read off the stream's loop: nvidia-smi and the
    /// model directories' walk take a while, and a runtime thread must not
    /// wait on them.
    pub(super) async fn register(&mut self) -> v1::Register {
        let options = self.config.discovery.clone();
        let (inv, error) = tokio::task::spawn_blocking(move || discovery::discover(&options))
            .await
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "discovery panicked");
                (discovery::Inventory::default(), None)
            });
        if let Some(e) = error {
            tracing::warn!(error = %e, "discovery was cut short; registering with what it found");
        }
        // Said when it changes, not before every dial of a server that
        // is down.
        let left_out = discovery::fabric::left_out(&inv.fabrics);
        if left_out != self.fabrics_said {
            for line in &left_out {
                tracing::warn!("{line}");
            }
            self.fabrics_said = left_out;
        }
        let health = self.registered_health(&inv.gpus);
        self.host = inv.host.clone();
        self.registered_figures = super::recheck::wire_figures(&inv.gpus);
        self.registered_cards = inv.gpus.iter().map(super::recheck::Card::of).collect();
        self.gpus = inv
            .gpus
            .iter()
            .map(|g| crate::engines::GpuInfo {
                index: g.index,
                name: g.name.clone(),
                compute_capability: g.compute_capability.clone(),
                memory_total_mb: g.memory_total_mb,
            })
            .collect();
        v1::Register {
            node_id: self.config.node_id.clone(),
            hostname: discovery::host::hostname(),
            mgmt_addr: self.config.mgmt_addr.clone(),
            labels: self.config.labels.clone().into_iter().collect(),
            gpus: inv
                .gpus
                .iter()
                .map(|g| v1::Gpu {
                    index: g.index as i32,
                    uuid: g.uuid.clone(),
                    name: g.name.clone(),
                    memory_total_mb: g.memory_total_mb as i32,
                    memory_used_mb: g.memory_used_mb as i32,
                    compute_capability: g.compute_capability.clone(),
                    numa_node: g.numa_node,
                    pci_bus_id: g.pci_bus_id.clone(),
                    driver_version: g.driver_version.clone(),
                    cuda_version: g.cuda_version.clone(),
                    nvlink_peers: g.nvlink_peers.iter().map(|p| *p as i32).collect(),
                    problems: health
                        .iter()
                        .find(|h| h.index == g.index as i32)
                        .map(|h| h.problems.clone())
                        .unwrap_or_default(),
                    temperature_c: g.health.temperature_c as i32,
                    ecc_errors: g.health.ecc_errors as i32,
                    utilization_percent: g.utilization_percent as i32,
                    class: g.class.clone(),
                })
                .collect(),
            fabrics: inv
                .fabrics
                .iter()
                .filter(|f| !f.usable.is_empty())
                .map(|f| v1::FabricAttachment {
                    fabric: f.fabric.clone(),
                    hcas: f.usable.clone(),
                    rate_gbps: f.rate_gbps as i32,
                })
                .collect(),
            agent_version: env!("CARGO_PKG_VERSION").into(),
            engine_versions: {
                let engines = self.installed_engines();
                self.sent_engines = engines.clone();
                engines.into_iter().collect()
            },
            running_shards: self.running_shards(),
            memory_total_mb: inv.memory_total_mb as i64,
            weights: {
                let w = wire_weights(&inv.weights);
                self.sent_weights = w.clone();
                w
            },
            storage: storage(&inv.storage),
            host: Some(v1::Host {
                os_id: inv.host.os_id.clone(),
                os_version: inv.host.os_version.clone(),
                os_codename: inv.host.os_codename.clone(),
                arch: inv.host.arch.clone(),
                cpu_flags: inv.host.cpu_flags.clone(),
                nvidia_driver: inv.host.nvidia_driver.clone(),
            }),
            engines_probed: true,
            epoch_seen: self.epochs.highest(),
            heartbeat_ms: u64::try_from(self.config.heartbeat.as_millis()).unwrap_or(u64::MAX),
            stopped_on_exit: self.stopped_on_exit.clone(),
        }
    }

    pub(super) fn running_shards(&mut self) -> Vec<v1::RunningShard> {
        self.reap();
        self.shards
            .values()
            .map(|r| {
                let s = &r.start;
                let state = r.status.borrow().state;
                v1::RunningShard {
                    replica_id: s.replica_id.clone(),
                    shard_id: s.shard_id.clone(),
                    rank: s.rank,
                    nnodes: s.nnodes,
                    gpu_indices: s.gpu_indices.clone(),
                    hcas: s.hcas.clone(),
                    http_port: s.http_port,
                    state: wire_state(state),
                    model: s.model.clone(),
                    profile: s
                        .profile
                        .as_ref()
                        .map(|p| p.name.clone())
                        .unwrap_or_default(),
                    pool: s.pool.clone(),
                    fabric: s.fabric.clone(),
                    leader_addr: s.leader_addr.clone(),
                    leader_port: s.leader_port,
                    profile_fp: s.profile_fp.clone(),
                    uptime_s: r.started.elapsed().as_secs() as i64,
                }
            })
            .collect()
    }

    /// Forgets shards whose processes are gone for good.
    pub(super) fn reap(&mut self) {
        let done: Vec<String> = self
            .shards
            .iter()
            .filter(|(_, r)| matches!(r.status.borrow().state, State::Stopped | State::Failed))
            .map(|(id, _)| id.clone())
            .collect();
        for id in done {
            self.take_shard(&id);
            self.forget(&id);
        }
    }

    /// Storage, memory and GPU figures always (a few numbers); weights
    /// when they changed; installed engines (probed in the background) when
    /// they changed. The flags say a list is meant, so an empty one is
    /// never ambiguous.
    pub(super) async fn heartbeat(&mut self) -> v1::Heartbeat {
        // The disks and the model directories' walk, off the loop.
        let o = self.config.discovery.clone();
        let (disks, memory_mb, found) = tokio::task::spawn_blocking(move || {
            let weights =
                (!o.model_dirs.is_empty()).then(|| discovery::weights::scan(&o.model_dirs));
            (
                discovery::storage::scan_cache_first(o.cache_dir.as_deref(), &o.model_dirs),
                discovery::memory::total_mb(&o.root.join("proc/meminfo")),
                weights,
            )
        })
        .await
        .unwrap_or_default();
        let mut hb = v1::Heartbeat {
            node_id: self.config.node_id.clone(),
            storage: storage(&disks),
            memory_total_mb: memory_mb as i64,
            ..v1::Heartbeat::default()
        };
        if let Some(found) = found {
            let weights = wire_weights(&found);
            if weights != self.sent_weights {
                hb.weights_changed = true;
                hb.weights = weights.clone();
                self.sent_weights = weights;
            }
        }
        let engines = self.installed_engines();
        if engines != self.sent_engines {
            hb.engines_changed = true;
            hb.engine_versions = engines.clone().into_iter().collect();
            self.sent_engines = engines;
        }
        if let Some(health) = self.changed_health() {
            hb.gpus_changed = true;
            hb.gpus = health;
        }
        if let Some(p) = self.changed_provision() {
            hb.provision_changed = true;
            hb.provision = p;
        }
        hb.gpu_figures = self.gpu_figures();
        hb
    }

    /// What the configuration names (the sim engine: llmgw itself) and
    /// what the latest probe found.
    pub(super) fn installed_engines(&self) -> BTreeMap<String, String> {
        let mut out = self.rechecked.borrow().engines.clone();
        // A provisioned build counts as soon as it is ready, not at the
        // next probe.
        for name in self.engines.names() {
            if let Some(crate::engines::Probe::Seen(v)) =
                self.engines.get(name).ok().and_then(|e| e.probe())
            {
                out.insert(name.to_owned(), v);
            }
        }
        out.extend(self.config.engines_installed.clone());
        out
    }
}
