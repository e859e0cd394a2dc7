//! Outages ridden out, nothing lost (issue 14 §3), through the shipped
//! binary.
//!
//! PostgreSQL goes away under load: the server reaches it through a TCP
//! relay this test owns, which is cut (connections closed, new ones
//! refused: a server gone) or paused (silence: a partition) and restored,
//! without touching the shared server. Just before, the relay loses the
//! answer that commits one usage append (a `COMMIT`, or the one statement
//! a group is written in when the store knows the head), so one retry
//! meets a commit whose outcome the server could not know. The gateway must keep serving from
//! its views, the usage must wait in the bounded buffer and land after,
//! exactly once per request served, and the leader must stop leading when
//! it cannot renew and lead again under a new epoch.
//!
//! SQLite on a full disk: the server runs under a file-size limit set on
//! the running process with `prlimit` (util-linux), which the kernel
//! enforces with EFBIG, as it would refuse a full disk with ENOSPC, and
//! which needs no root, no mount and no disk of a fixed size. Appends
//! fail with a clear error, serving goes on, the usage is held, and once
//! the limit is lifted it lands; the file passes SQLite's integrity check
//! and the log's hash chain verifies.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llmgw_eventstore::{AnyStore, EventStore, OpenOptions, StoreAddress};
use llmgw_testkit::Relay;
use serde_json::json;

use super::tenancy::{self, Mode};
use super::{Child, until};

/// How long the database stays away at least: longer than the lease's ttl
/// (2 s in these configurations), so that the leader must step down. 5 s
/// in the suite; `LLMGW_DRILL_OUTAGE_S=30` runs the 30 s drill.
fn outage() -> Duration {
    std::env::var("LLMGW_DRILL_OUTAGE_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(5), Duration::from_secs)
}

/// Clients sending chat completions back to back with a key, half of them
/// streamed, each under an `x-request-id` of its own, until stopped. A
/// request counts as served when it answered 200 in full (a stream up to
/// `[DONE]`).
pub(super) struct Load {
    stop: Arc<AtomicBool>,
    served: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<Vec<String>>>,
}

impl Load {
    pub(super) fn start(base: &str, key: &str, model: &str, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..clients)
            .map(|i| {
                let (stop, served) = (stop.clone(), served.clone());
                let (base, key, model) = (base.to_owned(), key.to_owned(), model.to_owned());
                tokio::spawn(async move {
                    let http = reqwest::Client::builder()
                        .timeout(Duration::from_secs(20))
                        .build()
                        .unwrap();
                    let mut failures = Vec::new();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let id = format!("load-{i}-{n}");
                        let stream = n.is_multiple_of(2);
                        let body = json!({"model": model, "stream": stream, "max_tokens": 4,
                            "messages": [{"role": "user", "content": format!("client {i}")}]});
                        let answer = async {
                            let r = http
                                .post(format!("{base}/v1/chat/completions"))
                                .bearer_auth(&key)
                                .header("x-request-id", &id)
                                .json(&body)
                                .send()
                                .await
                                .map_err(|e| format!("send: {e}"))?;
                            let status = r.status();
                            let text = r.text().await.map_err(|e| format!("body: {e}"))?;
                            match (status.as_u16(), stream) {
                                (200, true) if text.contains("[DONE]") => Ok(()),
                                (200, false) if text.contains("\"choices\"") => Ok(()),
                                _ => Err(format!("{status}: {text}")),
                            }
                        };
                        match answer.await {
                            Ok(()) => served.lock().unwrap().push(id),
                            Err(e) => failures.push(format!("{id}: {e}")),
                        }
                    }
                    failures
                })
            })
            .collect();
        Load {
            stop,
            served,
            tasks,
        }
    }

    pub(super) fn served(&self) -> usize {
        self.served.lock().unwrap().len()
    }

    /// Until `n` more requests have been served.
    pub(super) async fn more(&self, n: usize) {
        let target = self.served() + n;
        until("the clients to be served", || async {
            (self.served() >= target).then_some(())
        })
        .await;
    }

    /// Stops the clients; the ids served and the failures.
    pub(super) async fn finish(self) -> (Vec<String>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut failures = Vec::new();
        for t in self.tasks {
            failures.extend(t.await.unwrap());
        }
        let served = std::mem::take(&mut *self.served.lock().unwrap());
        (served, failures)
    }
}

/// The store, opened directly (not through the server).
pub(super) async fn open(address: &str) -> AnyStore {
    AnyStore::open(
        &StoreAddress::parse(address).unwrap(),
        OpenOptions::default(),
    )
    .await
    .unwrap()
}

/// The request ids of every usage row in the log, in log order.
pub(super) async fn usage_rows(store: &AnyStore) -> Vec<String> {
    let mut ids = Vec::new();
    let mut after = 0;
    loop {
        let page = store.read_all_raw(after, 10_000).await.unwrap();
        let Some(last) = page.last() else {
            return ids;
        };
        after = last.position;
        for e in &page {
            let rows =
                match llmgw_domain::Event::decode(&e.event_type, e.schema_version, &e.payload) {
                    Ok(llmgw_domain::Event::Usage(u)) => (u.rows().iter())
                        .map(|r| serde_json::to_value(r).unwrap())
                        .collect::<Vec<_>>(),
                    _ => continue,
                };
            ids.extend(
                rows.iter()
                    .map(|u| u["request_id"].as_str().unwrap().to_owned()),
            );
        }
    }
}

/// Waits until the log holds as many usage rows as requests were served,
/// then checks that it holds no more and none twice (the gateway's usage
/// ids are its own, one per request; the client's `x-request-id` is not
/// one of them, so rows are counted, not matched).
pub(super) async fn every_request_has_one_usage_row(store: &AnyStore, served: &[String]) {
    let rows = until("a usage row for every request served", || async {
        let rows = usage_rows(store).await;
        (rows.len() >= served.len()).then_some(rows)
    })
    .await;
    let unique: HashSet<&String> = rows.iter().collect();
    assert_eq!(
        unique.len(),
        rows.len(),
        "a request's usage was appended twice"
    );
    assert_eq!(
        rows.len(),
        served.len(),
        "more usage rows than requests served"
    );
}

/// A series' value on a server's metrics page (0 when absent).
pub(super) async fn metric(admin: &str, series: &str) -> f64 {
    let page = reqwest::get(format!("{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// A process's stderr as read so far, to wait on.
pub(super) struct Log<'a> {
    child: &'a Child,
    lines: Mutex<Vec<String>>,
}

impl<'a> Log<'a> {
    pub(super) fn of(child: &'a Child) -> Log<'a> {
        Log {
            child,
            lines: Mutex::new(Vec::new()),
        }
    }

    /// How many lines so far contain `needle`.
    pub(super) fn count(&self, needle: &str) -> usize {
        let mut lines = self.lines.lock().unwrap();
        lines.extend(self.child.stderr.try_iter());
        lines.iter().filter(|l| l.contains(needle)).count()
    }

    /// Until a line after the first `from` lines with `needle` appears.
    pub(super) async fn until_more(&self, needle: &str, from: usize) {
        until(&format!("a log line with {needle:?}"), || async {
            (self.count(needle) > from).then_some(())
        })
        .await;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Connections closed, new ones refused.
    Cut,
    /// Nothing flows, nothing is closed.
    Pause,
}

async fn postgres_goes_away_under_load(fault: Fault) {
    let db = llmgw_testkit::TestDb::create().await;
    let relay = Relay::to_postgres(&db.url).await;
    let through = relay.url(&db.url);
    let dir = tempfile::tempdir().unwrap();
    let engine = tenancy::engine();
    let e = engine.addr_after("listening on ");
    let config = tenancy::config(
        dir.path(),
        "a",
        &through,
        &e,
        Mode::Control,
        "auth:\n  enabled: true\n  flush_interval: 50ms\n",
    );
    let server = tenancy::start(&config);
    let (base, admin) = (server.base.as_str(), server.admin.as_str());
    tenancy::leads(admin).await;
    tenancy::tree(&through, admin);
    let (key, _) = tenancy::new_key(&through, admin, "load");
    let log = open(&db.url).await;
    let server_log = Log::of(&server.child);
    let load = Load::start(base, &key, "free", 4);
    until("usage in the log", || async {
        (usage_rows(&log).await.len() >= 20).then_some(())
    })
    .await;

    // A usage append commits, but its answer never arrives: the batcher
    // tries again with the same event ids, and the store answers with the
    // first append's positions.
    relay.lose_commit_reply(b"UsageBatchRecorded");
    server_log
        .until_more("a usage batch was already in the log", 0)
        .await;
    assert_eq!(relay.replies_lost(), 1);

    let epoch = log.lease_info().await.unwrap().epoch;
    let stepped_down = server_log.count("no longer leading");
    let served_before = load.served();
    let began = Instant::now();
    match fault {
        Fault::Cut => relay.cut(),
        Fault::Pause => relay.pause(),
    }
    // The leader stops when it cannot renew; the gateway serves on.
    server_log
        .until_more("no longer leading", stepped_down)
        .await;
    let stopped_leading = began.elapsed();

    load.more(100).await;
    tokio::time::sleep_until((began + outage()).into()).await;
    let held = metric(admin, "llmgw_usage_pending").await;
    assert!(held > 0.0, "no usage was held while the log was away");
    let served_down = load.served() - served_before;
    let outage = began.elapsed();
    relay.restore();
    let restored = Instant::now();
    let served_then = load.served();

    // It leads again, under a new epoch.
    let lease = until("the server to lead again", || async {
        let l = log.lease_info().await.ok()?;
        (l.held && l.holder.as_deref() == Some("a") && l.epoch > epoch).then_some(l)
    })
    .await;
    let leads_again = restored.elapsed();
    // What was held lands.
    until("the usage held to land", || async {
        (usage_rows(&log).await.len() >= served_then).then_some(())
    })
    .await;
    let landed = restored.elapsed();
    load.more(50).await;
    let (served, failures) = load.finish().await;
    assert!(
        failures.is_empty(),
        "{} of {} requests failed: {:?}",
        failures.len(),
        served.len() + failures.len(),
        &failures[..failures.len().min(5)]
    );
    every_request_has_one_usage_row(&log, &served).await;
    assert_eq!(metric(admin, "llmgw_usage_dropped_total").await, 0.0);
    eprintln!(
        "outage ({fault:?}): PostgreSQL away {:.1} s; the leader stopped leading {:.2} s in and led again {:.2} s after the link came back (epoch {epoch} -> {}); {served_down} requests served while it was away (0 failed), {held} usage records held at the end of it; the usage of every request served until then was in the log {:.2} s after the link came back; {} requests in all, {} usage rows, none twice; 0 dropped",
        outage.as_secs_f64(),
        stopped_leading.as_secs_f64(),
        leads_again.as_secs_f64(),
        lease.epoch,
        landed.as_secs_f64(),
        served.len(),
        served.len(),
    );
    drop(server);
    drop(engine);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_server_gone_for_a_while_is_ridden_out_and_no_usage_is_lost_or_doubled() {
    postgres_goes_away_under_load(Fault::Cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_from_postgres_is_ridden_out_and_no_usage_is_lost_or_doubled() {
    postgres_goes_away_under_load(Fault::Pause).await;
}

/// The largest size a file of the store may reach: what it has now.
fn sizes(db: &std::path::Path) -> u64 {
    std::fs::metadata(db).unwrap().len()
}

fn prlimit(pid: u32, fsize: &str) {
    let out = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--fsize={fsize}:")])
        .output()
        .expect("prlimit (util-linux) is installed");
    assert!(
        out.status.success(),
        "prlimit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_full_disk_fails_appends_clearly_keeps_serving_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("llmgw.db");
    let store = db.display().to_string();
    let engine = tenancy::engine();
    let e = engine.addr_after("listening on ");
    let config = tenancy::config(
        dir.path(),
        "a",
        &store,
        &e,
        Mode::Control,
        "auth:\n  enabled: true\n  flush_interval: 50ms\n",
    );
    let server = tenancy::start(&config);
    let (base, admin) = (server.base.as_str(), server.admin.as_str());
    tenancy::leads(admin).await;
    tenancy::tree(&store, admin);
    let (key, _) = tenancy::new_key(&store, admin, "load");
    let log = open(&store).await;
    let server_log = Log::of(&server.child);
    let load = Load::start(base, &key, "free", 4);
    until("usage in the log", || async {
        (usage_rows(&log).await.len() >= 20).then_some(())
    })
    .await;

    // The disk fills: no file of the server's may grow past the database's
    // size now.
    let pid = server.child.process.id();
    prlimit(pid, &sizes(&db).to_string());
    let served_before = load.served();
    let full_at = Instant::now();
    server_log
        .until_more("the store has no room to write", 0)
        .await;
    load.more(100).await;
    let held = until("usage held", || async {
        let held = metric(admin, "llmgw_usage_pending").await;
        (held > 0.0).then_some(held)
    })
    .await;
    let served_full = load.served() - served_before;
    let full_for = full_at.elapsed();

    // Room again: what was held lands.
    prlimit(pid, "unlimited");
    let freed = Instant::now();
    let served_then = load.served();
    until("the usage held to land", || async {
        (usage_rows(&log).await.len() >= served_then).then_some(())
    })
    .await;
    let landed = freed.elapsed();
    load.more(50).await;
    let (served, failures) = load.finish().await;
    assert!(
        failures.is_empty(),
        "{} of {} requests failed: {:?}",
        failures.len(),
        served.len() + failures.len(),
        &failures[..failures.len().min(5)]
    );
    every_request_has_one_usage_row(&log, &served).await;
    assert_eq!(metric(admin, "llmgw_usage_dropped_total").await, 0.0);

    // Nothing is damaged: SQLite's own check and the hash chain.
    let check: String = {
        use sqlx::Connection;
        let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{store}?mode=ro"))
            .await
            .unwrap();
        sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(&mut c)
            .await
            .unwrap()
    };
    assert_eq!(check, "ok");
    let verify = super::llmgw(&store, &["events", "verify"]);
    assert!(
        verify.status.success(),
        "{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    eprintln!(
        "full disk (SQLite under a file-size limit): {served_full} requests served in the {:.1} s the store could not grow (0 failed), {held} usage records held; they landed {:.2} s after the limit was lifted; {} requests in all, {} usage rows, none twice; integrity check ok, chain verified",
        full_for.as_secs_f64(),
        landed.as_secs_f64(),
        served.len(),
        served.len(),
    );
    drop(server);
    drop(engine);
}
