//! The server's series beside the gateway's, on its one metrics page: the
//! control plane's (leadership, nodes, replicas, what agents report) and
//! the log's (appends, the views' lag, the hash chain verified in the
//! background). The collectors live in `llmgw-control`; this wires them to
//! the gateway's registry and runs the two samplers they read.

use std::sync::Arc;
use std::time::Duration;

use llmgw_control::ControlPlane;
use llmgw_control::metrics::LogMetrics;
use llmgw_eventstore::{AnyStore, ChainWatch};
use llmgw_gateway::Gateway;
use llmgw_projections::Lag;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often the views' lag is sampled (the head is one indexed read).
const LAG_EVERY: Duration = Duration::from_secs(5);
/// How often the hash chain is verified, from where the last pass ended
/// (once the views have read something new).
const CHAIN_EVERY: Duration = Duration::from_secs(300);

/// The samplers behind the series; they stop when this is dropped.
#[derive(Debug, Default)]
pub(crate) struct ServerMetrics {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for ServerMetrics {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Registers the server's collectors with `gw`'s registry (once: this is
/// called once per server) and starts what they read. `views_at` is the
/// position the server's views have reached, `views` the views.
pub(crate) fn install(
    gw: &Gateway,
    log: Option<&AnyStore>,
    views_at: Option<watch::Receiver<u64>>,
    views: Option<Arc<std::sync::RwLock<llmgw_projections::Projections>>>,
    cp: Option<&Arc<ControlPlane>>,
) -> ServerMetrics {
    let mut out = ServerMetrics::default();
    if let (Some(log), Some(at), Some(views)) = (log, views_at, views) {
        let lag = Lag::new();
        let chain = ChainWatch::new();
        out.tasks.push(tokio::spawn(lag.clone().run(
            log.clone(),
            at.clone(),
            LAG_EVERY,
        )));
        out.tasks.push(tokio::spawn(chain.clone().run(
            log.clone(),
            CHAIN_EVERY,
            at,
        )));
        gw.metrics
            .register(Box::new(LogMetrics { lag, chain, views }));
    }
    if let Some(cp) = cp {
        gw.metrics.register(Box::new(cp.metrics()));
    }
    out
}
