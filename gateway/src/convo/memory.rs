//! `/v1/memory`: an agent's notes, owned by the key's project and by
//! `x-llmgw-agent` (default `default`). `PUT /v1/memory/{key}` with
//! `{"text", "tags"}` writes one (201 made, 200 replaced); `GET` and
//! `DELETE` read and remove it; `GET /v1/memory?q=words` or `?tag=t`
//! searches, newest write first. Another project's or agent's note
//! answers exactly like a missing one.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use llmgw_convo::{Note, Put, Search};
use llmgw_projections::KeyEntry;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Use, convo_error, keeper, memory_of};
use crate::{ApiError, Gateway};

pub(crate) fn routes() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/v1/memory", crate::api(get(search)))
        .route(
            "/v1/memory/{key}",
            crate::api(get(read).put(write).delete(forget)),
        )
}

/// Searches return at most this many notes unless `limit` says fewer.
pub(super) const MAX_RESULTS: u32 = 100;

/// A search by words or by a tag (exactly one), as `?q=`/`?tag=` and the
/// MCP tool `recall` take it; `usage` is the refusal otherwise.
pub(super) fn search_by(
    words: Option<&str>,
    tag: Option<&str>,
    usage: &str,
) -> Result<Search, ApiError> {
    match (words, tag) {
        (Some(words), None) => Ok(Search::Words(
            llmgw_convo::limits::query_words(words).map_err(convo_error)?,
        )),
        (None, Some(tag)) => Ok(Search::Tag(tag.to_owned())),
        _ => Err(ApiError::bad_request(usage.to_owned())),
    }
}

pub(super) fn note_json(n: &Note) -> Value {
    let at = |us: i64| {
        chrono::DateTime::from_timestamp_micros(us)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
    };
    json!({
        "object": "memory.note",
        "key": n.key,
        "text": n.text,
        "tags": n.tags,
        "created_at": at(n.created_at),
        "updated_at": at(n.updated_at),
    })
}

fn missing(key: &str) -> ApiError {
    ApiError::not_found(format!("no note {key:?}"))
}

/// The answer to `by`'s request, which its access line names.
fn answer(by: Option<&KeyEntry>, r: Result<Response, ApiError>) -> Response {
    super::keyed(by, r.unwrap_or_else(IntoResponse::into_response))
}

/// Unknown fields refused: `tag` for `tags` stored a note without them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoteBody {
    text: String,
    #[serde(default)]
    tags: Vec<String>,
}

async fn write(
    State(gw): State<Arc<Gateway>>,
    key: Result<Path<String>, axum::extract::rejection::PathRejection>,
    request: axum::extract::Request,
) -> Response {
    let headers = request.headers().clone();
    let caller = match crate::proxy::identify(&gw, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let by = caller.key.as_deref();
    answer(
        by,
        async {
            let key = path_key(key)?;
            let owner = memory_of(&gw, by, &headers, Use::Write)?;
            // Read only once the key is known to be good.
            let body = crate::proxy::body_within(request, super::BODY_LIMIT).await?;
            let note: NoteBody = serde_json::from_slice(&body).map_err(|e| {
                ApiError::bad_request(format!(
                    "a note is {{\"text\": \"…\", \"tags\": [\"…\"]}}: {e}"
                ))
            })?;
            let store = &keeper(&gw)?.store;
            let put = store
                .put_note(&owner, &key, &note.text, &note.tags, chrono::Utc::now())
                .await
                .map_err(convo_error)?;
            let stored = store
                .note(&owner, &key)
                .await
                .map_err(convo_error)?
                .ok_or_else(|| missing(&key))?;
            let status = match put {
                Put::Created => StatusCode::CREATED,
                Put::Replaced => StatusCode::OK,
            };
            Ok((status, Json(note_json(&stored))).into_response())
        }
        .await,
    )
}

async fn read(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    key: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    let caller = match crate::proxy::identify(&gw, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let by = caller.key.as_deref();
    answer(
        by,
        async {
            let key = path_key(key)?;
            let owner = memory_of(&gw, by, &headers, Use::Reach)?;
            let note = keeper(&gw)?
                .store
                .note(&owner, &key)
                .await
                .map_err(convo_error)?
                .ok_or_else(|| missing(&key))?;
            Ok(Json(note_json(&note)).into_response())
        }
        .await,
    )
}

async fn forget(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    key: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    let caller = match crate::proxy::identify(&gw, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let by = caller.key.as_deref();
    answer(
        by,
        async {
            let key = path_key(key)?;
            let owner = memory_of(&gw, by, &headers, Use::Reach)?;
            if keeper(&gw)?
                .store
                .delete_note(&owner, &key)
                .await
                .map_err(convo_error)?
            {
                Ok(StatusCode::NO_CONTENT.into_response())
            } else {
                Err(missing(&key))
            }
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
struct SearchQuery {
    q: Option<String>,
    tag: Option<String>,
    /// Read here, so a bad one is refused in the API's envelope.
    limit: Option<String>,
}

/// A path's key, or the API's refusal (axum's is plain text: a key that
/// is not UTF-8, say).
pub(super) fn path_key(
    key: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<String, ApiError> {
    key.map(|Path(k)| k)
        .map_err(|e| ApiError::bad_request(format!("the address: {}", e.body_text())))
}

async fn search(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    q: Result<Query<SearchQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let caller = match crate::proxy::identify(&gw, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let by = caller.key.as_deref();
    answer(
        by,
        async {
            let Query(q) =
                q.map_err(|e| ApiError::bad_request(format!("the query: {}", e.body_text())))?;
            let owner = memory_of(&gw, by, &headers, Use::Reach)?;
            let how = search_by(
                q.q.as_deref(),
                q.tag.as_deref(),
                "search with one of ?q=words or ?tag=name",
            )?;
            // Refused as MCP's recall refuses it: 0 or 500 were read as 1
            // and 100 unsaid.
            let limit = match q.limit.as_deref() {
                None => 20,
                Some(l) => l
                    .parse::<u32>()
                    .ok()
                    .filter(|l| (1..=MAX_RESULTS).contains(l))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "limit is a whole number from 1 to {MAX_RESULTS}"
                        ))
                    })?,
            };
            let notes = keeper(&gw)?
                .store
                .search(&owner, &how, limit)
                .await
                .map_err(convo_error)?;
            let data: Vec<Value> = notes.iter().map(note_json).collect();
            Ok(Json(json!({"object": "list", "data": data})).into_response())
        }
        .await,
    )
}
