//! OpenAI's Responses API (`POST /v1/responses`), served as a chat
//! completion: the request is turned into one ([`request`]), goes the
//! whole request path as one (keys, limits, budgets, routing, fallbacks,
//! usage, threads), and its answer is turned back, whole ([`answer`]) or
//! event by event ([`stream`]). Every engine serves chat, so every engine
//! serves this; what needs a store of responses (`previous_response_id`,
//! `store: true`, retrieval by id) is refused by name.
//!
//! Errors are the API's one envelope on both paths, so a refusal passes
//! through, naming the request's field as this API does (`input`).

mod answer;
mod input;
mod request;
mod stream;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

pub(crate) use request::Asked;

use crate::ApiError;

pub(crate) const PATH: &str = "/v1/responses";

/// The id the `k`th tool call of the chat answer `chat_id` is given when
/// its engine gave none: the same here and in a thread that keeps it, so
/// that the client's output names a call the thread holds.
pub(crate) fn call_id(chat_id: Option<&str>, k: usize) -> String {
    answer::Ids::from_chat(chat_id).item("call", k)
}

/// The chat completion's body for a Responses request, and what its answer
/// repeats.
pub(crate) fn to_chat(body: &[u8]) -> Result<(Bytes, Asked), ApiError> {
    request::to_chat(body).map(|(b, a)| (Bytes::from(b), a))
}

/// The chat completion's answer as the Responses API's: an error as it is,
/// but for the field it names.
pub(crate) async fn answer(response: Response, asked: Asked) -> Response {
    if !response.status().is_success() {
        return refusal(response).await;
    }
    let streamed = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    if streamed {
        let events = stream::Events::new(asked);
        let chunks = body.into_data_stream();
        // Each chunk's events as it comes; the terminal event, if the
        // chat stream ended without one, when it ends.
        let turned = futures_util::stream::unfold(Some((chunks, events)), |state| async move {
            let (mut chunks, mut events) = state?;
            match chunks.next().await {
                Some(Ok(b)) => {
                    let out = events.feed(&b);
                    Some((
                        Ok::<_, axum::Error>(Bytes::from(out)),
                        Some((chunks, events)),
                    ))
                }
                // Said as the response failing, not as a cut body.
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "a response's stream broke off");
                    let out = events.broke("the answer broke off; ask again");
                    Some((Ok(Bytes::from(out)), None))
                }
                None => Some((Ok(Bytes::from(events.end())), None)),
            }
        })
        .filter(|c| std::future::ready(c.as_ref().map_or(true, |b| !b.is_empty())));
        return Response::from_parts(parts, Body::from_stream(turned));
    }
    let whole = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::upstream("the engine's answer broke off before its end")
                .into_response();
        }
    };
    let turned = serde_json::from_slice(&whole)
        .ok()
        .and_then(|chat| answer::from_chat(&asked, &chat));
    let Some(turned) = turned else {
        tracing::warn!("an engine's chat answer could not be read as one");
        return ApiError::upstream("the engine's answer was not a chat completion").into_response();
    };
    parts.headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(turned.to_string()))
}

/// An engine's refusal of the chat completion, naming the field of the
/// request as this API does: a prompt that does not fit is in `input`
/// here, not in the `messages` made of it.
async fn refusal(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(whole) = axum::body::to_bytes(body, 1 << 20).await else {
        return ApiError::upstream("the engine's answer broke off before its end").into_response();
    };
    let body = match serde_json::from_slice::<serde_json::Value>(&whole) {
        Ok(mut v) if v["error"]["param"] == "messages" => {
            v["error"]["param"] = "input".into();
            parts.headers.remove(header::CONTENT_LENGTH);
            Bytes::from(v.to_string())
        }
        _ => whole,
    };
    Response::from_parts(parts, Body::from(body))
}

/// `/v1/responses/{id}` and what hangs under it (retrieve, cancel,
/// delete, input items): nothing is kept, so there is nothing to find.
/// Asked with a key, as every path of the API is.
pub(crate) async fn not_kept(
    axum::extract::State(gw): axum::extract::State<std::sync::Arc<crate::Gateway>>,
    method: axum::http::Method,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
) -> ApiError {
    if let Err(e) = crate::proxy::identify(&gw, &headers) {
        return e;
    }
    // Counting a request's tokens, compacting a conversation: no engine
    // offers either.
    if ["/v1/responses/input_tokens", "/v1/responses/compact"].contains(&uri.path()) {
        return ApiError::unknown_route(&method, uri.path());
    }
    ApiError::not_found(format!(
        "{} names a kept response, and this gateway keeps none (store is false): carry the conversation in `input`",
        uri.path()
    ))
}
