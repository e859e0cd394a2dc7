//! A hosted OpenAI-compatible service as an endpoint: its key comes from
//! a variable or a file, never the command line, and is never printed.

use std::process::Command;

use serde_json::json;

use super::Child;

/// A sim engine that wants `key` as a bearer token, as a hosted service.
fn hosted(key: &str) -> (Child, String) {
    let engine = Child::spawn_env(
        &[
            "sim-engine",
            "--listen",
            "127.0.0.1:0",
            "--model",
            "gpt-x",
            "--engine",
            "sim",
        ],
        &[("LLMGW_SIM_API_KEY", key.to_owned())],
    );
    let addr = engine.addr_after("listening on ");
    (engine, addr)
}

async fn chat(base: &str) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "gpt-x", "max_tokens": 3,
                      "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or_default())
}

fn server(endpoint: &str, env: &[(&str, String)]) -> Child {
    server_on("127.0.0.1:0", endpoint, env)
}

fn server_on(listen: &str, endpoint: &str, env: &[(&str, String)]) -> Child {
    Child::spawn_env(
        &[
            "server",
            "--listen",
            listen,
            "--admin-listen",
            "127.0.0.1:0",
            "--endpoint",
            endpoint,
        ],
        env,
    )
}

#[tokio::test]
async fn a_static_endpoint_sends_its_upstream_key_from_a_variable_or_a_file() {
    let key = "sk-upstream-0123456789";
    let (_engine, addr) = hosted(key);

    // Straight to the service without the key: refused, so the key matters.
    let (status, _) = chat(&format!("http://{addr}")).await;
    assert_eq!(status, 401);

    let from_env = server(
        &format!("hosted=http://{addr}=gpt-x;engine=sim;key_env=HOSTED_KEY"),
        &[("HOSTED_KEY", key.to_owned())],
    );
    let base = format!("http://{}", from_env.addr_after("client listening on "));
    let (status, body) = chat(&base).await;
    assert_eq!(status, 200, "{body}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hosted.key");
    std::fs::write(&file, format!("{key}\n")).unwrap();
    let from_file = server(
        &format!(
            "hosted=http://{addr}=gpt-x;engine=sim;key_file={}",
            file.display()
        ),
        &[],
    );
    let base = format!("http://{}", from_file.addr_after("client listening on "));
    let (status, body) = chat(&base).await;
    assert_eq!(status, 200, "{body}");
    drop(from_file);
    // Nothing the server wrote names the key.
    let said: Vec<String> = from_env
        .stderr
        .try_iter()
        .chain(from_env.stdout.try_iter())
        .collect();
    assert!(!said.is_empty() && !said.iter().any(|l| l.contains(key)));
}

#[test]
fn a_key_on_the_command_line_or_a_missing_one_stops_the_start() {
    let start = |endpoint: &str| {
        Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("HOSTED_KEY")
            .args(["server", "--check", "--endpoint", endpoint])
            .output()
            .unwrap()
    };
    let out = start("hosted=http://127.0.0.1:9=gpt-x;key=sk-secret");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("key_env=VARIABLE or key_file=PATH"), "{err}");
    // In the file too; the refusal does not repeat the key.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("server.yaml");
    std::fs::write(
        &config,
        "endpoints: [\"hosted=http://127.0.0.1:9=gpt-x;key=sk-secret\"]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["server", "--check", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("key_file=PATH") && !err.contains("sk-secret"),
        "{err}"
    );
    let out = start("hosted=http://127.0.0.1:9=gpt-x;key_env=HOSTED_KEY");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("HOSTED_KEY, which is not set"), "{err}");
}

/// Router-only, the endpoints are every model there is: a fallback to a
/// name none serves (a typo) is refused at start, not passed over at every
/// request.
#[test]
fn a_fallback_no_endpoint_serves_is_refused_router_only() {
    let check = |fallback: &str| {
        Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args([
                "server",
                "--check",
                "--endpoint",
                "e=http://127.0.0.1:9=big,tiny",
            ])
            .args(["--fallback", fallback])
            .output()
            .unwrap()
    };
    let out = check("big=tinyy");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("\"big\" falls back to \"tinyy\", which no endpoint serves"),
        "{err}"
    );
    let out = check("big=tiny");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two gateways that each name the other as an endpoint: the request that
/// comes round to the first is refused as a loop (each took the other's
/// mark for a stranger's, and they passed it back and forth until
/// connections ran out). A gateway in front of another still serves.
#[tokio::test]
async fn two_gateways_that_name_each_other_refuse_the_loop() {
    let a_listen = format!("127.0.0.1:{}", super::cluster::free_port());
    let b = server(&format!("a=http://{a_listen}=gpt-x"), &[]);
    let b_addr = b.addr_after("client listening on ");
    let a = server_on(&a_listen, &format!("b=http://{b_addr}=gpt-x"), &[]);
    assert_eq!(a.addr_after("client listening on "), a_listen);
    let (status, body) = chat(&format!("http://{a_listen}")).await;
    assert_eq!(status, 508, "{body}");
    assert_eq!(body["error"]["code"], "loop_detected", "{body}");

    let (_engine, engine) = hosted("k");
    let back = server(
        &format!("e=http://{engine}=gpt-x;key_env=K"),
        &[("K", "k".into())],
    );
    let back = back.addr_after("client listening on ");
    let front = server(&format!("back=http://{back}=gpt-x"), &[]);
    let (status, body) = chat(&format!(
        "http://{}",
        front.addr_after("client listening on ")
    ))
    .await;
    assert_eq!(status, 200, "{body}");
}
