//! The HTTP surface and the timing model.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::ToolCalls;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};

use crate::SimConfig;
use crate::cache::PrefixCache;
use crate::kv_events::{KvEvent, KvPublisher, KvPublisherTask, KvSink};
use crate::text::{Decoder, Generator, Invalid, Prompt, Scored};

/// Counters and gauges the metrics page reads.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) running: AtomicUsize,
    pub(crate) waiting: AtomicUsize,
    pub(crate) kv_blocks_in_use: AtomicUsize,
    pub(crate) requests: AtomicU64,
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) cached_prompt_tokens: AtomicU64,
    pub(crate) generation_tokens: AtomicU64,
    pub(crate) prefix_queries: AtomicU64,
    pub(crate) prefix_hits: AtomicU64,
}

#[derive(Debug)]
pub struct SimState {
    pub(crate) config: SimConfig,
    slots: Arc<Semaphore>,
    cache: Mutex<PrefixCache>,
    pub(crate) counters: Counters,
    /// Where the cache's changes are published, when they are.
    kv_events: Option<KvSink>,
    /// This engine's part of every answer's id: two engines numbering
    /// their answers alike gave a client behind a gateway the same id for
    /// different answers (and the Responses API's ids are made from it).
    mark: u32,
}

impl SimState {
    pub fn new(config: SimConfig) -> Self {
        SimState {
            slots: Arc::new(Semaphore::new(config.slots)),
            cache: Mutex::new(PrefixCache::new(config.kv_blocks, config.block_bytes)),
            counters: Counters::default(),
            config,
            kv_events: None,
            mark: {
                use std::hash::{BuildHasher, Hasher};
                // RandomState is seeded afresh for each one made.
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u32(std::process::id());
                h.finish() as u32
            },
        }
    }

    /// An engine whose cache's changes `publisher` publishes; run the
    /// task it returns beside the engine.
    pub fn with_kv_events(config: SimConfig, publisher: KvPublisher) -> (Self, KvPublisherTask) {
        let (sink, task) = publisher.start();
        let mut state = SimState::new(config);
        state.kv_events = Some(sink);
        (state, task)
    }
}

/// The engine's routes.
pub fn app(state: Arc<SimState>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_key,
        ));
    api.route("/health", get(|| async { "ok" }))
        .route("/metrics", get(crate::metrics::page))
        .with_state(state)
}

/// With a key configured, `/v1/*` wants it as a bearer token (compared in
/// constant time); a missing or wrong one is a 401 in the OpenAI envelope.
async fn require_key(
    axum::extract::State(state): axum::extract::State<Arc<SimState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let Some(want) = &state.config.api_key else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let same = given.len() == want.len()
        && given
            .bytes()
            .zip(want.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if same {
        return next.run(request).await;
    }
    (
        axum::http::StatusCode::UNAUTHORIZED,
        axum::Json(serde_json::json!({"error": {"message": "invalid api key", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}})),
    )
        .into_response()
}

/// The engine's one error type, rendered in the OpenAI envelope: with
/// `param` naming the field to blame (null when none is), as OpenAI's and
/// vLLM's errors do, so that a client says which field was wrong.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    param: Option<String>,
    message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "message": self.message, "type": self.kind,
                                      "param": self.param, "code": self.code } });
        (self.status, axum::Json(body)).into_response()
    }
}

fn error(status: StatusCode, kind: &'static str, code: &'static str, message: String) -> ApiError {
    ApiError {
        status,
        kind,
        code,
        param: None,
        message,
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "invalid_request",
        message.into(),
    )
}

/// A 400 that names the field.
fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError {
        param: Some(param.into()),
        ..bad_request(message)
    }
}

impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        ApiError {
            param: e.param,
            ..bad_request(e.message)
        }
    }
}

fn unknown_model(model: &str) -> ApiError {
    ApiError {
        param: Some("model".into()),
        ..error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("The model `{model}` does not exist."),
        )
    }
}

/// What the engine needs from a completion request.
struct Ask {
    model: String,
    /// The prompts: a chat's one, or each of a completion's list (each
    /// answered with `n` choices of its own).
    prompts: Vec<Prompt>,
    stream: bool,
    include_usage: bool,
    /// New tokens at most, when the request says.
    max_tokens: Option<u32>,
    /// Log probabilities asked for, with this many of the likeliest
    /// tokens at each place (chat's `logprobs` and `top_logprobs`,
    /// completions' `logprobs`).
    logprobs: Option<u32>,
    /// Choices asked for (`n`).
    n: u32,
    /// Where the answer ends, before the first of them (none empty).
    stops: Vec<String>,
    /// The first tool a chat request offers (unless `tool_choice` is
    /// `none`): the one a tool-calling answer calls.
    tool: Option<String>,
}

fn parse(state: &SimState, body: &Bytes, kind: Kind) -> Result<Ask, ApiError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| bad_request(format!("invalid JSON: {e}")))?;
    let model = v["model"]
        .as_str()
        .ok_or_else(|| invalid("model", "missing field `model`"))?
        .to_owned();
    if !state.config.models.contains(&model) {
        return Err(unknown_model(&model));
    }
    let prompts = match kind {
        // llama-server continues a last assistant message by itself (its
        // assistant prefill); vLLM and SGLang are asked to.
        Kind::Chat => vec![crate::text::chat(
            &v,
            state.config.vocabulary == crate::Vocabulary::Llamacpp,
        )?],
        Kind::Text => crate::text::completion(&v)?,
    };
    let max_tokens = v
        .get("max_completion_tokens")
        .or_else(|| v.get("max_tokens"))
        .and_then(Value::as_u64)
        .map(|n| n.min(1_000_000) as u32);
    let n = match &v["n"] {
        Value::Null => 1,
        n => n
            .as_u64()
            .filter(|n| (1..=128).contains(n))
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| invalid("n", "`n` must be a whole number from 1 to 128"))?,
    };
    let logprobs = match kind {
        Kind::Chat => {
            let asked = match &v["logprobs"] {
                Value::Null => false,
                Value::Bool(b) => *b,
                _ => return Err(invalid("logprobs", "`logprobs` must be true or false")),
            };
            let top = match &v["top_logprobs"] {
                Value::Null => 0,
                t => t
                    .as_u64()
                    .filter(|t| *t <= 20)
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| {
                        invalid(
                            "top_logprobs",
                            "`top_logprobs` must be a whole number from 0 to 20",
                        )
                    })?,
            };
            if top > 0 && !asked {
                return Err(invalid(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs` set to true",
                ));
            }
            asked.then_some(top)
        }
        Kind::Text => match &v["logprobs"] {
            Value::Null => None,
            n => Some(
                n.as_u64()
                    .filter(|n| *n <= 20)
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        invalid("logprobs", "`logprobs` must be a whole number from 0 to 20")
                    })?,
            ),
        },
    };
    let not_stop = || invalid("stop", "`stop` must be a string or a list of strings");
    let mut stops: Vec<String> = match &v["stop"] {
        Value::Null => Vec::new(),
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(not_stop)?,
        _ => return Err(not_stop()),
    };
    // An empty one would end every answer before it began.
    stops.retain(|s| !s.is_empty());
    let tool = match kind {
        Kind::Chat if v["tool_choice"] != "none" => v["tools"]
            .as_array()
            .and_then(|t| t.first())
            .and_then(|t| t["function"]["name"].as_str())
            .map(str::to_owned),
        _ => None,
    };
    Ok(Ask {
        model,
        prompts,
        tool,
        logprobs,
        n,
        stops,
        stream: v["stream"].as_bool().unwrap_or(false),
        include_usage: v["stream_options"]["include_usage"]
            .as_bool()
            .unwrap_or(false),
        max_tokens,
    })
}

impl Ask {
    /// The tokens to generate and why the answer ends there: the limit
    /// asked for (`length`), else the answer's natural end (`stop`), which
    /// for a chat counts an assistant message being continued, so an
    /// answer cut and continued is as long as the uninterrupted one.
    fn length(&self, prompt: &Prompt, default: u32) -> (u32, &'static str) {
        match self.max_tokens {
            Some(n) => (n, "length"),
            None => {
                let continued = u32::try_from(prompt.continued).unwrap_or(u32::MAX);
                (default.saturating_sub(continued), "stop")
            }
        }
    }
}

/// A request holding a slot and its share of the KV cache.
struct Running {
    _permit: OwnedSemaphorePermit,
    state: Arc<SimState>,
    blocks: usize,
    prompt_tokens: u64,
    cached_tokens: u64,
    prefill: Duration,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.state.counters.running.fetch_sub(1, Ordering::Relaxed);
        self.state
            .counters
            .kv_blocks_in_use
            .fetch_sub(self.blocks, Ordering::Relaxed);
    }
}

/// One more on a gauge while it lives.
struct Counted<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Counted<'a> {
    fn up(gauge: &'a std::sync::atomic::AtomicUsize) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Counted(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Waits for a slot (or refuses when the queue is full), then looks the
/// prompts up in the prefix cache to price their prefill.
async fn admit(state: &Arc<SimState>, prompts: &[Prompt]) -> Result<Running, ApiError> {
    let c = &state.counters;
    if c.waiting.load(Ordering::Relaxed) >= state.config.queue {
        return Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "queue_full",
            format!(
                "the engine's waiting queue is full ({} requests)",
                state.config.queue
            ),
        ));
    }
    // Counted off however the wait ends: a request whose client goes
    // away while it waits (its future dropped) left the gauge one up for
    // good, and the control plane saw a model busy that served nothing.
    let waiting = Counted::up(&c.waiting);
    let permit = state.slots.clone().acquire_owned().await;
    drop(waiting);
    let permit = permit.map_err(|_| {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "shutting_down",
            "the engine is stopping".into(),
        )
    })?;
    // Each prompt's blocks, and its tokens found cached.
    let (mut blocks, mut hits, mut cached_tokens) = (0, 0, 0);
    {
        let mut cache = state.cache.lock().await;
        for prompt in prompts {
            let mut events = Vec::new();
            let lookup = cache.admit(prompt.context.as_bytes(), &mut events);
            // Sent under the lock, so batches go out in the cache's order.
            if let Some(sink) = &state.kv_events {
                sink.send(events);
            }
            blocks += lookup.blocks;
            hits += lookup.hits;
            cached_tokens +=
                ((lookup.hits * state.config.block_bytes) as u64 / 4).min(prompt.tokens);
        }
    }
    // From here to `Running`, which counts them off, nothing awaits.
    c.running.fetch_add(1, Ordering::Relaxed);
    c.requests.fetch_add(1, Ordering::Relaxed);
    c.kv_blocks_in_use.fetch_add(blocks, Ordering::Relaxed);
    c.prefix_queries.fetch_add(blocks as u64, Ordering::Relaxed);
    c.prefix_hits.fetch_add(hits as u64, Ordering::Relaxed);
    let prompt_tokens = prompts.iter().map(|p| p.tokens).sum();
    c.prompt_tokens.fetch_add(prompt_tokens, Ordering::Relaxed);
    c.cached_prompt_tokens
        .fetch_add(cached_tokens, Ordering::Relaxed);
    let to_prefill = prompt_tokens - cached_tokens;
    let prefill = state.config.ttft
        + Duration::from_secs_f64(to_prefill as f64 / f64::from(state.config.prefill_tokens_per_s));
    Ok(Running {
        _permit: permit,
        state: state.clone(),
        blocks,
        prompt_tokens,
        cached_tokens,
        prefill,
    })
}

fn usage(run: &Running, completion: u32) -> Value {
    json!({
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": run.prompt_tokens + u64::from(completion),
        "prompt_tokens_details": { "cached_tokens": run.cached_tokens },
    })
}

async fn chat(State(state): State<Arc<SimState>>, headers: HeaderMap, body: Bytes) -> Response {
    generate(state, &headers, body, Kind::Chat).await
}

async fn completions(
    State(state): State<Arc<SimState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    generate(state, &headers, body, Kind::Text).await
}

/// One line a request, as a real engine's access log: with the id the
/// gateway sent, a request can be followed from the client to here.
fn received(headers: &HeaderMap, model: &str, stream: bool) {
    let request_id = headers.get("x-request-id").and_then(|v| v.to_str().ok());
    tracing::info!(request_id, model, stream, "request received");
}

#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Text,
}

/// Whether each prompt and its completion fit the model's context, as vLLM
/// refuses one that does not (400, OpenAI's `context_length_exceeded`).
fn fits(ask: &Ask, limit: u32, default_max: u32, kind: Kind) -> Result<(), ApiError> {
    for prompt in &ask.prompts {
        let (completion, _) = ask.length(prompt, default_max);
        let asked = prompt.tokens.saturating_add(u64::from(completion));
        if asked > u64::from(limit) {
            let (param, what) = match kind {
                Kind::Chat => ("messages", "messages"),
                Kind::Text => ("prompt", "prompt"),
            };
            return Err(ApiError {
                param: Some(param.into()),
                ..error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "context_length_exceeded",
                    format!(
                        "This model's maximum context length is {limit} tokens. However, you requested {asked} tokens ({} in the {what}, {completion} in the completion). Please reduce the length of the {what} or completion.",
                        prompt.tokens
                    ),
                )
            });
        }
    }
    Ok(())
}

async fn generate(state: Arc<SimState>, headers: &HeaderMap, body: Bytes, kind: Kind) -> Response {
    let ask = match parse(&state, &body, kind) {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    received(headers, &ask.model, ask.stream);
    if let Some(limit) = state.config.max_model_len
        && let Err(e) = fits(&ask, limit, state.config.default_max_tokens, kind)
    {
        return e.into_response();
    }
    let run = match admit(&state, &ask.prompts).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let per_token = Duration::from_secs_f64(1.0 / f64::from(state.config.tokens_per_s));
    let id = format!(
        "cmpl-sim-{:08x}-{}",
        state.mark,
        state.counters.requests.load(Ordering::Relaxed)
    );
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let object = match kind {
        Kind::Chat => "chat.completion",
        Kind::Text => "text_completion",
    };
    if let Some(name) = ask.tool.clone()
        && state.config.tools != ToolCalls::Ignore
    {
        return tool_answer(state.config.tools, &name, &ask, run, &id, created).await;
    }
    // A prompt's choices together, in the order of the prompts, as OpenAI
    // numbers them.
    let mut choices = Vec::new();
    for prompt in &ask.prompts {
        let (max, natural) = ask.length(prompt, state.config.default_max_tokens);
        for i in 0..ask.n {
            let decoder = Decoder::new(
                Generator::for_choice(&prompt.context, i),
                ask.stops.clone(),
                max,
                natural,
            );
            choices.push(Choice {
                index: u32::try_from(choices.len()).unwrap_or(u32::MAX),
                echo: prompt.echo.clone(),
                echo_len: prompt.echo.as_ref().map_or(0, String::len),
                decoder: match ask.logprobs {
                    Some(_) => decoder.scored(),
                    None => decoder,
                },
            });
        }
    }
    let framer = Framer {
        id,
        created,
        model: ask.model.clone(),
        kind,
        logprobs: ask.logprobs,
    };
    if !ask.stream {
        return whole_answer(&state, run, choices, &framer, per_token, object).await;
    }
    let stream = Streaming {
        run,
        choices,
        framer,
        per_token,
        include_usage: ask.include_usage,
        pending: VecDeque::new(),
        started: false,
        ended: false,
    };
    let stream = futures_util::stream::unfold(stream, |mut s| async move {
        let out = s.next().await?;
        Some((Ok::<_, std::convert::Infallible>(out), s))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// One of an answer's choices, as it is generated.
struct Choice {
    index: u32,
    /// Text the choice starts with before its new tokens (taken once
    /// sent).
    echo: Option<String>,
    /// Its length: where the new tokens start in the choice's text.
    echo_len: usize,
    decoder: Decoder,
}

/// The answer's frame: its id, model and kind, and the log
/// probabilities asked for.
struct Framer {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    logprobs: Option<u32>,
}

impl Framer {
    fn chunk_object(&self) -> &'static str {
        match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        }
    }

    /// One SSE event of the stream.
    fn event(&self, choices: Value, usage: Option<Value>) -> Bytes {
        let mut chunk = json!({"id": self.id, "object": self.chunk_object(), "created": self.created,
                               "model": self.model, "choices": choices});
        if let Some(u) = usage {
            chunk["usage"] = u;
        }
        Bytes::from(format!("data: {chunk}\n\n"))
    }

    /// The log probabilities of text (when asked for), in OpenAI's shape:
    /// a chat's `content` list of tokens with their likeliest
    /// alternatives, or a completion's lists of tokens, their log
    /// probabilities, their likeliest alternatives and where each starts
    /// in the choice's text (an echoed prompt's tokens first, the first of
    /// them without a log probability, as OpenAI gives).
    fn logprobs(&self, echo: Option<&str>, base: usize, tokens: &[(usize, Scored)]) -> Value {
        let Some(top) = self.logprobs else {
            return Value::Null;
        };
        let top = top as usize;
        match self.kind {
            Kind::Chat => {
                let entry = |token: &str, logprob: f64| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
                let content: Vec<Value> = tokens
                    .iter()
                    .map(|(_, t)| {
                        let mut e = entry(t.token, t.logprob);
                        e["top_logprobs"] = t
                            .top
                            .iter()
                            .take(top)
                            .map(|(w, lp)| entry(w, *lp))
                            .collect();
                        e
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
            Kind::Text => {
                let (mut words, mut logprobs, mut tops, mut offsets) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for (start, piece, logprob) in
                    echo.map(crate::text::prompt_tokens).unwrap_or_default()
                {
                    words.push(json!(piece));
                    logprobs.push(json!(logprob));
                    tops.push(logprob.map_or(Value::Null, |lp| json!({ piece: lp })));
                    offsets.push(json!(start));
                }
                for (start, t) in tokens {
                    words.push(json!(t.token));
                    logprobs.push(json!(t.logprob));
                    // The token chosen is always among them.
                    let likeliest: serde_json::Map<String, Value> = t
                        .top
                        .iter()
                        .take(top.max(1))
                        .map(|(w, lp)| ((*w).to_owned(), json!(lp)))
                        .collect();
                    tops.push(Value::Object(likeliest));
                    offsets.push(json!(base + start));
                }
                json!({"tokens": words, "token_logprobs": logprobs,
                       "top_logprobs": tops, "text_offset": offsets})
            }
        }
    }

    /// A choice's delta: the role first (chat; `text` None), then text,
    /// then the finish reason; with `logprobs` (null on the role's and
    /// the finish's) when they are asked for.
    fn delta(
        &self,
        index: u32,
        text: Option<&str>,
        finish: Option<&str>,
        logprobs: Value,
    ) -> Bytes {
        let mut choice = match self.kind {
            Kind::Chat => {
                let d = match text {
                    Some(t) => json!({"content": t}),
                    None => json!({"role": "assistant", "content": ""}),
                };
                json!({"index": index, "delta": d, "finish_reason": finish})
            }
            Kind::Text => {
                json!({"index": index, "text": text.unwrap_or_default(), "finish_reason": finish})
            }
        };
        if self.logprobs.is_some() {
            choice["logprobs"] = logprobs;
        }
        self.event(json!([choice]), None)
    }
}

/// The answer whole, after the time its longest choice takes.
async fn whole_answer(
    state: &SimState,
    run: Running,
    choices: Vec<Choice>,
    framer: &Framer,
    per_token: Duration,
    object: &str,
) -> Response {
    let mut out = Vec::with_capacity(choices.len());
    let (mut longest, mut total) = (0, 0);
    for mut c in choices {
        let (text, finish, tokens) = c.decoder.finish_all();
        let logprobs = framer.logprobs(c.echo.as_deref(), c.echo_len, &tokens);
        let text = format!("{}{text}", c.echo.unwrap_or_default());
        longest = longest.max(c.decoder.generated);
        total += c.decoder.generated;
        let mut choice = match framer.kind {
            Kind::Chat => {
                json!({"index": c.index, "message": {"role": "assistant", "content": text}, "finish_reason": finish})
            }
            Kind::Text => json!({"index": c.index, "text": text, "finish_reason": finish}),
        };
        if framer.logprobs.is_some() {
            choice["logprobs"] = logprobs;
        }
        out.push(choice);
    }
    tokio::time::sleep(run.prefill + per_token * longest).await;
    state
        .counters
        .generation_tokens
        .fetch_add(u64::from(total), Ordering::Relaxed);
    let body = json!({
        "id": framer.id, "object": object, "created": framer.created, "model": framer.model,
        "choices": out, "usage": usage(&run, total),
    });
    axum::Json(body).into_response()
}

/// A streamed answer: one SSE event per choice's token, produced as it is
/// generated (the role first for a chat, each choice's finish once it
/// ends, then the usage when asked for, then `[DONE]`).
struct Streaming {
    run: Running,
    choices: Vec<Choice>,
    framer: Framer,
    per_token: Duration,
    include_usage: bool,
    /// Events made and not yet sent.
    pending: VecDeque<Bytes>,
    started: bool,
    ended: bool,
}

impl Streaming {
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            if self.ended {
                return None;
            }
            if !self.started {
                tokio::time::sleep(self.run.prefill).await;
                self.started = true;
                for c in &mut self.choices {
                    if let Kind::Chat = self.framer.kind {
                        let role = self.framer.delta(c.index, None, None, Value::Null);
                        self.pending.push_back(role);
                    }
                    // Asked for no tokens: the echo alone, then the end.
                    if let Some(finish) = c.decoder.finish() {
                        if let Some(echo) = c.echo.take().filter(|e| !e.is_empty()) {
                            let logprobs = self.framer.logprobs(Some(&echo), 0, &[]);
                            let delta = self.framer.delta(c.index, Some(&echo), None, logprobs);
                            self.pending.push_back(delta);
                        }
                        let end = self
                            .framer
                            .delta(c.index, Some(""), Some(finish), Value::Null);
                        self.pending.push_back(end);
                    }
                }
                continue;
            }
            if self.choices.iter().all(|c| c.decoder.finish().is_some()) {
                if self.include_usage {
                    let total = self.choices.iter().map(|c| c.decoder.generated).sum();
                    self.pending
                        .push_back(self.framer.event(json!([]), Some(usage(&self.run, total))));
                }
                self.pending
                    .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                self.ended = true;
                continue;
            }
            tokio::time::sleep(self.per_token).await;
            for c in &mut self.choices {
                if c.decoder.finish().is_some() {
                    continue;
                }
                let step = c.decoder.step();
                self.run
                    .state
                    .counters
                    .generation_tokens
                    .fetch_add(1, Ordering::Relaxed);
                let echo = c.echo.take();
                let text = match &echo {
                    Some(e) => format!("{e}{}", step.text),
                    None => step.text,
                };
                if !text.is_empty() {
                    let logprobs = self
                        .framer
                        .logprobs(echo.as_deref(), c.echo_len, &step.tokens);
                    let delta = self.framer.delta(c.index, Some(&text), None, logprobs);
                    self.pending.push_back(delta);
                }
                if let Some(finish) = step.finish {
                    let end = self
                        .framer
                        .delta(c.index, Some(""), Some(finish), Value::Null);
                    self.pending.push_back(end);
                }
            }
        }
    }
}

/// vLLM's `/reset_prefix_cache`: the cache emptied, announced as
/// `AllBlocksCleared`.
async fn reset_prefix_cache(State(state): State<Arc<SimState>>) -> StatusCode {
    let mut cache = state.cache.lock().await;
    cache.clear();
    if let Some(sink) = &state.kv_events {
        sink.send(vec![KvEvent::Cleared]);
    }
    StatusCode::OK
}

/// vLLM's `/tokenize`: a chat (`messages`, with `add_generation_prompt`,
/// on unless turned off) or a text (`prompt`), counted exactly as this
/// engine counts its prompts, so that a gateway that trims to the count
/// sends what fits. The ids are positions: nothing reads them.
async fn tokenize(State(state): State<Arc<SimState>>, body: Bytes) -> Result<Response, ApiError> {
    let v: Value =
        serde_json::from_slice(&body).map_err(|e| bad_request(format!("invalid JSON: {e}")))?;
    if let Some(model) = v["model"].as_str()
        && !state.config.models.iter().any(|m| m == model)
    {
        return Err(unknown_model(model));
    }
    let tokens: u64 = if v.get("messages").is_some() {
        crate::text::chat(&v, false)?.tokens
    } else {
        crate::text::completion(&v)?.iter().map(|p| p.tokens).sum()
    };
    Ok(axum::Json(json!({
        "count": tokens,
        "tokens": (0..tokens).collect::<Vec<u64>>(),
    }))
    .into_response())
}

async fn embeddings(
    State(state): State<Arc<SimState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let v: Value =
        serde_json::from_slice(&body).map_err(|e| bad_request(format!("invalid JSON: {e}")))?;
    let model = v["model"]
        .as_str()
        .ok_or_else(|| invalid("model", "missing field `model`"))?;
    if !state.config.models.iter().any(|m| m == model) {
        return Err(unknown_model(model));
    }
    received(&headers, model, false);
    let inputs: Vec<String> = match &v["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    if inputs.is_empty() {
        return Err(invalid(
            "input",
            "`input` must be a string or a non-empty list of strings",
        ));
    }
    let tokens: u64 = inputs.iter().map(|i| crate::text::tokens_of(i.len())).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, text)| json!({"object": "embedding", "index": i, "embedding": embed(text)}))
        .collect();
    let usage = json!({"prompt_tokens": tokens, "total_tokens": tokens});
    Ok(
        axum::Json(json!({"object": "list", "model": model, "data": data, "usage": usage}))
            .into_response(),
    )
}

/// A deterministic unit vector from the text.
fn embed(text: &str) -> Vec<f32> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let raw: Vec<f32> = (0..16u8)
        .map(|i| {
            let mut h = DefaultHasher::new();
            (i, text).hash(&mut h);
            (h.finish() % 2000) as f32 / 1000.0 - 1.0
        })
        .collect();
    let norm = raw
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::EPSILON);
    raw.into_iter().map(|x| x / norm).collect()
}

async fn models(State(state): State<Arc<SimState>>) -> Response {
    let data: Vec<Value> = state
        .config
        .models
        .iter()
        .map(|m| {
            let mut model =
                json!({"id": m, "object": "model", "created": 0, "owned_by": "llmgw-sim"});
            // As vLLM says its context.
            if let Some(len) = state.config.max_model_len {
                model["max_model_len"] = json!(len);
            }
            model
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// A chat answer that calls `name` with no arguments, after the prefill:
/// as `tool_calls` (finish reason `tool_calls`), or as the `<tool_call>`
/// text a model writes when no parser lifts it out (finish reason `stop`).
/// Streamed, it comes whole in one delta.
async fn tool_answer(
    mode: ToolCalls,
    name: &str,
    ask: &Ask,
    run: Running,
    id: &str,
    created: u64,
) -> Response {
    tokio::time::sleep(run.prefill).await;
    // Each of the `n` choices makes the same call, under an id of its own.
    let call = |i: u32| {
        let call_id = match i {
            0 => format!("call-{id}"),
            i => format!("call-{id}-{i}"),
        };
        json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}})
    };
    let text = format!(
        "<tool_call>\n{}\n</tool_call>",
        json!({"name": name, "arguments": {}})
    );
    // About what the call's JSON takes in tokens, each choice.
    let completion = 12 * ask.n;
    run.state
        .counters
        .generation_tokens
        .fetch_add(u64::from(completion), Ordering::Relaxed);
    let answer = |i: u32| match mode {
        ToolCalls::Native => (
            json!({"role": "assistant", "content": null, "tool_calls": [call(i)]}),
            "tool_calls",
        ),
        ToolCalls::Text | ToolCalls::Ignore => {
            (json!({"role": "assistant", "content": text}), "stop")
        }
    };
    if !ask.stream {
        let choices: Vec<Value> = (0..ask.n)
            .map(|i| {
                let (message, finish) = answer(i);
                json!({"index": i, "message": message, "finish_reason": finish})
            })
            .collect();
        return axum::Json(json!({
            "id": id, "object": "chat.completion", "created": created, "model": ask.model,
            "choices": choices,
            "usage": usage(&run, completion),
        }))
        .into_response();
    }
    let frame = |choices: Value, usage: Option<Value>| {
        let mut chunk = json!({"id": id, "object": "chat.completion.chunk", "created": created,
                               "model": ask.model, "choices": choices});
        if let Some(u) = usage {
            chunk["usage"] = u;
        }
        format!("data: {chunk}\n\n")
    };
    let mut body = String::new();
    for i in 0..ask.n {
        let (mut delta, finish) = answer(i);
        if let Some(calls) = delta["tool_calls"].as_array_mut() {
            for (i, c) in calls.iter_mut().enumerate() {
                c["index"] = json!(i);
            }
        }
        body.push_str(&frame(
            json!([{"index": i, "delta": delta, "finish_reason": null}]),
            None,
        ));
        body.push_str(&frame(
            json!([{"index": i, "delta": {}, "finish_reason": finish}]),
            None,
        ));
    }
    if ask.include_usage {
        body.push_str(&frame(json!([]), Some(usage(&run, completion))));
    }
    body.push_str("data: [DONE]\n\n");
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
