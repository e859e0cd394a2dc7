//! Usage capture off the request path. Streaming requests ask the engine
//! for usage even when the client did not, and the extra chunk is taken out
//! before it reaches the client (`proxy/splice.rs`). Each finished request becomes one record
//! in a bounded queue; a full queue drops the record and counts it, never
//! blocking a request. A batcher appends the records to the event log when
//! the gateway has one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use llmgw_domain::tenancy::Band;

    use super::*;

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
