//! Request migration through the shipped binary: engine processes are
//! killed (SIGKILL) mid-answer, and the client still gets the one answer
//! it would have had, or, past `router.migration_limit`, an error event.

use serde_json::{Value, json};
use tokio_stream::StreamExt;

use super::Child;

fn engine() -> (Child, String) {
    let e = Child::spawn(&[
        "sim-engine",
        "--listen",
        "127.0.0.1:0",
        "--model",
        "chat",
        "--tps",
        "40",
    ]);
    let addr = e.addr_after("listening on ");
    (e, addr)
}

/// A router-only server in front of `engines` (ids e0, e1, …).
fn server(engines: &[(Child, String)], env: &[(&str, String)]) -> (Child, String, String) {
    let mut args = vec![
        "server".to_owned(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--admin-listen".into(),
        "127.0.0.1:0".into(),
    ];
    for (i, (_, addr)) in engines.iter().enumerate() {
        args.push("--endpoint".into());
        args.push(format!("e{i}=http://{addr}=chat;engine=vllm"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = Child::spawn_env(&args, env);
    let base = format!("http://{}", s.addr_after("client listening on "));
    let admin = format!("http://{}", s.addr_after("admin listening on "));
    (s, base, admin)
}

fn ask() -> Value {
    json!({"model": "chat", "stream": true, "max_tokens": 40,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "tell me about the fox"}]})
}

type Body =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = reqwest::Result<axum::body::Bytes>> + Send>>;

async fn stream(base: &str) -> Body {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&ask())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    Box::pin(r.bytes_stream())
}

fn events(raw: &[u8]) -> Vec<Value> {
    std::str::from_utf8(raw)
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

fn text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

/// Reads until the answer has `n` tokens' text (four bytes each).
async fn until_tokens(body: &mut Body, raw: &mut Vec<u8>, n: usize) {
    while text(&events(raw)).len() < n * 4 {
        raw.extend_from_slice(&body.next().await.expect("more of the answer").unwrap());
    }
}

async fn rest(mut body: Body, raw: &mut Vec<u8>) {
    while let Some(c) = body.next().await {
        raw.extend_from_slice(&c.expect("the stream ends cleanly"));
    }
}

/// The engine generating now (by its own metrics), of those not killed.
async fn serving(engines: &[(Child, String)], killed: &[usize]) -> usize {
    super::until("an engine generating", || async {
        for (i, (_, addr)) in engines.iter().enumerate() {
            if killed.contains(&i) {
                continue;
            }
            let page = reqwest::get(format!("http://{addr}/metrics"))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            if page.contains("vllm:num_requests_running{model_name=\"chat\"} 1") {
                return Some(i);
            }
        }
        None
    })
    .await
}

fn migrations(page: &str, outcome: &str) -> u64 {
    let series = format!("llmgw_migrations_total{{model=\"chat\",outcome=\"{outcome}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |v| v.parse().unwrap())
}

async fn page(admin: &str) -> String {
    reqwest::get(format!("{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_killed_mid_stream_leaves_the_client_the_whole_exact_answer() {
    let mut engines = vec![engine(), engine()];
    let (_server, base, admin) = server(&engines, &[]);
    // The answer without interruption, for comparison.
    let mut whole = Vec::new();
    rest(stream(&base).await, &mut whole).await;
    let want = events(&whole);
    assert_eq!(text(&want).len(), 160);

    let mut body = stream(&base).await;
    let mut raw = Vec::new();
    until_tokens(&mut body, &mut raw, 10).await;
    let victim = serving(&engines, &[]).await;
    engines[victim].0.process.kill().unwrap();
    rest(body, &mut raw).await;
    let got = events(&raw);
    assert!(
        std::str::from_utf8(&raw)
            .unwrap()
            .trim_end()
            .ends_with("data: [DONE]")
    );
    assert!(got.iter().all(|e| e.get("error").is_none()), "{got:?}");
    assert_eq!(text(&got), text(&want), "not a token lost or repeated");
    assert!(
        got.iter().all(|e| e["id"] == got[0]["id"]),
        "one answer: {got:?}"
    );
    let usage = |evs: &[Value]| {
        let u = evs
            .iter()
            .rev()
            .find_map(|e| e.get("usage"))
            .unwrap()
            .clone();
        (u["prompt_tokens"].clone(), u["completion_tokens"].clone())
    };
    assert_eq!(usage(&got), usage(&want), "one usage, the whole answer's");
    assert_eq!(migrations(&page(&admin).await, "resumed"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_migration_limit_the_client_gets_an_error_event_not_a_cut_body() {
    let mut engines = vec![engine(), engine(), engine()];
    let (_server, base, admin) = server(
        &engines,
        &[("LLMGW_ROUTER__MIGRATION_LIMIT", "1".to_owned())],
    );
    let mut body = stream(&base).await;
    let mut raw = Vec::new();
    until_tokens(&mut body, &mut raw, 5).await;
    let first = serving(&engines, &[]).await;
    engines[first].0.process.kill().unwrap();
    until_tokens(&mut body, &mut raw, 10).await;
    let second = serving(&engines, &[first]).await;
    engines[second].0.process.kill().unwrap();
    rest(body, &mut raw).await;
    let got = events(&raw);
    let raw = String::from_utf8(raw).unwrap();
    assert!(!raw.contains("[DONE]"), "{raw}");
    let last = got.last().unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("migration limit"),
        "{raw}"
    );
    let page = page(&admin).await;
    assert_eq!(
        (migrations(&page, "resumed"), migrations(&page, "exhausted")),
        (1, 1),
        "{page}"
    );
    assert!(
        page.contains("# HELP llmgw_migrations"),
        "documented on the page"
    );
}
