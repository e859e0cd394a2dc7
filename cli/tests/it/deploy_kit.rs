//! The deploy kit as an operator meets it: the systemd units, what the
//! server and agent tell systemd, and a stop that lets streams finish.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Child, tiny_engine, until};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `Key=value` lines of a unit file for one key.
fn directive<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

/// `systemd-analyze verify` wants ExecStart's binary to exist, so the
/// units are checked as copies whose ExecStart names the binary these
/// tests built; everything else is verified as shipped. verify exits 0 on
/// an unknown key or a bad value (it ignores them, as systemd would), so
/// anything it prints is a failure.
#[test]
fn the_systemd_units_pass_systemd_analyze_verify() {
    let analyze = Command::new("systemd-analyze").arg("--version").output();
    assert!(
        analyze.is_ok_and(|o| o.status.success()),
        "systemd-analyze is needed: apt-get install systemd (scripts/test does this)"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut copies = Vec::new();
    for name in [
        "llmgw-server.service",
        "llmgw-agent.service",
        "llmgw-mirror.service",
    ] {
        let unit = std::fs::read_to_string(repo().join("deploy/systemd").join(name)).unwrap();
        assert_eq!(
            directive(&unit, "ExecStart")
                .iter()
                .filter(|l| l.starts_with("/usr/local/bin/llmgw "))
                .count(),
            1,
            "{name} starts /usr/local/bin/llmgw"
        );
        let copy = dir.path().join(name);
        std::fs::write(
            &copy,
            unit.replace(
                "/usr/local/bin/llmgw ",
                &format!("{} ", env!("CARGO_BIN_EXE_llmgw")),
            ),
        )
        .unwrap();
        copies.push(copy);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&copies)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );

    let server =
        std::fs::read_to_string(repo().join("deploy/systemd/llmgw-server.service")).unwrap();
    for (key, want) in [
        ("Type", "notify"),
        ("User", "llmgw"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("StateDirectory", "llmgw"),
        ("ConfigurationDirectory", "llmgw"),
        ("EnvironmentFile", "-/etc/llmgw/server.env"),
        ("Restart", "on-failure"),
    ] {
        assert_eq!(directive(&server, key), [want], "server: {key}");
    }
    // The stop timeout outlasts the default grace and the flush after it.
    let stop = directive(&server, "TimeoutStopSec")[0];
    let stop_s: u64 = stop.trim_end_matches('s').parse().unwrap();
    assert!(stop_s >= 30 + 15, "TimeoutStopSec={stop}");

    let agent = std::fs::read_to_string(repo().join("deploy/systemd/llmgw-agent.service")).unwrap();
    for (key, want) in [
        ("Type", "notify"),
        ("User", "root"),
        ("KillMode", "process"),
    ] {
        assert_eq!(directive(&agent, key), [want], "agent: {key}");
    }
}

/// A socket standing in for systemd's: what the service sends arrives as
/// lines on the returned channel.
fn notify_socket(dir: &Path) -> (PathBuf, std::sync::mpsc::Receiver<String>) {
    let path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = sock.recv(&mut buf) {
            for line in String::from_utf8_lossy(&buf[..n]).lines() {
                if tx.send(line.to_owned()).is_err() {
                    return;
                }
            }
        }
    });
    (path, rx)
}

fn next_notification(rx: &std::sync::mpsc::Receiver<String>) -> String {
    rx.recv_timeout(Duration::from_secs(30))
        .expect("a notification")
}

#[tokio::test]
async fn the_server_and_the_agent_tell_systemd_when_ready_and_when_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, notes) = notify_socket(dir.path());
    let engine = tiny_engine();
    let endpoint = format!("e1=http://{}=tiny", engine.addr_after("listening on "));
    let mut server = Child::spawn_env(
        &[
            "server",
            "--endpoint",
            &endpoint,
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[("NOTIFY_SOCKET", socket.display().to_string())],
    );
    assert_eq!(next_notification(&notes), "READY=1");
    // Ready means serving: every listener answers.
    let client = server.addr_after("client listening on ");
    let metrics = server.addr_after("metrics listening on ");
    for addr in [&client, &metrics] {
        tokio::net::TcpStream::connect(addr).await.unwrap();
    }
    server.terminate();
    assert_eq!(next_notification(&notes), "STOPPING=1");
    assert!(server.process.wait().unwrap().success());

    // The agent is ready once it runs, whether or not a control plane
    // answers yet (none does here).
    let work = dir.path().join("agent");
    let mut agent = Child::spawn_env(
        &[
            "agent",
            "run",
            "--server",
            "http://127.0.0.1:1",
            "--node-id",
            "n1",
            "--skip-gpus",
            "--work-dir",
            work.to_str().unwrap(),
            "--cache-dir",
            dir.path().join("weights").to_str().unwrap(),
        ],
        &[("NOTIFY_SOCKET", socket.display().to_string())],
    );
    assert_eq!(next_notification(&notes), "READY=1");
    agent.terminate();
    assert_eq!(next_notification(&notes), "STOPPING=1");
    assert!(agent.process.wait().unwrap().success());
}

/// A sim engine that takes a tenth of a second per token, so a stream is
/// still running when the server is told to stop.
fn slow_engine() -> Child {
    Child::spawn(&[
        "sim-engine",
        "--listen",
        "127.0.0.1:0",
        "--model",
        "slow",
        "--ttft-ms",
        "1",
        "--tps",
        "10",
    ])
}

fn gateway_to(engine: &Child, extra: &[&str]) -> (Child, String) {
    let endpoint = format!("e1=http://{}=slow", engine.addr_after("listening on "));
    let mut args = vec![
        "server",
        "--endpoint",
        &endpoint,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let server = Child::spawn(&args);
    let client = server.addr_after("client listening on ");
    (server, client)
}

/// Starts a stream of `tokens` and returns it once its first bytes are in.
async fn stream_started(client: &str, tokens: u32) -> (reqwest::Response, String) {
    let mut resp = reqwest::Client::new()
        .post(format!("http://{client}/v1/chat/completions"))
        .json(
            &json!({"model": "slow", "stream": true, "max_tokens": tokens,
                      "messages": [{"role": "user", "content": "tell me a story"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().expect("a first chunk");
    (resp, String::from_utf8_lossy(&first).into_owned())
}

/// Everything else the stream sends, and whether it ended cleanly.
async fn rest_of(mut resp: reqwest::Response, mut text: String) -> (String, bool) {
    loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => text.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(None) => return (text, true),
            Err(_) => return (text, false),
        }
    }
}

async fn refuses_connections(addr: &str) {
    until("the client listener to refuse connections", || async {
        match tokio::net::TcpStream::connect(addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_lets_a_stream_in_flight_finish_and_refuses_new_connections() {
    let engine = slow_engine();
    let (mut server, client) = gateway_to(&engine, &[]);
    // Thirty tokens at ten a second: three seconds of stream.
    let (resp, first) = stream_started(&client, 30).await;
    server.terminate();
    Child::expect(&server.stdout, "stopping: no new connections");
    refuses_connections(&client).await;
    let (text, clean) = rest_of(resp, first).await;
    assert!(clean, "the stream ended early: {text}");
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    let content: usize = data
        .iter()
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    assert_eq!(content, 30, "every token arrived: {text}");
    assert!(server.process.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_longer_than_the_grace_is_cut_at_the_grace() {
    let engine = slow_engine();
    let (mut server, client) = gateway_to(&engine, &["--shutdown-grace", "500ms"]);
    let admin = server.addr_after("admin listening on ");
    // Six hundred tokens would take a minute; the grace is half a second.
    // A plain answer of as many is still awaited at the cut.
    let plain = tokio::spawn({
        let url = format!("http://{client}/v1/chat/completions");
        async move {
            let resp = reqwest::Client::new()
                .post(url)
                .json(&json!({"model": "slow", "max_tokens": 600,
                              "messages": [{"role": "user", "content": "tell me a story"}]}))
                .send()
                .await
                .unwrap();
            (resp.status(), resp.text().await.unwrap())
        }
    });
    until("the plain request to reach the engine", || {
        let url = format!("http://{admin}/metrics");
        async move {
            let page = reqwest::get(url).await.ok()?.text().await.ok()?;
            page.contains("llmgw_endpoint_in_flight{endpoint=\"e1\"} 1")
                .then_some(())
        }
    })
    .await;
    let (resp, first) = stream_started(&client, 600).await;
    server.terminate();
    Child::expect(&server.stdout, "requests in flight get up to 0.5s");
    let (text, clean) = rest_of(resp, first).await;
    assert!(
        !clean && !text.contains("[DONE]"),
        "the stream must break, not look complete: {text}"
    );
    // Cut between two events, it is told why first, as an SDK reads it.
    assert!(
        text.trim_end()
            .ends_with(r#""type":"server_error","code":"server_stopping"}}"#),
        "{text}"
    );
    Child::expect(&server.stderr, "the shutdown grace period is over");
    // Its access line says it was cut here, not left by its client.
    let line = Child::expect(&server.stderr, "stream_end=");
    assert!(line.contains("stream_end=\"server_stopping\""), "{line}");
    let (status, body) = plain.await.unwrap();
    let body: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{body}"));
    assert_eq!(
        (status.as_u16(), &body["error"]["code"]),
        (503, &json!("server_stopping")),
        "a request still waiting for its answer at the cut"
    );
    assert!(
        server.process.wait().unwrap().success(),
        "a stop that had to cut is still a clean stop"
    );
}

/// Every file directly in `dir`, by name, with its bytes.
fn files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

fn cert_names(pem: &Path) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["ctl", "cert", "inspect", "--json", pem.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    doc["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect()
}

/// Signs in on the pages' form, as a browser would, and returns the
/// cookies it holds afterwards.
async fn sign_in(base: &str, email: &str, password: &str) -> String {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let cookies = |r: &reqwest::Response| -> Vec<String> {
        r.headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|c| c.to_str().ok()?.split(';').next().map(str::to_owned))
            .collect()
    };
    let form = http.get(format!("{base}/login")).send().await.unwrap();
    let jar = cookies(&form).join("; ");
    let body = form.text().await.unwrap();
    let at = body.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    let csrf = &body[at..at + body[at..].find('"').unwrap()];
    let signed = http
        .post(format!("{base}/login"))
        .header("cookie", &jar)
        .form(&[("email", email), ("password", password), ("csrf", csrf)])
        .send()
        .await
        .unwrap();
    assert_eq!(signed.status(), 303, "{}", signed.text().await.unwrap());
    assert_eq!(signed.headers()["location"], "/profile");
    cookies(&signed).join("; ")
}

/// server.env's store is compared with `--store` as a database, not as
/// text (its password may be left off), and never shown with its password.
#[test]
fn server_init_names_another_store_without_its_password() {
    let root = tempfile::tempdir().unwrap();
    let etc = root.path().join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(
        etc.join("server.env"),
        "LLMGW_STORE=postgres://llmgw:Hush3d@127.0.0.1:1/llmgw\n",
    )
    .unwrap();
    let init = |store: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .env_remove("LLMGW_CONFIG")
            .current_dir(root.path())
            .args([
                "--store",
                store,
                "server",
                "init",
                "--admin",
                "a@example.org",
            ])
            .arg("--dir")
            .arg(&etc)
            .arg("--state-dir")
            .arg(root.path().join("state"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "no database at port 1");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let other = init("postgres://llmgw@127.0.0.1:1/elsewhere");
    assert!(
        other.contains("names another store (postgres://llmgw:***@127.0.0.1:1/llmgw)")
            && !other.contains("Hush3d"),
        "{other}"
    );
    // The same database without the password: on to the store (which is
    // not there), not "another store".
    let same = init("postgres://llmgw@127.0.0.1:1/llmgw");
    assert!(
        !same.contains("another store") && !same.contains("Hush3d"),
        "{same}"
    );
}

/// Beside a server.env that names the store (a database's address, kept
/// out of server.yaml for its password), a start by hand without it is
/// refused: it made a new, empty ./llmgw.db and led that.
#[test]
fn a_start_without_the_store_its_server_env_names_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("server.yaml");
    std::fs::write(
        &yaml,
        "listen: \"127.0.0.1:0\"\ncontrol:\n  enabled: true\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("server.env"),
        "LLMGW_STORE=postgres://llmgw:secret@127.0.0.1:1/llmgw\n",
    )
    .unwrap();
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .current_dir(dir.path())
            .args(["server", "--config", yaml.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("server.env names one (LLMGW_STORE)"), "{err}");
    assert!(!err.contains("secret"), "the password is not shown: {err}");
    assert!(!dir.path().join("llmgw.db").exists());
    // --check, which the deploy guides run by hand and which opens
    // nothing, and a named store, pass, each saying which store a start
    // opens (the first passed while the start then refused, silently).
    let here = format!("sqlite://{}", dir.path().join("here.db").display());
    for (extra, says) in [
        (&["--check"][..], "store: the one "),
        (&["--store", &here, "--check"], "store: sqlite://"),
    ] {
        let out = run(extra);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains(says),
            "{extra:?}: {said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!said.contains("secret"), "{said}");
    }
    let out = run(&["--check"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(
            "server.env names (LLMGW_STORE), which the unit reads; a start by hand needs it too"
        ),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_init_prepares_a_machine_once_and_its_admin_signs_in() {
    let root = tempfile::tempdir().unwrap();
    let (etc, state) = (root.path().join("etc"), root.path().join("state"));
    let init_as = |admin: &str, extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .env_remove("LLMGW_CONFIG")
            .current_dir(root.path())
            .args(["server", "init", "--admin", admin, "--dir"])
            .arg(&etc)
            .arg("--state-dir")
            .arg(&state)
            .args(extra)
            .output()
            .unwrap()
    };
    let init = |extra: &[&str]| {
        let out = init_as("ada@example.org", extra);
        assert!(
            out.status.success(),
            "init: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // A bad name or store is refused before anything is written.
    for extra in [&["--host", "a b"][..], &["--store", "no-such-dir/llmgw.db"]] {
        let out = init_as("ada@example.org", extra);
        assert!(!out.status.success(), "{extra:?}");
        assert!(!etc.exists() && !state.exists(), "{extra:?} wrote files");
    }
    // A store in the state directory this makes, named: fine on a fresh
    // machine (it is the default's place too).
    let in_state = format!("sqlite://{}", state.join("llmgw.db").display());
    let first = init(&["--store", &in_state]);
    let password = first
        .lines()
        .find_map(|l| l.strip_prefix("admin password (shown only now): "))
        .unwrap_or_else(|| panic!("no password printed: {first}"))
        .to_owned();
    for step in [
        "created  authority",
        "created  server certificate",
        "server.yaml",
        "created  project default",
        "promoted to admin",
    ] {
        assert!(first.contains(step), "{step}: {first}");
    }
    let made = files(&etc);
    for name in [
        "ca.pem",
        "ca-key.pem",
        "server.pem",
        "server-key.pem",
        "server.yaml",
        "server.env",
    ] {
        assert!(made.contains_key(name), "{name}: {:?}", made.keys());
    }
    let names = cert_names(&etc.join("server.pem"));
    assert!(
        names.iter().any(|n| n == "127.0.0.1") && names.iter().any(|n| n == "localhost"),
        "{names:?}"
    );

    // Again: every step says it was done before, and no file changes.
    let second = init(&[]);
    assert!(
        !second.contains("password") || second.contains("no password is printed"),
        "{second}"
    );
    assert!(
        second
            .lines()
            .all(|l| !l.starts_with("created") && !l.starts_with("reissued")),
        "{second}"
    );
    assert_eq!(files(&etc), made, "a second init changes no file");

    // A new name reissues the server's certificate under the same authority.
    let third = init(&["--host", "extra.example"]);
    assert!(third.contains("reissued server certificate"), "{third}");
    let now = files(&etc);
    for kept in ["ca.pem", "ca-key.pem", "server.yaml", "server.env"] {
        assert_eq!(now[kept], made[kept], "{kept} is kept");
    }
    assert_ne!(now["server.pem"], made["server.pem"]);
    let names = cert_names(&etc.join("server.pem"));
    assert!(
        names.iter().any(|n| n == "extra.example") && names.iter().any(|n| n == "127.0.0.1"),
        "{names:?}"
    );

    // The service starts on what init wrote, and the admin signs in with
    // the printed password: server.yaml names the store server.env does
    // (the unit reads both), so a start by hand, without server.env,
    // opens the same log (it made a new one in the working directory).
    let env = std::fs::read_to_string(etc.join("server.env")).unwrap();
    let store = env
        .lines()
        .find_map(|l| l.strip_prefix("LLMGW_STORE="))
        .unwrap()
        .to_owned();
    let yaml = std::fs::read_to_string(etc.join("server.yaml")).unwrap();
    assert!(yaml.contains(&format!("store: {store:?}")), "{yaml}");
    // Its comments name the files of its own directory, not /etc/llmgw.
    assert!(
        !yaml.contains("/etc/llmgw")
            && yaml.contains(&format!("@{}", etc.join("admin-token").display())),
        "{yaml}"
    );
    let server = Child::spawn_env(
        &[
            "server",
            "--config",
            etc.join("server.yaml").to_str().unwrap(),
        ],
        &[
            ("LLMGW_LISTEN", "127.0.0.1:0".into()),
            ("LLMGW_ADMIN_LISTEN", "127.0.0.1:0".into()),
            ("LLMGW_AGENT_LISTEN", "127.0.0.1:0".into()),
        ],
    );
    let base = format!("http://{}", server.addr_after("client listening on "));
    let session = sign_in(&base, "ada@example.org", &password).await;
    let admin_page = reqwest::Client::new()
        .get(format!("{base}/admin"))
        .header("cookie", session)
        .send()
        .await
        .unwrap();
    assert_eq!(admin_page.status(), 200, "the admin sees the admin pages");

    // While the server leads, init cannot decide a new admin's sign-up: it
    // fails, shows no password, and leaves no half-made person behind, so
    // that it makes the admin once the server is stopped.
    let init_bob = || init_as("bob@example.org", &[]);
    let refused = init_bob();
    let (out, err) = (
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr),
    );
    assert!(!refused.status.success(), "{out}");
    assert!(err.contains("bob@example.org was not made"), "{err}");
    assert!(!out.contains("password"), "{out}");
    // A clean stop gives the lease up.
    let mut server = server;
    server.terminate();
    assert!(server.process.wait().unwrap().success());
    let made = init_bob();
    let out = String::from_utf8_lossy(&made.stdout);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    assert!(out.contains("admin password (shown only now): "), "{out}");
}

/// `--store @FILE` keeps a password off init's command line; server.env
/// gets the address the file holds, since the unit runs as a user who may
/// not read FILE, and a second init with the same `@FILE` agrees with it.
#[test]
fn server_init_writes_the_address_an_at_file_holds() {
    let root = tempfile::tempdir().unwrap();
    let (etc, state) = (root.path().join("etc"), root.path().join("state"));
    let address = format!("sqlite://{}", root.path().join("log.db").display());
    let dsn = root.path().join("llmgw.dsn");
    std::fs::write(&dsn, format!("{address}\n")).unwrap();
    let at = format!("@{}", dsn.display());
    let init = || {
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .env_remove("LLMGW_CONFIG")
            .args([
                "--store",
                &at,
                "server",
                "init",
                "--admin",
                "ada@example.org",
            ])
            .arg("--dir")
            .arg(&etc)
            .arg("--state-dir")
            .arg(&state)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "init: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    init();
    let env = std::fs::read_to_string(etc.join("server.env")).unwrap();
    assert!(env.contains(&format!("LLMGW_STORE={address}\n")), "{env}");
    assert!(!env.contains('@'), "{env}");
    init();
}

/// An authority and a server certificate for 127.0.0.1, as `llmgw ctl
/// cert` makes them.
/// `--json` on the commands that write certificates says what they wrote
/// as one JSON document (they printed their text line).
#[test]
fn cert_commands_say_what_they_wrote_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    for (args, kind, name) in [
        (
            vec!["init-ca", "--name", "lab", "--dir", d],
            "authority",
            "lab",
        ),
        (
            vec!["issue-server", "gw", "--host", "127.0.0.1", "--dir", d],
            "server",
            "gw",
        ),
        (
            vec!["issue-client", "node-z", "--dir", d],
            "client",
            "node-z",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["ctl", "cert", "--json"])
            .args(&args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        let said: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out:?}"));
        assert_eq!(
            (said["kind"].as_str(), said["name"].as_str()),
            (Some(kind), Some(name))
        );
        for file in ["cert", "key"] {
            assert!(Path::new(said[file].as_str().unwrap()).is_file(), "{said}");
        }
    }
}

fn authority(dir: &Path) {
    let d = dir.to_str().unwrap();
    for args in [
        vec!["ctl", "cert", "init-ca", "--dir", d],
        vec![
            "ctl",
            "cert",
            "issue-server",
            "server",
            "--host",
            "127.0.0.1",
            "--dir",
            d,
        ],
        vec![
            "ctl",
            "cert",
            "issue-server",
            "other",
            "--host",
            "127.0.0.1",
            "--dir",
            d,
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(&args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_listener_serves_https_with_a_certificate_from_ctl_cert() {
    let dir = tempfile::tempdir().unwrap();
    authority(dir.path());
    let engine = tiny_engine();
    let engine_addr = engine.addr_after("listening on ");
    let config = |cert: &str, key: &str| {
        let f = dir.path().join(format!("{cert}-{key}.yaml"));
        std::fs::write(
            &f,
            format!(
                "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nendpoints: [\"e1=http://{engine_addr}=tiny\"]\n\
                 client_tls:\n  cert: {}\n  key: {}\n",
                dir.path().join(cert).display(),
                dir.path().join(key).display()
            ),
        )
        .unwrap();
        f
    };
    let server = Child::spawn(&[
        "server",
        "--config",
        config("server.pem", "server-key.pem").to_str().unwrap(),
    ]);
    let addr = server.addr_after("client listening on ");
    let ca = std::fs::read(dir.path().join("ca.pem")).unwrap();
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .no_proxy()
        .build()
        .unwrap();
    let health = https
        .get(format!("https://{addr}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "ok");
    let reply: serde_json::Value = https
        .post(format!("https://{addr}/v1/chat/completions"))
        .json(&json!({"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(reply["choices"][0]["message"]["content"], "fox was ");
    // Plain HTTP is answered in HTTP, saying to use https:// (a TLS
    // alert read as "Connection error." to the OpenAI SDK); a client that
    // does not trust the authority gets no answer.
    let plain = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 400);
    let said: serde_json::Value = plain.json().await.unwrap();
    assert_eq!(said["error"]["code"], "https_required", "{said}");
    assert!(
        said["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("send the request to https://{addr}")),
        "{said}"
    );
    let untrusting = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("https://{addr}/health"))
        .send()
        .await;
    assert!(untrusting.is_err(), "{untrusting:?}");

    // Files that are missing, or do not fit together, stop the start.
    for (cert, key, says) in [
        (
            "server.pem",
            "absent-key.pem",
            "client_tls.key: cannot read",
        ),
        ("server.pem", "other-key.pem", "do not fit together"),
        (
            "server-key.pem",
            "server-key.pem",
            "holds no PEM certificate",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["server", "--config", config(cert, key).to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{says}: {err}");
        // One line says why (log lines may come before it).
        let why: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert!(why.len() == 1 && why[0].contains(says), "{says}: {err}");
    }
}

/// The HA example's files, with the certificate paths moved to `dir`
/// (where `authority` made them).
fn ha_config(name: &str, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("deploy/examples/ha").join(name)).unwrap();
    let copy = dir.join(name);
    std::fs::write(
        &copy,
        text.replace("/etc/llmgw/", &format!("{}/", dir.display())),
    )
    .unwrap();
    copy
}

/// `listen:` of an example server file.
fn listen_of(config: &Path) -> String {
    let text = std::fs::read_to_string(config).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("listen: "))
        .unwrap()
        .trim_matches('"')
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ha_example_runs_two_servers_on_one_postgresql() {
    let dir = tempfile::tempdir().unwrap();
    authority(dir.path());
    let (store, _db) = llmgw_testkit::Scratch::new(llmgw_testkit::Backend::Postgres).await;
    let configs = [
        ha_config("server-a.yaml", dir.path()),
        ha_config("server-b.yaml", dir.path()),
    ];
    for config in &configs {
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["server", "--check", "--config", config.to_str().unwrap()])
            .env("LLMGW_STORE", &store)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success()
                && said.contains("configuration ok: control plane, keys required")
                && said.contains("store: postgres://"),
            "{config:?}: {out:?}"
        );
    }

    // The load balancer and keepalived probe /ready on the servers'
    // client listeners, as the files set them.
    let listens: Vec<String> = configs.iter().map(|c| listen_of(c)).collect();
    assert_ne!(listens[0], listens[1]);
    let haproxy = std::fs::read_to_string(repo().join("deploy/examples/ha/haproxy.cfg")).unwrap();
    assert!(haproxy.contains("option httpchk GET /ready"), "{haproxy}");
    for l in &listens {
        assert!(
            haproxy
                .lines()
                .any(|s| s.trim().starts_with("server ") && s.contains(&format!(" {l} check"))),
            "haproxy checks {l}"
        );
    }
    let keepalived =
        std::fs::read_to_string(repo().join("deploy/examples/ha/keepalived.conf")).unwrap();
    assert!(
        keepalived.contains(&format!("http://{}/ready", listens[0])),
        "{keepalived}"
    );

    // Both start on the one database (their addresses moved to this
    // machine): one leads, the other stands by and forwards an operator's
    // write to the leader through the advertised admin address.
    let mut servers = Vec::new();
    for config in &configs {
        let admin = format!("127.0.0.1:{}", super::cluster::free_port());
        let server = Child::spawn_env(
            &["server", "--config", config.to_str().unwrap()],
            &[
                ("LLMGW_STORE", store.clone()),
                ("LLMGW_LISTEN", "127.0.0.1:0".into()),
                ("LLMGW_ADMIN_LISTEN", admin.clone()),
                // On loopback here, where admin_open is refused.
                ("LLMGW_ADMIN_OPEN", "false".into()),
                ("LLMGW_METRICS_LISTEN", "127.0.0.1:0".into()),
                ("LLMGW_AGENT_LISTEN", "127.0.0.1:0".into()),
                ("LLMGW_CONTROL__ADVERTISE_ADMIN", format!("http://{admin}")),
            ],
        );
        server.addr_after("admin listening on ");
        servers.push((server, format!("http://{admin}")));
    }
    let leader = |admin: String| async move {
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["ctl", "leader", "--json", "--admin", &admin])
            .output()
            .ok()?;
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(doc)
    };
    let roles = until("one server to lead and the other to stand by", || async {
        let a = leader(servers[0].1.clone()).await?;
        let b = leader(servers[1].1.clone()).await?;
        (a["held"] == true && a["is_leader"] != b["is_leader"]).then_some((a, b))
    })
    .await;
    let instances = [roles.0["instance"].clone(), roles.1["instance"].clone()];
    assert_eq!(instances, [json!("cp-a"), json!("cp-b")]);
    let standby = if roles.0["is_leader"] == true {
        &servers[1].1
    } else {
        &servers[0].1
    };
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_remove("LLMGW_STORE")
        .args([
            "keys",
            "--admin",
            standby,
            "--as",
            "ops",
            "init",
            "--org",
            "o",
            "--team",
            "t",
            "--project",
            "p",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("project p is ready"),
        "{out:?}"
    );
}
