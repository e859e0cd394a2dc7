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
    let addrs: Vec<&str> = engines.iter().map(|(_, a)| a.as_str()).collect();
    server_for(&addrs, "chat", "vllm", env)
}

fn server_for(
    addrs: &[&str],
    model: &str,
    engine: &str,
    env: &[(&str, String)],
) -> (Child, String, String) {
    let mut args = vec![
        "server".to_owned(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--admin-listen".into(),
        "127.0.0.1:0".into(),
    ];
    for (i, addr) in addrs.iter().enumerate() {
        args.push("--endpoint".into());
        args.push(format!("e{i}=http://{addr}={model};engine={engine}"));
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
    migrations_of(page, "chat", outcome)
}

fn migrations_of(page: &str, model: &str, outcome: &str) -> u64 {
    let series = format!("llmgw_migrations_total{{model=\"{model}\",outcome=\"{outcome}\"}} ");
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

/// A real llama-server, killed when dropped.
struct Llama(std::process::Child, String);

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn llama(bin: &std::path::Path, model: &std::path::Path) -> Llama {
    let port = super::cluster::free_port();
    let child = std::process::Command::new(bin)
        .args([
            "-m",
            model.to_str().unwrap(),
            "--alias",
            "tiny",
            "--host",
            "127.0.0.1",
        ])
        .args([
            "--port",
            &port.to_string(),
            "--ctx-size",
            "512",
            "--metrics",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    super::until("llama-server is up", || async {
        let r = reqwest::get(format!("http://{addr}/health")).await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    Llama(child, addr)
}

/// llama.cpp's own form through the binary, against the real engine: its
/// server continues a last assistant message (and repeats it first, which
/// the gateway takes out). Greedy decoding of the tiny model makes the
/// uninterrupted answer known; the answer is cut within its first tokens,
/// where the text sent re-tokenizes as it was generated (checked for this
/// model and prompt, on another server, at every cut point up to 39).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_llama_server_killed_mid_stream_is_continued_by_another_exactly() {
    let (bin, model) = super::cluster::real_engine();
    let mut engines = vec![llama(&bin, &model).await, llama(&bin, &model).await];
    let addrs: Vec<&str> = engines.iter().map(|l| l.1.as_str()).collect();
    let (_server, base, admin) = server_for(&addrs, "tiny", "llamacpp", &[]);
    let ask = json!({"model": "tiny", "stream": true, "max_tokens": 200, "temperature": 0,
        "messages": [{"role": "user", "content": "hello"}]});
    let post = |url: String| {
        let ask = ask.clone();
        async move {
            let r = reqwest::Client::new()
                .post(url)
                .json(&ask)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            Box::pin(r.bytes_stream()) as Body
        }
    };
    let mut whole = Vec::new();
    rest(
        post(format!("http://{}/v1/chat/completions", engines[1].1)).await,
        &mut whole,
    )
    .await;
    let want = text(&events(&whole));

    let mut body = post(format!("{base}/v1/chat/completions")).await;
    let mut raw = Vec::new();
    while text(&events(&raw)).is_empty() {
        raw.extend_from_slice(&body.next().await.expect("more of the answer").unwrap());
    }
    // The tiny model outruns any poll: both engines are frozen at once,
    // then the one the gateway is streaming from is killed.
    let signal = |sig: &str, l: &Llama| {
        std::process::Command::new("kill")
            .args([sig, &l.0.id().to_string()])
            .status()
            .unwrap();
    };
    for l in &engines {
        signal("-STOP", l);
    }
    let page_now = page(&admin).await;
    let victim = (0..2)
        .find(|i| page_now.contains(&format!("llmgw_endpoint_in_flight{{endpoint=\"e{i}\"}} 1")))
        .expect("an endpoint in flight");
    engines[victim].0.kill().unwrap();
    signal("-CONT", &engines[1 - victim]);
    rest(body, &mut raw).await;
    let got = events(&raw);
    assert!(got.iter().all(|e| e.get("error").is_none()), "{got:?}");
    assert_eq!(text(&got), want, "not a token lost or repeated");
    assert!(got.iter().all(|e| e["id"] == got[0]["id"]), "{got:?}");
    assert_eq!(migrations_of(&page(&admin).await, "tiny", "resumed"), 1);
    drop(engines);
}
