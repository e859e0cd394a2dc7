//! A drain with nothing left to finish does not wait out its grace.

use serde_json::{Value, json};

use super::Child;
use super::cluster::{
    EngineSweeper, ctl, free_port, get, model_yaml, ready_replicas, server_yaml, start_agent,
    start_server, until,
};

fn node_of(replica: &Value) -> String {
    replica["shards"][0]["node"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_replica_stops_when_its_last_stream_ends_not_at_the_grace() {
    let _sweep = EngineSweeper("127.0.31.".into());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("llmgw.db");
    let store = format!("sqlite://{}", db.display());
    let port = free_port();
    let config = server_yaml(dir.path(), "solo", &store, port, 0);
    // A grace far longer than the test may take: a stop that waited for it
    // would time the test out.
    let yaml = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, yaml.replace("drain_grace: 1s", "drain_grace: 10m")).unwrap();
    let server = start_server(&config);
    let servers = format!("http://127.0.0.1:{port}");
    let _agents: Vec<Child> = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(i, n)| start_agent(&servers, n, &format!("127.0.31.{}", i + 2)))
        .collect();
    until("two nodes", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes.as_array().unwrap().len() == 2).then_some(())
    })
    .await;
    let model = dir.path().join("chat.yaml");
    std::fs::write(&model, model_yaml(1)).unwrap();
    let (ok, _, err) = ctl(&server.admin, &["model", "add", model.to_str().unwrap()]);
    assert!(ok, "{err}");
    let original = until("a ready replica", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        ready_replicas(&rows).into_iter().next()
    })
    .await;
    until("the gateway routes", || async {
        let r = reqwest::get(format!("{}/ready", server.base)).await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;

    // A stream of about five seconds (the sim makes 100 tokens a second)
    // is running on the original when its node is drained.
    let started = std::time::Instant::now();
    let mut stream = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "chat", "stream": true, "max_tokens": 500,
                      "messages": [{"role": "user", "content": "a long answer"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let first = stream.chunk().await.unwrap().unwrap();
    assert!(!first.is_empty());
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
    let mut body = String::from_utf8_lossy(&first).into_owned();
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
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let config = server_yaml(dir.path(), "gone", &store, port, 0);
    let yaml = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, yaml.replace("drain_grace: 1s", "drain_grace: 10m")).unwrap();
    let server = start_server(&config);
    let _agent = start_agent(&format!("http://127.0.0.1:{port}"), "a", "127.0.32.2");
    let model = dir.path().join("chat.yaml");
    std::fs::write(&model, model_yaml(1)).unwrap();
    until("the node", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes.as_array().unwrap().len() == 1).then_some(())
    })
    .await;
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
    // About three seconds of answer (the sim makes 100 tokens a second).
    let mut stream = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "chat", "stream": true, "max_tokens": 300,
                      "messages": [{"role": "user", "content": "a long answer"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let mut body = String::from_utf8_lossy(&stream.chunk().await.unwrap().unwrap()).into_owned();
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
