//! The control plane at fleet scale: its CPU and memory while 500, 1,000
//! and 2,000 simulated agents heartbeat every 5 s, and the time of one
//! placement decision on 10,000 nodes.
//!
//! Run: `cargo bench -p llmgw-control --bench scale`.
//!
//! The agents run in a child process (this program, re-run with
//! `--fleet`), so the figures are the control plane's alone: its process
//! runs the agent service, the views, the reconciler and the liveness
//! clocks on an embedded SQLite log, as `llmgw server` does. Each agent is
//! one stream (fifty share a connection, as agents behind one proxy
//! would; `--measure N --per-connection 1` gives each its own, and
//! `--tls` then puts each on mutual TLS with its own certificate;
//! `--exit-holding` leaves without freeing, for a heap profiler;
//! `--binary PATH` puts the fleet on `PATH server` instead, [`shipped`]),
//! dials as the agent does (its keepalive pings every 2 s), registers eight
//! H100s and heartbeats every 5 s from a random phase. The server's agent
//! listener is the binary's: capped, idle connections closed, TLS
//! handshakes beside the accept loop.
//! CPU is the server process's user + system time over a 15 s window
//! (`--window SECONDS` for a longer one: buffers that fill as the
//! streams run show in RSS only after minutes) after every agent has
//! registered, as a share of one core; the idle
//! control plane (no agents) is measured first, in the same run, as the
//! baseline. Placement is timed on generated clusters of 1,000 and 10,000
//! nodes (the same shape, a fifth of their GPUs taken), the smaller one
//! being the baseline for the ratio, both as the reconciler places (quiet:
//! the choice alone) and as `llmgw ctl model explain` does (every node's
//! verdict spelled out). `--placement` runs only the placement part.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark program; a failure should stop it loudly"
)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use llmgw_api::v1::{self, agent_message};
use llmgw_api::{AgentMessage, AgentServiceClient, AgentServiceServer};
use llmgw_control::{AgentSvc, ControlConfig, ControlPlane};
use llmgw_domain::catalog::{Engine, Model, Profile};
use llmgw_domain::ids::ReplicaId;
use llmgw_domain::nodes::{FabricAttachment, Gpu, Inventory, Node, Nodes, Reachability};
use llmgw_domain::placement::{PlaceOptions, place, place_quiet};
use llmgw_domain::replicas::{Placement, ReplicaEvent, Replicas, ShardPlacement};
use llmgw_eventstore::{AnyStore, OpenOptions, StoreAddress};

mod shipped;

const HEARTBEAT: Duration = Duration::from_secs(5);
/// The measuring window, unless `--window SECONDS` says otherwise.
const WINDOW: Duration = Duration::from_secs(15);
/// Streams sharing a connection, unless `--per-connection K` says otherwise
/// (1: every agent its own connection, as a fleet without a proxy dials).
const PER_CONNECTION: usize = 50;

/// `proc`: "self", or the pid of the binary measured (`--binary`).
fn cpu_seconds(proc: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{proc}/stat")).unwrap();
    let rest = stat.rsplit_once(") ").unwrap().1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the state: utime is field 14 of the full line, 12 here.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / rustix::param::clock_ticks_per_second() as f64
}

fn rss_mib(proc: &str) -> f64 {
    status_mib(proc, "VmRSS:")
}

/// The most the process has held at once (the kernel's high-water mark):
/// a transient that the allocator gave back is seen here, not in RSS.
fn peak_mib(proc: &str) -> f64 {
    status_mib(proc, "VmHWM:")
}

fn status_mib(proc: &str, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{proc}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024.0
}

fn register(i: usize) -> v1::Register {
    v1::Register {
        node_id: format!("node-{i:05}"),
        hostname: format!("node-{i:05}"),
        mgmt_addr: format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
        gpus: (0..8)
            .map(|g| v1::Gpu {
                index: g,
                uuid: format!("GPU-{i}-{g}"),
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_total_mb: 81_559,
                class: "h100-80g".into(),
                ..v1::Gpu::default()
            })
            .collect(),
        fabrics: vec![v1::FabricAttachment {
            fabric: format!("ib-{}", i % 4),
            hcas: (0..4).map(|h| format!("mlx5_{h}")).collect(),
            rate_gbps: 400,
        }],
        engine_versions: [("vllm".to_string(), "0.11.0".to_string())].into(),
        engines_probed: true,
        memory_total_mb: 2_000_000,
        storage: vec![v1::Storage {
            path: "/var/lib/llmgw-weights".into(),
            free_bytes: 3_000_000_000_000,
            total_bytes: 4_000_000_000_000,
            shared: false,
        }],
        ..v1::Register::default()
    }
}

/// What the fleet prints once every agent's registration is acknowledged
/// (the server's first message on a stream, sent once it is in the log).
const REGISTERED: &str = "registered";

/// The child: `n` agents against `addr`, until killed; with `pki` (the
/// directory [`Pki`] wrote), each on its own certificate.
async fn fleet(addr: &str, n: usize, per_connection: usize, pki: Option<&str>) {
    let issuer = pki.map(Pki::issuer);
    let acknowledged = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let port = addr.rsplit_once(':').unwrap().1;
    let mut tasks = Vec::new();
    for chunk_start in (0..n).step_by(per_connection) {
        let channel = match &issuer {
            Some((ca, issuer)) => {
                let (cert, key) = Pki::client(issuer, &format!("node-{chunk_start:05}"));
                let tls = (ca.clone(), cert, key);
                llmgw_agent::session::dial(&format!("https://localhost:{port}"), Some(&tls)).await
            }
            None => llmgw_agent::session::dial(&format!("http://{addr}"), None).await,
        }
        .unwrap();
        for i in chunk_start..(chunk_start + per_connection).min(n) {
            let channel = channel.clone();
            let acknowledged = acknowledged.clone();
            tasks.push(tokio::spawn(async move {
                let mut client = AgentServiceClient::new(channel);
                let (tx, rx) = tokio::sync::mpsc::channel(8);
                tx.send(AgentMessage {
                    msg: Some(agent_message::Msg::Register(register(i))),
                })
                .await
                .unwrap();
                let mut inbound = client
                    .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await
                    .unwrap()
                    .into_inner();
                let phase = Duration::from_millis((i as u64 * 7919) % 5000);
                let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + phase, HEARTBEAT);
                let mut first = true;
                loop {
                    tokio::select! {
                        _ = beat.tick() => {
                            let hb = v1::Heartbeat {
                                node_id: format!("node-{i:05}"),
                                storage: register(i).storage,
                                memory_total_mb: 2_000_000,
                                ..v1::Heartbeat::default()
                            };
                            if tx.send(AgentMessage { msg: Some(agent_message::Msg::Heartbeat(hb)) }).await.is_err() {
                                return;
                            }
                        }
                        m = inbound.message() => {
                            if !matches!(m, Ok(Some(_))) {
                                return;
                            }
                            if std::mem::take(&mut first)
                                && acknowledged.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == n
                            {
                                println!("{REGISTERED}");
                            }
                        }
                    }
                }
            }));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
}

struct Server {
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    stop: tokio::sync::watch::Sender<bool>,
}

/// `--tls`: an authority, the server's certificate for localhost, and
/// the authority's key in a directory the fleet reads, so that it signs
/// each agent's certificate (its common name the node's id, which the
/// server checks against the stream's registration).
struct Pki {
    dir: tempfile::TempDir,
    tls: llmgw_gateway::ServerTls,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "scale bench");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("ca-key.pem"), ca_key.serialize_pem()).unwrap();
        let (_, issuer) = Pki::issuer(dir.path().to_str().unwrap());
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &issuer).unwrap();
        let tls = llmgw_gateway::ServerTls::with_client_ca(
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
            ca.pem().as_bytes(),
        )
        .unwrap();
        Pki { dir, tls }
    }

    /// The authority in `dir`: its certificate (PEM) and its signer.
    fn issuer(dir: &str) -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
        let dir = std::path::Path::new(dir);
        let ca = std::fs::read_to_string(dir.join("ca.pem")).unwrap();
        let key = std::fs::read_to_string(dir.join("ca-key.pem")).unwrap();
        let key = rcgen::KeyPair::from_pem(&key).unwrap();
        let issuer = rcgen::Issuer::from_ca_cert_pem(&ca, key).unwrap();
        (ca, issuer)
    }

    /// A client certificate naming `node` and its key, PEM.
    fn client(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, node: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, node);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

async fn server(pki: Option<&Pki>) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let address = StoreAddress::parse(&dir.path().join("llmgw.db").display().to_string()).unwrap();
    let store = AnyStore::open(&address, OpenOptions::migrating())
        .await
        .unwrap();
    let mut runner = llmgw_projections::Runner::start(store.clone(), "bench")
        .await
        .unwrap();
    let cp = ControlPlane::new(
        store,
        runner.views(),
        runner.watch_position(),
        ControlConfig {
            instance: "bench".into(),
            ..ControlConfig::default()
        },
    );
    tokio::spawn(async move {
        let _ = runner.follow().await;
    });
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(cp.clone().run(stop_rx.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The binary's agent listener, its cap raised for the fleet as an
    // operator of one this size would (connections.max.agent).
    let limits = llmgw_gateway::ConnectionLimits::default();
    let acceptor = llmgw_gateway::Acceptor::new(
        listener,
        llmgw_gateway::Which::Agent,
        100_000,
        Some(limits.idle_timeout),
        Arc::default(),
    );
    let routes = tonic::service::Routes::new(AgentServiceServer::new(AgentSvc(cp.clone())));
    let tls = pki.map(|p| p.tls.clone());
    let mut stopped = stop_rx.clone();
    tokio::spawn(async move {
        let stop = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        llmgw_gateway::serve_grpc(acceptor, tls.as_ref(), routes, stop).await
    });
    let mut l = cp.leadership();
    l.wait_for(|t| t.is_some()).await.unwrap();
    Server {
        addr,
        _dir: dir,
        stop,
    }
}

/// The control plane measured: this program's own, or a binary's
/// (`--binary PATH`).
enum Plane {
    Own(Server),
    Shipped(shipped::Shipped),
}

impl Plane {
    async fn start(binary: Option<&str>, agents: usize, pki: Option<&Pki>) -> Plane {
        match binary {
            Some(b) => Plane::Shipped(shipped::Shipped::start(b, agents)),
            None => Plane::Own(server(pki).await),
        }
    }

    /// Its `/proc` entry's name.
    fn proc(&self) -> String {
        match self {
            Plane::Own(_) => "self".into(),
            Plane::Shipped(s) => s.pid().to_string(),
        }
    }

    fn agent_addr(&self) -> String {
        match self {
            Plane::Own(s) => s.addr.to_string(),
            Plane::Shipped(s) => s.agent.clone(),
        }
    }

    fn stop(self) {
        match self {
            Plane::Own(s) => {
                let _ = s.stop.send(true);
            }
            // Dropped: SIGTERM, and waited for.
            Plane::Shipped(s) => drop(s),
        }
    }
}

async fn measure(
    n: usize,
    per_connection: usize,
    tls: bool,
    window: Duration,
    binary: Option<&str>,
) {
    let pki = tls.then(Pki::new);
    let plane = Plane::start(binary, n, pki.as_ref()).await;
    let proc = plane.proc();
    let rss_before = rss_mib(&proc);
    let started = Instant::now();
    let mut fleet = std::process::Command::new(std::env::current_exe().unwrap());
    fleet.args([
        "--fleet",
        &plane.agent_addr(),
        &n.to_string(),
        &per_connection.to_string(),
    ]);
    if let Some(p) = &pki {
        fleet.arg(p.dir.path());
    }
    let mut child = fleet
        // A preloaded profiler (heaptrack) follows the server only.
        .env_remove("LD_PRELOAD")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let said = tokio::task::spawn_blocking(move || {
        std::io::BufRead::lines(std::io::BufReader::new(out)).next()
    })
    .await
    .unwrap();
    assert!(
        matches!(said, Some(Ok(l)) if l == REGISTERED),
        "the fleet stopped before every agent was registered"
    );
    let registered = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (c0, t0) = (cpu_seconds(&proc), Instant::now());
    tokio::time::sleep(window).await;
    let share = (cpu_seconds(&proc) - c0) / t0.elapsed().as_secs_f64();
    let rss = rss_mib(&proc);
    println!(
        "agents {n:>5}  heartbeats/s {:>5.0}  control plane{} CPU {:>5.1}% of a core  RSS {rss:>6.1} MiB (+{:.1} with them, peak {:.1})  all registered in {:.1} s",
        n as f64 / HEARTBEAT.as_secs_f64(),
        binary.map_or(String::new(), |b| format!(" ({b})")),
        share * 100.0,
        rss - rss_before,
        peak_mib(&proc),
        registered.as_secs_f64()
    );
    let _ = child.kill();
    let _ = child.wait();
    if std::env::args().any(|a| a == "--exit-holding") {
        // Everything still held: a heap profiler's "leaked" at exit is
        // the steady state just measured.
        std::process::exit(0);
    }
    plane.stop();
}

async fn idle(binary: Option<&str>) {
    let plane = Plane::start(binary, 0, None).await;
    let proc = plane.proc();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (c0, t0) = (cpu_seconds(&proc), Instant::now());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let share = (cpu_seconds(&proc) - c0) / t0.elapsed().as_secs_f64();
    println!(
        "agents     0  (baseline: an idle control plane{})  CPU {:>5.1}% of a core  RSS {:>6.1} MiB",
        binary.map_or(String::new(), |b| format!(", {b}")),
        share * 100.0,
        rss_mib(&proc)
    );
    plane.stop();
}

fn cluster(n: usize) -> (Nodes, Replicas) {
    let classes = ["h100-80g", "a100-80g", "l40s-45g"];
    let mut nodes = BTreeMap::new();
    for i in 0..n {
        let id = format!("node-{i:05}");
        let class = classes[i % 3];
        nodes.insert(
            id.clone().into(),
            Node {
                id: id.clone().into(),
                inventory: Inventory {
                    hostname: id.clone(),
                    gpus: (0..8)
                        .map(|g| Gpu {
                            index: g,
                            uuid: format!("GPU-{i}-{g}"),
                            class: class.into(),
                            memory_mb: 81_559,
                            nvlink_peers: (0..8).filter(|p| *p != g).collect(),
                            problems: vec![],
                        })
                        .collect(),
                    fabrics: vec![FabricAttachment {
                        fabric: format!("ib-{}", i % 8),
                        hcas: vec!["mlx5_0".into(), "mlx5_1".into()],
                        rate_gbps: 400,
                    }],
                    memory_total_mb: 2_000_000,
                    disk_free_gb: Some(3000),
                    engines: [("vllm".to_string(), "0.11.0".to_string())].into(),
                    ..Inventory::default()
                },
                reachability: if i % 50 == 0 {
                    Reachability::Unreachable
                } else {
                    Reachability::Ready
                },
                cordoned: i % 97 == 0,
                draining: false,
            },
        );
    }
    let nodes = Nodes { nodes };
    // About a fifth of the GPUs taken: every fifth node full, every fifth
    // but one with a tp2 replica.
    let mut replicas = Replicas::default();
    for (i, id) in nodes.nodes.keys().enumerate() {
        let gpus: Vec<u32> = match i % 5 {
            0 => (0..8).collect(),
            1 => vec![0, 1],
            _ => continue,
        };
        replicas.evolve(&ReplicaEvent::ReplicaPlaced(Placement {
            replica_id: format!("r{i:06}").into(),
            model: "filler".into(),
            profile: "p".into(),
            profile_fp: String::new(),
            pool: "h100-80g".into(),
            fabric: None,
            shards: vec![ShardPlacement {
                shard_id: format!("r{i:06}-0").into(),
                rank: 0,
                node_id: id.clone(),
                gpu_indices: gpus,
                hcas: vec![],
                port: 20000,
                memory_mb: 0,
            }],
            why: String::new(),
        }));
    }
    (nodes, replicas)
}

fn model(name: &str, tp: u32, nodes: u32) -> Model {
    let mut m = Model::named(name);
    m.profiles = vec![Profile {
        name: format!("tp{tp}x{nodes}"),
        engine: Engine::Vllm,
        gpu_class: Some("h100-80g".into()),
        tp,
        pp: 1,
        nodes,
        gpus_per_node: tp / nodes,
        priority: 0,
        weight: 1,
        startup_timeout_s: None,
        min_disk_gb: 100,
        memory_mb: 0,
        node_selector: Default::default(),
        args: vec![],
        env: Default::default(),
    }];
    m
}

/// The median of 15 placements; `explain` as `ctl model explain` asks,
/// else quiet as the reconciler places.
fn time_placement(nodes: &Nodes, replicas: &Replicas, m: &Model, explain: bool) -> Duration {
    let mut times: Vec<Duration> = (0..15)
        .map(|i| {
            let id = ReplicaId::from(format!("probe-{i}"));
            let t = Instant::now();
            let chosen = if explain {
                place(m, nodes, replicas, &[], &id, PlaceOptions::default()).chosen
            } else {
                place_quiet(m, nodes, replicas, &[], &id, PlaceOptions::default())
            };
            let took = t.elapsed();
            assert!(chosen.is_some(), "the probe fits");
            took
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn placement() {
    let (small_nodes, small_replicas) = cluster(1_000);
    let (big_nodes, big_replicas) = cluster(10_000);
    for (label, m) in [
        ("tp8, one node", model("big", 8, 1)),
        ("tp16, two nodes on one fabric", model("huge", 16, 2)),
    ] {
        for explain in [false, true] {
            let base = time_placement(&small_nodes, &small_replicas, &m, explain);
            let t = time_placement(&big_nodes, &big_replicas, &m, explain);
            let how = if explain { "explained" } else { "quiet" };
            println!(
                "placement {label:<30} {how:<9} 10,000 nodes {:>8.2} ms   1,000 nodes (baseline) {:>7.2} ms   ratio {:.1}",
                t.as_secs_f64() * 1e3,
                base.as_secs_f64() * 1e3,
                t.as_secs_f64() / base.as_secs_f64()
            );
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // Silent unless asked: `RUST_LOG=llmgw_projections=debug` shows each
    // snapshot of the views, its size and how long it held their lock.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // Five quiet placements on 10,000 nodes and nothing else: for
    // callgrind (`--toggle-collect='*place_quiet*'`), whose instruction
    // counts hold where timings on a loaded machine move by a factor of two.
    if args.iter().any(|a| a == "--count-placements") {
        let (nodes, replicas) = cluster(10_000);
        let m = model("big", 8, 1);
        for i in 0..5 {
            let id = ReplicaId::from(format!("probe-{i}"));
            let chosen = place_quiet(&m, &nodes, &replicas, &[], &id, PlaceOptions::default());
            assert!(chosen.is_some(), "the probe fits");
        }
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--fleet") {
        rt.block_on(fleet(
            &args[i + 1],
            args[i + 2].parse().unwrap(),
            args[i + 3].parse().unwrap(),
            args.get(i + 4).map(String::as_str),
        ));
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--measure") {
        let n: usize = args[i + 1].parse().unwrap();
        let per_connection = args
            .iter()
            .position(|a| a == "--per-connection")
            .map_or(PER_CONNECTION, |k| args[k + 1].parse().unwrap())
            .max(1);
        let tls = args.iter().any(|a| a == "--tls");
        let binary = args
            .iter()
            .position(|a| a == "--binary")
            .map(|k| args[k + 1].clone());
        // The binary's agents would need its authority's certificates, and
        // its heap is not this process's.
        assert!(
            binary.is_none() || !(tls || args.iter().any(|a| a == "--exit-holding")),
            "--binary measures plain connections, without --tls or --exit-holding"
        );
        let window = args
            .iter()
            .position(|a| a == "--window")
            .map_or(WINDOW, |k| {
                Duration::from_secs(args[k + 1].parse().unwrap())
            });
        // A connection's certificate names one node.
        assert!(
            !tls || per_connection == 1,
            "--tls needs --per-connection 1"
        );
        rt.block_on(async {
            if n == 0 {
                idle(binary.as_deref()).await
            } else {
                measure(n, per_connection, tls, window, binary.as_deref()).await
            }
        });
        return;
    }
    placement();
    if args.iter().any(|a| a == "--placement") {
        return;
    }
    // Each level in a fresh process, so that one level's memory is not
    // the next one's; on the binary too when one is named (placement,
    // above, is the domain's function, timed here either way).
    let binary = args.iter().position(|a| a == "--binary");
    for n in [0, 500, 1000, 2000] {
        let mut level = std::process::Command::new(std::env::current_exe().unwrap());
        level.args(["--measure", &n.to_string()]);
        if let Some(k) = binary {
            level.args(["--binary", &args[k + 1]]);
        }
        let status = level.status().unwrap();
        assert!(status.success());
    }
}

/// The shipped binary's allocator (cli/src/main.rs), so that the figures
/// are its; the system's with `--features bench-system-alloc`.
#[cfg(not(feature = "bench-system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
