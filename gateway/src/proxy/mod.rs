//! The request path: read the body once, parse only what routing needs,
//! pick an endpoint, forward the original bytes, and stream the answer back.
//! A failure before the first byte is retried on another endpoint; after
//! it, the stream ends with an error (a retry could duplicate output).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;

use crate::{ApiError, Gateway};

pub(crate) const SERVED_MODEL: &str = "x-llmgw-served-model";

/// The fields routing reads; everything else is forwarded untouched.
#[derive(Debug, Deserialize)]
struct Head {
    model: Option<String>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<serde_json::Value>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    prompt: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<serde_json::Value>,
}

impl Head {
    /// The prompt's text, for prefix affinity: message contents in order.
    fn prompt_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut push = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => out.extend_from_slice(s.as_bytes()),
            serde_json::Value::Array(parts) => {
                for p in parts {
                    if let Some(t) = p
                        .get("text")
                        .and_then(serde_json::Value::as_str)
                        .or(p.as_str())
                    {
                        out.extend_from_slice(t.as_bytes());
                    }
                }
            }
            _ => {}
        };
        for m in self.messages.iter().flatten() {
            if let Some(c) = &m.content {
                push(c);
            }
        }
        if let Some(p) = &self.prompt {
            push(p);
        }
        out
    }
}

/// Asks the engine to report usage in a streamed answer; returns the new
/// body, or None when the client already asked (then nothing is stripped).
fn with_usage_requested(body: &Bytes) -> Option<Bytes> {
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object_mut()?;
    let opts = obj.entry("stream_options").or_insert_with(|| json!({}));
    if opts
        .get("include_usage")
        .and_then(serde_json::Value::as_bool)
        == Some(true)
    {
        return None;
    }
    opts.as_object_mut()?
        .insert("include_usage".into(), json!(true));
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

static REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn request_id() -> String {
    let n = REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("req-{}-{n}", std::process::id())
}

/// Records a request's usage when dropped: at the end of its stream, or
/// when the client goes away mid-stream.
struct Finish {
    gw: Arc<Gateway>,
    key_id: String,
    project_id: String,
    band: llmgw_domain::tenancy::Band,
    model: String,
    status: u16,
    started: tokio::time::Instant,
    first_content: Option<std::time::Duration>,
    tokens: Option<crate::usage::Tokens>,
}

impl Drop for Finish {
    fn drop(&mut self) {
        // A finished request may let a held-back one in.
        self.gw.admission.load_changed();
        let tokens = self.tokens.unwrap_or_default();
        self.gw.metrics.tokens(tokens.prompt, tokens.completion);
        if !self.key_id.is_empty() {
            self.gw.rates.spent(
                &self.key_id,
                tokens.prompt.saturating_add(tokens.completion),
                tokio::time::Instant::now(),
            );
        }
        if let Some(t) = self.first_content {
            self.gw.metrics.ttft(t.as_secs_f64());
        }
        if let Some(q) = &self.gw.usage {
            q.record(llmgw_domain::usage::FinishedRequest {
                request_id: request_id(),
                key_id: self.key_id.clone(),
                project_id: self.project_id.clone(),
                model_asked: self.model.clone(),
                model_served: self.model.clone(),
                prompt_tokens: tokens.prompt,
                completion_tokens: tokens.completion,
                status: self.status,
                latency_ms: self.started.elapsed().as_millis().min(u128::from(u32::MAX)) as u32,
                ttft_ms: self
                    .first_content
                    .map(|t| t.as_millis().min(u128::from(u32::MAX)) as u32),
                band: self.band,
                at: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64),
            });
        }
    }
}

pub(crate) async fn forward(
    State(gw): State<Arc<Gateway>>,
    uri: Uri,
    request: Request,
) -> Response {
    let path = uri.path().to_owned();
    match route(&gw, &path, request).await {
        Ok(r) => r,
        Err((model, e)) => {
            gw.metrics.request(&model, e.status.as_u16());
            e.into_response()
        }
    }
}

async fn route(
    gw: &Arc<Gateway>,
    path: &str,
    request: Request,
) -> Result<Response, (String, ApiError)> {
    let session_header = request
        .headers()
        .get("x-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // With authentication off the header picks the band; with it on, the
    // key will, so that clients cannot promote themselves.
    let key = match &gw.keys {
        Some(directory) => Some(
            directory
                .authenticate(request.headers())
                .map_err(|e| (String::from("-"), e))?,
        ),
        None => None,
    };
    let band_header = request
        .headers()
        .get("x-llmgw-band")
        .map(|v| v.to_str().unwrap_or("?").to_owned());
    let limit = gw.config.body_limit;
    let unknown = || String::from("-");
    let body = axum::body::to_bytes(request.into_body(), limit)
        .await
        .map_err(|_| (unknown(), ApiError::too_large(limit)))?;
    let mut head: Head = serde_json::from_slice(&body).map_err(|e| {
        (
            unknown(),
            ApiError::bad_request(format!("the body is not valid JSON: {e}")),
        )
    })?;
    let model = head
        .model
        .take()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| (unknown(), ApiError::bad_request("missing field `model`")))?;
    let asked = head
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(serde_json::Value::as_bool);
    let injected = if head.stream && asked != Some(true) {
        with_usage_requested(&body)
    } else {
        None
    };
    let strip_usage = injected.is_some();
    let body = injected.unwrap_or(body);
    let started = tokio::time::Instant::now();
    // An alias is its model everywhere: route, account and answer as the
    // canonical name, and ask the engine for it by that name.
    let canonical = gw.routes.canonical(&model);
    let body = if canonical != model {
        with_model(&body, &canonical).unwrap_or(body)
    } else {
        body
    };
    let model = canonical;
    if !gw.endpoints.knows_model(&model) && !gw.routes.catalogued(&model) {
        return Err((model.clone(), ApiError::unknown_model(&model)));
    }
    // A key's allowlist: a model it may not use does not exist for it.
    if let Some(k) = &key
        && !k.limits.models.permits(&model)
    {
        return Err((model.clone(), ApiError::unknown_model(&model)));
    }
    if let Some(k) = &key {
        if (k.limits.rpm.is_some() || k.limits.tpm.is_some())
            && let Err(refusal) = gw.rates.admit(
                &k.key_id,
                k.limits.rpm,
                k.limits.tpm,
                tokio::time::Instant::now(),
            )
        {
            return Err((model.clone(), ApiError::rate_limited(refusal)));
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        if let Some(b) = gw.keys.as_ref().and_then(|d| d.spent_budget(k, now_ms)) {
            let scope = serde_json::to_value(b.scope)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let period = serde_json::to_value(b.period)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            return Err((
                model.clone(),
                ApiError::budget_spent(&scope, &b.scope_id, &period),
            ));
        }
    }
    let band = match (&key, band_header) {
        (Some(k), _) => k.band,
        (None, None) => gw.admission.config.default_band,
        (None, Some(b)) => crate::admission::parse_band(&b).ok_or_else(|| {
            (
                model.clone(),
                ApiError::bad_request(format!(
                    "unknown band {b:?}: bronze, silver, gold or platinum"
                )),
            )
        })?,
    };
    let cfg = &gw.admission.config;
    if gw
        .admission
        .admit(band, || {
            gw.endpoints
                .saturation(&model, cfg.waiting_ceiling, cfg.kv_ceiling)
        })
        .await
        .is_err()
    {
        let name = crate::admission::band_name(band);
        gw.metrics.rejected(name);
        return Err((model.clone(), ApiError::overloaded(name)));
    }
    if gw.routes.on_demand(&model) {
        wait_on_demand(gw, &model).await;
    }
    let ctx = Attempt {
        key_id: key.as_ref().map(|k| k.key_id.clone()).unwrap_or_default(),
        project_id: key
            .as_ref()
            .map(|k| k.project_id.clone())
            .unwrap_or_default(),
        band,
        session: session_header.or(head.user.clone()),
        prompt: head.prompt_bytes(),
        stream: head.stream,
        strip_usage,
        started,
    };
    let mut last_error = match attempt(gw, path, &body, &model, &ctx).await {
        Ok(r) => return Ok(r),
        Err(e) => e,
    };
    // No capacity (not a failure): the model's fallbacks, in order, with the
    // body naming the fallback; x-llmgw-served-model tells the client.
    if last_error.is_none() {
        for fallback in &gw.routes.fallbacks(&model) {
            let Some(rewritten) = with_model(&body, fallback) else {
                continue;
            };
            match attempt(gw, path, &rewritten, fallback, &ctx).await {
                Ok(r) => return Ok(r),
                Err(e) => last_error = last_error.or(e),
            }
        }
    }
    let error = match last_error {
        Some(why) => ApiError::upstream(format!("no endpoint answered: {why}")),
        None => ApiError::no_capacity(&model),
    };
    Err((model, error))
}

/// Tells the control plane the model is wanted and, while nothing serves
/// it, waits (bounded) for a replica to come up.
async fn wait_on_demand(gw: &Gateway, model: &str) {
    if let Some(hook) = gw.demand.get() {
        (hook.0)(model);
    }
    let serving = || gw.endpoints.routable_models().iter().any(|m| m == model);
    let deadline = tokio::time::Instant::now() + gw.config.on_demand_wait;
    loop {
        let changed = gw.routes_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if serving() {
            return;
        }
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            return;
        }
    }
}

/// What every attempt of one request shares.
struct Attempt {
    key_id: String,
    project_id: String,
    band: llmgw_domain::tenancy::Band,
    session: Option<String>,
    prompt: Vec<u8>,
    stream: bool,
    strip_usage: bool,
    started: tokio::time::Instant,
}

/// The body with its `model` replaced.
fn with_model(body: &Bytes, model: &str) -> Option<Bytes> {
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.as_object_mut()?.insert("model".into(), json!(model));
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

/// Tries the endpoints of `model`, retrying before the first byte only.
/// `Err(None)`: nothing could take it (no capacity); `Err(Some(why))`:
/// endpoints were tried and failed.
async fn attempt(
    gw: &Arc<Gateway>,
    path: &str,
    body: &Bytes,
    model: &str,
    ctx: &Attempt,
) -> Result<Response, Option<String>> {
    let model = model.to_owned();
    let (session, prompt, started, strip_usage) =
        (&ctx.session, &ctx.prompt, ctx.started, ctx.strip_usage);
    let mut tried: Vec<String> = Vec::new();
    let mut last_error = None;
    for _ in 0..=gw.config.retries {
        let candidates = gw.endpoints.candidates(&model, &tried);
        if candidates.is_empty() {
            break;
        }
        let view: Vec<crate::affinity::Candidate<'_>> = candidates
            .iter()
            .map(|(e, _)| crate::affinity::Candidate {
                id: &e.spec.id,
                load: gw.endpoints.load_of(e),
            })
            .collect();
        let (i, decision) = gw
            .affinity
            .choose(&model, session.as_deref(), prompt, &view);
        let endpoint = candidates[i].0.clone();
        tried.push(endpoint.spec.id.clone());
        let Some(flight) = gw.endpoints.take(&endpoint) else {
            continue;
        };
        gw.metrics.decision(decision);
        let sent = gw
            .client
            .post(format!("{}{path}", endpoint.spec.url))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
            .await;
        let upstream = match sent {
            Ok(r) if r.status().is_server_error() => {
                endpoint.record(false);
                last_error = Some(format!(
                    "endpoint {} answered {}",
                    endpoint.spec.id,
                    r.status()
                ));
                continue;
            }
            Ok(r) => r,
            Err(e) => {
                endpoint.record(false);
                tracing::warn!(endpoint = %endpoint.spec.id, error = %e, "upstream request failed; trying another endpoint");
                last_error = Some(format!("endpoint {} is unreachable", endpoint.spec.id));
                continue;
            }
        };
        endpoint.record(true);
        let status =
            StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        gw.metrics.request(&model, status.as_u16());
        let content_type = upstream
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .cloned();
        let mut finish = Finish {
            gw: gw.clone(),
            key_id: ctx.key_id.clone(),
            project_id: ctx.project_id.clone(),
            band: ctx.band,
            model: model.clone(),
            status: status.as_u16(),
            started,
            first_content: None,
            tokens: None,
        };
        let body = if ctx.stream {
            Body::from_stream(relay(upstream, flight, finish, strip_usage))
        } else {
            // A plain answer is one JSON document: read it, note its usage.
            // Nothing has reached the client yet, so a break here is retried.
            let bytes = match upstream.bytes().await {
                Ok(b) => b,
                Err(e) => {
                    endpoint.record(false);
                    last_error = Some(format!("endpoint {} broke off: {e}", endpoint.spec.id));
                    continue;
                }
            };
            finish.tokens = serde_json::from_slice(&bytes)
                .ok()
                .and_then(|v| crate::usage::Tokens::from_usage(&v));
            drop((finish, flight));
            Body::from(bytes)
        };
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        if let Some(ct) = content_type.and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok()) {
            headers.insert(header::CONTENT_TYPE, ct);
        }
        if let Ok(v) = HeaderValue::from_str(&model) {
            headers.insert(SERVED_MODEL, v);
        }
        return Ok(response);
    }
    Err(last_error)
}

/// The streamed answer, event by event. It owns the in-flight count and
/// the usage record: both end when the stream ends or the client goes away
/// (which also drops the upstream request).
fn relay(
    upstream: reqwest::Response,
    flight: crate::InFlight,
    finish: Finish,
    strip_usage: bool,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    struct State<S> {
        upstream: S,
        flight: crate::InFlight,
        finish: Finish,
        scanner: crate::usage::SseScanner,
        done: bool,
    }
    let state = State {
        upstream: Box::pin(upstream.bytes_stream()),
        flight,
        finish,
        scanner: crate::usage::SseScanner::new(strip_usage),
        done: false,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            match st.upstream.next().await {
                Some(Ok(chunk)) => {
                    let out = st.scanner.feed(&chunk);
                    if st.scanner.saw_content && st.finish.first_content.is_none() {
                        st.finish.first_content = Some(st.finish.started.elapsed());
                    }
                    st.finish.tokens = st.scanner.tokens;
                    if !out.is_empty() {
                        return Some((Ok(out), st));
                    }
                }
                Some(Err(e)) => {
                    st.flight.endpoint().record(false);
                    st.done = true;
                    return Some((Err(std::io::Error::other(e)), st));
                }
                None => {
                    st.done = true;
                    let rest = st.scanner.finish();
                    return Some((Ok(rest), st));
                }
            }
        }
    })
}

/// Models that can serve now; with keys on, only those the key may use.
pub(crate) async fn models(
    State(gw): State<Arc<Gateway>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let key = match &gw.keys {
        Some(directory) => match directory.authenticate(&headers) {
            Ok(k) => Some(k),
            Err(e) => return e.into_response(),
        },
        None => None,
    };
    let data: Vec<_> = gw
        .endpoints
        .routable_models()
        .into_iter()
        .filter(|m| key.as_ref().is_none_or(|k| k.limits.models.permits(m)))
        .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "llmgw"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

pub(crate) async fn ready(State(gw): State<Arc<Gateway>>) -> Response {
    if gw.endpoints.routable_models().is_empty() {
        (StatusCode::SERVICE_UNAVAILABLE, "nothing is routable").into_response()
    } else {
        (StatusCode::OK, Bytes::from_static(b"ready")).into_response()
    }
}
