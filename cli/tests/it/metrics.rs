//! The metrics an operator scrapes, from the shipped binary: a server with
//! the control plane on its metrics listener and an agent serving a sim
//! model (on a node whose stub nvidia-smi reports one GPU) on its own,
//! after a client's requests.

use std::collections::BTreeMap;
use std::path::Path;

use llmgw_testkit::{Backend, Scratch};
use serde_json::json;

use super::Child;
use super::cluster::{
    EngineSweeper, StateFileSweeper, free_port, get, ready_replicas, server_yaml, until,
};

/// `series{labels}` → value, from a text-format page; and the names that
/// have a HELP line, counted.
struct Page {
    samples: BTreeMap<String, f64>,
    help: BTreeMap<String, usize>,
    text: String,
}

impl Page {
    fn parse(text: String) -> Page {
        let mut samples = BTreeMap::new();
        let mut help = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap_or_default().to_owned();
                *help.entry(name).or_insert(0) += 1;
            } else if !line.starts_with('#')
                && let Some((series, value)) = line.rsplit_once(' ')
            {
                let value = match value {
                    "+Inf" => f64::INFINITY,
                    v => v.parse().unwrap_or_else(|_| panic!("a number in {line:?}")),
                };
                samples.insert(series.to_owned(), value);
            }
        }
        Page {
            samples,
            help,
            text,
        }
    }

    fn get(&self, series: &str) -> Option<f64> {
        self.samples.get(series).copied()
    }

    /// The value of `series`, which must be there.
    fn value(&self, series: &str) -> f64 {
        self.get(series)
            .unwrap_or_else(|| panic!("no {series} in\n{}", self.text))
    }

    /// Every sample's family has exactly one HELP line.
    fn every_series_has_one_help(&self) {
        for series in self.samples.keys() {
            let name = series.split('{').next().unwrap();
            let family = ["_total", "_bucket", "_sum", "_count", "_created"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| self.help.contains_key(*f)))
                .unwrap_or(name);
            assert_eq!(
                self.help.get(family),
                Some(&1),
                "{series}: one HELP for {family}\n{}",
                self.text
            );
        }
    }
}

async fn scrape(url: &str) -> Page {
    Page::parse(reqwest::get(url).await.unwrap().text().await.unwrap())
}

/// A stub nvidia-smi printing `rows` (the CSV the agent asks for).
fn smi(dir: &Path, rows: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let csv = dir.join("smi.csv");
    let tmp = dir.join("smi.csv.tmp");
    std::fs::write(&tmp, rows).unwrap();
    std::fs::rename(&tmp, &csv).unwrap();
    let path = dir.join("nvidia-smi");
    if !path.exists() {
        std::fs::write(&path, format!("#!/bin/sh\ncat {}\n", csv.display())).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    path
}

/// index, uuid, name, memory total and used (MiB), compute capability, bus,
/// driver, temperature, ECC errors, utilisation (%).
fn gpu_row(temperature: u32) -> String {
    format!(
        "0, GPU-a, NVIDIA H100 80GB HBM3, 81559, 300, 9.0, 00000000:1B:00.0, 550.54, {temperature}, 0, 37\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_server_and_agent_export_what_an_operator_checks() {
    exported(Backend::Sqlite, "127.0.13.").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_server_and_agent_export_what_an_operator_checks() {
    exported(Backend::Postgres, "127.0.14.").await;
}

async fn exported(backend: Backend, net: &str) {
    let sweep = EngineSweeper(net.to_owned());
    let dir = tempfile::tempdir().unwrap();
    let (store, _scratch) = match backend {
        Backend::Sqlite => (
            format!("sqlite://{}", dir.path().join("llmgw.db").display()),
            None,
        ),
        Backend::Postgres => {
            let (address, scratch) = Scratch::new(Backend::Postgres).await;
            (address, Some(scratch))
        }
    };
    let port = free_port();
    let config = server_yaml(dir.path(), "metrics", &store, port, 1);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("metrics_listen: \"127.0.0.1:0\"\n");
    std::fs::write(&config, text).unwrap();
    let server = Child::spawn(&["server", "--config", &config]);
    let _agents = server.addr_after("agent listening on ");
    let base = format!("http://{}", server.addr_after("client listening on "));
    let admin = format!("http://{}", server.addr_after("admin listening on "));
    let server_metrics = format!(
        "http://{}/metrics",
        server.addr_after("metrics listening on ")
    );

    let work = dir.path().join("work");
    let _engines = StateFileSweeper(work.clone());
    let smi_path = smi(dir.path(), &gpu_row(41));
    let ip = format!("{net}2");
    let agent = Child::spawn(&[
        "agent",
        "run",
        "--server",
        &format!("http://127.0.0.1:{port}"),
        "--node-id",
        "n1",
        "--mgmt-addr",
        &ip,
        "--engine-bind",
        &ip,
        "--heartbeat-s",
        "0.2",
        "--recheck-s",
        "0.2",
        "--nvidia-smi",
        smi_path.to_str().unwrap(),
        "--work-dir",
        work.to_str().unwrap(),
        "--cache-dir",
        dir.path().join("cache").to_str().unwrap(),
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let agent_metrics = format!(
        "http://{}/metrics",
        agent.addr_after("metrics listening on ")
    );

    let replica = until("the model's replica is ready", || async {
        let rows = get(format!("{admin}/api/v1/replicas")).await;
        ready_replicas(&rows).into_iter().next()
    })
    .await;
    let replica_id = replica["id"].as_str().unwrap().to_owned();
    until("the gateway routes to it", || async {
        let r = reqwest::get(format!("{base}/ready")).await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    let http = reqwest::Client::new();
    let answer = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "chat", "stream": true, "max_tokens": 4,
                      "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.text().await.unwrap().contains("[DONE]"));
    let unknown = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "anything a client types", "max_tokens": 1,
                      "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);

    // The request is counted when its stream ends on the server, a moment
    // after the client has read it.
    let page = until("the request counted with its model", || async {
        let page = scrape(&server_metrics).await;
        let counted = page.get("llmgw_requests_total{model=\"chat\",status=\"200\"}") == Some(1.0)
            && page.get("llmgw_ttft_seconds_count{model=\"chat\"}") == Some(1.0)
            && page.get("llmgw_model_replicas_ready{model=\"chat\"}") == Some(1.0);
        counted.then_some(page)
    })
    .await;
    page.every_series_has_one_help();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        page.value(&format!("llmgw_build_info{{version=\"{version}\"}}")),
        1.0
    );
    assert_eq!(page.value("llmgw_leader"), 1.0);
    assert!(page.value("llmgw_lease_epoch") >= 1.0);
    assert_eq!(
        page.value("llmgw_node_up{node=\"n1\",state=\"ready\"}"),
        1.0
    );
    assert!(page.value("llmgw_node_last_seen_seconds{node=\"n1\"}") >= 0.0);
    let free = page.value("llmgw_node_disk_free_bytes{node=\"n1\"}");
    let total = page.value("llmgw_node_disk_total_bytes{node=\"n1\"}");
    assert!(free > 0.0 && total >= free, "free {free} of {total}");
    assert_eq!(page.value("llmgw_replicas{state=\"ready\"}"), 1.0);
    assert_eq!(
        page.value("llmgw_requests_total{model=\"unknown\",status=\"404\"}"),
        1.0,
        "a model nobody knows is counted as unknown"
    );
    assert!(!page.text.contains("anything a client types"));
    assert_eq!(
        page.value(&format!(
            "llmgw_endpoint_in_flight{{endpoint=\"{replica_id}\",node=\"n1\"}}"
        )),
        0.0,
        "a placed replica's endpoint names its node"
    );
    for t in [
        "LeadershipAcquired",
        "NodeRegistered",
        "ReplicaPlaced",
        "ReplicaReady",
    ] {
        assert!(
            page.value(&format!("llmgw_events_appended_total{{type=\"{t}\"}}")) >= 1.0,
            "{t}"
        );
    }
    assert!(page.value("llmgw_append_seconds_count") >= 4.0);
    assert_eq!(
        page.value("llmgw_append_seconds_bucket{le=\"+Inf\"}"),
        page.value("llmgw_append_seconds_count")
    );
    assert!(
        page.value("llmgw_append_batch_events_sum")
            >= page.value("llmgw_append_batch_events_count")
    );
    assert!(page.value("llmgw_projection_lag_events") >= 0.0);
    assert!(page.value("llmgw_projection_lag_seconds") >= 0.0);
    assert_eq!(page.value("llmgw_chain_verify_failures_total"), 0.0);
    assert!(page.value("llmgw_chain_verified_position") >= 1.0);
    // Every connection is a file: how many are open, and the most that
    // may be (the soft limit the server raised at start).
    let soft = super::connections::open_files(server.process.id()) as f64;
    assert_eq!(page.value("llmgw_process_max_fds"), soft);
    let open = page.value("llmgw_process_open_fds");
    assert!(open >= 4.0 && open < soft, "{open} open of {soft}");
    let gpu = |name: &str| format!("llmgw_gpu_{name}{{node=\"n1\",gpu=\"0\"}}");
    const MIB: f64 = 1024.0 * 1024.0;
    assert_eq!(page.value(&gpu("memory_used_bytes")), 300.0 * MIB);
    assert_eq!(page.value(&gpu("memory_total_bytes")), 81559.0 * MIB);
    assert_eq!(page.value(&gpu("utilization_ratio")), 0.37);
    assert_eq!(page.value(&gpu("ecc_errors")), 0.0);
    assert_eq!(page.value(&gpu("temperature_celsius")), 41.0);

    // The agent looks at its GPUs again; the next heartbeat carries it.
    smi(dir.path(), &gpu_row(77));
    until("the new temperature", || async {
        let page = scrape(&server_metrics).await;
        (page.get(&gpu("temperature_celsius")) == Some(77.0)).then_some(())
    })
    .await;

    let page = until("the agent's shard is ready on its page", || async {
        let page = scrape(&agent_metrics).await;
        (page.get("llmgw_agent_shards{state=\"ready\"}") == Some(1.0)).then_some(page)
    })
    .await;
    page.every_series_has_one_help();
    assert_eq!(page.value("llmgw_agent_connected"), 1.0);
    assert_eq!(page.value("llmgw_agent_reconnects_total"), 0.0);
    assert_eq!(
        page.value(&format!("llmgw_build_info{{version=\"{version}\"}}")),
        1.0
    );
    // A node gone quiet shows no figures: its last ones (a card's
    // temperature, its disk) stayed for ever, and a removed node's until
    // the leader restarted.
    drop(agent);
    let page = until("the quiet node's figures gone", || async {
        let page = scrape(&server_metrics).await;
        (page
            .get("llmgw_node_up{node=\"n1\",state=\"ready\"}")
            .is_none()
            && page.get(&gpu("temperature_celsius")).is_none())
        .then_some(page)
    })
    .await;
    assert!(
        page.get("llmgw_node_disk_free_bytes{node=\"n1\"}")
            .is_none(),
        "{}",
        page.text
    );
    drop(server);
    drop(sweep);
}

/// An event this build cannot read (a newer build's) is left out of the
/// views, and the metrics page says so: how many, and which kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_the_views_left_out_are_counted_with_their_kinds() {
    use llmgw_eventstore::{ExpectedVersion, NewEvent, StreamAppend};
    let future = NewEvent::new("FromTheFuture", 3, json!({"x": 1}));
    let (store, _scratch, _log) = super::store_with(
        Backend::Sqlite,
        [vec![StreamAppend::new(
            "later",
            ExpectedVersion::Any,
            vec![future],
        )]],
    )
    .await;
    let engine = super::tiny_engine();
    let endpoint = format!("e1=http://{}=tiny", engine.addr_after("listening on "));
    let server = Child::spawn(&[
        "--store",
        &store,
        "server",
        "--endpoint",
        &endpoint,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let metrics = format!(
        "http://{}/metrics",
        server.addr_after("metrics listening on ")
    );
    let page = until("the views have read the log", || async {
        let page = scrape(&metrics).await;
        (page.get("llmgw_projection_skipped_events_total") == Some(1.0)).then_some(page)
    })
    .await;
    assert_eq!(
        page.value("llmgw_projection_unknown_event_kinds{type=\"FromTheFuture\",schema=\"3\"}"),
        1.0
    );
    page.every_series_has_one_help();
}
