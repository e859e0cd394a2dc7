//! How many usage events a day the batcher appends, by flush interval and
//! traffic: a day of requests (random arrivals spread over its busy hours)
//! fed to the real batcher, which appends into a real SQLite store, on
//! paused tokio time (moved by hand, never while an append
//! is in flight) so that a day passes in seconds. Prints the events,
//! rows an event, and the events' share of one-per-request.
//!
//! `cargo bench -p llmgw-gateway --bench usage_events`

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark program; a failure should stop it loudly"
)]

use std::time::Duration;

use llmgw_domain::UnixMillis;
use llmgw_domain::catalog::Price;
use llmgw_domain::tenancy::Band;
use llmgw_domain::usage::FinishedRequest;
use llmgw_eventstore::{AnyStore, EventStore, OpenOptions, StoreAddress};
use llmgw_gateway::usage::{UsageQueue, run_batcher};

/// A small deterministic generator (xorshift64*): arrivals are the same
/// from run to run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Day {
    requests: u64,
    busy_hours: u64,
}

async fn events_in(day: &Day, interval: Duration, batch: usize) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let address = format!("sqlite://{}", dir.path().join("usage.db").display());
    let store = AnyStore::open(
        &StoreAddress::parse(&address).unwrap(),
        OpenOptions::migrating(),
    )
    .await
    .unwrap();
    // On the clock from here (opening the store waits on real time).
    tokio::time::pause();
    let (queue, rx) = UsageQueue::new(8192);
    let batcher = tokio::spawn(run_batcher(
        store.clone(),
        "gateway-bench".into(),
        rx,
        batch,
        interval,
    ));
    // Poisson arrivals at the busy hours' mean rate.
    let busy = Duration::from_secs(day.busy_hours * 3600);
    let mean_gap = busy.as_secs_f64() / day.requests as f64;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let start = tokio::time::Instant::now();
    let mut at = 0.0f64;
    for i in 0..day.requests {
        at += -mean_gap * (1.0 - rng.next()).ln();
        let due = start + Duration::from_secs_f64(at);
        // The clock moves only here: while an append is in flight this
        // task keeps the runtime busy, so paused time does not jump ahead
        // on its own while the store answers in real time.
        tokio::time::advance(due.saturating_duration_since(tokio::time::Instant::now())).await;
        while queue.pending() > 0 {
            tokio::task::yield_now().await;
        }
        queue.record(FinishedRequest {
            request_id: format!("r{i}"),
            key_id: format!("key-{}", i % 200).into(),
            project_id: format!("project-{}", i % 20).into(),
            model_asked: "m".into(),
            model_served: "m".into(),
            prompt_tokens: 100,
            completion_tokens: 50,
            status: 200,
            latency_ms: 800,
            ttft_ms: Some(90),
            band: Band::Gold,
            at: UnixMillis(1_780_000_000_000 + (at * 1000.0) as i64),
            price: Price {
                prompt_per_1k: 1000,
                completion_per_1k: 1000,
            },
        });
    }
    // The rest goes on stop, as a server's does.
    let queue_dropped = queue.dropped();
    drop(queue);
    batcher.await.unwrap();
    tokio::time::resume();
    let stats = store.stats().await.unwrap();
    let events = stats.count;
    assert_eq!(queue_dropped, 0, "records were dropped");
    let rows = day.requests;
    (events, rows)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let days = [
        Day {
            requests: 100_000,
            busy_hours: 24,
        },
        Day {
            requests: 100_000,
            busy_hours: 8,
        },
        Day {
            requests: 1_000_000,
            busy_hours: 8,
        },
    ];
    let intervals = [Duration::from_secs(2), Duration::from_secs(60)];
    let batch = 500;
    println!(
        "usage events a day: one UsageBatchRecorded per flush, batch_size {batch}, real batcher into SQLite on paused time"
    );
    println!(
        "{:>10} {:>6} {:>9} {:>9} {:>10} {:>8}",
        "requests", "hours", "interval", "events", "rows/event", "wall s"
    );
    for day in &days {
        for interval in intervals {
            // A million requests fill batches whatever the interval.
            if day.requests > 100_000 && interval < Duration::from_secs(60) {
                continue;
            }
            let wall = std::time::Instant::now();
            let (events, rows) = events_in(day, interval, batch).await;
            println!(
                "{:>10} {:>6} {:>9} {:>9} {:>10.1} {:>8.1}",
                day.requests,
                day.busy_hours,
                format!("{:?}", interval),
                events,
                rows as f64 / events.max(1) as f64,
                wall.elapsed().as_secs_f64()
            );
        }
    }
}
