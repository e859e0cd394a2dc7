//! `/mcp`: the memory notes as an MCP server (the streamable HTTP
//! transport, protocol 2024-11-05 to 2025-11-25), with the tools
//! `remember`, `recall` and `forget`. A client POSTs one JSON-RPC message
//! at a time (or a batch, where its version has them) and is answered
//! with one JSON body; the server keeps no session (every request carries
//! its key, and a note's owner is the key's project and `x-llmgw-agent`,
//! as on `/v1/memory`), so it offers no event stream (GET answers 405).
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
use super::{Use, convo_error, keeper, memory_of};
use crate::{ApiError, Gateway};

pub(crate) fn routes() -> Router<Arc<Gateway>> {
    Router::new().route("/mcp", post(handle).get(no_stream).delete(no_stream))
}

/// The protocol versions this server speaks, newest first.
const VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The header a client names its version with on every request after
/// `initialize` (2025-06-18 on).
const VERSION_HEADER: &str = "mcp-protocol-version";

/// JSON-RPC's error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const NO_METHOD: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

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
    let by = caller.key.as_deref();
    super::keyed(by, serve(&gw, by, &headers, request).await)
}

/// A request from a caller with a good key.
async fn serve(
    gw: &Gateway,
    key: Option<&llmgw_projections::KeyEntry>,
    headers: &HeaderMap,
    request: axum::extract::Request,
) -> Response {
    let batches = match takes_batches(headers) {
        Ok(b) => b,
        Err(unsupported) => {
            let body = rpc_error(Value::Null, INVALID_REQUEST, &unsupported);
            return (StatusCode::BAD_REQUEST, json_body(&body)).into_response();
        }
    };
    let body = match crate::proxy::body_within(request, super::BODY_LIMIT).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let message: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return json_body(&rpc_error(
                Value::Null,
                PARSE_ERROR,
                &format!("not JSON: {e}"),
            ));
        }
    };
    let caller = Caller { gw, key, headers };
    let answer = match message {
        Value::Array(batch) if batches => caller.batch(batch).await,
        Value::Array(_) => Some(rpc_error(
            Value::Null,
            INVALID_REQUEST,
            "batches are not part of MCP since 2025-06-18: send one message per POST",
        )),
        one => caller.answer(&one).await,
    };
    match answer {
        Some(v) => json_body(&v),
        // Notifications and responses only: nothing to answer.
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// Whether the client's version takes batches: 2025-03-26 does, and the
/// specification has a server read a request without the header as
/// 2025-03-26 (2024-11-05's clients send none either); 2025-06-18 took
/// them out. A version this server does not speak is refused (400), as
/// the specification requires.
fn takes_batches(headers: &HeaderMap) -> Result<bool, String> {
    let Some(v) = headers.get(VERSION_HEADER) else {
        return Ok(true);
    };
    match v.to_str().ok().filter(|v| VERSIONS.contains(v)) {
        Some(v) => Ok(v <= "2025-03-26"),
        None => Err(format!(
            "MCP-Protocol-Version {:?} is not one this server speaks: {}",
            String::from_utf8_lossy(v.as_bytes()),
            VERSIONS.join(", ")
        )),
    }
}

/// One JSON-RPC message, as JSON-RPC 2.0 and MCP shape it.
enum Message<'a> {
    Request {
        id: &'a Value,
        method: &'a str,
        params: &'a Value,
    },
    /// A notification, or a response to us (we never ask): no answer.
    Unanswered,
}

/// A request's id: a string or an integer, never null (MCP).
fn valid_id(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64()
}

impl<'a> Message<'a> {
    /// The message, or why it is not a valid one (an Invalid Request).
    fn of(m: &'a Value) -> Result<Self, &'static str> {
        if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err("a JSON-RPC 2.0 message is an object with \"jsonrpc\": \"2.0\"");
        }
        let id = m.get("id");
        match (m.get("method"), id) {
            (Some(Value::String(_)), None) => Ok(Message::Unanswered),
            (Some(Value::String(method)), Some(id)) if valid_id(id) => Ok(Message::Request {
                id,
                method,
                params: m.get("params").unwrap_or(&Value::Null),
            }),
            (Some(Value::String(_)), Some(_)) => {
                Err("a request's id is a string or an integer, never null")
            }
            (Some(_), _) => Err("a request's method is a string"),
            (None, Some(id))
                if valid_id(id) && (m.get("result").is_some() || m.get("error").is_some()) =>
            {
                Ok(Message::Unanswered)
            }
            (None, _) => Err("a JSON-RPC 2.0 request needs a method"),
        }
    }
}

/// Who asks, for the tools.
struct Caller<'a> {
    gw: &'a Gateway,
    key: Option<&'a llmgw_projections::KeyEntry>,
    headers: &'a HeaderMap,
}

impl Caller<'_> {
    /// A batch's answers, in its order; None when it held only
    /// notifications and responses.
    async fn batch(&self, batch: Vec<Value>) -> Option<Value> {
        if batch.is_empty() {
            return Some(rpc_error(Value::Null, INVALID_REQUEST, "an empty batch"));
        }
        let mut answers = Vec::new();
        for m in &batch {
            let answer = if m.get("method").and_then(Value::as_str) == Some("initialize") {
                Some(rpc_error(
                    id_of(m),
                    INVALID_REQUEST,
                    "initialize is sent alone, never in a batch",
                ))
            } else {
                self.answer(m).await
            };
            answers.extend(answer);
        }
        (!answers.is_empty()).then_some(Value::Array(answers))
    }

    /// One message's answer; None for a notification or a response.
    async fn answer(&self, m: &Value) -> Option<Value> {
        let (id, method, params) = match Message::of(m) {
            Ok(Message::Request { id, method, params }) => (id, method, params),
            Ok(Message::Unanswered) => return None,
            Err(why) => return Some(rpc_error(id_of(m), INVALID_REQUEST, why)),
        };
        let result = match method {
            "initialize" => Ok(initialize(params)),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({"tools": tools()})),
            "tools/call" => self.call(params).await,
            other => Err((NO_METHOD, format!("no method {other:?}"))),
        };
        Some(match result {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err((code, message)) => rpc_error(id.clone(), code, &message),
        })
    }

    /// `tools/call`: an unknown tool, or none named, is the caller's
    /// mistake (Invalid params); what the tool itself refuses is a result
    /// the model reads.
    async fn call(&self, params: &Value) -> Result<Value, (i64, String)> {
        let tool = match params.get("name") {
            Some(Value::String(name)) => Tool::named(name).ok_or_else(|| {
                (
                    INVALID_PARAMS,
                    format!("no tool {name:?}: the tools are remember, recall and forget"),
                )
            })?,
            _ => {
                return Err((
                    INVALID_PARAMS,
                    "tools/call names its tool in params.name".into(),
                ));
            }
        };
        let args = match params.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(a @ Value::Object(_)) => a.clone(),
            Some(_) => return Err((INVALID_PARAMS, "a tool's arguments are an object".into())),
        };
        Ok(outcome(
            async {
                let need = match tool {
                    Tool::Remember => Use::Write,
                    Tool::Recall | Tool::Forget => Use::Reach,
                };
                let owner = memory_of(self.gw, self.key, self.headers, need)?;
                match tool {
                    Tool::Remember => remember(self.gw, &owner, &args).await,
                    Tool::Recall => recall(self.gw, &owner, &args).await,
                    Tool::Forget => forget(self.gw, &owner, &args).await,
                }
            }
            .await,
        ))
    }
}

#[derive(Debug, Clone, Copy)]
enum Tool {
    Remember,
    Recall,
    Forget,
}

impl Tool {
    fn named(name: &str) -> Option<Tool> {
        match name {
            "remember" => Some(Tool::Remember),
            "recall" => Some(Tool::Recall),
            "forget" => Some(Tool::Forget),
            _ => None,
        }
    }
}

/// A message's id for an error about it: its own where it is a valid
/// one, else null (JSON-RPC's answer to a request whose id is unknown).
fn id_of(m: &Value) -> Value {
    m.get("id")
        .filter(|id| valid_id(id))
        .cloned()
        .unwrap_or(Value::Null)
}

fn json_body(v: &Value) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        v.to_string(),
    )
        .into_response()
}

fn rpc_error(id: Value, code: i64, message: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message},
    })
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
