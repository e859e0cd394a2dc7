use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use llmgw_sim::{Bound, Cluster, SimConfig, Vocabulary};

use crate::Outcome;

#[derive(Debug, Args)]
pub(crate) struct SimArgs {
    /// Where to serve HTTP; port 0 picks a free one (printed on start).
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// A model name to serve; repeat for several.
    #[arg(long = "model", required = true)]
    models: Vec<String>,
    /// Whose metric names to publish: vllm, sglang, llamacpp or sim.
    #[arg(long, default_value = "vllm")]
    engine: Vocabulary,
    /// Fixed part of the time to first token, in milliseconds.
    #[arg(long, default_value_t = 20)]
    ttft_ms: u64,
    /// Prompt tokens prefilled per second (cached prefix blocks are free).
    #[arg(long, default_value_t = 20_000)]
    prefill_tps: u32,
    /// Tokens generated per second per request.
    #[arg(long, default_value_t = 100)]
    tps: u32,
    /// Requests generating at once.
    #[arg(long, default_value_t = 8)]
    slots: usize,
    /// Requests waiting for a slot before new ones get 503.
    #[arg(long, default_value_t = 256)]
    queue: usize,
    /// Prefix-cache capacity in blocks.
    #[arg(long, default_value_t = 4096)]
    kv_blocks: usize,
    /// Prefix-cache block size in bytes of prompt.
    #[arg(long, default_value_t = 64)]
    block_bytes: usize,
    /// Completion length when a request names none.
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// The model's context in tokens, as vLLM's flag: a request whose
    /// prompt and completion exceed it is refused (400), and /v1/models
    /// says it. None without it.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_model_len: Option<u32>,
    /// Nodes in a multi-node group; rank 0 serves once all have joined.
    #[arg(long, default_value_t = 1)]
    nnodes: u32,
    /// This node's rank in the group (0 serves).
    #[arg(long = "node-rank", alias = "rank", default_value_t = 0)]
    rank: u32,
    /// Rank 0's rendezvous address (rank 0 binds it, workers dial it).
    #[arg(long = "dist-init-addr", alias = "rendezvous")]
    rendezvous: Option<SocketAddr>,
    /// How long a worker keeps dialling rank 0, in seconds.
    #[arg(long, default_value_t = 300)]
    join_timeout_s: u64,
    /// Refuse /v1/* without this bearer token, as a hosted service does
    /// (from the variable, so that it stays off the command line).
    #[arg(long = "api-key", env = "LLMGW_SIM_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// How a chat request offering tools is answered: `native` (a
    /// `tool_calls` message calling the first tool, as an engine with its
    /// tool parser on), `text` (the call written as `<tool_call>` text in
    /// the content, as a model with no parser to lift it), `ignore` (a
    /// plain answer).
    #[arg(long, default_value = "native")]
    tools: llmgw_sim::ToolCalls,
    /// Publish the prefix cache's changes as vLLM's KV-cache events on a
    /// ZeroMQ PUB socket bound here, `tcp://IP:PORT` (port 0 picks one,
    /// printed on start).
    #[arg(long = "kv-events", value_parser = llmgw_sim::kv_events::parse_endpoint)]
    kv_events: Option<SocketAddr>,
    /// Also answer replay requests for missed event batches on a ROUTER
    /// socket bound here, `tcp://IP:PORT`.
    #[arg(long = "kv-events-replay", value_parser = llmgw_sim::kv_events::parse_endpoint, requires = "kv_events")]
    kv_events_replay: Option<SocketAddr>,
}

pub(crate) async fn run(a: SimArgs) -> anyhow::Result<Outcome> {
    let cluster = match (a.nnodes, a.rendezvous) {
        (1, _) => None,
        (0, _) => bail!("--nnodes must be at least 1"),
        (_, None) => bail!("a multi-node group needs --dist-init-addr HOST:PORT"),
        (nnodes, Some(rendezvous)) => Some(Cluster {
            nnodes,
            rank: a.rank,
            rendezvous,
            join_timeout: Duration::from_secs(a.join_timeout_s),
        }),
    };
    let config = SimConfig {
        models: a.models,
        vocabulary: a.engine,
        ttft: Duration::from_millis(a.ttft_ms),
        prefill_tokens_per_s: a.prefill_tps,
        tokens_per_s: a.tps,
        slots: a.slots,
        queue: a.queue,
        kv_blocks: a.kv_blocks,
        block_bytes: a.block_bytes,
        default_max_tokens: a.max_tokens,
        max_model_len: a.max_model_len,
        api_key: a.api_key,
        tools: a.tools,
        kv_events: a.kv_events.map(|publish| llmgw_sim::KvEventsConfig {
            publish,
            replay: a.kv_events_replay,
            buffer: 10_000,
        }),
    };
    let serve = llmgw_sim::run(config, a.listen, cluster, |bound| {
        let mut out = std::io::stdout().lock();
        let _ = match bound {
            Bound::Rendezvous(addr) => writeln!(out, "rendezvous on {addr}"),
            Bound::Http(addr) => writeln!(out, "listening on {addr}"),
            Bound::KvEvents(addr) => writeln!(out, "kv events on tcp://{addr}"),
            Bound::KvReplay(addr) => writeln!(out, "kv events replay on tcp://{addr}"),
        };
        let _ = out.flush();
    });
    tokio::select! {
        r = serve => r?,
        _ = shutdown() => {}
    }
    Ok(Outcome::Ok)
}

/// SIGINT or SIGTERM. The handlers are installed when this is called, not
/// when the future is first polled: a daemon calls it before it tells
/// systemd (or a test) that it is ready, so a signal sent right after
/// READY=1 is never met by the default action, and a loop that polls it
/// again and again never leaves a gap where a signal is lost.
pub(crate) fn shutdown() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            match (term, int) {
                (Some(mut term), Some(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
