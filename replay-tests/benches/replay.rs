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
//!   bytes counted and dropped; SQLite: the rows stepped through the driver
//!   and dropped);
//! - the previous replay path: `read_all` pages of 1000 (payloads parsed
//!   into `serde_json::Value`, metadata and hashes too) applied with
//!   `Projections::apply`;
//! - replay as the runner does it: `DecodingReader` pages of `REPLAY_PAGE`
//!   payload texts decoded straight into typed events in the reading task,
//!   applied with `Projections::apply_decoded` while the next page is read.

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
            node_id: format!("n{n}"),
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
        })));
    }
    out
}

fn generated(i: u64) -> Event {
    if i.is_multiple_of(500) {
        // Churn: nodes going unreachable and coming back.
        let node_id = format!("n{}", i / 500 % 50);
        return if (i / 500).is_multiple_of(2) {
            Event::Node(NodeEvent::NodeUnreachable { node_id })
        } else {
            Event::Node(NodeEvent::NodeRecovered { node_id })
        };
    }
    let k = i % KEYS;
    Event::Usage(UsageEvent::UsageRecorded(UsageRecorded {
        request_id: format!("req-{i}"),
        key_id: format!("k{k}"),
        project_id: format!("p{}", k % 20),
        model_asked: format!("model-{}", i % MODELS),
        model_served: format!("model-{}", i % MODELS),
        prompt_tokens: 100 + i % 900,
        completion_tokens: 50 + i % 200,
        cost_micros: 42,
        status: if i.is_multiple_of(97) { 500 } else { 200 },
        latency_ms: (200 + i % 2000) as u32,
        ttft_ms: Some((20 + i % 200) as u32),
        band: Band::Silver,
        at: 1_796_029_200_000 + (i as i64) * 1000,
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

    let t = Instant::now();
    let bytes = bare_read(&store, head).await;
    let ceiling = head as f64 / t.elapsed().as_secs_f64();
    println!(
        "{name:<8} bare read (ceiling)    {ceiling:>8.0} events/s  ({:.0} MB read)",
        bytes as f64 / 1e6
    );

    let t = Instant::now();
    let mut old = Projections::default();
    let mut reader = llmgw_eventstore::PageReader::new(store.clone(), 0, 1000);
    while old.checkpoint.position < head {
        for e in reader.next_page().await.unwrap() {
            old.apply(&e);
        }
    }
    let old_rate = head as f64 / t.elapsed().as_secs_f64();
    println!("{name:<8} replay, Value path      {old_rate:>8.0} events/s  (previous code, baseline)");

    let t = Instant::now();
    let mut p = Projections::default();
    let mut reader = llmgw_eventstore::DecodingReader::new(
        store.clone(),
        0,
        llmgw_projections::REPLAY_PAGE,
        llmgw_projections::decode_text,
    );
    while p.checkpoint.position < head {
        for d in reader.next_page().await.unwrap() {
            p.apply_decoded(&d);
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let rate = head as f64 / secs;
    assert!(p == old, "both paths build the same views");
    println!(
        "{name:<8} replay, typed from text {rate:>8.0} events/s  ({head} events into all views in {secs:.1} s; \
         {:.2} of the ceiling, {:.2}x the Value path); peak RSS {:.0} MB; {} models, {} keys in the usage view",
        rate / ceiling,
        rate / old_rate,
        peak_rss_mb(),
        p.usage.models.len(),
        p.usage
            .spend
            .get(&llmgw_domain::tenancy::Scope::Key)
            .map_or(0, |m| m.len()),
    );
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
            let mut conn = s.read_pool().acquire().await.unwrap();
            let mut rows = sqlx::query(
                "SELECT position, stream_id, stream_version, event_id, event_type,
                        schema_version, recorded_at, payload
                   FROM es_events ORDER BY position",
            )
            .fetch(&mut *conn);
            let (mut n, mut bytes) = (0u64, 0u64);
            while let Some(row) = rows.try_next().await.unwrap() {
                use sqlx::Row;
                n += 1;
                bytes += row.try_get::<&str, _>(7).unwrap().len() as u64;
            }
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
    rt.block_on(async {
        run(Backend::Postgres).await;
        run(Backend::Sqlite).await;
    });
}
