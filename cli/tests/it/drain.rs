//! Drained replicas: one with nothing left to finish does not wait out
//! its grace, and a removed model's answer in flight finishes; a drain
//! with nowhere to go keeps serving and is ended by uncordon.

use serde_json::{Value, json};

use super::Child;
use super::cluster::{
    EngineSweeper, ServerProc, ctl, free_port, get, model_yaml, ready_replicas, server_yaml,
    start_agent, start_server, until,
};

fn node_of(replica: &Value) -> String {
    replica["shards"][0]["node"].as_str().unwrap().to_owned()
}

/// A server whose drain grace is far longer than a test may take (a stop
/// that waited for it would time the test out).
/// Its store's address beside it.
fn patient_server(dir: &std::path::Path, name: &str, port: u16) -> (ServerProc, String) {
    let store = format!("sqlite://{}", dir.join("llmgw.db").display());
    let config = server_yaml(dir, name, &store, port, 0);
    let yaml = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, yaml.replace("drain_grace: 1s", "drain_grace: 10m")).unwrap();
    (start_server(&config), store)
}

/// Once `nodes` nodes are connected, adds the one-replica `chat` model and
/// waits until the gateway routes to its replica; returns that replica.
async fn serving_chat(server: &ServerProc, dir: &std::path::Path, nodes: usize) -> Value {
    until("the nodes", || async {
        let listed = get(format!("{}/api/v1/nodes", server.admin)).await;
        (listed.as_array().unwrap().len() == nodes).then_some(())
    })
    .await;
    let model = dir.join("chat.yaml");
    std::fs::write(&model, model_yaml(1)).unwrap();
    let (ok, _, err) = ctl(&server.admin, &["model", "add", model.to_str().unwrap()]);
    assert!(ok, "{err}");
    let replica = until("a ready replica", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        ready_replicas(&rows).into_iter().next()
    })
    .await;
    until("the gateway routes", || async {
        let r = reqwest::get(format!("{}/ready", server.base)).await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    replica
}

/// A stream of `tokens` (the sim makes 100 a second) under way: its
/// response and its first chunk.
async fn streaming(server: &ServerProc, tokens: u32) -> (reqwest::Response, String) {
    let mut stream = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(
            &json!({"model": "chat", "stream": true, "max_tokens": tokens,
                      "messages": [{"role": "user", "content": "a long answer"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let first = stream.chunk().await.unwrap().unwrap();
    assert!(!first.is_empty());
    (stream, String::from_utf8_lossy(&first).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_replica_stops_when_its_last_stream_ends_not_at_the_grace() {
    let _sweep = EngineSweeper("127.0.31.".into());
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (server, store) = patient_server(dir.path(), "solo", port);
    let servers = format!("http://127.0.0.1:{port}");
    let _agents: Vec<Child> = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(i, n)| start_agent(&servers, n, &format!("127.0.31.{}", i + 2)))
        .collect();
    let original = serving_chat(&server, dir.path(), 2).await;

    // A stream of about five seconds is running on the original when its
    // node is drained.
    let started = std::time::Instant::now();
    let (mut stream, first) = streaming(&server, 500).await;
    let node = node_of(&original);
    let (ok, out, err) = ctl(&server.admin, &["drain", &node]);
    assert!(ok, "{out}{err}");

    let id = original["id"].as_str().unwrap().to_owned();
    let status_of = |rows: &Value| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id.as_str())
            .map(|r| r["status"].as_str().unwrap().to_owned())
    };
    until(
        "the original to drain behind a ready replacement",
        || async {
            let rows = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
            (status_of(&rows).as_deref() == Some("draining")).then_some(())
        },
    )
    .await;
    // The stream in flight is not cut: the replica drains while it runs.
    // The engine cannot have finished its 500 tokens before five seconds;
    // later, the client (slowed by a status request a chunk) may still be
    // reading what the engine sent before it went idle and was stopped,
    // which is allowed: the tokens below show nothing was lost.
    let mut body = first;
    while let Some(chunk) = stream.chunk().await.unwrap() {
        body.push_str(&String::from_utf8_lossy(&chunk));
        if started.elapsed() < std::time::Duration::from_secs(4) {
            let rows = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
            assert_eq!(
                status_of(&rows).as_deref(),
                Some("draining"),
                "stopped under a stream"
            );
        }
    }
    assert!(body.contains("[DONE]"), "the stream finished: {body}");
    let tokens = body.matches("\"content\":").count();
    assert!(tokens >= 500, "every token arrived: {tokens}");

    // Once idle it stops, long before the ten-minute grace.
    until("the drained replica to stop", || async {
        let rows = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
        (status_of(&rows).as_deref() == Some("stopped")).then_some(())
    })
    .await;
    let log = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["events", "log", "--store", &store, "--model", "chat"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(
        log.contains("nothing was left running"),
        "the log says why it stopped early:\n{log}"
    );
}

/// A model removed while a replica answers: the answer finishes (the
/// replica drains), then the replica stops; it used to be cut mid-stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_models_stream_in_flight_finishes() {
    let _sweep = EngineSweeper("127.0.32.".into());
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (server, _) = patient_server(dir.path(), "gone", port);
    let _agent = start_agent(&format!("http://127.0.0.1:{port}"), "a", "127.0.32.2");
    let replica = serving_chat(&server, dir.path(), 1).await;
    // About three seconds of answer.
    let (mut stream, mut body) = streaming(&server, 300).await;
    let (ok, _, err) = ctl(&server.admin, &["model", "remove", "chat"]);
    assert!(ok, "{err}");
    while let Some(chunk) = stream.chunk().await.unwrap() {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        body.contains("[DONE]") && !body.contains("\"error\""),
        "the answer finished: {body}"
    );
    assert!(body.matches("\"content\":").count() >= 300, "{body}");
    let id = replica["id"].as_str().unwrap().to_owned();
    until("the drained replica to stop", || async {
        let rows = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
        rows.as_array()?
            .iter()
            .any(|r| r["id"] == id.as_str() && r["status"] == "stopped")
            .then_some(())
    })
    .await;
}

/// One node: a drain has nowhere to move the replica, which keeps
/// serving; uncordon ends the drain (it used to be refused while the
/// node drained, so such a node stayed cordoned for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_with_nowhere_to_go_keeps_serving_and_uncordon_ends_it() {
    let _sweep = EngineSweeper("127.0.33.".into());
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (server, _store) = patient_server(dir.path(), "lone", port);
    let _agent = start_agent(&format!("http://127.0.0.1:{port}"), "a", "127.0.33.2");
    let original = serving_chat(&server, dir.path(), 1).await;
    let (ok, out, err) = ctl(&server.admin, &["drain", "a"]);
    assert!(ok && out.contains("llmgw ctl uncordon a"), "{out}{err}");
    let flags = || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (
            nodes[0]["cordoned"].as_bool(),
            nodes[0]["draining"].as_bool(),
        )
    };
    assert_eq!(flags().await, (Some(true), Some(true)));
    let (ok, out, err) = ctl(&server.admin, &["uncordon", "a"]);
    assert!(ok, "{out}{err}");
    assert_eq!(flags().await, (Some(false), Some(false)));
    // The replica never stopped, and serves.
    let (mut stream, _) = streaming(&server, 5).await;
    while stream.chunk().await.unwrap().is_some() {}
    let rows = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(rows[0]["id"], original["id"]);
    assert_eq!(rows[0]["status"], "ready");
}
