//! Drills through the binary (issue 14 §6), with real processes; each
//! prints its figures, recorded in docs/benchmarks.md under "Faults".
//!
//! (a) The leader is SIGKILLed while four clients stream from the standby:
//! no request fails, and the standby takes over within the lease's ttl
//! and a second (a correctness bound of the lease, not a speed figure: the
//! dead leader's lease runs out at most a ttl after its last renewal, and
//! the standby looks at least every second).
//!
//! (c) PostgreSQL is restarted under load: a private server started by the
//! test (`PrivatePostgres`: the installed initdb and pg_ctl, as
//! `scripts/test` starts one) is restarted with `pg_ctl restart -m fast`
//! while four clients send requests with a key: no request fails, and the
//! log holds exactly one usage row per request served.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use llmgw_eventstore::EventStore;

use super::Child;
use super::cluster::{
    Clients, EngineSweeper, ServerProc, free_port, get, leader_and_standby, ready_replicas,
    start_agent, until,
};
use super::outage::{Load, Log, every_request_has_one_usage_row, metric, open, usage_rows};
use super::tenancy::{self, Mode};

/// The lease's ttl in `cluster::server_yaml`.
const LEASE_TTL: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_a_the_leader_killed_under_four_streams_on_the_standby_fails_none() {
    let sweep = EngineSweeper("127.0.41.".into());
    let db = llmgw_testkit::TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (free_port(), free_port());
    let (first, second) =
        leader_and_standby(dir.path(), &db.url, ("first", pa), ("second", pb), 2).await;
    let servers = format!("http://127.0.0.1:{pa},http://127.0.0.1:{pb}");
    let agents: Vec<Child> = (1..3)
        .map(|i| start_agent(&servers, &format!("n{i}"), &format!("127.0.41.{i}")))
        .collect();
    until(
        "the standby's gateway routes to two ready replicas",
        || async {
            let r = reqwest::get(format!("{}/ready", second.base)).await.ok()?;
            let rows = get(format!("{}/api/v1/replicas", second.admin)).await;
            (r.status() == 200 && ready_replicas(&rows).len() == 2).then_some(())
        },
    )
    .await;
    let clients = Clients::start(&second.base);
    clients.wait_for_more(20).await;

    let ServerProc { mut child, .. } = first;
    let killed = Instant::now();
    let served_at_kill = clients.done.load(Ordering::Relaxed);
    child.process.kill().unwrap();
    until("the standby leads", || async {
        (get(format!("{}/api/v1/leader", second.admin)).await["is_leader"] == true).then_some(())
    })
    .await;
    let takeover = killed.elapsed();
    let served_in_takeover = clients.done.load(Ordering::Relaxed) - served_at_kill;
    until("both agents are on the new leader", || async {
        let nodes = get(format!("{}/api/v1/nodes", second.admin)).await;
        nodes
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["connected"] == true)
            .then_some(())
    })
    .await;
    let agents_back = killed.elapsed();
    clients.wait_for_more(20).await;
    let (served, failures) = clients.finish().await;
    assert!(
        failures.is_empty(),
        "{} of {} streams failed: {:?}",
        failures.len(),
        served + failures.len() as u64,
        &failures[..failures.len().min(5)]
    );
    assert!(
        takeover <= LEASE_TTL + Duration::from_secs(1),
        "the standby took over {takeover:?} after the kill, past the ttl ({LEASE_TTL:?}) and a second"
    );
    eprintln!(
        "drill (a): leader SIGKILLed under 4 streaming clients on the standby: takeover {:.2} s after the kill (lease ttl {} s); both agents on the new leader at {:.2} s; {served_in_takeover} streams completed during the takeover, {served} in all, 0 failed",
        takeover.as_secs_f64(),
        LEASE_TTL.as_secs(),
        agents_back.as_secs_f64(),
    );
    drop(child);
    drop(agents);
    drop(second);
    drop(sweep);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_c_postgres_restarted_under_load_fails_no_request_and_loses_no_usage() {
    let pg = Arc::new(
        tokio::task::spawn_blocking(llmgw_testkit::PrivatePostgres::start)
            .await
            .unwrap(),
    );
    let url = pg.url();
    let dir = tempfile::tempdir().unwrap();
    let engine = tenancy::engine();
    let e = engine.addr_after("listening on ");
    let config = tenancy::config(
        dir.path(),
        "a",
        &url,
        &e,
        Mode::Control,
        "auth:\n  enabled: true\n  flush_interval: 50ms\n",
    );
    let server = tenancy::start(&config);
    let (base, admin) = (server.base.as_str(), server.admin.as_str());
    tenancy::leads(admin).await;
    tenancy::tree(&url, admin);
    let (key, _) = tenancy::new_key(&url, admin, "load");
    let server_log = Log::of(&server.child);
    let load = Load::start(base, &key, "free", 4);
    load.more(50).await;
    let epoch = {
        let log = open(&url).await;
        log.lease_info().await.unwrap().epoch
    };

    let served_before = load.served();
    let restart = {
        let pg = pg.clone();
        tokio::task::spawn_blocking(move || pg.restart())
            .await
            .unwrap()
    };
    let served_during = load.served() - served_before;
    let back = Instant::now();
    let served_then = load.served();
    let log = open(&url).await;
    until("the usage held to land", || async {
        (usage_rows(&log).await.len() >= served_then).then_some(())
    })
    .await;
    let landed = back.elapsed();
    load.more(100).await;
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
    let lease = until("the server to lead", || async {
        let l = log.lease_info().await.ok()?;
        (l.held && l.holder.as_deref() == Some("a")).then_some(l)
    })
    .await;
    eprintln!(
        "drill (c): PostgreSQL restarted (pg_ctl restart -m fast, {:.2} s) under 4 clients: {served_during} requests served during the restart, {} in all, 0 failed; the usage of every request served until then in the log {:.2} s after the restart ended; {} usage rows, none lost or twice; the leader {} (epoch {epoch} -> {})",
        restart.as_secs_f64(),
        served.len(),
        landed.as_secs_f64(),
        served.len(),
        if lease.epoch == epoch {
            "kept its lease".to_owned()
        } else {
            format!(
                "stepped down {} time(s) and leads again",
                server_log.count("no longer leading")
            )
        },
        lease.epoch,
    );
    drop(server);
    drop(engine);
}
