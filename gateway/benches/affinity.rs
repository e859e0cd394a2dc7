//! Prefix-aware routing against plain least-loaded routing, with sim
//! engines whose prefix caches are too small for the working set.
//!
//! Run: `cargo bench -p llmgw-gateway --bench affinity` (add `-- --peers`
//! to run SGLang Model Gateway's `cache_aware` policy too, installed into
//! a venv as the proxy bench does; `--clients N` for other than 8
//! concurrent clients).
//!
//! Four engines, each caching 200 blocks of 64 bytes (12.8 KB); a cache
//! miss costs prefill at 2,000 tokens/s. Two workloads, 8 concurrent
//! clients unless told:
//! - documents: 16 documents of 2 KB asked about in a fixed pseudo-random
//!   order, 15 requests a document (32 KB of prefixes: more than one
//!   engine holds, less than four do); `--documents N` for N documents
//!   (24 or more put the caches under pressure: 48 KB and up, against
//!   51.2 KB in all four), `--only documents|chat` for one workload;
//! - chat: a shared 1.5 KB system prompt and 48 users' conversations
//!   growing by a question and an answer a turn, six turns each, the
//!   users' turns interleaved (~100 KB of conversations: most are evicted
//!   before their next turn).
//!
//! Each router runs on fresh engines, in the same run: least loaded (no
//! affinity), the approximate index (where prompts were sent), the exact
//! index (the engines' KV-cache events), and SGLang's `cache_aware`. For
//! llmgw's, the gateway's decisions are printed too (why each request
//! went where it did).

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark program; a failure should stop it loudly"
)]

#[allow(
    dead_code,
    reason = "the proxy bench's peers: only SGLang Model Gateway runs here"
)]
#[path = "proxy/peers.rs"]
mod peers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use llmgw_gateway::affinity::AffinityConfig;
use llmgw_gateway::{Gateway, GatewayConfig, Listener};
use llmgw_sim::{KvEventsConfig, SimConfig};
use serde_json::{Value, json};

const ENGINES: usize = 4;
const CLIENTS: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// This many documents, each asked about 15 times.
    Documents(u64),
    Chat,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Router {
    LeastLoaded,
    Approximate,
    Exact,
    Sglang,
}

impl Router {
    fn name(self) -> &'static str {
        match self {
            Router::LeastLoaded => "least loaded",
            Router::Approximate => "approximate index",
            Router::Exact => "exact (KV events)",
            Router::Sglang => "SGLang cache_aware",
        }
    }
}

struct Engine {
    http: SocketAddr,
    kv: Option<(SocketAddr, SocketAddr)>,
}

async fn engine(events: bool) -> Engine {
    let config = SimConfig {
        models: vec!["m".into()],
        ttft: Duration::from_millis(5),
        prefill_tokens_per_s: 2000,
        tokens_per_s: 1000,
        slots: 16,
        kv_blocks: 200,
        block_bytes: 64,
        kv_events: events.then(|| KvEventsConfig {
            publish: "127.0.0.1:0".parse().unwrap(),
            replay: Some("127.0.0.1:0".parse().unwrap()),
            buffer: 10_000,
        }),
        ..SimConfig::default()
    };
    let e = llmgw_sim::spawn(config).await.unwrap();
    Engine {
        http: e.http,
        kv: e.kv_events.zip(e.kv_replay),
    }
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

/// Prefix-cache hits and queries over every engine, and the requests
/// each engine served (one token generated a request).
async fn cache_counts(engines: &[Engine]) -> (f64, f64, Vec<f64>) {
    let (mut hits, mut queries, mut served) = (0.0, 0.0, Vec::new());
    for e in engines {
        hits += metric(e.http, "vllm:prefix_cache_hits_total").await;
        queries += metric(e.http, "vllm:prefix_cache_queries_total").await;
        served.push(metric(e.http, "vllm:generation_tokens_total").await);
    }
    (hits, queries, served)
}

fn document(d: u64) -> String {
    // 2 KB that differ from the first byte, so documents share no prefix.
    format!("document {d:02}: ") + &format!("lorem ipsum {d} dolor sit amet ").repeat(100)[..2000]
}

const USERS: usize = 48;
const TURNS: usize = 6;

fn system_prompt() -> String {
    "You are the support assistant of a hardware shop: answer briefly, cite the manual, never guess prices. "
        .repeat(16)[..1536]
        .to_owned()
}

fn question(u: usize, t: usize) -> String {
    format!("user {u} turn {t}: ")
        + &format!("how do I fix the {u}-{t} widget when it rattles? ").repeat(3)
}

fn answer(u: usize, t: usize) -> String {
    format!("answer {u}.{t}: ")
        + &format!("loosen screw {t}, check part {u}, tighten it again and restart. ").repeat(4)
}

/// The requests of a workload, in the order they are sent.
fn requests(w: Workload) -> Vec<Value> {
    match w {
        Workload::Documents(n) => (0..15 * n)
            .map(|i| {
                // A fixed pseudo-random document per request, drawn
                // independently each time (splitmix64's mixer): a
                // multiplicative step sweeps the documents in near order,
                // a recency cache's worst case, once they do not all fit.
                let mut z = i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                let d = (z ^ (z >> 31)) % n;
                json!({"model": "m", "stream": true, "max_tokens": 1, "messages": [
                    {"role": "system", "content": document(d)},
                    {"role": "user", "content": format!("question {i}")}]})
            })
            .collect(),
        Workload::Chat => {
            let system = system_prompt();
            (0..USERS * TURNS)
                .map(|i| {
                    // Turn t of every user before turn t+1 of any, the
                    // users in a shuffled order each round.
                    let (t, p) = (i / USERS, i % USERS);
                    let u = (p * 29 + t * 7) % USERS;
                    let mut messages = vec![json!({"role": "system", "content": system})];
                    for k in 0..t {
                        messages.push(json!({"role": "user", "content": question(u, k)}));
                        messages.push(json!({"role": "assistant", "content": answer(u, k)}));
                    }
                    messages.push(json!({"role": "user", "content": question(u, t)}));
                    // No `user` or session header: routing goes by the prefix.
                    json!({"model": "m", "stream": true, "max_tokens": 1, "messages": messages})
                })
                .collect()
        }
    }
}

/// Sends `bodies` from `clients` clients; the TTFTs and the seconds taken.
async fn drive(url: &str, bodies: Arc<Vec<Value>>, clients: usize) -> (Vec<Duration>, f64) {
    let next = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::new();
    let start = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (next, client, url, bodies) =
                (next.clone(), client.clone(), url.to_owned(), bodies.clone());
            tokio::spawn(async move {
                let mut ttfts = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else {
                        return ttfts;
                    };
                    let t = Instant::now();
                    let resp = client.post(&url).json(body).send().await.unwrap();
                    assert!(resp.status().is_success(), "{}", resp.status());
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
    (ttfts, start.elapsed().as_secs_f64())
}

struct Figures {
    hit: f64,
    p50: f64,
    rate: f64,
    /// Requests each engine served: a router that starves engines shows.
    spread: String,
    /// Why llmgw chose as it did (its decisions' counts); empty for SGLang.
    decisions: String,
}

/// A gateway over `engines`; None for SGLang when it is not installed.
async fn router_url(
    r: Router,
    engines: &[Engine],
) -> Option<(String, Option<peers::Peer>, Option<Arc<Gateway>>)> {
    if r == Router::Sglang {
        let workers: Vec<SocketAddr> = engines.iter().map(|e| e.http).collect();
        let probe = json!({"model": "m", "max_tokens": 1,
            "messages": [{"role": "user", "content": "ready?"}]})
        .to_string();
        let peer = peers::start_policy(
            &peers::venv(),
            "sglang-router",
            &workers,
            "cache_aware",
            &reqwest::Client::new(),
            &probe,
        )
        .await?;
        return Some((peer.url.clone(), Some(peer), None));
    }
    let endpoints = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut spec = format!("e{i}=http://{}=m", e.http);
            if let (Router::Exact, Some((publish, replay))) = (r, e.kv) {
                spec +=
                    &format!(";kv_events=tcp://{publish};kv_replay=tcp://{replay};tokenizer=sim");
            }
            spec.parse().unwrap()
        })
        .collect();
    let gw = Gateway::new(
        GatewayConfig {
            endpoints,
            affinity: AffinityConfig {
                enabled: r != Router::LeastLoaded,
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
    tokio::spawn(llmgw_gateway::serve(gw.clone(), any, any, None, move |l| {
        if let (Listener::Client(a), Some(tx)) = (l, tx.take()) {
            let _ = tx.send(a);
        }
    }));
    let url = format!("http://{}/v1/chat/completions", rx.await.unwrap());
    if r == Router::Exact {
        for i in 0..engines.len() {
            let mut st = gw.kv_events.state(&format!("e{i}")).unwrap();
            st.wait_for(|s| s.live).await.unwrap();
        }
    }
    Some((url, None, Some(gw)))
}

async fn run(w: Workload, r: Router, clients: usize) -> Option<Figures> {
    let mut engines = Vec::new();
    for _ in 0..ENGINES {
        engines.push(engine(r == Router::Exact).await);
    }
    let (url, _peer, gw) = router_url(r, &engines).await?;
    let (hits0, queries0, served0) = cache_counts(&engines).await;
    let (mut ttfts, secs) = drive(&url, Arc::new(requests(w)), clients).await;
    let (hits, queries, served) = cache_counts(&engines).await;
    let decisions = gw.as_ref().map_or_else(String::new, |gw| {
        let prefix = "llmgw_prefix_decisions_total{decision=\"";
        let mut counts: Vec<String> = gw
            .metrics
            .render()
            .lines()
            .filter_map(|l| {
                let (name, n) = l.strip_prefix(prefix)?.split_once("\"} ")?;
                Some(format!("{name} {n}"))
            })
            .collect();
        counts.sort();
        counts.join(", ")
    });
    if r == Router::Exact
        && let Some(gw) = gw
    {
        // Whether the subscriptions held: a reset or an endpoint not live
        // means the approximate index routed for it part of the run.
        let states = gw.kv_events.states();
        let resets: u64 = states.iter().map(|(_, s)| s.resets).sum();
        let unchained: u64 = states.iter().map(|(_, s)| s.unchained).sum();
        let live = states.iter().filter(|(_, s)| s.live).count();
        println!(
            "  (KV events: {live} of {} subscriptions live at the end, {resets} resets, {unchained} unchained blocks)",
            states.len()
        );
    }
    ttfts.sort();
    Some(Figures {
        hit: 100.0 * (hits - hits0) / (queries - queries0).max(1.0),
        p50: ttfts[ttfts.len() / 2].as_secs_f64() * 1e3,
        rate: ttfts.len() as f64 / secs,
        spread: served
            .iter()
            .zip(&served0)
            .map(|(n, n0)| format!("{}", n - n0))
            .collect::<Vec<_>>()
            .join("/"),
        decisions,
    })
}

/// The number after `flag`, 1 or more, or `default` without the flag.
fn count(args: &[String], flag: &str, default: u64) -> u64 {
    match args.iter().position(|a| a == flag) {
        Some(i) => args
            .get(i + 1)
            .and_then(|n| n.parse().ok())
            .filter(|&n: &u64| n > 0)
            .unwrap_or_else(|| panic!("{flag} takes a number, 1 or more")),
        None => default,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let with_peers = args.iter().any(|a| a == "--peers");
    let clients = count(&args, "--clients", CLIENTS as u64) as usize;
    let documents = count(&args, "--documents", 16);
    let only = args
        .iter()
        .position(|a| a == "--only")
        .map(|i| args.get(i + 1).map_or("", String::as_str));
    if let Some(o) = only {
        assert!(
            o == "documents" || o == "chat",
            "--only takes documents or chat"
        );
    }
    if with_peers && let Err(e) = peers::install(&peers::venv()) {
        eprintln!("SGLang Model Gateway left out: {e}");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for (w, what) in [
            (
                Workload::Documents(documents),
                format!(
                    "documents: {documents} documents of 2 KB, {} requests",
                    15 * documents
                ),
            ),
            (
                Workload::Chat,
                "chat: a 1.5 KB system prompt, 48 users x 6 turns, 288 requests".into(),
            ),
        ] {
            let name = if w == Workload::Chat { "chat" } else { "documents" };
            if only.is_some_and(|o| o != name) {
                continue;
            }
            println!("{what}, {clients} clients, {ENGINES} engines of 200 blocks");
            let mut routers = vec![Router::LeastLoaded, Router::Approximate, Router::Exact];
            if with_peers {
                routers.push(Router::Sglang);
            }
            let mut figures = Vec::new();
            for r in routers {
                let Some(f) = run(w, r, clients).await else {
                    println!("  {:<20} not run", r.name());
                    continue;
                };
                println!(
                    "  {:<20} prefix-cache hit rate {:5.1}%   TTFT p50 {:6.1} ms   {:5.1} req/s   per engine {}",
                    r.name(),
                    f.hit,
                    f.p50,
                    f.rate,
                    f.spread
                );
                if r != Router::LeastLoaded && !f.decisions.is_empty() {
                    println!("  {:<20} decisions: {}", "", f.decisions);
                }
                figures.push((r, f));
            }
            let get = |r| figures.iter().find(|(x, _)| *x == r).map(|(_, f)| f);
            // The exact index against the others, and the approximate
            // index (what an engine without events gets) against SGLang.
            for (ours, other) in [
                (Router::Exact, Router::LeastLoaded),
                (Router::Exact, Router::Approximate),
                (Router::Exact, Router::Sglang),
                (Router::Approximate, Router::Sglang),
            ] {
                if let (Some(a), Some(o)) = (get(ours), get(other)) {
                    println!(
                        "  {} vs {:<18} hit rate {:+5.1} points, TTFT p50 {:.2}x, throughput {:.2}x",
                        if ours == Router::Exact { "exact" } else { "approximate" },
                        other.name(),
                        a.hit - o.hit,
                        a.p50 / o.p50,
                        a.rate / o.rate
                    );
                }
            }
        }
    });
}

/// The shipped binary's allocator (cli/src/main.rs), so that the figures are its.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
