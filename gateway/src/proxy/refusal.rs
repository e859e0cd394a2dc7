//! An engine's error answer in OpenAI's one shape,
//! `{"error": {"message", "type", "param", "code"}}` with a string code,
//! whatever the engine: each says the same failure its own way (llama.cpp
//! a number for `code` and a type of its own, vLLM a number and
//! `BadRequestError`), and a client that checks `code` missed it on all
//! but one. A request that does not fit the model's context is 400
//! `context_length_exceeded`, as OpenAI and the sim say it; what an engine
//! does not do at all (501) is a 400 no retry can change.

use axum::body::Bytes;
use axum::http::StatusCode;
use serde_json::{Value, json};

/// An engine's refusal as the client gets it.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) body: Bytes,
    /// Asking again cannot help: sent as `x-should-retry: false` (OpenAI's
    /// SDKs retry a 5xx, and a 501 never changes).
    pub(crate) final_answer: bool,
}

/// The error types OpenAI's API says; an engine's own (llama.cpp's
/// `exceed_context_size_error`, vLLM's `BadRequestError`) is replaced by
/// the one its status stands for.
const OPENAI_TYPES: [&str; 6] = [
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "rate_limit_error",
    "server_error",
];

/// What engines say when a request does not fit the context, in lower
/// case: vLLM ("This model's maximum context length is N tokens. However,
/// …"; "The decoder prompt (length N) is longer than the maximum model
/// length of M"), SGLang ("The input (N tokens) is longer than the model's
/// context length (M tokens)"; "Requested token count exceeds the model's
/// maximum context length of M tokens"), older llama.cpp ("the request
/// exceeds the available context size").
const OVERFLOW_WORDS: [&str; 4] = [
    "maximum context length",
    "longer than the maximum model length",
    "longer than the model's context length",
    "exceeds the available context size",
];

/// The engine's error answer `body` (status `status`) to a request on
/// `path` for `model`, in OpenAI's shape.
pub(crate) fn normalise(status: StatusCode, body: &[u8], path: &str, model: &str) -> Refusal {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    // OpenAI's envelope, or the fields at the top (vLLM's older answers,
    // FastAPI's `detail`).
    let error = json.as_ref().map(|v| match &v["error"] {
        e @ Value::Object(_) => e,
        _ => v,
    });
    let field = |name: &str| error.and_then(|e| e[name].as_str());
    let message = message_of(json.as_ref(), body);
    let said = |status: StatusCode, kind: &str, param: Option<&str>, code: Option<&str>| {
        let message = if message.is_empty() {
            format!("the engine answered {status}")
        } else {
            message.clone()
        };
        let body =
            json!({"error": {"message": message, "type": kind, "param": param, "code": code}});
        Bytes::from(body.to_string())
    };
    if overflows(status, field("type"), field("code"), &message) {
        return Refusal {
            status: StatusCode::BAD_REQUEST,
            body: said(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some(prompt_param(path)),
                Some("context_length_exceeded"),
            ),
            final_answer: false,
        };
    }
    if status == StatusCode::NOT_IMPLEMENTED {
        let why = match message.as_str() {
            "" => String::new(),
            m => format!(" (it says: {m})"),
        };
        let body = json!({"error": {
            "message": format!("`{model}` is not served for {path} here: its engine does not do that{why}"),
            "type": "invalid_request_error",
            "param": "model",
            "code": "unsupported_endpoint",
        }});
        return Refusal {
            status: StatusCode::BAD_REQUEST,
            body: Bytes::from(body.to_string()),
            final_answer: true,
        };
    }
    let kind = field("type")
        .filter(|t| OPENAI_TYPES.contains(t))
        .unwrap_or_else(|| type_of(status));
    Refusal {
        status,
        body: said(status, kind, field("param"), field("code")),
        final_answer: false,
    }
}

/// The message of an OpenAI-shaped error body (`error.message`), a
/// FastAPI one (`detail`), or the body's first line of text; nothing of an
/// HTML page.
pub(crate) fn message_of(json: Option<&Value>, body: &[u8]) -> String {
    let from_json = json.and_then(|v| {
        [
            &v["error"]["message"],
            &v["message"],
            &v["detail"],
            &v["error"],
        ]
        .into_iter()
        .find_map(|m| m.as_str().map(str::to_owned))
    });
    from_json
        .or_else(|| {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            (!text.starts_with('<')).then(|| text.lines().next().unwrap_or_default().to_owned())
        })
        .unwrap_or_default()
}

/// Whether the engine says the request does not fit the model's context.
fn overflows(status: StatusCode, kind: Option<&str>, code: Option<&str>, message: &str) -> bool {
    if kind == Some("exceed_context_size_error") || code == Some("context_length_exceeded") {
        return true;
    }
    let lower = message.to_lowercase();
    status.is_client_error() && OVERFLOW_WORDS.iter().any(|w| lower.contains(w))
}

/// The field a request's prompt is in, on each path.
fn prompt_param(path: &str) -> &'static str {
    match path {
        "/v1/completions" => "prompt",
        "/v1/embeddings" => "input",
        _ => "messages",
    }
}

/// OpenAI's error type for a status.
fn type_of(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: Value, path: &str) -> (u16, Value, bool) {
        let status = StatusCode::from_u16(status).unwrap();
        let r = normalise(status, body.to_string().as_bytes(), path, "m");
        let body = serde_json::from_slice(&r.body).unwrap();
        (r.status.as_u16(), body, r.final_answer)
    }

    #[test]
    fn each_engines_context_overflow_is_context_length_exceeded() {
        let llamacpp = json!({"error": {"code": 400, "message": "request (613 tokens) exceeds the available context size (512 tokens), try increasing it",
            "type": "exceed_context_size_error", "n_prompt_tokens": 613, "n_ctx": 512}});
        let vllm = json!({"error": {"message": "This model's maximum context length is 512 tokens. However, your request has 613 input tokens. Please reduce the length of the input messages.",
            "type": "BadRequestError", "param": null, "code": 400}});
        let vllm_old = json!({"object": "error", "message": "This model's maximum context length is 512 tokens. However, you requested 613 tokens (600 in the messages, 13 in the completion). Please reduce the length of the messages or completion.",
            "type": "BadRequestError", "param": null, "code": 400});
        let sglang = json!({"object": "error", "message": "The input (613 tokens) is longer than the model's context length (512 tokens).",
            "type": "BadRequestError", "param": null, "code": 400});
        for (body, path, param) in [
            (llamacpp, "/v1/chat/completions", "messages"),
            (vllm, "/v1/completions", "prompt"),
            (vllm_old, "/v1/chat/completions", "messages"),
            (sglang, "/v1/embeddings", "input"),
        ] {
            let message = message_of(Some(&body), b"");
            let (status, said, final_answer) = answer(400, body, path);
            assert_eq!(status, 400);
            assert!(!final_answer);
            assert_eq!(
                said,
                json!({"error": {"message": message, "type": "invalid_request_error",
                    "param": param, "code": "context_length_exceeded"}})
            );
        }
    }

    #[test]
    fn other_refusals_keep_status_and_message_in_the_standard_shape() {
        let (status, said, final_answer) = answer(
            404,
            json!({"error": {"code": 404, "message": "model not found", "type": "not_found_error"}}),
            "/v1/chat/completions",
        );
        assert_eq!((status, final_answer), (404, false));
        assert_eq!(
            said,
            json!({"error": {"message": "model not found", "type": "not_found_error", "param": null, "code": null}})
        );
        // vLLM's own type is replaced by OpenAI's for the status; a string
        // code and param are kept.
        let (_, said, _) = answer(
            400,
            json!({"error": {"message": "bad", "type": "BadRequestError", "param": "temperature", "code": "invalid_value"}}),
            "/v1/chat/completions",
        );
        assert_eq!(
            said["error"],
            json!({"message": "bad", "type": "invalid_request_error", "param": "temperature", "code": "invalid_value"})
        );
        // Plain text and HTML.
        let r = normalise(
            StatusCode::UNPROCESSABLE_ENTITY,
            b"no\nmore",
            "/v1/completions",
            "m",
        );
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            (r.status.as_u16(), &v["error"]["message"]),
            (422, &json!("no"))
        );
        let r = normalise(
            StatusCode::FORBIDDEN,
            b"<html>x</html>",
            "/v1/completions",
            "m",
        );
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["type"], "permission_error");
        assert_eq!(v["error"]["message"], "the engine answered 403 Forbidden");
    }

    #[test]
    fn what_an_engine_does_not_do_is_a_final_400() {
        let (status, said, final_answer) = answer(
            501,
            json!({"error": {"code": 501, "message": "This server does not support embeddings. Start it with `--embeddings`",
                "type": "not_supported_error"}}),
            "/v1/embeddings",
        );
        assert_eq!((status, final_answer), (400, true));
        assert_eq!(said["error"]["code"], "unsupported_endpoint");
        assert_eq!(said["error"]["param"], "model");
        let message = said["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("`m` is not served for /v1/embeddings")
                && message.contains("Start it with `--embeddings`"),
            "{message}"
        );
    }
}
