use std::net::SocketAddr;
use std::sync::Arc;

use llmgw_gateway::{EndpointSpec, Gateway, GatewayConfig, Listener};
use llmgw_sim::{Bound, SimConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot};

pub(crate) fn sim_config() -> SimConfig {
    SimConfig {
        models: vec!["m".into()],
        ttft: std::time::Duration::from_millis(5),
        tokens_per_s: 1000,
        ..SimConfig::default()
    }
}

/// A sim engine on a loopback port, for the test's lifetime.
pub(crate) async fn sim(config: SimConfig) -> SocketAddr {
    let (tx, rx) = oneshot::channel();
    let mut tx = Some(tx);
    tokio::spawn(llmgw_sim::run(
        config,
        "127.0.0.1:0".parse().unwrap(),
        None,
        move |b| {
            if let (Bound::Http(addr), Some(tx)) = (b, tx.take()) {
                let _ = tx.send(addr);
            }
        },
    ));
    rx.await.unwrap()
}

/// An address nothing listens on: connections are refused.
/// An address nothing listens on. Port 1 (tcpmux) is not served here; a
/// port bound and let go could be handed to the next listener, a gateway's
/// own included (its "dead" endpoint then was itself).
pub(crate) fn dead_url() -> SocketAddr {
    "127.0.0.1:1".parse().unwrap()
}

pub(crate) fn spec(id: &str, addr: &SocketAddr, models: &[&str]) -> EndpointSpec {
    format!("{id}=http://{addr}={}", models.join(","))
        .parse()
        .unwrap()
}

pub(crate) struct Running {
    pub(crate) base: String,
    pub(crate) admin: String,
    #[allow(dead_code, reason = "kept so tests can reach the live state")]
    pub(crate) gateway: Arc<Gateway>,
}

impl Running {
    /// `body` posted to the gateway's chat completions.
    pub(crate) async fn chat(&self, body: &serde_json::Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", self.base))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// The gateway's admin /metrics page.
    pub(crate) async fn admin_page(&self) -> String {
        reqwest::get(format!("{}/metrics", self.admin))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

pub(crate) async fn gateway(endpoints: Vec<EndpointSpec>) -> Running {
    gateway_with(GatewayConfig {
        endpoints,
        ..GatewayConfig::default()
    })
    .await
}

pub(crate) async fn gateway_with(config: GatewayConfig) -> Running {
    gateway_recording(config, None).await
}

pub(crate) async fn gateway_recording(
    config: GatewayConfig,
    usage: Option<Arc<llmgw_gateway::usage::UsageQueue>>,
) -> Running {
    serve(Gateway::new(config, usage).unwrap()).await
}

/// A gateway with one endpoint `a` serving `m` on `engine`, and what it
/// records as usage.
pub(crate) async fn recording_one(
    engine: &SocketAddr,
) -> (Running, llmgw_gateway::usage::UsageReceiver) {
    let (queue, rx) = llmgw_gateway::usage::UsageQueue::new(16);
    let gw = gateway_recording(
        GatewayConfig {
            endpoints: vec![spec("a", engine, &["m"])],
            ..Default::default()
        },
        Some(queue),
    )
    .await;
    (gw, rx)
}

/// Serves a gateway on loopback ports.
pub(crate) async fn serve(gw: Arc<Gateway>) -> Running {
    serve_limited(gw, llmgw_gateway::ConnectionLimits::default()).await
}

/// Serves a gateway on loopback ports with these caps and timeouts.
pub(crate) async fn serve_limited(
    gw: Arc<Gateway>,
    connections: llmgw_gateway::ConnectionLimits,
) -> Running {
    let (tx, rx) = oneshot::channel();
    let mut found = (None, None);
    let mut tx = Some(tx);
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let listen = llmgw_gateway::Listen {
        client: any,
        client_tls: None,
        admin: any,
        admin_token: None,
        metrics: None,
        connections,
    };
    let stop = llmgw_gateway::Stop {
        signal: Box::pin(std::future::pending()),
        grace: std::time::Duration::ZERO,
    };
    tokio::spawn(llmgw_gateway::serve_with(
        gw.clone(),
        listen,
        llmgw_gateway::Extra::default(),
        stop,
        move |l| {
            match l {
                Listener::Client(a) => found.0 = Some(a),
                Listener::Admin(a) => found.1 = Some(a),
                Listener::Metrics(_) => {}
            }
            if let (Some(c), Some(a)) = found
                && let Some(tx) = tx.take()
            {
                let _ = tx.send((c, a));
            }
        },
    ));
    let (client, admin) = rx.await.unwrap();
    Running {
        base: format!("http://{client}"),
        admin: format!("http://{admin}"),
        gateway: gw,
    }
}

/// A metric's value from an engine's /metrics (the first series of it).
pub(crate) async fn metric(engine: &SocketAddr, name: &str) -> f64 {
    let page = reqwest::get(format!("http://{engine}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    page.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in\n{page}"))
}

/// A TCP relay in front of an engine that the test can cut, like a killed
/// process (open connections drop and new ones are refused), or freeze,
/// like a hung one (connections stay open and nothing more passes).
pub(crate) struct Relay {
    pub(crate) addr: SocketAddr,
    kill: Arc<Notify>,
    freeze: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    pub(crate) async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let kill = Arc::new(Notify::new());
        let (freeze, frozen) = tokio::sync::watch::channel(false);
        let k = kill.clone();
        tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = k.notified() => break,
                    accepted = listener.accept() => {
                        let Ok((mut inbound, _)) = accepted else { break };
                        let mut frozen = frozen.clone();
                        conns.spawn(async move {
                            if let Ok(mut outbound) = TcpStream::connect(target).await {
                                tokio::select! {
                                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                                    // Both ends held open, silent.
                                    _ = async { frozen.wait_for(|f| *f).await.is_ok() } => std::future::pending::<()>().await,
                                }
                            }
                        });
                    }
                }
            }
            // Dropping the set aborts every relayed connection; the listener
            // goes with this task.
            conns.abort_all();
        });
        Relay { addr, kill, freeze }
    }

    pub(crate) fn kill(&self) {
        self.kill.notify_one();
    }

    pub(crate) fn freeze(&self) {
        self.freeze.send_replace(true);
    }
}

/// An engine that looks healthy to the scraper but fails every request.
pub(crate) async fn failing_engine() -> SocketAddr {
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "engine crashed") }),
        )
        .route(
            "/metrics",
            get(|| async { "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n" }),
        );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

/// An engine that looks healthy to the scraper but breaks off every
/// answer after its headers and first bytes, as an engine that dies
/// mid-body. Raw HTTP/1.1, so that what goes out before the close is
/// exactly this.
pub(crate) async fn breaking_engine() -> SocketAddr {
    raw_engine(Some(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{\"id\":\"cmpl-broken\",")).await
}

/// An engine that looks healthy to the scraper and takes every request,
/// but never answers one: a hung engine.
pub(crate) async fn hung_engine() -> SocketAddr {
    raw_engine(None).await
}

/// Raw HTTP/1.1: `/metrics` answered as an idle engine's; any other
/// request read whole, then `answer` written and the connection closed,
/// or, with None, the connection held open without a word.
async fn raw_engine(answer: Option<&'static [u8]>) -> SocketAddr {
    use tokio::io::AsyncWriteExt;
    const IDLE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 56\r\nconnection: close\r\n\r\nvllm:num_requests_running 0\nvllm:num_requests_waiting 0\n";
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = l.accept().await {
            tokio::spawn(async move {
                let Some(head) = read_request(&mut conn).await else {
                    return;
                };
                let Some(answer) = (if head.starts_with("get /metrics") {
                    Some(IDLE)
                } else {
                    answer
                }) else {
                    std::future::pending::<()>().await;
                    return;
                };
                let _ = conn.write_all(answer).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    addr
}

/// Reads one HTTP/1.1 request off `conn`, body and all (so that a close
/// after it is a clean one: unread bytes would make it a reset), and
/// returns its head in lower case; None if the peer closed first.
pub(crate) async fn read_request(conn: &mut TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = conn.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = conn.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(head)
}

/// Requests sent straight to `engine` (another gateway's traffic), once at
/// least `waiting` of them queue in it. Abort the handles to let them go.
pub(crate) async fn backlog(
    engine: &SocketAddr,
    requests: usize,
    waiting: f64,
) -> Vec<tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>> {
    let client = reqwest::Client::new();
    let url = format!("http://{engine}/v1/chat/completions");
    let body = serde_json::json!({"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "backlog"}]});
    let handles = (0..requests)
        .map(|_| tokio::spawn(client.post(&url).json(&body).send()))
        .collect();
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while metric(engine, "vllm:num_requests_waiting").await < waiting {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the backlog queued in the engine");
    handles
}

/// The ids of a `/v1/models` answer.
pub(crate) fn model_ids(models: &serde_json::Value) -> Vec<&str> {
    models["data"].as_array().map_or_else(Vec::new, |a| {
        a.iter().filter_map(|m| m["id"].as_str()).collect()
    })
}

/// A router view with `models` catalogued and each of `serving` (model,
/// engine address) a ready replica of it.
/// When [`router_view`]'s catalog was added (2026-11-30T00:00:00Z).
pub(crate) const ADDED_MS: i64 = 1_796_083_200_000;

pub(crate) fn router_view(
    models: Vec<llmgw_domain::catalog::Model>,
    serving: &[(&str, SocketAddr)],
) -> llmgw_projections::RouterView {
    use llmgw_domain::Event;
    use llmgw_domain::catalog::{CatalogEvent, Engine, Profile};
    use llmgw_domain::nodes::{Inventory, NodeEvent};
    use llmgw_domain::replicas::{Placement, ReplicaEvent, ShardPlacement};
    use llmgw_projections::{RouterView, Stamp, View};

    let mut view = RouterView::default();
    let mut apply = |e: Event| {
        view.apply_event(
            Stamp {
                position: 0,
                recorded_at_ms: ADDED_MS,
            },
            &e,
        )
    };
    let profile = Profile::cpu("sim", Engine::Sim);
    let fp = profile.fingerprint();
    for mut model in models {
        if model.profiles.is_empty() {
            model.profiles.push(profile.clone());
        }
        apply(Event::Catalog(CatalogEvent::ModelAdded { model }));
    }
    apply(Event::Node(NodeEvent::NodeRegistered {
        node_id: "n1".into(),
        inventory: Inventory {
            hostname: "n1".into(),
            mgmt_addr: "127.0.0.1".into(),
            ..Inventory::default()
        },
    }));
    for (i, (model, addr)) in serving.iter().enumerate() {
        let id = format!("r{i}");
        apply(Event::Replica(ReplicaEvent::ReplicaPlaced(Placement {
            replica_id: id.clone().into(),
            model: (*model).into(),
            profile: "sim".into(),
            profile_fp: fp.clone(),
            pool: "cpu".into(),
            fabric: None,
            shards: vec![ShardPlacement {
                shard_id: format!("{id}-0").into(),
                rank: 0,
                node_id: "n1".into(),
                gpu_indices: vec![],
                hcas: vec![],
                port: addr.port(),
                memory_mb: 0,
            }],
            why: "test".into(),
        })));
        apply(Event::Replica(ReplicaEvent::ReplicaReady {
            replica_id: id.into(),
        }));
    }
    view
}

/// An empty SQLite log, removed when the scratch is dropped.
pub(crate) async fn sqlite_log() -> (llmgw_eventstore::AnyStore, llmgw_testkit::Scratch) {
    use llmgw_eventstore::{AnyStore, OpenOptions, StoreAddress};
    let (address, scratch) = llmgw_testkit::Scratch::new(llmgw_testkit::Backend::Sqlite).await;
    let store = AnyStore::open(
        &StoreAddress::parse(&address).unwrap(),
        OpenOptions::migrating(),
    )
    .await
    .unwrap();
    (store, scratch)
}

/// A usage event's rows as JSON objects, whichever shape it was stored in
/// (a batch is stored in columns).
pub(crate) fn usage_rows(e: &llmgw_eventstore::RecordedEvent) -> Vec<serde_json::Value> {
    let decoded = llmgw_domain::Event::decode(&e.event_type, e.schema_version, &e.payload);
    let Ok(llmgw_domain::Event::Usage(u)) = decoded else {
        panic!("not a usage event: {e:?}")
    };
    (u.rows().iter())
        .map(|r| serde_json::to_value(r).unwrap())
        .collect()
}
