//! Prefix affinity against plain least-loaded routing, with sim engines
//! whose prefix caches are too small for the working set.
//!
//! Run: `cargo bench -p llmgw-gateway --bench affinity`.
//! Four engines, each caching 200 blocks of 64 bytes (12.8 KB); 16
//! documents of 2 KB asked about in a fixed pseudo-random order by 8
//! concurrent clients (32 KB of prefixes: more than one engine holds, less
//! than four do). A cache miss costs prefill at 2,000 tokens/s. Both
//! configurations run on fresh engines in the same run.

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark program; a failure should stop it loudly"
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use llmgw_gateway::affinity::AffinityConfig;
use llmgw_gateway::{Gateway, GatewayConfig, Listener};
use llmgw_sim::{Bound, SimConfig};
use serde_json::json;

const ENGINES: usize = 4;
const DOCS: u64 = 16;
const REQUESTS: u64 = 240;
const CLIENTS: usize = 8;

async fn engine() -> SocketAddr {
    let config = SimConfig {
        models: vec!["m".into()],
        ttft: Duration::from_millis(5),
        prefill_tokens_per_s: 2000,
        tokens_per_s: 1000,
        slots: 16,
        kv_blocks: 200,
        block_bytes: 64,
        ..SimConfig::default()
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut tx = Some(tx);
    tokio::spawn(llmgw_sim::run(
        config,
        "127.0.0.1:0".parse().unwrap(),
        None,
        move |b| {
            if let (Bound::Http(a), Some(tx)) = (b, tx.take()) {
                let _ = tx.send(a);
            }
        },
    ));
    rx.await.unwrap()
}

async fn metric(engine: SocketAddr, name: &str) -> f64 {
    let page = reqwest::get(format!("http://{engine}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    page.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn document(d: u64) -> String {
    // 2 KB that differ from the first byte, so documents share no prefix.
    format!("document {d:02}: ") + &format!("lorem ipsum {d} dolor sit amet ").repeat(100)[..2000]
}

async fn run(affinity: bool) -> (f64, f64, f64) {
    let mut engines = Vec::new();
    for _ in 0..ENGINES {
        engines.push(engine().await);
    }
    let endpoints = engines
        .iter()
        .enumerate()
        .map(|(i, a)| format!("e{i}=http://{a}=m").parse().unwrap())
        .collect();
    let gw = Gateway::new(
        GatewayConfig {
            endpoints,
            affinity: AffinityConfig {
                enabled: affinity,
                ..AffinityConfig::default()
            },
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
    let url = format!("http://{}/v1/chat/completions", rx.await.unwrap());
    let next = Arc::new(AtomicU64::new(0));
    let client = reqwest::Client::new();
    let start = Instant::now();
    let workers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (next, client, url) = (next.clone(), client.clone(), url.clone());
            tokio::spawn(async move {
                let mut ttfts = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= REQUESTS {
                        return ttfts;
                    }
                    // A fixed pseudo-random document per request.
                    let d = (i.wrapping_mul(2_654_435_761) >> 7) % DOCS;
                    let body = json!({"model": "m", "stream": true, "max_tokens": 1, "messages": [
                        {"role": "system", "content": document(d)},
                        {"role": "user", "content": format!("question {i}")}]});
                    let t = Instant::now();
                    let resp = client.post(&url).json(&body).send().await.unwrap();
                    let mut s = resp.bytes_stream();
                    s.next().await;
                    ttfts.push(t.elapsed());
                    while s.next().await.is_some() {}
                }
            })
        })
        .collect();
    let mut ttfts = Vec::new();
    for w in workers {
        ttfts.extend(w.await.unwrap());
    }
    let secs = start.elapsed().as_secs_f64();
    let (mut hits, mut queries) = (0.0, 0.0);
    for e in &engines {
        hits += metric(*e, "vllm:prefix_cache_hits_total").await;
        queries += metric(*e, "vllm:prefix_cache_queries_total").await;
    }
    ttfts.sort();
    let p50 = ttfts[ttfts.len() / 2].as_secs_f64() * 1e3;
    (100.0 * hits / queries.max(1.0), p50, REQUESTS as f64 / secs)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (base_hit, base_ttft, base_rate) = run(false).await;
        let (hit, ttft, rate) = run(true).await;
        println!("least loaded:    prefix-cache hit rate {base_hit:5.1}%   TTFT p50 {base_ttft:6.1} ms   {base_rate:5.1} req/s");
        println!("prefix affinity: prefix-cache hit rate {hit:5.1}%   TTFT p50 {ttft:6.1} ms   {rate:5.1} req/s");
        println!("ratio: TTFT p50 {:.2}x of least loaded, throughput {:.2}x", ttft / base_ttft, rate / base_rate);
    });
}
