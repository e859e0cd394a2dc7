//! The prefix cache's changes published as vLLM publishes its KV-cache
//! events (`--kv-events-config`, `vllm/distributed/kv_events.py`), so that
//! a router written for vLLM reads the sim's, and the gateway is tested
//! against the protocol a real engine speaks:
//!
//! - a ZeroMQ PUB socket (here an XPUB, which a SUB cannot tell apart,
//!   so that a subscription is registered before anything published after
//!   it) sending `[topic, seq (8 bytes, big-endian), payload]`, `seq`
//!   counting batches from 0;
//! - the payload a msgpack `KVEventBatch` as msgspec writes it with
//!   `array_like`: `[ts, [event…], data_parallel_rank]`, each event a
//!   tagged array: `["BlockStored", block_hashes, parent_block_hash,
//!   token_ids, block_size, lora_id, medium]`, `["BlockRemoved",
//!   block_hashes, medium]`, `["AllBlocksCleared"]`;
//! - a ROUTER socket for replay: a request `["", start_seq]` (8 bytes,
//!   big-endian) is answered with every buffered batch from `start_seq`
//!   as `["", seq, payload]`, then `["", -1, ""]`.

use std::collections::VecDeque;
use std::net::SocketAddr;

use rmpv::Value;
use tokio::sync::mpsc;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, XPubSocket, ZmqMessage};

use crate::SimError;

/// One change of the prefix cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KvEvent {
    /// Consecutive full blocks, each chained to the one before; `parent`
    /// is the block before the first (None at the prompt's start).
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: usize,
    },
    Removed {
        hashes: Vec<u64>,
    },
    Cleared,
}

/// Where the events go: `tcp://HOST:PORT` for the PUB socket, and for the
/// replay socket if any (port 0 picks a free one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsConfig {
    pub publish: SocketAddr,
    pub replay: Option<SocketAddr>,
    /// Batches kept for replay.
    pub buffer: usize,
}

/// `tcp://HOST:PORT`, as vLLM's `endpoint` and `replay_endpoint` take it
/// (only TCP, and an address rather than a name: the sim binds it).
pub fn parse_endpoint(s: &str) -> Result<SocketAddr, String> {
    s.strip_prefix("tcp://")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("{s:?}: expected tcp://HOST:PORT with an IP address"))
}

/// Hands batches to the publishing task, in the order the cache made them.
#[derive(Debug, Clone)]
pub(crate) struct KvSink(mpsc::UnboundedSender<Vec<KvEvent>>);

impl KvSink {
    pub(crate) fn send(&self, events: Vec<KvEvent>) {
        if !events.is_empty() {
            // The task ends only with the engine.
            let _ = self.0.send(events);
        }
    }
}

/// The bound publisher, not yet running.
pub struct KvPublisher {
    xpub: XPubSocket,
    replay: Option<RouterSocket>,
    buffer: usize,
}

impl std::fmt::Debug for KvPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvPublisher")
            .field("buffer", &self.buffer)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for KvPublisherTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KvPublisherTask")
    }
}

/// What [`KvPublisher::start`] returns: run it beside the engine.
pub struct KvPublisherTask(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>);

impl std::future::Future for KvPublisherTask {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

fn tcp_addr(e: &zeromq::Endpoint, asked: SocketAddr) -> SocketAddr {
    match e {
        zeromq::Endpoint::Tcp(host, port) => format!("{host}:{port}")
            .parse()
            .unwrap_or(SocketAddr::new(asked.ip(), *port)),
        _ => asked,
    }
}

impl KvPublisher {
    /// Binds the sockets; returns the publisher and the addresses bound
    /// (the PUB's, then the replay socket's).
    pub async fn bind(
        config: &KvEventsConfig,
    ) -> Result<(KvPublisher, SocketAddr, Option<SocketAddr>), SimError> {
        let bind_err = |addr: SocketAddr, e: zeromq::ZmqError| SimError::Listen {
            addr,
            source: std::io::Error::other(e.to_string()),
        };
        let mut xpub = XPubSocket::new();
        let bound = xpub
            .bind(&format!("tcp://{}", config.publish))
            .await
            .map_err(|e| bind_err(config.publish, e))?;
        let publish = tcp_addr(&bound, config.publish);
        let (replay, replay_addr) = match config.replay {
            Some(addr) => {
                let mut r = RouterSocket::new();
                let bound = r
                    .bind(&format!("tcp://{addr}"))
                    .await
                    .map_err(|e| bind_err(addr, e))?;
                (Some(r), Some(tcp_addr(&bound, addr)))
            }
            None => (None, None),
        };
        Ok((
            KvPublisher {
                xpub,
                replay,
                buffer: config.buffer.max(1),
            },
            publish,
            replay_addr,
        ))
    }

    /// The sink the cache writes to, and the task that publishes.
    pub(crate) fn start(self) -> (KvSink, KvPublisherTask) {
        let (tx, rx) = mpsc::unbounded_channel();
        (KvSink(tx), KvPublisherTask(Box::pin(self.run(rx))))
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Vec<KvEvent>>) {
        let mut seq: u64 = 0;
        let mut sent: VecDeque<(u64, bytes::Bytes)> = VecDeque::new();
        loop {
            tokio::select! {
                // Subscriptions first: one that arrived before a batch is
                // registered before the batch goes out.
                biased;
                sub = self.xpub.recv() => {
                    if let Err(e) = sub {
                        tracing::debug!(error = %e, "kv events subscriber left");
                    }
                }
                req = recv_opt(&mut self.replay) => {
                    if let Some(r) = self.replay.as_mut() {
                        replay(r, req, &sent).await;
                    }
                }
                batch = rx.recv() => {
                    let Some(events) = batch else { return };
                    let payload = bytes::Bytes::from(encode_batch(&events));
                    let message = ZmqMessage::try_from(vec![
                        bytes::Bytes::new(),
                        bytes::Bytes::copy_from_slice(&seq.to_be_bytes()),
                        payload.clone(),
                    ]);
                    if let Ok(m) = message
                        && let Err(e) = self.xpub.send(m).await
                    {
                        tracing::warn!(error = %e, "publishing kv events failed");
                    }
                    sent.push_back((seq, payload));
                    if sent.len() > self.buffer {
                        sent.pop_front();
                    }
                    seq += 1;
                }
            }
        }
    }
}

async fn recv_opt(r: &mut Option<RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match r {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// Answers one replay request: `[identity, "", start_seq]`.
async fn replay(
    r: &mut RouterSocket,
    req: zeromq::ZmqResult<ZmqMessage>,
    sent: &VecDeque<(u64, bytes::Bytes)>,
) {
    let Ok(req) = req else { return };
    let frames = req.into_vec();
    let [id, _, start] = &frames[..] else {
        tracing::warn!(frames = frames.len(), "malformed kv events replay request");
        return;
    };
    let Ok(start) = <[u8; 8]>::try_from(&start[..]).map(u64::from_be_bytes) else {
        tracing::warn!("malformed kv events replay request");
        return;
    };
    let answers = sent
        .iter()
        .filter(|(s, _)| *s >= start)
        .map(|(s, p)| (s.to_be_bytes(), p.clone()))
        .chain(std::iter::once((
            (-1i64).to_be_bytes(),
            bytes::Bytes::new(),
        )));
    for (s, payload) in answers {
        let m = ZmqMessage::try_from(vec![
            id.clone(),
            bytes::Bytes::new(),
            bytes::Bytes::copy_from_slice(&s),
            payload,
        ]);
        if let Ok(m) = m
            && r.send(m).await.is_err()
        {
            return;
        }
    }
}

/// A batch as msgspec encodes vLLM's `KVEventBatch` (array_like, tagged).
pub(crate) fn encode_batch(events: &[KvEvent]) -> Vec<u8> {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let ints = |v: &[u64]| Value::Array(v.iter().map(|h| Value::from(*h)).collect());
    let gpu = Value::from("GPU");
    let events = events
        .iter()
        .map(|e| match e {
            KvEvent::Stored {
                hashes,
                parent,
                tokens,
                block_size,
            } => Value::Array(vec![
                Value::from("BlockStored"),
                ints(hashes),
                parent.map_or(Value::Nil, Value::from),
                Value::Array(tokens.iter().map(|t| Value::from(*t)).collect()),
                Value::from(*block_size as u64),
                Value::Nil,
                gpu.clone(),
            ]),
            KvEvent::Removed { hashes } => {
                Value::Array(vec![Value::from("BlockRemoved"), ints(hashes), gpu.clone()])
            }
            KvEvent::Cleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
        })
        .collect();
    let batch = Value::Array(vec![Value::F64(ts), Value::Array(events), Value::from(0)]);
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &batch);
    out
}
