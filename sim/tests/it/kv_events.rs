//! The prefix cache's changes as vLLM's KV-cache events, read by a real
//! ZeroMQ subscriber over TCP and decoded from msgpack as vLLM's
//! consumers decode them.

use std::net::SocketAddr;

use llmgw_sim::{KvEventsConfig, SimConfig};
use rmpv::Value;
use serde_json::json;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

struct Engine {
    http: SocketAddr,
    publish: SocketAddr,
    replay: SocketAddr,
}

async fn engine() -> Engine {
    let config = SimConfig {
        models: vec!["m".into()],
        ttft: std::time::Duration::from_millis(1),
        prefill_tokens_per_s: u32::MAX,
        tokens_per_s: 10_000,
        kv_blocks: 4,
        block_bytes: 16,
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

async fn ask(e: &Engine, content: &str) {
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", e.http))
        .json(&json!({"model": "m", "max_tokens": 1,
            "messages": [{"role": "user", "content": content}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Batches `[seq, payload]` from `from` on, by the replay socket.
async fn replay(e: &Engine, from: u64) -> Vec<(i64, Vec<u8>)> {
    let mut d = DealerSocket::new();
    d.connect(&format!("tcp://{}", e.replay)).await.unwrap();
    let ask = ZmqMessage::try_from(vec![
        bytes::Bytes::new(),
        bytes::Bytes::copy_from_slice(&from.to_be_bytes()),
    ])
    .unwrap();
    d.send(ask).await.unwrap();
    let mut out = Vec::new();
    loop {
        let m = d.recv().await.unwrap().into_vec();
        let seq = i64::from_be_bytes(m[1][..].try_into().unwrap());
        if seq == -1 {
            return out;
        }
        out.push((seq, m[2].to_vec()));
    }
}

/// The events of a batch `[ts, events, dp_rank]`, each `[tag, field…]`.
fn events(payload: &[u8]) -> Vec<Vec<Value>> {
    let v = rmpv::decode::read_value(&mut &payload[..]).unwrap();
    let batch = v.as_array().unwrap();
    assert!(batch[0].is_f64() && batch[2].as_u64() == Some(0), "{v}");
    batch[1]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_array().unwrap().clone())
        .collect()
}

async fn next(sub: &mut SubSocket) -> (u64, Vec<Vec<Value>>) {
    let m = sub.recv().await.unwrap().into_vec();
    assert_eq!(m.len(), 3, "[topic, seq, payload]");
    let seq = u64::from_be_bytes(m[1][..].try_into().unwrap());
    (seq, events(&m[2]))
}

fn hashes(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn the_cache_publishes_vllm_kv_events_a_subscriber_decodes() {
    let e = engine().await;
    let mut sub = SubSocket::new();
    sub.subscribe("").await.unwrap();
    sub.connect(&format!("tcp://{}", e.publish)).await.unwrap();
    // The engine answers a replay only after the subscription sent before
    // it is registered: from here on, nothing published is missed.
    assert!(replay(&e, 0).await.is_empty(), "nothing published yet");

    // "user: " + 26 bytes + "\nassistant: ": two full 16-byte blocks
    // (8 tokens of 4 bytes, 4 a block) and a partial one, not announced.
    let content = "abcdefghijklmnopqrstuvwxyz";
    ask(&e, content).await;
    let rendered = format!("user: {content}\nassistant: ");
    let (seq, ev) = next(&mut sub).await;
    assert_eq!((seq, ev.len()), (0, 1));
    let stored = &ev[0];
    assert_eq!(stored[0].as_str(), Some("BlockStored"));
    let first = hashes(&stored[1]);
    assert_eq!(first.len(), 2);
    assert!(stored[2].is_nil(), "no parent: the prompt's first block");
    let tokens: Vec<u64> = stored[3]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let want: Vec<u64> = rendered.as_bytes()[..32]
        .chunks(4)
        .map(|c| u64::from(u32::from_le_bytes(c.try_into().unwrap())))
        .collect();
    assert_eq!(tokens, want, "the tokens a router recomputes the keys from");
    assert_eq!(stored[4].as_u64(), Some(4), "block size in tokens");
    assert_eq!(stored[6].as_str(), Some("GPU"));

    // A longer prompt sharing the first blocks: a run chained to them,
    // then its own tail evicted from a 4-block cache, last block first
    // (vLLM frees a request's blocks tail first, keeping prefixes whole).
    // 96 bytes: six full blocks, the first two shared.
    ask(&e, &format!("{content}{}", "x".repeat(52))).await;
    let (seq, ev) = next(&mut sub).await;
    assert_eq!(seq, 1);
    assert_eq!(ev[0][0].as_str(), Some("BlockStored"));
    assert_eq!(
        ev[0][2].as_u64(),
        Some(first[1]),
        "chained to the shared blocks"
    );
    let new = hashes(&ev[0][1]);
    assert_eq!(new.len(), 4);
    let removed = ev
        .iter()
        .find(|e| e[0].as_str() == Some("BlockRemoved"))
        .unwrap();
    assert_eq!(
        hashes(&removed[1]),
        [new[3], new[2]],
        "the tail, not the shared head"
    );

    let r = reqwest::Client::new()
        .post(format!("http://{}/reset_prefix_cache", e.http))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (seq, ev) = next(&mut sub).await;
    assert_eq!((seq, ev[0][0].as_str()), (2, Some("AllBlocksCleared")));

    // A subscriber that missed batches asks for them again.
    let again = replay(&e, 1).await;
    assert_eq!(
        again.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert_eq!(events(&again[1].1)[0][0].as_str(), Some("AllBlocksCleared"));
}
