//! Keeps [`Projections`] in step with the log: start from the last snapshot
//! (when it still matches the log) plus the tail, then follow.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use llmgw_eventstore::{DEFAULT_PAGE, EventStore, Snapshot, StoreError};

use crate::Projections;

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("reading the event log: {0}")]
    Store(#[from] StoreError),
}

/// Owns the in-memory views and feeds them.
#[derive(Debug)]
pub struct Runner<S> {
    store: S,
    name: String,
    views: Arc<RwLock<Projections>>,
    lag: Arc<AtomicU64>,
    position: tokio::sync::watch::Sender<u64>,
    /// Events between snapshots.
    snapshot_every: u64,
    since_snapshot: u64,
    /// When the last snapshot was saved (or the runner started).
    snapshot_at: tokio::time::Instant,
}

/// A runner that has caught up snapshots at most this often: under a
/// steady trickle (usage) it is caught up after every batch, and a snapshot
/// of every view per batch would cost more than the batch itself.
const SNAPSHOT_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

impl<S: EventStore> Runner<S> {
    /// Loads the snapshot named `name` if it matches this build and the log,
    /// else starts from nothing, then catches up to the head.
    pub async fn start(store: S, name: &str) -> Result<Self, RunnerError> {
        let mut projections = Projections::default();
        if let Some(snap) = store.load_snapshot(name).await? {
            match Self::usable(&store, &snap).await? {
                Some(p) => projections = p,
                None => tracing::info!(name, "snapshot does not match; rebuilding from the start"),
            }
        }
        let position = tokio::sync::watch::Sender::new(projections.checkpoint.position);
        let mut runner = Runner {
            store,
            name: name.to_owned(),
            views: Arc::new(RwLock::new(projections)),
            lag: Arc::new(AtomicU64::new(0)),
            position,
            snapshot_every: 10_000,
            since_snapshot: 0,
            snapshot_at: tokio::time::Instant::now(),
        };
        runner.catch_up().await?;
        Ok(runner)
    }

    async fn usable(store: &S, snap: &Snapshot) -> Result<Option<Projections>, RunnerError> {
        if snap.state_version != Projections::STATE_VERSION {
            return Ok(None);
        }
        if snap.checkpoint.position > 0 {
            let at = store.event_at(snap.checkpoint.position).await?;
            if at.map(|e| e.event_id) != snap.checkpoint.event_id {
                // Ahead of the log that survived (failover, restore).
                return Ok(None);
            }
        }
        Ok(serde_json::from_value(snap.state.clone()).ok())
    }

    pub fn snapshot_every(mut self, events: u64) -> Self {
        self.snapshot_every = events.max(1);
        self
    }

    /// The views, shared with readers (the gateway, the admin API).
    pub fn views(&self) -> Arc<RwLock<Projections>> {
        self.views.clone()
    }

    /// How many events the views are behind the head, as of the last read.
    pub fn lag(&self) -> u64 {
        self.lag.load(Ordering::Relaxed)
    }

    pub fn position(&self) -> u64 {
        self.read().checkpoint.position
    }

    /// The position the views have reached, to wait on.
    pub fn watch_position(&self) -> tokio::sync::watch::Receiver<u64> {
        self.position.subscribe()
    }

    /// A handle that reads the lag while the runner is owned elsewhere.
    pub fn lag_handle(&self) -> Arc<AtomicU64> {
        self.lag.clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Projections> {
        self.views.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies everything up to the current head, in large pages read and
    /// decoded while the previous one is applied.
    pub async fn catch_up(&mut self) -> Result<(), RunnerError> {
        let mut reader = llmgw_eventstore::DecodingReader::new(
            self.store.clone(),
            self.position(),
            crate::REPLAY_PAGE,
            crate::decode_text,
        );
        loop {
            let page = reader.next_page().await?;
            if page.is_empty() {
                self.lag.store(0, Ordering::Relaxed);
                return Ok(());
            }
            // The views' lock is taken per thousand events, so that readers
            // (routing, the admin API) never wait for a whole large page.
            for chunk in page.chunks(DEFAULT_PAGE) {
                let position = {
                    let mut views = self.views.write().unwrap_or_else(|p| p.into_inner());
                    for d in chunk {
                        views.apply_decoded(d);
                    }
                    views.checkpoint.position
                };
                self.position.send_replace(position);
            }
            self.since_snapshot += page.len() as u64;
            let (head, _) = self.store.head().await?;
            self.lag
                .store(head.saturating_sub(self.position()), Ordering::Relaxed);
            self.maybe_snapshot(false).await?;
        }
    }

    fn apply_all(&mut self, events: &[llmgw_eventstore::RecordedEvent]) {
        let position = {
            let mut views = self.views.write().unwrap_or_else(|p| p.into_inner());
            for e in events {
                views.apply(e);
            }
            views.checkpoint.position
        };
        self.since_snapshot += events.len() as u64;
        self.position.send_replace(position);
    }

    /// Follows the log forever; drop the future to stop. A snapshot is saved
    /// every `snapshot_every` events, and when the views catch up if the
    /// last one is older than [`SNAPSHOT_IDLE`].
    pub async fn follow(&mut self) -> Result<(), RunnerError> {
        let mut sub = self.store.subscribe(self.position());
        loop {
            let event = sub.next().await?;
            let mut batch = vec![event];
            while batch.len() < DEFAULT_PAGE {
                match sub.next_now().await {
                    Ok(Some(e)) => batch.push(e),
                    Ok(None) => break,
                    // The store went away mid-batch: apply what was read;
                    // `next` waits for it, with backoff.
                    Err(e) if e.is_transient() => break,
                    Err(e) => return Err(e.into()),
                }
            }
            self.apply_all(&batch);
            let caught_up = sub.is_caught_up();
            if caught_up {
                self.lag.store(0, Ordering::Relaxed);
            }
            // A snapshot only shortens the next start: one that cannot be
            // written (the store unreachable, its disk full) must not stop
            // the views, which serve from memory.
            if let Err(e) = self.maybe_snapshot(caught_up).await {
                tracing::warn!(name = %self.name, error = %e, "could not save the views' snapshot; trying again later");
                self.snapshot_at = tokio::time::Instant::now();
                self.since_snapshot = 0;
            }
        }
    }

    async fn maybe_snapshot(&mut self, caught_up: bool) -> Result<(), RunnerError> {
        let due = self.since_snapshot >= self.snapshot_every
            || (caught_up
                && self.since_snapshot > 0
                && self.snapshot_at.elapsed() >= SNAPSHOT_IDLE);
        if !due {
            return Ok(());
        }
        self.save_snapshot().await
    }

    /// Writes the current views as the named snapshot.
    pub async fn save_snapshot(&mut self) -> Result<(), RunnerError> {
        let snapshot = {
            let views = self.read();
            Snapshot {
                checkpoint: views.checkpoint.clone(),
                state_version: Projections::STATE_VERSION,
                state: serde_json::to_value(&*views).expect("views serialise"),
            }
        };
        self.store.save_snapshot(&self.name, &snapshot).await?;
        self.store
            .save_checkpoint(&self.name, &snapshot.checkpoint)
            .await?;
        self.since_snapshot = 0;
        self.snapshot_at = tokio::time::Instant::now();
        Ok(())
    }
}
