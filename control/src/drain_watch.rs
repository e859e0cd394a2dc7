//! Draining replicas stop as soon as their engines are idle, instead of
//! always waiting out `drain_grace`: each pass asks every draining
//! replica's engine (rank 0, where requests arrive) for its queue. The
//! engine's own count covers every gateway's requests, not only this
//! server's. A page that cannot be read proves nothing, and the grace
//! still applies.

use std::collections::BTreeSet;
use std::time::Duration;

use llmgw_domain::State;
use llmgw_domain::catalog::Engine;
use llmgw_domain::engine_load;
use llmgw_domain::ids::ReplicaId;
use llmgw_domain::replicas::ReplicaStatus;

/// How long after a drain begins its engine is first asked: the time every
/// gateway needs to take the replica out of routing, so that a request
/// still on its way cannot arrive after the engine was seen idle.
pub(crate) const SETTLE_MS: i64 = 1_000;

/// A draining replica's engine to ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub replica_id: ReplicaId,
    /// None when its model (or profile) has left the catalog: the page is
    /// read in whichever engine's names it has.
    pub engine: Option<Engine>,
    pub url: String,
}

/// The draining replicas whose drains are older than the settle time.
pub(crate) fn targets(
    state: &State,
    drain_since: &std::collections::BTreeMap<ReplicaId, llmgw_domain::UnixMillis>,
    now: llmgw_domain::UnixMillis,
    settle: i64,
) -> Vec<Target> {
    state
        .replicas
        .replicas
        .values()
        .filter(|r| r.status == ReplicaStatus::Draining)
        .filter(|r| {
            drain_since
                .get(&r.placement.replica_id)
                .is_some_and(|since| now - *since >= settle)
        })
        .filter_map(|r| {
            let p = &r.placement;
            let rank0 = p.shards.iter().find(|s| s.rank == 0)?;
            let node = state.nodes.nodes.get(&rank0.node_id)?;
            let engine = state
                .catalog
                .models
                .get(&p.model)
                .and_then(|m| m.profiles.iter().find(|f| f.name == p.profile))
                .map(|f| f.engine);
            let host = node.inventory.address();
            Some(Target {
                replica_id: p.replica_id.clone(),
                engine,
                url: format!(
                    "http://{}:{}/metrics",
                    llmgw_domain::nodes::url_host(host),
                    rank0.port
                ),
            })
        })
        .collect()
}

/// The targets whose engines answered with nothing running or waiting.
pub(crate) async fn idle(http: &reqwest::Client, targets: Vec<Target>) -> BTreeSet<ReplicaId> {
    let mut asks = tokio::task::JoinSet::new();
    for t in targets {
        asks.spawn(ask(http.clone(), t));
    }
    let mut idle = BTreeSet::new();
    while let Some(answer) = asks.join_next().await {
        if let Ok(Some(id)) = answer {
            idle.insert(id);
        }
    }
    idle
}

async fn ask(http: reqwest::Client, t: Target) -> Option<ReplicaId> {
    let page = http
        .get(&t.url)
        .timeout(Duration::from_secs(1))
        .send()
        .await
        .ok()?
        .error_for_status()
        .ok()?
        .text()
        .await
        .ok()?;
    let queued = match t.engine {
        Some(e) => engine_load::queued(&page, e.vocabulary()),
        None => [Engine::Vllm, Engine::Sglang, Engine::Llamacpp, Engine::Sim]
            .into_iter()
            .find_map(|e| engine_load::queued(&page, e.vocabulary()).ok())
            .ok_or_else(|| "the page has no engine's queue".to_owned()),
    };
    match queued {
        Ok(q) if q <= 0.0 => Some(t.replica_id),
        Ok(_) => None,
        Err(why) => {
            tracing::debug!(replica = %t.replica_id, %why, "a draining engine's queue is unknown; its grace applies");
            None
        }
    }
}
