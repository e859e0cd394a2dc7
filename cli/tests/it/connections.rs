//! The listeners' caps and timeouts as configured in a server's file, in
//! each mode (router only; with the control plane, whose agent listener
//! has them too), and the engine client that no proxy variable diverts.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

use serde_json::json;

use super::{Child, until};

/// A server from `yaml` (listeners on loopback port 0 are added), with
/// its client, admin and (with the control plane) agent addresses.
fn server(
    dir: &Path,
    yaml: &str,
    env: &[(&str, String)],
) -> (Child, String, String, Option<String>) {
    let config = dir.join("server.yaml");
    std::fs::write(
        &config,
        format!("listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\n{yaml}"),
    )
    .unwrap();
    let child = Child::spawn_env(&["server", "--config", config.to_str().unwrap()], env);
    let control = yaml.contains("control:");
    let agent = control.then(|| child.addr_after("agent listening on "));
    let client = child.addr_after("client listening on ");
    let admin = child.addr_after("admin listening on ");
    (child, client, admin, agent)
}

/// Everything the peer sends until it closes the connection.
fn until_closed(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// One series' value from a server's admin page, when it has it.
async fn series(admin: &str, name: &str) -> Option<f64> {
    let page = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    page.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// What `connections:` sets is what the listeners do, router-only and
/// with the control plane.
#[tokio::test]
async fn caps_and_timeouts_from_the_file_hold_in_every_mode() {
    let limits = |max: &str| {
        format!("connections:\n  idle_timeout: 1s\n  body_timeout: 300ms\n  max: {{{max}}}\n")
    };
    for mode in ["router only", "control plane"] {
        let dir = tempfile::tempdir().unwrap();
        let yaml = match mode {
            "router only" => format!(
                "endpoints: [\"a=http://127.0.0.1:9=m\"]\n{}",
                limits("client: 1")
            ),
            _ => format!(
                "store: \"sqlite://{}\"\nagent_listen: \"127.0.0.1:0\"\ncontrol:\n  enabled: true\n{}",
                dir.path().join("llmgw.db").display(),
                limits("client: 1, agent: 1"),
            ),
        };
        let (_server, client, admin, agent) = server(dir.path(), &yaml, &[]);

        // A body that stalls: 408, and the connection closed.
        let mut s = TcpStream::connect(&client).unwrap();
        s.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-length: 50\r\n\r\n{\"model\"",
        )
        .unwrap();
        let answer = until_closed(&mut s);
        assert!(answer.starts_with("HTTP/1.1 408"), "{mode}: {answer}");
        assert!(answer.contains("request_timeout"), "{mode}: {answer}");

        // One connection at a time: a second waits until the first closes.
        let mut first = TcpStream::connect(&client).unwrap();
        first
            .write_all(b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 512];
        let n = first.read(&mut buf).unwrap();
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
            "{mode}"
        );
        let mut second = TcpStream::connect(&client).unwrap();
        second
            .write_all(b"GET /health HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
            .unwrap();
        let max = "llmgw_connections_max{listener=\"client\"}";
        assert_eq!(series(&admin, max).await, Some(1.0), "{mode}");
        let open = "llmgw_connections{listener=\"client\"}";
        assert_eq!(
            series(&admin, open).await,
            Some(1.0),
            "{mode}: the second waits"
        );
        // The first, idle, is closed at the idle timeout; then the second
        // is served.
        assert_eq!(until_closed(&mut first), "", "{mode}");
        let answer = until_closed(&mut second);
        assert!(answer.starts_with("HTTP/1.1 200"), "{mode}: {answer}");
        let full = "llmgw_connections_full_total{listener=\"client\"}";
        assert!(series(&admin, full).await.unwrap() >= 1.0, "{mode}");

        // The agent listener: capped, and a connection that says nothing
        // is closed.
        if let Some(agent) = agent {
            let max = "llmgw_connections_max{listener=\"agent\"}";
            assert_eq!(series(&admin, max).await, Some(1.0));
            // (The server speaks first: its HTTP/2 settings.)
            let mut silent = TcpStream::connect(&agent).unwrap();
            silent
                .set_read_timeout(Some(std::time::Duration::from_secs(20)))
                .unwrap();
            let mut said = Vec::new();
            let closed = match silent.read_to_end(&mut said) {
                Ok(_) => true,
                Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            };
            assert!(closed, "the silent agent connection is still open");
            until("the agent listener to free its slot", || async {
                let open = "llmgw_connections{listener=\"agent\"}";
                (series(&admin, open).await == Some(0.0)).then_some(())
            })
            .await;
        }
    }
}

/// What `server --check` says of `config`, which it must refuse (exit 2).
fn refused_at_check(config: &Path) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["server", "--check", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    err
}

#[test]
fn an_agent_listener_cap_without_the_control_plane_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("server.yaml");
    std::fs::write(
        &config,
        "endpoints: [\"a=http://127.0.0.1:9=m\"]\nconnections:\n  max: {agent: 10}\n",
    )
    .unwrap();
    let err = refused_at_check(&config);
    assert!(
        err.contains("connections.max.agent needs the control plane"),
        "{err}"
    );
    std::fs::write(
        &config,
        "endpoints: [\"a=http://127.0.0.1:9=m\"]\nconnections:\n  max: {client: 0}\n",
    )
    .unwrap();
    let err = refused_at_check(&config);
    assert!(
        err.contains("connections.max.client must be at least 1"),
        "{err}"
    );
}

/// A model of the file whose source is on the mirror, where no mirror.url
/// says where that is: refused at start (each start would fail at the
/// fetch while its requests waited).
#[test]
fn a_mirror_source_without_a_mirror_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("server.yaml");
    let store = dir.path().join("m.db");
    std::fs::write(
        &config,
        format!(
            "store: {}\nmodels:\n  - name: tiny\n    source: mirror:tiny/v1/tiny.gguf\n    scaling: {{min: 0, max: 1}}\n    profiles:\n      - name: cpu\n        engine: llamacpp\n",
            store.display()
        ),
    )
    .unwrap();
    let err = refused_at_check(&config);
    assert!(
        err.contains("model tiny has a mirror source") && err.contains("mirror.url"),
        "{err}"
    );
}

/// `llmgw server --config CONFIG` with its open files limited (soft,
/// hard) by prlimit(1), which sets its own limit and runs the server in
/// its place, so the child's pid is the server's.
fn limited(soft: u64, hard: u64, config: &Path) -> std::process::Command {
    let mut command = std::process::Command::new("prlimit");
    command.args([
        &format!("--nofile={soft}:{hard}"),
        "--",
        env!("CARGO_BIN_EXE_llmgw"),
        "server",
        "--config",
        config.to_str().unwrap(),
    ]);
    command
}

/// The soft limit on open files of a running process.
pub(super) fn open_files(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// Under the soft limit most processes start with (1,024 open files),
/// the default caps could never be reached. The server raises its soft
/// limit to the hard one; default caps that still do not fit are lowered
/// (with a warning, and the metrics say so), and caps the operator set
/// that cannot fit are refused at start, and by `--check`.
#[tokio::test]
async fn the_open_file_limit_is_raised_and_the_caps_fit_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("server.yaml");
    let router = "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\nendpoints: [\"a=http://127.0.0.1:9=m\"]\n";
    std::fs::write(&config, router).unwrap();

    // Room for the defaults (16,896 files router-only) under the hard limit.
    let server = Child::spawn_command(limited(1024, 19_000, &config));
    let admin = server.addr_after("admin listening on ");
    assert_eq!(open_files(server.process.id()), 19_000);
    let max = "llmgw_connections_max{listener=\"client\"}";
    assert_eq!(series(&admin, max).await, Some(8192.0));
    drop(server);

    // No room: the defaults are lowered to fit 1,024 files.
    let server = Child::spawn_command(limited(1024, 1024, &config));
    let warned = Child::expect(&server.stderr, "connection caps do not fit");
    assert!(
        warned.contains("connections.max.client 8192 -> 256"),
        "{warned}"
    );
    let admin = server.addr_after("admin listening on ");
    assert_eq!(series(&admin, max).await, Some(256.0));
    drop(server);

    // A cap the operator set that cannot fit: refused, naming it.
    std::fs::write(
        &config,
        format!("{router}connections:\n  max: {{client: 1000}}\n"),
    )
    .unwrap();
    // `--check` says so too, run where the server would run.
    for check in [false, true] {
        let mut command = limited(1024, 1024, &config);
        if check {
            command.arg("--check");
        }
        let out = command.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("need up to 2512 open files") && err.contains("may open 1024"),
            "{err}"
        );
        assert!(err.contains("lower connections.max.client"), "{err}");
    }
}

/// A proxy set for the machine's way out (weights, packages) does not
/// catch the engines: with every proxy variable pointing at a dead
/// address, requests are still served.
#[tokio::test]
async fn the_engine_client_ignores_proxy_variables() {
    let engine = Child::spawn(&[
        "sim-engine",
        "--listen",
        "127.0.0.1:0",
        "--model",
        "m",
        "--engine",
        "sim",
    ]);
    let addr = engine.addr_after("listening on ");
    let dead = "http://127.0.0.1:9".to_owned();
    let dir = tempfile::tempdir().unwrap();
    let env: Vec<(&str, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .into_iter()
    .map(|k| (k, dead.clone()))
    .chain([("NO_PROXY", String::new()), ("no_proxy", String::new())])
    .collect();
    let (_server, client, _admin, _) = server(
        dir.path(),
        &format!("endpoints: [\"a=http://{addr}=m;engine=sim\"]\n"),
        &env,
    );
    let r = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("http://{client}/v1/chat/completions"))
        .json(&json!({"model": "m", "max_tokens": 3,
                      "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body = r.text().await.unwrap();
    assert_eq!(status, 200, "{body}");
}
