//! `/mcp`: the memory notes as an MCP server (the streamable HTTP
//! transport, protocol 2024-11-05 to 2025-11-25), with the tools `remember`, `recall` and
//! `forget`. A client POSTs one JSON-RPC message at a time and is answered
//! with one JSON body; the server keeps no session (every request carries
//! its key, and a note's owner is the key's project and `x-llmgw-agent`, as
//! on `/v1/memory`), so it offers no event stream (GET answers 405).
//!
//! Written here rather than with the `rmcp` SDK: three tools need four
//! JSON-RPC methods, while the SDK's HTTP service brings its own session
//! manager and SSE machinery that would sit beside the gateway's key check
//! instead of behind it. The official Python client drives it in the tests.
//!
//! The tools are never added to chat requests: an agent's client calls
//! them itself.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use llmgw_convo::{Owner, Put};
use serde_json::{Value, json};

use super::memory::{MAX_RESULTS, note_json, search_by};
use super::{convo_error, keeper, memory_of};
use crate::{ApiError, Gateway};

pub(crate) fn routes() -> Router<Arc<Gateway>> {
    Router::new().route("/mcp", post(handle).get(no_stream).delete(no_stream))
}

/// The protocol versions this server speaks, newest first.
const VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// No server-initiated stream and no session to end.
async fn no_stream() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, HeaderValue::from_static("POST"))],
        "this MCP server answers each POST with one JSON body; it offers no event stream",
    )
        .into_response()
}

async fn handle(State(gw): State<Arc<Gateway>>, request: axum::extract::Request) -> Response {
    let headers = request.headers().clone();
    // The key is checked before the body is read: a caller without one
    // learns nothing, not even which methods exist, and has no body held;
    // a browser page on a foreign origin is refused first.
    let caller = match crate::proxy::identify(&gw, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let body = match crate::proxy::body_within(request, super::BODY_LIMIT).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let message: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return rpc_error(Value::Null, -32700, &format!("not JSON: {e}")),
    };
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        // A response to us (we never ask) or garbage.
        if message.get("id").is_some() && message.get("jsonrpc").is_some() {
            return StatusCode::ACCEPTED.into_response();
        }
        return rpc_error(
            Value::Null,
            -32600,
            "a JSON-RPC 2.0 request needs a method (one message per POST)",
        );
    };
    let Some(id) = message.get("id").cloned() else {
        // A notification (initialized, cancelled): nothing to answer.
        return StatusCode::ACCEPTED.into_response();
    };
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    let result = match method {
        "initialize" => Ok(initialize(&params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tools()})),
        "tools/call" => Ok(call(&gw, caller.key.as_deref(), &headers, &params).await),
        other => Err((-32601, format!("no method {other:?}"))),
    };
    match result {
        Ok(result) => json_body(json!({"jsonrpc": "2.0", "id": id, "result": result})),
        Err((code, message)) => rpc_error(id, code, &message),
    }
}

fn json_body(v: Value) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        v.to_string(),
    )
        .into_response()
}

fn rpc_error(id: Value, code: i64, message: &str) -> Response {
    json_body(json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message},
    }))
}

fn initialize(params: &Value) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = asked
        .filter(|v| VERSIONS.contains(v))
        .unwrap_or(VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "llmgw", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Notes kept for this key's project and agent (x-llmgw-agent, \
                         default 'default'): remember writes one, recall reads one by key \
                         or searches by words or tag, forget removes one.",
    })
}

fn tools() -> Value {
    json!([
        {
            "name": "remember",
            "description": "Keep a note under a key (replacing one kept under it): \
                            text up to 16 KiB, up to 16 tags of a-z, 0-9, _ and -.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "key": {"type": "string", "description": "The note's name, up to 200 bytes."},
                    "text": {"type": "string"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["key", "text"],
            },
        },
        {
            "name": "recall",
            "description": "Read the note kept under a key, or search the notes by words \
                            (query) or by a tag, newest write first.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "key": {"type": "string"},
                    "query": {"type": "string", "description": "Words the notes must all contain."},
                    "tag": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS},
                },
            },
        },
        {
            "name": "forget",
            "description": "Remove the note kept under a key.",
            "inputSchema": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
    ])
}

/// A tool's outcome as MCP carries it: a failure the model should read
/// (memory off, a limit, no such note) is a result marked as an error,
/// not a protocol error.
fn outcome(r: Result<(String, Value), ApiError>) -> Value {
    match r {
        Ok((text, data)) => json!({
            "content": [{"type": "text", "text": text}],
            "structuredContent": data,
            "isError": false,
        }),
        Err(e) => json!({
            "content": [{"type": "text", "text": e.message}],
            "isError": true,
        }),
    }
}

async fn call(
    gw: &Gateway,
    key: Option<&llmgw_projections::KeyEntry>,
    headers: &HeaderMap,
    params: &Value,
) -> Value {
    let name = params.get("name").and_then(Value::as_str).unwrap_or("");
    let args = params.get("arguments").cloned().unwrap_or(json!({}));
    outcome(
        async {
            let owner = memory_of(gw, key, headers)?.0;
            match name {
                "remember" => remember(gw, &owner, &args).await,
                "recall" => recall(gw, &owner, &args).await,
                "forget" => forget(gw, &owner, &args).await,
                other => Err(ApiError::bad_request(format!(
                    "no tool {other:?}: the tools are remember, recall and forget"
                ))),
            }
        }
        .await,
    )
}

fn text_arg<'a>(args: &'a Value, name: &str) -> Result<Option<&'a str>, ApiError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::bad_request(format!("{name} is a string"))),
    }
}

fn required<'a>(args: &'a Value, name: &str) -> Result<&'a str, ApiError> {
    text_arg(args, name)?.ok_or_else(|| ApiError::bad_request(format!("{name} is required")))
}

async fn remember(gw: &Gateway, owner: &Owner, args: &Value) -> Result<(String, Value), ApiError> {
    let key = required(args, "key")?;
    let text = required(args, "text")?;
    let tags: Vec<String> = match args.get("tags") {
        None | Some(Value::Null) => Vec::new(),
        Some(t) => serde_json::from_value(t.clone())
            .map_err(|_| ApiError::bad_request("tags is a list of strings"))?,
    };
    let store = &keeper(gw)?.store;
    let put = store
        .put_note(owner, key, text, &tags, chrono::Utc::now())
        .await
        .map_err(convo_error)?;
    let verb = match put {
        Put::Created => "remembered",
        Put::Replaced => "replaced",
    };
    let note = store.note(owner, key).await.map_err(convo_error)?;
    Ok((
        format!("{verb} {key:?}"),
        note.as_ref().map_or(Value::Null, note_json),
    ))
}

async fn recall(gw: &Gateway, owner: &Owner, args: &Value) -> Result<(String, Value), ApiError> {
    let store = &keeper(gw)?.store;
    let (key, words, tag) = (
        text_arg(args, "key")?,
        text_arg(args, "query")?,
        text_arg(args, "tag")?,
    );
    const USAGE: &str = "recall takes one of key, query or tag";
    if let Some(key) = key {
        if words.is_some() || tag.is_some() {
            return Err(ApiError::bad_request(USAGE));
        }
        let note = store
            .note(owner, key)
            .await
            .map_err(convo_error)?
            .ok_or_else(|| ApiError::not_found(format!("no note {key:?}")))?;
        return Ok((note.text.clone(), json!({"notes": [note_json(&note)]})));
    }
    let search = search_by(words, tag, USAGE)?;
    let limit = match args.get("limit") {
        None | Some(Value::Null) => 20,
        Some(l) => l
            .as_u64()
            .filter(|l| (1..=u64::from(MAX_RESULTS)).contains(l))
            .ok_or_else(|| {
                ApiError::bad_request(format!("limit is a whole number from 1 to {MAX_RESULTS}"))
            })? as u32,
    };
    let notes = store
        .search(owner, &search, limit)
        .await
        .map_err(convo_error)?;
    let text = if notes.is_empty() {
        "no notes match".to_owned()
    } else {
        notes
            .iter()
            .map(|n| format!("{}: {}", n.key, n.text))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let data: Vec<Value> = notes.iter().map(note_json).collect();
    Ok((text, json!({"notes": data})))
}

async fn forget(gw: &Gateway, owner: &Owner, args: &Value) -> Result<(String, Value), ApiError> {
    let key = required(args, "key")?;
    if keeper(gw)?
        .store
        .delete_note(owner, key)
        .await
        .map_err(convo_error)?
    {
        Ok((format!("forgot {key:?}"), json!({"key": key})))
    } else {
        Err(ApiError::not_found(format!("no note {key:?}")))
    }
}
