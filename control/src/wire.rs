//! What an agent's messages may say. Protobuf decodes almost any bytes
//! into some message, and a well-formed one can still carry a negative GPU
//! index, a port beyond 65535 or a list no node has; such values are
//! refused here, with the field that holds them, before they become
//! commands (a negative index read as 0 would put two shards on one card).
//! The refusal ends the agent's stream with INVALID_ARGUMENT and the
//! reason, so a broken agent is seen rather than half-believed.
//!
//! The caps are far above any real node and far below what would make a
//! reconciler pass or an event slow: one message is at most 4 MiB anyway.

use llmgw_api::v1;

/// GPUs on one node (the largest boards have 16).
pub(crate) const MAX_GPUS: usize = 256;
/// Shards one node runs at once.
pub(crate) const MAX_SHARDS: usize = 1024;
/// Nodes one replica spans.
pub(crate) const MAX_NODES_PER_REPLICA: i32 = 256;
/// Entries of the other lists (labels, weights, filesystems, adapters…).
pub(crate) const MAX_ENTRIES: usize = 10_000;
/// A shard's error message, as stored: an engine may print anything.
pub(crate) const MAX_ERROR: usize = 4096;

fn count(what: &str, n: usize, max: usize) -> Result<(), String> {
    if n > max {
        return Err(format!("{n} {what} (at most {max})"));
    }
    Ok(())
}

fn not_negative(what: &str, v: i64) -> Result<(), String> {
    if v < 0 {
        return Err(format!("{what} is {v}, below 0"));
    }
    Ok(())
}

fn port(what: &str, v: i32) -> Result<(), String> {
    if !(1..=i32::from(u16::MAX)).contains(&v) {
        return Err(format!("{what} {v} is not a port (1 to 65535)"));
    }
    Ok(())
}

fn gpu(g: &v1::Gpu) -> Result<(), String> {
    let at = |what: &str| format!("GPU {}: {what}", g.index);
    not_negative("a GPU index", i64::from(g.index))?;
    not_negative(&at("memory_total_mb"), i64::from(g.memory_total_mb))?;
    count(&at("NVLink peers"), g.nvlink_peers.len(), MAX_GPUS)?;
    if let Some(p) = g.nvlink_peers.iter().find(|p| **p < 0) {
        return Err(at(&format!("NVLink peer {p} is below 0")));
    }
    count(&at("problems"), g.problems.len(), MAX_ENTRIES)
}

fn storage(s: &[v1::Storage]) -> Result<(), String> {
    count("filesystems", s.len(), MAX_ENTRIES)?;
    for f in s {
        not_negative(&format!("{}: free_bytes", f.path), f.free_bytes)?;
        not_negative(&format!("{}: total_bytes", f.path), f.total_bytes)?;
    }
    Ok(())
}

/// A running shard as an agent reports it, for adoption.
fn running(s: &v1::RunningShard) -> Result<(), String> {
    let at = |what: String| format!("running shard {}: {what}", s.shard_id);
    if s.shard_id.is_empty() || s.replica_id.is_empty() {
        return Err(at("no shard or replica id".into()));
    }
    if !(1..=MAX_NODES_PER_REPLICA).contains(&s.nnodes) {
        return Err(at(format!(
            "nnodes {} is not 1 to {MAX_NODES_PER_REPLICA}",
            s.nnodes
        )));
    }
    if !(0..s.nnodes).contains(&s.rank) {
        return Err(at(format!("rank {} is not 0 to {}", s.rank, s.nnodes - 1)));
    }
    port("http_port", s.http_port).map_err(at)?;
    count("GPU indices", s.gpu_indices.len(), MAX_GPUS).map_err(at)?;
    if let Some(g) = s.gpu_indices.iter().find(|g| **g < 0) {
        return Err(at(format!("GPU index {g} is below 0")));
    }
    count("adapters", s.hcas.len(), MAX_ENTRIES).map_err(at)
}

/// A registration: the inventory and the running shards.
pub(crate) fn register(r: &v1::Register) -> Result<(), String> {
    count("GPUs", r.gpus.len(), MAX_GPUS)?;
    r.gpus.iter().try_for_each(gpu)?;
    count("labels", r.labels.len(), MAX_ENTRIES)?;
    count("fabrics", r.fabrics.len(), MAX_ENTRIES)?;
    for f in &r.fabrics {
        count(
            &format!("fabric {}: adapters", f.fabric),
            f.hcas.len(),
            MAX_ENTRIES,
        )?;
        not_negative(
            &format!("fabric {}: rate_gbps", f.fabric),
            i64::from(f.rate_gbps),
        )?;
    }
    count("engines", r.engine_versions.len(), MAX_ENTRIES)?;
    not_negative("memory_total_mb", r.memory_total_mb)?;
    count("weights", r.weights.len(), MAX_ENTRIES)?;
    for w in &r.weights {
        not_negative(&format!("weights {}: size_bytes", w.path), w.size_bytes)?;
    }
    storage(&r.storage)?;
    count("running shards", r.running_shards.len(), MAX_SHARDS)?;
    count(
        "shards stopped on exit",
        r.stopped_on_exit.len(),
        MAX_SHARDS,
    )?;
    r.running_shards.iter().try_for_each(running)
}

/// A heartbeat: its lists are bounded like a registration's.
pub(crate) fn heartbeat(h: &v1::Heartbeat) -> Result<(), String> {
    storage(&h.storage)?;
    count("weights", h.weights.len(), MAX_ENTRIES)?;
    count("engines", h.engine_versions.len(), MAX_ENTRIES)?;
    count("provisioning entries", h.provision.len(), MAX_ENTRIES)?;
    count("GPUs", h.gpus.len(), MAX_GPUS)?;
    for g in &h.gpus {
        not_negative("a GPU index", i64::from(g.index))?;
        count(
            &format!("GPU {}: problems", g.index),
            g.problems.len(),
            MAX_ENTRIES,
        )?;
    }
    count("GPU figures", h.gpu_figures.len(), MAX_GPUS)?;
    if let Some(g) = h.gpu_figures.iter().find(|g| g.index < 0) {
        return Err(format!("GPU figures for index {}, below 0", g.index));
    }
    not_negative("memory_total_mb", h.memory_total_mb)
}

/// `s` cut to at most `max` bytes, on a character boundary.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_no_node_has_are_refused_with_the_field_that_holds_them() {
        let mut r = v1::Register::default();
        assert_eq!(register(&r), Ok(()));
        r.gpus = vec![v1::Gpu {
            index: -1,
            ..v1::Gpu::default()
        }];
        assert_eq!(register(&r), Err("a GPU index is -1, below 0".into()));
        r.gpus = (0..300)
            .map(|i| v1::Gpu {
                index: i,
                ..v1::Gpu::default()
            })
            .collect();
        assert_eq!(register(&r), Err("300 GPUs (at most 256)".into()));
        r.gpus.clear();
        r.running_shards = vec![v1::RunningShard {
            replica_id: "r".into(),
            shard_id: "s".into(),
            nnodes: 1,
            rank: 0,
            http_port: 70_000,
            ..v1::RunningShard::default()
        }];
        assert_eq!(
            register(&r),
            Err("running shard s: http_port 70000 is not a port (1 to 65535)".into())
        );
        r.running_shards[0].http_port = 8000;
        r.running_shards[0].rank = 2;
        assert_eq!(
            register(&r),
            Err("running shard s: rank 2 is not 0 to 0".into())
        );
    }

    #[test]
    fn clipping_keeps_whole_characters() {
        assert_eq!(clip("héllo", 2), "h…");
        assert_eq!(clip("hello", 5), "hello");
    }
}
