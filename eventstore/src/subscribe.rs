//! Catch up from a position, then follow the log live.
//!
//! Hints that something was appended (PostgreSQL NOTIFY, or an in-process
//! signal for SQLite) only shorten the wait: a hint can be lost, for instance
//! while a listener reconnects, so the subscription also polls. Its position
//! is the last event it handed out, so after any failure it reads on from
//! there: nothing is lost and nothing is repeated.

use std::collections::VecDeque;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::watch;

use crate::{DEFAULT_PAGE, EventStore, RecordedEvent, Result, StoreError};

const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// Where a subscription's "new events" hints come from.
#[derive(Debug)]
pub enum Wakeups {
    Postgres(Box<PgListener>),
    Local(watch::Receiver<u64>),
}

impl Wakeups {
    /// Returns when a hint arrives or `max` has passed, whichever is first.
    async fn wait(&mut self, max: Duration) {
        match self {
            Wakeups::Postgres(listener) => {
                match tokio::time::timeout(max, listener.try_recv()).await {
                    // A hint, a timeout, or a lost connection (`None`: the
                    // next call reconnects; read now for what was missed).
                    Ok(Ok(_)) | Err(_) => {}
                    Ok(Err(_)) => tokio::time::sleep(max).await,
                }
            }
            Wakeups::Local(rx) => {
                if tokio::time::timeout(max, rx.changed())
                    .await
                    .is_ok_and(|r| r.is_err())
                {
                    // The store that fed this receiver is gone: poll only.
                    tokio::time::sleep(max).await;
                }
            }
        }
    }
}

/// A live, ordered view of the log after a position.
#[derive(Debug)]
pub struct Subscription<S> {
    store: S,
    after: u64,
    buffer: VecDeque<RecordedEvent>,
    wakeups: Option<Wakeups>,
    caught_up: bool,
    failures: u32,
}

impl<S: EventStore> Subscription<S> {
    pub(crate) fn new(store: S, after: u64) -> Self {
        Subscription {
            store,
            after,
            buffer: VecDeque::new(),
            wakeups: None,
            caught_up: false,
            failures: 0,
        }
    }

    /// The position of the last event handed out (or the starting point).
    pub fn position(&self) -> u64 {
        self.after
    }

    /// True once a read found nothing beyond what has been handed out.
    pub fn is_caught_up(&self) -> bool {
        self.caught_up && self.buffer.is_empty()
    }

    /// The next event, waiting for one to be appended if need be. Transient
    /// failures (a lost connection, a busy database) are retried with
    /// backoff; only errors a retry cannot fix are returned.
    pub async fn next(&mut self) -> Result<RecordedEvent> {
        loop {
            if let Some(event) = self.buffer.pop_front() {
                self.after = event.position;
                return Ok(event);
            }
            self.fill().await?;
        }
    }

    /// The next event if one is already in the log, without waiting.
    pub async fn next_now(&mut self) -> Result<Option<RecordedEvent>> {
        if self.buffer.is_empty() {
            self.read_page().await?;
        }
        Ok(self.buffer.pop_front().inspect(|e| self.after = e.position))
    }

    async fn fill(&mut self) -> Result<()> {
        // Listen before reading, so that an append landing between the read
        // and the wait still wakes us.
        if self.wakeups.is_none() {
            match self.store.wakeups().await {
                Ok(w) => self.wakeups = Some(w),
                Err(e) if e.is_transient() => return self.back_off(e).await,
                Err(e) => return Err(e),
            }
        }
        match self.read_page().await {
            Ok(()) if !self.buffer.is_empty() => Ok(()),
            Ok(()) => {
                let poll = self.store.poll_interval();
                if let Some(w) = self.wakeups.as_mut() {
                    w.wait(poll).await;
                }
                Ok(())
            }
            Err(e) if e.is_transient() => {
                self.wakeups = None;
                self.back_off(e).await
            }
            Err(e) => Err(e),
        }
    }

    async fn read_page(&mut self) -> Result<()> {
        let page = self.store.read_all(self.after, DEFAULT_PAGE).await?;
        if let Some(first) = page.first()
            && first.position != self.after + 1
            && !self.starts_at_base(first.position).await?
        {
            // Cannot happen with the control-row append; refuse rather than
            // silently skip if the log was damaged.
            return Err(StoreError::Corrupt {
                position: self.after + 1,
                reason: format!("missing: the next stored event is {}", first.position),
            });
        }
        self.caught_up = page.is_empty();
        self.failures = 0;
        self.buffer.extend(page);
        Ok(())
    }

    /// True when the log begins after `self.after` (it was imported from an
    /// anchor) and `first` is its first event.
    async fn starts_at_base(&self, first: u64) -> Result<bool> {
        let (base, _) = self.store.base().await?;
        Ok(self.after <= base && first == base + 1)
    }

    async fn back_off(&mut self, error: StoreError) -> Result<()> {
        self.failures += 1;
        let delay =
            Duration::from_millis(100 * 2u64.pow(self.failures.min(6))).min(MAX_RETRY_DELAY);
        if self.failures == 1 {
            tracing::warn!(error = %error, position = self.after, "subscription lost the store; retrying");
        }
        tokio::time::sleep(delay).await;
        Ok(())
    }
}
