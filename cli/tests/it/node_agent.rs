//! The node agent against a real server, end to end, for what only a node
//! can know: its GPUs as discovery sees them (stub nvidia-smi), the
//! engines installed on it, ports other programs hold, and its state
//! files.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::Child;
use super::cluster::{
    EngineSweeper, ServerProc, StateFileSweeper, ctl, free_port, get, ready_replicas, server_yaml,
    start_agent_in, start_server, until,
};

/// A server on its own SQLite store, with `control` lines added to its
/// control section and `models` as its catalog.
fn server(dir: &Path, agent_port: u16, control: &str, models: &str) -> ServerProc {
    let store = format!("sqlite://{}", dir.join("llmgw.db").display());
    let config = dir.join("server.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\nagent_listen: \"127.0.0.1:{agent_port}\"\nstore: \"{store}\"\ncontrol:\n  interval: 200ms\n{control}models:\n{models}"
        ),
    )
    .unwrap();
    start_server(config.to_str().unwrap())
}

/// One sim model, started at once.
const SIM_MODEL: &str = "  - name: chat\n    scaling: {min: 1, max: 1}\n    profiles:\n      - name: sim\n        engine: sim\n";

/// An agent dialling `agent_port` by bare address, heartbeating fast, with
/// its work and cache directories under `dir`; `extra` adds flags.
fn agent(agent_port: u16, node: &str, dir: &Path, extra: &[&str]) -> Child {
    let (work, cache) = (dir.join("work"), dir.join("cache"));
    let server = format!("127.0.0.1:{agent_port}");
    let mut args = vec![
        "agent",
        "run",
        "--server",
        &server,
        "--node-id",
        node,
        "--heartbeat-s",
        "0.2",
        "--work-dir",
        work.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Child::spawn(&args)
}

/// Writes `text` to `path` whole: to a temporary name, then renamed, so a
/// reader (or an exec) never meets a file half written.
fn replace(path: &Path, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A shell script at `dir/name`, executable.
fn executable(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    replace(&path, &format!("#!/bin/sh\n{body}"), 0o755);
    path
}

/// The first shard error any replica shows, failed ones included (a failed
/// replica is stopped at once).
async fn shard_error(admin: &str) -> Option<String> {
    let rows = get(format!("{admin}/api/v1/replicas?all=true")).await;
    rows.as_array()?.iter().find_map(|r| {
        r["shards"]
            .as_array()?
            .iter()
            .find_map(|s| s["error"].as_str().map(str::to_owned))
    })
}

/// A start is validated on the node against the cards it was given, as
/// discovery saw them: FP8 on a V100 (compute capability 7.0) fails before
/// anything is launched, and the reason reaches `ctl replicas`.
#[tokio::test]
async fn a_start_the_nodes_gpus_cannot_run_fails_before_launch_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = server(
        dir.path(),
        port,
        "  port_range: [30500, 30599]\n",
        "  - name: big\n    source: /models/big\n    scaling: {min: 1, max: 1}\n    profiles:\n      - name: fp8\n        engine: vllm\n        gpu_class: v100-32g\n        tp: 1\n        gpus_per_node: 1\n        args: [\"--quantization\", \"fp8\"]\n",
    );
    let smi = executable(
        dir.path(),
        "nvidia-smi",
        "echo '0, GPU-v100, Tesla V100-SXM2-32GB, 32510, 0, 7.0, 00000000:1B:00.0, 535.54, 30, 0'\n",
    );
    let marker = dir.path().join("vllm-ran");
    let vllm = executable(
        dir.path(),
        "vllm",
        &format!("touch {}\nsleep 600\n", marker.display()),
    );
    let _agent = agent(
        port,
        "v100-1",
        dir.path(),
        &[
            "--nvidia-smi",
            smi.to_str().unwrap(),
            "--vllm-bin",
            vllm.to_str().unwrap(),
        ],
    );
    let error = until("the shard's failure", || shard_error(&server.admin)).await;
    assert!(
        error.contains("fp8 quantization needs compute capability 8.9")
            && error.contains("Tesla V100"),
        "{error}"
    );
    assert!(!marker.exists(), "nothing was launched");
}

/// Installed engines are looked for again while the agent runs: vLLM
/// installed after the agent started shows in the node's engines.
#[tokio::test]
async fn an_engine_installed_while_the_agent_runs_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let server = start_server(&server_yaml(dir.path(), "probe", &store, port, 0));
    let vllm = dir.path().join("vllm");
    let _agent = agent(
        port,
        "later",
        dir.path(),
        &[
            "--recheck-s",
            "0.2",
            "--skip-gpus",
            "--vllm-bin",
            vllm.to_str().unwrap(),
        ],
    );
    let engines = |nodes: &Value| -> Option<Vec<String>> {
        let e = nodes.as_array()?.first()?["engines"].as_array()?.clone();
        Some(
            e.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        )
    };
    let before = until("the node registers", || async {
        engines(&get(format!("{}/api/v1/nodes", server.admin)).await)
    })
    .await;
    assert!(!before.contains(&"vllm".to_owned()), "{before:?}");
    executable(dir.path(), "vllm", "exit 0\n");
    until("vllm is reported", || async {
        engines(&get(format!("{}/api/v1/nodes", server.admin)).await)?
            .contains(&"vllm".to_owned())
            .then_some(())
    })
    .await;
}

/// A node whose first engine port another program holds: a loopback
/// address and ports of the test's own, outside the ephemeral range, so
/// nothing else on the machine takes them meanwhile.
struct Squat {
    // Dropped in this order: the agent and server before their directory.
    agent: Child,
    server: ServerProc,
    _squatter: std::net::TcpListener,
    dir: tempfile::TempDir,
}

impl Squat {
    fn new(ip: &str, taken: u16, last: u16, control: &str, node: &str) -> Squat {
        let squatter = std::net::TcpListener::bind((ip, taken)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let server = server(
            dir.path(),
            port,
            &format!("{control}  port_range: [{taken}, {last}]\n"),
            SIM_MODEL,
        );
        let agent = agent(
            port,
            node,
            dir.path(),
            &["--skip-gpus", "--engine-bind", ip, "--mgmt-addr", ip],
        );
        Squat {
            agent,
            server,
            _squatter: squatter,
            dir,
        }
    }
}

/// A port something else already listens on is refused before launch,
/// with a reason, rather than left to the engine's bind error in its log;
/// with no other port to take, the model says why it does not run.
#[tokio::test]
async fn a_shard_whose_port_is_taken_fails_with_the_reason() {
    let taken = 30620;
    let squat = Squat::new("127.0.12.3", taken, taken, "", "busy-port");
    let server = &squat.server;
    let error = until("the shard's failure", || shard_error(&server.admin)).await;
    assert!(
        error.contains(&format!("port {taken} is not free on this node")),
        "{error}"
    );
    // The agent's own journal says so too (it said nothing of a shard
    // that failed, nor of one that finished stopping).
    let said = Child::expect(&squat.agent.stderr, "failed");
    assert!(
        said.contains("WARN") && said.contains("is not free on this node"),
        "{said}"
    );
    // The failed replica is stopped at once; the model keeps the reason.
    let (ok, table, err) = ctl(&server.admin, &["models"]);
    assert!(
        ok && table.contains("chat: last failure on busy-port: port"),
        "{table}{err}"
    );
    // A taken port is no failure of the model's: it is not held back (a
    // backoff of 10 s and more, for nothing), and with the range's only
    // port held out of placement it waits for a place, said so.
    let (table, status) = until("waiting for a place said", || async {
        let (_, table, _) = ctl(&server.admin, &["models"]);
        let (_, status, _) = ctl(&server.admin, &["status"]);
        status
            .contains("waiting for a place")
            .then_some((table, status))
    })
    .await;
    assert!(!table.contains("backing off"), "{table}");
    assert!(!status.contains("backing off"), "{status}");
}

/// A port another program holds is left alone: the next placement of the
/// model takes another port of the range and serves.
#[tokio::test]
async fn a_squatted_port_is_avoided_and_the_model_serves_on_another() {
    let taken = 30610;
    let squat = Squat::new(
        "127.0.12.2",
        taken,
        taken + 1,
        "  base_backoff: 300ms\n",
        "squat-1",
    );
    let server = &squat.server;
    let _sweep = StateFileSweeper(squat.dir.path().join("work"));
    let served_on = until("a ready replica", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        ready_replicas(&rows).first()?["shards"][0]["port"].as_u64()
    })
    .await;
    assert_eq!(served_on, u64::from(taken) + 1);
    let all = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
    assert!(
        all.as_array()
            .unwrap()
            .iter()
            .any(|r| r["shards"][0]["port"] == taken),
        "the taken port was tried first: {all}"
    );
    // Each turn is in the agent's journal: the refusal, then the engine
    // on the next port ready.
    let said = Child::expect(&squat.agent.stderr, "failed before launch");
    assert!(said.contains("is not free"), "{said}");
    let said = Child::expect(&squat.agent.stderr, " ready");
    assert!(said.contains("INFO") && said.contains("shard="), "{said}");
}

/// Two agents on one machine (one address) are never handed the same
/// engine port: each node's replica serves on its own port at the first
/// try, with no failed start between. Removing one of them, with no
/// certificates in play, says that its agent registers again while it
/// runs, rather than that it is refused.
#[tokio::test]
async fn two_agents_on_one_address_get_different_ports() {
    let ip = "127.0.12.5";
    let dir = tempfile::tempdir().unwrap();
    // Declared first, so dropped last: after the agents and the server,
    // so that no engine is started again after the sweep (one was, and
    // held its port into the next run).
    let homes = [dir.path().join("twin-a"), dir.path().join("twin-b")];
    let _sweeps = homes.clone().map(|h| StateFileSweeper(h.join("work")));
    let port = free_port();
    let control = "  enabled: true\n  port_range: [30640, 30649]\n";
    let server = server(dir.path(), port, control, "  []\n");
    let twin = |home: &std::path::Path, node: &str| {
        std::fs::create_dir(home).unwrap();
        agent(
            port,
            node,
            home,
            &["--skip-gpus", "--engine-bind", ip, "--mgmt-addr", ip],
        )
    };
    let _a = twin(&homes[0], "twin-a");
    let _b = twin(&homes[1], "twin-b");
    // Both registered before the model asks for two replicas: one each.
    until("two nodes", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes.as_array()?.len() == 2).then_some(())
    })
    .await;
    let model = dir.path().join("chat.yaml");
    std::fs::write(
        &model,
        "name: chat\nscaling: {min: 2, max: 2}\nprofiles:\n  - name: sim\n    engine: sim\n",
    )
    .unwrap();
    let (good, _, err) = ctl(&server.admin, &["model", "add", model.to_str().unwrap()]);
    assert!(good, "{err}");
    let ports = until("two ready replicas", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        let ready = ready_replicas(&rows);
        (ready.len() == 2).then(|| {
            ready
                .iter()
                .map(|r| {
                    (
                        r["shards"][0]["node"].to_string(),
                        r["shards"][0]["port"].as_u64(),
                    )
                })
                .collect::<Vec<_>>()
        })
    })
    .await;
    assert_ne!(ports[0].0, ports[1].0, "one replica per node: {ports:?}");
    assert_ne!(ports[0].1, ports[1].1, "{ports:?}");
    let all = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
    assert_eq!(all.as_array().unwrap().len(), 2, "no start failed: {all}");

    let (good, out, err) = ctl(&server.admin, &["node", "remove", "twin-b"]);
    assert!(good, "{err}");
    assert!(out.contains("without a client certificate"), "{out}");
    assert!(out.contains("registers again"), "{out}");
    // A node whose agent is not connected: how it connects is not known,
    // so it is not told that its certificates are refused as if it had any.
    drop(_a);
    until("twin-a's agent is gone", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        let a = nodes.as_array()?.iter().find(|n| n["id"] == "twin-a")?;
        (a["connected"] == false).then_some(())
    })
    .await;
    let (good, out, err) = ctl(&server.admin, &["node", "remove", "twin-a"]);
    assert!(good, "{err}");
    assert!(
        out.contains("Its agent is not connected: if it connects with a client certificate"),
        "{out}"
    );
    assert!(
        out.contains("if it connects without one, nothing refuses it"),
        "{out}"
    );
}

/// A node gone quiet (its agent stopped, not yet lost) does not count as
/// serving in `ctl status`: it said every model was serving while the
/// gateway had nothing to route to, until the node was declared lost.
#[tokio::test]
async fn status_does_not_count_replicas_on_a_quiet_node_as_serving() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let control = "  unreachable_after: 1s\n  lost_after: 10m\n  port_range: [30650, 30659]\n";
    let server = server(dir.path(), port, control, SIM_MODEL);
    let _sweep = StateFileSweeper(dir.path().join("work"));
    let agent = agent(
        port,
        "quiet",
        dir.path(),
        &[
            "--skip-gpus",
            "--engine-bind",
            "127.0.12.6",
            "--mgmt-addr",
            "127.0.12.6",
        ],
    );
    until("a ready replica", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        (ready_replicas(&rows).len() == 1).then_some(())
    })
    .await;
    let (ok, status, err) = ctl(&server.admin, &["status"]);
    assert!(
        ok && status.contains("1 of 1 models serving"),
        "{status}{err}"
    );
    let pid = agent.process.id().to_string();
    let signal = |s: &str| {
        let done = std::process::Command::new("kill")
            .args([s, &pid])
            .status()
            .unwrap();
        assert!(done.success());
    };
    signal("-STOP");
    let status = until("the node to go quiet", || async {
        let (_, status, _) = ctl(&server.admin, &["status"]);
        status.contains("0/1 nodes ready").then_some(status)
    })
    .await;
    let (_, models, _) = ctl(&server.admin, &["models", "--json"]);
    signal("-CONT");
    assert!(
        status.contains(
            "0 of 1 models serving (1 more only on unreachable nodes, routed while their engines answer)"
        ),
        "{status}"
    );
    assert!(
        status.contains("1 on unreachable nodes (still routed while their engines answer)"),
        "{status}"
    );
    // `ctl models` agrees: none ready.
    assert!(models.contains("\"ready\":0"), "{models}");
}

/// GPU health is read again while the agent runs: a card that starts
/// reporting uncorrected ECC errors leaves placement and comes back once
/// it reports none; a card the driver no longer lists is out, and a driver
/// that cannot answer takes every card out.
#[tokio::test]
async fn a_gpu_that_turns_sick_while_the_agent_runs_leaves_placement() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let server = start_server(&server_yaml(dir.path(), "sick", &store, port, 0));
    let rows = dir.path().join("smi.csv");
    let healthy = "0, GPU-a, NVIDIA H100 80GB HBM3, 81559, 0, 9.0, 00000000:1B:00.0, 550.54, 30, 0\n\
                   1, GPU-b, NVIDIA H100 80GB HBM3, 81559, 0, 9.0, 00000000:1C:00.0, 550.54, 30, 0\n";
    replace(&rows, healthy, 0o644);
    let smi = executable(
        dir.path(),
        "nvidia-smi",
        &format!("cat {}\n", rows.display()),
    );
    let _agent = agent(
        port,
        "gpu-1",
        dir.path(),
        &["--recheck-s", "0.2", "--nvidia-smi", smi.to_str().unwrap()],
    );
    let free = || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        nodes.as_array()?.first()?["gpus_free"].as_u64()
    };
    let gpus_free = |n: u64| async move { (free().await? == n).then_some(()) };
    until("two healthy GPUs", || gpus_free(2)).await;
    let sick = healthy.replace(
        "00000000:1C:00.0, 550.54, 30, 0",
        "00000000:1C:00.0, 550.54, 30, 7",
    );
    replace(&rows, &sick, 0o644);
    until("GPU 1 is out", || gpus_free(1)).await;
    // ctl nodes says why, under its table (FREE alone read as a node
    // with one card).
    let (ok, nodes, err) = ctl(&server.admin, &["nodes"]);
    assert!(ok, "{err}");
    assert!(
        nodes.contains("gpu-1: GPU 1: 7 uncorrected ECC errors (kept out of placement)"),
        "{nodes}"
    );
    replace(&rows, healthy, 0o644);
    until("GPU 1 is back", || gpus_free(2)).await;
    replace(&rows, healthy.lines().next().unwrap(), 0o644);
    until("GPU 1 is gone", || gpus_free(1)).await;
    executable(
        dir.path(),
        "nvidia-smi",
        "echo 'Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error' >&2\nexit 9\n",
    );
    until("every GPU is out", || gpus_free(0)).await;
}

/// The agent's state files: one it cannot read is cleaned up at start, a
/// running engine has one, and an engine that dies takes its file with it
/// (a restarted agent must not adopt a dead engine) while the control
/// plane starts a replacement.
#[tokio::test]
async fn state_files_follow_their_engines_and_unreadable_ones_are_cleaned_up() {
    let sweep = EngineSweeper("127.0.11.".into());
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let server = start_server(&server_yaml(dir.path(), "files", &store, port, 1));
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("shard-broken.json"), "{not json").unwrap();
    let _agent = start_agent_in(
        &format!("http://127.0.0.1:{port}"),
        "files-1",
        "127.0.11.2",
        &work,
    );
    let state_files = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&work)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("shard-") && n.ends_with(".json"))
            .collect();
        names.sort();
        names
    };
    let ready_shard = || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        let ready = ready_replicas(&rows);
        ready.first()?["shards"][0]["shard_id"]
            .as_str()
            .map(str::to_owned)
    };
    let first = until("a ready replica with a state file", || async {
        let shard = ready_shard().await?;
        (state_files() == [format!("shard-{shard}.json")]).then_some(shard)
    })
    .await;
    assert!(
        !work.join("shard-broken.json").exists(),
        "cleaned up at start"
    );
    let engines = sweep.engines();
    assert_eq!(engines.len(), 1);
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &engines[0].0.to_string()])
        .status();
    until(
        "the dead engine's file is gone and it is replaced",
        || async {
            let shard = ready_shard().await?;
            (shard != first && state_files() == [format!("shard-{shard}.json")]).then_some(())
        },
    )
    .await;
}

/// A stop signal ends the agent within a second even while its first
/// engine probe hangs (a slow SGLang import), and the probe goes with it.
#[tokio::test]
async fn a_stop_signal_is_not_held_up_by_a_hanging_probe() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("probe-started");
    let pid = dir.path().join("probe-pid");
    let python = executable(
        dir.path(),
        "python",
        &format!(
            "echo $$ > {}; touch {}; exec sleep 60\n",
            pid.display(),
            started.display()
        ),
    );
    let mut agent = agent(
        free_port(),
        "slow-probe",
        dir.path(),
        &["--skip-gpus", "--sglang-python", python.to_str().unwrap()],
    );
    until("the probe runs", || async {
        started.exists().then_some(())
    })
    .await;
    let signalled = std::time::Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &agent.process.id().to_string()])
        .status();
    let status = agent.process.wait().unwrap();
    let took = signalled.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        took < std::time::Duration::from_secs(1),
        "the agent took {took:?} to stop"
    );
    let probe = std::fs::read_to_string(&pid).unwrap();
    until("the probe is gone", || async {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", probe.trim())).unwrap_or_default();
        (stat.is_empty()
            || stat
                .rsplit_once(") ")
                .is_some_and(|(_, r)| r.starts_with('Z')))
        .then_some(())
    })
    .await;
}

/// A start that needs the port of a shard of ours still stopping waits
/// for that stop instead of failing on "another program": the model is
/// removed and added back while its engine takes its time to exit.
#[tokio::test]
async fn a_start_waits_for_our_own_stopping_engine_to_free_its_port() {
    let ip = "127.0.12.4";
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Added with ctl: a model the file defines cannot be removed by ctl.
    let server = server(
        dir.path(),
        port,
        "  enabled: true\n  base_backoff: 300ms\n  port_range: [30630, 30635]\n",
        "  []\n",
    );
    let file = dir.path().join("slow.yaml");
    std::fs::write(
        &file,
        "name: slow\nsource: /models/slow.gguf\nscaling: {min: 1, max: 1}\nprofiles:\n  - name: cpu\n    engine: llamacpp\n",
    )
    .unwrap();
    // An "engine" that holds its port and takes four seconds to exit on
    // SIGTERM (as a large model freeing its GPUs does).
    let engine = executable(
        dir.path(),
        "llama-server",
        r#"while [ $# -gt 0 ]; do case "$1" in --host) h=$2;; --port) p=$2;; esac; shift; done
exec python3 -c "
import signal, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('$h', $p)); s.listen()
signal.signal(signal.SIGTERM, lambda *a: (time.sleep(4), sys.exit(0)))
time.sleep(600)
"
"#,
    );
    let _sweep = StateFileSweeper(dir.path().join("work"));
    let _agent = agent(
        port,
        "slow-1",
        dir.path(),
        &[
            "--skip-gpus",
            "--engine-bind",
            ip,
            "--mgmt-addr",
            ip,
            "--stop-timeout-s",
            "20",
            "--llamacpp-bin",
            engine.to_str().unwrap(),
        ],
    );
    let (ok, _, err) = ctl(&server.admin, &["model", "add", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    let shard_on = |rows: &Value, port: u64| -> Option<String> {
        rows.as_array()?.iter().find_map(|r| {
            let s = &r["shards"][0];
            // Loading is the agent's word (the control plane says starting
            // as soon as it sends the start).
            (s["port"] == port && s["state"] == "loading")
                .then(|| s["shard_id"].as_str().unwrap_or_default().to_owned())
        })
    };
    let first = until("the engine runs on the first port", || async {
        shard_on(
            &get(format!("{}/api/v1/replicas", server.admin)).await,
            30630,
        )
    })
    .await;
    // The engine holds its port (and its SIGTERM handler is in place).
    until("the engine listens", || async {
        std::net::TcpStream::connect((ip, 30630)).ok().map(|_| ())
    })
    .await;
    let (ok, _, err) = ctl(&server.admin, &["model", "remove", "slow"]);
    assert!(ok, "{err}");
    // Its replica is stopped at once; its engine takes seconds to go.
    until("the replica is stopped", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        rows.as_array()?.is_empty().then_some(())
    })
    .await;
    let (ok, _, err) = ctl(&server.admin, &["model", "add", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    until("the replacement runs on the same port", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        shard_on(&rows, 30630).filter(|s| *s != first).map(|_| ())
    })
    .await;
    let all = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
    assert!(
        !all.to_string().contains("not free"),
        "our own stopping engine was taken for another program: {all}"
    );
}

/// The logs of shards stopped longer than the retention leave the work
/// directory when the agent starts; a recent one stays and `ctl logs`
/// still offers it.
#[tokio::test]
async fn old_engine_logs_of_stopped_shards_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let old = work.join("shard-s-old.log");
    std::fs::write(&old, "an engine that stopped long ago\n").unwrap();
    let ten_days = std::time::Duration::from_secs(10 * 24 * 3600);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - ten_days)
        .unwrap();
    std::fs::write(work.join("shard-s-recent.log"), "stopped an hour ago\n").unwrap();
    let port = free_port();
    let server = server(dir.path(), port, "  enabled: true\n", "  []\n");
    let _agent = agent(
        port,
        "pruner",
        dir.path(),
        &["--skip-gpus", "--engine-log-retention-h", "72"],
    );
    let listed = until("the node's logs are listed", || async {
        let (ok, out, _) = ctl(&server.admin, &["logs", "pruner"]);
        ok.then_some(out)
    })
    .await;
    assert!(
        listed.contains("s-recent") && !listed.contains("s-old"),
        "{listed}"
    );
    assert!(!old.exists(), "the old log is gone from the work directory");
}

/// An agent given a server's client or admin address instead of its agent
/// listener says so (it retried for ever on "connection closed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_pointed_at_the_wrong_listener_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), free_port(), "  enabled: true\n", "  []\n");
    for (i, wrong) in [&server.base, &server.admin].into_iter().enumerate() {
        let work = dir.path().join(format!("agent-{i}"));
        let agent = start_agent_in(wrong, "lost", "127.0.0.1", &work);
        let said = Child::expect(&agent.stderr, "no session with the control plane");
        assert!(
            said.contains(&format!("{wrong} answers plain HTTP"))
                && said.contains("not its agent listener"),
            "{said}"
        );
    }
}
