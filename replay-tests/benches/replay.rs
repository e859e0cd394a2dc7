//! Replays 1,000,000 generated events from each backend into all views and
//! prints events/s and the process's peak memory.
//!
//! Run: `cargo bench -p llmgw-replay-tests --bench replay`
//! (`LLMGW_BENCH_EVENTS=300000` for a smaller log).
//! The log is mostly usage (as a busy cluster's is) over 200 keys and 20
//! models, with catalog, node, replica and tenancy changes mixed in.
//!
//! Measured in the same run, on the same log:
//! - the bare read ceiling: the same columns read in position order with
//!   nothing decoded (PostgreSQL: `COPY … TO STDOUT (FORMAT binary)`, the
//!   bytes counted and dropped; SQLite: every row and column read by the
//!   engine in one statement that hands over only a count);
//! - the previous replay path: `read_all` pages of 1000 (payloads parsed
//!   into `serde_json::Value`, metadata and hashes too) applied with
//!   `Projections::apply`;
//! - the text pages alone: `read_text_page` pages of `REPLAY_PAGE`, read
//!   one after the other, each reusing the last one's memory, nothing
//!   decoded;
//! - replay as the runner does it: `DecodingReader` pages of `REPLAY_PAGE`
//!   `TextPage`s decoded straight into typed events from the page's text
//!   in a decoding task, applied with `Projections::apply_decoded` while
//!   the next page is read and decoded, each applied page handed back;
//! - then a decider taking office on the same log (its state as of the
//!   head, read from the first event).

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark program; a failure should stop it loudly"
)]

use std::time::{Duration, Instant};

use llmgw_domain::Event;
use llmgw_domain::catalog::{CatalogEvent, Model, Price};
use llmgw_domain::nodes::{Inventory, NodeEvent};
use llmgw_domain::tenancy::{Band, Key, TenancyEvent};
use llmgw_domain::usage::{UsageEvent, UsageRecorded};
use llmgw_eventstore::{
    AnyStore, EventStore, ExpectedVersion, NewEvent, OpenOptions, StoreAddress, StreamAppend,
    Writer,
};
use llmgw_projections::Projections;
use llmgw_testkit::{Backend, Scratch};

fn events() -> u64 {
    std::env::var("LLMGW_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}
const BATCH: u64 = 1000;
const KEYS: u64 = 200;
const MODELS: u64 = 20;

fn setup_events() -> Vec<Event> {
    let mut out = Vec::new();
    for m in 0..MODELS {
        let mut model = Model::named(&format!("model-{m}"));
        model.price = Some(Price {
            prompt_per_1k: 100,
            completion_per_1k: 300,
        });
        out.push(Event::Catalog(CatalogEvent::ModelAdded { model }));
    }
    for n in 0..50 {
        out.push(Event::Node(NodeEvent::NodeRegistered {
            node_id: format!("n{n}").into(),
            inventory: Inventory {
                hostname: format!("n{n}"),
                ..Inventory::default()
            },
        }));
    }
    out.push(Event::Tenancy(TenancyEvent::OrgCreated {
        org_id: "o".into(),
        name: "o".into(),
    }));
    out.push(Event::Tenancy(TenancyEvent::TeamCreated {
        team_id: "t".into(),
        org_id: "o".into(),
        name: "t".into(),
    }));
    for p in 0..20 {
        out.push(Event::Tenancy(TenancyEvent::ProjectCreated {
            project_id: format!("p{p}"),
            team_id: "t".into(),
            name: "p".into(),
        }));
    }
    for k in 0..KEYS {
        out.push(Event::Tenancy(TenancyEvent::KeyIssued(Key {
            key_id: format!("k{k}"),
            project_id: format!("p{}", k % 20),
            name: "k".into(),
            hash: format!("{k:064x}"),
            prefix: "llmgw-".into(),
            band: Band::Silver,
            routing_profile: None,
            revoked: false,
            owner: None,
            claim_by: None,
            expires_at: None,
            previous: None,
        })));
    }
    out
}

fn generated(i: u64) -> Event {
    if i.is_multiple_of(500) {
        // Churn: nodes going unreachable and coming back.
        let node_id = format!("n{}", i / 500 % 50);
        return if (i / 500).is_multiple_of(2) {
            Event::Node(NodeEvent::NodeUnreachable {
                node_id: node_id.into(),
            })
        } else {
            Event::Node(NodeEvent::NodeRecovered {
                node_id: node_id.into(),
            })
        };
    }
    let k = i % KEYS;
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
        at: llmgw_domain::UnixMillis(1_796_029_200_000 + (i as i64) * 1000),
    }))
}

async fn fill(store: &AnyStore) {
    let lease = store
        .acquire_lease("bench", Duration::from_secs(3600))
        .await
        .unwrap();
    let w = Writer::Leader(lease.token);
    let mut pending: Vec<Event> = setup_events();
    let mut i = 0;
    let total = events();
    while store.head().await.unwrap().0 < total {
        while (pending.len() as u64) < BATCH {
            pending.push(generated(i));
            i += 1;
        }
        // Consecutive events of one stream travel together; a stream that
        // comes back later in the batch starts a new append.
        let mut batch: Vec<StreamAppend> = Vec::new();
        for e in pending.drain(..) {
            let (kind, version, payload) = e.encode();
            let stream = e.stream_id();
            let event = NewEvent::new(kind, version, payload);
            if batch.iter().any(|s| s.stream_id == stream) {
                store.append(&w, &batch).await.unwrap();
                batch.clear();
            }
            batch.push(StreamAppend::new(stream, ExpectedVersion::Any, vec![event]));
        }
        store.append(&w, &batch).await.unwrap();
    }
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

async fn run(backend: Backend) {
    let (address, _scratch) = Scratch::new(backend).await;
    let store = AnyStore::open(
        &StoreAddress::parse(&address).unwrap(),
        OpenOptions::migrating(),
    )
    .await
    .unwrap();
    let t = Instant::now();
    fill(&store).await;
    let (head, _) = store.head().await.unwrap();
    let name = format!("{backend:?}").to_lowercase();
    println!(
        "{name:<8} generated {head} events in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // As a long-running store is: checkpointed, vacuumed, and in the page
    // cache (one untimed read), so that no phase pays for an earlier one.
    match &store {
        AnyStore::Postgres(s) => {
            for sql in ["VACUUM (ANALYZE) es_events", "CHECKPOINT"] {
                sqlx::query(sql).execute(s.pool()).await.unwrap();
            }
        }
        AnyStore::Sqlite(s) => {
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(s.pool())
                .await
                .unwrap();
        }
    }
    bare_read(&store, head).await;
    let server = Server::of(&store).await;
    let clock = Clock::start(&server).await;
    let bytes = bare_read(&store, head).await;
    let ceiling = clock.stop(&server, head).await;
    println!(
        "{name:<8} bare read (ceiling)     {}  ({:.0} MB read)",
        ceiling.show(),
        bytes as f64 / 1e6
    );

    let clock = Clock::start(&server).await;
    let mut after = 0;
    let mut page = llmgw_eventstore::TextPage::default();
    while after < head {
        page = store
            .read_text_page(after, llmgw_projections::REPLAY_PAGE, page)
            .await
            .unwrap();
        after = page.last_position().unwrap();
    }
    let text = clock.stop(&server, head).await;
    println!("{name:<8} read as text, no decode {}", text.show());

    let clock = Clock::start(&server).await;
    let mut old = Projections::default();
    let mut reader = llmgw_eventstore::PageReader::new(store.clone(), 0, 1000);
    while old.checkpoint.position < head {
        for e in reader.next_page().await.unwrap() {
            old.apply(&e);
        }
    }
    let value_path = clock.stop(&server, head).await;
    println!(
        "{name:<8} replay, Value path       {}  (previous code, baseline)",
        value_path.show()
    );

    let clock = Clock::start(&server).await;
    let mut p = Projections::default();
    let mut reader = llmgw_eventstore::DecodingReader::new(
        store.clone(),
        0,
        llmgw_projections::REPLAY_PAGE,
        llmgw_projections::decode_text,
    );
    while p.checkpoint.position < head {
        let page = reader.next_page().await.unwrap();
        for d in &page {
            p.apply_decoded(d);
        }
        reader.recycle(page);
    }
    let typed = clock.stop(&server, head).await;
    assert!(p == old, "both paths build the same views");
    println!("{name:<8} replay, typed from text  {}", typed.show());
    println!(
        "{name:<8} typed replay: {:.2} of the ceiling and {:.2}x the Value path by wall clock, \
         {:.2} of the ceiling and {:.2}x the Value path by CPU; peak RSS {:.0} MB for {head} events; \
         {} models, {} keys in the usage view; load average {}",
        typed.rate() / ceiling.rate(),
        typed.rate() / value_path.rate(),
        ceiling.cpu_per_event() / typed.cpu_per_event(),
        value_path.cpu_per_event() / typed.cpu_per_event(),
        peak_rss_mb(),
        p.usage.models.len(),
        p.usage
            .spend
            .get(&llmgw_domain::tenancy::Scope::Key)
            .map_or(0, |m| m.len()),
        load_average(),
    );

    // A decider taking office on the same log: its state as of the head.
    let clock = Clock::start(&server).await;
    let decider = llmgw_decider::Decider::new(store.clone(), "bench".into());
    let nodes = decider.read(|s| s.nodes.nodes.len()).await.unwrap();
    let office = clock.stop(&server, head).await;
    println!(
        "{name:<8} decider taking office  {}  ({nodes} nodes)",
        office.show()
    );
}

/// The PostgreSQL server processes serving this benchmark's database, whose
/// CPU time counts with ours: on one machine they share the cores.
struct Server {
    pool: Option<sqlx::PgPool>,
}

impl Server {
    async fn of(store: &AnyStore) -> Server {
        Server {
            pool: match store {
                AnyStore::Postgres(s) => Some(s.pool().clone()),
                AnyStore::Sqlite(_) => None,
            },
        }
    }

    /// CPU seconds used so far by the backends of this database.
    async fn cpu(&self) -> f64 {
        let Some(pool) = &self.pool else {
            return 0.0;
        };
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        pids.into_iter()
            .map(|pid| cpu_of(&format!("/proc/{pid}/stat")))
            .sum()
    }
}

/// User + system CPU seconds of a process, from its `stat` file (in clock
/// ticks of 1/100 s, Linux's USER_HZ).
fn cpu_of(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15; the rest starts at field 3.
    (ticks(11) + ticks(12)) / 100.0
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_owned()
}

/// Wall clock and CPU time (ours and the database server's) of one phase.
struct Clock {
    wall: Instant,
    ours: f64,
    server: f64,
}

struct Figures {
    events: u64,
    secs: f64,
    ours: f64,
    server: f64,
}

impl Clock {
    async fn start(server: &Server) -> Clock {
        let server = server.cpu().await;
        Clock {
            wall: Instant::now(),
            ours: cpu_of("/proc/self/stat"),
            server,
        }
    }

    async fn stop(self, server: &Server, events: u64) -> Figures {
        let secs = self.wall.elapsed().as_secs_f64();
        let ours = cpu_of("/proc/self/stat") - self.ours;
        Figures {
            events,
            secs,
            ours,
            server: server.cpu().await - self.server,
        }
    }
}

impl Figures {
    fn rate(&self) -> f64 {
        self.events as f64 / self.secs
    }

    /// CPU seconds per event, ours and the server's together.
    fn cpu_per_event(&self) -> f64 {
        (self.ours + self.server) / self.events as f64
    }

    fn show(&self) -> String {
        format!(
            "{:>8.0} events/s  CPU {:.2} µs/event ({:.2} ours + {:.2} the database's): \
             {:>8.0} events per CPU-second",
            self.rate(),
            self.cpu_per_event() * 1e6,
            self.ours / self.events as f64 * 1e6,
            self.server / self.events as f64 * 1e6,
            1.0 / self.cpu_per_event(),
        )
    }
}

/// Reads the columns replay reads, in position order, decoding nothing.
/// Returns the bytes read.
async fn bare_read(store: &AnyStore, head: u64) -> u64 {
    use futures_util::TryStreamExt;
    match store {
        AnyStore::Postgres(s) => {
            let mut conn = s.pool().acquire().await.unwrap();
            let mut stream = conn
                .copy_out_raw(
                    "COPY (SELECT position, stream_id, stream_version, event_id, event_type,
                                  schema_version, recorded_at, payload
                             FROM es_events ORDER BY position) TO STDOUT (FORMAT binary)",
                )
                .await
                .unwrap();
            let mut bytes = 0u64;
            while let Some(chunk) = stream.try_next().await.unwrap() {
                bytes += chunk.len() as u64;
            }
            bytes
        }
        AnyStore::Sqlite(s) => {
            // SQLite reading every row in position order and every byte of
            // the columns replay reads, in the engine: nothing is handed over.
            let (n, bytes, _): (i64, i64, i64) = sqlx::query_as(
                "SELECT count(*), sum(length(stream_id || event_id || event_type || payload)),
                        sum(stream_version + schema_version) + max(recorded_at)
                   FROM (SELECT * FROM es_events ORDER BY position)",
            )
            .fetch_one(s.read_pool())
            .await
            .unwrap();
            let (n, bytes) = (n as u64, bytes as u64);
            assert_eq!(n, head);
            bytes
        }
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // LLMGW_BENCH_BACKEND=postgres or sqlite runs one backend only.
    let only = std::env::var("LLMGW_BENCH_BACKEND").ok();
    rt.block_on(async {
        for backend in [Backend::Postgres, Backend::Sqlite] {
            let name = format!("{backend:?}").to_lowercase();
            if only.as_ref().is_none_or(|o| *o == name) {
                run(backend).await;
            }
        }
    });
}

/// The shipped binary's allocator (cli/src/main.rs), so that the figures are its.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
