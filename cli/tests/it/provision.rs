//! `engines:` in the server's file, through the shipped binary: the leader
//! tells the agent, the agent installs the real llama-server from an
//! archive served in the test, `ctl nodes` says it is ready, and the tiny
//! model is served on it; an archive that does not match its checksum is
//! refused with the reason in `ctl nodes`.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::Child;
use super::cluster::{
    StateFileSweeper, ctl, file_server, free_port, get, ready_replicas, real_engine, start_server,
    until,
};

/// `llama-b1/llama-server` (the real one) as the CPU build's archive,
/// packed by the system's tar: its name and bytes.
fn archive(dir: &std::path::Path, version: &str) -> (String, Vec<u8>) {
    let (bin, _) = real_engine();
    let stage = dir.join("stage");
    let top = stage.join(format!("llama-{version}"));
    std::fs::create_dir_all(&top).unwrap();
    std::fs::copy(&bin, top.join("llama-server")).unwrap();
    let arch = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        other => other,
    };
    let name = format!("llama-{version}-bin-ubuntu-{arch}.tar.gz");
    let out = dir.join(&name);
    let ok = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&out)
        .arg("-C")
        .arg(&stage)
        .arg(format!("llama-{version}"))
        .status()
        .unwrap();
    assert!(ok.success());
    (name, std::fs::read(&out).unwrap())
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn server_file(dir: &std::path::Path, agent_port: u16, engines: &str, models: &str) -> String {
    let path = dir.join("server.yaml");
    let store = format!("sqlite://{}", dir.join("llmgw.db").display());
    std::fs::write(
        &path,
        format!(
            r#"listen: "127.0.0.1:0"
admin_listen: "127.0.0.1:0"
agent_listen: "127.0.0.1:{agent_port}"
store: "{store}"
control:
  enabled: true
  interval: 200ms
  port_range: [31600, 31649]
{engines}{models}"#
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn agent(dir: &std::path::Path, agent_port: u16, ip: &str) -> Child {
    Child::spawn(&[
        "agent",
        "run",
        "--server",
        &format!("http://127.0.0.1:{agent_port}"),
        "--node-id",
        "cpu-1",
        "--mgmt-addr",
        ip,
        "--engine-bind",
        ip,
        "--heartbeat-s",
        "0.2",
        "--skip-gpus",
        "--work-dir",
        dir.join("work").to_str().unwrap(),
        "--cache-dir",
        dir.join("cache").to_str().unwrap(),
        "--engines-dir",
        dir.join("engines").to_str().unwrap(),
        // The test machine's packages are not the test's to install.
        "--os-packages",
        "false",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_named_in_the_servers_file_is_installed_on_the_node_and_serves() {
    let (_, model) = real_engine();
    let dir = tempfile::tempdir().unwrap();
    let _sweep = StateFileSweeper(dir.path().join("work"));
    let (asset, bytes) = archive(dir.path(), "b1");
    let base = file_server(bytes.clone());
    let port = free_port();
    let engines = format!(
        "engines:\n  llamacpp:\n    version: b1\n    source: \"{base}/{{version}}/{{asset}}\"\n    sha256: {{{asset}: {}}}\n",
        hex(&bytes)
    );
    let models = format!(
        r#"models:
  - name: tiny
    source: {}
    scaling: {{min: 1, max: 1}}
    profiles:
      - name: cpu
        engine: llamacpp
        args: ["--ctx-size", "256"]
"#,
        model.display()
    );
    let server = start_server(&server_file(dir.path(), port, &engines, &models));
    let first = agent(dir.path(), port, "127.0.71.2");
    let (ok, table, err) = until("ctl nodes says llamacpp b1 is ready", || async {
        let out = ctl(&server.admin, &["nodes"]);
        out.1.contains("llamacpp b1 ready").then_some(out)
    })
    .await;
    assert!(ok, "{err}");
    assert!(table.contains("PROVISIONED"), "{table}");
    let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
    let p = &nodes[0]["provision"][0];
    assert_eq!(
        (&p["engine"], &p["variant"], &p["state"]),
        (&json!("llamacpp"), &json!("cpu"), &json!("ready")),
        "{nodes}"
    );
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .starts_with("llama-server version"),
        "{p}"
    );
    assert!(
        dir.path()
            .join("engines/llamacpp/b1-cpu/llama-b1/llama-server")
            .exists()
    );
    // The node reports llamacpp only now, and the replica runs on it.
    until("the tiny model is ready", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        (!ready_replicas(&rows).is_empty()).then_some(())
    })
    .await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "tiny", "max_tokens": 3,
            "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");

    // A restarted agent checks the build it has before it registers, so
    // its registration already carries llamacpp: the node's inventory
    // does not change (no event), and it is ready again.
    let inventory_changes = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args([
                "events",
                "tail",
                "--type",
                "NodeInventoryChanged",
                "--store",
            ])
            .arg(format!(
                "sqlite://{}",
                dir.path().join("llmgw.db").display()
            ))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter(|l| l.contains("NodeInventoryChanged"))
            .count()
    };
    let before = inventory_changes();
    drop(first);
    let saved = std::fs::read_to_string(dir.path().join("work/provision.json")).unwrap();
    assert!(saved.contains("\"b1\""), "{saved}");
    let _again = agent(dir.path(), port, "127.0.71.2");
    until("ready again after the restart", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes[0]["connected"] == true && nodes[0]["provision"][0]["state"] == "ready")
            .then_some(())
    })
    .await;
    assert_eq!(
        inventory_changes(),
        before,
        "the restart changed the inventory"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_that_does_not_match_its_checksum_is_refused_with_the_reason_in_ctl_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let (asset, bytes) = archive(dir.path(), "b2");
    let base = file_server(bytes);
    let port = free_port();
    let engines = format!(
        "engines:\n  llamacpp:\n    version: b2\n    source: \"{base}/{{asset}}\"\n    sha256: {{{asset}: {}}}\n",
        "0".repeat(64)
    );
    let server = start_server(&server_file(dir.path(), port, &engines, "models: []\n"));
    let _agent = agent(dir.path(), port, "127.0.71.3");
    let table = until("ctl nodes says why", || async {
        let (_, out, _) = ctl(&server.admin, &["nodes"]);
        out.contains("llamacpp b2 failed").then_some(out)
    })
    .await;
    assert!(
        table.contains(&format!(
            "cpu-1: llamacpp b2 failed: {asset} does not match the checksum its publisher gave"
        )),
        "{table}"
    );
    assert!(!dir.path().join("engines/llamacpp/b2-cpu").exists());
    // The admin pages say it too, on the node's row.
    let page = reqwest::get(format!("{}/admin", server.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("llamacpp b2 failed") && page.contains("does not match the checksum"),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_on_the_fleets_mirror_is_installed_and_checked_against_its_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let (asset, bytes) = archive(dir.path(), "b3");
    let upstream = file_server(bytes.clone());
    let models = dir.path().join("models");
    let added = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["mirror", "add", "--dir", models.to_str().unwrap()])
        .args(["--model", "llama.cpp", "--version", "b3"])
        .arg(format!("{upstream}/{asset}"))
        .output()
        .unwrap();
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let mirror = super::mirror::start_mirror(&models, &[]);
    let port = free_port();
    // No checksum in the file: the mirror's manifest has it.
    let engines = format!(
        "mirror:\n  url: {}\nengines:\n  llamacpp:\n    version: b3\n    source: \"mirror:llama.cpp\"\n",
        mirror.bytes
    );
    let server = start_server(&server_file(dir.path(), port, &engines, "models: []\n"));
    let _agent = agent(dir.path(), port, "127.0.71.4");
    until("ctl nodes says llamacpp b3 is ready", || async {
        let (_, out, _) = ctl(&server.admin, &["nodes"]);
        out.contains("llamacpp b3 ready").then_some(())
    })
    .await;
    let marker = std::fs::read_to_string(
        dir.path()
            .join("engines/llamacpp/b3-cpu")
            .join(llmgw_agent::provision::MARKER),
    )
    .unwrap();
    assert!(marker.contains(&hex(&bytes)), "{marker}");

    // The archive is in use by the fleet's engines though no model names
    // it: `mirror unused` does not offer it and `mirror remove` refuses it.
    let mirror_cmd = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .arg("mirror")
            .args(args)
            .args(["--dir", models.to_str().unwrap(), "--admin", &server.admin])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = mirror_cmd(&["unused", "--json"]);
    assert!(ok, "{err}");
    let unused: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(unused, serde_json::json!([]), "{out}");
    let (ok, _, err) = mirror_cmd(&[
        "remove",
        "--model",
        "llama.cpp",
        "--version",
        "b3",
        "--file",
        &asset,
    ]);
    assert!(!ok && err.contains("engines"), "{err}");
    assert!(models.join("llama.cpp/b3").join(&asset).exists());
}

#[test]
fn engine_settings_the_server_cannot_honour_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let check = |text: &str| {
        let path = dir.path().join("s.yaml");
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["server", "--check", "--config", path.to_str().unwrap()])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let store = format!(
        "store: \"sqlite://{}\"\n",
        dir.path().join("x.db").display()
    );
    for (body, why) in [
        (
            "endpoints: [\"e=http://127.0.0.1:1=m\"]\nengines: {llamacpp: {version: b1}}\n",
            "engines needs the control plane",
        ),
        (
            "control: {enabled: true}\nengines: {llamacpp: {version: b1, source: \"https://x/{version}.tgz\"}}\n",
            "must contain {asset}",
        ),
        (
            "control: {enabled: true}\nengines: {llamacpp: {version: b1, source: \"https://x/{asset}\"}}\n",
            "engines.llamacpp.sha256 is required",
        ),
        (
            "control: {enabled: true}\nengines: {vllm: {version: \"0.6\"}}\n",
            "unknown field `vllm`",
        ),
        (
            "control: {enabled: true}\nengines: {llamacpp: {version: b1, source: \"mirror:llama.cpp\"}}\n",
            "needs mirror.url",
        ),
    ] {
        let (code, err) = check(&format!("{store}{body}"));
        assert_eq!(code, Some(2), "{body}: {err}");
        assert!(err.contains(why), "{body}: {err}");
    }
}
