//! Usage capture off the request path. Streaming requests ask the engine
//! for usage even when the client did not, and the extra chunk is taken out
//! before it reaches the client. Each finished request becomes one record
//! in a bounded queue; a full queue drops the record and counts it, never
//! blocking a request. A batcher appends the records to the event log when
//! the gateway has one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use llmgw_decider::{Actor, Decider, Origin};
use llmgw_domain::Event;
use llmgw_domain::catalog::Price;
use llmgw_domain::usage::{FinishedRequest, record};
use llmgw_eventstore::AnyStore;
use serde_json::Value;
use tokio::sync::mpsc;

/// Tokens as the engine reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub prompt: u64,
    pub completion: u64,
}

impl Tokens {
    pub(crate) fn from_usage(v: &Value) -> Option<Tokens> {
        let u = v.get("usage")?;
        Some(Tokens {
            prompt: u.get("prompt_tokens")?.as_u64()?,
            completion: u
                .get("completion_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        })
    }
}

/// Where finished requests go.
#[derive(Debug)]
pub struct UsageQueue {
    tx: mpsc::Sender<FinishedRequest>,
    dropped: AtomicU64,
}

impl UsageQueue {
    pub fn new(capacity: usize) -> (Arc<Self>, mpsc::Receiver<FinishedRequest>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            Arc::new(UsageQueue {
                tx,
                dropped: AtomicU64::new(0),
            }),
            rx,
        )
    }

    /// Never waits: a full queue loses the record and counts it.
    pub fn record(&self, r: FinishedRequest) {
        if self.tx.try_send(r).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n == 1 || n.is_multiple_of(1000) {
                tracing::warn!(dropped = n, "usage queue full; records dropped");
            }
        }
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Appends queued usage to the log every `interval` or `batch` records,
/// through the decider's observer path (usage is a fact any gateway saw,
/// not a leader's decision; each batch is one command of this gateway).
/// Runs until the queue's senders are gone, then flushes what is left.
pub async fn run_batcher(
    store: AnyStore,
    instance: String,
    mut rx: mpsc::Receiver<FinishedRequest>,
    batch: usize,
    interval: Duration,
    price_of: impl Fn(&str) -> Price,
) {
    let decider = Decider::new(store, instance.clone());
    let mut pending: Vec<FinishedRequest> = Vec::new();
    let mut tick = tokio::time::interval(interval);
    loop {
        // A full batch goes at once; anything else waits for the tick, so
        // a steady trickle becomes one append per interval, not one per
        // moment the queue happens to be empty.
        let (flush, closed) = tokio::select! {
            r = rx.recv() => match r {
                Some(r) => { pending.push(r); (pending.len() >= batch, false) }
                None => (true, true),
            },
            _ = tick.tick() => (true, false),
        };
        if flush && !pending.is_empty() {
            let events: Vec<Event> = pending
                .drain(..)
                .filter_map(|r| {
                    let price = price_of(&r.model_served);
                    record(r, price).ok()
                })
                .map(Event::Usage)
                .collect();
            let n = events.len();
            let origin = Origin::new(Actor::Gateway(instance.clone()));
            if n > 0
                && let Err(e) = decider.observe(&origin, events).await
            {
                tracing::error!(error = %e, records = n, "appending usage failed; records lost");
            }
        }
        if closed {
            return;
        }
    }
}

/// Scans an SSE stream chunk by chunk: passes events through as soon as
/// they are complete, notes usage, and drops the usage-only event when the
/// gateway asked for it on the client's behalf.
#[derive(Debug, Default)]
pub(crate) struct SseScanner {
    partial: Vec<u8>,
    strip_usage: bool,
    pub(crate) tokens: Option<Tokens>,
    pub(crate) saw_content: bool,
    /// Events that carried text: engines stream about one token each, so
    /// this stands for the completion while no usage has been reported.
    pub(crate) content_events: u64,
}

impl SseScanner {
    pub(crate) fn new(strip_usage: bool) -> Self {
        SseScanner {
            strip_usage,
            ..Self::default()
        }
    }

    /// The bytes to forward for this chunk (possibly none yet).
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Bytes {
        let mut buf = std::mem::take(&mut self.partial);
        buf.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(buf.len());
        let mut start = 0;
        while let Some(end) = find(&buf[start..], b"\n\n") {
            let event = &buf[start..start + end + 2];
            if self.keep(event) {
                out.extend_from_slice(event);
            }
            start += end + 2;
        }
        buf.drain(..start);
        self.partial = buf;
        Bytes::from(out)
    }

    /// Whatever is left when the upstream ends (a last event without its
    /// blank line).
    pub(crate) fn finish(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.partial))
    }

    fn keep(&mut self, event: &[u8]) -> bool {
        let Some(data) = event.strip_prefix(b"data: ") else {
            return true;
        };
        let data = data.trim_ascii_end();
        if data == b"[DONE]" {
            return true;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return true;
        };
        if let Some(t) = Tokens::from_usage(&v) {
            self.tokens = Some(t);
            let usage_only = v["choices"].as_array().is_some_and(|c| c.is_empty());
            if usage_only && self.strip_usage {
                return false;
            }
        }
        if v["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
            || v["choices"][0]["text"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        {
            self.saw_content = true;
            self.content_events += 1;
        }
        true
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use llmgw_domain::tenancy::Band;

    use super::*;

    #[test]
    fn events_split_across_chunks_pass_whole_and_the_injected_usage_chunk_is_dropped() {
        let mut s = SseScanner::new(true);
        let mut out = Vec::new();
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
        for piece in stream.as_bytes().chunks(5) {
            out.extend_from_slice(&s.feed(piece));
        }
        out.extend_from_slice(&s.finish());
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
        );
        assert_eq!(
            s.tokens,
            Some(Tokens {
                prompt: 7,
                completion: 2
            })
        );
        assert!(s.saw_content);
    }

    #[test]
    fn a_client_that_asked_for_usage_keeps_it() {
        let mut s = SseScanner::new(false);
        let chunk =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n";
        assert_eq!(&s.feed(chunk.as_bytes())[..], chunk.as_bytes());
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_rather_than_waits() {
        let (q, _rx) = UsageQueue::new(1);
        let r = || FinishedRequest {
            request_id: "r".into(),
            key_id: String::new(),
            project_id: String::new(),
            model_asked: "m".into(),
            model_served: "m".into(),
            prompt_tokens: 1,
            completion_tokens: 1,
            status: 200,
            latency_ms: 1,
            ttft_ms: None,
            band: Band::Gold,
            at: 0,
        };
        q.record(r());
        q.record(r());
        q.record(r());
        assert_eq!(q.dropped(), 2);
    }
}
