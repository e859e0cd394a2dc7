//! What a thread adds to a request: reading its history. 10,000 threads of
//! 50 turns (about 200 bytes each) on SQLite and PostgreSQL; 2,000 lookups
//! of random threads, against a baseline of 2,000 lookups of threads that
//! do not exist (the same query and round trip, no rows), in the same run.
//!
//! Run: `cargo bench -p llmgw-convo --bench lookup` (PostgreSQL from
//! DATABASE_URL, else 127.0.0.1:5432 as the tests use).

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark program; a failure should stop it loudly"
)]

use std::time::{Duration, Instant};

use llmgw_convo::Convo;
use llmgw_eventstore::{AnyStore, OpenOptions, StoreAddress};
use llmgw_testkit::{Backend, Scratch};

const THREADS: u64 = 10_000;
const TURNS: u64 = 50;
const LOOKUPS: u64 = 2_000;

/// The turns, loaded in bulk with SQL (as the replay benchmark loads its
/// log): appending them one thread at a time would measure the loader.
async fn fill(store: &AnyStore) {
    let message = format!(
        r#"{{"role":"user","content":"{}"}}"#,
        "a few words of a conversation ".repeat(6)
    );
    match store {
        AnyStore::Sqlite(s) => {
            let pool = s.pool();
            sqlx::query(
                "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < $1)
                 INSERT INTO convo_threads (project_id, thread_id, created_at, updated_at, next_seq)
                 SELECT 'p', 't' || i, 0, 0, $2 FROM n",
            )
            .bind(THREADS as i64)
            .bind(TURNS as i64)
            .execute(pool)
            .await
            .unwrap();
            sqlx::query(
                "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < $1)
                 INSERT INTO convo_turns (project_id, thread_id, seq, message)
                 SELECT 'p', 't' || (i / $2), i % $2, $3 FROM n",
            )
            .bind((THREADS * TURNS) as i64)
            .bind(TURNS as i64)
            .bind(&message)
            .execute(pool)
            .await
            .unwrap();
        }
        AnyStore::Postgres(s) => {
            let pool = s.pool();
            sqlx::query(
                "INSERT INTO convo_threads (project_id, thread_id, created_at, updated_at, next_seq)
                 SELECT 'p', 't' || i, 0, 0, $2 FROM generate_series(0, $1 - 1) i",
            )
            .bind(THREADS as i64)
            .bind(TURNS as i64)
            .execute(pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO convo_turns (project_id, thread_id, seq, message)
                 SELECT 'p', 't' || (i / $2), i % $2, $3 FROM generate_series(0, $1 - 1) i",
            )
            .bind((THREADS * TURNS) as i64)
            .bind(TURNS as i64)
            .bind(&message)
            .execute(pool)
            .await
            .unwrap();
            sqlx::query("ANALYZE").execute(pool).await.unwrap();
        }
    }
}

/// A fixed pseudo-random sequence (no dependency for one bench).
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

async fn run(backend: Backend) {
    let (address, _scratch) = Scratch::new(backend).await;
    let store = AnyStore::open(
        &StoreAddress::parse(&address).unwrap(),
        OpenOptions::migrating(),
    )
    .await
    .unwrap();
    let loading = Instant::now();
    fill(&store).await;
    let loaded = loading.elapsed();
    let convo = Convo::new(&store);
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let (mut hits, mut misses) = (Vec::new(), Vec::new());
    // Interleaved, so both see the same machine at the same moments.
    for _ in 0..LOOKUPS {
        let t = format!("t{}", next(&mut seed) % THREADS);
        let start = Instant::now();
        let h = convo.history("p", &t).await.unwrap();
        hits.push(start.elapsed());
        assert_eq!(h.len() as u64, TURNS);
        let start = Instant::now();
        let m = convo.history("p", &format!("x{t}")).await.unwrap();
        misses.push(start.elapsed());
        assert!(m.is_empty());
    }
    hits.sort();
    misses.sort();
    println!(
        "{backend:?}: {THREADS} threads x {TURNS} turns loaded in {:.1} s; \
         lookup of a thread p50 {:.3} ms p99 {:.3} ms; of a missing one (baseline) \
         p50 {:.3} ms p99 {:.3} ms; the 50 turns add p50 {:.3} ms",
        loaded.as_secs_f64(),
        pct(&hits, 0.5),
        pct(&hits, 0.99),
        pct(&misses, 0.5),
        pct(&misses, 0.99),
        pct(&hits, 0.5) - pct(&misses, 0.5),
    );
}

#[tokio::main]
async fn main() {
    run(Backend::Sqlite).await;
    run(Backend::Postgres).await;
}
