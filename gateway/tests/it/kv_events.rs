//! Routing by what engines say they hold: sim engines publishing vLLM's
//! KV-cache events over ZeroMQ, and a gateway subscribed to them.

use std::net::SocketAddr;
use std::time::Duration;

use llmgw_gateway::EndpointSpec;
use llmgw_gateway::kv_events::KvState;
use llmgw_sim::{KvEventsConfig, SimConfig};
use rmpv::Value;
use serde_json::json;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, XPubSocket, ZmqMessage};

use crate::support::{Running, gateway, sim};

struct Engine {
    http: SocketAddr,
    publish: SocketAddr,
    replay: SocketAddr,
}

async fn engine() -> Engine {
    let config = SimConfig {
        models: vec!["m".into()],
        ttft: Duration::from_millis(1),
        tokens_per_s: 10_000,
        kv_blocks: 16,
        block_bytes: 64,
        kv_events: Some(KvEventsConfig {
            publish: "127.0.0.1:0".parse().unwrap(),
            replay: Some("127.0.0.1:0".parse().unwrap()),
            buffer: 100,
        }),
        ..SimConfig::default()
    };
    let e = llmgw_sim::spawn(config).await.unwrap();
    Engine {
        http: e.http,
        publish: e.kv_events.unwrap(),
        replay: e.kv_replay.unwrap(),
    }
}

fn spec(id: &str, e: &Engine) -> EndpointSpec {
    format!(
        "{id}=http://{}=m;kv_events=tcp://{};kv_replay=tcp://{};tokenizer=sim",
        e.http, e.publish, e.replay
    )
    .parse()
    .unwrap()
}

fn ask(content: &str) -> serde_json::Value {
    json!({"model": "m", "max_tokens": 1,
        "messages": [{"role": "system", "content": content}, {"role": "user", "content": "and?"}]})
}

/// Prompt tokens the engine that answered had cached.
async fn cached(url: &str, content: &str) -> u64 {
    let r: serde_json::Value = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .json(&ask(content))
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

/// Waits until the gateway has applied the endpoint's batch `seq`.
async fn applied(gw: &Running, endpoint: &str, seq: u64) -> KvState {
    let mut st = gw.gateway.kv_events.state(endpoint).unwrap();
    *st.wait_for(|s| s.live && s.applied == Some(seq))
        .await
        .unwrap()
}

/// A series' value on a metrics page (0 when absent).
fn series(page: &str, name: &str) -> u64 {
    page.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

fn exact_hits(page: &str) -> u64 {
    series(page, "llmgw_prefix_decisions_total{decision=\"exact_hit\"}")
}

fn exact_colds(page: &str) -> u64 {
    series(
        page,
        "llmgw_prefix_decisions_total{decision=\"exact_cold\"}",
    )
}

#[tokio::test]
async fn requests_go_where_the_engines_events_say_their_prefix_is() {
    let (a, b) = (engine().await, engine().await);
    let gw = gateway(vec![spec("a", &a), spec("b", &b)]).await;
    let (ua, ub) = (format!("http://{}", a.http), format!("http://{}", b.http));
    for id in ["a", "b"] {
        let mut st = gw.gateway.kv_events.state(id).unwrap();
        st.wait_for(|s| s.live).await.unwrap();
    }
    // Nine full blocks of system prompt.
    let p = "the shared document, ".repeat(30);

    // First sight: the least loaded, a (ties go by id); the approximate
    // index now remembers a for this prefix.
    assert_eq!(cached(&gw.base, &p).await, 0);
    assert!(applied(&gw, "a", 0).await.blocks >= 9);
    // a's cache is emptied, and b gets the prompt behind the gateway's back.
    reqwest::Client::new()
        .post(format!("{ua}/reset_prefix_cache"))
        .send()
        .await
        .unwrap();
    assert_eq!(applied(&gw, "a", 1).await.blocks, 0);
    assert_eq!(cached(&ub, &p).await, 0);
    applied(&gw, "b", 0).await;

    // The guess says a; b's events say b holds it: b it is, cached.
    assert!(cached(&gw.base, &p).await >= 9 * 16);
    assert_eq!(exact_hits(&gw.admin_page().await), 1);

    // b evicts it (a long other prompt through a 16-block cache) and a
    // holds it again: the next request moves to a.
    cached(&ub, &"another, longer document ".repeat(60)).await;
    applied(&gw, "b", 1).await;
    cached(&ua, &p).await;
    applied(&gw, "a", 2).await;
    assert!(cached(&gw.base, &p).await >= 9 * 16);
    assert_eq!(exact_hits(&gw.admin_page().await), 2);
}

#[tokio::test]
async fn an_engine_with_live_events_that_announced_nothing_gets_the_shared_prefix_next() {
    let (a, b) = (engine().await, engine().await);
    let gw = gateway(vec![spec("a", &a), spec("b", &b)]).await;
    for id in ["a", "b"] {
        let mut st = gw.gateway.kv_events.state(id).unwrap();
        st.wait_for(|s| s.live).await.unwrap();
    }
    let p = "the shared system prompt, ".repeat(25);
    // Both silent: the least loaded, a (ties go by id).
    assert_eq!(cached(&gw.base, &p).await, 0);
    applied(&gw, "a", 0).await;
    // a holds the prompt, but b has announced nothing yet: were it
    // passed over, it would never get the prompt, so never announce it.
    assert_eq!(cached(&gw.base, &p).await, 0, "b's cold cache");
    assert!(applied(&gw, "b", 0).await.blocks >= 9);
    let page = gw.admin_page().await;
    assert_eq!((exact_colds(&page), exact_hits(&page)), (2, 0));
    // Both hold it now: the longest prefix, the least loaded among equals.
    assert!(cached(&gw.base, &p).await >= 9 * 16);
    assert_eq!(exact_hits(&gw.admin_page().await), 1);
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

/// A batch as newer vLLM writes it (msgspec maps), storing `tokens` as
/// blocks of 2 under hashes `first..`, chained to `parent`.
fn stored(first: u64, parent: Option<u64>, tokens: &[u32]) -> Vec<u8> {
    let n = tokens.len() as u64 / 2;
    let event = map(vec![
        ("type", "BlockStored".into()),
        (
            "block_hashes",
            Value::Array((first..first + n).map(Value::from).collect()),
        ),
        ("parent_block_hash", parent.map_or(Value::Nil, Value::from)),
        (
            "token_ids",
            Value::Array(tokens.iter().map(|t| Value::from(*t)).collect()),
        ),
        ("block_size", 2.into()),
        ("lora_id", Value::Nil),
        ("medium", Value::Nil),
        ("lora_name", Value::Nil),
    ]);
    let batch = map(vec![
        ("ts", Value::F64(0.0)),
        ("events", Value::Array(vec![event])),
        ("data_parallel_rank", 0.into()),
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).unwrap();
    out
}

async fn publish(xpub: &mut XPubSocket, seq: u64, payload: Vec<u8>) {
    let m = ZmqMessage::try_from(vec![
        bytes::Bytes::new(),
        bytes::Bytes::copy_from_slice(&seq.to_be_bytes()),
        bytes::Bytes::from(payload),
    ])
    .unwrap();
    xpub.send(m).await.unwrap();
}

#[tokio::test]
async fn a_gap_in_the_sequence_drops_what_the_endpoint_was_known_to_hold() {
    // The test plays an engine without a replay socket; its XPUB socket
    // sees the gateway's subscription arrive.
    let mut xpub = XPubSocket::new();
    let at = xpub.bind("tcp://127.0.0.1:0").await.unwrap();
    let engine = sim(crate::support::sim_config()).await;
    let e: EndpointSpec = format!("e=http://{engine}=m;kv_events={at};tokenizer=sim")
        .parse()
        .unwrap();
    let gw = gateway(vec![e]).await;
    let subscription = xpub.recv().await.unwrap();
    assert_eq!(
        subscription.get(0).unwrap()[..],
        [1],
        "subscribed to every topic"
    );
    let mut st = gw.gateway.kv_events.state("e").unwrap();
    st.wait_for(|s| s.live).await.unwrap();

    publish(&mut xpub, 0, stored(100, None, &[1, 2, 3, 4])).await;
    publish(&mut xpub, 1, stored(102, Some(101), &[5, 6])).await;
    let s = *st.wait_for(|s| s.applied == Some(1)).await.unwrap();
    assert_eq!((s.blocks, s.resets), (3, 0));

    // Batch 2 is lost: what batch 2 may have removed is unknown, so
    // everything known is dropped; batch 3's block, chained to a block
    // no longer known, cannot be keyed either.
    publish(&mut xpub, 3, stored(103, Some(102), &[7, 8])).await;
    let s = *st.wait_for(|s| s.applied == Some(3)).await.unwrap();
    assert_eq!((s.blocks, s.resets, s.live, s.unchained), (0, 1, true, 1));
    assert_eq!(
        series(
            &gw.admin_page().await,
            "llmgw_kv_events_unchained_blocks_total{endpoint=\"e\"}"
        ),
        1,
        "the broken chain is counted"
    );
    // Blocks stored afresh are known again.
    publish(&mut xpub, 4, stored(200, None, &[9, 9])).await;
    let s = *st.wait_for(|s| s.applied == Some(4)).await.unwrap();
    assert_eq!((s.blocks, s.resets), (1, 1));
}

/// Answers a replay request (`[identity, "", from]`) with `batches` from
/// `from` on, then the end mark; returns `from`.
async fn answer_replay(router: &mut RouterSocket, batches: &[(u64, Vec<u8>)]) -> u64 {
    let req = router.recv().await.unwrap().into_vec();
    let from = u64::from_be_bytes(<[u8; 8]>::try_from(&req[2][..]).unwrap());
    let end = (u64::MAX, Vec::new());
    for (seq, payload) in batches.iter().filter(|(s, _)| *s >= from).chain([&end]) {
        let m = ZmqMessage::try_from(vec![
            req[0].clone(),
            bytes::Bytes::new(),
            bytes::Bytes::copy_from_slice(&seq.to_be_bytes()),
            bytes::Bytes::from(payload.clone()),
        ])
        .unwrap();
        router.send(m).await.unwrap();
    }
    from
}

#[tokio::test]
async fn a_subscriber_that_missed_the_first_batch_replays_from_it() {
    // The test plays an engine with a replay socket, whose batch 0 went
    // out before the gateway's subscription reached it.
    let mut xpub = XPubSocket::new();
    let at = xpub.bind("tcp://127.0.0.1:0").await.unwrap();
    let mut router = RouterSocket::new();
    let replay = router.bind("tcp://127.0.0.1:0").await.unwrap();
    let engine = sim(crate::support::sim_config()).await;
    let e: EndpointSpec =
        format!("e=http://{engine}=m;kv_events={at};kv_replay={replay};tokenizer=sim")
            .parse()
            .unwrap();
    let gw = gateway(vec![e]).await;
    xpub.recv().await.unwrap();
    // The catch-up at the start: nothing buffered yet.
    assert_eq!(answer_replay(&mut router, &[]).await, 0);
    let mut st = gw.gateway.kv_events.state("e").unwrap();
    st.wait_for(|s| s.live).await.unwrap();

    let batches = [
        (0, stored(100, None, &[1, 2, 3, 4])),
        (1, stored(102, Some(101), &[5, 6])),
    ];
    publish(&mut xpub, 1, batches[1].1.clone()).await;
    // Batch 1 first: the gateway asks for what came before, from 0.
    assert_eq!(answer_replay(&mut router, &batches).await, 0);
    let s = *st.wait_for(|s| s.applied == Some(1)).await.unwrap();
    assert_eq!((s.blocks, s.unchained, s.resets), (3, 0, 0), "one chain");
    publish(&mut xpub, 2, stored(103, Some(102), &[7, 8])).await;
    let s = *st.wait_for(|s| s.applied == Some(2)).await.unwrap();
    assert_eq!((s.blocks, s.unchained), (4, 0));
}

#[tokio::test]
async fn a_prompt_no_events_announce_yet_goes_where_it_was_sent() {
    // Two engines whose events the test plays; each announces a block of
    // its own first, so that neither is fresh, and nothing after.
    let slow = SimConfig {
        tokens_per_s: 2,
        ..crate::support::sim_config()
    };
    let mut specs: Vec<EndpointSpec> = Vec::new();
    let mut publishers = Vec::new();
    for id in ["a", "b"] {
        let engine = sim(slow.clone()).await;
        let mut xpub = XPubSocket::new();
        let at = xpub.bind("tcp://127.0.0.1:0").await.unwrap();
        specs.push(
            format!("{id}=http://{engine}=m;kv_events={at};tokenizer=sim")
                .parse()
                .unwrap(),
        );
        publishers.push((id, xpub));
    }
    let gw = gateway(specs).await;
    for (id, xpub) in &mut publishers {
        xpub.recv().await.unwrap();
        let mut st = gw.gateway.kv_events.state(id).unwrap();
        st.wait_for(|s| s.live).await.unwrap();
        publish(xpub, 0, stored(900, None, &[9, 9])).await;
        st.wait_for(|s| s.applied == Some(0)).await.unwrap();
    }
    let p = "the shared document, ".repeat(30);
    let client = reqwest::Client::new();
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut body = ask(&p);
        body["stream"] = json!(true);
        body["max_tokens"] = json!(50);
        // Headers back: the gateway has chosen; the answer stays open.
        open.push(
            client
                .post(format!("{}/v1/chat/completions", gw.base))
                .json(&body)
                .send()
                .await
                .unwrap(),
        );
    }
    // The first went to a (the least loaded, ties by id). Its engine has
    // announced nothing of it, but the second, with the same prompt, goes
    // there too rather than to the idle b, which would prefill it all
    // again: where events say nothing, where it was sent decides.
    let page = gw.admin_page().await;
    assert_eq!(
        series(&page, "llmgw_endpoint_in_flight{endpoint=\"a\"}"),
        2,
        "{page}"
    );
    assert_eq!(series(&page, "llmgw_endpoint_in_flight{endpoint=\"b\"}"), 0);
    assert_eq!(
        series(
            &page,
            "llmgw_prefix_decisions_total{decision=\"prefix_hit\"}"
        ),
        1
    );
    assert_eq!(exact_hits(&page), 0);
    drop(open);
}
