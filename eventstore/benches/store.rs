//! Append and read throughput of both backends, printed as figures.
//!
//! Run: `cargo bench -p llmgw-eventstore --bench store` (PostgreSQL from
//! DATABASE_URL, else 127.0.0.1:5432; each run uses a fresh database).
//!
//! Baseline: the same rows inserted into a plain table with no control row,
//! no version checks and no hash chain, one transaction per batch, measured
//! in the same run; `ratio` is our append's throughput over that baseline.
//!
//! Group commit: with several writers, concurrent appends are written
//! together in one transaction. The `alone` figure is the same writers
//! taking turns (a mutex around each append, so every append is its own
//! transaction, as before group commit), measured in the same run; `x alone`
//! is the grouped throughput over it.

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark program; a failure should stop it loudly"
)]

use std::time::{Duration, Instant};

use llmgw_eventstore::{
    AnyStore, EventStore, ExpectedVersion, NewEvent, OpenOptions, StoreAddress, StreamAppend,
    Writer,
};
use llmgw_testkit::{Backend, Scratch};
use serde_json::json;
use sqlx::Executor;

const BATCHES: [usize; 4] = [1, 10, 100, 1000];

/// `LLMGW_BENCH_BATCHES=1,10` measures only those batch sizes.
fn batches() -> Vec<usize> {
    std::env::var("LLMGW_BENCH_BATCHES")
        .ok()
        .map(|v| v.split(',').filter_map(|b| b.trim().parse().ok()).collect())
        .unwrap_or_else(|| BATCHES.to_vec())
}
const WRITERS: [usize; 2] = [1, 4];
/// Each configuration runs for about this long.
const BUDGET: Duration = Duration::from_millis(1500);
const READ_BACK: u64 = 100_000;

fn payload(i: usize) -> serde_json::Value {
    json!({"request_id": format!("req-{i:08}"), "key": "key-3f2a", "model": "llama-3.1-8b",
           "prompt_tokens": 512, "completion_tokens": 128, "cost_micros": 1234, "status": 200})
}

fn batch(stream: &str, n: usize) -> Vec<StreamAppend> {
    let events = (0..n)
        .map(|i| NewEvent::new("UsageRecorded", 1, payload(i)))
        .collect();
    vec![StreamAppend::new(stream, ExpectedVersion::Any, events)]
}

struct Figures {
    events: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile(&mut self, p: f64) -> f64 {
        self.latencies.sort();
        let i = ((self.latencies.len() as f64 * p).ceil() as usize).clamp(1, self.latencies.len());
        self.latencies[i - 1].as_secs_f64() * 1e3
    }
}

/// `alone`: the writers take turns, one append (one transaction) at a time.
async fn appends(
    store: &AnyStore,
    writer: &Writer,
    size: usize,
    writers: usize,
    alone: bool,
) -> Figures {
    let start = Instant::now();
    let turns = std::sync::Arc::new(tokio::sync::Mutex::new(()));
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (store, writer, turns) = (store.clone(), writer.clone(), turns.clone());
            tokio::spawn(async move {
                let stream = format!("usage-w{w}");
                let mut latencies = Vec::new();
                let mut events = 0u64;
                while start.elapsed() < BUDGET {
                    let b = batch(&stream, size);
                    let t = Instant::now();
                    let turn = if alone {
                        Some(turns.lock().await)
                    } else {
                        None
                    };
                    store.append(&writer, &b).await.unwrap();
                    drop(turn);
                    latencies.push(t.elapsed());
                    events += size as u64;
                }
                (events, latencies)
            })
        })
        .collect();
    let mut figures = Figures {
        events: 0,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    };
    for t in tasks {
        let (events, latencies) = t.await.unwrap();
        figures.events += events;
        figures.latencies.extend(latencies);
    }
    figures.elapsed = start.elapsed();
    figures
}

/// Plain inserts of the same rows: what the database does with no log
/// semantics at all.
async fn baseline(store: &AnyStore, size: usize) -> f64 {
    let start = Instant::now();
    let mut events = 0u64;
    while start.elapsed() < BUDGET {
        let rows: Vec<String> = (0..size).map(|i| payload(i).to_string()).collect();
        match store {
            AnyStore::Postgres(s) => {
                let mut tx = s.pool().begin().await.unwrap();
                sqlx::query(
                    "INSERT INTO bench_raw (payload) SELECT p::jsonb FROM unnest($1::text[]) AS u(p)",
                )
                .bind(&rows)
                .execute(&mut *tx)
                .await
                .unwrap();
                tx.commit().await.unwrap();
            }
            AnyStore::Sqlite(s) => {
                let mut tx = s.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
                sqlx::query("INSERT INTO bench_raw (payload) SELECT value FROM json_each(?1)")
                    .bind(serde_json::to_string(&rows).unwrap())
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
        }
        events += size as u64;
    }
    events as f64 / start.elapsed().as_secs_f64()
}

/// Vacuums and checkpoints between measurements, so that one measurement's
/// autovacuum or checkpoint does not land in the next one's window.
async fn settle(store: &AnyStore) {
    match store {
        AnyStore::Postgres(s) => {
            for sql in [
                "VACUUM (ANALYZE) bench_raw",
                "VACUUM (ANALYZE) es_events",
                "CHECKPOINT",
            ] {
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

async fn run(backend: Backend) {
    let (address, _scratch) = Scratch::new(backend).await;
    let address = StoreAddress::parse(&address).unwrap();
    let store = AnyStore::open(&address, OpenOptions::migrating())
        .await
        .unwrap();
    match &store {
        AnyStore::Postgres(s) => s
            .pool()
            .execute("CREATE TABLE bench_raw (id bigserial PRIMARY KEY, payload jsonb NOT NULL)")
            .await
            .map(|_| ())
            .unwrap(),
        AnyStore::Sqlite(s) => s
            .pool()
            .execute("CREATE TABLE bench_raw (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
            .await
            .map(|_| ())
            .unwrap(),
    }
    let lease = store
        .acquire_lease("bench", Duration::from_secs(3600))
        .await
        .unwrap();
    let writer = Writer::Leader(lease.token);
    let name = format!("{backend:?}").to_lowercase();
    for size in batches() {
        settle(&store).await;
        let base = baseline(&store, size).await;
        for writers in WRITERS {
            settle(&store).await;
            let before = store.group_stats();
            let mut f = appends(&store, &writer, size, writers, false).await;
            let after = store.group_stats();
            let per_group = (after.appends - before.appends) as f64
                / (after.groups - before.groups).max(1) as f64;
            let one_statement = 100.0 * (after.one_statement - before.one_statement) as f64
                / (after.groups - before.groups).max(1) as f64;
            let ratio = if writers == 1 {
                format!("{:.2}", f.rate() / base)
            } else {
                "-".into()
            };
            let grouping = if writers > 1 {
                settle(&store).await;
                let alone = appends(&store, &writer, size, writers, true).await;
                format!(
                    "  alone {:>7.0} events/s  {:.2}x alone",
                    alone.rate(),
                    f.rate() / alone.rate()
                )
            } else {
                String::new()
            };
            println!(
                "{name:<8} batch {size:>4}  writers {writers}  {:>7.0} events/s  \
                 p50 {:>7.2} ms  p99 {:>7.2} ms  {per_group:.1} appends/group \
                 ({one_statement:.0}% in one statement)  \
                 baseline {:>7.0} events/s  ratio {ratio}{grouping}",
                f.rate(),
                f.percentile(0.50),
                f.percentile(0.99),
                base,
            );
        }
    }
    // Fill up to the read-back size, then read everything in pages.
    while store.head().await.unwrap().0 < READ_BACK {
        store
            .append(&writer, &batch("usage-fill", 1000))
            .await
            .unwrap();
    }
    settle(&store).await;
    let start = Instant::now();
    let (mut after, mut read) = (0, 0u64);
    while read < READ_BACK {
        let page = store.read_all(after, 1000).await.unwrap();
        read += page.len() as u64;
        after = page.last().unwrap().position;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{name:<8} read {read} events in {secs:.2} s: {:.0} events/s; load average {}",
        read as f64 / secs,
        load_average()
    );
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_owned()
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
