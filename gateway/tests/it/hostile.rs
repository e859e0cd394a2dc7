//! Bad input, generated: arbitrary methods, paths, headers and bodies sent
//! over a real socket to a real gateway (keys on, a key with rates and a
//! budget, a priced model, an engine behind it). Whatever arrives, the
//! gateway answers: never a panic, never a 5xx of its own making, and a
//! refusal on the API says why in the OpenAI envelope. Afterwards the
//! gateway still serves.

use std::time::Duration;

use llmgw_domain::catalog::Price;
use llmgw_domain::tenancy::{Limits, Period, Scope};
use llmgw_gateway::{ConnectionLimits, Gateway, GatewayConfig};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{self, spec};
use crate::tenancy::Tenants;

/// An engine that answers anything at once (a sim would take its time
/// over a hostile max_tokens): a chat completion, streamed when asked.
async fn quick_engine() -> std::net::SocketAddr {
    use axum::body::Bytes;
    use axum::routing::{get, post};
    async fn complete(body: Bytes) -> axum::response::Response {
        use axum::response::IntoResponse;
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let usage = json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5});
        if v["stream"] == json!(true) {
            let chunk = json!({"id": "q", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]});
            let last = json!({"id": "q", "object": "chat.completion.chunk", "model": "m",
                "choices": [], "usage": usage});
            let text = format!("data: {chunk}\n\ndata: {last}\n\ndata: [DONE]\n\n");
            return ([("content-type", "text/event-stream")], text).into_response();
        }
        axum::Json(json!({"id": "q", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                         "finish_reason": "stop"}],
            "usage": usage}))
        .into_response()
    }
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(complete))
        .route("/v1/completions", post(complete))
        .route("/v1/embeddings", post(complete))
        .route(
            "/metrics",
            get(|| async { "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n" }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

/// One request as bytes on the wire.
#[derive(Debug, Clone)]
struct Raw {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

const API: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => Just("POST".to_owned()),
        2 => Just("GET".to_owned()),
        1 => prop::sample::select(vec!["PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE"])
            .prop_map(str::to_owned),
        1 => "[A-Z]{1,10}",
        1 => "[!-~]{1,10}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    let known = prop::sample::select(vec![
        "/v1/models",
        "/v1/models/m",
        "/me",
        "/health",
        "/ready",
        "/metrics",
    ]);
    prop_oneof![
        12 => prop::sample::select(API.to_vec()).prop_map(str::to_owned),
        3 => known.prop_map(str::to_owned),
        1 => "/v1/models/[!-~]{0,64}",
        1 => prop::sample::select(vec![
            "/../../etc/passwd",
            "/v1/models/..%2f..%2fetc%2fpasswd",
            "/v1/../v1/chat/completions",
            "//v1//chat//completions",
            "/v1/models/%00",
            "/v1/models/%ff%fe",
            "*",
        ])
        .prop_map(str::to_owned),
        1 => "/[!-~]{0,200}",
    ]
}

fn header() -> impl Strategy<Value = (String, String)> {
    let name = prop_oneof![
        prop::sample::select(vec![
            "authorization",
            "content-type",
            "x-llmgw-band",
            "x-session-id",
            "x-request-id",
            "accept",
            "accept-encoding",
            "expect",
            "transfer-encoding",
            "cookie",
            "origin",
        ])
        .prop_map(str::to_owned),
        "[a-z][a-z0-9-]{0,24}",
    ];
    let value = prop_oneof![
        Just("Bearer llmgw-sk-k1-0123456789".to_owned()),
        Just("application/json".to_owned()),
        prop::sample::select(vec!["gold", "bronze", "platinum", "ruby", ""])
            .prop_map(str::to_owned),
        "Bearer [ -~]{0,80}",
        "[ -~]{0,200}",
        "[a-z]{4000}",
    ];
    (name, value)
}

/// JSON of any shape, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[ -~]{0,40}".prop_map(Value::String),
        ".{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,12}", inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Numbers no request should carry.
fn hostile_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => Just(json!(-1)),
        1 => Just(json!(0)),
        4 => Just(json!(u64::MAX)),
        1 => Just(json!(i64::MIN)),
        2 => Just(json!(u64::MAX - 1)),
        1 => Just(json!(4_294_967_296u64)),
        1 => Just(json!(1e300)),
        1 => Just(json!(0.5)),
        1 => Just(json!("12")),
        1 => Just(json!(null)),
        1 => Just(json!([1, 2])),
        1 => any::<u64>().prop_map(Value::from),
    ]
}

/// A request that looks like the API's, with hostile values in its
/// fields.
fn api_like() -> impl Strategy<Value = Value> {
    let model = prop_oneof![
        4 => Just(json!("m")),
        1 => Just(json!("")),
        1 => Just(json!("no-such-model")),
        1 => Just(json!("../m")),
        1 => Just(json!(17)),
        1 => Just(json!(null)),
        1 => "[a-z]{5000}".prop_map(Value::String),
    ];
    let content = prop_oneof![
        ".{0,64}".prop_map(Value::String),
        any_json(),
        prop::collection::vec(
            prop_oneof![Just(json!({"type": "text", "text": "hi"})), any_json()],
            0..4
        )
        .prop_map(Value::Array),
    ];
    let message = (
        prop::sample::select(vec!["user", "system", "assistant", "", "tool"]),
        content,
    )
        .prop_map(|(role, content)| json!({"role": role, "content": content}));
    (
        model,
        any::<bool>(),
        prop::option::of(hostile_number()),
        prop::option::of(hostile_number()),
        prop::collection::vec(message, 0..6),
        prop::option::of(any_json()),
        prop::option::of(any_json()),
    )
        .prop_map(
            |(model, stream, max_tokens, max_completion, messages, prompt, extra)| {
                let mut v = json!({"model": model, "stream": stream, "messages": messages});
                if let Some(n) = max_tokens {
                    v["max_tokens"] = n;
                }
                if let Some(n) = max_completion {
                    v["max_completion_tokens"] = n;
                }
                if let Some(p) = prompt {
                    v["prompt"] = p.clone();
                    v["input"] = p;
                }
                if let Some(e) = extra {
                    v["stream_options"] = e.clone();
                    v["user"] = e;
                }
                v
            },
        )
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        10 => api_like().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        2 => any_json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => prop::collection::vec(any::<u8>(), 0..512),
        // Nested past any parser's patience.
        1 => (1usize..5000).prop_map(|n| format!("{}{}", "[".repeat(n), "]".repeat(n)).into_bytes()),
        1 => Just(Vec::new()),
    ]
}

/// Mostly with the key, so that most requests get past the door to the
/// stages behind it.
fn raw() -> impl Strategy<Value = Raw> {
    (
        method(),
        path(),
        prop::collection::vec(header(), 0..6),
        body(),
        prop::bool::weighted(0.8),
    )
        .prop_map(|(method, path, mut headers, body, keyed)| {
            if keyed {
                headers.insert(
                    0,
                    (
                        "authorization".into(),
                        "Bearer llmgw-sk-k1-0123456789".into(),
                    ),
                );
            }
            Raw {
                method,
                path,
                headers,
                body,
            }
        })
}

/// Sends `r` on a fresh connection; the status and body, or what went
/// wrong. The request says `connection: close`, so the server ends the
/// connection after its answer.
async fn send(addr: &str, r: &Raw) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let mut head = format!("{} {} HTTP/1.1\r\nhost: gw\r\n", r.method, r.path);
    for (k, v) in &r.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n",
        r.body.len()
    ));
    // The server may answer and close before reading all of it.
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(&r.body).await;
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    match read {
        Err(_) => return Err(format!("no end to the answer within 20 s: {text:?}")),
        Ok(Err(e)) if out.is_empty() => return Err(format!("no answer: {e}")),
        Ok(_) => {}
    }
    // An interim answer (100 Continue) comes before the final one.
    let mut text = text.as_str();
    while text.starts_with("HTTP/1.1 1")
        && let Some((_, rest)) = text.split_once("\r\n\r\n")
    {
        text = rest;
    }
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}

/// What a user may expect of any answer to `r`.
fn check(r: &Raw, answer: Result<(u16, String), String>) -> Result<(), TestCaseError> {
    let (status, body) = answer.map_err(TestCaseError::fail)?;
    prop_assert!(
        status < 500,
        "{} {} answered {status}: {body}",
        r.method,
        r.path
    );
    // A message HTTP itself cannot parse (a broken framing header, say)
    // is refused by the HTTP layer before any route: a bare 400 or 431.
    let malformed = body.is_empty() && matches!(status, 400 | 431);
    if status >= 400 && !malformed && r.method == "POST" && API.contains(&r.path.as_str()) {
        // The envelope, with a reason a person can act on. (A chunked
        // answer's body is in chunks: the message is still in it.)
        prop_assert!(
            body.contains("\"error\"") && body.contains("\"message\":\""),
            "{} {} answered {status} without a reason: {body}",
            r.method,
            r.path
        );
    }
    Ok(())
}

#[test]
fn arbitrary_requests_are_answered_and_never_with_a_server_error() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (keyed, open, _tenants, gw) = rt.block_on(async {
        let mut t = Tenants::new().await;
        let secret = t.key("k1", "p").await;
        assert_eq!(secret, "llmgw-sk-k1-0123456789");
        t.limit(
            Scope::Project,
            "p",
            Limits {
                rpm: Some(1_000_000),
                tpm: Some(1_000_000),
                budget_micros: Some(1_000_000_000),
                period: Some(Period::Day),
                models: None,
            },
        )
        .await;
        let engine = quick_engine().await;
        let config = GatewayConfig {
            endpoints: vec![spec("a", &engine, &["m"])],
            default_price: Price {
                prompt_per_1k: 1_000,
                completion_per_1k: 2_000,
            },
            ..GatewayConfig::default()
        };
        let limits = ConnectionLimits {
            // A body shorter than its headers promise waits this long.
            body_timeout: Duration::from_secs(2),
            ..ConnectionLimits::default()
        };
        let keyed = Gateway::with_keys(config.clone(), None, Some(t.directory())).unwrap();
        let keyed = support::serve_limited(keyed, limits).await;
        let open = support::serve_limited(Gateway::new(config, None).unwrap(), limits).await;
        let addr = |r: &support::Running| r.base.trim_start_matches("http://").to_owned();
        (addr(&keyed), addr(&open), t, keyed)
    });
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        max_shrink_iters: 200,
        ..Config::default()
    });
    // Each request to both: keys on (a key with rates and a budget) and
    // keys off.
    runner
        .run(&raw(), |r| {
            check(&r, rt.block_on(send(&keyed, &r)))?;
            check(&r, rt.block_on(send(&open, &r)))
        })
        .unwrap();

    // Still serving, the key still works.
    rt.block_on(async {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", gw.base))
            .bearer_auth("llmgw-sk-k1-0123456789")
            .json(&json!({"model": "m", "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{:?}", r.text().await);
    });
}

/// The numbers most likely to overflow an estimate, each in each field
/// that carries one, with a prompt: answered, never a dropped connection.
#[tokio::test]
async fn giant_and_negative_token_counts_are_answered() {
    let engine = quick_engine().await;
    let gw = support::gateway(vec![spec("a", &engine, &["m"])]).await;
    let addr = gw.base.trim_start_matches("http://");
    for field in ["max_tokens", "max_completion_tokens"] {
        for n in [
            json!(u64::MAX),
            json!(u64::MAX - 1),
            json!(i64::MAX),
            json!(-1),
            json!(1e300),
        ] {
            for stream in [false, true] {
                let body = json!({"model": "m", "stream": stream, field: n,
                    "messages": [{"role": "user", "content": "tell me a story"}]});
                let r = Raw {
                    method: "POST".into(),
                    path: "/v1/chat/completions".into(),
                    headers: vec![],
                    body: serde_json::to_vec(&body).unwrap(),
                };
                let answer = send(addr, &r).await;
                check(&r, answer.clone()).unwrap_or_else(|e| panic!("{body}: {e}"));
                let (status, text) = answer.unwrap();
                assert!(matches!(status, 200 | 400), "{body}: {status} {text}");
            }
        }
    }
}
