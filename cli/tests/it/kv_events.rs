//! KV-cache-event routing through the shipped binary: sim engine
//! processes publishing vLLM's events, a router-only server subscribed to
//! them.

use std::process::Command;

use serde_json::json;

use super::{Child, until};

fn engine() -> (Child, String, String, String) {
    let e = Child::spawn(&[
        "sim-engine",
        "--listen",
        "127.0.0.1:0",
        "--model",
        "m",
        "--kv-blocks",
        "16",
        "--kv-events",
        "tcp://127.0.0.1:0",
        "--kv-events-replay",
        "tcp://127.0.0.1:0",
    ]);
    let publish = e.addr_after("kv events on ");
    let replay = e.addr_after("kv events replay on ");
    let http = e.addr_after("listening on ");
    (e, http, publish, replay)
}

async fn metric(page_url: &str, series: &str) -> Option<f64> {
    let page = reqwest::get(page_url).await.ok()?.text().await.ok()?;
    page.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

async fn cached(base: &str, content: &str) -> u64 {
    let r: serde_json::Value = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "m", "max_tokens": 1,
            "messages": [{"role": "system", "content": content}, {"role": "user", "content": "so?"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    r["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn the_router_sends_a_prompt_to_the_engine_whose_events_say_it_holds_it() {
    let engines = [engine(), engine()];
    let mut args = vec![
        "server".to_owned(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--admin-listen".into(),
        "127.0.0.1:0".into(),
    ];
    for (i, (_, http, publish, replay)) in engines.iter().enumerate() {
        args.push("--endpoint".into());
        args.push(format!(
            "e{i}=http://{http}=m;kv_events={publish};kv_replay={replay};tokenizer=sim"
        ));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Child::spawn(&args);
    let base = format!("http://{}", server.addr_after("client listening on "));
    let metrics = format!(
        "http://{}/metrics",
        server.addr_after("admin listening on ")
    );
    for i in 0..2 {
        let live = format!("llmgw_kv_events_live{{endpoint=\"e{i}\"}} 1");
        until("the subscriptions", || async {
            (metric(&metrics, &live).await == Some(1.0)).then_some(())
        })
        .await;
    }
    // e0 announces something else first: an engine that has announced
    // nothing yet would be sent the next request for that alone.
    cached(
        &format!("http://{}", engines[0].1),
        &"e0's own document, ".repeat(10),
    )
    .await;
    until("e0's first batch", || async {
        (metric(&metrics, "llmgw_kv_events_last_seq{endpoint=\"e0\"}").await == Some(0.0))
            .then_some(())
    })
    .await;
    // e1 gets the prompt behind the router's back; e0, the least loaded by
    // id, is what a router without its events would pick.
    let doc = "a long shared document, ".repeat(25);
    assert_eq!(cached(&format!("http://{}", engines[1].1), &doc).await, 0);
    until("e1's first batch", || async {
        (metric(&metrics, "llmgw_kv_events_last_seq{endpoint=\"e1\"}").await == Some(0.0))
            .then_some(())
    })
    .await;
    assert!(
        cached(&base, &doc).await >= 8 * 16,
        "served by e1, from its cache"
    );
    assert_eq!(
        metric(
            &metrics,
            "llmgw_prefix_decisions_total{decision=\"exact_hit\"}"
        )
        .await,
        Some(1.0)
    );

    // The engine goes away: what it was known to hold is dropped.
    drop(engines);
    until("the lost subscription", || async {
        (metric(&metrics, "llmgw_kv_events_live{endpoint=\"e1\"}").await == Some(0.0)).then_some(())
    })
    .await;
    assert_eq!(
        metric(&metrics, "llmgw_kv_events_blocks{endpoint=\"e1\"}").await,
        Some(0.0)
    );
}

#[test]
fn kv_events_without_a_tokenizer_the_gateway_has_are_refused_at_start() {
    for (endpoint, says) in [
        (
            "e=http://127.0.0.1:1=m;kv_events=tcp://127.0.0.1:5557",
            "kv_events needs tokenizer=",
        ),
        (
            "e=http://127.0.0.1:1=m;kv_events=tcp://127.0.0.1:5557;tokenizer=llama3",
            "tokenizer \"llama3\" is not supported",
        ),
        (
            "e=http://127.0.0.1:1=m;kv_events=127.0.0.1:5557;tokenizer=sim",
            "is not tcp://HOST:PORT",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["server", "--listen", "127.0.0.1:0", "--endpoint", endpoint])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{endpoint}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{endpoint}: {err}");
    }
}
