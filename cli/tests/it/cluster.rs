//! Server, agents and sim engines as separate processes on loopback: the
//! control plane's promises as clients and operators see them.
//!
//! Each test's nodes bind their own loopback addresses (127.0.N.x), so that
//! engines of different nodes share ports without clashing, and so that a
//! test can find and clean up the engines its agents leave running.

use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::Child;
use serde_json::{Value, json};

/// Engines outlive their agents by design; this kills the ones a test's
/// nodes started when the test ends.
pub(crate) struct EngineSweeper(pub(crate) String);

impl EngineSweeper {
    /// `(pid, cmdline)` of every sim engine bound under this prefix.
    pub(crate) fn engines(&self) -> Vec<(u32, String)> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            if cmd.contains("sim-engine") && cmd.contains(&format!("--listen {}", self.0)) {
                out.push((pid, cmd));
            }
        }
        out
    }
}

impl Drop for EngineSweeper {
    fn drop(&mut self) {
        for (pid, _) in self.engines() {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
    }
}

/// Kills, when dropped, the engines an agent's work directory records
/// (its state files' process groups): engines outlive their agents by
/// design, so a test stops the ones it caused even when it fails, and
/// nothing else on the machine.
pub(crate) struct StateFileSweeper(pub(crate) std::path::PathBuf);

impl Drop for StateFileSweeper {
    fn drop(&mut self) {
        for entry in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            let Ok(text) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            let Ok(record) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            for pgid in record["pids"].as_array().into_iter().flatten() {
                if let Some(pgid) = pgid.as_u64().filter(|p| *p > 1) {
                    let _ = std::process::Command::new("kill")
                        .args(["-9", "--", &format!("-{pgid}")])
                        .status();
                }
            }
        }
    }
}

/// A port free now, for a listener a test names before it starts (an
/// agent listener that agents and a standby are told of). Taken from
/// 22000–26999, below the kernel's ephemeral range (32768 up): a port the
/// kernel handed out (bind to 0) was soon another connection's source
/// port, and the server meant to bind it failed to start. A counter keeps
/// this process's tests from being given one port twice.
pub(crate) fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 22_000;
    const SPAN: u32 = 5_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id() % SPAN;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free port left in {FIRST}..{}", FIRST + SPAN);
        let port = (FIRST + (start + n) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

pub(crate) fn model_yaml(min: u32) -> String {
    // min 0 is on demand (max 0 could never serve, and is refused).
    let max = min.max(1);
    format!(
        r#"name: chat
scaling: {{min: {min}, max: {max}}}
profiles:
  - name: sim
    engine: sim
"#
    )
}

/// A server configuration; `min: 0` leaves the catalog empty (models are
/// added with `ctl model add`).
pub(crate) fn server_yaml(
    dir: &std::path::Path,
    name: &str,
    store: &str,
    agent_port: u16,
    min: u32,
) -> String {
    let path = dir.join(format!("{name}.yaml"));
    let models = if min == 0 {
        "models: []\n".to_owned()
    } else {
        let indented: String = model_yaml(min)
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect();
        format!("models:\n  - {}", indented.trim_start())
    };
    std::fs::write(
        &path,
        format!(
            r#"listen: "127.0.0.1:0"
admin_listen: "127.0.0.1:0"
agent_listen: "127.0.0.1:{agent_port}"
store: "{store}"
control:
  instance: {name}
  interval: 200ms
  lease_ttl: 2s
  unreachable_after: 1s
  lost_after: 2500ms
  base_backoff: 300ms
  drain_grace: 1s
  port_range: [30100, 30199]
  enabled: true
{models}"#
        ),
    )
    .unwrap();
    path.display().to_string()
}

pub(crate) struct ServerProc {
    pub(crate) child: Child,
    pub(crate) base: String,
    pub(crate) admin: String,
}

pub(crate) fn start_server(config: &str) -> ServerProc {
    let child = Child::spawn(&["server", "--config", config]);
    let _agents = child.addr_after("agent listening on ");
    let base = format!("http://{}", child.addr_after("client listening on "));
    let admin = format!("http://{}", child.addr_after("admin listening on "));
    ServerProc { child, base, admin }
}

pub(crate) fn start_agent(servers: &str, node: &str, ip: &str) -> Child {
    let work = std::env::temp_dir().join(format!("llmgw-agent-{ip}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    start_agent_in(servers, node, ip, &work)
}

pub(crate) fn start_agent_in(servers: &str, node: &str, ip: &str, work: &std::path::Path) -> Child {
    Child::spawn(&[
        "agent",
        "run",
        "--server",
        servers,
        "--node-id",
        node,
        "--mgmt-addr",
        ip,
        "--engine-bind",
        ip,
        "--heartbeat-s",
        "0.2",
        "--reconnect-max-s",
        "0.5",
        "--skip-gpus",
        "--work-dir",
        work.to_str().unwrap(),
    ])
}

pub(crate) async fn get(url: String) -> Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

pub(crate) use super::until;

pub(crate) fn ready_replicas(rows: &Value) -> Vec<Value> {
    rows.as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == "ready")
        .cloned()
        .collect()
}

/// Four clients streaming chat completions back to back until stopped.
/// Every answer must be whole and the same each time for a client (the
/// sim engine is deterministic): `[DONE]`, no error event, one id, the
/// text of the client's first answer; anything else is a failure.
pub(crate) struct Clients {
    stop: Arc<AtomicBool>,
    pub(crate) done: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<Vec<String>>>,
}

/// The text of a whole, single answer, or what is wrong with it.
fn one_answer(raw: &str) -> Result<String, String> {
    if !raw.trim_end().ends_with("data: [DONE]") {
        return Err(format!("cut short: {raw}"));
    }
    let events: Vec<Value> = raw
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).map_err(|_| format!("not JSON: {e}")))
        .collect::<Result<_, _>>()?;
    if events.iter().any(|e| e.get("error").is_some()) {
        return Err(format!("an error event: {raw}"));
    }
    if events.iter().any(|e| e["id"] != events[0]["id"]) {
        return Err(format!("two answers' ids: {raw}"));
    }
    Ok(events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect())
}

impl Clients {
    pub(crate) fn start(base: &str) -> Clients {
        Clients::streaming(base, 8)
    }

    fn streaming(base: &str, max_tokens: u32) -> Clients {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let tasks = (0..4)
            .map(|i| {
                let (stop, done, base) = (stop.clone(), done.clone(), base.to_owned());
                tokio::spawn(async move {
                    let http = reqwest::Client::new();
                    let mut failures = Vec::new();
                    let mut first: Option<String> = None;
                    while !stop.load(Ordering::Relaxed) {
                        let body = json!({"model": "chat", "stream": true, "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": format!("client {i}")}]});
                        let r = http
                            .post(format!("{base}/v1/chat/completions"))
                            .json(&body)
                            .send()
                            .await;
                        match r {
                            Ok(r) if r.status() == 200 => {
                                match r.text().await.map(|t| one_answer(&t)) {
                                    Ok(Ok(t)) if first.as_ref().is_none_or(|f| *f == t) => {
                                        first = Some(t);
                                        done.fetch_add(1, Ordering::Relaxed);
                                    }
                                    Ok(Ok(t)) => failures
                                        .push(format!("another answer: {t:?} after {first:?}")),
                                    Ok(Err(e)) => failures.push(e),
                                    Err(e) => failures.push(format!("body: {e}")),
                                }
                            }
                            Ok(r) => failures.push(format!(
                                "{}: {}",
                                r.status(),
                                r.text().await.unwrap_or_default()
                            )),
                            Err(e) => failures.push(format!("send: {e}")),
                        }
                    }
                    failures
                })
            })
            .collect();
        Clients { stop, done, tasks }
    }

    pub(crate) async fn wait_for_more(&self, n: u64) {
        let target = self.done.load(Ordering::Relaxed) + n;
        until("clients to make progress", || async {
            (self.done.load(Ordering::Relaxed) >= target).then_some(())
        })
        .await;
    }

    pub(crate) async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut failures = Vec::new();
        for t in self.tasks {
            failures.extend(t.await.unwrap());
        }
        (self.done.load(Ordering::Relaxed), failures)
    }
}

/// Drill (b) of issue 14: a node (its agent and its engines) SIGKILLed
/// under four streaming clients. The streams it was serving go on on the
/// other replica (request migration), no request fails, and the replica is
/// rebuilt on a survivor. Prints the figures recorded in
/// docs/benchmarks.md ("Faults").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_loses_no_stream_and_its_replica_is_rebuilt_on_a_survivor() {
    let sweep = EngineSweeper("127.0.1.".into());
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let config = server_yaml(dir.path(), "solo", &store, port, 0);
    let server = start_server(&config);
    let servers = format!("http://127.0.0.1:{port}");
    let ip = |i: usize| format!("127.0.1.{}", i + 2);
    let mut agents: Vec<(String, Child)> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, n)| (n.to_string(), start_agent(&servers, n, &ip(i))))
        .collect();
    until("three nodes", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes.as_array().unwrap().len() == 3).then_some(())
    })
    .await;
    // The operator adds the model once the nodes are in, so its replicas
    // spread over them.
    let model = dir.path().join("chat.yaml");
    std::fs::write(&model, model_yaml(2)).unwrap();
    let (ok, out, err) = ctl(&server.admin, &["model", "add", model.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("model chat added"), "{out}");
    let replicas = until("two replicas ready", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        let ready = ready_replicas(&rows);
        (ready.len() == 2).then_some(ready)
    })
    .await;
    until("the gateway routes", || async {
        let r = reqwest::get(format!("{}/ready", server.base)).await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    // 40 tokens at the sim's 100 a second: streams of about 0.4 s, so the
    // node dies with some of them half sent.
    let clients = Clients::streaming(&server.base, 40);
    clients.wait_for_more(20).await;

    let victim = replicas[0]["shards"][0]["node"]
        .as_str()
        .unwrap()
        .to_owned();
    let at = agents.iter().position(|(n, _)| *n == victim).unwrap();
    let victim_ip = ip(["a", "b", "c"].iter().position(|n| *n == victim).unwrap());
    let engine = format!(
        "http://{victim_ip}:{}/metrics",
        replicas[0]["shards"][0]["port"]
    );
    // Killed while it streams (the sim's own gauge).
    until("a stream on the node", || async {
        let page = reqwest::get(&engine).await.ok()?.text().await.ok()?;
        page.lines()
            .any(|l| l.starts_with("llmgw_sim_running ") && !l.ends_with(" 0"))
            .then_some(())
    })
    .await;
    let (_, mut killed) = agents.remove(at);
    let engines: Vec<u32> = sweep
        .engines()
        .into_iter()
        .filter(|(_, cmd)| cmd.contains(&format!("--listen {victim_ip}:")))
        .map(|(pid, _)| pid)
        .collect();
    assert!(!engines.is_empty());
    let t0 = Instant::now();
    killed.process.kill().unwrap();
    for pid in &engines {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    let _ = killed.process.wait();
    let done_at_kill = clients.done.load(Ordering::Relaxed);

    until("the node is lost", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        nodes
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == victim.as_str() && n["state"] == "lost")
            .then_some(())
    })
    .await;
    let lost_after = t0.elapsed();
    let rebuilt = until(
        "two replicas ready again, none on the lost node",
        || async {
            let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
            let ready = ready_replicas(&rows);
            let off = ready
                .iter()
                .all(|r| r["shards"][0]["node"] != victim.as_str());
            (ready.len() == 2 && off).then_some(ready)
        },
    )
    .await;
    let rebuilt_after = t0.elapsed();
    assert!(rebuilt.iter().any(|r| r["id"] != replicas[0]["id"]));
    clients.wait_for_more(20).await;
    let (done, failures) = clients.finish().await;
    assert!(
        failures.is_empty(),
        "{} of {} requests failed: {:?}",
        failures.len(),
        done,
        &failures[..failures.len().min(5)]
    );
    assert!(done >= 40);
    let page = reqwest::get(format!("{}/metrics", server.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let resumed: u64 = page
        .lines()
        .find_map(|l| l.strip_prefix("llmgw_migrations_total{model=\"chat\",outcome=\"resumed\"} "))
        .map_or(0, |v| v.parse().unwrap());
    assert!(resumed >= 1, "the node died with no stream on it: {page}");
    println!(
        "drill (b): node {victim} (agent + {} engine) SIGKILLed under 4 streaming clients: \
         {done} streams answered ({done_at_kill} before the kill), 0 failed; \
         {resumed} continued on another replica; node lost after {:.1} s, \
         capacity rebuilt (2 replicas ready) after {:.1} s",
        engines.len(),
        lost_after.as_secs_f64(),
        rebuilt_after.as_secs_f64(),
    );
    // The incident, captured from this log, is a replay test as written.
    super::capture::a_live_node_loss_becomes_a_passing_test(&store, &victim);
    drop(agents);
    drop(server);
    drop(sweep);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_adopts_running_engines_and_keeps_serving() {
    let sweep = EngineSweeper("127.0.2.".into());
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let config = server_yaml(dir.path(), "restart", &store, port, 1);
    let server = start_server(&config);
    let agent = start_agent(&format!("http://127.0.0.1:{port}"), "a", "127.0.2.2");
    let first = until("ready", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        ready_replicas(&rows).into_iter().next()
    })
    .await;
    let pids = until("one engine", || async {
        let e = sweep.engines();
        (e.len() == 1).then_some(e)
    })
    .await;

    // A clean stop, then a new server on the same log and agent port.
    let ServerProc { child, .. } = server;
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.process.id().to_string()])
        .status();
    drop(child);
    let server = start_server(&config);
    let replicas = until("the replica serves through the new server", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        let ready = ready_replicas(&rows);
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        let connected = nodes[0]["connected"] == true;
        (connected && ready.len() == 1).then_some(ready)
    })
    .await;
    assert_eq!(replicas[0]["id"], first["id"], "adopted, not replaced");
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "chat", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(sweep.engines(), pids, "the engine kept its process id");
    drop(agent);
    drop(server);
    drop(sweep);
}

/// Two servers on one log: the first started leads before the second
/// (its standby) starts. Each is `(instance name, agent port)`.
pub(crate) async fn leader_and_standby(
    dir: &std::path::Path,
    store: &str,
    (a, pa): (&str, u16),
    (b, pb): (&str, u16),
    min: u32,
) -> (ServerProc, ServerProc) {
    let leader = start_server(&server_yaml(dir, a, store, pa, min));
    until("the first server leads", || async {
        (get(format!("{}/api/v1/leader", leader.admin)).await["is_leader"] == true).then_some(())
    })
    .await;
    let standby = start_server(&server_yaml(dir, b, store, pb, min));
    (leader, standby)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_postgres_hand_over_without_a_failed_request() {
    let sweep = EngineSweeper("127.0.3.".into());
    let db = llmgw_testkit::TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (free_port(), free_port());
    let (first, second) =
        leader_and_standby(dir.path(), &db.url, ("first", pa), ("second", pb), 2).await;
    let servers = format!("http://127.0.0.1:{pa},http://127.0.0.1:{pb}");
    let agents: Vec<Child> = (2..4)
        .map(|i| start_agent(&servers, &format!("n{i}"), &format!("127.0.3.{i}")))
        .collect();
    // The standby routes from the shared log's views (its /ready); the
    // replicas are the leader's answer, forwarded.
    until("the standby's gateway is ready", || async {
        let r = reqwest::get(format!("{}/ready", second.base)).await.ok()?;
        let rows = get(format!("{}/api/v1/replicas", second.admin)).await;
        (r.status() == 200 && ready_replicas(&rows).len() == 2).then_some(())
    })
    .await;
    // What only the leader knows (the agents' streams) is the leader's
    // answer through the standby too: every node connected, heartbeating.
    let nodes = get(format!("{}/api/v1/nodes", second.admin)).await;
    let nodes = nodes.as_array().unwrap();
    assert!(
        nodes.len() == 2
            && nodes
                .iter()
                .all(|n| n["connected"] == true && n["last_heartbeat_s"].is_number()),
        "{nodes:?}"
    );
    let before = get(format!("{}/api/v1/replicas?all=true", second.admin)).await;
    let clients = Clients::start(&second.base);
    clients.wait_for_more(20).await;

    let stopped = Instant::now();
    let ServerProc { child, .. } = first;
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.process.id().to_string()])
        .status();
    until("the standby leads", || async {
        (get(format!("{}/api/v1/leader", second.admin)).await["is_leader"] == true).then_some(())
    })
    .await;
    let took = stopped.elapsed();
    assert!(took < Duration::from_secs(3), "handover took {took:?}");
    until("both agents follow to the new leader", || async {
        let nodes = get(format!("{}/api/v1/nodes", second.admin)).await;
        nodes
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["connected"] == true)
            .then_some(())
    })
    .await;
    clients.wait_for_more(20).await;
    let (done, failures) = clients.finish().await;
    assert!(
        failures.is_empty(),
        "{} of {} requests failed: {:?}",
        failures.len(),
        done,
        &failures[..failures.len().min(5)]
    );
    let after = get(format!("{}/api/v1/replicas?all=true", second.admin)).await;
    assert_eq!(before, after, "nothing was placed twice or restarted");
    drop(child);
    drop(agents);
    drop(second);
    drop(sweep);
}

/// `llmgw up` on ports of its own, keeping its log in `data`.
fn up(data: &std::path::Path, more: &[&str]) -> Child {
    let mut args = vec![
        "up",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ];
    args.extend_from_slice(more);
    Child::spawn(&args)
}

/// One `llmgw up` at a time: each puts its engine on 127.0.0.1:20000,
/// the agent's first engine port, where the tests count engines.
static UP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `up` honours LLMGW_ADMIN_TOKEN as `server` does: it was ignored, the
/// admin API left open while `ctl` sent a token nothing asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llmgw_up_guards_its_admin_api_with_the_token_given() {
    let _one = UP.lock().await;
    let sweep = EngineSweeper("127.0.0.1:20".into());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data").display().to_string();
    let token = "0123456789abcdef0123";
    let up = Child::spawn_env(
        &[
            "up",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--data-dir",
            &data,
        ],
        &[("LLMGW_ADMIN_TOKEN", token.to_owned())],
    );
    let status = format!(
        "http://{}/api/v1/status",
        up.addr_after("admin listening on ")
    );
    let http = reqwest::Client::new();
    let bare = http.get(&status).send().await.unwrap();
    assert_eq!(bare.status(), 401);
    let with = http.get(&status).bearer_auth(token).send().await.unwrap();
    assert_eq!(with.status(), 200);
    drop(up);
    drop(sweep);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llmgw_up_serves_a_model_and_prints_a_curl_that_works() {
    let _one = UP.lock().await;
    // Made first, dropped last: a failed assertion kills `up` (the child's
    // drop) and this then stops its engine, which the next test would see.
    let sweep = EngineSweeper("127.0.0.1:20".into());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = up(&data, &[]);
    assert!(Child::expect(&up.stdout, "llmgw is up").contains("serving"));
    let endpoint = up.addr_after("  endpoint  ");
    // Where its log is, as a command that reads it.
    let log = up.addr_after("  log       ");
    let stats = log
        .strip_prefix("llmgw ")
        .unwrap_or_else(|| panic!("{log}"));
    let read = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(stats.split(' '))
        .output()
        .unwrap();
    assert!(
        read.status.success() && String::from_utf8_lossy(&read.stdout).contains("events "),
        "{read:?}"
    );
    let curl = Child::expect(&up.stdout, "curl ");
    assert!(
        curl.contains(&format!("{endpoint}/chat/completions")),
        "{curl}"
    );
    // The printed command, as a person would paste it.
    let out = std::process::Command::new("sh")
        .args(["-c", curl.trim()])
        .output()
        .unwrap();
    let answer: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)));
    assert!(
        answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .len()
            > 1
    );
    assert!(
        data.join("llmgw.db").exists(),
        "the log lives in the data directory"
    );
    assert_eq!(
        huge_pages_kib(up.process.id()),
        0,
        "the allocator asked for transparent huge pages: whole 2 MiB pages for a sparse heap"
    );
    // The engine listens on loopback only, like the rest of `up`; Ctrl-C
    // stops it with everything else.
    assert_eq!(sweep.engines().len(), 1, "one engine, on 127.0.0.1");
    // A second `up` on the same data is refused (it used to stand by,
    // adopt this one's engine and stop it on its way out).
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success() && said.contains("another llmgw up is running on"),
        "{said}"
    );
    assert_eq!(sweep.engines().len(), 1, "the engine still runs");
    let mut up = up;
    let _ = std::process::Command::new("kill")
        .args(["-INT", &up.process.id().to_string()])
        .status();
    until("the engine stops with llmgw up", || async {
        sweep.engines().is_empty().then_some(())
    })
    .await;
    until("llmgw up exits on Ctrl-C", || {
        let exited = up.process.try_wait().unwrap().is_some();
        async move { exited.then_some(()) }
    })
    .await;

    // Again, on the same data: the engine stopped on purpose is not taken
    // for failed (a failure would also hold the model back ~10 s).
    let again = self::up(&data, &[]);
    assert!(Child::expect(&again.stdout, "llmgw is up").contains("serving"));
    let store = format!("sqlite://{}", data.join("llmgw.db").display());
    let events = super::json_lines(&super::ok(
        &store,
        &[
            "events", "tail", "--type", "Replica*", "--from", "1", "--json",
        ],
    ));
    let types: Vec<&str> = events
        .iter()
        .map(|e| e["event_type"].as_str().unwrap())
        .collect();
    assert!(!types.contains(&"ReplicaFailed"), "{events:#?}");
    let stopped = events
        .iter()
        .find(|e| e["event_type"] == "ReplicaStopped")
        .unwrap_or_else(|| panic!("no ReplicaStopped: {events:#?}"));
    assert_eq!(
        stopped["payload"]["reason"], "its agent stopped it on a clean exit",
        "{stopped}"
    );
    assert_eq!(
        types.iter().filter(|t| **t == "ReplicaReady").count(),
        2,
        "{types:?}"
    );
    drop(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ctrl_c_while_llmgw_up_waits_for_its_model_stops_everything() {
    let _one = UP.lock().await;
    let sweep = EngineSweeper("127.0.0.1:20".into());
    let dir = tempfile::tempdir().unwrap();
    let mut up = up(&dir.path().join("data"), &["--wait-s", "600"]);
    // Listening, and from now on waiting for the model to serve.
    Child::expect(&up.stdout, "client listening on");
    let _ = std::process::Command::new("kill")
        .args(["-INT", &up.process.id().to_string()])
        .status();
    until("llmgw up exits on Ctrl-C", || {
        let exited = up.process.try_wait().unwrap().is_some();
        async move { exited.then_some(()) }
    })
    .await;
    assert!(
        sweep.engines().is_empty(),
        "an engine outlived llmgw up: {:?}",
        sweep.engines()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_model_starts_for_a_request_and_stops_when_idle() {
    let sweep = EngineSweeper("127.0.4.".into());
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let config = server_yaml(dir.path(), "lazy", &store, port, 0);
    let server = start_server(&config);
    let _agent = start_agent(&format!("http://127.0.0.1:{port}"), "a", "127.0.4.2");
    until("the node", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes.as_array().unwrap().len() == 1).then_some(())
    })
    .await;
    let model = dir.path().join("lazy.json");
    std::fs::write(
        &model,
        json!({"name": "lazy", "scaling": {"min": 0, "max": 1, "idle_timeout_s": 1},
               "profiles": [{"name": "sim", "engine": "sim", "args": ["--tps", "10"]}]})
        .to_string(),
    )
    .unwrap();
    let (ok, _, err) = ctl(&server.admin, &["model", "add", model.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(sweep.engines().is_empty(), "nothing runs before a request");
    // A stream longer than the idle time (3 s at 10 tokens a second): the
    // model serving it is in use, not idle, however long ago it was asked.
    let mut r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "lazy", "max_tokens": 30, "stream": true,
            "messages": [{"role": "user", "content": "wake up"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the request waited for the model to start");
    let mut text = String::new();
    let mut looked = false;
    while let Some(chunk) = r.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
        if !looked && text.matches("data: ").count() > 22 {
            // Past two seconds of answer: twice the idle time.
            looked = true;
            let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
            assert_eq!(rows[0]["status"], "ready", "serving, not idle: {rows}");
        }
    }
    assert!(looked, "{text}");
    assert!(
        text.trim_end().ends_with("data: [DONE]") && !text.contains("upstream_lost"),
        "{text}"
    );
    // Idle past its timeout: drained, then stopped.
    until("the idle replica is stopped", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        (rows.as_array().unwrap().is_empty() && sweep.engines().is_empty()).then_some(())
    })
    .await;
    let all = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
    assert_eq!(all[0]["status"], "stopped");
    assert_eq!(all[0]["shards"][0]["state"], "stopped", "{all}");
    // The log says why it was drained.
    let drained = super::ok(
        &store,
        &["events", "tail", "--type", "ReplicaDraining", "--json"],
    );
    assert!(
        drained.contains("\"why\":\"not asked for within its idle time\""),
        "{drained}"
    );
    // An unknown model is still a 404.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "nope", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// A model's context_length reaches its engine: a request whose prompt
/// and completion do not fit is refused by the engine with its own
/// message (it was read only to trim threads), and a change to it
/// restarts the replica with the new length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_models_context_length_reaches_its_engine_and_a_change_restarts_it() {
    let _sweep = EngineSweeper("127.0.16.".into());
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let config = server_yaml(dir.path(), "ctx", &store, port, 0);
    let server = start_server(&config);
    let _agent = start_agent(&format!("http://127.0.0.1:{port}"), "a", "127.0.16.2");
    let model = dir.path().join("short.json");
    // `model add` adds, or updates a model that exists.
    let add = |len: u32| {
        std::fs::write(
            &model,
            json!({"name": "short", "context_length": len, "scaling": {"min": 1, "max": 1},
                   "profiles": [{"name": "sim", "engine": "sim"}]})
            .to_string(),
        )
        .unwrap();
        let (ok, _, err) = ctl(&server.admin, &["model", "add", model.to_str().unwrap()]);
        assert!(ok, "{err}");
    };
    add(64);
    let ask = |words: usize| {
        let url = format!("{}/v1/chat/completions", server.base);
        async move {
            reqwest::Client::new()
                .post(url)
                .json(&json!({"model": "short", "max_tokens": 8,
                    "messages": [{"role": "user", "content": "word ".repeat(words)}]}))
                .send()
                .await
                .unwrap()
        }
    };
    until("the model to serve", || async {
        (ask(2).await.status() == 200).then_some(())
    })
    .await;
    let listed = get(format!("{}/v1/models", server.base)).await;
    assert_eq!(listed["data"][0]["context_length"], 64, "{listed}");
    // The chat page asks up to 512 tokens and sends the whole
    // conversation: fitted to the 64-token context (the oldest turns left
    // out, the answer's length lowered), it is answered, where every turn
    // was refused.
    let mut conversation = vec![json!({"role": "system", "content": "be brief"})];
    for i in 0..4 {
        conversation.push(
            json!({"role": "user", "content": format!("question {i} {}", "word ".repeat(8))}),
        );
        conversation.push(
            json!({"role": "assistant", "content": format!("answer {i} {}", "word ".repeat(8))}),
        );
    }
    conversation.push(json!({"role": "user", "content": "and now?"}));
    let page = reqwest::Client::new()
        .post(format!("{}/chat/completions", server.base))
        .json(
            &json!({"model": "short", "max_tokens": 512, "stream": true, "messages": conversation}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let said = page.text().await.unwrap();
    assert!(
        said.contains("[DONE]") && !said.contains("\"error\""),
        "{said}"
    );
    let refused = ask(60).await;
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 64 tokens"),
        "{body}"
    );
    // A longer context: the replica is replaced, and the request fits.
    add(4096);
    until("the request to fit the new length", || async {
        (ask(60).await.status() == 200).then_some(())
    })
    .await;
}

/// A server restarted while an on-demand model serves keeps it up for its
/// idle time: when it was last asked for is memory, not log, and a new
/// term knew none, so it drained every running on-demand model at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_keeps_a_running_on_demand_model_up() {
    let sweep = EngineSweeper("127.0.96.".into());
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let config = server_yaml(dir.path(), "again", &store, port, 0);
    let server = start_server(&config);
    let _agent = start_agent(&format!("http://127.0.0.1:{port}"), "a", "127.0.96.2");
    let model = dir.path().join("od.json");
    std::fs::write(
        &model,
        json!({"name": "od", "scaling": {"min": 0, "max": 1, "idle_timeout_s": 600},
               "profiles": [{"name": "sim", "engine": "sim"}]})
        .to_string(),
    )
    .unwrap();
    until("the node", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes.as_array().unwrap().len() == 1).then_some(())
    })
    .await;
    let (ok, _, err) = ctl(&server.admin, &["model", "add", model.to_str().unwrap()]);
    assert!(ok, "{err}");
    let ask = |base: String| async move {
        reqwest::Client::new()
            .post(format!("{base}/v1/chat/completions"))
            .json(&json!({"model": "od", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(ask(server.base.clone()).await, 200);
    let before = get(format!("{}/api/v1/replicas", server.admin)).await;
    let engines = sweep.engines();
    server.child.terminate();
    drop(server);
    let again = start_server(&config);
    until("the restarted server leads", || async {
        super::failover::is_leader(&again.admin).await.then_some(())
    })
    .await;
    // From its first pass, the new term wants the running model kept.
    let status = get(format!("{}/api/v1/status", again.admin)).await;
    assert_eq!(status["replicas_wanted"], 1, "{status}");
    let after = get(format!("{}/api/v1/replicas", again.admin)).await;
    assert_eq!(after[0]["replica_id"], before[0]["replica_id"], "{after}");
    assert_eq!(after[0]["status"], "ready", "not drained: {after}");
    assert_eq!(sweep.engines(), engines, "the engine was kept");
    assert_eq!(ask(again.base.clone()).await, 200);
}

/// An on-demand model that is the fallback of a model with no capacity is
/// started by a request for that model, which waits for it and is served
/// by it (before, the request got 503 and the fallback was never asked
/// for, nor kept up while it served fallback traffic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_fallback_is_started_for_a_model_without_capacity() {
    let _sweep = EngineSweeper("127.0.82.".into());
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let config = server_yaml(dir.path(), "falls", &store, port, 0);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text = text.replace("models: []\n", "");
    // main fits nowhere (no node is on mars); od starts when asked.
    // far, on demand, fits nowhere either: asked for, it is refused at
    // once, not after the whole on_demand_wait.
    text.push_str(
        "router:\n  on_demand_wait: 10m\nmodels:\n  - name: main\n    fallbacks: [od]\n    scaling: {min: 1, max: 1}\n    profiles:\n      - name: sim\n        engine: sim\n        node_selector: {zone: mars}\n  - name: od\n    scaling: {min: 0, max: 1}\n    profiles:\n      - name: sim\n        engine: sim\n  - name: far\n    scaling: {min: 0, max: 1}\n    profiles:\n      - name: sim\n        engine: sim\n        node_selector: {zone: mars}\n",
    );
    std::fs::write(&config, text).unwrap();
    let server = start_server(&config);
    let _agent = start_agent(&format!("http://127.0.0.1:{port}"), "a", "127.0.82.2");
    until("the node", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes.as_array().unwrap().len() == 1).then_some(())
    })
    .await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "main", "max_tokens": 2, "messages": [{"role": "user", "content": "anyone?"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert_eq!(r.headers()["x-llmgw-served-model"], "od");
    // The operator sees why main has no replica without reading the
    // leader's log; od, below no floor, is not called unplaced.
    let (ok, table, err) = ctl(&server.admin, &["models"]);
    assert!(ok, "{err}");
    assert!(
        table.contains("main fits nowhere (") && table.contains("zone"),
        "{table}"
    );
    assert!(!table.contains("od fits nowhere"), "{table}");
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .timeout(std::time::Duration::from_secs(60))
        .json(&json!({"model": "far", "max_tokens": 2, "messages": [{"role": "user", "content": "anyone?"}]}))
        .send()
        .await
        .expect("answered at once, not after router.on_demand_wait");
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_unplaceable", "{body}");
    // The nodes and their labels are the operator's, not the client's.
    let said = body["error"]["message"].as_str().unwrap();
    assert!(
        said.contains("explain-placement far") && !said.contains("mars"),
        "{said}"
    );
    // Refused, it is not asked for: the status waits for main's place
    // alone (far's ask kept one more waiting for its idle time).
    let status = get(format!("{}/api/v1/status", server.admin)).await;
    assert_eq!(status["replicas_waiting"], 1, "{status}");

    // A model added that no node can take is said so at once; a client
    // asking for it, with no replica and nothing to fall back to, is told
    // it has no place (it got no_capacity, "right now", retried for ever).
    let file = dir.path().join("stuck.yaml");
    std::fs::write(
        &file,
        "name: stuck\nscaling: {min: 1, max: 1}\nprofiles:\n  - name: sim\n    engine: sim\n    node_selector: {zone: mars}\n",
    )
    .unwrap();
    let (ok, out, err) = ctl(&server.admin, &["model", "add", file.to_str().unwrap()]);
    assert!(
        ok && out.contains("model stuck added")
            && out.contains("no node of this cluster can take it")
            && out.contains("explain-placement stuck"),
        "{out}{err}"
    );
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "stuck", "max_tokens": 2, "messages": [{"role": "user", "content": "anyone?"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_unplaceable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("has no replica"),
        "{body}"
    );
    // A model on the mirror, where the server names no mirror: refused,
    // not added to fail every start while its requests wait.
    std::fs::write(
        &file,
        "name: mirrored\nsource: mirror:tiny/v1/tiny.gguf\nscaling: {min: 0, max: 1}\nprofiles:\n  - name: cpu\n    engine: llamacpp\n",
    )
    .unwrap();
    let (ok, out, err) = ctl(&server.admin, &["model", "add", file.to_str().unwrap()]);
    assert!(
        !ok && err.contains("names no mirror (mirror.url in server.yaml)"),
        "{out}{err}"
    );
    let (_, models, _) = ctl(&server.admin, &["models"]);
    assert!(!models.contains("mirrored"), "{models}");
    // An on-demand model whose engine fails at every start: the request
    // is told so once the first start failed, with when the next is, not
    // after the whole on_demand_wait (10 min here).
    std::fs::write(
        &file,
        "name: broken
scaling: {min: 0, max: 1}
profiles:
  - name: sim
    engine: sim
    args: [\"--no-such-flag\"]
",
    )
    .unwrap();
    let (ok, out, err) = ctl(&server.admin, &["model", "add", file.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .timeout(std::time::Duration::from_secs(60))
        .json(&json!({"model": "broken", "max_tokens": 2, "messages": [{"role": "user", "content": "anyone?"}]}))
        .send()
        .await
        .expect("answered once the start failed, not after router.on_demand_wait");
    assert_eq!(r.status(), 503);
    assert!(retry_after_s(&r) >= 1, "{:?}", r.headers());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_start_failed", "{body}");
    // The engine's complaint is the operator's, not the client's.
    let said = body["error"]["message"].as_str().unwrap();
    assert!(
        !said.contains("no-such-flag") && said.contains("ctl models"),
        "{said}"
    );
}

fn retry_after_s(r: &reqwest::Response) -> u64 {
    r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// `scaling.max` above `min` is reached under load: while the engines of
/// a model are full (requests waiting at the admission ceiling), the
/// leader adds a replica, and drains it once the model has been quiet for
/// its idle time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_grows_a_model_to_its_max_and_quiet_shrinks_it_back() {
    let _sweep = EngineSweeper("127.0.81.".into());
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let config = server_yaml(dir.path(), "grows", &store, port, 0);
    let mut text = std::fs::read_to_string(&config).unwrap();
    // One slot an engine, 20 tokens a second: three requests keep one
    // waiting; the load read every 100 ms.
    text = text.replace("models: []\n", "");
    text.push_str(
        "router:\n  scrape_interval: 100ms\nadmission:\n  waiting_ceiling: 1\nmodels:\n  - name: chat\n    scaling: {min: 1, max: 2, idle_timeout_s: 2}\n    profiles:\n      - name: sim\n        engine: sim\n        args: [\"--slots\", \"1\", \"--tps\", \"20\"]\n",
    );
    std::fs::write(&config, text).unwrap();
    let server = start_server(&config);
    let _agent = start_agent(&format!("http://127.0.0.1:{port}"), "a", "127.0.81.2");
    let ready = |n: usize| {
        let admin = server.admin.clone();
        async move {
            let rows = get(format!("{admin}/api/v1/replicas")).await;
            let rows = rows.as_array().unwrap();
            let ready = rows.iter().filter(|r| r["status"] == "ready").count();
            (rows.len() == n && ready == n).then_some(())
        }
    };
    until("one replica serves", || ready(1)).await;
    let client = reqwest::Client::new();
    let send = || {
        let (client, base) = (client.clone(), server.base.clone());
        tokio::spawn(async move {
            client
                .post(format!("{base}/v1/chat/completions"))
                .json(&json!({"model": "chat", "max_tokens": 40, "messages": [{"role": "user", "content": "busy"}]}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    // Kept busy until the second replica serves.
    let mut load: Vec<tokio::task::JoinHandle<_>> = (0..4).map(|_| send()).collect();
    let grown = until("load adds a replica", || {
        load.retain(|t| !t.is_finished());
        while load.len() < 4 {
            load.push(send());
        }
        ready(2)
    });
    grown.await;
    for t in load {
        let _ = t.await;
    }
    // Quiet past its idle time: back to min.
    until("the extra replica is drained", || ready(1)).await;
    let all = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
    let stopped = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == "stopped")
        .count();
    assert!(
        stopped >= 1,
        "what load added was drained and stopped: {all}"
    );
}

/// Issue 17 §4: a second on-demand model on a full node evicts the idle
/// one and serves. Each model's profile takes 60% of the node's memory, so
/// only one fits; the guards are shortened (min_lifetime 2s, evict_idle
/// 1s) and the domain's tests cover each of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_on_demand_replica_makes_room_for_another_model_asked_for() {
    let sweep = EngineSweeper("127.0.51.".into());
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let config = dir.path().join("evict.yaml");
    std::fs::write(
        &config,
        format!(
            r#"listen: "127.0.0.1:0"
admin_listen: "127.0.0.1:0"
agent_listen: "127.0.0.1:{port}"
store: "{store}"
control:
  instance: evict
  interval: 200ms
  min_lifetime: 2s
  evict_idle: 1s
  port_range: [30900, 30949]
  enabled: true
models: []
"#
        ),
    )
    .unwrap();
    let server = start_server(config.to_str().unwrap());
    let _agent = start_agent(&format!("http://127.0.0.1:{port}"), "a", "127.0.51.2");
    let memory = until("the node", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        nodes[0]["memory_total_mb"].as_u64().filter(|m| *m > 0)
    })
    .await;
    for name in ["first", "second"] {
        let model = dir.path().join(format!("{name}.json"));
        std::fs::write(
            &model,
            json!({"name": name, "scaling": {"min": 0, "max": 1, "idle_timeout_s": 600},
                   "profiles": [{"name": "sim", "engine": "sim", "memory_mb": memory * 6 / 10}]})
            .to_string(),
        )
        .unwrap();
        let (ok, _, err) = ctl(&server.admin, &["model", "add", model.to_str().unwrap()]);
        assert!(ok, "{err}");
    }
    let ask = |model: &'static str| {
        let base = server.base.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/chat/completions"))
                .json(&json!({"model": model, "max_tokens": 2,
                              "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    // One request, the one that started it: that is use of its replica
    // (it was never evicted when only a later request counted).
    assert_eq!(ask("first").await, 200, "first started for its request");
    // The node is full: second waits for first to be evicted (once it is
    // past its minimum lifetime and idle), then serves.
    assert_eq!(ask("second").await, 200, "second served after the eviction");
    let all = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
    let status = |model: &str| {
        all.as_array()
            .unwrap()
            .iter()
            .filter(|r| r["model"] == model)
            .map(|r| r["status"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(status("first"), ["stopped"], "{all}");
    assert_eq!(status("second"), ["ready"], "{all}");
    assert_eq!(sweep.engines().len(), 1, "one engine on the node");
    let log = super::ok(&store, &["events", "tail", "--json", "--limit", "200"]);
    let stopped = super::json_lines(&log)
        .into_iter()
        .find(|e| e["event_type"] == "ReplicaStopped")
        .expect("first was stopped");
    assert!(
        stopped["payload"]["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("drained")),
        "{stopped}"
    );
    let said = Child::expect(
        &server.child.stderr,
        "evicting an idle replica to make room",
    );
    assert!(
        said.contains("second"),
        "it names the model made room for: {said}"
    );
    let drained = super::ok(
        &store,
        &["events", "tail", "--type", "ReplicaDraining", "--json"],
    );
    assert!(
        drained.contains("evicted, idle, to make room for second"),
        "the log says why: {drained}"
    );
}

pub(crate) fn ctl(admin: &str, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .arg("ctl")
        .args(args)
        .args(["--admin", admin])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_reads_and_changes_the_cluster_as_tables_and_json() {
    let sweep = EngineSweeper("127.0.5.".into());
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let server = start_server(&server_yaml(dir.path(), "ops", &store, port, 1));
    let servers = format!("http://127.0.0.1:{port}");
    let _a = start_agent(&servers, "gpu-a", "127.0.5.2");
    let _b = start_agent(&servers, "gpu-b", "127.0.5.3");
    until("a ready replica and two nodes", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (ready_replicas(&rows).len() == 1 && nodes.as_array().unwrap().len() == 2).then_some(())
    })
    .await;
    let admin = server.admin.as_str();

    let (ok, status, _) = ctl(admin, &["status"]);
    assert!(
        ok && status.starts_with("1 of 1 models serving, on 2/2 nodes ready"),
        "{status}"
    );
    assert!(status.contains("replicas  1 ready (1 wanted)"), "{status}");
    assert!(status.contains("ops (leader)"), "{status}");
    let (_, nodes, _) = ctl(admin, &["nodes"]);
    let header = nodes.lines().next().unwrap();
    assert!(
        header.starts_with("NODE") && header.contains("HEARTBEAT"),
        "{nodes}"
    );
    assert!(
        nodes.contains("gpu-a") && nodes.contains("gpu-b"),
        "{nodes}"
    );
    let (_, replicas, _) = ctl(admin, &["replicas", "--model", "chat"]);
    assert!(
        replicas.contains("ready") && replicas.contains(":30100"),
        "{replicas}"
    );
    let (_, json, _) = ctl(admin, &["replicas", "--json"]);
    let rows: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(rows[0]["model"], "chat");
    // A model name that is none is a typo, said, not an empty table.
    let (ok, _, err) = ctl(admin, &["replicas", "--model", "caht"]);
    assert!(!ok && err.contains("no model or alias caht"), "{err}");
    // The client port given as --admin: said in one line, not its page.
    let (ok, _, err) = ctl(&server.base, &["status"]);
    assert!(
        !ok && err.contains("is not an llmgw admin API") && err.lines().count() == 1,
        "{err}"
    );

    let busy = rows[0]["shards"][0]["node"].as_str().unwrap().to_owned();
    let idle = if busy == "gpu-a" { "gpu-b" } else { "gpu-a" };
    let (ok, out, _) = ctl(admin, &["cordon", idle]);
    assert!(ok && out.contains("cordoned"), "{out}");
    // The status says a node takes no new work, beside the ready count.
    let (_, status, _) = ctl(admin, &["status"]);
    assert!(
        status.contains("on 2/2 nodes ready (1 cordoned: `llmgw ctl nodes`)"),
        "{status}"
    );
    let (_, explained, _) = ctl(admin, &["explain-placement", "chat"]);
    assert!(
        explained.contains(idle) && explained.contains("cordoned"),
        "{explained}"
    );
    // Of a model that runs, the verdict is about one more replica: said
    // so, not "chat fits nowhere" over a model that serves; at its max,
    // that none is placed (it read as one to come).
    assert!(
        explained.starts_with("chat runs 1 replica, its most (scaling.max 1): no further one is placed; with a higher max, one would go: chat "),
        "{explained}"
    );
    let (_, json, _) = ctl(admin, &["explain-placement", "chat", "--json"]);
    let e: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(e["profiles"][0]["candidates"].as_array().unwrap().len(), 2);
    let (_, again, _) = ctl(admin, &["cordon", idle]);
    assert!(again.starts_with("nothing to change"), "{again}");
    // A name beyond ASCII (a $USER or --as) travels too.
    let (ok, _, err) = ctl(admin, &["uncordon", idle, "--as", "jürgen 100%"]);
    assert!(ok, "{err}");
    // A change made with ctl is recorded as its operator's, as a key is.
    let history = super::ok(&store, &["events", "tail", "--limit", "200", "--json"]);
    let actor_of = |kind: &str| {
        super::json_lines(&history)
            .into_iter()
            .rfind(|e| e["event_type"] == kind)
            .map(|e| e["metadata"]["actor"].clone())
    };
    assert_eq!(
        actor_of("NodeUncordoned"),
        Some(json!("jürgen 100%")),
        "{history}"
    );
    let user = std::env::var("USER").unwrap_or_default();
    if !user.is_empty() {
        assert_eq!(actor_of("NodeCordoned"), Some(json!(user)), "{history}");
    }

    // A drain moves the replica to the other node, replacement first.
    let (ok, out, _) = ctl(admin, &["drain", &busy]);
    assert!(ok && out.contains("draining"), "{out}");
    until("the replica moved", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        let ready = ready_replicas(&rows);
        (ready.len() == 1 && ready[0]["shards"][0]["node"] == idle).then_some(())
    })
    .await;
    // An engine's log, read over the node's stream.
    let shard = rows[0]["shards"][0]["shard_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (ok, listed, err) = ctl(admin, &["logs", &busy]);
    assert!(ok && listed.contains(&shard), "{listed}{err}");
    let (ok, lines, err) = ctl(admin, &["logs", &busy, "--source", &shard]);
    assert!(ok && lines.contains("listening on"), "{lines}{err}");
    let (ok, _, err) = ctl(admin, &["logs", &busy, "--source", "nope"]);
    assert!(!ok && err.contains("no log named nope"), "{err}");
    // No lines asked for is a usage error, not every line.
    let (ok, _, err) = ctl(admin, &["logs", &busy, "--source", &shard, "--lines", "0"]);
    assert!(!ok && err.contains("--lines"), "{err}");
    // The agent's own log, at info level whatever its stderr shows.
    assert!(listed.contains("agent"), "{listed}");
    let (ok, lines, err) = ctl(admin, &["logs", &busy, "--source", "agent"]);
    assert!(
        ok && lines.contains("connected to the control plane"),
        "{lines}{err}"
    );
    let (_, leader, _) = ctl(admin, &["leader", "--json"]);
    let l: Value = serde_json::from_str(&leader).unwrap();
    assert_eq!(l["holder"], "ops");

    // Errors say what to do.
    let (ok, _, err) = ctl(admin, &["cordon", "no-such-node"]);
    assert!(
        !ok && err.contains("no node no-such-node has registered"),
        "{err}"
    );
    let (ok, _, err) = ctl(admin, &["explain-placement", "nope"]);
    assert!(!ok && err.contains("llmgw ctl models"), "{err}");
    let (ok, _, err) = ctl("http://127.0.0.1:1", &["nodes"]);
    assert!(!ok && err.contains("is the server running"), "{err}");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "name: broken\nscaling: {min: 3, max: 1}\n").unwrap();
    let (ok, _, err) = ctl(admin, &["model", "add", bad.to_str().unwrap()]);
    assert!(!ok && err.contains("scaling min 3 exceeds max 1"), "{err}");
    // A misspelt key would leave its default in place: refused, as the
    // configuration file refuses it, and so is a setting nothing honours.
    std::fs::write(&bad, "name: typo\nscalling: {min: 0, max: 1}\n").unwrap();
    let (ok, _, err) = ctl(admin, &["model", "add", bad.to_str().unwrap()]);
    assert!(!ok && err.contains("does not know: `scalling`"), "{err}");
    std::fs::write(&bad, "name: typo\nscaling: {min: 0, max: 1, mni: 2}\n").unwrap();
    let (ok, _, err) = ctl(admin, &["model", "add", bad.to_str().unwrap()]);
    assert!(!ok && err.contains("`mni` in scaling"), "{err}");
    std::fs::write(&bad, "name: typo\nrouting_profile: batch\n").unwrap();
    let (ok, _, err) = ctl(admin, &["model", "add", bad.to_str().unwrap()]);
    assert!(
        !ok && err.contains("routing_profile \"batch\" is not supported"),
        "{err}"
    );
    // A wrong value is placed in the file, not in the JSON sent.
    let wrong = dir.path().join("wrong.yaml");
    std::fs::write(
        &wrong,
        "name: typo2\nprofiles:\n  - name: p\n    engine: vlm\n",
    )
    .unwrap();
    let (ok, _, err) = ctl(admin, &["model", "add", wrong.to_str().unwrap()]);
    assert!(
        !ok && err.contains("wrong.yaml is not a model") && err.contains("line 4"),
        "{err}"
    );
    let (_, models, _) = ctl(admin, &["models"]);
    assert!(!models.contains("typo"), "{models}");
    // The file's models come back whenever a server takes office: a
    // change through ctl would silently not last, so it is refused.
    let (ok, _, err) = ctl(admin, &["model", "remove", "chat"]);
    assert!(
        !ok && err.contains("defined in the leader's configuration file"),
        "{err}"
    );
    // Both steps: the file alone does not take a model away.
    assert!(
        err.contains(
            "delete it from the file, restart the server, then run `llmgw ctl model remove chat`"
        ),
        "{err}"
    );
    let edited = dir.path().join("chat.yaml");
    std::fs::write(&edited, model_yaml(2)).unwrap();
    let (ok, _, err) = ctl(admin, &["model", "add", edited.to_str().unwrap()]);
    assert!(!ok && err.contains("edit the file"), "{err}");
    // Both refusals are in the model's history, as every refused command
    // is (they were left out: the attempt an auditor most wants to see).
    let refused = super::ok(&store, &["events", "log", "--model", "chat", "--json"]);
    let refusals: Vec<Value> = super::json_lines(&refused)
        .into_iter()
        .filter(|e| e["event_type"] == "CommandRefused")
        .collect();
    assert_eq!(refusals.len(), 2, "{refused}");
    assert!(
        refusals[0]["payload"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("leader's configuration file")),
        "{refused}"
    );
    // A typo inside a profile is named, not reported as the key missing.
    let typo = dir.path().join("typo.yaml");
    std::fs::write(
        &typo,
        "name: typo3\nprofiles:\n  - name: p\n    engin: sim\n",
    )
    .unwrap();
    let (ok, _, err) = ctl(admin, &["model", "add", typo.to_str().unwrap()]);
    assert!(!ok && err.contains("`profiles.0.engin`"), "{err}");
    let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
    assert_eq!(ready_replicas(&rows).len(), 1, "nothing changed");
    drop(sweep);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_adopts_its_engines_and_never_starts_a_second_copy() {
    let sweep = EngineSweeper("127.0.6.".into());
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("agent");
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let server = start_server(&server_yaml(dir.path(), "keep", &store, port, 1));
    let servers = format!("http://127.0.0.1:{port}");
    let mut agent = start_agent_in(&servers, "a", "127.0.6.2", &work);
    let first = until("ready", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        ready_replicas(&rows).into_iter().next()
    })
    .await;
    let engines = until("its engine", || async {
        let e = sweep.engines();
        (e.len() == 1).then_some(e)
    })
    .await;
    let files: Vec<String> = std::fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        files
            .iter()
            .any(|f| f.starts_with("shard-") && f.ends_with(".json")),
        "{files:?}"
    );
    assert!(
        files.iter().any(|f| f.ends_with(".log")),
        "engines log to a file: {files:?}"
    );

    // A process the state files cannot describe is killed; one whose pid
    // now runs something else is left alone.
    let mut stray = std::process::Command::new("sleep")
        .arg("300")
        .process_group(0)
        .spawn()
        .unwrap();
    let stray_pid = stray.id();
    std::fs::write(
        work.join("shard-stray.json"),
        json!({"spec": {"replica_id": "", "shard_id": "stray", "rank": 0, "nnodes": 1, "gpu_indices": [],
                        "hcas": [], "http_port": 1, "model": "", "profile": "", "engine": "", "served_model_name": "",
                        "pool": "", "fabric": "", "leader_addr": "", "leader_port": 0, "profile_fp": ""},
               "pids": [stray_pid], "cmdline": ["sleep", "300"], "started_at": 0})
        .to_string(),
    )
    .unwrap();
    let mut bystander = std::process::Command::new("sleep")
        .arg("301")
        .process_group(0)
        .spawn()
        .unwrap();
    std::fs::write(
        work.join("shard-reused.json"),
        json!({"spec": {"replica_id": "r", "shard_id": "reused", "rank": 0, "nnodes": 1, "gpu_indices": [],
                        "hcas": [], "http_port": 1, "model": "m", "profile": "p", "engine": "sim", "served_model_name": "m",
                        "pool": "", "fabric": "", "leader_addr": "", "leader_port": 0, "profile_fp": ""},
               "pids": [bystander.id()], "cmdline": ["llmgw", "sim-engine"], "started_at": 0})
        .to_string(),
    )
    .unwrap();

    agent.process.kill().unwrap();
    let _ = agent.process.wait();
    let clients = Clients::start(&server.base);
    clients.wait_for_more(5).await;
    let _agent = start_agent_in(&servers, "a", "127.0.6.2", &work);
    // The stray is this test's child: its exit is awaited, not polled.
    let killed = tokio::task::spawn_blocking(move || stray.wait());
    tokio::time::timeout(Duration::from_secs(30), killed)
        .await
        .expect("the stray was not killed")
        .unwrap()
        .unwrap();
    until("the agent reconnected", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes[0]["connected"] == true).then_some(())
    })
    .await;
    clients.wait_for_more(10).await;
    let (done, failures) = clients.finish().await;
    assert!(
        failures.is_empty(),
        "{} of {done} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    assert_eq!(
        sweep.engines(),
        engines,
        "the same engine, not a second copy"
    );
    let rows = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
    assert_eq!(
        rows.as_array().unwrap().len(),
        1,
        "nothing was rebuilt: {rows}"
    );
    assert_eq!(rows[0]["id"], first["id"]);
    assert_eq!(rows[0]["status"], "ready");
    assert!(
        matches!(bystander.try_wait(), Ok(None)),
        "a reused pid is never signalled"
    );
    let _ = bystander.kill();
    let _ = bystander.wait();
    assert!(!work.join("shard-reused.json").exists() && !work.join("shard-stray.json").exists());
}

/// Serves `body` to every GET, over HTTP/1.1, from a thread.
pub(crate) fn file_server(body: Vec<u8>) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for sock in listener.incoming() {
            let Ok(mut sock) = sock else { continue };
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes());
            let _ = sock.write_all(&body);
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_weights_are_fetched_verified_and_then_reported_by_the_node() {
    let sweep = EngineSweeper("127.0.7.".into());
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let server = start_server(&server_yaml(dir.path(), "fetch", &store, port, 0));
    let servers = format!("http://127.0.0.1:{port}");
    let agent = Child::spawn(&[
        "agent",
        "run",
        "--server",
        &servers,
        "--node-id",
        "a",
        "--mgmt-addr",
        "127.0.7.2",
        "--engine-bind",
        "127.0.7.2",
        "--heartbeat-s",
        "0.2",
        "--skip-gpus",
        "--work-dir",
        dir.path().join("work").to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    until("the node", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes.as_array().unwrap().len() == 1).then_some(())
    })
    .await;
    let weights = b"not really a model, but bytes all the same".to_vec();
    let sum = {
        use sha2::Digest;
        sha2::Sha256::digest(&weights)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let source = format!("{}/tiny.gguf", file_server(weights.clone()));
    let model = dir.path().join("m.json");
    let add = |checksum: String, name: &str| {
        std::fs::write(
            &model,
            json!({"name": name, "source": source, "checksum": checksum, "scaling": {"min": 1, "max": 1},
                   "profiles": [{"name": "sim", "engine": "sim"}]})
            .to_string(),
        )
        .unwrap();
        let (ok, _, err) = ctl(&server.admin, &["model", "add", model.to_str().unwrap()]);
        assert!(ok, "{err}");
    };
    // A checksum that does not match: the shard fails and says why.
    add(format!("sha256:{}", "0".repeat(64)), "bad");
    let err = until("the bad download fails", || async {
        let rows = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
        rows.as_array()
            .unwrap()
            .iter()
            .find_map(|r| r["shards"][0]["error"].as_str().map(str::to_owned))
    })
    .await;
    assert!(err.contains("checksum"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["ctl", "--admin", &server.admin, "model", "remove", "bad"])
        .output()
        .unwrap();
    assert!(out.status.success());

    add(format!("sha256:{sum}"), "good");
    until("the replica is ready once its weights are in", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        ready_replicas(&rows)
            .iter()
            .any(|r| r["model"] == "good")
            .then_some(())
    })
    .await;
    let cached: Vec<std::path::PathBuf> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        cached.len(),
        1,
        "one complete file, no part left: {cached:?}"
    );
    assert_eq!(std::fs::read(&cached[0]).unwrap(), weights);
    assert!(
        cached[0]
            .file_name()
            .unwrap()
            .to_string_lossy()
            .ends_with("-tiny.gguf")
    );
    // The next heartbeat says the node now holds them.
    let address = llmgw_eventstore::StoreAddress::parse(&store).unwrap();
    let log = llmgw_eventstore::AnyStore::open(&address, llmgw_eventstore::OpenOptions::default())
        .await
        .unwrap();
    let path = cached[0].display().to_string();
    until("the node reports the cached weights", || async {
        use llmgw_eventstore::EventStore;
        let events = log.read_all(0, 10_000).await.unwrap();
        events
            .iter()
            .any(|e| {
                e.event_type == "NodeInventoryChanged"
                    && e.payload["inventory"]["weights"]
                        .to_string()
                        .contains(&path)
            })
            .then_some(())
    })
    .await;
    // Collection: a cached file no model names goes; the model's own file
    // and the operator's stay.
    let stray = cache.join(llmgw_domain::placement::cache_name(
        "https://gone.example/old.gguf",
    ));
    std::fs::write(&stray, b"old").unwrap();
    let mine = cache.join("copied-by-hand.gguf");
    std::fs::write(&mine, b"mine").unwrap();
    let stray_s = stray.display().to_string();
    until("the node reports the stray", || async {
        let (_, out, _) = ctl(&server.admin, &["weights"]);
        out.contains(&stray_s).then_some(())
    })
    .await;
    let (_, listed, _) = ctl(&server.admin, &["weights", "--json"]);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["a"], json!([stray_s]), "only the stray is unwanted");
    let (ok, out, err) = ctl(&server.admin, &["weights", "--collect"]);
    assert!(ok && out.contains("REMOVING"), "{out}{err}");
    until("the stray is removed", || async {
        (!stray.exists()).then_some(())
    })
    .await;
    assert!(mine.exists() && cached[0].exists());
    // A node that is not connected cannot be asked: it keeps its stray,
    // and ctl says so rather than that there is nothing to collect.
    std::fs::write(&stray, b"old").unwrap();
    until("the node reports the stray again", || async {
        let (_, out, _) = ctl(&server.admin, &["weights"]);
        out.contains(&stray_s).then_some(())
    })
    .await;
    drop(agent);
    until("the node to be disconnected", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes[0]["connected"] == false).then_some(())
    })
    .await;
    let (ok, _, err) = ctl(&server.admin, &["weights", "--collect"]);
    assert!(ok && err.contains("a is not connected"), "{err}");
    assert!(stray.exists());
    drop(sweep);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_stream_over_mutual_tls_refuses_the_wrong_certificate() {
    let sweep = EngineSweeper("127.0.8.".into());
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let rogue = dir.path().join("rogue");
    let llmgw = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let p = pki.to_str().unwrap();
    llmgw(&["ctl", "cert", "init-ca", "--dir", p]);
    llmgw(&[
        "ctl",
        "cert",
        "issue-server",
        "cp",
        "--host",
        "127.0.0.1",
        "--dir",
        p,
    ]);
    llmgw(&["ctl", "cert", "issue-client", "a", "--dir", p]);
    llmgw(&["ctl", "cert", "issue-client", "b", "--dir", p]);
    let r = rogue.to_str().unwrap();
    llmgw(&["ctl", "cert", "init-ca", "--dir", r]);
    llmgw(&["ctl", "cert", "issue-client", "a", "--dir", r]);
    let inspected = llmgw(&[
        "ctl",
        "cert",
        "inspect",
        pki.join("cp.pem").to_str().unwrap(),
    ]);
    assert!(
        inspected.contains("CN=cp")
            && inspected.contains("127.0.0.1")
            && inspected.contains("server"),
        "{inspected}"
    );
    let as_json: Value = serde_json::from_str(&llmgw(&[
        "ctl",
        "cert",
        "inspect",
        "--json",
        pki.join("cp.pem").to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(as_json["subject"], "CN=cp");
    assert_eq!(as_json["names"], json!(["127.0.0.1"]));
    assert_eq!(as_json["purposes"], json!(["server"]));
    assert_eq!(as_json["ca"], false);
    // Dates as RFC 3339 in UTC, as everywhere else; the text says how long.
    let not_after = chrono::DateTime::parse_from_rfc3339(as_json["not_after"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{as_json}: {e}"));
    assert!(not_after > chrono::Utc::now(), "{as_json}");
    assert!(
        as_json["not_before"].as_str().unwrap().ends_with('Z'),
        "{as_json}"
    );
    assert!(inspected.contains("expires in "), "{inspected}");

    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let config = server_yaml(dir.path(), "secure", &store, port, 1);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "tls:\n  ca: {p}/ca.pem\n  cert: {p}/cp.pem\n  key: {p}/cp-key.pem\n"
    ));
    std::fs::write(&config, text).unwrap();
    let server = start_server(&config);
    let url = format!("https://127.0.0.1:{port}");
    let agent = |node: &str,
                 ip: &str,
                 ca: &std::path::Path,
                 pki: &std::path::Path,
                 cert: &str,
                 url: &str| {
        Child::spawn(&[
            "agent",
            "run",
            "--server",
            url,
            "--node-id",
            node,
            "--mgmt-addr",
            ip,
            "--engine-bind",
            ip,
            "--heartbeat-s",
            "0.2",
            "--skip-gpus",
            "--reconnect-max-s",
            "0.5",
            "--work-dir",
            dir.path()
                .join(format!("work-{node}-{cert}"))
                .to_str()
                .unwrap(),
            "--tls-ca",
            ca.join("ca.pem").to_str().unwrap(),
            "--tls-cert",
            pki.join(format!("{cert}.pem")).to_str().unwrap(),
            "--tls-key",
            pki.join(format!("{cert}-key.pem")).to_str().unwrap(),
        ])
    };
    // Node b's certificate claiming to be a: refused with the reason.
    let impostor = agent("a", "127.0.8.3", &pki, &pki, "b", &url);
    let line = Child::expect(&impostor.stderr, "certificate is for node b");
    assert!(line.contains("not a"), "{line}");
    drop(impostor);
    // A certificate from another authority does not get a stream at all.
    let stranger = agent("a", "127.0.8.4", &pki, &rogue, "a", &url);
    let said = Child::expect(&stranger.stderr, "no session with the control plane");
    // Whether the agent reads the server's alert or only the closed
    // connection after it is a race of the two ends.
    assert!(said.contains("refused this node's certificate"), "{said}");
    // The server says why, with the peer's address.
    let logged = Child::expect(&server.child.stderr, "a TLS handshake failed");
    assert!(
        logged.contains("authority this server does not trust") && logged.contains("127.0.0.1"),
        "{logged}"
    );
    drop(stranger);
    let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
    assert!(
        nodes.as_array().unwrap().is_empty(),
        "no refused agent registered: {nodes}"
    );

    // The right certificate: registered, placed, served.
    let _a = agent("a", "127.0.8.2", &pki, &pki, "a", &url);
    until("served over the secured stream", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        (ready_replicas(&rows).len() == 1).then_some(())
    })
    .await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Holding certificates, an agent refuses to dial in the clear.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args([
            "agent",
            "run",
            "--server",
            &format!("http://127.0.0.1:{port}"),
            "--node-id",
            "a",
            "--tls-ca",
            pki.join("ca.pem").to_str().unwrap(),
            "--tls-cert",
            pki.join("a.pem").to_str().unwrap(),
            "--tls-key",
            pki.join("a-key.pem").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("only https://"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Holding none, it dials in the clear, and the TLS listener closes on
    // it without a word it can read: it says what to check.
    let plain = Child::spawn(&[
        "agent",
        "run",
        "--server",
        &format!("http://127.0.0.1:{port}"),
        "--node-id",
        "c",
        "--skip-gpus",
        "--work-dir",
        dir.path().join("work-plain").to_str().unwrap(),
    ]);
    let said = Child::expect(&plain.stderr, "no session with the control plane");
    assert!(said.contains("dial https://"), "{said}");
    drop(plain);
    drop(sweep);
}

/// llama.cpp's server and a tiny model, built once into a cache by
/// `scripts/real-engine` (minutes the first time, then instant).
pub(crate) fn real_engine() -> (std::path::PathBuf, std::path::PathBuf) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/real-engine");
    let out = std::process::Command::new(script).output().unwrap();
    assert!(
        out.status.success(),
        "scripts/real-engine failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    (lines.next().unwrap().into(), lines.next().unwrap().into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_llama_server_is_launched_judged_ready_and_served_through_the_router() {
    let (bin, model) = real_engine();
    // Every flag llmgw passes is in this build's own --help.
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args([
            "ctl",
            "engine-check",
            "llamacpp",
            "--bin",
            bin.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success() && !table.contains("MISSING"),
        "{table}"
    );
    let dir = tempfile::tempdir().unwrap();
    let _sweep = StateFileSweeper(dir.path().join("work"));
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let config = dir.path().join("real.yaml");
    std::fs::write(
        &config,
        format!(
            r#"listen: "127.0.0.1:0"
admin_listen: "127.0.0.1:0"
agent_listen: "127.0.0.1:{port}"
store: "{store}"
control:
  interval: 200ms
  port_range: [30400, 30499]
models:
  - name: tiny
    source: {}
    context_length: 512
    scaling: {{min: 1, max: 1}}
    profiles:
      - name: cpu
        engine: llamacpp
"#,
            model.display()
        ),
    )
    .unwrap();
    let server = start_server(config.to_str().unwrap());
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let _agent = Child::spawn_env(
        &[
            "agent",
            "run",
            "--server",
            &format!("http://127.0.0.1:{port}"),
            "--node-id",
            "cpu-1",
            "--mgmt-addr",
            "127.0.0.1",
            "--heartbeat-s",
            "0.2",
            "--skip-gpus",
            "--work-dir",
            dir.path().join("work").to_str().unwrap(),
            "--cache-dir",
            dir.path().join("cache").to_str().unwrap(),
        ],
        &[("PATH", path)],
    );
    let rows = until("llama-server is ready", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        let ready = ready_replicas(&rows);
        (!ready.is_empty()).then_some(ready)
    })
    .await;
    assert_eq!(rows[0]["shards"][0]["state"], "ready");
    let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
    assert!(
        nodes[0]["engines"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "llamacpp"),
        "{nodes}"
    );

    let http = reqwest::Client::new();
    let r = http
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert!(
        body["usage"]["completion_tokens"].as_u64().unwrap() >= 1,
        "{body}"
    );
    let r = http
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "tiny", "max_tokens": 4, "stream": true,
                      "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("chat.completion.chunk") && text.trim_end().ends_with("data: [DONE]"),
        "{text}"
    );
    // A prompt of ~314 tokens fits the catalog's 512: llama-server splits
    // its --ctx-size among its four slots, and each got 128.
    let r = http
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "tiny", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "word ".repeat(300)}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_agent_exits_within_a_second_and_leaves_its_engines_serving() {
    let sweep = EngineSweeper("127.0.9.".into());
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let server = start_server(&server_yaml(dir.path(), "calm", &store, port, 1));
    let mut agent = start_agent(&format!("http://127.0.0.1:{port}"), "a", "127.0.9.2");
    until("ready", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        (ready_replicas(&rows).len() == 1).then_some(())
    })
    .await;
    let engines = sweep.engines();
    assert_eq!(engines.len(), 1);
    let signalled = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &agent.process.id().to_string()])
        .status();
    let status = agent.process.wait().unwrap();
    let took = signalled.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        took < Duration::from_secs(1),
        "the agent took {took:?} to stop"
    );
    assert_eq!(sweep.engines(), engines, "its engine keeps running");
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "still there?"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "served without its agent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_request_at_the_standby_starts_the_model_on_the_leader() {
    let sweep = EngineSweeper("127.0.10.".into());
    let db = llmgw_testkit::TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (free_port(), free_port());
    let (leader, standby) =
        leader_and_standby(dir.path(), &db.url, ("lead", pa), ("stand", pb), 0).await;
    let _agent = start_agent(
        &format!("http://127.0.0.1:{pa},http://127.0.0.1:{pb}"),
        "a",
        "127.0.10.2",
    );
    let model = dir.path().join("lazy.json");
    std::fs::write(
        &model,
        json!({"name": "lazy", "scaling": {"min": 0, "max": 1, "idle_timeout_s": 60},
               "profiles": [{"name": "sim", "engine": "sim"}]})
        .to_string(),
    )
    .unwrap();
    let (ok, _, err) = ctl(&leader.admin, &["model", "add", model.to_str().unwrap()]);
    assert!(ok, "{err}");
    until("the standby knows the model and the node", || async {
        let models = get(format!("{}/api/v1/models", standby.admin)).await;
        let nodes = get(format!("{}/api/v1/nodes", standby.admin)).await;
        (models.as_array().unwrap().len() == 1 && nodes.as_array().unwrap().len() == 1)
            .then_some(())
    })
    .await;
    assert!(sweep.engines().is_empty());
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", standby.base))
        .json(&json!({"model": "lazy", "max_tokens": 2, "messages": [{"role": "user", "content": "wake"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        200,
        "the leader started it for the standby's request"
    );
    assert_eq!(sweep.engines().len(), 1);
    // A node's log comes over the stream the leader holds: asked of the
    // standby, the leader answers it.
    let (ok, lines, err) = ctl(&standby.admin, &["logs", "a", "--source", "agent"]);
    assert!(
        ok && lines.contains("connected to the control plane"),
        "{lines}{err}"
    );
}

/// A standby whose own file defines a model refuses to send a change of
/// it on to the leader (whose file does not): the change would be undone
/// when the standby takes office. Other models go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_refuses_ctl_changes_to_a_model_its_own_file_defines() {
    let db = llmgw_testkit::TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let leader = start_server(&server_yaml(dir.path(), "plain", &db.url, free_port(), 0));
    until("the first server leads", || async {
        (get(format!("{}/api/v1/leader", leader.admin)).await["is_leader"] == true).then_some(())
    })
    .await;
    let standby = start_server(&server_yaml(dir.path(), "filed", &db.url, free_port(), 1));
    // As it stands by, it says which of its models would change when it
    // takes office.
    let said = super::Child::expect(&standby.child.stderr, "defines models otherwise");
    assert!(said.contains("chat"), "{said}");
    let chat = dir.path().join("chat.yaml");
    std::fs::write(&chat, model_yaml(0)).unwrap();
    let (ok, _, err) = ctl(&standby.admin, &["model", "add", chat.to_str().unwrap()]);
    assert!(
        !ok && err.contains("defined in this server's configuration file"),
        "{err}"
    );
    let (ok, _, err) = ctl(&standby.admin, &["model", "remove", "chat"]);
    assert!(
        !ok && err.contains("defined in this server's configuration file"),
        "{err}"
    );
    let other = dir.path().join("other.yaml");
    std::fs::write(&other, model_yaml(0).replace("name: chat", "name: other")).unwrap();
    let (ok, _, err) = ctl(&standby.admin, &["model", "add", other.to_str().unwrap()]);
    assert!(ok, "{err}");
    let (_, models, _) = ctl(&leader.admin, &["models"]);
    assert!(
        models.contains("other") && !models.contains("chat"),
        "{models}"
    );
    // Both refusals are in the log, as the leader's own are.
    let refused = super::ok(
        &db.url,
        &["events", "tail", "--type", "CommandRefused", "--json"],
    );
    let rows = super::json_lines(&refused);
    assert_eq!(rows.len(), 2, "{refused}");
    assert!(
        rows.iter().all(|r| r["payload"]["reason"]
            .as_str()
            .is_some_and(|w| w.contains("defined in this server's configuration file"))),
        "{refused}"
    );
}

/// A catalog that wants a replica and a cluster with no node yet: the
/// status says so in one consistent summary, counting what waits for a
/// place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_replicas_waiting_for_a_place() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let config = server_yaml(dir.path(), "empty", &store, free_port(), 1);
    let server = start_server(&config);
    let status = until("the catalog to be applied", || async {
        let (ok, status, _) = ctl(&server.admin, &["status"]);
        (ok && status.starts_with("0 of 1 models")).then_some(status)
    })
    .await;
    assert!(
        status.starts_with("0 of 1 models serving, on 0/0 nodes ready"),
        "{status}"
    );
    assert!(
        status.contains("replicas  0 ready, 1 waiting for a place (1 wanted)"),
        "{status}"
    );
}

/// Two machines under one node id (a cloned image's hostname): while the
/// first heartbeats, the second is refused and told why, and the node
/// stays the first's; once the first has gone quiet, the second takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_machine_under_a_connected_node_id_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let server = start_server(&server_yaml(dir.path(), "twins", &store, port, 0));
    let servers = format!("http://127.0.0.1:{port}");
    let node_addr = || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        let twin = nodes
            .as_array()?
            .iter()
            .find(|n| n["id"] == "twin")?
            .clone();
        (twin["connected"] == true).then(|| twin["addr"].as_str().unwrap_or_default().to_owned())
    };
    let first = start_agent(&servers, "twin", "127.0.31.2");
    until("the first machine's node", || async {
        node_addr().await.filter(|a| a == "127.0.31.2")
    })
    .await;
    let second = start_agent(&servers, "twin", "127.0.31.3");
    // Bounded as a whole: two agents taking the node from each other log
    // without pause, so a wait per line would never end.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let line = second
            .stderr
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the second agent was told why it was refused");
        if line.contains("claims the same id") {
            break line;
        }
    };
    assert!(
        refused.contains("node twin is connected from 127.0.31.2"),
        "{refused}"
    );
    assert_eq!(node_addr().await.as_deref(), Some("127.0.31.2"));
    drop(first);
    until("the second machine to take the node", || async {
        node_addr().await.filter(|a| a == "127.0.31.3")
    })
    .await;
}

/// KiB of process `pid` in transparent huge pages. Where the kernel puts
/// every process's memory in them (`always`, for all sizes or for 2 MiB
/// pages), that is its operator's choice, not ours: counted as none.
fn huge_pages_kib(pid: u32) -> u64 {
    let thp = "/sys/kernel/mm/transparent_hugepage";
    let always = [
        format!("{thp}/enabled"),
        format!("{thp}/hugepages-2048kB/enabled"),
    ]
    .iter()
    .any(|f| std::fs::read_to_string(f).is_ok_and(|mode| mode.contains("[always]")));
    if always {
        return 0;
    }
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let line = rollup
        .lines()
        .find(|l| l.starts_with("AnonHugePages:"))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// What only the leader knows, asked of a standby while the leader is
/// gone but its lease runs: the standby says the leader does not answer
/// and when its lease runs out, not "send the command to the leader".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_says_when_the_leader_it_would_ask_does_not_answer() {
    let db = llmgw_testkit::TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let long_lease = |path: String| {
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("lease_ttl: 2s", "lease_ttl: 60s")).unwrap();
        path
    };
    let leader = start_server(&long_lease(server_yaml(
        dir.path(),
        "gone",
        &db.url,
        free_port(),
        0,
    )));
    until("the first server leads", || async {
        (get(format!("{}/api/v1/leader", leader.admin)).await["is_leader"] == true).then_some(())
    })
    .await;
    let standby = start_server(&long_lease(server_yaml(
        dir.path(),
        "left",
        &db.url,
        free_port(),
        0,
    )));
    // Killed, not stopped: its lease runs on.
    drop(leader);
    let (ok, _, err) = ctl(&standby.admin, &["logs", "n1"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("the leader gone does not answer at") && err.contains("its lease runs out in"),
        "{err}"
    );
    // A write the CLI sends the leader itself (no server at --admin) is
    // told the same, before the advice on addresses, which after a crash
    // sent operators to edit a configuration that was right.
    let out = crate::llmgw(
        &db.url,
        &[
            "keys",
            "init",
            "--org",
            "o",
            "--team",
            "t",
            "--project",
            "p",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("the leader gone does not answer at")
            && err.contains("if gone has stopped or crashed, its lease runs out in"),
        "{err}"
    );
    drop(standby);
}

/// Two servers started with different admin tokens: an operator's command
/// through the standby (or a router-only server), with that server's own
/// token, was refused by the leader, which gets the forwarding server's
/// token, and the operator read "the token sent is not this admin API's:
/// check LLMGW_ADMIN_TOKEN" of a token that was right. Now it says the
/// leader, at its address, refused the server's token: the servers'
/// tokens differ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_refusing_a_standbys_admin_token_says_the_servers_tokens_differ() {
    use super::tenancy::{Mode, Stage};
    let (store, _scratch) = llmgw_testkit::Scratch::new(llmgw_testkit::Backend::Postgres).await;
    let stage = Stage::new();
    let token = |t: &str| vec![("LLMGW_ADMIN_TOKEN", t.to_owned())];
    let (lead_token, standby_token, router_token) = (
        "leader-token-0123456789abcdef01",
        "standby-token-0123456789abcdef0",
        "router-token-0123456789abcdef01",
    );
    let leader = stage.start_env(
        "cp-b",
        &store,
        Mode::Control,
        "auth: true\n",
        &token(lead_token),
    );
    until("cp-b to lead", || async {
        let v: Value = reqwest::Client::new()
            .get(format!("{}/api/v1/leader", leader.admin))
            .bearer_auth(lead_token)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (v["is_leader"] == true).then_some(())
    })
    .await;
    let standby = stage.start_env(
        "cp-a",
        &store,
        Mode::Control,
        "auth: true\n",
        &token(standby_token),
    );
    let router = stage.start_env(
        "ro",
        &store,
        Mode::RouterOnly,
        "auth: true\n",
        &token(router_token),
    );
    let llmgw = |server_token: &str, args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .env_remove("LLMGW_ADMIN")
            .env("LLMGW_ADMIN_TOKEN", server_token)
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was done");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let init = ["init", "--org", "o", "--team", "t", "--project", "p"];
    let keys = |admin: &str| {
        let mut a = vec!["--store", &store, "keys", "--admin", admin, "--as", "alice"];
        a.extend(init);
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let said = |args: Vec<String>, server_token: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        llmgw(server_token, &args)
    };
    // The leader's address as it recorded it (its loopback admin_listen).
    let at = format!("the leader cp-b at {}", leader.admin);
    for (what, err) in [
        (
            "keys init via the standby",
            said(keys(&standby.admin), standby_token),
        ),
        (
            "ctl nodes via the standby",
            llmgw(standby_token, &["ctl", "nodes", "--admin", &standby.admin]),
        ),
        (
            "ctl cordon via the standby",
            llmgw(
                standby_token,
                &["ctl", "cordon", "node1", "--admin", &standby.admin],
            ),
        ),
        (
            "keys init via a router-only server",
            said(keys(&router.admin), router_token),
        ),
    ] {
        assert!(
            err.contains(&at)
                && err.contains("refused the admin token this server")
                && err.contains("the servers' admin_token settings differ"),
            "{what}: {err}"
        );
        assert!(!err.contains("is not this admin API's"), "{what}: {err}");
    }
    // The operator's own token was right for the server asked: that one
    // is still told apart (a wrong token at the standby itself).
    let err = llmgw(lead_token, &["ctl", "nodes", "--admin", &standby.admin]);
    assert!(err.contains("is not this admin API's"), "{err}");
}

/// A restore from an older backup that holds the node but not the replica
/// its engine serves (the auditor's: the first lines of an export, up to
/// the node's registration, imported into a new file). The new server
/// placed a replica on the node before its agent was back; the agent's
/// engine then clashed with it on its port, the adoption was refused and
/// the serving engine stopped, for a replica started anew beside it. Now
/// nothing is placed on a node the server has not heard from: the agent,
/// held back here until the new server has marked the node unreachable,
/// comes back and its engine is adopted, the same process serving on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restored_from_an_older_log_adopts_the_engine_the_log_does_not_know() {
    let sweep = EngineSweeper("127.0.73.".into());
    let dir = tempfile::tempdir().unwrap();
    let live = format!("sqlite://{}", dir.path().join("live.db").display());
    let older = format!("sqlite://{}", dir.path().join("older.db").display());
    let port = free_port();
    let server = start_server(&server_yaml(dir.path(), "live", &live, port, 1));
    let agent = start_agent(&format!("http://127.0.0.1:{port}"), "a", "127.0.73.2");
    let first = until("ready", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        ready_replicas(&rows).into_iter().next()
    })
    .await;
    let pids = until("one engine", || async {
        let e = sweep.engines();
        (e.len() == 1).then_some(e)
    })
    .await;
    server.child.terminate();
    drop(server);

    // The backup: the log up to the node's registration.
    let exported = super::ok(&live, &["events", "export"]);
    let registered = (exported.lines())
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event_type"] == "NodeRegistered")
        .expect("the node registered")["position"]
        .as_u64()
        .unwrap();
    let backup = dir.path().join("backup.jsonl");
    let to = registered.to_string();
    std::fs::write(
        &backup,
        super::ok(&live, &["events", "export", "--to", &to]),
    )
    .unwrap();
    super::ok(&older, &["events", "import", backup.to_str().unwrap()]);

    let signal = |sig: &str| {
        let pid = agent.process.id().to_string();
        assert!(
            std::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    signal("-STOP");
    let server = start_server(&server_yaml(dir.path(), "restored", &older, port, 1));
    until("the unheard node marked unreachable", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes[0]["state"] == "unreachable").then_some(())
    })
    .await;
    let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
    assert_eq!(rows, json!([]), "placed on a node not heard from");
    signal("-CONT");
    let ready = until("the engine adopted through the restored server", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        let ready = ready_replicas(&rows);
        (nodes[0]["connected"] == true && ready.len() == 1).then_some(rows)
    })
    .await;
    assert_eq!(ready.as_array().unwrap().len(), 1, "{ready}");
    assert_eq!(ready[0]["id"], first["id"], "adopted, not replaced");
    assert_eq!(ready[0]["adopted"], true);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "chat", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(sweep.engines(), pids, "the engine kept its process id");
    drop(agent);
    drop(server);
    drop(sweep);
}
