//! `ctl replicas --watch` and `ctl logs NODE --source S --follow` as an
//! operator leaves them running: each change printed as it happens, each
//! log line once.

use super::Child;
use super::cluster::{
    EngineSweeper, ctl, free_port, get, model_yaml, ready_replicas, server_yaml, start_agent,
    start_server, until,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_watch_and_logs_follow_print_changes_as_they_happen() {
    let _sweep = EngineSweeper("127.0.17.".into());
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let server = start_server(&server_yaml(dir.path(), "watch", &store, port, 0));
    let admin = server.admin.as_str();
    let watch = Child::spawn(&[
        "ctl",
        "replicas",
        "--watch",
        "--interval-s",
        "0.1",
        "--admin",
        admin,
    ]);
    // Nothing yet: the header alone, after the time line.
    assert!(Child::expect(&watch.stdout, "-- ").len() == "-- 00:00:00".len());
    Child::expect(&watch.stdout, "REPLICA");
    let _agent = start_agent(&format!("http://127.0.0.1:{port}"), "w1", "127.0.17.2");
    let model = dir.path().join("chat.yaml");
    std::fs::write(&model, model_yaml(1)).unwrap();
    let (ok, _, err) = ctl(admin, &["model", "add", model.to_str().unwrap()]);
    assert!(ok, "{err}");
    // The new replica appears, and later its ready state, each in a new
    // table printed by the same running command.
    let placed = Child::expect(&watch.stdout, "chat");
    let ready = loop {
        let line = Child::expect(&watch.stdout, "chat");
        if line.contains(" ready") {
            break line;
        }
    };
    assert!(ready.contains("0@w1:"), "{placed}\n{ready}");

    let rows = until("a ready replica", || async {
        let rows = get(format!("{admin}/api/v1/replicas")).await;
        (ready_replicas(&rows).len() == 1).then_some(rows)
    })
    .await;
    let shard = rows[0]["shards"][0]["shard_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // `ctl logs w1 --source SHARD --follow` with `extra`.
    let follow_with = |extra: &[&str]| {
        let mut args = vec!["ctl", "logs", "w1", "--source", &shard, "--follow"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--admin", admin]);
        Child::spawn(&args)
    };
    let follow = follow_with(&["--interval-s", "0.1"]);
    let mut seen = vec![Child::expect(&follow.stdout, "listening on")];
    let http = reqwest::Client::new();
    for id in ["follow-me-1", "follow-me-2"] {
        let r = http
            .post(format!("{}/v1/chat/completions", server.base))
            .header("x-request-id", id)
            .json(&serde_json::json!({"model": "chat", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        // Every line up to the one with this request's id.
        loop {
            let line = Child::expect(&follow.stdout, "");
            let done = line.contains(id);
            seen.push(line);
            if done {
                break;
            }
        }
    }
    let count = |needle: &str| seen.iter().filter(|l| l.contains(needle)).count();
    assert_eq!(
        (
            count("listening on"),
            count("follow-me-1"),
            count("follow-me-2")
        ),
        (1, 1, 1),
        "{seen:#?}"
    );

    // More lines between two looks than --lines: every one is printed
    // (--lines is how far back the first look goes, not a cap on a look).
    let short = follow_with(&["--lines", "1", "--interval-s", "0.5"]);
    Child::expect(&short.stdout, "");
    let burst = (1..=6).map(|i| {
        http.post(format!("{}/v1/chat/completions", server.base))
            .header("x-request-id", format!("burst-{i}"))
            .json(&serde_json::json!({"model": "chat", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    });
    for r in futures_util::future::join_all(burst).await {
        assert!(r.unwrap().status().is_success());
    }
    let mut missing: std::collections::BTreeSet<String> =
        (1..=6).map(|i| format!("burst-{i}")).collect();
    let mut printed = Vec::new();
    while !missing.is_empty() {
        let line = Child::expect(&short.stdout, "");
        missing.retain(|id| !line.contains(id.as_str()));
        printed.push(line);
    }
    // Only what came after the first look: the history before it (the
    // engine's start, the earlier requests) is not printed again.
    assert!(
        printed
            .iter()
            .all(|l| !l.contains("listening on") && !l.contains("follow-me-")),
        "{printed:#?}"
    );
    for i in 1..=6 {
        let id = format!("burst-{i}");
        let times = printed.iter().filter(|l| l.contains(&id)).count();
        assert_eq!(times, 1, "{id}: {printed:#?}");
    }

    // With --json, each line is a JSON document of its own.
    let json = follow_with(&["--json"]);
    let first: serde_json::Value =
        serde_json::from_str(&Child::expect(&json.stdout, "")).expect("a JSON line");
    assert!(first["line"].is_string(), "{first}");

    // Following a log that does not exist is an error at once.
    let (ok, _, err) = ctl(admin, &["logs", "w1", "--source", "nope", "--follow"]);
    assert!(!ok && err.contains("no log named nope"), "{err}");
}
