//! The peers: SGLang Model Gateway (`sglang-router` on PyPI) and
//! vllm-router (`vllm-router`), both Rust routers shipped as Python wheels,
//! run against the same upstream as llmgw so that the ratio is measured in
//! one run. `--peers` installs them into a venv (once; later runs reuse
//! it) and starts each on a free loopback port, round robin, request
//! logging off (what they log per request would otherwise be their cost).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A peer router running as a child process, stopped when dropped.
pub struct Peer {
    pub name: String,
    pub url: String,
    child: std::process::Child,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the peers are installed: `$LLMGW_PEERS_VENV`, or
/// `~/.cache/llmgw/peers-venv`.
pub fn venv() -> PathBuf {
    if let Some(v) = std::env::var_os("LLMGW_PEERS_VENV") {
        return PathBuf::from(v);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache/llmgw/peers-venv")
}

/// The two packages and the module or entry point each is started by.
const PACKAGES: [&str; 2] = ["sglang-router", "vllm-router"];

/// Creates the venv and installs what is missing; Err says what failed.
pub fn install(venv: &Path) -> Result<(), String> {
    let python = venv.join("bin/python");
    if !python.exists() {
        run(Command::new("python3").arg("-m").arg("venv").arg(venv))?;
    }
    let missing: Vec<&str> = PACKAGES
        .into_iter()
        .filter(|p| version(venv, p).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("installing {} into {}", missing.join(", "), venv.display());
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--quiet"])
        .args(&missing))
}

fn run(c: &mut Command) -> Result<(), String> {
    let out = c.output().map_err(|e| format!("{c:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{c:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The installed version of `package`, if it is installed.
pub fn version(venv: &Path, package: &str) -> Option<String> {
    let out = Command::new(venv.join("bin/python"))
        .args([
            "-c",
            &format!("import importlib.metadata as m; print(m.version({package:?}))"),
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts both peers against `upstream` and waits until each answers a
/// chat completion; a peer that does not come up is reported and left out.
pub async fn start(
    venv: &Path,
    upstream: SocketAddr,
    probe: &reqwest::Client,
    body: &str,
) -> Vec<Peer> {
    let mut peers = Vec::new();
    for package in PACKAGES {
        if let Some(p) = start_policy(venv, package, &[upstream], "round_robin", probe, body).await
        {
            peers.push(p);
        }
    }
    peers
}

/// Starts `package` over `workers` with a routing `policy` and waits until
/// it answers a chat completion; None (said why) when it does not.
pub async fn start_policy(
    venv: &Path,
    package: &str,
    workers: &[SocketAddr],
    policy: &str,
    probe: &reqwest::Client,
    body: &str,
) -> Option<Peer> {
    let Some(v) = version(venv, package) else {
        eprintln!("{package} is not installed in {}; left out", venv.display());
        return None;
    };
    let (port, metrics) = (free_port(), free_port());
    let mut c = match package {
        "sglang-router" => {
            let mut c = Command::new(venv.join("bin/python"));
            c.args(["-m", "sglang_router.launch_router", "--log-level", "warn"]);
            c
        }
        _ => {
            let mut c = Command::new(venv.join("bin/vllm-router"));
            c.args(["--log-level", "warning"]);
            c
        }
    };
    c.arg("--worker-urls")
        .args(workers.iter().map(|w| format!("http://{w}")))
        .args(["--policy", policy, "--host", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .args(["--prometheus-port", &metrics.to_string()]);
    let log = std::env::temp_dir().join(format!("llmgw-bench-{package}.log"));
    let file = std::fs::File::create(&log).unwrap();
    c.stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    let child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => {
            eprintln!("{package} could not start: {e}");
            return None;
        }
    };
    let name = match package {
        "sglang-router" => format!("SGLang Model Gateway {v}"),
        _ => format!("vllm-router {v}"),
    };
    let mut peer = Peer {
        name,
        url: format!("http://127.0.0.1:{port}/v1/chat/completions"),
        child,
    };
    if ready(&mut peer, probe, body).await {
        Some(peer)
    } else {
        eprintln!(
            "{} did not come up in 60 s; see {}",
            peer.name,
            log.display()
        );
        None
    }
}

/// Polls the peer with a chat completion until it answers 200.
async fn ready(peer: &mut Peer, probe: &reqwest::Client, body: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if !matches!(peer.child.try_wait(), Ok(None)) {
            return false;
        }
        let answer = probe
            .post(&peer.url)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await;
        if answer.is_ok_and(|r| r.status().is_success()) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}
