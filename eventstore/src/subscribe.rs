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

use crate::{DEFAULT_PAGE, EventRef, EventStore, RecordedEvent, Result, StoreError, TextPage};

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

    /// True once a read reached the head: it found nothing beyond what has
    /// been handed out, or (a page) fewer events than it asked for.
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

    /// The next events, up to `limit`, each decoded by `decode` straight
    /// from its payload's text (no `serde_json::Value` on the way), waiting
    /// for one to be appended if need be. Retries as [`Subscription::next`]
    /// does. Events [`Subscription::next`] read ahead and did not hand out
    /// are read again here.
    pub async fn next_page<T>(
        &mut self,
        limit: usize,
        mut decode: impl FnMut(EventRef<'_>) -> T,
    ) -> Result<Vec<T>> {
        self.buffer.clear();
        let limit = limit.max(1);
        loop {
            if !self.listening().await? {
                continue;
            }
            // A page is not kept between reads: at the head the runner
            // waits here, and a page of usage batches can be megabytes.
            match self.read_text(limit).await {
                Ok(page) if !page.is_empty() => {
                    let events = page.iter().map(&mut decode).collect();
                    self.after = page.last_position().unwrap_or(self.after);
                    return Ok(events);
                }
                Ok(_) => self.settle(Ok(false)).await?,
                Err(e) => self.settle(Err(e)).await?,
            }
        }
    }

    async fn fill(&mut self) -> Result<()> {
        if !self.listening().await? {
            return Ok(());
        }
        let read = self.read_page().await;
        let found = read.as_ref().is_ok_and(|()| !self.buffer.is_empty());
        self.settle(read.map(|()| found)).await
    }

    /// Listens for hints before a read, so that an append landing between
    /// the read and the wait still wakes us. False when the store could not
    /// be reached (and the subscription has backed off).
    async fn listening(&mut self) -> Result<bool> {
        if self.wakeups.is_none() {
            match self.store.wakeups().await {
                Ok(w) => self.wakeups = Some(w),
                Err(e) if e.is_transient() => {
                    self.back_off(e).await?;
                    return Ok(false);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// After a read that found something (true) or nothing (false): waits
    /// for a hint when it found nothing, backs off when the store was lost.
    async fn settle(&mut self, read: Result<bool>) -> Result<()> {
        match read {
            Ok(true) => Ok(()),
            Ok(false) => {
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
        if let Some(first) = page.first() {
            self.follows_on(first.position).await?;
        }
        self.caught_up = page.is_empty();
        self.failures = 0;
        self.buffer.extend(page);
        Ok(())
    }

    /// A page of text; one shorter than `limit` reached the head.
    async fn read_text(&mut self, limit: usize) -> Result<TextPage> {
        let reading = self
            .store
            .read_text_page(self.after, limit, TextPage::default());
        let page = reading.await?;
        if let Some(first) = page.get(0) {
            self.follows_on(first.position).await?;
        }
        self.caught_up = page.len() < limit;
        self.failures = 0;
        Ok(page)
    }

    /// Refuses a read whose first event is not the next one: cannot happen
    /// with the control-row append, so the log was damaged, and skipping
    /// silently would hide it.
    async fn follows_on(&self, first: u64) -> Result<()> {
        if first == self.after + 1 || self.starts_at_base(first).await? {
            return Ok(());
        }
        Err(StoreError::Corrupt {
            position: self.after + 1,
            reason: format!("missing: the next stored event is {first}"),
        })
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
