//! What the gateway adds on the way to an engine, printed as figures.
//!
//! Run: `cargo bench -p llmgw-gateway --bench proxy`.
//! Upstream: a constant-response OpenAI-shaped server on loopback (no
//! generation delay), so every microsecond measured is transport and proxy.
//! Baseline: the same client going direct to it, in the same run.

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark program; a failure should stop it loudly"
)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use futures_util::StreamExt;
use llmgw_gateway::{Gateway, GatewayConfig, Listener};
use serde_json::json;

const REPLY: &str = r#"{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;

async fn upstream() -> SocketAddr {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(|body: axum::body::Bytes| async move {
            let streaming = body.windows(13).any(|w| w == b"\"stream\":true");
            if streaming {
                let events = [
                    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hel\"}}]}",
                    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}",
                    "{\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2}}",
                ];
                let mut text = String::new();
                for e in events {
                    text.push_str(&format!("data: {e}\n\n"));
                }
                text.push_str("data: [DONE]\n\n");
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from(text))
                    .unwrap()
            } else {
                Response::builder()
                    .header("content-type", "application/json")
                    .body(Body::from(REPLY))
                    .unwrap()
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

async fn gateway(up: SocketAddr) -> SocketAddr {
    let gw = Gateway::new(
        GatewayConfig {
            endpoints: vec![format!("u=http://{up}=m").parse().unwrap()],
            ..GatewayConfig::default()
        },
        None,
    )
    .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut tx = Some(tx);
    let any = "127.0.0.1:0".parse().unwrap();
    tokio::spawn(llmgw_gateway::serve(gw, any, any, None, move |l| {
        if let (Listener::Client(a), Some(tx)) = (l, tx.take()) {
            let _ = tx.send(a);
        }
    }));
    rx.await.unwrap()
}

fn body(stream: bool) -> String {
    json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "say hello to the benchmark"}]}).to_string()
}

async fn one(client: &reqwest::Client, url: &str, stream: bool) -> Duration {
    let t = Instant::now();
    let resp = client
        .post(url)
        .header("content-type", "application/json")
        .body(body(stream))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    if stream {
        // Time to the first byte of the body.
        let mut s = resp.bytes_stream();
        let first = s.next().await;
        let elapsed = t.elapsed();
        assert!(first.is_some());
        while s.next().await.is_some() {}
        elapsed
    } else {
        resp.bytes().await.unwrap();
        t.elapsed()
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1].as_secs_f64() * 1e3
}

/// Open loop: requests start at a fixed rate whatever the answers do.
async fn fixed_rate(client: &reqwest::Client, url: &str, rate: u64, seconds: u64) -> Vec<Duration> {
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::new();
    for _ in 0..rate * seconds {
        tick.tick().await;
        let (c, u) = (client.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move { one(&c, &u, false).await }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Closed loop: `workers` clients back to back for `seconds`.
async fn saturate(
    client: &reqwest::Client,
    url: &str,
    workers: usize,
    seconds: u64,
    stream: bool,
) -> (f64, Vec<Duration>) {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (c, u) = (client.clone(), url.to_owned());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    lat.push(one(&c, &u, stream).await);
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (all.len() as f64 / start.elapsed().as_secs_f64(), all)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let up = upstream().await;
        let gw = gateway(up).await;
        let direct = format!("http://{up}/v1/chat/completions");
        let via = format!("http://{gw}/v1/chat/completions");
        let client = reqwest::Client::builder().pool_max_idle_per_host(256).tcp_nodelay(true).build().unwrap();
        // Warm the connection pools.
        saturate(&client, &direct, 8, 1, false).await;
        saturate(&client, &via, 8, 1, false).await;

        for rate in [1000u64, 5000] {
            let mut d = fixed_rate(&client, &direct, rate, 3).await;
            let mut g = fixed_rate(&client, &via, rate, 3).await;
            let (d50, d99, g50, g99) = (pct(&mut d, 0.5), pct(&mut d, 0.99), pct(&mut g, 0.5), pct(&mut g, 0.99));
            println!(
                "fixed {rate:>4} req/s   direct p50 {d50:.3} ms p99 {d99:.3} ms   via gateway p50 {g50:.3} ms p99 {g99:.3} ms   added p50 {:.3} ms p99 {:.3} ms",
                g50 - d50,
                g99 - d99
            );
        }
        for (stream, label) in [(false, "plain"), (true, "streaming (time to first byte)")] {
            let (d_rate, mut d) = saturate(&client, &direct, 32, 3, stream).await;
            let (g_rate, mut g) = saturate(&client, &via, 32, 3, stream).await;
            println!(
                "saturated, 32 clients, {label}: direct {d_rate:.0} req/s (p50 {:.3} ms), via gateway {g_rate:.0} req/s (p50 {:.3} ms): {:.0}% of direct",
                pct(&mut d, 0.5),
                pct(&mut g, 0.5),
                100.0 * g_rate / d_rate
            );
        }
    });
}
