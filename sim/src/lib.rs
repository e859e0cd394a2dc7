//! `llmgw sim-engine`: an OpenAI-compatible inference engine that does no
//! inference, good enough to test routing, admission and streaming against.
//!
//! What belongs here: the simulated engine's HTTP surface
//! (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
//! `/v1/models`, `/health`, `/metrics`), its timing model (a time to first
//! token shortened by prefix-cache hits, a decode rate, concurrency slots and
//! a bounded waiting queue), the request fields OpenAI's API serves (`stop`,
//! `n`, list prompts, `echo`, `logprobs`; errors naming their `param`), its
//! deterministic text (an interrupted answer continues exactly), its metrics in the vocabulary of the engine it
//! imitates, and multi-node rendezvous. What must not: anything the gateway
//! or the agent would depend on; they talk to it over HTTP like a real engine.

mod cache;
mod cluster;
mod engine;
pub mod kv_events;
mod metrics;
mod text;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use cluster::{Cluster, ClusterError};
pub use engine::{SimState, app};
pub use kv_events::{KvEventsConfig, KvPublisher};

/// An address the engine has bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Rank 0's rendezvous port, bound before any worker has joined.
    Rendezvous(SocketAddr),
    /// The HTTP port: the engine now serves.
    Http(SocketAddr),
    /// The KV-cache events' PUB socket (before the HTTP port).
    KvEvents(SocketAddr),
    /// Their replay socket.
    KvReplay(SocketAddr),
}

/// Whose metric names `/metrics` publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vocabulary {
    Vllm,
    Sglang,
    Llamacpp,
    Sim,
}

impl std::str::FromStr for Vocabulary {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "vllm" => Ok(Vocabulary::Vllm),
            "sglang" => Ok(Vocabulary::Sglang),
            "llamacpp" | "llama.cpp" => Ok(Vocabulary::Llamacpp),
            "sim" => Ok(Vocabulary::Sim),
            other => Err(format!(
                "unknown engine {other:?}: use vllm, sglang, llamacpp or sim"
            )),
        }
    }
}

/// How the simulated engine behaves.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub models: Vec<String>,
    pub vocabulary: Vocabulary,
    /// Fixed part of the time to first token.
    pub ttft: Duration,
    /// Prompt tokens prefilled per second; cached prefix blocks skip it.
    pub prefill_tokens_per_s: u32,
    /// Tokens generated per second per request.
    pub tokens_per_s: u32,
    /// Requests generating at once.
    pub slots: usize,
    /// Requests waiting for a slot before new ones are refused.
    pub queue: usize,
    /// Prefix-cache capacity, in blocks.
    pub kv_blocks: usize,
    pub block_bytes: usize,
    /// Completion length when a request names none.
    pub default_max_tokens: u32,
    /// Refuse `/v1/*` without `Authorization: Bearer <key>`, as a hosted
    /// service (or llama-server's `--api-key`) does.
    pub api_key: Option<String>,
    /// How a chat request that offers tools is answered.
    pub tools: ToolCalls,
    /// Publish the prefix cache's changes as vLLM's KV-cache events.
    pub kv_events: Option<KvEventsConfig>,
    /// The model's context, in tokens (vLLM's `--max-model-len`): a
    /// request whose prompt and completion would not fit is refused, as
    /// vLLM refuses it. None: no limit.
    pub max_model_len: Option<u32>,
}

/// How the engine answers a chat request that offers tools: as an engine
/// whose tool parser is on (`tool_calls`), as one serving a model that
/// writes its call as text with no parser to lift it (`<tool_call>` in the
/// content), or as a model that ignores the tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ToolCalls {
    #[default]
    Native,
    Text,
    Ignore,
}

impl std::str::FromStr for ToolCalls {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "native" => Ok(ToolCalls::Native),
            "text" => Ok(ToolCalls::Text),
            "ignore" => Ok(ToolCalls::Ignore),
            other => Err(format!("{other:?}: use native, text or ignore")),
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            models: vec!["sim-model".into()],
            vocabulary: Vocabulary::Vllm,
            ttft: Duration::from_millis(20),
            prefill_tokens_per_s: 20_000,
            tokens_per_s: 100,
            slots: 8,
            queue: 256,
            kv_blocks: 4096,
            block_bytes: 64,
            default_max_tokens: 16,
            api_key: None,
            tools: ToolCalls::Native,
            kv_events: None,
            max_model_len: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving HTTP")]
    Serve(#[source] std::io::Error),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// [`spawn`]'s engine ended without having served.
    #[error("the engine stopped before serving")]
    Stopped,
}

impl SimConfig {
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: &str| Err(SimError::Config(m.into()));
        if self.models.is_empty() {
            return bad("at least one --model");
        }
        if self.slots == 0 || self.tokens_per_s == 0 || self.prefill_tokens_per_s == 0 {
            return bad("slots, tokens per second and prefill tokens per second must be positive");
        }
        if self.block_bytes == 0 || self.kv_blocks == 0 {
            return bad("the KV cache needs a positive block size and capacity");
        }
        if self.kv_events.is_some() && !self.block_bytes.is_multiple_of(4) {
            return bad(
                "KV-cache events count whole tokens of four bytes: the block size must be a multiple of 4",
            );
        }
        Ok(())
    }
}

/// Serves on `listen` until the future is dropped. With a cluster, rank 0
/// serves only once every worker has joined its rendezvous, and a worker
/// serves nothing: it holds its place until rank 0 goes away.
/// `on_event` learns the bound addresses (useful with port 0).
pub async fn run(
    config: SimConfig,
    listen: SocketAddr,
    cluster: Option<Cluster>,
    mut on_event: impl FnMut(Bound),
) -> Result<(), SimError> {
    config.validate()?;
    if let Some(c) = &cluster {
        if c.rank > 0 {
            return Ok(c.join_as_worker().await?);
        }
        c.gather_workers(|addr| on_event(Bound::Rendezvous(addr)))
            .await?;
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| SimError::Listen {
            addr: listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(SimError::Serve)?;
    let (state, publishing) = match &config.kv_events {
        Some(kv) => {
            let (publisher, at, replay) = KvPublisher::bind(kv).await?;
            on_event(Bound::KvEvents(at));
            if let Some(r) = replay {
                on_event(Bound::KvReplay(r));
            }
            let (state, task) = SimState::with_kv_events(config, publisher);
            (state, Some(task))
        }
        None => (SimState::new(config), None),
    };
    on_event(Bound::Http(addr));
    let serving = axum::serve(listener, app(Arc::new(state)));
    match publishing {
        Some(task) => tokio::select! {
            r = serving => r.map_err(SimError::Serve),
            () = task => Ok(()),
        },
        None => serving.await.map_err(SimError::Serve),
    }
}

/// What an engine started by [`spawn`] has bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spawned {
    pub http: SocketAddr,
    /// The KV-cache events' PUB socket, when the config publishes them.
    pub kv_events: Option<SocketAddr>,
    /// Their replay socket, when the config has one.
    pub kv_replay: Option<SocketAddr>,
}

/// Runs an engine on loopback ports chosen by the system, in a task of its
/// own that lives as long as the runtime, and returns once it serves: what
/// tests and benchmarks need, which otherwise each collect [`Bound`]s.
pub async fn spawn(config: SimConfig) -> Result<Spawned, SimError> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(run(
        config,
        SocketAddr::from(([127, 0, 0, 1], 0)),
        None,
        move |b| {
            let _ = tx.send(b);
        },
    ));
    let (mut kv_events, mut kv_replay) = (None, None);
    while let Some(b) = rx.recv().await {
        match b {
            Bound::KvEvents(a) => kv_events = Some(a),
            Bound::KvReplay(a) => kv_replay = Some(a),
            Bound::Http(http) => {
                return Ok(Spawned {
                    http,
                    kv_events,
                    kv_replay,
                });
            }
            Bound::Rendezvous(_) => {}
        }
    }
    // The task ended before serving. Without a cluster `run` returns only
    // after serving or on an error, so this is its error (or its panic).
    match task.await {
        Ok(Err(e)) => Err(e),
        Ok(Ok(())) => Err(SimError::Stopped),
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
