//! The agent's own metrics: whether its stream to a leader is up, how
//! often it had to dial again, and the shards it supervises by state.
//! The node's hardware figures are not here: they travel in heartbeats and
//! the control plane publishes them for the whole cluster.
//!
//! The session loop updates an [`AgentStats`]; [`render`] writes them in
//! the Prometheus text format for `llmgw agent run --metrics-listen`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::supervisor::Status;

/// Shared between the session loop and the metrics page.
#[derive(Debug, Default)]
pub struct AgentStats {
    connected: AtomicBool,
    /// Streams opened so far; every one after the first is a reconnect.
    sessions: AtomicU64,
    /// The status of every shard the agent supervises, read at scrape
    /// time, so a state is never stale however long the stream is down.
    shards: Mutex<Vec<watch::Receiver<Status>>>,
    /// Commands refused because they came from a deposed leader.
    refused: AtomicU64,
}

impl AgentStats {
    /// Whether a stream to a leader is up.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Streams opened after the first (each one means the last was lost).
    pub fn reconnects(&self) -> u64 {
        self.sessions.load(Ordering::Relaxed).saturating_sub(1)
    }

    /// Shards supervised, by state name (`ready`, `loading`, …).
    pub fn shards(&self) -> BTreeMap<String, u64> {
        let shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        let mut by_state = BTreeMap::new();
        for s in shards.iter() {
            *by_state.entry(s.borrow().state.to_string()).or_insert(0) += 1;
        }
        by_state
    }

    /// Commands refused so far because their sender was deposed.
    pub fn refused_commands(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub(crate) fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stream_up(&self) {
        self.sessions.fetch_add(1, Ordering::Relaxed);
        self.connected.store(true, Ordering::Relaxed);
    }

    pub(crate) fn stream_down(&self) {
        self.connected.store(false, Ordering::Relaxed);
    }

    /// The shards supervised now.
    pub(crate) fn supervising(&self, shards: Vec<watch::Receiver<Status>>) {
        *self.shards.lock().unwrap_or_else(|p| p.into_inner()) = shards;
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct StateLabels {
    state: String,
}

/// The agent's page: build, connection, reconnects and shards by state.
pub fn render(stats: &AgentStats) -> String {
    let mut registry = Registry::with_prefix("llmgw");
    let build = Family::<VersionLabels, Gauge>::default();
    build
        .get_or_create(&VersionLabels {
            version: env!("CARGO_PKG_VERSION"),
        })
        .set(1);
    registry.register(
        "build_info",
        "Always 1; the version label is this binary's",
        build,
    );
    registry.register(
        "agent_connected",
        "1 while the agent's stream to the leading control plane is up",
        ConstGauge::new(i64::from(stats.connected())),
    );
    registry.register(
        "agent_reconnects",
        "Streams to a control plane opened after the first (each means the previous was lost)",
        ConstCounter::new(stats.reconnects()),
    );
    registry.register(
        "agent_commands_refused",
        "Commands not carried out because they came from a leader under a lower lease epoch than the agent has seen (a deposed leader)",
        ConstCounter::new(stats.refused_commands()),
    );
    let shards = Family::<StateLabels, Gauge>::default();
    for (state, n) in stats.shards() {
        shards.get_or_create(&StateLabels { state }).set(n as i64);
    }
    registry.register(
        "agent_shards",
        "Shards the agent supervises, by state",
        shards,
    );
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::State;

    fn status(state: State) -> watch::Receiver<Status> {
        watch::channel(Status {
            state,
            exit_code: None,
            error: None,
            log_tail: String::new(),
            pids: Vec::new(),
        })
        .1
    }

    #[test]
    fn the_page_shows_the_stream_reconnects_and_shards_by_state() {
        let stats = AgentStats::default();
        let page = render(&stats);
        assert!(page.contains("llmgw_agent_connected 0"), "{page}");
        assert!(page.contains("llmgw_agent_reconnects_total 0"), "{page}");
        assert!(page.contains(&format!(
            "llmgw_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )));
        stats.stream_up();
        stats.stream_down();
        stats.stream_up();
        stats.refused();
        stats.supervising(vec![
            status(State::Ready),
            status(State::Ready),
            status(State::Loading),
        ]);
        let page = render(&stats);
        for line in [
            "llmgw_agent_connected 1",
            "llmgw_agent_reconnects_total 1",
            "llmgw_agent_commands_refused_total 1",
            "llmgw_agent_shards{state=\"ready\"} 2",
            "llmgw_agent_shards{state=\"loading\"} 1",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} in {page}");
        }
        for help in [
            "build_info",
            "agent_connected",
            "agent_reconnects",
            "agent_commands_refused",
            "agent_shards",
        ] {
            assert!(page.contains(&format!("# HELP llmgw_{help} ")), "{page}");
        }
    }
}
