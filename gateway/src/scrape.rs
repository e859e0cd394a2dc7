//! Engine load, scraped from each endpoint's `/metrics` every interval in
//! the vocabulary of its engine: running and waiting requests are required,
//! KV-cache usage is optional (llama.cpp publishes none). A scrape that
//! fails, or that lacks a required metric, leaves the endpoint's figures
//! stale; stale endpoints are flagged and routed around.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Endpoint, Gateway};

/// Which engine an endpoint runs, for its metric names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineKind {
    #[default]
    Vllm,
    Sglang,
    Llamacpp,
    Sim,
}

impl std::str::FromStr for EngineKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "vllm" => Ok(EngineKind::Vllm),
            "sglang" => Ok(EngineKind::Sglang),
            "llamacpp" => Ok(EngineKind::Llamacpp),
            "sim" => Ok(EngineKind::Sim),
            other => Err(format!(
                "unknown engine {other:?}: vllm, sglang, llamacpp or sim"
            )),
        }
    }
}

pub use llmgw_domain::engine_load::Vocabulary;
use llmgw_domain::engine_load::value;

impl EngineKind {
    pub fn vocabulary(self) -> Vocabulary {
        use llmgw_domain::catalog::Engine;
        match self {
            EngineKind::Vllm => Engine::Vllm,
            EngineKind::Sglang => Engine::Sglang,
            EngineKind::Llamacpp => Engine::Llamacpp,
            EngineKind::Sim => Engine::Sim,
        }
        .vocabulary()
    }
}

/// An engine's load as last scraped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    pub running: f64,
    pub waiting: f64,
    pub kv_usage: Option<f64>,
    pub at: Instant,
}

/// The load in a page, or why it is unusable.
pub fn parse(page: &str, vocabulary: Vocabulary, at: Instant) -> Result<Load, String> {
    let need = |n: &str| value(page, n).ok_or_else(|| format!("the page has no {n}"));
    Ok(Load {
        running: need(vocabulary.running)?,
        waiting: need(vocabulary.waiting)?,
        kv_usage: vocabulary.kv_usage.and_then(|n| value(page, n)),
        at,
    })
}

/// Scrapes every endpoint once, concurrently.
pub async fn scrape_once(gw: &Arc<Gateway>) {
    let endpoints = gw.endpoints.snapshot();
    let scrapes = endpoints.iter().map(|e| scrape(gw, e));
    futures_util::future::join_all(scrapes).await;
    gw.admission.load_changed();
}

async fn scrape(gw: &Arc<Gateway>, e: &Arc<Endpoint>) {
    let url = format!("{}/metrics", e.spec.url);
    let mut request = gw.client.get(&url).timeout(Duration::from_secs(1));
    if let Some(key) = &e.spec.api_key {
        request = request.bearer_auth(key.expose());
    }
    let answer = request.send().await;
    // Silent only when nothing listens there: a slow metrics page (an
    // engine under load) timing out is an engine that is there.
    e.heard(answer.as_ref().is_ok() || answer.as_ref().is_err_and(|e| !e.is_connect()));
    let page = match answer {
        Ok(r) if r.status().is_success() => r.text().await.ok(),
        _ => None,
    };
    match page.map(|p| parse(&p, e.spec.engine.vocabulary(), Instant::now())) {
        Some(Ok(load)) => e.scraped(Some(load)),
        Some(Err(why)) => {
            e.scraped(None);
            if e.warn_contract_once() {
                tracing::warn!(endpoint = %e.spec.id, %why, "engine metrics break the vocabulary contract");
            }
        }
        None => {
            e.scraped(None);
            tracing::debug!(endpoint = %e.spec.id, "metrics scrape failed");
        }
    }
}

/// Scrapes every `interval` until dropped.
pub async fn run(gw: Arc<Gateway>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        scrape_once(&gw).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_vocabulary_reads_its_engine_and_kv_is_optional() {
        let vllm = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"a\"} 2\nvllm:num_requests_running{model_name=\"b\"} 1\nvllm:num_requests_waiting{model_name=\"a\"} 4\nvllm:kv_cache_usage_perc{model_name=\"a\"} 0.5\n";
        let l = parse(vllm, EngineKind::Vllm.vocabulary(), Instant::now()).unwrap();
        assert_eq!((l.running, l.waiting, l.kv_usage), (3.0, 4.0, Some(0.5)));
        let llama = "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n";
        let l = parse(llama, EngineKind::Llamacpp.vocabulary(), Instant::now()).unwrap();
        assert_eq!(l.kv_usage, None, "absent, not zero");
        let err = parse(vllm, EngineKind::Sglang.vocabulary(), Instant::now()).unwrap_err();
        assert!(err.contains("sglang:num_running_reqs"));
        // A longer name with the same prefix is not the metric.
        assert_eq!(
            value(
                "vllm:num_requests_running_total 9\n",
                "vllm:num_requests_running"
            ),
            None
        );
    }
}
