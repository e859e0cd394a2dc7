//! Bytes the log stores per request served, usage recorded one event per
//! request (the shape of the oldest logs), one event per flush carrying a
//! list of rows (version 1) and one per flush in columns (version 2, as
//! gateways append it now), on SQLite and PostgreSQL.
//!
//! Run: `cargo bench -p llmgw-replay-tests --bench usage_bytes`
//! (`LLMGW_BENCH_REQUESTS=20000` by default).
//!
//! Each shape is appended to a fresh store through the decider's observer
//! path, as a gateway appends it (metadata, ids, hash chain, indexes and
//! all); what it cost is the store's size after, less its size empty:
//! SQLite's pages (`page_count · page_size`, the WAL included), PostgreSQL's
//! `pg_database_size`. Rows are as a gateway writes them: a request id,
//! 200 keys, 20 projects and models, tokens, latency, a time to first token.

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark program; a failure should stop it loudly"
)]

use llmgw_decider::{Actor, Decider, Origin};
use llmgw_domain::Event;
use llmgw_domain::catalog::Price;
use llmgw_domain::tenancy::Band;
use llmgw_domain::usage::{FinishedRequest, UsageEvent, record, record_batch};
use llmgw_eventstore::{
    AnyStore, EventStore, ExpectedVersion, NewEvent, OpenOptions, StoreAddress, StreamAppend,
    Writer,
};
use llmgw_testkit::{Backend, Scratch};

fn requests() -> u64 {
    std::env::var("LLMGW_BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn request(i: u64) -> FinishedRequest {
    FinishedRequest {
        request_id: format!("req-{}-{i}", 4_000_000 + i % 7),
        key_id: format!("key-{:08x}", i % 200 * 2_654_435_761 % (1 << 32)).into(),
        project_id: format!("project-{}", i % 20).into(),
        model_asked: format!("llama-3.1-{}b-instruct", 8 + i % 20).into(),
        model_served: format!("llama-3.1-{}b-instruct", 8 + i % 20).into(),
        prompt_tokens: 200 + i % 1800,
        completion_tokens: 50 + i % 450,
        status: if i.is_multiple_of(50) { 502 } else { 200 },
        latency_ms: 300 + (i % 4000) as u32,
        ttft_ms: Some(40 + (i % 300) as u32),
        band: Band::Gold,
        at: llmgw_domain::UnixMillis(1_780_000_000_000 + i as i64 * 850),
        price: Price {
            prompt_per_1k: 150,
            completion_per_1k: 600,
        },
    }
}

/// How usage is written.
#[derive(Clone, Copy)]
enum Shape {
    /// One `UsageRecorded` a request, as the oldest logs hold it.
    Single,
    /// `UsageBatchRecorded` version 1, a list of rows (logs written
    /// before columns).
    Rows(u64),
    /// `UsageBatchRecorded` as gateways append it now, in columns.
    Columns(u64),
}

/// What one shape appends: the events of `n` requests, one append each.
fn events(shape: Shape, n: u64) -> Vec<Vec<Event>> {
    let batches = |rows: u64| {
        (0..n).step_by(rows as usize).map(move |start| {
            let (batch, _) =
                record_batch("gateway-cp-1", (start..(start + rows).min(n)).map(request));
            vec![Event::Usage(batch.unwrap())]
        })
    };
    match shape {
        // The old batcher: one event per request, 500 to an append.
        Shape::Single => (0..n)
            .map(|i| Event::Usage(record(request(i)).unwrap()))
            .collect::<Vec<_>>()
            .chunks(500)
            .map(<[Event]>::to_vec)
            .collect(),
        Shape::Rows(rows) | Shape::Columns(rows) => batches(rows).collect(),
    }
}

/// A batch as version 1 stored it, with the metadata the decider gives
/// a gateway's append: no build appends this shape any more.
fn as_rows(events: &[Event], origin: &Origin) -> Vec<StreamAppend> {
    events
        .iter()
        .map(|e| {
            let Event::Usage(UsageEvent::UsageBatchRecorded(b)) = e else {
                unreachable!("batches")
            };
            let payload = serde_json::json!({"gateway": b.gateway, "rows": b.rows});
            let event = NewEvent::new("UsageBatchRecorded", 1, payload)
                .with_metadata(origin.metadata("gateway-cp-1"));
            StreamAppend::new(e.stream_id(), ExpectedVersion::Any, vec![event])
        })
        .collect()
}

async fn size(address: &str, backend: Backend) -> i64 {
    use sqlx::Connection;
    match backend {
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(address).await.unwrap();
            sqlx::query_scalar("SELECT pg_database_size(current_database())")
                .fetch_one(&mut c)
                .await
                .unwrap()
        }
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{address}"))
                .await
                .unwrap();
            sqlx::query_scalar(
                "SELECT (SELECT page_count FROM pragma_page_count()) * (SELECT page_size FROM pragma_page_size())",
            )
            .fetch_one(&mut c)
            .await
            .unwrap()
        }
    }
}

async fn bytes_per_request(backend: Backend, shape: Shape, n: u64) -> (f64, u64) {
    let (address, _scratch) = Scratch::new(backend).await;
    let store = AnyStore::open(
        &StoreAddress::parse(&address).unwrap(),
        OpenOptions::migrating(),
    )
    .await
    .unwrap();
    let empty = size(&address, backend).await;
    let decider = Decider::new(store.clone(), "gateway-cp-1".into());
    let origin = Origin::new(Actor::Gateway("gateway-cp-1".into()));
    let appends = events(shape, n);
    let count = appends.iter().map(Vec::len).sum::<usize>() as u64;
    let writer = Writer::Observer {
        instance: "gateway-cp-1".into(),
    };
    for events in appends {
        match shape {
            Shape::Rows(_) => {
                store
                    .append(&writer, &as_rows(&events, &origin))
                    .await
                    .unwrap();
            }
            _ => {
                decider.observe(&origin, events).await.unwrap();
            }
        }
    }
    drop(decider);
    drop(store);
    let full = size(&address, backend).await;
    ((full - empty) as f64 / n as f64, count)
}

#[tokio::main]
async fn main() {
    let n = requests();
    // The payload alone, as canonical text: what the batcher hashes and
    // the views parse, before the store's own bytes a row.
    let mut text = (0, 0);
    for batch in events(Shape::Columns(500), n) {
        let origin = Origin::new(Actor::Gateway("gateway-cp-1".into()));
        let v1 = &as_rows(&batch, &origin)[0].events[0].payload;
        let (_, _, v2) = batch[0].encode();
        text.0 += llmgw_eventstore::hash::canonical_string(v1).len();
        text.1 += llmgw_eventstore::hash::canonical_string(&v2).len();
    }
    println!(
        "payload text per request at 500 rows an event: {} B as rows (v1), {} B in columns (v2)",
        text.0 as u64 / n,
        text.1 as u64 / n
    );
    println!("{n} requests; bytes stored per request (the store's growth / requests)");
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let shapes = [
            Shape::Single,
            Shape::Rows(500),
            Shape::Columns(1),
            Shape::Columns(10),
            Shape::Columns(100),
            Shape::Columns(500),
        ];
        for shape in shapes {
            let (bytes, events) = bytes_per_request(backend, shape, n).await;
            let what = match shape {
                Shape::Single => "one UsageRecorded per request".to_owned(),
                Shape::Rows(r) => format!("batch v1 (rows), {r} rows an event"),
                Shape::Columns(r) => format!("batch v2 (columns), {r} rows an event"),
            };
            println!("{backend:?}\t{what:<40}\t{events:>6} events\t{bytes:>7.0} B/request");
        }
    }
}
