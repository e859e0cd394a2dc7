//! `llmgw agent run --config agent.yaml`: the agent's settings from a
//! file, under its flags and `LLMGW_AGENT_…` variables, and the address
//! other nodes reach it at taken from the route to the control plane.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::Child;
use super::cluster::{StateFileSweeper, ctl, free_port, get, ready_replicas, start_server, until};

/// `llmgw agent run --check` with only `env` as its environment (and
/// PATH): the exit status, the resolved settings (or null) and stderr.
fn check(args: &[&str], env: &[(&str, &str)]) -> (i32, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .args(["agent", "run", "--check"])
        .args(args)
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// This machine's address on its default route, as the kernel would pick
/// it for `target`; None on a machine with loopback only.
fn route_to(target: &str) -> Option<String> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect(target).ok()?;
    Some(s.local_addr().ok()?.ip().to_string())
}

/// A flag wins over its variable's absence and the file; a variable wins
/// over the file; the file over the default; every other setting keeps its
/// default; lists come from the file unless a flag gives them.
#[test]
fn flags_and_variables_win_over_the_file_and_the_file_over_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.yaml");
    std::fs::write(
        &file,
        "servers: [\"http://127.0.0.1:7443\", \"http://127.0.0.2:7443\"]\nnode_id: from-file\nheartbeat_s: 2\nreconnect_max_s: 9\nlabels: {zone: a, rack: \"7\"}\nmodel_dirs: [/models/a]\nfabrics: {ib-a: [mlx5_0, mlx5_1]}\nskip_gpus: true\nllamacpp_bin: /opt/llama.cpp/bin/llama-server\nvllm_launch_mode: mp\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let (code, s, err) = check(
        &[
            "--config",
            path,
            "--node-id",
            "from-flag",
            "--model-dir",
            "/models/b",
        ],
        &[
            ("LLMGW_AGENT_HEARTBEAT_S", "0.5"),
            ("LLMGW_AGENT_SKIP_GPUS", "false"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["node_id"], "from-flag", "{s}");
    assert_eq!(s["heartbeat_s"], 0.5, "{s}");
    assert_eq!(s["skip_gpus"], false, "{s}");
    assert_eq!(s["reconnect_max_s"], 9.0, "{s}");
    assert_eq!(
        s["servers"],
        serde_json::json!(["http://127.0.0.1:7443", "http://127.0.0.2:7443"])
    );
    assert_eq!(s["model_dirs"], serde_json::json!(["/models/b"]));
    assert_eq!(s["labels"], serde_json::json!({"rack": "7", "zone": "a"}));
    assert_eq!(
        s["fabrics"],
        serde_json::json!({"ib-a": ["mlx5_0", "mlx5_1"]})
    );
    assert_eq!(s["llamacpp_bin"], "/opt/llama.cpp/bin/llama-server");
    assert_eq!(s["vllm_launch_mode"], "mp");
    // Defaults where nothing said otherwise.
    assert_eq!(s["work_dir"], "/var/lib/llmgw-agent");
    assert_eq!(s["stop_timeout_s"], 30.0);
    // The control plane is on loopback: so is the node, for it.
    assert_eq!(s["mgmt_addr"], "127.0.0.1", "{s}");

    // The variables agents used before still count, under the new ones.
    let (code, s, err) = check(
        &["--config", path],
        &[("LLMGW_NODE_ID", "older"), ("LLMGW_MGMT_ADDR", "10.9.9.9")],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        (&s["node_id"], &s["mgmt_addr"]),
        (&"older".into(), &"10.9.9.9".into())
    );
}

/// Without `mgmt_addr`, the node's address is its own on the route to
/// the control plane, not 127.0.0.1 (unless the machine has no route).
#[test]
fn the_management_address_defaults_to_the_route_to_the_control_plane() {
    // A documentation address (TEST-NET-2): reached by the default route,
    // and UDP "connecting" to it sends nothing.
    let server = "198.51.100.7:7443";
    let (code, s, err) = check(&["--server", server], &[]);
    assert_eq!(code, 0, "{err}");
    match route_to(server) {
        Some(ip) => {
            assert_eq!(s["mgmt_addr"], ip.as_str(), "{s}");
            assert_ne!(ip, "127.0.0.1");
        }
        None => assert_eq!(s["mgmt_addr"], "127.0.0.1", "{s}"),
    }
    // Engines listen where they are reached, not on every interface.
    assert_eq!(s["engine_bind"], s["mgmt_addr"], "{s}");
}

/// Engines listen on the management address by default (nothing in front
/// of them checks keys); on every interface only when this host does not
/// hold that address (behind NAT), with a warning; `--engine-bind` wins.
#[test]
fn engines_listen_on_the_management_address_unless_told() {
    let (code, s, err) = check(
        &["--server", "127.0.0.1:7443", "--mgmt-addr", "127.0.0.1"],
        &[],
    );
    assert_eq!(
        (code, &s["engine_bind"]),
        (0, &Value::from("127.0.0.1")),
        "{err}"
    );
    // TEST-NET-3: no host here holds it.
    let (code, s, err) = check(
        &["--server", "127.0.0.1:7443", "--mgmt-addr", "203.0.113.9"],
        &[],
    );
    assert_eq!((code, &s["engine_bind"]), (0, &Value::Null), "{err}");
    assert!(err.contains("engines listen on every interface"), "{err}");
    let (code, s, err) = check(
        &[
            "--server",
            "127.0.0.1:7443",
            "--mgmt-addr",
            "127.0.0.1",
            "--engine-bind",
            "0.0.0.0",
        ],
        &[],
    );
    assert_eq!(
        (code, &s["engine_bind"]),
        (0, &Value::from("0.0.0.0")),
        "{err}"
    );
}

/// A model directory that is not there is said (a typo would leave the
/// node reporting no weights), not refused (a mount may come up later).
#[test]
fn a_model_directory_that_is_not_there_is_said() {
    let (code, _, err) = check(
        &[
            "--server",
            "127.0.0.1:7443",
            "--model-dir",
            "/no/such/models",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("a model directory that is not there") && err.contains("/no/such/models"),
        "{err}"
    );
}

/// A typo is refused (exit 2, naming the key), and so is a setting of the
/// wrong type, before anything dials.
#[test]
fn an_unknown_or_wrong_key_is_refused_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let bad = |name: &str, text: &str| {
        let f = dir.path().join(name);
        std::fs::write(&f, text).unwrap();
        check(&["--config", f.to_str().unwrap()], &[])
    };
    let (code, _, err) = bad("typo.yaml", "servers: [\"127.0.0.1:7443\"]\nheartbeat: 5\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown field `heartbeat`"), "{err}");
    let (code, _, err) = bad(
        "type.yaml",
        "servers: [\"127.0.0.1:7443\"]\nheartbeat_s: often\n",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("heartbeat_s"), "{err}");
    let (code, _, err) = bad("none.yaml", "node_id: n\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no control plane"), "{err}");
    let (code, _, err) = bad(
        "agent.toml",
        "servers = [\"127.0.0.1:7443\"]\nnode_id = \"t\"\n",
    );
    assert_eq!(code, 0, "{err}");
}

/// What the agent would refuse once started, `--check` refuses too, with
/// exit 2: a check that passes is a start that does.
#[test]
fn check_refuses_what_the_start_would() {
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("x.pem");
    std::fs::write(&pem, "").unwrap();
    let pem = pem.to_str().unwrap();
    let server = ["--server", "127.0.0.1:7443"];
    // Under a file, no directory can be made, even by root.
    let blocked = format!("{pem}/weights");
    let missing = dir.path().join("absent.pem");
    let missing = missing.to_str().unwrap();
    let cases: [(&[&str], &str); 14] = [
        (
            &["--heartbeat-s", "0"],
            "--heartbeat-s must be a positive number",
        ),
        (&["--recheck-s=-1"], "--recheck-s must be a positive number"),
        (
            &["--engine-log-retention-h=-2"],
            "--engine-log-retention-h must be 0",
        ),
        (
            &[
                "--join",
                "tok",
                "--tls-ca",
                pem,
                "--tls-cert",
                pem,
                "--tls-key",
                pem,
            ],
            "two ways to the same certificate",
        ),
        (
            &["--skip-gpus", "--nvidia-smi", "/opt/bin/nvidia-smi"],
            "--nvidia-smi says how to find GPUs, and --skip-gpus reports none",
        ),
        (
            &["--cache-dir", &blocked],
            "x.pem/weights: cannot create it",
        ),
        // What the start reads before it dials, read here too.
        (
            &["--engine-log-retention-h", "1e300"],
            "--engine-log-retention-h must be 0",
        ),
        (
            &["--server", "ftp://127.0.0.1:7443"],
            "ftp://127.0.0.1:7443",
        ),
        (
            &[
                "--server",
                "http://127.0.0.1:7444",
                "--tls-ca",
                pem,
                "--tls-cert",
                pem,
                "--tls-key",
                pem,
            ],
            "127.0.0.1:7444",
        ),
        (
            &["--tls-ca", missing, "--tls-cert", pem, "--tls-key", pem],
            "--tls-ca: cannot read",
        ),
        (&["--join", "garbage"], "--join: not a join token"),
        // The address engines are reached at, and where they listen.
        (
            &["--mgmt-addr", "10.0.0.5:8000"],
            "is not an address or a host name",
        ),
        (
            &["--mgmt-addr", "http://10.0.0.5"],
            "is not an address or a host name",
        ),
        (
            &["--mgmt-addr", "10.0.0.5", "--engine-bind", "127.0.0.1"],
            "the gateway could never reach them",
        ),
    ];
    for (args, says) in cases {
        let (code, json, err) = check(&[&server[..], args].concat(), &[]);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(json, Value::Null, "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let (code, _, err) = check(
        &server,
        &[("LLMGW_AGENT_SKIP_GPUS", "1"), ("LLMGW_AGENT_NO_NVML", "1")],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--no-nvml says how to find GPUs"), "{err}");
    // A variable a letter off one the agent reads is refused, not passed
    // over (the node would register under another name).
    let (code, _, err) = check(&server, &[("LLMGW_AGENT_NODEID", "gpu-1")]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "LLMGW_AGENT_NODEID is not a variable of llmgw; did you mean LLMGW_AGENT_NODE_ID?"
        ),
        "{err}"
    );
    let (code, json, err) = check(
        &[&server[..], &["--skip-gpus", "--no-nvml=false"]].concat(),
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(json["skip_gpus"], true);
    // An IPv6 management address is an address.
    let (code, _, err) = check(
        &[&server[..], &["--mgmt-addr", "2001:db8::5"]].concat(),
        &[],
    );
    assert_eq!(code, 0, "{err}");
}

/// An agent given only `--config` joins a real server as the file says:
/// its id, its labels (a node selector places the model on it), and the
/// address it was reached at, its own on the route to the server, which
/// the gateway uses to reach the engine it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_configured_by_its_file_alone_joins_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // The server on every interface, so the agent can dial the host's own
    // address when it has one: plaintext there needs agent_plaintext.
    let host = route_to("198.51.100.7:9").unwrap_or_else(|| "127.0.0.1".into());
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let config = dir.path().join("server.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\nagent_listen: \"0.0.0.0:{port}\"\nagent_plaintext: true\nstore: \"{store}\"\ncontrol:\n  interval: 200ms\n  port_range: [31400, 31499]\nmodels:\n  - name: chat\n    scaling: {{min: 1, max: 1}}\n    profiles:\n      - name: sim\n        engine: sim\n        node_selector: {{zone: west}}\n"
        ),
    )
    .unwrap();
    let server = start_server(config.to_str().unwrap());
    let work = dir.path().join("work");
    let _sweep = StateFileSweeper(work.clone());
    let agent_yaml = dir.path().join("agent.yaml");
    write_agent_yaml(&agent_yaml, &host, port, &work, &dir.path().join("cache"));
    let _agent = Child::spawn(&["agent", "run", "--config", agent_yaml.to_str().unwrap()]);
    let node = until("the node from the file", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        nodes
            .as_array()?
            .iter()
            .find(|n| n["id"] == "filed")
            .cloned()
    })
    .await;
    assert_eq!(node["addr"], host.as_str(), "{node}");
    until("a ready replica on the labelled node", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        (ready_replicas(&rows).len() == 1).then_some(())
    })
    .await;
    let answer: Value = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&serde_json::json!({"model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{answer}"
    );
    let (ok, out, err) = ctl(&server.admin, &["nodes"]);
    assert!(ok && out.contains("filed"), "{out}{err}");
}

fn write_agent_yaml(path: &Path, host: &str, port: u16, work: &Path, cache: &Path) {
    std::fs::write(
        path,
        format!(
            "servers: \"http://{host}:{port}\"\nnode_id: filed\nlabels: {{zone: west}}\nheartbeat_s: 0.2\nreconnect_max_s: 0.5\nskip_gpus: true\nwork_dir: {}\ncache_dir: {}\n",
            work.display(),
            cache.display()
        ),
    )
    .unwrap();
}

/// The shipped example is accepted as it stands, with what it says.
#[test]
fn the_example_agent_file_is_accepted() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/agent.yaml");
    // Its servers are https://: the first start joins with the token
    // agent.env gives (LLMGW_AGENT_JOIN), later ones with what it stored.
    let token = format!("llmgw-join-{}.{}", "ab".repeat(24), "0".repeat(32));
    let example = example.to_str().unwrap();
    let (code, s, err) = check(&["--config", example], &[("LLMGW_AGENT_JOIN", &token)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["node_id"], "gpu-01");
    // Without it, it is refused at once, naming the way in.
    let (code, _, err) = check(&["--config", example], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("join with a token"), "{err}");
    assert_eq!(s["fabrics"]["ib-a"][1], "mlx5_1");
}

/// `agent inventory` sees what `agent run` would: the variables and the
/// agent's file name the model directories it scans, the flags win.
#[test]
fn inventory_takes_the_agents_file_and_variables() {
    let dir = tempfile::tempdir().unwrap();
    let (from_env, from_file) = (dir.path().join("env"), dir.path().join("file"));
    for (d, name) in [(&from_env, "a.gguf"), (&from_file, "b.gguf")] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join(name), b"GGUF").unwrap();
    }
    let file = dir.path().join("agent.yaml");
    std::fs::write(
        &file,
        format!(
            "servers: [\"127.0.0.1:7443\"]\nskip_gpus: true\nmodel_dirs: [{}]\n",
            from_file.display()
        ),
    )
    .unwrap();
    let weights = |env: &[(&str, String)], args: &[&str]| -> Vec<String> {
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .args(["agent", "inventory", "--json"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let inv: Value = serde_json::from_slice(&out.stdout).unwrap();
        inv["weights"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                w["path"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    let env_dirs = ("LLMGW_AGENT_MODEL_DIRS", from_env.display().to_string());
    assert_eq!(
        weights(
            &[env_dirs.clone(), ("LLMGW_AGENT_SKIP_GPUS", "1".into())],
            &[]
        ),
        ["a.gguf"]
    );
    let config = ("LLMGW_AGENT_CONFIG", file.display().to_string());
    assert_eq!(weights(std::slice::from_ref(&config), &[]), ["b.gguf"]);
    // The variable wins over the file, as for `agent run`.
    assert_eq!(weights(&[config, env_dirs], &[]), ["a.gguf"]);
}

/// Settings an agent could never work with are refused at start, not
/// found after placement or in an endless redial: https:// with no
/// certificate to show, a bind address that is none or that this host
/// does not hold. The retention variable's older name still counts.
#[test]
fn an_agent_refuses_settings_it_could_never_work_with() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("work");
    let w = w.to_str().unwrap();
    let tls = ["--server", "https://127.0.0.1:7443", "--work-dir", w];
    let (code, _, err) = check(&tls, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("join with a token"), "{err}");
    let token = format!("llmgw-join-{}.{}", "ab".repeat(24), "0".repeat(32));
    let (code, _, err) = check(&[&tls[..], &["--join", &token]].concat(), &[]);
    assert_eq!(code, 0, "{err}");
    let plain = ["--server", "127.0.0.1:7443", "--work-dir", w];
    for (bind, says) in [
        ("notanaddr", "is not an IP address"),
        ("192.0.2.77", "engines cannot listen there"),
    ] {
        let (code, _, err) = check(&[&plain[..], &["--engine-bind", bind]].concat(), &[]);
        assert_eq!(code, 2, "{bind}: {err}");
        assert!(err.contains(says), "{bind}: {err}");
    }
    for (name, hours) in [
        ("LLMGW_AGENT_ENGINE_LOG_RETENTION_H", 6.0),
        ("LLMGW_AGENT_LOG_RETENTION_H", 5.0),
    ] {
        let (code, s, err) = check(&plain, &[(name, &hours.to_string())]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(s["engine_log_retention_h"], hours, "{name}: {s}");
    }
}

/// With its own certificate and no --node-id, a node is the node its
/// certificate names (as deploy/examples/agent.yaml says), not the
/// hostname the server would refuse; --node-id still wins.
#[test]
fn a_certificate_names_the_node_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().to_str().unwrap();
    super::authority_and(pki, &["issue-client", "gpu-n7"]);
    let tls = |f: &str| format!("{pki}/{f}");
    let (ca, cert, key) = (tls("ca.pem"), tls("gpu-n7.pem"), tls("gpu-n7-key.pem"));
    let with_tls = [
        "--server",
        "https://127.0.0.1:7443",
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ];
    let (code, s, err) = check(&with_tls, &[]);
    assert_eq!((code, &s["node_id"]), (0, &Value::from("gpu-n7")), "{err}");
    let (code, s, err) = check(&[&with_tls[..], &["--node-id", "other"]].concat(), &[]);
    assert_eq!((code, &s["node_id"]), (0, &Value::from("other")), "{err}");

    // A certificate an earlier join stored in the work directory names
    // the node the same way (`--check` showed null).
    let work = dir.path().join("work");
    let identity = work.join("identity");
    std::fs::create_dir_all(&identity).unwrap();
    for (from, to) in [
        ("ca.pem", "ca.pem"),
        ("gpu-n7.pem", "node.pem"),
        ("gpu-n7-key.pem", "node-key.pem"),
    ] {
        std::fs::copy(tls(from), identity.join(to)).unwrap();
    }
    std::fs::write(identity.join("token.sha256"), "00\n").unwrap();
    let joined = [
        "--server",
        "127.0.0.1:7443",
        "--work-dir",
        work.to_str().unwrap(),
    ];
    let (code, s, err) = check(&joined, &[]);
    assert_eq!((code, &s["node_id"]), (0, &Value::from("gpu-n7")), "{err}");
    // With nothing to name it, the node is the machine's hostname.
    let bare = dir.path().join("bare");
    let (code, s, err) = check(
        &[
            "--server",
            "127.0.0.1:7443",
            "--work-dir",
            bare.to_str().unwrap(),
        ],
        &[],
    );
    let host = llmgw_agent::discovery::host::hostname();
    assert_eq!((code, &s["node_id"]), (0, &Value::from(host)), "{err}");
}

/// `agent inventory` prints the disk placement's `min_disk_gb` is checked
/// against: the weights cache's free space, measured where the cache
/// would be made on a node where `agent run` has not made it yet. It
/// printed no disk, and its JSON had none before the cache existed.
#[test]
fn inventory_prints_the_disk_placement_checks_before_the_cache_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("not/made/yet");
    let inventory = |json: bool| -> String {
        let mut c = Command::new(env!("CARGO_BIN_EXE_llmgw"));
        c.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .args(["agent", "inventory", "--skip-gpus", "--cache-dir"])
            .arg(&cache);
        if json {
            c.arg("--json");
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let inv: Value = serde_json::from_str(&inventory(true)).unwrap();
    assert_eq!(
        inv["storage"][0]["path"],
        cache.display().to_string(),
        "{inv}"
    );
    let gb = inv["disk_free_gb"].as_u64().unwrap();
    assert_eq!(
        gb,
        inv["storage"][0]["free_bytes"].as_u64().unwrap() / 1_000_000_000
    );
    let text = inventory(false);
    let line = text
        .lines()
        .find(|l| l.starts_with("disk "))
        .unwrap_or_else(|| panic!("no disk line: {text}"));
    let suffix = format!(" GB free where weights go ({})", cache.display());
    let said: u64 = line
        .strip_prefix("disk")
        .and_then(|l| l.strip_suffix(&suffix))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    // Other programs write to this disk between the two runs.
    assert!(said.abs_diff(gb) <= 1, "{said} and {gb}");
    assert!(!cache.exists(), "inventory makes nothing");
}

/// A fabric configured whose adapters are not on the node was dropped by
/// `agent run` without a word (`--check` accepted it, the log was silent,
/// `ctl nodes` showed no fabric). The registration says so, in the words
/// `agent inventory` uses; the agent still runs (an adapter may come up
/// later). No server is needed: a registration is made before each dial.
#[test]
fn a_fabric_the_registration_leaves_out_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let cache = dir.path().join("cache");
    let server = format!("http://127.0.0.1:{}", free_port());
    let agent = Child::spawn(&[
        "agent",
        "run",
        "--server",
        &server,
        "--node-id",
        "fabricless",
        "--skip-gpus",
        "--fabric",
        "ib-a=mlx5_llmgw_absent",
        "--work-dir",
        work.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    let line = Child::expect(&agent.stderr, "fabric ib-a: ");
    assert!(line.contains("WARN"), "{line}");
    assert!(
        line.contains("fabric ib-a: NOT USABLE; mlx5_llmgw_absent is not on this node (found: ")
            && line.contains("not registered"),
        "{line}"
    );
}
