//! A node joins with one token (`llmgw ctl node token`, then `llmgw agent
//! run --join`), and a removed node's certificate is refused: the server,
//! the agents and ctl as separate processes over real sockets.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use llmgw_eventstore::{AnyStore, EventStore, OpenOptions, StoreAddress};
use llmgw_testkit::{Backend, Scratch};
use serde_json::{Value, json};
use sha2::Digest;

use super::Child;
use super::cluster::{
    EngineSweeper, ServerProc, ctl, free_port, get, ready_replicas, server_yaml, start_server,
    until,
};

fn llmgw(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = llmgw(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An authority and a server certificate for 127.0.0.1 in `dir`.
fn pki(dir: &Path) -> String {
    let p = dir.to_str().unwrap().to_owned();
    ok(&["ctl", "cert", "init-ca", "--dir", &p]);
    ok(&[
        "ctl",
        "cert",
        "issue-server",
        "cp",
        "--host",
        "127.0.0.1",
        "--dir",
        &p,
    ]);
    p
}

/// A server with a one-model catalog whose agent listener is mutual TLS;
/// with `ca_key`, nodes may join with a token.
fn tls_server(dir: &Path, store: &str, pki: &str, ca_key: bool) -> (ServerProc, String) {
    let port = free_port();
    let config = server_yaml(dir, "joins", store, port, 1);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "tls:\n  ca: {pki}/ca.pem\n  cert: {pki}/cp.pem\n  key: {pki}/cp-key.pem\n"
    ));
    if ca_key {
        text.push_str(&format!("  ca_key: {pki}/ca-key.pem\n"));
    }
    std::fs::write(&config, text).unwrap();
    (start_server(&config), format!("https://127.0.0.1:{port}"))
}

fn agent_args<'a>(url: &'a str, node: &'a str, ip: &'a str, work: &'a str) -> Vec<&'a str> {
    vec![
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
        "--reconnect-max-s",
        "0.5",
        "--skip-gpus",
        "--work-dir",
        work,
    ]
}

/// A token from `ctl node token`, and what it said on standard error.
fn token(admin: &str, args: &[&str]) -> (String, String) {
    let mut all = vec!["node", "token"];
    all.extend_from_slice(args);
    let (good, out, err) = ctl(admin, &all);
    assert!(good, "ctl node token: {err}");
    let token = out.trim().to_owned();
    assert_eq!(out.lines().count(), 1, "the token alone on stdout: {out}");
    assert!(token.starts_with("llmgw-join-"), "{token}");
    (token, err)
}

async fn events(store: &str) -> Vec<llmgw_eventstore::RecordedEvent> {
    let log = AnyStore::open(&StoreAddress::parse(store).unwrap(), OpenOptions::default())
        .await
        .unwrap();
    log.read_all_raw(0, 10_000).await.unwrap()
}

/// Runs an agent that must give up (its token refused): its exit status
/// and what it said.
fn refused_agent(url: &str, node: &str, work: &Path, token: &str) -> String {
    let mut args = agent_args(url, node, "127.0.31.9", work.to_str().unwrap());
    args.extend(["--join", token]);
    let out = llmgw(&args);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        !work.join("identity/node.pem").exists(),
        "a refused join stores nothing"
    );
    said
}

pub(crate) async fn a_node_joins_with_one_token_and_once_removed_its_certificate_is_refused(
    backend: Backend,
) {
    let sweep = EngineSweeper("127.0.31.".into());
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(&dir.path().join("pki"));
    let (store, _scratch) = Scratch::new(backend).await;
    let (server, url) = tls_server(dir.path(), &store, &pki, true);
    let says = Child::expect(&server.child.stderr, "agent listener");
    assert!(says.contains("may join with a token"), "{says}");

    // One token, for node a.
    let (t, how) = token(&server.admin, &["--ttl", "10m", "--node", "a"]);
    assert!(
        how.contains(&format!(
            "LLMGW_AGENT_JOIN=TOKEN llmgw agent run --server {url} --node-id a"
        )),
        "{how}"
    );
    // The log holds its hash, never the secret.
    let secret = t
        .trim_start_matches("llmgw-join-")
        .split('.')
        .next()
        .unwrap()
        .to_owned();
    let log = events(&store).await;
    let issued = log
        .iter()
        .find(|e| e.event_type == "JoinTokenIssued")
        .expect("the token's issue is an event");
    let hash: String = sha2::Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(issued.payload["token_hash"], hash.as_str());
    assert_eq!(issued.payload["node_id"], "a");
    assert!(
        log.iter().all(|e| !e.payload.to_string().contains(&secret)),
        "the secret is not in the log"
    );

    // The agent joins with it (from the variable, as the unit's
    // environment file gives it) and serves over mutual TLS.
    let work_a = dir.path().join("work-a");
    let args = agent_args(&url, "a", "127.0.31.2", work_a.to_str().unwrap());
    let a = Child::spawn_env(&args, &[("LLMGW_AGENT_JOIN", t.clone())]);
    Child::expect(&a.stderr, "joined the cluster");
    until("a replica served over the joined node's stream", || async {
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
    // The engine, which runs model code, does not inherit the token.
    let engine_env: Vec<String> = std::fs::read_dir(&work_a)
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
        .flat_map(|record| record["pids"].as_array().cloned().unwrap_or_default())
        .filter_map(|pid| std::fs::read(format!("/proc/{pid}/environ")).ok())
        .map(|env| String::from_utf8_lossy(&env).into_owned())
        .collect();
    assert!(
        !engine_env.is_empty(),
        "the engine's environment is readable"
    );
    assert!(
        engine_env.iter().all(|env| !env.contains(&secret)),
        "the join token reached the engine"
    );
    // Its key stayed on the node, readable by the agent only; its
    // certificate names it.
    let identity = work_a.join("identity");
    let mode = std::fs::metadata(identity.join("node-key.pem"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let cert: Value = serde_json::from_str(&ok(&[
        "ctl",
        "cert",
        "inspect",
        "--json",
        identity.join("node.pem").to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(
        (cert["subject"].as_str(), &cert["purposes"]),
        (Some("CN=a"), &json!(["client"]))
    );
    let joined = events(&store).await;
    let joined = joined
        .iter()
        .find(|e| e.event_type == "NodeJoined")
        .expect("the token's use is an event");
    assert_eq!(joined.payload["node_id"], "a");
    assert_eq!(joined.payload["token_id"], issued.payload["token_id"]);

    // The token again: refused, with the reason.
    let said = refused_agent(&url, "a", &dir.path().join("work-reuse"), &t);
    assert!(said.contains("already used (by node a)"), "{said}");
    let logged = Child::expect(&server.child.stderr, "refused a node's join");
    assert!(logged.contains("already used"), "{logged}");
    // An expired token: refused, with the reason.
    let (expired, _) = token(&server.admin, &["--ttl", "1ms"]);
    let said = refused_agent(&url, "b", &dir.path().join("work-expired"), &expired);
    assert!(said.contains("expired"), "{said}");
    // A token for another node: refused.
    let (for_c, _) = token(&server.admin, &["--node", "c"]);
    let said = refused_agent(&url, "b", &dir.path().join("work-other"), &for_c);
    assert!(said.contains("is for node c, not b"), "{said}");

    // Restarted without the token, the agent dials with what it stored.
    drop(a);
    let old_cert = dir.path().join("old");
    std::fs::create_dir(&old_cert).unwrap();
    for f in ["ca.pem", "node.pem", "node-key.pem"] {
        std::fs::copy(identity.join(f), old_cert.join(f)).unwrap();
    }
    let a = Child::spawn(&agent_args(
        &url,
        "a",
        "127.0.31.2",
        work_a.to_str().unwrap(),
    ));
    Child::expect(&a.stderr, "connected to the control plane");

    // Removed: its stream ends, and its certificate is refused with the
    // reason, on both sides.
    let (good, out, err) = ctl(&server.admin, &["node", "remove", "a"]);
    assert!(good, "{err}");
    assert!(out.contains("node a removed"), "{out}");
    let said = Child::expect(&a.stderr, "node a was removed from the cluster");
    assert!(said.contains("no session with the control plane"), "{said}");
    // The way back keeps the token out of the arguments.
    assert!(
        said.contains("`LLMGW_AGENT_JOIN=TOKEN llmgw agent run …`") && !said.contains("--join"),
        "{said}"
    );
    let logged = Child::expect(&server.child.stderr, "refused a removed node's certificate");
    assert!(logged.contains("127.0.0.1"), "{logged}");
    let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
    assert!(
        nodes.as_array().unwrap().iter().all(|n| n["id"] != "a"),
        "{nodes}"
    );
    let removed = events(&store).await;
    let removed = removed
        .iter()
        .find(|e| e.event_type == "NodeRemoved")
        .expect("the removal is an event");
    assert_eq!(
        removed.payload["certificates"],
        json!([joined.payload["certificate"]])
    );
    // The node's history says how it joined: the token issued, then used.
    let history = ok(&["--store", &store, "events", "log", "--node", "a"]);
    for what in [
        "JoinTokenIssued",
        "NodeJoined",
        "NodeRegistered",
        "NodeRemoved",
    ] {
        assert!(history.contains(what), "{what}: {history}");
    }
    // Its replica no longer counts: it is failed, to be rebuilt elsewhere.
    until("the removed node's replica stopped", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        rows.as_array().unwrap().is_empty().then_some(())
    })
    .await;
    drop(a);

    // A new token brings it back with a new certificate; the old one
    // stays refused.
    let (again, _) = token(&server.admin, &["--node", "a"]);
    let mut args = agent_args(&url, "a", "127.0.31.2", work_a.to_str().unwrap());
    args.extend(["--join", &again]);
    let a = Child::spawn(&args);
    Child::expect(&a.stderr, "joined the cluster");
    until("a replica served by the node that joined again", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        (ready_replicas(&rows).len() == 1).then_some(())
    })
    .await;
    let o = |f: &str| old_cert.join(f).to_str().unwrap().to_owned();
    let (ca, crt, key) = (o("ca.pem"), o("node.pem"), o("node-key.pem"));
    let stale_work = dir.path().join("work-stale");
    let mut args = agent_args(&url, "a", "127.0.31.3", stale_work.to_str().unwrap());
    args.extend(["--tls-ca", &ca, "--tls-cert", &crt, "--tls-key", &key]);
    let stale = Child::spawn(&args);
    let said = Child::expect(&stale.stderr, "this certificate was revoked");
    assert!(said.contains("no session with the control plane"), "{said}");
    drop(stale);
    drop(a);
    drop(sweep);
}

mod postgres {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_joins_with_one_token_and_once_removed_its_certificate_is_refused() {
        super::a_node_joins_with_one_token_and_once_removed_its_certificate_is_refused(
            super::Backend::Postgres,
        )
        .await
    }
}

mod sqlite {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_joins_with_one_token_and_once_removed_its_certificate_is_refused() {
        super::a_node_joins_with_one_token_and_once_removed_its_certificate_is_refused(
            super::Backend::Sqlite,
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_sign_says_so_at_start_or_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(&dir.path().join("pki"));
    let other = pki_other(&dir.path().join("other"));
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    // A key that is not the authority's: refused at start, in one line.
    let config = server_yaml(dir.path(), "wrong", &store, free_port(), 1);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "tls:\n  ca: {pki}/ca.pem\n  cert: {pki}/cp.pem\n  key: {pki}/cp-key.pem\n  ca_key: {other}/ca-key.pem\n"
    ));
    std::fs::write(&config, text).unwrap();
    let out = llmgw(&["server", "--config", &config, "--check"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("tls.ca_key is not the key of tls.ca's first certificate"),
        "{said}"
    );
    assert_eq!(said.trim().lines().count(), 1, "{said}");

    // Without a ca_key: a token is refused with what to configure, and an
    // agent with a token is told the server is not what it names.
    let (server, url) = tls_server(dir.path(), &store, &pki, false);
    let (good, _, err) = ctl(&server.admin, &["node", "token"]);
    assert!(!good);
    assert!(err.contains("ca_key"), "{err}");
    // Any pin: this server presents no authority at all.
    let fake = format!("llmgw-join-{}.{}", "ab".repeat(24), "0".repeat(32));
    let work = dir.path().join("work");
    let said = refused_agent(&url, "b", &work, &fake);
    assert!(
        said.contains("does not present the authority this token names"),
        "{said}"
    );
}

/// Issuing from a directory without the authority points at the fleet's
/// CA first: a new one (`init-ca`) would sign what the fleet does not trust.
#[test]
fn issuing_without_an_authority_asks_for_the_fleets_not_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().to_str().unwrap();
    for args in [
        &["ctl", "cert", "issue-client", "gpu-a-01", "--dir", p][..],
        &[
            "ctl",
            "cert",
            "issue-server",
            "mirror",
            "--host",
            "models.internal",
            "--dir",
            p,
        ][..],
    ] {
        let out = llmgw(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            err.contains(&format!("no authority in {p} (ca.pem and ca-key.pem)"))
                && err.contains("give --dir where your fleet's CA is")
                && err.contains("/etc/llmgw")
                && err.contains("for a new fleet only"),
            "{err}"
        );
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

fn pki_other(dir: &Path) -> String {
    let p = dir.to_str().unwrap().to_owned();
    ok(&["ctl", "cert", "init-ca", "--dir", &p]);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_a_standby_and_a_join_at_a_standby_reach_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(&dir.path().join("pki"));
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let config = |name: &str, port: u16| {
        let path = server_yaml(dir.path(), name, &store, port, 1);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&format!(
            "tls:\n  ca: {pki}/ca.pem\n  cert: {pki}/cp.pem\n  key: {pki}/cp-key.pem\n  ca_key: {pki}/ca-key.pem\n"
        ));
        std::fs::write(&path, text).unwrap();
        path
    };
    let leader = start_server(&config("lead", free_port()));
    until("the first server leads", || async {
        (get(format!("{}/api/v1/leader", leader.admin)).await["is_leader"] == true).then_some(())
    })
    .await;
    let standby_port = free_port();
    let standby = start_server(&config("stand", standby_port));
    // Asked of the standby, the token is the leader's decision.
    let (t, _) = token(&standby.admin, &["--node", "a"]);
    let issued = events(&store).await;
    let issued = issued
        .iter()
        .find(|e| e.event_type == "JoinTokenIssued")
        .unwrap();
    assert_eq!(issued.metadata["writer"], "lead", "{}", issued.metadata);
    // An agent that knows only the standby joins through the leader it
    // names.
    let work = dir.path().join("work-a");
    let standby_url = format!("https://127.0.0.1:{standby_port}");
    let mut args = agent_args(&standby_url, "a", "127.0.31.5", work.to_str().unwrap());
    args.extend(["--join", &t]);
    let a = Child::spawn(&args);
    Child::expect(&a.stderr, "joined the cluster");
    assert!(work.join("identity/node.pem").exists());
    drop(a);
}

/// While it cannot join (no server answers yet), an agent asks again as
/// often as `--reconnect-max-s` lets its redials, and its metrics page is
/// already up, saying it is not connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_agent_retries_within_its_reconnect_bound_and_serves_metrics_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    // Nothing listens here: every attempt fails to connect.
    let url = format!("https://127.0.0.1:{}", free_port());
    let token = llmgw_api::join_token::format(&"a".repeat(32), &"b".repeat(32));
    let mut args = agent_args(&url, "j", "127.0.31.7", work.to_str().unwrap());
    args.extend(["--join", &token, "--metrics-listen", "127.0.0.1:0"]);
    let a = Child::spawn(&args);
    let metrics = a.addr_after("metrics listening on ");
    let page = reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("llmgw_agent_connected 0"), "{page}");
    // agent_args sets --reconnect-max-s 0.5: no wait between attempts is
    // longer (the join's own doubling from 1 s up to 30 s was).
    for _ in 0..3 {
        let line = Child::expect(&a.stderr, "could not join yet");
        assert!(line.contains("retry_in_s=0.5"), "{line}");
    }
    assert!(!work.join("identity/node.pem").exists());
}
