//! An engine's refusal reaches the client in OpenAI's one shape, whatever
//! the engine: llama.cpp's and vLLM's context overflows are OpenAI's
//! `context_length_exceeded`, and what the engine does not do (llama.cpp's
//! 501 for embeddings) is a 400 no retry changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::{Value, json};

use crate::support::{self, spec};

/// An engine that answers as llama.cpp's server does: a prompt saying LONG
/// does not fit its context, one saying VLLM is refused in vLLM's words,
/// one saying GONE meets a 404, and embeddings are not served (started
/// without `--embeddings`). Counts the embeddings asked.
async fn llamacpp_like(embeddings: Arc<AtomicUsize>) -> std::net::SocketAddr {
    let generate = |body: String| async move {
        if body.contains("LONG") {
            (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"error": {"code": 400,
                    "message": "request (613 tokens) exceeds the available context size (512 tokens), try increasing it",
                    "type": "exceed_context_size_error", "n_prompt_tokens": 613, "n_ctx": 512}})),
            )
                .into_response()
        } else if body.contains("VLLM") {
            (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"error": {"code": 400, "param": null, "type": "BadRequestError",
                    "message": "This model's maximum context length is 512 tokens. However, your request has 613 input tokens. Please reduce the length of the input messages."}})),
            )
                .into_response()
        } else if body.contains("GONE") {
            (
                StatusCode::NOT_FOUND,
                axum::Json(
                    json!({"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}),
                ),
            )
                .into_response()
        } else {
            axum::Json(json!({"id": "c", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}))
            .into_response()
        }
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(generate))
        .route("/v1/completions", axum::routing::post(generate))
        .route(
            "/v1/embeddings",
            axum::routing::post(move || {
                embeddings.fetch_add(1, Ordering::SeqCst);
                async {
                    (
                        StatusCode::NOT_IMPLEMENTED,
                        axum::Json(json!({"error": {"code": 501,
                            "message": "This server does not support embeddings. Start it with `--embeddings`",
                            "type": "not_supported_error"}})),
                    )
                }
            }),
        )
        .route("/metrics", axum::routing::get(|| async { "" }));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

/// The error of a refused request, asserted to be OpenAI's shape: the
/// four fields, strings or null, and nothing else.
async fn refusal(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status().as_u16(), status);
    let body: Value = r.json().await.unwrap();
    let error = body["error"].as_object().unwrap();
    let mut fields: Vec<&str> = error.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(fields, ["code", "message", "param", "type"], "{body}");
    assert!(error["message"].is_string(), "{body}");
    assert!(
        error.values().all(|v| v.is_string() || v.is_null()),
        "{body}"
    );
    body["error"].clone()
}

#[tokio::test]
async fn a_prompt_too_long_for_any_engine_is_context_length_exceeded() {
    let engine = llamacpp_like(Arc::default()).await;
    let gw = support::gateway(vec![spec("a", &engine, &["m"])]).await;
    let client = reqwest::Client::new();
    let post =
        |path: &str, body: Value| client.post(format!("{}{path}", gw.base)).json(&body).send();
    let chat = |say: &str, stream: bool| {
        json!({"model": "m", "stream": stream,
            "messages": [{"role": "user", "content": say}]})
    };
    let cases = [
        ("/v1/chat/completions", chat("LONG", false), "messages"),
        // Streamed or not: the engine refuses before it streams.
        ("/v1/chat/completions", chat("LONG", true), "messages"),
        ("/v1/chat/completions", chat("VLLM", false), "messages"),
        (
            "/v1/completions",
            json!({"model": "m", "prompt": "LONG"}),
            "prompt",
        ),
        // The Responses API names its own field.
        (
            "/v1/responses",
            json!({"model": "m", "input": "LONG"}),
            "input",
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "LONG", "stream": true}),
            "input",
        ),
    ];
    for (path, body, param) in cases {
        let error = refusal(post(path, body.clone()).await.unwrap(), 400).await;
        assert_eq!(error["code"], "context_length_exceeded", "{path} {body}");
        assert_eq!(error["type"], "invalid_request_error", "{error}");
        assert_eq!(error["param"], param, "{path} {body}");
        // The engine's own words.
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains("exceeds the available context size (512 tokens)")
                || message.contains("maximum context length is 512 tokens"),
            "{error}"
        );
    }
    // Any other refusal keeps its status and message, in the same shape.
    let error = refusal(
        post("/v1/chat/completions", chat("GONE", false))
            .await
            .unwrap(),
        404,
    )
    .await;
    assert_eq!(
        (&error["message"], &error["type"], &error["code"]),
        (
            &json!("File Not Found"),
            &json!("not_found_error"),
            &Value::Null
        )
    );
    assert_eq!(
        post("/v1/chat/completions", chat("hi", false))
            .await
            .unwrap()
            .status(),
        200
    );
}

/// Embeddings from an engine started without them: asked once, answered
/// 400 with `x-should-retry: false` (a 501 made OpenAI's SDKs ask three
/// times what could never succeed).
#[tokio::test]
async fn what_the_engine_does_not_do_is_a_final_400() {
    let asked = Arc::new(AtomicUsize::new(0));
    let engine = llamacpp_like(asked.clone()).await;
    let gw = support::gateway(vec![spec("a", &engine, &["m"])]).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/embeddings", gw.base))
        .json(&json!({"model": "m", "input": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-should-retry"], "false");
    let error = refusal(r, 400).await;
    assert_eq!(
        (&error["code"], &error["param"]),
        (&json!("unsupported_endpoint"), &json!("model"))
    );
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("`m` is not served for /v1/embeddings")
            && message.contains("Start it with `--embeddings`"),
        "{message}"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1);
}
