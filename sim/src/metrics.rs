//! `/metrics` in the names of the engine being imitated, so that the
//! router's per-engine vocabularies are exercised as they would be against
//! the real thing. The llama.cpp vocabulary publishes no KV-usage gauge, as
//! the real llama-server does not.

use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::Vocabulary;
use crate::engine::SimState;

pub(crate) async fn page(State(state): State<Arc<SimState>>) -> impl IntoResponse {
    let c = &state.counters;
    let running = c.running.load(Ordering::Relaxed);
    let waiting = c.waiting.load(Ordering::Relaxed);
    let kv = (c.kv_blocks_in_use.load(Ordering::Relaxed) as f64 / state.config.kv_blocks as f64)
        .min(1.0);
    let hits = c.prefix_hits.load(Ordering::Relaxed);
    let queries = c.prefix_queries.load(Ordering::Relaxed);
    let prompt = c.prompt_tokens.load(Ordering::Relaxed);
    let cached = c.cached_prompt_tokens.load(Ordering::Relaxed);
    let generated = c.generation_tokens.load(Ordering::Relaxed);
    let model = state.config.models.first().cloned().unwrap_or_default();
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, labels: &str, value: f64| {
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{labels} {value}");
    };
    let l = format!("{{model_name=\"{model}\"}}");
    match state.config.vocabulary {
        Vocabulary::Vllm => {
            metric("vllm:num_requests_running", "gauge", &l, running as f64);
            metric("vllm:num_requests_waiting", "gauge", &l, waiting as f64);
            metric("vllm:kv_cache_usage_perc", "gauge", &l, kv);
            metric(
                "vllm:prefix_cache_queries_total",
                "counter",
                &l,
                queries as f64,
            );
            metric("vllm:prefix_cache_hits_total", "counter", &l, hits as f64);
            metric("vllm:prompt_tokens_total", "counter", &l, prompt as f64);
            metric(
                "vllm:generation_tokens_total",
                "counter",
                &l,
                generated as f64,
            );
        }
        Vocabulary::Sglang => {
            let l = format!("{{model_name=\"{model}\"}}");
            metric("sglang:num_running_reqs", "gauge", &l, running as f64);
            metric("sglang:num_queue_reqs", "gauge", &l, waiting as f64);
            metric("sglang:token_usage", "gauge", &l, kv);
            metric(
                "sglang:cache_hit_rate",
                "gauge",
                &l,
                if queries == 0 {
                    0.0
                } else {
                    hits as f64 / queries as f64
                },
            );
            metric("sglang:prompt_tokens_total", "counter", &l, prompt as f64);
            metric(
                "sglang:generation_tokens_total",
                "counter",
                &l,
                generated as f64,
            );
        }
        Vocabulary::Llamacpp => {
            metric("llamacpp:requests_processing", "gauge", "", running as f64);
            metric("llamacpp:requests_deferred", "gauge", "", waiting as f64);
            metric("llamacpp:prompt_tokens_total", "counter", "", prompt as f64);
            metric(
                "llamacpp:prompt_tokens_cached_total",
                "counter",
                "",
                cached as f64,
            );
            metric(
                "llamacpp:tokens_predicted_total",
                "counter",
                "",
                generated as f64,
            );
        }
        Vocabulary::Sim => {
            metric("llmgw_sim_running", "gauge", "", running as f64);
            metric("llmgw_sim_waiting", "gauge", "", waiting as f64);
            metric("llmgw_sim_kv_cache_usage", "gauge", "", kv);
            metric(
                "llmgw_sim_prefix_queries_total",
                "counter",
                "",
                queries as f64,
            );
            metric("llmgw_sim_prefix_hits_total", "counter", "", hits as f64);
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}
