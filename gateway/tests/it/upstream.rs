//! The proxy hop itself: what an engine is sent, and that an engine's
//! redirect is its answer, relayed, not followed.

use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use axum::routing::post;
use llmgw_gateway::UpstreamKey;
use serde_json::{Value, json};

use crate::support::{self, spec};

/// What the engine was sent: the path and headers of each request.
type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

/// An engine whose chat path redirects elsewhere on itself.
async fn redirecting_engine(seen: Seen) -> std::net::SocketAddr {
    let on_chat = seen.clone();
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(|headers: HeaderMap| async move {
                on_chat.lock().unwrap().push(("chat".into(), headers));
                (
                    axum::http::StatusCode::FOUND,
                    [
                        ("location", "/v1/elsewhere"),
                        ("content-type", "application/json"),
                    ],
                    r#"{"moved": true}"#,
                )
            }),
        )
        .route(
            "/v1/elsewhere",
            post(|headers: HeaderMap| async move {
                seen.lock().unwrap().push(("elsewhere".into(), headers));
                "followed"
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

#[tokio::test]
async fn an_engines_redirect_is_relayed_as_its_answer_and_never_followed() {
    let seen = Seen::default();
    let engine = redirecting_engine(seen.clone()).await;
    let mut e = spec("a", &engine, &["m"]);
    e.api_key = Some(UpstreamKey::new("sk-upstream".into()));
    let gw = support::gateway(vec![e]).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.base))
        .header("x-request-id", "req-302")
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 302);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body, json!({"moved": true}));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "the redirect was followed");
    let (path, headers) = &seen[0];
    assert_eq!(path, "chat");
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    assert_eq!(header("authorization"), Some("Bearer sk-upstream"));
    assert_eq!(header("content-type"), Some("application/json"));
    assert_eq!(header("x-request-id"), Some("req-302"));
    assert_eq!(header("accept"), Some("*/*"));
}
