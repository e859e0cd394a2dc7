//! Request migration: a stream whose engine dies mid-answer goes on on
//! another replica, and the client sees one answer, exactly the one it
//! would have had. The sim engines are deterministic (the same context
//! gives the same tokens), so the uninterrupted answer is known.

use std::net::SocketAddr;

use futures_util::StreamExt;
use llmgw_gateway::{EndpointSpec, GatewayConfig};
use llmgw_sim::{SimConfig, Vocabulary};
use serde_json::{Value, json};

use super::support::{self, Relay, Running, gateway_with, metric, sim, spec};

/// A streamed answer as the client received it.
#[derive(Debug)]
struct Answer {
    events: Vec<Value>,
    text: String,
    done: bool,
}

impl Answer {
    fn parse(raw: &[u8]) -> Answer {
        let raw = std::str::from_utf8(raw).unwrap();
        let mut events = Vec::new();
        let mut done = false;
        for e in raw.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
            if e == "[DONE]" {
                done = true;
            } else {
                events.push(serde_json::from_str::<Value>(e).unwrap());
            }
        }
        let text = events
            .iter()
            .filter_map(|e| {
                let c = &e["choices"][0];
                c["delta"]["content"].as_str().or(c["text"].as_str())
            })
            .collect();
        Answer { events, text, done }
    }

    fn errors(&self) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e.get("error").is_some())
            .collect()
    }

    fn usage(&self) -> Option<&Value> {
        self.events.iter().rev().find_map(|e| e.get("usage"))
    }

    fn roles(&self) -> usize {
        self.events
            .iter()
            .filter(|e| e["choices"][0]["delta"].get("role").is_some())
            .count()
    }

    /// Every event the client got names the same answer.
    fn one_identity(&self) -> bool {
        let first = &self.events[0];
        self.events
            .iter()
            .filter(|e| e.get("error").is_none())
            .all(|e| {
                e["id"] == first["id"]
                    && e["created"] == first["created"]
                    && e["model"] == first["model"]
            })
    }
}

type Body =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<axum::body::Bytes>> + Send>>;

async fn start(base: &str, path: &str, body: &Value) -> Body {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    Box::pin(r.bytes_stream())
}

/// Reads until `n` events with text have arrived in all.
async fn until_text(body: &mut Body, raw: &mut Vec<u8>, n: usize) {
    while Answer::parse(raw)
        .events
        .iter()
        .filter(|e| {
            let c = &e["choices"][0];
            c["delta"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .is_some_and(|t| !t.is_empty())
        })
        .count()
        < n
    {
        raw.extend_from_slice(&body.next().await.expect("more of the answer").unwrap());
    }
}

async fn rest(mut body: Body, raw: &mut Vec<u8>) {
    while let Some(c) = body.next().await {
        raw.extend_from_slice(&c.expect("the stream ends cleanly"));
    }
}

fn slow(vocabulary: Vocabulary) -> SimConfig {
    SimConfig {
        tokens_per_s: 40,
        vocabulary,
        ..support::sim_config()
    }
}

fn endpoint(id: &str, addr: &SocketAddr, engine: &str) -> EndpointSpec {
    format!("{id}=http://{addr}=m;engine={engine}")
        .parse()
        .unwrap()
}

async fn gateway(endpoints: Vec<EndpointSpec>, migration_limit: u32) -> Running {
    gateway_with(GatewayConfig {
        endpoints,
        migration_limit,
        ..GatewayConfig::default()
    })
    .await
}

fn chat(max_tokens: u32) -> Value {
    json!({"model": "m", "stream": true, "max_tokens": max_tokens,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}]})
}

/// The answer an engine gives without interruption.
async fn uninterrupted(engine: &SocketAddr, path: &str, body: &Value) -> Answer {
    let mut raw = Vec::new();
    rest(
        start(&format!("http://{engine}"), path, body).await,
        &mut raw,
    )
    .await;
    Answer::parse(&raw)
}

/// Kills `a` after `after` tokens of the answer and returns the rest as
/// the client saw it.
async fn killed_after(gw: &Running, a: &Relay, path: &str, body: &Value, after: usize) -> Answer {
    let mut body = start(&gw.base, path, body).await;
    let mut raw = Vec::new();
    until_text(&mut body, &mut raw, after).await;
    a.kill();
    rest(body, &mut raw).await;
    Answer::parse(&raw)
}

fn count(page: &str, outcome: &str) -> f64 {
    page.lines()
        .find(|l| {
            l.starts_with(&format!(
                "llmgw_migrations_total{{model=\"m\",outcome=\"{outcome}\"}}"
            ))
        })
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn a_chat_whose_engine_dies_goes_on_elsewhere_as_the_same_exact_answer() {
    let (a, b) = (
        sim(slow(Vocabulary::Vllm)).await,
        sim(slow(Vocabulary::Vllm)).await,
    );
    let relay = Relay::start(a).await;
    // "a" sorts first, so the answer starts there.
    let (queue, mut records) = llmgw_gateway::usage::UsageQueue::new(16);
    let gw = support::gateway_recording(
        GatewayConfig {
            endpoints: vec![
                endpoint("a", &relay.addr, "vllm"),
                endpoint("b", &b, "vllm"),
            ],
            ..GatewayConfig::default()
        },
        Some(queue),
    )
    .await;
    let want = uninterrupted(&b, "/v1/chat/completions", &chat(30)).await;
    assert_eq!(want.text.len(), 120, "{want:?}");
    let got = killed_after(&gw, &relay, "/v1/chat/completions", &chat(30), 7).await;
    assert!(got.errors().is_empty(), "{got:?}");
    assert_eq!(got.text, want.text, "not a token lost or repeated");
    assert!(
        got.done && got.one_identity() && got.roles() == 1,
        "{got:?}"
    );
    let (first, second) = (got.events[0]["id"].as_str(), want.events[0]["id"].as_str());
    assert!(
        first.is_some_and(|id| id.ends_with("-1")) && first != second,
        "the first engine's id, its first answer: {first:?} (the second's {second:?})"
    );
    let usage = got.usage().unwrap();
    let expected = want.usage().unwrap();
    assert_eq!(
        (
            &usage["prompt_tokens"],
            &usage["completion_tokens"],
            &usage["total_tokens"]
        ),
        (
            &expected["prompt_tokens"],
            &expected["completion_tokens"],
            &expected["total_tokens"]
        ),
        "one usage, for the whole answer"
    );
    let page = gw.admin_page().await;
    assert_eq!(count(&page, "resumed"), 1.0, "{page}");
    assert!(
        page.contains("llmgw_tokens_total{direction=\"completion\"} 30"),
        "counted once: {page}"
    );
    // One usage record for the request: the original prompt, every token.
    let record = records.recv().await.expect("a usage record");
    assert_eq!(
        (record.prompt_tokens, record.completion_tokens),
        (
            expected["prompt_tokens"].as_u64().unwrap(),
            expected["completion_tokens"].as_u64().unwrap()
        ),
        "{record:?}"
    );
    assert!(records.try_recv().is_none(), "only one record");
}

#[tokio::test]
async fn llama_cpp_chats_and_completions_are_continued_in_their_own_form() {
    let (a, b) = (
        sim(slow(Vocabulary::Llamacpp)).await,
        sim(slow(Vocabulary::Llamacpp)).await,
    );
    let relay = Relay::start(a).await;
    let gw = gateway(
        vec![
            endpoint("a", &relay.addr, "llamacpp"),
            endpoint("b", &b, "llamacpp"),
        ],
        3,
    )
    .await;
    let want = uninterrupted(&b, "/v1/chat/completions", &chat(20)).await;
    let got = killed_after(&gw, &relay, "/v1/chat/completions", &chat(20), 5).await;
    assert_eq!(got.text, want.text);
    assert!(got.done && got.one_identity(), "{got:?}");

    let (c, d) = (
        sim(slow(Vocabulary::Vllm)).await,
        sim(slow(Vocabulary::Vllm)).await,
    );
    let relay = Relay::start(c).await;
    let gw = gateway(
        vec![
            endpoint("c", &relay.addr, "vllm"),
            endpoint("d", &d, "vllm"),
        ],
        3,
    )
    .await;
    // No usage asked for: the gateway's own usage event stays out.
    let text =
        json!({"model": "m", "stream": true, "max_tokens": 20, "prompt": "Once upon a time"});
    let want = uninterrupted(&d, "/v1/completions", &text).await;
    let got = killed_after(&gw, &relay, "/v1/completions", &text, 6).await;
    assert_eq!(got.text, want.text);
    assert!(
        got.done && got.one_identity() && got.usage().is_none(),
        "{got:?}"
    );
}

/// The engine (behind its relay) that is generating now.
async fn serving(engines: &[(SocketAddr, &Relay)], killed: &[SocketAddr]) -> usize {
    loop {
        for (i, (addr, _)) in engines.iter().enumerate() {
            if !killed.contains(addr) && metric(addr, "vllm:num_requests_running").await > 0.0 {
                return i;
            }
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn the_migration_limit_is_honoured_and_a_stream_nobody_can_finish_ends_with_an_error_event() {
    let engines = [
        sim(slow(Vocabulary::Vllm)).await,
        sim(slow(Vocabulary::Vllm)).await,
        sim(slow(Vocabulary::Vllm)).await,
    ];
    let relays = [
        Relay::start(engines[0]).await,
        Relay::start(engines[1]).await,
        Relay::start(engines[2]).await,
    ];
    let pairs: Vec<(SocketAddr, &Relay)> = engines.iter().copied().zip(relays.iter()).collect();
    let specs = |n: usize| -> Vec<EndpointSpec> {
        (0..n)
            .map(|i| spec(&format!("e{i}"), &relays[i].addr, &["m"]))
            .collect()
    };
    // Limit 1, three replicas: the second death ends the answer, though a
    // third replica is up.
    let gw = gateway(specs(3), 1).await;
    let mut body = start(&gw.base, "/v1/chat/completions", &chat(60)).await;
    let mut raw = Vec::new();
    until_text(&mut body, &mut raw, 5).await;
    let first = serving(&pairs, &[]).await;
    relays[first].kill();
    until_text(&mut body, &mut raw, 10).await;
    let second = serving(&pairs, &[engines[first]]).await;
    relays[second].kill();
    rest(body, &mut raw).await;
    let got = Answer::parse(&raw);
    assert!(!got.done, "not an answer that looks complete: {got:?}");
    let errors = got.errors();
    assert_eq!(errors.len(), 1, "{got:?}");
    assert!(
        errors[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("migration limit"),
        "{errors:?}"
    );
    let third = (0..3).find(|i| *i != first && *i != second).unwrap();
    assert_eq!(
        metric(&engines[third], "vllm:prefix_cache_queries_total").await,
        0.0,
        "the third replica was never asked"
    );
    let page = gw.admin_page().await;
    assert_eq!(
        (count(&page, "resumed"), count(&page, "exhausted")),
        (1.0, 1.0),
        "{page}"
    );

    // Every replica dead: the limit is not reached, but nobody is left.
    let (a, b) = (
        sim(slow(Vocabulary::Vllm)).await,
        sim(slow(Vocabulary::Vllm)).await,
    );
    let (ra, rb) = (Relay::start(a).await, Relay::start(b).await);
    let gw = gateway(
        vec![spec("a", &ra.addr, &["m"]), spec("b", &rb.addr, &["m"])],
        3,
    )
    .await;
    let mut body = start(&gw.base, "/v1/chat/completions", &chat(60)).await;
    let mut raw = Vec::new();
    until_text(&mut body, &mut raw, 3).await;
    ra.kill();
    until_text(&mut body, &mut raw, 6).await;
    rb.kill();
    rest(body, &mut raw).await;
    let got = Answer::parse(&raw);
    assert!(!got.done);
    assert!(
        got.errors()[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no other replica"),
        "{got:?}"
    );

    // Limit 0: no continuation at all, and still a clean error event.
    let (a, b) = (
        sim(slow(Vocabulary::Vllm)).await,
        sim(slow(Vocabulary::Vllm)).await,
    );
    let ra = Relay::start(a).await;
    let (queue, mut records) = llmgw_gateway::usage::UsageQueue::new(16);
    let gw = support::gateway_recording(
        GatewayConfig {
            endpoints: vec![spec("a", &ra.addr, &["m"]), spec("b", &b, &["m"])],
            migration_limit: 0,
            ..GatewayConfig::default()
        },
        Some(queue),
    )
    .await;
    let got = killed_after(&gw, &ra, "/v1/chat/completions", &chat(60), 3).await;
    assert!(!got.done && got.errors().len() == 1, "{got:?}");
    assert_eq!(metric(&b, "vllm:prefix_cache_queries_total").await, 0.0);
    // Its usage says it failed (not the 200 its head said), and charges
    // what was sent.
    let record = records.recv().await.expect("a usage record");
    assert_eq!(record.status, 502, "{record:?}");
    assert!(
        record.completion_tokens >= 3 && record.completion_tokens < 60,
        "{record:?}"
    );
}

#[tokio::test]
async fn a_plain_answer_that_breaks_off_mid_body_is_sent_again_elsewhere() {
    let broken = support::breaking_engine().await;
    let live = sim(support::sim_config()).await;
    // "a-broken" sorts first, so it is tried first.
    let gw = gateway(
        vec![spec("a-broken", &broken, &["m"]), spec("b", &live, &["m"])],
        3,
    )
    .await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.base))
        .json(&json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .len(),
        16,
        "{v}"
    );
    let page = gw.admin_page().await;
    assert_eq!(count(&page, "retried"), 1.0, "{page}");
}

/// A hung engine (a stuck GPU, a route lost without a reset) keeps its
/// connection and sends nothing more: after `router.stream_idle_timeout`
/// the answer goes on elsewhere, as when the engine dies.
#[tokio::test]
async fn a_stream_whose_engine_goes_silent_goes_on_elsewhere() {
    let (a, b) = (
        sim(slow(Vocabulary::Vllm)).await,
        sim(slow(Vocabulary::Vllm)).await,
    );
    let relay = Relay::start(a).await;
    let gw = gateway_with(GatewayConfig {
        endpoints: vec![
            endpoint("a", &relay.addr, "vllm"),
            endpoint("b", &b, "vllm"),
        ],
        // A token comes every 25 ms: a second of silence is no engine's
        // pace.
        stream_idle_timeout: std::time::Duration::from_secs(1),
        ..GatewayConfig::default()
    })
    .await;
    let want = uninterrupted(&b, "/v1/chat/completions", &chat(30)).await;
    let mut body = start(&gw.base, "/v1/chat/completions", &chat(30)).await;
    let mut raw = Vec::new();
    until_text(&mut body, &mut raw, 7).await;
    relay.freeze();
    rest(body, &mut raw).await;
    let got = Answer::parse(&raw);
    assert!(got.errors().is_empty(), "{got:?}");
    assert_eq!(got.text, want.text, "not a token lost or repeated");
    assert!(got.done && got.one_identity(), "{got:?}");
    let page = gw.admin_page().await;
    assert_eq!(count(&page, "resumed"), 1.0, "{page}");
}

/// An engine that takes requests and never answers them: a stream, whose
/// head a working engine sends at once, is sent elsewhere after
/// `router.response_timeout` and counted by the engine's breaker; a plain
/// answer, which comes whole at its end, may only be slow: 504, neither
/// sent again nor counted.
#[tokio::test]
async fn an_engine_that_never_answers_is_timed_out_and_routed_around() {
    let hung = support::hung_engine().await;
    let live = sim(support::sim_config()).await;
    let config = |endpoints| GatewayConfig {
        endpoints,
        response_timeout: std::time::Duration::from_millis(500),
        ..GatewayConfig::default()
    };
    // "a-hung" sorts first, so it is tried first; light traffic then takes
    // turns, so it is tried every other request until its breaker opens
    // (three failures).
    let gw = gateway_with(config(vec![
        spec("a-hung", &hung, &["m"]),
        spec("b", &live, &["m"]),
    ]))
    .await;
    let client = reqwest::Client::new();
    let ask = |stream: bool| {
        client
            .post(format!("{}/v1/chat/completions", gw.base))
            .json(&json!({"model": "m", "stream": stream, "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    let plain = ask(false).await.unwrap();
    assert_eq!(plain.status(), 504, "a plain answer is not sent again");
    let body: Value = plain.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_timeout", "{body}");
    assert_eq!(
        metric(&live, "vllm:prefix_cache_queries_total").await,
        0.0,
        "b was not asked"
    );
    for _ in 0..4 {
        let r = ask(true).await.unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        assert!(text.contains("[DONE]"), "answered by b: {text}");
    }
    let page = gw.admin_page().await;
    assert!(
        page.contains("llmgw_endpoint_breaker_open{endpoint=\"a-hung\"} 1"),
        "three streams' timeouts (of the four sent, the first went to b) open its breaker: {page}"
    );
    // Now the plain request goes straight to b.
    assert_eq!(ask(false).await.unwrap().status(), 200);

    let alone = gateway_with(config(vec![spec("a-hung", &hung, &["m"])])).await;
    let r = client
        .post(format!("{}/v1/chat/completions", alone.base))
        .json(&json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_timeout", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("router.response_timeout") && !message.contains("a-hung"),
        "{body}"
    );
}
