//! The request path, in stages read in order:
//!
//! 1. [`admit::identify`]: the key, before the body is read;
//! 2. the body, read once, only what routing and limits need parsed
//!    ([`request`]);
//! 3. [`resolve::plan`]: alias to canonical, allowlist, budgets, and the
//!    models to try (fallbacks for a spent budget or for no capacity);
//! 4. [`admit::admit`]: rates at every level, then the band's turn on
//!    the first model of the plan with room for it;
//! 5. [`resolve::wait_on_demand`]: an on-demand model is started and
//!    waited for, bounded;
//! 6. [`forward::forward`]: endpoints, retries, breakers, the answer
//!    streamed back ([`relay`]), continued on another replica when its
//!    engine breaks mid-answer ([`continuation`], [`splice`]);
//! 7. [`account`]: when the answer ends, usage, metrics and the rates'
//!    settlement.
//!
//! Nothing here waits on the database: every stage reads memory.

mod account;
mod admit;
mod content;
mod continuation;
mod forward;
mod refusal;
mod relay;
mod request;
mod resolve;
mod splice;
pub(crate) mod upstream;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::Uri;
use axum::response::{IntoResponse, Response};

pub(crate) use admit::identify;
pub(crate) use resolve::{known, now_ms, price};

use llmgw_projections::KeyEntry;
use serde_json::Value;

use crate::access::{Access, RequestId};
use crate::{ApiError, Gateway};

/// A refusal and the model label it is counted under (None: `unknown`).
struct Refused(Option<String>, ApiError);

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Self {
        Refused(None, e)
    }
}

pub(crate) async fn handle(State(gw): State<Arc<Gateway>>, uri: Uri, request: Request) -> Response {
    let access = Access::start(request.extensions().get::<RequestId>());
    let answer = route(&gw, uri.path(), request, &access).await;
    refusal_counted(&gw, answer, &access)
}

/// The answer, or the refusal counted in the metrics and the access line.
fn refusal_counted(gw: &Gateway, answer: Result<Response, Refused>, access: &Access) -> Response {
    match answer {
        Ok(r) => r,
        Err(Refused(label, e)) => {
            let label = label.as_deref().unwrap_or("unknown");
            gw.metrics.request(label.into(), e.status.as_u16());
            access.status(e.status.as_u16());
            e.into_response()
        }
    }
}

async fn route(
    gw: &Arc<Gateway>,
    path: &str,
    request: Request,
    access: &Access,
) -> Result<Response, Refused> {
    if upstream::came_back(request.headers().get(upstream::HOP)) {
        return Err(ApiError::loop_detected().into());
    }
    let caller = admit::identify(gw, request.headers())?;
    if let Some(k) = &caller.key {
        access.key(k.key_id.clone());
    }
    let thread = crate::convo::thread_header(request.headers())?;
    let body = body_within(request, gw.config.body_limit).await?;
    // A Responses request goes the whole way as the chat completion it
    // is turned into, and its answer is turned back.
    let (path, body, asked) = if path == crate::responses::PATH {
        let (chat, asked) = crate::responses::to_chat(&body)?;
        (CHAT, chat, Some(asked))
    } else {
        (path, body, None)
    };
    let answer = match thread {
        None => serve_body(gw, path, caller, body, access).await?,
        Some(_) if path != CHAT => {
            return Err(ApiError::bad_request(
                "x-llmgw-thread names a chat completion's or a response's thread",
            )
            .into());
        }
        Some(thread) => {
            let turn = crate::convo::Turn::open(gw, caller.key.as_deref(), thread, body).await?;
            let body = turn.body.clone();
            turn.close(serve_body(gw, path, caller, body, access).await?)
        }
    };
    Ok(match asked {
        Some(asked) => crate::responses::answer(answer, asked).await,
        None => answer,
    })
}

const CHAT: &str = "/v1/chat/completions";

/// A request's body within `router.body_limit`, or the API's refusal (the
/// chat page reads its turns so: it took any body of up to 2 MiB, whatever
/// the limit, and answered one above in plain text).
pub async fn body_of(gw: &Gateway, request: Request) -> Result<Bytes, ApiError> {
    body_within(request, gw.config.body_limit).await
}

/// A chat completion on a signed-in person's behalf (the chat page): no
/// key is presented; `key` stands for the person's project (None with
/// authentication off). Everything after identification is the API's.
/// `id` is the request's own, which the page's answer carries: the access
/// line names it, so what the page shows a person finds the line.
pub async fn chat_as(
    gw: Arc<Gateway>,
    key: Option<KeyEntry>,
    body: Bytes,
    id: Option<RequestId>,
) -> Response {
    let access = Access::start(id.as_ref());
    if let Some(k) = &key {
        access.key(k.key_id.clone());
    }
    let caller = admit::Caller::standing_for(key);
    let answer = serve_body(&gw, CHAT, caller, body, &access).await;
    refusal_counted(&gw, answer, &access)
}

/// A chat page's turn (the whole conversation so far) fitted to its
/// model's context where the catalog gives one: the oldest whole turns
/// dropped (never a system message, nor the person's newest question),
/// with at least half the context left for the prompt, and `max_tokens`
/// lowered to what the context leaves. A conversation on a small model
/// was refused from its second or third turn on (a 512-token answer
/// asked of a 512-token context), however often it was sent again. A turn
/// without messages is left as it is, for the API to refuse.
pub fn fit_chat_turn(gw: &Gateway, turn: &mut serde_json::Map<String, Value>) {
    let context = {
        let routes = gw.routes.load();
        let asked = turn.get("model").and_then(Value::as_str).unwrap_or("");
        let canonical = routes.canonical(asked).to_owned();
        std::iter::once(&canonical)
            .chain(routes.fallbacks(&canonical))
            .filter_map(|m| routes.context(m))
            .min()
    };
    let Some(context) = context.map(u64::from) else {
        return;
    };
    let asked = turn
        .get("max_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(context);
    let Some(Value::Array(messages)) = turn.get_mut("messages") else {
        return;
    };
    let is_user = |m: &Value| m.get("role").and_then(Value::as_str) == Some("user");
    let newest = messages.iter().rposition(is_user).unwrap_or(0);
    let new = messages.split_off(newest);
    let history = std::mem::take(messages);
    let budget = context - asked.min(context / 2);
    let (mut kept, _) = crate::convo::threads::trim(history, &new, budget);
    kept.extend(new);
    let prompt: u64 = kept.iter().map(crate::convo::threads::cost).sum();
    *messages = kept;
    let room = context.saturating_sub(prompt).max(1);
    turn.insert("max_tokens".into(), Value::from(asked.min(room)));
}

async fn serve_body(
    gw: &Arc<Gateway>,
    path: &str,
    caller: admit::Caller,
    body: Bytes,
    access: &Access,
) -> Result<Response, Refused> {
    let render = gw.endpoints.any_publish_kv_events();
    let request = request::ClientRequest::parse(body, render)?;
    access.asked(&request.model, request.stream);
    let started = tokio::time::Instant::now();
    // One routing table for the whole request, however the view moves.
    let routes = gw.routes.load();
    let mut plan = resolve::plan(gw, &routes, &caller, &request).map_err(|(l, e)| Refused(l, e))?;
    let label = || Some(plan.asked.to_owned());
    let models = match plan.candidates.as_slice() {
        [] => std::slice::from_ref(&plan.asked),
        some => some,
    };
    let admitted = admit::admit(gw, &routes, &caller, models, request.token_estimate())
        .await
        .map_err(|e| Refused(label(), e))?;
    // Held back on the models before it, the request goes to the first
    // with room for it: those are not tried (they have none).
    plan.candidates
        .drain(..admitted.model.min(plan.candidates.len()));
    let room = admitted.charge.headroom();
    let ticket = account::Ticket::open(
        gw.clone(),
        caller.key.as_ref(),
        plan.asked.into(),
        admitted,
        started,
        access.clone(),
        plan.hold.take(),
    );
    if let Some(model) = resolve::to_wait_for(gw, &routes, &plan) {
        plan.waited = Some(model);
        if let Err(why) = resolve::wait_on_demand(gw, &routes, model).await {
            plan.not_started = Some(why);
        }
    }
    let session = caller.session.as_deref().or(request.user.as_deref());
    let mut response = forward::forward(gw, path, &request, session, &plan, ticket)
        .await
        .map_err(|e| Refused(label(), e))?;
    // What the key's limits leave, as OpenAI's API says it (nothing for a
    // key without rpm or tpm).
    if room != crate::limits::Headroom::default() {
        crate::limits::write_headroom(response.headers_mut(), room);
    }
    Ok(response)
}

/// A request's body, read only now (after its key was checked: a caller
/// without one never gets a body held) and at most `limit` bytes.
pub(crate) async fn body_within(request: Request, limit: usize) -> Result<Bytes, ApiError> {
    whole(http_body_util::Limited::new(request.into_body(), limit))
        .await
        .map_err(|e| crate::listen::body::body_refusal(&axum::Error::new(e), limit))
}

/// A body whole: the one chunk hyper hands over for a small body, as it
/// came, or the chunks joined. (`collect`, under axum's `to_bytes` too,
/// keeps a list of the chunks: an allocation for every request and every
/// plain answer.) Trailers are not part of it.
async fn whole<B>(mut body: B) -> Result<Bytes, B::Error>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    use http_body_util::BodyExt;
    let mut first = Bytes::new();
    let mut joined: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        if first.is_empty() && joined.is_empty() {
            first = data;
        } else {
            if joined.is_empty() {
                joined.extend_from_slice(&first);
            }
            joined.extend_from_slice(&data);
        }
    }
    Ok(if joined.is_empty() {
        first
    } else {
        joined.into()
    })
}
