//! Group commit: appends that arrive while another is being written wait,
//! and are then written together in one transaction.
//!
//! A commit's cost is mostly the durable flush and the round trips around
//! it, not the rows, so single-event appends from concurrent callers (the
//! decider, the usage batcher, the recorder) cost one commit per group
//! rather than one each. Each caller still gets exactly the answer its own
//! transaction would have given: [`crate::append::plan_group`] decides the
//! requests in arrival order, each against the log as the earlier ones
//! leave it, with its own fence, retry and expected-version checks; a
//! refused request writes nothing and does not affect the others.
//!
//! Nobody waits for company: the first append to arrive while no group is
//! being written starts one at once, so a lone writer's latency is
//! unchanged; appends that arrive meanwhile form the next group.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;
use tracing::Instrument;

use crate::append::{self, Prepared};
use crate::{AppendPoint, Appended, Result, StoreError, StreamAppend, Writer};

/// At most this many events in one group's transaction, so that one group
/// does not hold the control row for long; the rest form the next group.
const MAX_GROUP_EVENTS: usize = 10_000;

/// A backend that can write a group of prepared appends in one transaction.
pub(crate) trait GroupWriter: Clone + Send + Sync + 'static {
    fn queue(&self) -> &Queue;

    /// The test seam ([`crate::AppendHook`]).
    fn hook_at(&self, point: AppendPoint) -> impl Future<Output = ()> + Send;

    /// Writes the group in one transaction, under the control row's lock:
    /// one answer per request, in order. An `Err` means the transaction
    /// failed as a whole and nothing of it was written.
    fn write_group<'a>(
        &'a self,
        group: &'a [Prepared],
    ) -> impl Future<Output = Result<Vec<Result<Appended>>>> + Send + 'a;
}

/// The appends waiting for the next group, shared by every clone of a store.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    state: Mutex<State>,
    /// Groups written and the appends in them, for [`GroupStats`].
    groups: AtomicU64,
    appends: AtomicU64,
    /// Groups a backend wrote in one statement (PostgreSQL's fast path).
    one_statement: AtomicU64,
}

/// How many groups a store has written and how many appends they held
/// (refused ones included): the mean group size is what group commit buys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupStats {
    pub groups: u64,
    pub appends: u64,
    /// Of the groups, those written in one statement (the head as the
    /// store left it; on SQLite, one trip to the driver).
    pub one_statement: u64,
}

#[derive(Debug, Default)]
struct State {
    pending: Vec<Request>,
    /// A task is writing groups and will take what is pending.
    running: bool,
}

#[derive(Debug)]
struct Request {
    prepared: Prepared,
    reply: oneshot::Sender<Result<Appended>>,
}

impl Queue {
    pub(crate) fn stats(&self) -> GroupStats {
        GroupStats {
            groups: self.groups.load(Ordering::Relaxed),
            appends: self.appends.load(Ordering::Relaxed),
            one_statement: self.one_statement.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn wrote_in_one_statement(&self) {
        self.one_statement.fetch_add(1, Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a request; true when no task is writing, so the caller must
    /// start one.
    fn push(&self, request: Request) -> bool {
        let mut state = self.lock();
        state.pending.push(request);
        !std::mem::replace(&mut state.running, true)
    }

    /// The next group, in arrival order; `None` (and no task running any
    /// more) when nothing is waiting.
    fn take(&self) -> Option<Vec<Request>> {
        let mut state = self.lock();
        if state.pending.is_empty() {
            state.running = false;
            return None;
        }
        let mut events = 0;
        let n = state
            .pending
            .iter()
            .take_while(|r| {
                let first = events == 0;
                events += r.prepared.len();
                first || events <= MAX_GROUP_EVENTS
            })
            .count();
        Some(state.pending.drain(..n).collect())
    }
}

/// Appends `batch` as part of the next group, and answers as if it had been
/// written alone.
pub(crate) async fn append<W: GroupWriter>(
    store: &W,
    writer: &Writer,
    batch: &[StreamAppend],
) -> Result<Appended> {
    // Validation and the canonical JSON happen here, on the caller's task,
    // so that concurrent callers do that work side by side.
    let prepared = append::prepare(writer, batch)?;
    let (reply, answer) = oneshot::channel();
    if store.queue().push(Request { prepared, reply }) {
        // Its own task, so that a caller that stops waiting cannot strand
        // the others' appends half way.
        tokio::spawn(run(store.clone()).instrument(tracing::Span::current()));
    }
    store.hook_at(AppendPoint::Queued).await;
    answer.await.map_err(|_| StoreError::Interrupted)?
}

/// Writes groups until nothing is waiting.
async fn run<W: GroupWriter>(store: W) {
    let mut running = Running {
        queue: store.queue(),
        done: false,
    };
    while let Some(group) = store.queue().take() {
        let (prepared, replies): (Vec<Prepared>, Vec<_>) =
            group.into_iter().map(|r| (r.prepared, r.reply)).unzip();
        store
            .hook_at(AppendPoint::Writing {
                appends: prepared.len(),
            })
            .await;
        let outcomes = write(&store, &prepared).await;
        let queue = store.queue();
        queue.groups.fetch_add(1, Ordering::Relaxed);
        queue
            .appends
            .fetch_add(prepared.len() as u64, Ordering::Relaxed);
        for (reply, outcome) in replies.into_iter().zip(outcomes) {
            // A caller that stopped waiting no longer needs its answer.
            let _ = reply.send(outcome);
        }
        // The callers just answered are woken on this runtime; a writer
        // that appends again at once (the decider, the usage batcher) does
        // so within microseconds. One turn of the scheduler lets those
        // appends join the next group instead of forming a group of their
        // own after it: without it, 4 single-event writers split into two
        // alternating groups of 2, each paying a whole commit. This is not
        // waiting for company (no timer): a lone writer's next group starts
        // after one yield.
        tokio::task::yield_now().await;
    }
    running.done = true;
}

async fn write<W: GroupWriter>(store: &W, group: &[Prepared]) -> Vec<Result<Appended>> {
    match store.write_group(group).await {
        Ok(outcomes) => outcomes,
        Err(e) if group.len() == 1 => vec![Err(e)],
        Err(e) => {
            // The transaction failed as a whole (a row the database refused,
            // a lost connection): nothing was written. One request's trouble
            // must not become the others' answer, so each is written alone
            // and gets its own.
            tracing::debug!(error = %e, requests = group.len(), "group append failed; writing each alone");
            let mut outcomes = Vec::with_capacity(group.len());
            for request in group {
                outcomes.push(
                    match store.write_group(std::slice::from_ref(request)).await {
                        Ok(mut one) => one.pop().unwrap_or(Err(StoreError::Interrupted)),
                        Err(e) => Err(e),
                    },
                );
            }
            outcomes
        }
    }
}

/// Clears the running flag if the writing task ends early (a panic, a
/// runtime shutting down), failing what is still queued rather than leaving
/// it waiting for a task that will never come.
struct Running<'a> {
    queue: &'a Queue,
    done: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.queue.lock();
        state.running = false;
        state.pending.clear();
    }
}

/// How long a kept writer connection is trusted without the pool's check.
const KEEP: std::time::Duration = std::time::Duration::from_secs(10);

/// The connection a backend keeps for writing groups between one and the
/// next: taking one from the pool and giving it back each costs a round trip
/// (the pool checks a connection as it hands it out and as it takes it
/// back), which is as much as a small append's own work.
#[derive(Debug)]
pub(crate) struct Parked<DB: sqlx::Database> {
    slot: Mutex<Option<(sqlx::pool::PoolConnection<DB>, std::time::Instant)>>,
}

impl<DB: sqlx::Database> Default for Parked<DB> {
    fn default() -> Self {
        Parked {
            slot: Mutex::new(None),
        }
    }
}

impl<DB: sqlx::Database> Parked<DB> {
    /// The kept connection if it was used recently (true), else one from
    /// the pool (false).
    pub(crate) async fn take(
        &self,
        pool: &sqlx::Pool<DB>,
    ) -> Result<(sqlx::pool::PoolConnection<DB>, bool)> {
        let kept = self.slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        match kept {
            Some((conn, at)) if at.elapsed() < KEEP => Ok((conn, true)),
            // Old: back to the pool, which checks it before the next use.
            _ => Ok((pool.acquire().await?, false)),
        }
    }

    pub(crate) fn park(&self, conn: sqlx::pool::PoolConnection<DB>) {
        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((conn, std::time::Instant::now()));
    }
}
