//! The proxy hop itself: what an engine is sent, that an engine's
//! redirect is its answer, relayed, not followed, and that connections to
//! an engine are kept and reused.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::ConnectInfo;
use axum::http::HeaderMap;
use axum::routing::post;
use llmgw_gateway::UpstreamKey;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Notify, mpsc};

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

/// A hosted service's 429 reaches the client with its own Retry-After, so
/// an SDK waits as long as the service asked.
#[tokio::test]
async fn an_upstreams_retry_after_is_passed_on() {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            (
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "17"), ("content-type", "application/json")],
                r#"{"error": {"message": "slow down", "type": "rate_limit_error"}}"#,
            )
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    let gw = support::gateway(vec![spec("hosted", &engine, &["m"])]).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.base))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"], "17");
}

/// The client ends of the connections an engine was sent chats on.
type Peers = Arc<Mutex<Vec<SocketAddr>>>;

/// An engine that answers chats, plain or streamed, and notes which
/// connection each came on. Asked "fail", it answers 500; asked "close",
/// it answers and closes the connection.
async fn noting_engine(peers: Peers) -> SocketAddr {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(
            |ConnectInfo(peer): ConnectInfo<SocketAddr>, body: axum::body::Bytes| async move {
                peers.lock().unwrap().push(peer);
                let asked: Value = serde_json::from_slice(&body).unwrap();
                let said = asked["messages"][0]["content"].as_str().unwrap_or_default();
                let answer = axum::response::Response::builder();
                if said == "fail" {
                    return answer
                        .status(500)
                        .header("content-type", "application/json")
                        .body(axum::body::Body::from(r#"{"error":"engine failed"}"#))
                        .unwrap();
                }
                let answer = if said == "close" {
                    answer.header("connection", "close")
                } else {
                    answer
                };
                if asked["stream"] == json!(true) {
                    let events = [
                        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
                        "data: [DONE]\n\n",
                    ];
                    let chunks = futures_util::stream::iter(
                        events.map(|e| Ok::<_, std::io::Error>(axum::body::Bytes::from(e))),
                    );
                    answer
                        .header("content-type", "text/event-stream")
                        .body(axum::body::Body::from_stream(chunks))
                        .unwrap()
                } else {
                    answer
                        .header("content-type", "application/json")
                        .body(axum::body::Body::from(
                            r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#,
                        ))
                        .unwrap()
                }
            },
        ),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

/// A chat through the gateway; a hop that lost a wake would hang it, so
/// it fails after ten seconds instead.
async fn chat(base: &str, say: &str, stream: bool) -> (u16, String) {
    let asking = async {
        let r = reqwest::Client::new()
            .post(format!("{base}/v1/chat/completions"))
            .json(&json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": say}]}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), asking)
        .await
        .expect("an answer within ten seconds")
}

#[tokio::test]
async fn one_connection_to_an_engine_carries_request_after_request() {
    let peers = Peers::default();
    let engine = noting_engine(peers.clone()).await;
    let gw = support::gateway(vec![spec("a", &engine, &["m"])]).await;
    // (what is said, streamed, the gateway's answer)
    let asked = [
        ("hi", false, 200),
        ("hi", true, 200),
        // The engine's error is relayed (one endpoint: nowhere else to
        // go), and its connection, answered to the end, is kept.
        ("fail", false, 500),
        ("hi", true, 200),
        ("hi", false, 200),
        // The engine closes this one after answering.
        ("close", false, 200),
        ("hi", false, 200),
        ("hi", true, 200),
    ];
    for (say, stream, status) in asked {
        let (got, text) = chat(&gw.base, say, stream).await;
        assert_eq!(got, status, "{say}: {text}");
        match (status, stream) {
            (200, true) => assert!(text.trim_end().ends_with("data: [DONE]"), "{text}"),
            (200, false) => assert!(text.contains("\"content\":\"hi\""), "{text}"),
            _ => {}
        }
    }
    let peers = peers.lock().unwrap();
    assert_eq!(peers.len(), asked.len());
    assert!(
        peers[..6].iter().all(|p| *p == peers[0]),
        "each answer, read or left to its end, leaves its connection for the next request: {peers:?}"
    );
    assert!(
        peers[6..].iter().all(|p| *p == peers[6]) && peers[6] != peers[0],
        "the connection the engine closed is not used again: {peers:?}"
    );
}

/// An engine that closes a connection it has answered on when told to,
/// without having said so in its answer: as an engine does at its
/// keep-alive timeout, after the gateway has put the connection back in
/// its pool. Says on `closed` when it has.
async fn closing_engine(close: Arc<Notify>, closed: mpsc::UnboundedSender<()>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = l.accept().await {
            let (close, closed) = (close.clone(), closed.clone());
            tokio::spawn(async move {
                let Some(head) = support::read_request(&mut conn).await else {
                    return;
                };
                if !head.starts_with("post /v1/chat/completions") {
                    return;
                }
                let body =
                    r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
                close.notified().await;
                let _ = conn.shutdown().await;
                drop(conn);
                let _ = closed.send(());
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_connection_the_engine_closed_while_idle_is_not_what_the_next_request_fails_on() {
    let close = Arc::new(Notify::new());
    let (closed_tx, mut closed) = mpsc::unbounded_channel();
    let engine = closing_engine(close.clone(), closed_tx).await;
    // One endpoint and no retries: a request sent on the closed
    // connection would have had nowhere else to go.
    let gw = support::gateway_with(llmgw_gateway::GatewayConfig {
        endpoints: vec![spec("a", &engine, &["m"])],
        retries: 0,
        ..llmgw_gateway::GatewayConfig::default()
    })
    .await;
    for _ in 0..3 {
        let (status, text) = chat(&gw.base, "hi", false).await;
        assert_eq!(status, 200, "{text}");
        // The answered connection is idle in the gateway's pool now.
        close.notify_one();
        closed.recv().await.unwrap();
        // A round trip through the gateway's runtime, so that the close
        // has reached it (as an engine's keep-alive timeout of seconds
        // has, before the next request).
        gw.admin_page().await;
    }
}

#[tokio::test]
async fn a_request_and_its_answer_larger_than_one_read_arrive_whole() {
    // Far more than hyper reads at once (8 KiB at first), each way: the
    // gateway is handed the request and the answer in pieces, and passes
    // each on as the one document. The engine answers what it was told.
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(|body: axum::body::Bytes| async move {
            let asked: Value = serde_json::from_slice(&body).unwrap();
            let said = &asked["messages"][0]["content"];
            let answer = json!({
                "choices": [{"index": 0, "message": {"role": "assistant", "content": said}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            });
            ([("content-type", "application/json")], answer.to_string())
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    let gw = support::gateway(vec![spec("a", &engine, &["m"])]).await;
    let said = "0123456789".repeat(20_000);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.base))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": said}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["x-llmgw-served-model"], "m");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], json!(said));
}
