//! Connections that stall or idle, and more of them than a listener takes.
//! The gateway is in-process on paused time: the clock moves only when
//! every task waits, so "nothing happened for 30 s" is a fact of the run,
//! not a guess, and a timeout fires at its exact second.

use std::time::Duration;

use llmgw_gateway::{ConnectionLimits, Gateway, GatewayConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::support::{Running, serve_limited, sim, spec};

async fn gateway(limits: ConnectionLimits) -> Running {
    serve_limited(
        Gateway::new(GatewayConfig::default(), None).unwrap(),
        limits,
    )
    .await
}

fn addr(base: &str) -> &str {
    base.trim_start_matches("http://")
}

/// Everything the server sends until it closes the connection.
async fn until_closed(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One answer with a Content-Length, read off a kept-alive connection.
async fn answer(s: &mut TcpStream) -> (u16, String) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed before an answer: {:?}",
            String::from_utf8_lossy(&out)
        );
        out.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&out).into_owned();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let length: usize = text[..end]
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        if out.len() >= end + 4 + length {
            let status = text[9..12].parse().unwrap();
            return (status, text[end + 4..].to_owned());
        }
    }
}

async fn get(s: &mut TcpStream, path: &str) -> (u16, String) {
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    answer(s).await
}

/// One series' value from the admin listener's page.
async fn series(gw: &Running, name: &str) -> f64 {
    let mut s = TcpStream::connect(addr(&gw.admin)).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let page = until_closed(&mut s).await;
    page.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in\n{page}"))
}

#[tokio::test(start_paused = true)]
async fn a_body_that_stalls_is_answered_408_at_the_body_timeout() {
    let gw = gateway(ConnectionLimits {
        body_timeout: Duration::from_secs(5),
        ..ConnectionLimits::default()
    })
    .await;
    let heads: [&[u8]; 2] = [
        // Promises 100 bytes, sends 9.
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":",
        // A chunked body that stops after its first chunk.
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ntransfer-encoding: chunked\r\n\r\n9\r\n{\"model\":\r\n",
    ];
    for head in heads {
        let mut s = TcpStream::connect(addr(&gw.base)).await.unwrap();
        s.write_all(head).await.unwrap();
        let sent = Instant::now();
        let answer = until_closed(&mut s).await;
        let waited = sent.elapsed();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
        assert!(
            waited >= Duration::from_secs(5) && waited < Duration::from_secs(6),
            "answered after {waited:?}"
        );
    }
    // A body that arrives whole in time is read as ever.
    let mut s = TcpStream::connect(addr(&gw.base)).await.unwrap();
    let body = br#"{"messages": []}"#;
    s.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    s.write_all(body).await.unwrap();
    let (status, text) = answer(&mut s).await;
    assert_eq!(status, 400, "the missing model, not the clock: {text}");
    assert!(text.contains("missing field `model`"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn headers_that_never_finish_and_an_idle_connection_are_closed_at_the_idle_timeout() {
    let gw = gateway(ConnectionLimits {
        idle_timeout: Duration::from_secs(10),
        ..ConnectionLimits::default()
    })
    .await;
    // Slowloris: a request line and a header, and then nothing.
    let mut s = TcpStream::connect(addr(&gw.base)).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let sent = Instant::now();
    let answer = until_closed(&mut s).await;
    assert_eq!(answer, "", "closed without an answer");
    assert!(
        sent.elapsed() >= Duration::from_secs(10) && sent.elapsed() < Duration::from_secs(11),
        "closed after {:?}",
        sent.elapsed()
    );

    // Kept alive: served, then closed once idle for the timeout.
    let mut s = TcpStream::connect(addr(&gw.base)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(get(&mut s, "/health").await, (200, "ok".into()));
    let answered = Instant::now();
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(
        get(&mut s, "/health").await,
        (200, "ok".into()),
        "each request starts the idle clock again"
    );
    let answered_again = Instant::now();
    assert_eq!(until_closed(&mut s).await, "");
    assert!(answered_again - answered >= Duration::from_secs(9));
    let idle = answered_again.elapsed();
    assert!(
        idle >= Duration::from_secs(10) && idle < Duration::from_secs(11),
        "closed after {idle:?} idle"
    );
}

#[tokio::test(start_paused = true)]
async fn connections_beyond_the_cap_wait_until_one_closes() {
    let gw = gateway(ConnectionLimits {
        max_client: 2,
        ..ConnectionLimits::default()
    })
    .await;
    let mut a = TcpStream::connect(addr(&gw.base)).await.unwrap();
    let mut b = TcpStream::connect(addr(&gw.base)).await.unwrap();
    assert_eq!(get(&mut a, "/health").await.0, 200);
    assert_eq!(get(&mut b, "/health").await.0, 200);
    assert_eq!(
        series(&gw, "llmgw_connections{listener=\"client\"}").await,
        2.0
    );
    assert_eq!(
        series(&gw, "llmgw_connections_max{listener=\"client\"}").await,
        2.0
    );

    // A third connects (the system queues it) but is not served while
    // both are open, however long it waits (short of the idle timeout).
    let mut c = TcpStream::connect(addr(&gw.base)).await.unwrap();
    c.write_all(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 1];
    let waited = tokio::time::timeout(Duration::from_secs(30), c.read(&mut first)).await;
    assert!(waited.is_err(), "answered beyond the cap: {waited:?}");
    assert!(
        series(&gw, "llmgw_connections_full_total{listener=\"client\"}").await >= 1.0,
        "the cap is counted"
    );
    // The other listeners have caps of their own: the admin page answered.

    // One closes: the waiting connection is taken and served.
    drop(a);
    // (The read that timed out was dropped before it took anything.)
    assert_eq!(answer(&mut c).await, (200, "ok".into()));
    assert_eq!(
        series(&gw, "llmgw_connections{listener=\"client\"}").await,
        2.0
    );
    drop(b);
}

/// The idle clock runs only while no request is in progress: a slow
/// first token and a long stream are answered whole. (Real time: the
/// engine is a sim over a real socket.)
#[tokio::test]
async fn a_request_in_progress_is_never_cut_by_the_idle_timeout() {
    let engine = sim(llmgw_sim::SimConfig {
        ttft: Duration::from_millis(600),
        tokens_per_s: 10,
        ..crate::support::sim_config()
    })
    .await;
    let gw = serve_limited(
        Gateway::new(
            GatewayConfig {
                endpoints: vec![spec("a", &engine, &["m"])],
                ..GatewayConfig::default()
            },
            None,
        )
        .unwrap(),
        ConnectionLimits {
            idle_timeout: Duration::from_millis(200),
            ..ConnectionLimits::default()
        },
    )
    .await;
    let client = reqwest::Client::new();
    let text = client
        .post(format!("{}/v1/chat/completions", gw.base))
        .json(
            &serde_json::json!({"model": "m", "stream": true, "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
}
