//! Export, verify and import speed over 1,000,000 events on each backend,
//! printed as events/s: what `llmgw events export`, `events verify` and
//! `events import` do, through the same library calls.
//!
//! Run: `cargo bench -p llmgw-eventstore --bench export_verify` (PostgreSQL
//! from DATABASE_URL, else 127.0.0.1:5432; each run uses fresh databases).
//!
//! The log is usage records (as a busy cluster's is) over 200 streams,
//! about 580 bytes a line once exported. Baseline: reading the same events
//! page by page without doing anything with them, in the same run; `ratio`
//! is the measured operation's throughput over it.

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark program; a failure should stop it loudly"
)]

use std::io::{BufRead, BufReader, BufWriter};
use std::time::{Duration, Instant};

use llmgw_eventstore::{
    AnyStore, ChainCheck, DEFAULT_PAGE, EventStore, ExpectedVersion, ImportOptions, NewEvent,
    OpenOptions, RecordedEvent, StoreAddress, StreamAppend, Writer,
};
use llmgw_testkit::{Backend, Scratch};
use serde_json::json;
use sqlx::Executor;

const EVENTS: u64 = 1_000_000;
const BATCH: u64 = 1000;
const STREAMS: u64 = 200;

fn usage(i: u64) -> NewEvent {
    NewEvent::new(
        "UsageRecorded",
        1,
        json!({
            "request_id": format!("req-{i:010}"),
            "key_id": format!("k{}", i % STREAMS),
            "project_id": format!("p{}", i % 20),
            "model": "llama-3.1-8b",
            "served_model": "llama-3.1-8b",
            "prompt_tokens": 512 + i % 97,
            "completion_tokens": 128 + i % 31,
            "cost_micros": 1234 + i % 1000,
            "latency_ms": 180 + i % 500,
            "status": 200,
        }),
    )
    .with_metadata(json!({"actor": "gw-1", "actor_kind": "gateway", "writer": "gw-1"}))
}

async fn open(address: &str) -> AnyStore {
    AnyStore::open(
        &StoreAddress::parse(address).unwrap(),
        OpenOptions::migrating(),
    )
    .await
    .unwrap()
}

async fn fill(store: &AnyStore) {
    let lease = store
        .acquire_lease("bench", Duration::from_secs(3600))
        .await
        .unwrap();
    let w = Writer::Leader(lease.token.clone());
    for b in 0..EVENTS / BATCH {
        let events = (b * BATCH..(b + 1) * BATCH).map(usage).collect();
        let stream = format!("usage-k{}", b % STREAMS);
        store
            .append(
                &w,
                &[StreamAppend::new(stream, ExpectedVersion::Any, events)],
            )
            .await
            .unwrap();
    }
    store.release_lease(&lease.token).await.unwrap();
}

/// Vacuums and checkpoints, so that the load's autovacuum or checkpoint
/// does not land in a measurement's window.
async fn settle(store: &AnyStore) {
    match store {
        AnyStore::Postgres(s) => {
            for sql in ["VACUUM (ANALYZE) es_events", "CHECKPOINT"] {
                s.pool().execute(sql).await.unwrap();
            }
        }
        AnyStore::Sqlite(s) => {
            s.pool()
                .execute("PRAGMA wal_checkpoint(TRUNCATE)")
                .await
                .unwrap();
        }
    }
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

async fn run(backend: Backend) {
    let name = match backend {
        Backend::Postgres => "postgres",
        Backend::Sqlite => "sqlite  ",
    };
    let (address, _scratch) = Scratch::new(backend).await;
    let store = open(&address).await;
    let t = Instant::now();
    fill(&store).await;
    println!(
        "{name} generated {EVENTS} events in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    settle(&store).await;

    // Baseline: the same pages read and dropped.
    let t = Instant::now();
    let mut after = 0;
    loop {
        let page = store.read_all_raw(after, DEFAULT_PAGE).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.position;
    }
    let reading = rate(EVENTS, t.elapsed());
    println!("{name} read   {EVENTS} events: {reading:>7.0} events/s (baseline)");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("export.jsonl");
    let t = Instant::now();
    let mut sink = BufWriter::with_capacity(1 << 20, std::fs::File::create(&path).unwrap());
    let done = llmgw_eventstore::export(&store, 1, None, &mut sink)
        .await
        .unwrap();
    drop(sink);
    let took = t.elapsed();
    assert_eq!(done.events, EVENTS);
    let bytes = std::fs::metadata(&path).unwrap().len();
    println!(
        "{name} export {EVENTS} events in {:>5.1} s: {:>7.0} events/s, {:.0} MB/s, {} bytes a line (ratio {:.2})",
        took.as_secs_f64(),
        rate(EVENTS, took),
        bytes as f64 / took.as_secs_f64() / 1e6,
        bytes / EVENTS,
        rate(EVENTS, took) / reading
    );

    let t = Instant::now();
    let report = store.verify(1, None).await.unwrap();
    let took = t.elapsed();
    assert!(report.is_ok() && report.checked == EVENTS, "{report:?}");
    println!(
        "{name} verify {EVENTS} events in {:>5.1} s: {:>7.0} events/s (ratio {:.2})",
        took.as_secs_f64(),
        rate(EVENTS, took),
        rate(EVENTS, took) / reading
    );

    // The file on its own: parsing every line and checking its place in
    // the chain, as an import does before it writes.
    let t = Instant::now();
    let mut check = ChainCheck::new(None, &[]);
    for line in BufReader::with_capacity(1 << 20, std::fs::File::open(&path).unwrap()).lines() {
        let e: RecordedEvent = serde_json::from_str(&line.unwrap()).unwrap();
        check.push(&e).unwrap();
    }
    let took = t.elapsed();
    println!(
        "{name} check  {EVENTS} lines  in {:>5.1} s: {:>7.0} events/s (the file alone)",
        took.as_secs_f64(),
        rate(EVENTS, took)
    );

    // Into a fresh store of the same backend, in one transaction.
    let (copy_address, _copy_scratch) = Scratch::new(backend).await;
    let copy = open(&copy_address).await;
    let t = Instant::now();
    let lease = copy
        .acquire_lease("import", Duration::from_secs(3600))
        .await
        .unwrap();
    let lines = BufReader::with_capacity(1 << 20, std::fs::File::open(&path).unwrap())
        .lines()
        .map(|l| Ok(serde_json::from_str::<RecordedEvent>(&l.unwrap()).unwrap()));
    let imported = copy
        .import(&lease.token, &ImportOptions::default(), lines)
        .await
        .unwrap();
    let took = t.elapsed();
    assert_eq!(imported.written, EVENTS);
    assert_eq!(copy.head().await.unwrap(), store.head().await.unwrap());
    println!(
        "{name} import {EVENTS} events in {:>5.1} s: {:>7.0} events/s (one transaction)",
        took.as_secs_f64(),
        rate(EVENTS, took)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    run(Backend::Postgres).await;
    run(Backend::Sqlite).await;
}
