//! What the gateway adds on the way to an engine, printed as figures.
//!
//! Run: `cargo bench -p llmgw-gateway --bench proxy`.
//! Upstream: a constant-response OpenAI-shaped server on loopback (no
//! generation delay), so every microsecond measured is transport and proxy.
//! Baseline: the same client going direct to it, in the same run.
//!
//! `-- --peers`: first, side by side with SGLang Model Gateway and
//! vllm-router (installed into a venv, see [`peers`]), llmgw with auth,
//! limits and usage on, and a bare TCP relay (the floor of what a router
//! in its own process adds); the ratios printed in one table. The peers
//! are processes of their own, so for that table llmgw is too: this
//! program run as `--serve UPSTREAM` (its gateways, store, views, batcher
//! and the relay), so that no router shares the client's threads and none
//! gets more of the machine's scheduler than another. With `--binary
//! PATH`, llmgw as shipped takes the row of llmgw with auth, limits and
//! usage (its own build, as the peers are theirs).
//! `-- --profile SECONDS`: only the `--serve` process, saturated with
//! auth, limits and usage for that long (with `--off` too, the all-off
//! gateway instead; with `--keys`, auth and limits without usage); its
//! pid is printed, for `perf record -g -p PID`, and then its CPU a
//! request and its memory. With `--rate R` too, an open loop at R req/s
//! instead, in one-second slots direct, through the bare relay and
//! through llmgw in turn: what a request adds at low load, and where its
//! time goes (its CPU, and how often its threads slept and were woken, a
//! request). With `--binary PATH` too, llmgw as shipped instead: `PATH
//! server`, keys on, set up with `PATH keys` ([`shipped`]).
//! `-- --logged`: the `--serve` process logs as the binary does (info, or
//! what RUST_LOG says; one access line a request) to a pipe this program
//! drains, as a journal would; without it, it logs nothing, like a
//! binary run with `RUST_LOG=warn`. With `LLMGW_LOG_FORMAT=json` set, the
//! lines are JSON, as the binary writes them then.
//! `-- --lines`: only what one access line costs to format ([`lines`]).
//! `-- --key-lookups`: only what finding a request's key costs, from the
//! key cache and composed again ([`key_lookups`]).
//! `-- --answers`: only what reading a plain answer's usage costs, against
//! parsing it ([`answers`]).

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

#[path = "proxy/answers.rs"]
mod answers;
#[path = "proxy/key_lookups.rs"]
mod key_lookups;
#[path = "proxy/lines.rs"]
mod lines;
#[path = "proxy/peers.rs"]
mod peers;
#[path = "proxy/shipped.rs"]
mod shipped;

/// The benchmark's one key (ignored where auth is off).
const SECRET: &str = "llmgw-sk-bench-0123456789abcdef";

/// The key requests present: [`SECRET`], or the one `--binary`'s server
/// issued.
static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn key() -> &'static str {
    KEY.get().map_or(SECRET, String::as_str)
}

const REPLY: &str = r#"{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;

async fn upstream() -> SocketAddr {
    // The peers ask for /health, /server_info and /model_info at start.
    let info = || async {
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(r#"{"model_path":"m","is_generation":true}"#))
            .unwrap()
    };
    let app = Router::new().fallback(info).route(
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
    let gw = Gateway::new(config(up), None).unwrap();
    listen(gw).await
}

fn config(up: SocketAddr) -> GatewayConfig {
    GatewayConfig {
        endpoints: vec![format!("u=http://{up}=m").parse().unwrap()],
        // Every request is priced, so the budget check has work to do.
        default_price: llmgw_domain::catalog::Price {
            prompt_per_1k: 1,
            completion_per_1k: 1,
        },
        ..GatewayConfig::default()
    }
}

/// What a gateway with keys, limits and usage recording needs: a store
/// (SQLite, on disk), a key under org → team → project with rpm, tpm and a
/// budget at every level, the views following the store, and the batcher.
struct Tenancy {
    store: llmgw_eventstore::AnyStore,
    queue: std::sync::Arc<llmgw_gateway::usage::UsageQueue>,
    views: std::sync::Arc<std::sync::RwLock<llmgw_projections::Projections>>,
    _dir: tempfile::TempDir,
}

async fn tenancy() -> (Tenancy, llmgw_gateway::usage::UsageReceiver) {
    use llmgw_domain::Command;
    use llmgw_domain::tenancy::{Band, Key, Limits, Period, Scope, TenancyCommand as T};
    let dir = tempfile::tempdir().unwrap();
    let address = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store = llmgw_eventstore::AnyStore::open(
        &llmgw_eventstore::StoreAddress::parse(&address).unwrap(),
        llmgw_eventstore::OpenOptions::migrating(),
    )
    .await
    .unwrap();
    let secret = SECRET;
    // Generous limits: checked on every request, never refusing one.
    let limits = Limits {
        rpm: Some(100_000_000),
        tpm: Some(2_000_000_000),
        budget_micros: Some(u64::MAX / 4),
        period: Some(Period::Month),
        models: Some(vec!["m".into()]),
    };
    let mut commands = vec![
        T::CreateOrg {
            org_id: "o".into(),
            name: "o".into(),
        },
        T::CreateTeam {
            team_id: "t".into(),
            org_id: "o".into(),
            name: "t".into(),
        },
        T::CreateProject {
            project_id: "p".into(),
            team_id: "t".into(),
            name: "p".into(),
        },
        T::IssueKey(Key {
            key_id: "k".into(),
            project_id: "p".into(),
            name: "bench".into(),
            hash: llmgw_gateway::auth::key_hash(secret),
            prefix: secret[..12].into(),
            band: Band::Gold,
            routing_profile: None,
            revoked: false,
            owner: None,
            claim_by: None,
            expires_at: None,
            previous: None,
        }),
    ];
    for (scope, id) in [
        (Scope::Org, "o"),
        (Scope::Team, "t"),
        (Scope::Project, "p"),
        (Scope::Key, "k"),
    ] {
        commands.push(T::SetLimits {
            scope,
            scope_id: id.into(),
            limits: limits.clone(),
        });
    }
    let origin = llmgw_decider::Origin::new(llmgw_decider::Actor::Recorder("bench".into()));
    llmgw_decider::offline::execute(
        &store,
        &origin,
        commands.into_iter().map(Command::Tenancy).collect(),
    )
    .await
    .unwrap();
    let mut runner = llmgw_projections::Runner::start(store.clone(), "bench")
        .await
        .unwrap();
    let views = runner.views();
    tokio::spawn(async move { runner.follow().await });
    let (queue, rx) = llmgw_gateway::usage::UsageQueue::new(8192);
    (
        Tenancy {
            store,
            queue,
            views,
            _dir: dir,
        },
        rx,
    )
}

async fn listen(gw: std::sync::Arc<Gateway>) -> SocketAddr {
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

/// The same question on OpenAI's Responses API.
fn responses_body(stream: bool) -> String {
    json!({"model": "m", "stream": stream, "input": "say hello to the benchmark"}).to_string()
}

async fn one(client: &reqwest::Client, url: &str, stream: bool) -> Duration {
    one_since(client, url, stream, Instant::now()).await
}

/// A request's time counted from `t`, when it was due.
async fn one_since(client: &reqwest::Client, url: &str, stream: bool, t: Instant) -> Duration {
    // The key is ignored where auth is off.
    let resp = client
        .post(url)
        .header("authorization", format!("Bearer {}", key()))
        .header("content-type", "application/json")
        .body(if url.ends_with("/v1/responses") {
            responses_body(stream)
        } else {
            body(stream)
        })
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
    // A router that falls behind must not run the process out of file
    // descriptors (four a request in flight: the client's, and the
    // in-process gateway's three): past this many in flight a request
    // waits for one to finish, and its wait counts in its time, since
    // its time runs from when it was due.
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(2000));
    let mut tasks = Vec::new();
    for _ in 0..rate * seconds {
        tick.tick().await;
        let due = Instant::now();
        let (c, u, slots) = (client.clone(), url.to_owned(), in_flight.clone());
        tasks.push(tokio::spawn(async move {
            let _slot = slots.acquire_owned().await.unwrap();
            one_since(&c, &u, false, due).await
        }));
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

/// What the command line asks for (cargo passes `--bench` too).
#[derive(Default)]
struct Args {
    peers: bool,
    profile: Option<u64>,
    /// `--profile` the all-off gateway instead.
    off: bool,
    /// `--profile` the gateway with auth and limits, recording no usage.
    keys: bool,
    /// `--profile` at this many requests a second (open loop).
    rate: Option<u64>,
    /// The child: serve llmgw in front of this upstream.
    serve: Option<SocketAddr>,
    /// The `--serve` child logs as the shipped binary does.
    logged: bool,
    /// Only time the access line's formatting.
    lines: bool,
    /// Only time a key's lookup, from the cache and composed again.
    key_lookups: bool,
    /// Only time reading a plain answer's usage.
    answers: bool,
    /// `--profile` this llmgw binary instead ([`shipped`]); with
    /// `--peers`, side by side with them in place of the bench's own
    /// gateway with auth, limits and usage.
    binary: Option<String>,
}

fn args() -> Args {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--peers" => a.peers = true,
            "--off" => a.off = true,
            "--keys" => a.keys = true,
            "--logged" => a.logged = true,
            "--lines" => a.lines = true,
            "--key-lookups" => a.key_lookups = true,
            "--answers" => a.answers = true,
            "--rate" => a.rate = it.next().and_then(|s| s.parse().ok()),
            "--profile" => a.profile = it.next().and_then(|s| s.parse().ok()).or(Some(30)),
            "--serve" => a.serve = it.next().and_then(|s| s.parse().ok()),
            "--binary" => a.binary = it.next(),
            _ => {}
        }
    }
    a
}

/// The `--serve` child: llmgw with auth, limits and usage (a SQLite store,
/// the views following it, the batcher), llmgw with all off, and llmgw
/// with auth and limits recording no usage, in front of `up`; prints their
/// addresses, one a line, and serves until its stdin closes (the parent
/// went away).
fn serve(up: SocketAddr, logged: bool) {
    // Through the binary's own layer and writer (log_lines): info unless
    // RUST_LOG says otherwise, JSON when LLMGW_LOG_FORMAT says so.
    let _lines = logged.then(|| {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        use tracing_subscriber::{EnvFilter, Layer};
        let (stderr, guard) = llmgw_gateway::log_lines::stderr();
        let format = match std::env::var("LLMGW_LOG_FORMAT") {
            Ok(f) if f == "json" => llmgw_gateway::log_lines::Format::Json,
            _ => llmgw_gateway::log_lines::Format::Text { ansi: false },
        };
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
        tracing_subscriber::registry()
            .with(llmgw_gateway::log_lines::layer(format, stderr).with_filter(filter))
            .init();
        guard
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (t, rx) = tenancy().await;
        let keyed = Gateway::with_keys(
            config(up),
            Some(t.queue.clone()),
            Some(llmgw_gateway::auth::KeyDirectory::new(t.views.clone())),
        )
        .unwrap();
        tokio::spawn(llmgw_gateway::usage::run_batcher(
            t.store.clone(),
            "bench".into(),
            rx,
            500,
            Duration::from_millis(200),
        ));
        let unrecorded = Gateway::with_keys(
            config(up),
            None,
            Some(llmgw_gateway::auth::KeyDirectory::new(t.views.clone())),
        )
        .unwrap();
        println!("{}", listen(keyed).await);
        println!("{}", gateway(up).await);
        println!("{}", listen(unrecorded).await);
        println!("{}", relay(up).await);
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        while tokio::io::AsyncReadExt::read(&mut stdin, &mut buf)
            .await
            .is_ok_and(|n| n > 0)
        {}
        drop(t);
    });
}

/// A bare TCP relay to `up` (each connection piped to one of its own): the
/// floor of what any router in its own process adds, which reads nothing
/// of the bytes it passes.
async fn relay(up: SocketAddr) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                inbound.set_nodelay(true).unwrap();
                let mut outbound = tokio::net::TcpStream::connect(up).await.unwrap();
                outbound.set_nodelay(true).unwrap();
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    });
    addr
}

/// This program run as `--serve`: llmgw in its own process.
struct Served {
    child: std::process::Child,
    tenanted: String,
    off: String,
    /// Auth and limits, no usage recorded.
    keys: String,
    /// A bare TCP relay: see [`relay`].
    relay: String,
}

impl Drop for Served {
    /// Its stdin closed, it stops serving and exits as a program does
    /// (an instrumented build writes its profile then); killed if it has
    /// not within a few seconds.
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let (exited, exit) = std::sync::mpsc::channel::<()>();
        let pid = self.child.id().to_string();
        // Under a tool, its exit (which writes the tool's figures) is slow.
        let grace = Duration::from_secs(if wrapper().is_some() { 300 } else { 5 });
        let watchdog = std::thread::spawn(move || {
            if exit.recv_timeout(grace) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid])
                    .status();
            }
        });
        let _ = self.child.wait();
        drop(exited);
        let _ = watchdog.join();
    }
}

/// `LLMGW_BENCH_WRAP`: a command line (split at spaces) the `--serve`
/// process runs under, such as `valgrind --tool=callgrind`: instructions
/// a request, which this VM's missing hardware counters cannot count, are
/// steadier than its timings.
fn wrapper() -> Option<Vec<String>> {
    let wrap = std::env::var("LLMGW_BENCH_WRAP").ok()?;
    let words: Vec<String> = wrap.split_whitespace().map(str::to_owned).collect();
    (!words.is_empty()).then_some(words)
}

fn served(up: SocketAddr, logged: bool) -> Served {
    use std::io::BufRead;
    let this = std::env::current_exe().unwrap();
    let mut command = match wrapper() {
        Some(words) => {
            let mut c = std::process::Command::new(&words[0]);
            c.args(&words[1..]).arg(this);
            c
        }
        None => std::process::Command::new(this),
    };
    command.args(["--serve", &up.to_string()]);
    if logged {
        command.arg("--logged");
    }
    let mut child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its log read as a journal or a container runtime reads one: from a
    // pipe, here into nothing.
    let mut log = child.stderr.take().unwrap();
    std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || {
        format!(
            "http://{}/v1/chat/completions",
            lines.next().unwrap().unwrap()
        )
    };
    let (tenanted, off, keys, relay) = (next(), next(), next(), next());
    Served {
        child,
        tenanted,
        off,
        keys,
        relay,
    }
}

fn main() {
    let args = args();
    if let Some(up) = args.serve {
        return serve(up, args.logged);
    }
    if args.lines {
        return lines::run();
    }
    if args.answers {
        return answers::run();
    }
    if args.key_lookups {
        let rt = tokio::runtime::Runtime::new().unwrap();
        return rt.block_on(key_lookups::run());
    }
    if args.binary.is_some() && (args.profile.is_none() && !args.peers || args.off || args.keys) {
        eprintln!(
            "--binary measures the binary with keys on, in a --profile mode or with --peers: not with --off or --keys, nor without either"
        );
        std::process::exit(2);
    }
    let venv = peers::venv();
    if args.peers
        && let Err(e) = peers::install(&venv)
    {
        eprintln!("the peers could not be installed, so they are left out: {e}");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let up = upstream().await;
        let gw = gateway(up).await;
        let (t, rx) = tenancy().await;
        let keyed = Gateway::with_keys(
            config(up),
            Some(t.queue.clone()),
            Some(llmgw_gateway::auth::KeyDirectory::new(t.views.clone())),
        )
        .unwrap();
        let batcher = tokio::spawn(llmgw_gateway::usage::run_batcher(
            t.store.clone(),
            "bench".into(),
            rx,
            500,
            Duration::from_millis(200),
        ));
        let keyed = listen(keyed).await;
        let tenanted = format!("http://{keyed}/v1/chat/completions");
        // The same keys and limits, recording no usage: what the log costs.
        let unrecorded = Gateway::with_keys(
            config(up),
            None,
            Some(llmgw_gateway::auth::KeyDirectory::new(t.views.clone())),
        )
        .unwrap();
        let unrecorded = format!("http://{}/v1/chat/completions", listen(unrecorded).await);
        let direct = format!("http://{up}/v1/chat/completions");
        let via = format!("http://{gw}/v1/chat/completions");
        let client = reqwest::Client::builder().pool_max_idle_per_host(256).tcp_nodelay(true).build().unwrap();
        // Warm the connection pools.
        saturate(&client, &direct, 8, 1, false).await;
        saturate(&client, &via, 8, 1, false).await;
        saturate(&client, &tenanted, 8, 1, false).await;
        saturate(&client, &unrecorded, 8, 1, false).await;

        if let Some(seconds) = args.profile {
            let child = served(up, args.logged);
            let binary = args.binary.as_deref().map(|b| shipped::start(b, up, args.logged));
            let (url, what, pid) = match (&binary, args.off, args.keys) {
                (Some(b), _, _) => (&b.url, "auth, limits and usage, as shipped", b.pid()),
                (None, true, _) => (&child.off, "all off", child.child.id()),
                (None, _, true) => (&child.keys, "auth and limits, no usage", child.child.id()),
                _ => (&child.tenanted, "auth, limits and usage", child.child.id()),
            };
            if let Some(b) = &binary {
                KEY.set(b.key.clone()).unwrap();
            }
            saturate(&client, url, 8, 1, false).await;
            if let Some(rate) = args.rate {
                let relay = (child.child.id(), child.relay.as_str());
                return at_rate(&client, relay, pid, url, what, rate, seconds, &direct).await;
            }
            println!("pid {pid}: llmgw with {what}, 32 clients for {seconds} s");
            let cpu = cpu_seconds(pid);
            let (rate, mut lat) = saturate(&client, url, 32, seconds, false).await;
            let cpu = cpu_seconds(pid) - cpu;
            println!(
                "{rate:.0} req/s, p50 {:.3} ms; llmgw's CPU {:.1} µs a request; its memory {}",
                pct(&mut lat, 0.5),
                cpu * 1e6 / lat.len() as f64,
                memory(pid)
            );
            return;
        }
        if args.peers {
            let running = peers::start(&venv, up, &client, &body(false)).await;
            let child = served(up, args.logged);
            let binary = args.binary.as_deref().map(|b| shipped::start(b, up, args.logged));
            if let Some(b) = &binary {
                // Every request now presents the binary's key: the
                // bench's own gateway with keys would refuse it.
                KEY.set(b.key.clone()).unwrap();
            }
            let ours = binary.as_ref().map(|b| b.url.as_str());
            side_by_side(&client, &direct, &child, ours, &running).await;
            if binary.is_some() {
                // The rest measures the bench's own gateways, and the one
                // with keys refuses the binary's key.
                return;
            }
        } else {
            println!("(`-- --peers` also runs SGLang Model Gateway and vllm-router, installed into {})", venv.display());
        }

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
        // The Responses API: the same request turned into a chat
        // completion and its answer turned back, against chat, both all off.
        let responses = format!("http://{gw}/v1/responses");
        saturate(&client, &responses, 8, 1, false).await;
        for (stream, label) in [(false, "plain"), (true, "streaming (time to first byte)")] {
            let (c_rate, mut c) = saturate(&client, &via, 32, 3, stream).await;
            let (r_rate, mut r) = saturate(&client, &responses, 32, 3, stream).await;
            println!(
                "saturated, 32 clients, {label}: chat {c_rate:.0} req/s (p50 {:.3} ms), Responses API {r_rate:.0} req/s (p50 {:.3} ms): {:.0}% of chat",
                pct(&mut c, 0.5),
                pct(&mut r, 0.5),
                100.0 * r_rate / c_rate
            );
        }
        // Auth, limits at four levels, budgets and usage recording on,
        // against all off, in the same run.
        let mut d = fixed_rate(&client, &direct, 1000, 3).await;
        let mut g = fixed_rate(&client, &via, 1000, 3).await;
        let mut k = fixed_rate(&client, &tenanted, 1000, 3).await;
        let d50 = pct(&mut d, 0.5);
        let d99 = pct(&mut d, 0.99);
        println!(
            "fixed 1000 req/s, added over direct: all off p50 {:.3} ms p99 {:.3} ms   auth+limits+usage p50 {:.3} ms p99 {:.3} ms",
            pct(&mut g, 0.5) - d50,
            pct(&mut g, 0.99) - d99,
            pct(&mut k, 0.5) - d50,
            pct(&mut k, 0.99) - d99,
        );
        // Interleaved twice, best of each: the machine's own noise (two
        // cores shared by clients, upstream and gateways) moves single runs
        // by a third.
        let before = head(&t.store).await;
        let (mut off, mut keys_only, mut on, mut on_p50) = (0f64, 0f64, 0f64, 0f64);
        for _ in 0..2 {
            off = off.max(saturate(&client, &via, 32, 3, false).await.0);
            keys_only = keys_only.max(saturate(&client, &unrecorded, 32, 3, false).await.0);
            let (rate, mut lat) = saturate(&client, &tenanted, 32, 3, false).await;
            if rate > on {
                (on, on_p50) = (rate, pct(&mut lat, 0.5));
            }
        }
        println!(
            "saturated, 32 clients, plain, best of two: all off {off:.0} req/s; auth+limits without usage {keys_only:.0} req/s ({:.2} of all off); auth+limits+usage {on:.0} req/s, p50 {on_p50:.3} ms ({:.2} of all off)",
            keys_only / off,
            on / off
        );
        // The usage path: what reaching the log costs per request.
        let events = settled(&t.store).await - before;
        let recorded = usage_rows(&t.store, before).await;
        println!(
            "usage path: {recorded} requests recorded as usage rows in {events} events ({} dropped); appending them costs {:.1} µs per record (one UsageBatchRecorded of 500 rows an append, SQLite)",
            t.queue.dropped(),
            append_cost(&t.store).await
        );
        drop(batcher);
    });
}

/// llmgw (all off, and with auth, limits and usage) against the peers,
/// direct and a bare TCP relay: saturated, interleaved in two rounds, best
/// of each (one run moves by a third on two shared cores); then 1,000
/// req/s open loop.
async fn side_by_side(
    client: &reqwest::Client,
    direct: &str,
    served: &Served,
    binary: Option<&str>,
    running: &[peers::Peer],
) {
    let ours = match binary {
        Some(url) => ("llmgw binary, auth+limits+usage".into(), url),
        None => ("llmgw, auth+limits+usage".into(), served.tenanted.as_str()),
    };
    let mut targets: Vec<(String, &str)> = vec![
        ("direct".into(), direct),
        ours,
        ("llmgw, all off".into(), &served.off),
    ];
    println!("load before the side by side: {}", uptime());
    targets.extend(running.iter().map(|p| (p.name.clone(), p.url.as_str())));
    targets.push(("bare TCP relay (the floor)".into(), &served.relay));
    for (_, url) in &targets {
        saturate(client, url, 8, 1, false).await;
    }
    // (req/s, p50, p99) saturated, and (p50, p99) at 1,000 req/s.
    let mut best = vec![(0f64, 0f64, 0f64); targets.len()];
    for _ in 0..2 {
        for (i, (_, url)) in targets.iter().enumerate() {
            let (rate, mut lat) = saturate(client, url, 32, 3, false).await;
            if rate > best[i].0 {
                best[i] = (rate, pct(&mut lat, 0.5), pct(&mut lat, 0.99));
            }
        }
    }
    let mut fixed = Vec::new();
    for (_, url) in &targets {
        let mut lat = fixed_rate(client, url, 1000, 3).await;
        fixed.push((pct(&mut lat, 0.5), pct(&mut lat, 0.99)));
    }
    let ours = best[1].0;
    println!(
        "side by side: 32 clients saturated, best of two interleaved 3 s runs; 1000 req/s open loop for 3 s (added: over direct)"
    );
    println!(
        "{:<34} {:>8} {:>8} {:>8} {:>14} {:>10} {:>10}",
        "", "req/s", "p50 ms", "p99 ms", "llmgw(a+l+u)/", "1k added", "1k added"
    );
    println!(
        "{:<34} {:>8} {:>8} {:>8} {:>14} {:>10} {:>10}",
        "", "", "", "", "this", "p50 ms", "p99 ms"
    );
    for (i, (name, _)) in targets.iter().enumerate() {
        let (rate, p50, p99) = best[i];
        println!(
            "{name:<34} {rate:>8.0} {p50:>8.3} {p99:>8.3} {:>14.2} {:>10.3} {:>10.3}",
            ours / rate,
            fixed[i].0 - fixed[0].0,
            fixed[i].1 - fixed[0].1,
        );
    }
}

/// `--profile S --rate R`: direct, the bare relay and llmgw at R req/s, in
/// S rounds of one second each through all three in turn, so that the
/// machine's drift (other processes, the clock's speed) falls on all
/// three alike rather than on whichever ran last; for the relay and
/// llmgw, the process's CPU and its threads' sleeps a request in their
/// own seconds.
#[allow(clippy::too_many_arguments, reason = "a benchmark's one call")]
async fn at_rate(
    client: &reqwest::Client,
    (relay_pid, relay): (u32, &str),
    pid: u32,
    url: &str,
    what: &str,
    rate: u64,
    seconds: u64,
    direct: &str,
) {
    println!(
        "pid {pid}: llmgw with {what}, {rate} req/s, {seconds} rounds of a second each direct, through the relay and through llmgw"
    );
    let (mut direct_lat, mut relay_lat, mut lat) = (Vec::new(), Vec::new(), Vec::new());
    // (CPU seconds, sleeps, page faults) in the relay's and llmgw's seconds.
    let (mut relay_used, mut used) = ((0.0, 0, 0), (0.0, 0, 0));
    let counters = |pid| (cpu_seconds(pid), switches(pid), faults(pid));
    let add = |sum: &mut (f64, u64, u64), pid, before: (f64, u64, u64)| {
        let after = counters(pid);
        sum.0 += after.0 - before.0;
        sum.1 += after.1 - before.1;
        sum.2 += after.2 - before.2;
    };
    for _ in 0..seconds {
        direct_lat.extend(fixed_rate(client, direct, rate, 1).await);
        let before = counters(relay_pid);
        relay_lat.extend(fixed_rate(client, relay, rate, 1).await);
        add(&mut relay_used, relay_pid, before);
        let before = counters(pid);
        lat.extend(fixed_rate(client, url, rate, 1).await);
        add(&mut used, pid, before);
    }
    let (d50, d99) = (pct(&mut direct_lat, 0.5), pct(&mut direct_lat, 0.99));
    let (r50, r99) = (pct(&mut relay_lat, 0.5), pct(&mut relay_lat, 0.99));
    let (p50, p99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
    let (rn, n) = (relay_lat.len() as f64, lat.len() as f64);
    println!(
        "direct p50 {d50:.3} ms p99 {d99:.3} ms; relay added p50 {:.3} ms p99 {:.3} ms; its CPU {:.1} µs and its threads' sleeps {:.2} a request",
        r50 - d50,
        r99 - d99,
        relay_used.0 * 1e6 / rn,
        relay_used.1 as f64 / rn,
    );
    println!(
        "llmgw added p50 {:.3} ms p99 {:.3} ms; its CPU {:.1} µs, its threads' sleeps {:.2} and its page faults {:.2} a request",
        p50 - d50,
        p99 - d99,
        used.0 * 1e6 / n,
        used.1 as f64 / n,
        used.2 as f64 / n
    );
}

/// Voluntary context switches of all of `pid`'s threads so far.
fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("status")).ok())
        .filter_map(|status| {
            let line = status
                .lines()
                .find(|l| l.starts_with("voluntary_ctxt_switches:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum()
}

/// Resident and peak memory of process `pid`, from its status.
fn memory(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    format!(
        "RSS {:.1} MiB, peak {:.1} MiB",
        kib("VmRSS:") / 1024.0,
        kib("VmHWM:") / 1024.0
    )
}

/// Field `n` of `/proc/PID/stat` (as proc(5) counts, from 1).
fn stat_field(pid: u32, n: usize) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the name, which may hold spaces, the state is field 3.
    let rest = stat.rsplit_once(") ").unwrap().1;
    rest.split_whitespace().nth(n - 3).unwrap().parse().unwrap()
}

/// Minor page faults of process `pid` so far (minflt): memory touched for
/// the first time, or again after its allocator gave it back to the kernel.
fn faults(pid: u32) -> u64 {
    stat_field(pid, 10)
}

/// User and system CPU seconds of process `pid` so far (utime + stime),
/// in USER_HZ, which Linux fixes at 100 for /proc.
fn cpu_seconds(pid: u32) -> f64 {
    (stat_field(pid, 14) + stat_field(pid, 15)) as f64 / 100.0
}

/// The load average, so that a figure says what it ran beside.
fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map_or_else(|_| "unknown".into(), |l| l.trim().to_owned())
}

async fn head(store: &llmgw_eventstore::AnyStore) -> u64 {
    use llmgw_eventstore::EventStore;
    store.head().await.unwrap().0
}

/// The usage rows of the events after `after` (a batch has one request id
/// a row).
async fn usage_rows(store: &llmgw_eventstore::AnyStore, mut after: u64) -> u64 {
    use llmgw_eventstore::EventStore;
    let mut rows = 0;
    loop {
        let page = store.read_all(after, 1000).await.unwrap();
        let Some(last) = page.last() else {
            return rows;
        };
        after = last.position;
        rows += page
            .iter()
            .filter_map(|e| e.payload.get("request_id").and_then(|r| r.as_array()))
            .map(|r| r.len() as u64)
            .sum::<u64>();
    }
}

/// The log's head once the batcher has stopped appending.
async fn settled(store: &llmgw_eventstore::AnyStore) -> u64 {
    let mut last = head(store).await;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = head(store).await;
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Microseconds per usage record appended through the decider's observer
/// path, in the batcher's batch size (one `UsageBatchRecorded` per batch).
async fn append_cost(store: &llmgw_eventstore::AnyStore) -> f64 {
    let n = 5000;
    let requests: Vec<llmgw_domain::usage::FinishedRequest> = (0..n)
        .map(|i| llmgw_domain::usage::FinishedRequest {
            request_id: format!("bench-{i}"),
            key_id: "k".into(),
            project_id: "p".into(),
            model_asked: "m".into(),
            model_served: "m".into(),
            prompt_tokens: 12,
            completion_tokens: 3,
            status: 200,
            latency_ms: 1,
            ttft_ms: None,
            band: llmgw_domain::tenancy::Band::Gold,
            at: llmgw_domain::UnixMillis(0),
            price: llmgw_domain::catalog::Price::ZERO,
        })
        .collect();
    let decider = llmgw_decider::Decider::new(store.clone(), "bench".into());
    let origin = llmgw_decider::Origin::new(llmgw_decider::Actor::Gateway("bench".into()));
    let timed = Instant::now();
    for chunk in requests.chunks(500) {
        let (batch, _) = llmgw_domain::usage::record_batch("bench", chunk.to_vec());
        let batch = llmgw_domain::Event::Usage(batch.expect("rows"));
        decider.observe(&origin, vec![batch]).await.unwrap();
    }
    timed.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// The shipped binary's allocator (cli/src/main.rs), so that the figures are its.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
