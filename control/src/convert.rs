//! Between the agent protocol and the domain's types.

use llmgw_api::v1;
use llmgw_domain::heartbeat::{GpuLook, Heartbeat};
use llmgw_domain::nodes::{FabricAttachment, Gpu, Inventory};
use llmgw_domain::registration::{RunningShard, Start};
use llmgw_domain::replicas::ShardState;

/// What the scheduler keeps of a registration. Telemetry (used memory,
/// temperatures) stays out: it would make every heartbeat an event.
pub(crate) fn inventory(r: &v1::Register) -> Inventory {
    Inventory {
        hostname: r.hostname.clone(),
        mgmt_addr: r.mgmt_addr.clone(),
        labels: r.labels.clone().into_iter().collect(),
        gpus: r.gpus.iter().map(gpu).collect(),
        fabrics: r
            .fabrics
            .iter()
            .map(|f| FabricAttachment {
                fabric: f.fabric.clone(),
                hcas: f.hcas.clone(),
                rate_gbps: u32::try_from(f.rate_gbps).unwrap_or(0),
            })
            .collect(),
        memory_total_mb: u64::try_from(r.memory_total_mb).unwrap_or(0),
        disk_free_gb: disk_free_gb(&r.storage),
        engines: r.engine_versions.clone().into_iter().collect(),
        weights: r.weights.iter().map(|w| w.path.clone()).collect(),
    }
}

/// What a heartbeat says of the inventory, in the domain's terms: the
/// facts an agent sends only on a change are `None` without one.
pub(crate) fn heartbeat(hb: v1::Heartbeat) -> Heartbeat {
    Heartbeat {
        memory_total_mb: u64::try_from(hb.memory_total_mb).ok().filter(|m| *m > 0),
        disk_free_gb: (!hb.storage.is_empty()).then(|| disk_free_gb(&hb.storage)),
        weights: hb
            .weights_changed
            .then(|| hb.weights.iter().map(|w| w.path.clone()).collect()),
        engines: hb
            .engines_changed
            .then(|| hb.engine_versions.clone().into_iter().collect()),
        // A negative index names no card the node registered.
        gpus: hb.gpus_changed.then(|| {
            hb.gpus
                .iter()
                .filter_map(|g| {
                    Some(GpuLook {
                        index: u32::try_from(g.index).ok()?,
                        problems: g.problems.clone(),
                    })
                })
                .collect()
        }),
    }
}

/// The free disk `min_disk_gb` is checked against, in GB: the room where
/// the node's weights go. An agent lists its weights cache's filesystem
/// first (fetched weights land there), so that one's; None (no check)
/// when it is a shared filer, whose space is not the node's own, or when
/// the node lists none. The sum over every filesystem counted room the
/// weights never go to: a 24 GB cache beside 79 GB free on / read as
/// 104 GB, and a model needing 100 GB was placed there. An agent from
/// before the cache came first listed its model directories first, the
/// cache last: its first filesystem is the cache's when it has no model
/// directory of its own or they share the cache's disk. The agent's
/// `agent inventory` prints the same figure (its storage::weights_free_gb).
pub(crate) fn disk_free_gb(storage: &[v1::Storage]) -> Option<u64> {
    storage
        .first()
        .filter(|s| !s.shared)
        .map(|s| u64::try_from(s.free_bytes).unwrap_or(0) / 1_000_000_000)
}

fn gpu(g: &v1::Gpu) -> Gpu {
    let memory_mb = u64::try_from(g.memory_total_mb).unwrap_or(0);
    let class = if g.class.is_empty() {
        // An agent that did not name the class: derive it the same way.
        let name = g.name.to_lowercase();
        let model = name.split_whitespace().last().unwrap_or("gpu").to_owned();
        format!("{model}-{}g", (memory_mb as f64 / 1024.0).round() as u64)
    } else {
        g.class.clone()
    };
    Gpu {
        index: u32::try_from(g.index).unwrap_or(0),
        uuid: g.uuid.clone(),
        class,
        memory_mb,
        nvlink_peers: g
            .nvlink_peers
            .iter()
            .filter_map(|p| u32::try_from(*p).ok())
            .collect(),
        problems: g.problems.clone(),
    }
}

pub(crate) fn state_from_wire(s: i32) -> Option<ShardState> {
    use v1::shard_status::State as W;
    Some(match W::try_from(s).ok()? {
        W::Unspecified => return None,
        W::Pending => ShardState::Pending,
        W::Starting => ShardState::Starting,
        W::Loading => ShardState::Loading,
        W::Ready => ShardState::Ready,
        W::Draining => ShardState::Draining,
        W::Stopped => ShardState::Stopped,
        W::Failed => ShardState::Failed,
    })
}

/// The rendezvous port of a multi-node replica: beside the engine port
/// range, so it never collides with an engine's HTTP port.
pub(crate) fn rendezvous_port(http_port: u16) -> u16 {
    http_port.saturating_add(1000)
}

pub(crate) fn start_shard(start: &Start, mgmt_interface: &str) -> v1::StartShard {
    let Start {
        placement,
        shard,
        model,
        profile,
        leader_addr,
    } = start;
    let rank0_port = placement
        .shards
        .iter()
        .find(|s| s.rank == 0)
        .map_or(shard.port, |s| s.port);
    v1::StartShard {
        replica_id: placement.replica_id.to_string(),
        shard_id: shard.shard_id.to_string(),
        rank: shard.rank as i32,
        nnodes: placement.shards.len() as i32,
        leader_addr: leader_addr.to_owned(),
        leader_port: i32::from(rendezvous_port(rank0_port)),
        gpu_indices: shard.gpu_indices.iter().map(|g| *g as i32).collect(),
        hcas: shard.hcas.clone(),
        mgmt_interface: mgmt_interface.to_owned(),
        http_port: i32::from(shard.port),
        profile: Some(v1::EngineProfile {
            name: profile.name.clone(),
            engine: profile.engine.name().to_owned(),
            gpu_class: profile.gpu_class.clone().unwrap_or_default(),
            tp: profile.tp as i32,
            pp: profile.pp as i32,
            gpus_per_node: profile.gpus_per_node as i32,
            nodes: profile.nodes as i32,
            args: profile.args.clone(),
            env: profile.env.clone().into_iter().collect(),
            // An engine needs something to load; a model without a source
            // (the sim engine's) is named by itself.
            model_path: if model.source.is_empty() {
                model.name.clone()
            } else {
                model.source.clone()
            },
            served_model_name: model.name.clone(),
            context_length: model.context_length.unwrap_or(0),
        }),
        startup_timeout_ms: i64::from(profile.startup_timeout_s.unwrap_or(600)) * 1000,
        pool: placement.pool.clone(),
        fabric: placement.fabric.clone().unwrap_or_default(),
        profile_fp: placement.profile_fp.clone(),
        model: model.name.clone(),
        source: model.source.clone(),
        checksum: model.checksum.clone().unwrap_or_default(),
        // A setting of the server, not of the model: the sender adds it.
        mirror_url: String::new(),
    }
}

/// A running shard as the agent reports it, in the domain's terms: numbers
/// out of range become 0 (and GPU indices are dropped), as they always
/// have for adoption and the ports a stopping process holds.
pub(crate) fn running_shard(s: &v1::RunningShard) -> RunningShard {
    RunningShard {
        replica_id: s.replica_id.as_str().into(),
        shard_id: s.shard_id.as_str().into(),
        rank: u32::try_from(s.rank).unwrap_or(0),
        nnodes: u32::try_from(s.nnodes).unwrap_or(0).max(1),
        gpu_indices: s
            .gpu_indices
            .iter()
            .filter_map(|g| u32::try_from(*g).ok())
            .collect(),
        hcas: s.hcas.clone(),
        port: u16::try_from(s.http_port).unwrap_or(0),
        state: state_from_wire(s.state),
        model: s.model.clone(),
        profile: s.profile.clone(),
        profile_fp: s.profile_fp.clone(),
        pool: s.pool.clone(),
        fabric: s.fabric.clone(),
    }
}

/// A node's provisioning report, its texts clipped (a detail is an
/// error message from the node).
pub(crate) fn provision(p: &[v1::ProvisionStatus]) -> Vec<llmgw_api::admin::ProvisionRow> {
    use crate::wire::{MAX_ERROR, clip};
    p.iter()
        .map(|s| llmgw_api::admin::ProvisionRow {
            engine: clip(&s.engine, 64),
            version: clip(&s.version, 64),
            variant: clip(&s.variant, 64),
            state: clip(&s.state, 16),
            detail: clip(&s.detail, MAX_ERROR),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn storage(path: &str, free_gb: i64, shared: bool) -> v1::Storage {
        v1::Storage {
            path: path.into(),
            free_bytes: free_gb * 1_000_000_000 + 123,
            total_bytes: 2 * free_gb * 1_000_000_000,
            shared,
        }
    }

    /// The audit's node: the cache on a 24 GB tmpfs, a model directory on
    /// / with 79 GB free. It read as 104 GB, and a model needing 100 GB
    /// was placed where its weights could not land.
    #[test]
    fn free_disk_is_the_weights_caches_not_the_sum_of_every_disk() {
        let listed = vec![
            storage("/var/lib/llmgw-weights", 24, false),
            storage("/models", 79, false),
        ];
        let reg = v1::Register {
            storage: listed.clone(),
            ..v1::Register::default()
        };
        assert_eq!(inventory(&reg).disk_free_gb, Some(24));
        let hb = v1::Heartbeat {
            storage: listed,
            ..v1::Heartbeat::default()
        };
        assert_eq!(heartbeat(hb).disk_free_gb, Some(Some(24)));
    }

    /// A cache on a shared filer: its room is not the node's own, and the
    /// node's local disks are not where weights go. No check, as when a
    /// node lists nothing; a heartbeat without storage says nothing.
    #[test]
    fn a_cache_on_a_shared_filer_or_none_listed_checks_nothing() {
        let shared = vec![
            storage("/mnt/nfs/weights", 500, true),
            storage("/models", 79, false),
        ];
        assert_eq!(disk_free_gb(&shared), None);
        let hb = v1::Heartbeat {
            storage: shared,
            ..v1::Heartbeat::default()
        };
        assert_eq!(heartbeat(hb).disk_free_gb, Some(None));
        assert_eq!(disk_free_gb(&[]), None);
        assert_eq!(heartbeat(v1::Heartbeat::default()).disk_free_gb, None);
        let mut odd = storage("/cache", 1, false);
        odd.free_bytes = -5;
        assert_eq!(disk_free_gb(&[odd]), Some(0), "a negative count is none");
    }
}
