//! Page render times on a big installation: 1,000,000 events in the log and
//! 10,000 keys in the views, p50 and p99 per page (aim: p50 under 50 ms).
//!
//! Run: `cargo bench -p llmgw-web --bench pages` (both backends), or add
//! `-- sqlite` or `-- postgres` for one. To keep the filled log between
//! runs, name a store: `LLMGW_BENCH_SQLITE=/tmp/pages.db`,
//! `LLMGW_BENCH_POSTGRES=postgres://…/an_empty_database` (filled up to a
//! million events the first time, reused as it is after; its usage then
//! ends when it was filled, not when the run starts).
//!
//! Each request goes through the admin listener's router (`admin_routes`,
//! no sign-in) in-process, body included, so a figure is what the server
//! spends on the page. The log is mostly usage, as a busy cluster's is,
//! with node churn, replica changes and tenancy mixed in, every event with
//! the decider's metadata (writer, actor, actor kind).
//!
//! Adding a page: write a `fn NAME_cases(fx: &Fixture) -> Vec<Case>` and
//! list it in `cases`.
//!
//! Usage is recorded one request a second up to the moment the benchmark
//! starts, so the usage charts (which end now) are full.

#![allow(
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a benchmark program; a failure should stop it loudly"
)]

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use llmgw_domain::Event;
use llmgw_domain::catalog::{CatalogEvent, Engine, Model, Profile};
use llmgw_domain::nodes::{Gpu, Inventory, NodeEvent};
use llmgw_domain::replicas::{Placement, ReplicaEvent, ShardPlacement, ShardState};
use llmgw_domain::tenancy::{Band, Key, TenancyEvent};
use llmgw_domain::usage::{UsageEvent, UsageRecorded};
use llmgw_eventstore::{
    AnyStore, EventStore, ExpectedVersion, NewEvent, OpenOptions, StoreAddress, StreamAppend,
    Writer,
};
use llmgw_projections::Projections;
use llmgw_testkit::{Backend, Scratch};
use llmgw_web::{Web, WebSettings};
use serde_json::{Value, json};
use tower::ServiceExt;

const EVENTS: u64 = 1_000_000;
const BATCH: u64 = 1000;
const KEYS: u64 = 10_000;
const USERS: u64 = 200;
const MODELS: u64 = 20;
const NODES: u64 = 50;
const REPLICAS: u64 = 100;
/// Requests per case, after a few to warm up.
const RUNS: usize = 100;

/// One page request to time.
struct Case {
    page: &'static str,
    name: String,
    path: String,
    /// Requests to warm up, and requests timed.
    warm: usize,
    runs: usize,
}

impl Case {
    fn new(page: &'static str, name: &str, path: impl Into<String>) -> Case {
        Case {
            page,
            name: name.to_owned(),
            path: path.into(),
            warm: 5,
            runs: RUNS,
        }
    }

    /// A page that takes seconds by design (it reads the whole log):
    /// timed a few times, without warming up.
    fn slow(page: &'static str, name: &str, path: impl Into<String>) -> Case {
        Case {
            warm: 0,
            runs: 3,
            ..Case::new(page, name, path)
        }
    }
}

/// What the cases may refer to.
struct Fixture {
    router: Router,
    head: u64,
}

fn cases(fx: &Fixture) -> Vec<Case> {
    let mut all = Vec::new();
    all.extend(admin_cases(fx));
    all.extend(events_cases(fx));
    all
}

/// The dashboard (10,000 keys sorted by spend, a page shown), the people
/// and the usage charts.
fn admin_cases(_fx: &Fixture) -> Vec<Case> {
    vec![
        Case::new("/admin", "first page", "/admin"),
        Case::new("/admin", "keys page 150 (the last)", "/admin?page=150"),
        Case::new("/admin/users", "first page", "/admin/users"),
        Case::new(
            "/admin/usage",
            "by project, 7d (3-hour bars)",
            "/admin/usage",
        ),
        Case::new(
            "/admin/usage",
            "by person, 24h (hourly bars)",
            "/admin/usage?by=person&range=24h",
        ),
        Case::new(
            "/admin/usage",
            "by person, 30d (daily bars)",
            "/admin/usage?by=person&range=30d",
        ),
        Case::new(
            "/admin/usage",
            "by org, 365d (weekly bars)",
            "/admin/usage?by=org&range=365d",
        ),
    ]
}

fn events_cases(fx: &Fixture) -> Vec<Case> {
    let p = "/admin/events";
    vec![
        Case::new(p, "first page", p),
        Case::new(
            p,
            "type=NodeUnreachable (1 in 1000)",
            format!("{p}?type=NodeUnreachable"),
        ),
        Case::new(
            p,
            "type=KeyIssued (none near the head)",
            format!("{p}?type=KeyIssued"),
        ),
        Case::new(p, "actor=cp-1", format!("{p}?actor=cp-1")),
        Case::new(
            p,
            "actor=alice (none near the head)",
            format!("{p}?actor=alice"),
        ),
        Case::new(
            p,
            "to=2000-01-01 (nothing that old)",
            format!("{p}?to=2000-01-01"),
        ),
        Case::new(p, "stream=node-n7 (exact)", format!("{p}?stream=node-n7")),
        Case::new(p, "stream=node-* (prefix)", format!("{p}?stream=node-*")),
        Case::new(
            p,
            "stream=usage-k42 (a long stream)",
            format!("{p}?stream=usage-k42"),
        ),
        Case::new(
            p,
            "thing=node:n7 (node, replicas, audit)",
            format!("{p}?thing=node:n7"),
        ),
        Case::new(p, "thing=model:model-3", format!("{p}?thing=model:model-3")),
        Case::new(
            p,
            "thing=user:u7 (and their keys)",
            format!("{p}?thing=user:u7"),
        ),
        Case::new(p, "deep page, before=500000", format!("{p}?before=500000")),
        Case::new(p, "deep page, before=20000", format!("{p}?before=20000")),
        Case::new(
            p,
            "deep filtered, type=NodeRecovered&before=300000",
            format!("{p}?type=NodeRecovered&before=300000"),
        ),
        Case::new(
            p,
            "thing=key:k42&before=(middle)",
            format!("{p}?thing=key:k42&before={}", fx.head / 2),
        ),
        Case::new(
            "/admin/events/replay",
            "view=cluster at the head (from the views)",
            "/admin/events/replay?view=cluster",
        ),
        Case::slow(
            "/admin/events/replay",
            "view=tenancy&until=500000 (500,000 events)",
            "/admin/events/replay?view=tenancy&until=500000",
        ),
        Case::slow(
            "/admin/events/verify",
            "the whole chain",
            "/admin/events/verify",
        ),
    ]
}

fn operator(name: &str) -> Value {
    json!({"writer": "cp-1", "actor": name, "actor_kind": "operator", "command_id": "c"})
}

fn leader() -> Value {
    json!({"writer": "cp-1", "actor": "cp-1", "actor_kind": "leader", "command_id": "c"})
}

fn gateway() -> Value {
    json!({"writer": "gw-1", "actor": "gw-1", "actor_kind": "gateway", "command_id": "c"})
}

fn gpu(index: u32) -> Gpu {
    Gpu {
        index,
        uuid: format!("GPU-{index}"),
        class: "h100-80g".into(),
        memory_mb: 81_920,
        nvlink_peers: Vec::new(),
        problems: Vec::new(),
    }
}

fn placement(r: u64) -> Placement {
    let node = format!("n{}", r % NODES);
    Placement {
        replica_id: format!("r-{r:04}").into(),
        model: format!("model-{}", r % MODELS),
        profile: "p".into(),
        profile_fp: "fp".into(),
        pool: "default".into(),
        fabric: None,
        shards: vec![ShardPlacement {
            shard_id: format!("r-{r:04}-0").into(),
            rank: 0,
            node_id: node.into(),
            gpu_indices: vec![0],
            hcas: Vec::new(),
            port: 8000,
            memory_mb: 0,
        }],
        why: "bench".into(),
    }
}

fn setup_events() -> Vec<(Event, Value)> {
    let mut out = Vec::new();
    for m in 0..MODELS {
        let model = Model::named(&format!("model-{m}"));
        out.push((
            Event::Catalog(CatalogEvent::ModelAdded { model }),
            operator("alice"),
        ));
    }
    // Wants a replica and fits on no node: the dashboard explains why.
    let mut huge = Model::named("huge");
    huge.scaling.min = 1;
    let mut profile = Profile::cpu("h100x16", Engine::Vllm);
    profile.gpu_class = Some("h100-80g".into());
    profile.gpus_per_node = 16;
    profile.tp = 16;
    huge.profiles.push(profile);
    out.push((
        Event::Catalog(CatalogEvent::ModelAdded { model: huge }),
        operator("alice"),
    ));
    for n in 0..NODES {
        out.push((
            Event::Node(NodeEvent::NodeRegistered {
                node_id: format!("n{n}").into(),
                inventory: Inventory {
                    hostname: format!("n{n}"),
                    gpus: (0..8).map(gpu).collect(),
                    ..Inventory::default()
                },
            }),
            leader(),
        ));
    }
    out.push((
        Event::Tenancy(TenancyEvent::OrgCreated {
            org_id: "o".into(),
            name: "o".into(),
        }),
        operator("alice"),
    ));
    out.push((
        Event::Tenancy(TenancyEvent::TeamCreated {
            team_id: "t".into(),
            org_id: "o".into(),
            name: "t".into(),
        }),
        operator("alice"),
    ));
    for p in 0..20 {
        out.push((
            Event::Tenancy(TenancyEvent::ProjectCreated {
                project_id: format!("p{p}"),
                team_id: "t".into(),
                name: "p".into(),
            }),
            operator("alice"),
        ));
    }
    for u in 0..USERS {
        let user_id = format!("u{u}");
        out.push((
            Event::Tenancy(TenancyEvent::UserSignedUp {
                user_id: user_id.clone(),
            }),
            operator(&user_id),
        ));
        out.push((
            Event::Tenancy(TenancyEvent::UserApproved {
                user_id,
                project_id: format!("p{}", u % 20),
                by: "alice".into(),
            }),
            operator("alice"),
        ));
    }
    for k in 0..KEYS {
        // Every fifth key is a person's own, made on their profile page.
        let owner = k.is_multiple_of(5).then(|| format!("u{}", k / 5 % USERS));
        let by = owner.clone().unwrap_or_else(|| "bob".into());
        out.push((
            Event::Tenancy(TenancyEvent::KeyIssued(Key {
                key_id: format!("k{k}"),
                project_id: format!("p{}", k % 20),
                name: format!("key {k}"),
                hash: format!("{k:064x}"),
                prefix: "llmgw-".into(),
                band: Band::Silver,
                routing_profile: None,
                revoked: false,
                owner,
                claim_by: None,
                expires_at: None,
                previous: None,
            })),
            operator(&by),
        ));
    }
    for r in 0..REPLICAS {
        out.push((
            Event::Replica(ReplicaEvent::ReplicaPlaced(placement(r))),
            leader(),
        ));
    }
    out
}

fn generated(i: u64) -> (Event, Value) {
    if i.is_multiple_of(500) {
        // Churn: nodes going unreachable and coming back.
        let node_id = format!("n{}", i / 500 % NODES);
        let e = if (i / 500).is_multiple_of(2) {
            NodeEvent::NodeUnreachable {
                node_id: node_id.into(),
            }
        } else {
            NodeEvent::NodeRecovered {
                node_id: node_id.into(),
            }
        };
        return (Event::Node(e), leader());
    }
    if i % 500 == 250 {
        let r = i / 500 % REPLICAS;
        return (
            Event::Replica(ReplicaEvent::ShardStateChanged {
                replica_id: format!("r-{r:04}").into(),
                shard_id: format!("r-{r:04}-0").into(),
                state: ShardState::Ready,
                error: None,
                exit_code: None,
                log_tail: None,
            }),
            leader(),
        );
    }
    // Usage over the first 1000 keys, so that some streams are long.
    let k = i % 1000;
    (
        Event::Usage(UsageEvent::UsageRecorded(UsageRecorded {
            request_id: format!("req-{i}"),
            key_id: format!("k{k}").into(),
            project_id: format!("p{}", k % 20).into(),
            model_asked: format!("model-{}", i % MODELS).into(),
            model_served: format!("model-{}", i % MODELS).into(),
            prompt_tokens: 100 + i % 900,
            completion_tokens: 50 + i % 200,
            cost_micros: 42,
            status: if i.is_multiple_of(97) { 500 } else { 200 },
            latency_ms: (200 + i % 2000) as u32,
            ttft_ms: Some((20 + i % 200) as u32),
            band: Band::Silver,
            at: llmgw_domain::UnixMillis(usage_epoch() + (i as i64) * 1000),
        })),
        gateway(),
    )
}

/// When the first generated request was made: as long before the
/// benchmark started as the log has requests, one a second.
fn usage_epoch() -> i64 {
    static EPOCH: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(|| chrono::Utc::now().timestamp_millis() - EVENTS as i64 * 1000)
}

/// Appends the log in batches of a thousand straight through the store
/// (the replay benchmark's loader, with metadata).
async fn fill(store: &AnyStore) {
    let lease = store
        .acquire_lease("bench", Duration::from_secs(3600))
        .await
        .unwrap();
    let w = Writer::Leader(lease.token);
    let mut pending = setup_events();
    let mut i = 0;
    while store.head().await.unwrap().0 < EVENTS {
        while (pending.len() as u64) < BATCH {
            pending.push(generated(i));
            i += 1;
        }
        // Consecutive events of one stream travel together; a stream that
        // comes back later in the batch starts a new append.
        let mut batch: Vec<StreamAppend> = Vec::new();
        for (e, metadata) in pending.drain(..) {
            let (kind, version, payload) = e.encode();
            let stream = e.stream_id();
            let event = NewEvent::new(kind, version, payload).with_metadata(metadata);
            if batch.iter().any(|s| s.stream_id == stream) {
                store.append(&w, &batch).await.unwrap();
                batch.clear();
            }
            batch.push(StreamAppend::new(stream, ExpectedVersion::Any, vec![event]));
        }
        store.append(&w, &batch).await.unwrap();
    }
}

async fn views_of(store: &AnyStore, head: u64) -> Projections {
    let mut p = Projections::default();
    let mut reader = llmgw_eventstore::PageReader::new(store.clone(), 0, 1000);
    while p.checkpoint.position < head {
        for e in reader.next_page().await.unwrap() {
            p.apply(&e);
        }
    }
    p
}

async fn get(router: &Router, path: &str) -> (StatusCode, usize) {
    let response = router
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, body.len())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

async fn run(backend: Backend) {
    let name = format!("{backend:?}").to_lowercase();
    // A store named in the environment is kept and reused: filling a
    // million events takes minutes (twenty on a busy PostgreSQL).
    let kept = std::env::var(format!("LLMGW_BENCH_{}", name.to_uppercase())).ok();
    let (address, _scratch) = match kept {
        Some(address) => (address, None),
        None => {
            let (address, scratch) = Scratch::new(backend).await;
            (address, Some(scratch))
        }
    };
    let store = AnyStore::open(
        &StoreAddress::parse(&address).unwrap(),
        OpenOptions::migrating(),
    )
    .await
    .unwrap();
    let t = Instant::now();
    fill(&store).await;
    let (head, _) = store.head().await.unwrap();
    println!(
        "{name}: {head} events appended in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let views = views_of(&store, head).await;
    println!(
        "{name}: views built in {:.0} s ({} keys)",
        t.elapsed().as_secs_f64(),
        views.tenancy.tenancy.keys.len()
    );
    let gateway =
        llmgw_gateway::Gateway::new(llmgw_gateway::GatewayConfig::default(), None).unwrap();
    let web = Arc::new(Web {
        settings: WebSettings::default(),
        views: Arc::new(RwLock::new(views)),
        store: Some(store),
        people: None,
        gateway,
        admin: Router::new(),
        decider: None,
        instance: "bench".into(),
    });
    let fx = Fixture {
        router: llmgw_web::admin_routes(web),
        head,
    };
    println!(
        "{:<21} {:<50} {:>9} {:>9} {:>9}",
        "PAGE", "CASE", "P50 ms", "P99 ms", "BYTES"
    );
    for case in cases(&fx) {
        let mut bytes = 0;
        for _ in 0..case.warm {
            get(&fx.router, &case.path).await;
        }
        let mut times = Vec::with_capacity(case.runs);
        for _ in 0..case.runs {
            let t = Instant::now();
            let (status, len) = get(&fx.router, &case.path).await;
            times.push(t.elapsed());
            assert_eq!(status, StatusCode::OK, "{}", case.path);
            bytes = len;
        }
        times.sort();
        println!(
            "{:<21} {:<50} {:>9.1} {:>9.1} {:>9}",
            case.page,
            case.name,
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            bytes
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let only = |b: &str| {
        !args.iter().any(|a| a == "sqlite" || a == "postgres") || args.iter().any(|a| a == b)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if only("sqlite") {
            run(Backend::Sqlite).await;
        }
        if only("postgres") {
            run(Backend::Postgres).await;
        }
    });
}
