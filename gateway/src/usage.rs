//! Usage capture off the request path. Streaming requests ask the engine
//! for usage even when the client did not, and the extra chunk is taken out
//! before it reaches the client (`proxy/splice.rs`). Each finished request becomes one record
//! in a bounded queue (a row of the next flush's one event); a full queue drops the record and counts it, never
//! blocking a request. A batcher appends the records to the event log when
//! the gateway has one, and holds them while the log cannot be reached.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use llmgw_decider::{Actor, Decider, Origin};
use llmgw_domain::Event;
use llmgw_domain::usage::{FinishedRequest, UsageBatchRecorded, UsageEvent, record_batch};
use llmgw_eventstore::{AnyStore, StoreError};
use serde_json::Value;
use tokio::sync::mpsc;
use uuid::Uuid;

mod answer;

pub use crate::unflushed::{Spending, Unflushed};

/// Tokens as the engine reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub prompt: u64,
    pub completion: u64,
}

impl Tokens {
    /// The usage of a plain answer's body: as [`Tokens::from_usage`] on
    /// the parsed document, without parsing the rest of it.
    pub fn from_answer(body: &[u8]) -> Option<Tokens> {
        // A struct also deserializes from an array; a document that is not
        // an object has no usage.
        if body.trim_ascii_start().first() != Some(&b'{') {
            return None;
        }
        let answer: answer::Answer = serde_json::from_slice(body).ok()?;
        let usage = answer.usage?;
        Some(Tokens {
            prompt: usage.prompt?,
            completion: usage.completion.unwrap_or(0),
        })
    }

    pub(crate) fn from_usage(v: &Value) -> Option<Tokens> {
        Tokens::from_usage_value(v.get("usage")?)
    }

    /// The tokens of a `usage` object.
    fn from_usage_value(u: &Value) -> Option<Tokens> {
        Some(Tokens {
            prompt: u.get("prompt_tokens")?.as_u64()?,
            completion: u
                .get("completion_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        })
    }
}

/// What the queue and the batcher count together.
#[derive(Debug, Default)]
pub struct UsageCounts {
    /// Records lost: the queue was full, or the log refused them for good.
    dropped: AtomicU64,
    /// Records taken off the queue and not yet in the log (the batch being
    /// appended, retried while the log cannot be reached).
    held: AtomicU64,
}

impl UsageCounts {
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    fn drop_records(&self, n: u64, why: &str) {
        let before = self.dropped.fetch_add(n, Ordering::Relaxed);
        // The first loss and then every thousandth: a full queue under load
        // would otherwise write a line per request.
        if before == 0 || (before / 1000) != (before + n) / 1000 {
            tracing::warn!(dropped = before + n, "usage records dropped: {why}");
        }
    }
}

/// A finished request on its way to the log, with what it costs the
/// budgets over its key (counted by [`Unflushed`] until the views hold it).
#[derive(Debug)]
struct Queued {
    request: FinishedRequest,
    spending: Option<Spending>,
}

/// Where finished requests go.
#[derive(Debug)]
pub struct UsageQueue {
    tx: mpsc::Sender<Queued>,
    counts: Arc<UsageCounts>,
    unflushed: Arc<Unflushed>,
    wake: Arc<Wake>,
}

/// When the batcher is woken: when a batch has queued up, and when the
/// queue is gone. Not on every record: that was a wake-up of the
/// batcher's task (often another thread) per request, for a record that
/// waits for the tick anyway.
#[derive(Debug)]
struct Wake {
    notify: tokio::sync::Notify,
    /// Records that make a batch (none until a batcher runs).
    at: std::sync::atomic::AtomicUsize,
    /// The queue has been dropped: nothing more will come.
    closed: std::sync::atomic::AtomicBool,
}

impl Drop for UsageQueue {
    fn drop(&mut self) {
        self.close();
    }
}

/// The batcher's end of the queue.
#[derive(Debug)]
pub struct UsageReceiver {
    rx: mpsc::Receiver<Queued>,
    counts: Arc<UsageCounts>,
    unflushed: Arc<Unflushed>,
    wake: Arc<Wake>,
}

impl UsageReceiver {
    /// The next record, taken out of the way to the log.
    pub async fn recv(&mut self) -> Option<FinishedRequest> {
        let q = self.rx.recv().await?;
        if let Some(s) = &q.spending {
            self.unflushed.unqueued(s);
        }
        Some(q.request)
    }

    /// A record already waiting, if any.
    pub fn try_recv(&mut self) -> Option<FinishedRequest> {
        let q = self.rx.try_recv().ok()?;
        if let Some(s) = &q.spending {
            self.unflushed.unqueued(s);
        }
        Some(q.request)
    }

    /// The counts, readable after the receiver has gone to the batcher.
    pub fn counts(&self) -> Arc<UsageCounts> {
        self.counts.clone()
    }
}

impl UsageQueue {
    /// A queue of `capacity` records: with the batch the batcher holds, the
    /// most usage a gateway keeps while the log cannot be reached.
    pub fn new(capacity: usize) -> (Arc<Self>, UsageReceiver) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let counts = Arc::new(UsageCounts::default());
        let unflushed = Arc::new(Unflushed::default());
        let wake = Arc::new(Wake {
            notify: tokio::sync::Notify::new(),
            at: usize::MAX.into(),
            closed: false.into(),
        });
        (
            Arc::new(UsageQueue {
                tx,
                counts: counts.clone(),
                unflushed: unflushed.clone(),
                wake: wake.clone(),
            }),
            UsageReceiver {
                rx,
                counts,
                unflushed,
                wake,
            },
        )
    }

    /// Nothing more will come: the batcher appends what is queued and
    /// ends. A stop says so once its requests are done, rather than wait
    /// for every holder of the queue to let go (with the control plane,
    /// more than the gateway holds it, for as long as the process runs).
    pub fn close(&self) {
        self.wake.closed.store(true, Ordering::Release);
        self.wake.notify.notify_one();
    }

    /// Never waits: a full queue loses the record and counts it. Whether
    /// it was queued.
    pub fn record(&self, r: FinishedRequest) -> bool {
        self.record_spending(r, None)
    }

    /// As [`UsageQueue::record`], and `spending` counts in this gateway's
    /// budget checks from now until the views hold the record.
    pub fn record_spending(&self, r: FinishedRequest, spending: Option<Spending>) -> bool {
        // Counted before it is sent: the batcher may take it at once.
        if let Some(s) = &spending {
            self.unflushed.queued(s);
        }
        match self.tx.try_send(Queued {
            request: r,
            spending,
        }) {
            Ok(()) => {
                let queued = self.tx.max_capacity() - self.tx.capacity();
                if queued >= self.wake.at.load(Ordering::Relaxed) {
                    self.wake.notify.notify_one();
                }
                true
            }
            Err(e) => {
                self.lost(e);
                false
            }
        }
    }

    fn lost(&self, e: mpsc::error::TrySendError<Queued>) {
        let q = match e {
            mpsc::error::TrySendError::Full(q) | mpsc::error::TrySendError::Closed(q) => q,
        };
        if let Some(s) = &q.spending {
            self.unflushed.unqueued(s);
        }
        self.counts.drop_records(1, "the usage queue is full");
    }

    /// This gateway's spend not yet in the views.
    pub fn unflushed(&self) -> &Unflushed {
        &self.unflushed
    }

    /// Records lost: the queue was full, or the log refused them for good.
    pub fn dropped(&self) -> u64 {
        self.counts.dropped()
    }

    /// Records not yet in the log: queued, or in the batch being appended.
    pub fn pending(&self) -> u64 {
        let queued = self.tx.max_capacity() - self.tx.capacity();
        queued as u64 + self.counts.held()
    }
}

/// The first wait before appending a batch again, doubled up to
/// [`RETRY_MAX`]: short enough that usage lands soon after the log is back.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Appends queued usage to the log every `interval` or `batch` records, one
/// `UsageBatchRecorded` event per flush, through the decider's observer path (usage is a fact any gateway saw,
/// not a leader's decision; each batch is one command of this gateway).
/// A batch that cannot be appended is tried again, with the same event
/// id, until it lands: while it waits, new records wait in the queue
/// (and are dropped, counted, once it is full). Runs until the queue's
/// senders are gone, then flushes what is left.
pub async fn run_batcher(
    store: AnyStore,
    instance: String,
    mut rx: UsageReceiver,
    batch: usize,
    interval: Duration,
) {
    let decider = Decider::new(store, instance.clone());
    let counts = rx.counts();
    let unflushed = rx.unflushed.clone();
    unflushed.name_batches(&instance);
    let mut pending: Vec<Queued> = Vec::new();
    // The first tick one interval from now, not at once.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    // Ticks missed while a batch waited for the log are not made up in a
    // burst of tiny appends.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let wake = rx.wake.clone();
    // A queue no bigger than a batch wakes the batcher when half full,
    // so that records arriving while it is being woken still fit.
    let at = batch.min(rx.rx.max_capacity() / 2).max(1);
    wake.at.store(at, Ordering::Relaxed);
    // Records queued before the batcher ran told no one: the first turn
    // takes them as if woken.
    wake.notify.notify_one();
    let to = Flush {
        instance: &instance,
        decider: &decider,
        counts: &counts,
        unflushed: &unflushed,
    };
    loop {
        // A full batch goes at once; anything else waits for the tick, so
        // a steady trickle becomes one append per interval, not one per
        // moment the queue happens to be empty.
        let ticked = tokio::select! {
            () = wake.notify.notified() => false,
            _ = tick.tick() => true,
        };
        // Read before the queue is drained: what was sent before the
        // queue went is in it by then.
        let closed = wake.closed.load(Ordering::Acquire);
        loop {
            // What queued up meanwhile (a backlog after an outage) goes in
            // full batches.
            while pending.len() < at {
                match rx.rx.try_recv() {
                    Ok(r) => pending.push(r),
                    Err(_) => break,
                }
            }
            let full = pending.len() >= at;
            if pending.is_empty() || !(full || ticked || closed) {
                break;
            }
            to.flush(pending.drain(..)).await;
            if !full {
                break;
            }
        }
        if closed {
            return;
        }
    }
}

/// What a flush needs of the batcher.
struct Flush<'a> {
    instance: &'a str,
    decider: &'a Decider,
    counts: &'a UsageCounts,
    unflushed: &'a Unflushed,
}

impl Flush<'_> {
    /// One event of `queued`, its id given once, here: every try of this
    /// batch carries it, so a try whose commit was unknown is not appended
    /// twice.
    async fn flush(&self, queued: impl Iterator<Item = Queued>) {
        let mut spendings = Vec::new();
        let requests = queued.map(|q| {
            spendings.extend(q.spending);
            q.request
        });
        let (batch, refused) = record_batch(self.instance, requests);
        if !refused.is_empty() {
            tracing::error!(reason = %refused[0], "usage records that cannot be recorded; they are lost");
            self.counts
                .drop_records(refused.len() as u64, "not a usage record");
        }
        let Some(batch) = batch else {
            spendings.iter().for_each(|s| self.unflushed.unqueued(s));
            return;
        };
        // Counted as this batch's until the views mark it (a refused
        // row's spend too, until then: a moment's overcount, never an
        // undercount).
        let last = batch.rows().last().map(|u| u.request_id.clone());
        let last = last.unwrap_or_default();
        self.unflushed.sent(&last, spendings.iter());
        let origin = Origin::new(Actor::Gateway(self.instance.to_owned()));
        let to = Delivery {
            decider: self.decider,
            origin: &origin,
            gateway: self.instance,
            counts: self.counts,
            unflushed: self.unflushed,
        };
        deliver(&to, (Uuid::now_v7(), batch), &last).await;
    }
}

/// Where a batch goes, and what counts it.
struct Delivery<'a> {
    decider: &'a Decider,
    origin: &'a Origin,
    gateway: &'a str,
    counts: &'a UsageCounts,
    unflushed: &'a Unflushed,
}

/// Appends one batch, whose last row is `last`, trying again until it
/// lands or the log refuses it for good.
async fn deliver(to: &Delivery<'_>, (id, batch): (Uuid, UsageEvent), last: &str) {
    let Delivery {
        decider,
        origin,
        gateway,
        counts,
        unflushed,
    } = *to;
    let n = batch.rows().len() as u64;
    counts.held.fetch_add(n, Ordering::Relaxed);
    let events = [(id, Event::Usage(batch))];
    let mut wait = RETRY_FIRST;
    let mut failing_since: Option<tokio::time::Instant> = None;
    let mut reported = tokio::time::Instant::now();
    loop {
        match decider.observe_once(origin, &events).await {
            Ok(appended) => {
                if appended.deduplicated {
                    tracing::info!(
                        records = n,
                        "a usage batch was already in the log (an earlier try committed without an answer); not appended again"
                    );
                }
                if let Some(since) = failing_since {
                    tracing::info!(
                        records = n,
                        after_s = since.elapsed().as_secs_f64(),
                        "usage appended again; the log is back"
                    );
                }
                break;
            }
            Err(e @ (StoreError::Invalid(_) | StoreError::DuplicateEventId { .. })) => {
                let [(_, Event::Usage(batch))] = events else {
                    unreachable!("one usage event")
                };
                if n > 1 {
                    // One bad record must not take the others with it: each
                    // row goes again as a batch of its own. New ids are safe
                    // here, the refused append wrote nothing. Its spend
                    // counts again as each row lands in the views.
                    counts.held.fetch_sub(n, Ordering::Relaxed);
                    unflushed.unsent(last);
                    let rows = match batch {
                        UsageEvent::UsageBatchRecorded(b) => b.rows,
                        UsageEvent::UsageRecorded(u) => vec![u],
                    };
                    for row in rows {
                        let id = row.request_id.clone();
                        let one = UsageEvent::UsageBatchRecorded(UsageBatchRecorded {
                            gateway: gateway.to_owned(),
                            rows: vec![row],
                        });
                        Box::pin(deliver(to, (Uuid::now_v7(), one), &id)).await;
                    }
                    return;
                }
                tracing::error!(error = %e, "the log refused a usage record; it is lost");
                counts.drop_records(1, "refused by the log");
                unflushed.unsent(last);
                break;
            }
            Err(e) => {
                let now = tokio::time::Instant::now();
                if failing_since.is_none() || now - reported >= Duration::from_secs(60) {
                    tracing::warn!(
                        error = %e,
                        records = n,
                        "cannot append usage; holding it and trying again"
                    );
                    reported = now;
                }
                failing_since.get_or_insert(now);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RETRY_MAX);
            }
        }
    }
    counts.held.fetch_sub(n, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use llmgw_domain::catalog::Price;
    use llmgw_domain::tenancy::Band;

    use super::*;

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_rather_than_waits() {
        let (q, _rx) = UsageQueue::new(1);
        let r = || FinishedRequest {
            request_id: "r".into(),
            key_id: "".into(),
            project_id: "".into(),
            model_asked: "m".into(),
            model_served: "m".into(),
            prompt_tokens: 1,
            completion_tokens: 1,
            status: 200,
            latency_ms: 1,
            ttft_ms: None,
            band: Band::Gold,
            at: llmgw_domain::UnixMillis(0),
            price: Price::ZERO,
        };
        q.record(r());
        q.record(r());
        q.record(r());
        assert_eq!(q.dropped(), 2);
    }

    #[test]
    fn a_plain_answer_reads_as_its_parsed_document_does() {
        let bodies: [&[u8]; 18] = [
            br#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#,
            br#" {"usage":{"prompt_tokens":5}}"#,
            br#"{"usage":{"prompt_tokens":5,"completion_tokens":"many"}}"#,
            br#"{"usage":{"prompt_tokens":-1}}"#,
            br#"{"usage":null}"#,
            br#"[{"prompt_tokens":1}]"#,
            br#"{"usage":"#,
            b"{}",
            br#"{"usage":{"total_tokens":9,"prompt_tokens_details":{"cached_tokens":4},"prompt_tokens":5,"completion_tokens":4}}"#,
            br#"{"usage":[5,4]}"#,
            br#"{"usage":"5"}"#,
            br#"{"usage":{"prompt_tokens":5.0,"completion_tokens":4}}"#,
            br#"{"usage":{"prompt_tokens":5,"completion_tokens":-4}}"#,
            br#"{"usage":{"prompt_tokens":5,"completion_tokens":[1,{"a":[2]}],"x":{"y":null}}}"#,
            br#"{"usage":{"prompt_tokens":1,"prompt_tokens":2,"completion_tokens":true}}"#,
            br#"{"usage":{"prompt\u005ftokens":7}}"#,
            br#"{"usage":{"prompt_tokens":18446744073709551616}}"#,
            br#"{"usage":{"prompt_tokens":18446744073709551615,"completion_tokens":{}}}"#,
        ];
        for body in bodies {
            let parsed = serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|v| Tokens::from_usage(&v));
            assert_eq!(
                Tokens::from_answer(body),
                parsed,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let first = Tokens::from_answer(bodies[0]);
        assert_eq!(
            first,
            Some(Tokens {
                prompt: 12,
                completion: 3
            })
        );
    }
}
