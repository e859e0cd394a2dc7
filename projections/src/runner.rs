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
    floor: SnapshotFloor,
    since_snapshot: u64,
    /// When the last snapshot was taken (or the runner started).
    snapshot_at: tokio::time::Instant,
    /// The snapshot being written, if any: one at a time.
    writing: Option<tokio::task::JoinHandle<()>>,
    /// The position of the snapshot this runner started from (0: none).
    started_from: u64,
    /// The length of the last snapshot's text: the next one's buffer is
    /// sized from it, so that it is not grown (and copied) as it fills.
    last_len: usize,
}

/// The name a server's views are snapshotted under: one for every server
/// and every start on a store. The views are the log's alone, and a
/// snapshot is checked against the log before use, so servers sharing a
/// store may share it; named by instance (hostname-PID by default), a
/// restarted server never found its last snapshot.
pub const VIEWS_SNAPSHOT: &str = "views";

/// When the views are snapshotted: once `events` have been applied since
/// the last snapshot, or once `interval` has passed since it with at least
/// one event applied, never merely because the views caught up (under a
/// trickle of usage they catch up after every batch). A snapshot only
/// shortens the next start, which replays at most about `events` plus an
/// `interval`'s worth of the log (a few thousand events: milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotFloor {
    pub events: u64,
    pub interval: std::time::Duration,
}

impl Default for SnapshotFloor {
    fn default() -> Self {
        SnapshotFloor {
            events: 10_000,
            interval: std::time::Duration::from_secs(300),
        }
    }
}

impl<S: EventStore> Runner<S> {
    /// Loads the snapshot named `name` if it matches this build and the log,
    /// else starts from nothing, then catches up to the head.
    pub async fn start(store: S, name: &str) -> Result<Self, RunnerError> {
        let mut projections = Projections::default();
        let mut last_len = 0;
        if let Some(snap) = store.load_snapshot(name).await? {
            // Used or not, its size is the next one's best guess.
            last_len = snap.state.len();
            match Self::usable(&store, &snap).await? {
                Some(p) => projections = p,
                None => tracing::info!(name, "snapshot does not match; rebuilding from the start"),
            }
        }
        let started_from = projections.checkpoint.position;
        let position = tokio::sync::watch::Sender::new(projections.checkpoint.position);
        let mut runner = Runner {
            store,
            name: name.to_owned(),
            views: Arc::new(RwLock::new(projections)),
            lag: Arc::new(AtomicU64::new(0)),
            position,
            floor: SnapshotFloor::default(),
            since_snapshot: 0,
            snapshot_at: tokio::time::Instant::now(),
            writing: None,
            started_from,
            last_len,
        };
        runner.catch_up().await?;
        // A long catch-up's snapshot is written before the views are
        // handed out (a short-lived command would otherwise drop it).
        runner.snapshot_written().await;
        // At info: how much a start replayed is what an operator asks of a
        // slow restart.
        tracing::info!(
            name,
            from_snapshot = started_from,
            position = runner.position(),
            replayed = runner.position().saturating_sub(started_from),
            "views started"
        );
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
        // Decoded straight from the text: no tree of it is built first. A
        // snapshot that does not decode is a cache lost, not an error.
        match serde_json::from_str::<Projections>(&snap.state) {
            // Events its writer did not know (a newer type or schema
            // version, during an upgrade) may read now: they are in the
            // log, not in the snapshot.
            Ok(views) if views.left_out_readable() => {
                tracing::info!(
                    unknown = ?views.unknown,
                    "the views' snapshot left out events this build reads; rebuilding from the log"
                );
                Ok(None)
            }
            Ok(views) => Ok(Some(views)),
            Err(e) => {
                tracing::warn!(error = %e, "the views' snapshot does not decode; rebuilding from the log");
                Ok(None)
            }
        }
    }

    /// Snapshots every `events` events (and on the default time floor).
    pub fn snapshot_every(mut self, events: u64) -> Self {
        self.floor.events = events.max(1);
        self
    }

    pub fn snapshot_floor(mut self, floor: SnapshotFloor) -> Self {
        self.floor = SnapshotFloor {
            events: floor.events.max(1),
            ..floor
        };
        self
    }

    /// The position of the snapshot the views started from (0: they were
    /// built from the start of the log).
    pub fn started_from(&self) -> u64 {
        self.started_from
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
            self.apply(&page);
            reader.recycle(page);
            let (head, _) = self.store.head().await?;
            self.lag
                .store(head.saturating_sub(self.position()), Ordering::Relaxed);
            self.maybe_snapshot().await;
        }
    }

    /// Applies events decoded outside the views' lock. The lock is taken
    /// per thousand events, so that readers (routing, key checks, the admin
    /// API) never wait for a whole large page, nor for any decoding.
    fn apply(&mut self, page: &[crate::Decoded]) {
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
    }

    /// Follows the log forever; drop the future to stop. Snapshots are
    /// taken on the [`SnapshotFloor`], written beside the following.
    pub async fn follow(&mut self) -> Result<(), RunnerError> {
        let mut sub = self.store.subscribe(self.position());
        loop {
            // Decoded here, in pages, from the payloads' text: applying
            // each event through a `serde_json::Value` under the views'
            // write lock held up every reader (a gateway's key and budget
            // checks) for the decoding of a usage batch's rows.
            let page = sub.next_page(DEFAULT_PAGE, crate::decode_text).await?;
            self.apply(&page);
            if sub.is_caught_up() {
                self.lag.store(0, Ordering::Relaxed);
            }
            self.maybe_snapshot().await;
        }
    }

    /// Takes a snapshot when the floor is reached and none is being
    /// written: the views are encoded (see [`Runner::encode`]) and the text
    /// written by a task of its own, so that the following does not wait
    /// for the store. A snapshot that cannot be written (the store
    /// unreachable, its disk full) is logged and tried again at the next
    /// floor: the views serve from memory and must not stop for it.
    async fn maybe_snapshot(&mut self) {
        let due = self.since_snapshot >= self.floor.events
            || (self.since_snapshot > 0 && self.snapshot_at.elapsed() >= self.floor.interval);
        if !due || self.writing.as_ref().is_some_and(|w| !w.is_finished()) {
            return;
        }
        self.since_snapshot = 0;
        self.snapshot_at = tokio::time::Instant::now();
        let snapshot = self.encode().await;
        let (store, name) = (self.store.clone(), self.name.clone());
        self.writing = Some(tokio::spawn(async move {
            if let Err(e) = write_snapshot(&store, &name, snapshot).await {
                tracing::warn!(name = %name, error = %e, "could not save the views' snapshot; trying again later");
            }
        }));
    }

    /// The views as a snapshot, encoded straight from under their read
    /// lock into a buffer sized from the last one, on a blocking thread
    /// (encoding a large fleet takes tens of milliseconds: off the async
    /// workers). No copy of the views is made: the clone this replaced
    /// held ~30 MiB more at 10,000 nodes for a moment, on top of the
    /// text. The read lock keeps no reader waiting: the runner is the
    /// views' only writer and waits here for the encoding, so no writer
    /// queues behind it (one would hold up new readers); what waits is the
    /// following (and whoever waits on [`Runner::watch_position`]), for as
    /// long as the encoding takes (~100 ms at 10,000 nodes, the first time
    /// with a pass that counts), as it waited for the clone before.
    async fn encode(&mut self) -> Snapshot {
        let (views, hint) = (self.views.clone(), self.last_len);
        let (snapshot, held) = tokio::task::spawn_blocking(move || {
            let views = views.read().unwrap_or_else(|p| p.into_inner());
            let started = std::time::Instant::now();
            // A tenth over the last (the text grows with the fleet); the
            // first is measured by a pass that only counts.
            let capacity = match hint {
                0 => encoded_len(&views),
                n => n + n / 10,
            };
            let mut text = Vec::with_capacity(capacity);
            serde_json::to_writer(&mut text, &*views).expect("views serialise");
            let snapshot = Snapshot {
                checkpoint: views.checkpoint.clone(),
                state_version: Projections::STATE_VERSION,
                state: String::from_utf8(text).expect("serde_json writes UTF-8"),
            };
            (snapshot, started.elapsed())
        })
        .await
        .expect("encoding the views does not panic");
        self.last_len = snapshot.state.len();
        tracing::debug!(
            name = %self.name,
            bytes = self.last_len,
            read_lock_ms = held.as_secs_f64() * 1e3,
            "views encoded for a snapshot"
        );
        snapshot
    }

    /// Waits for the snapshot being written, if any (a stop, a test).
    pub async fn snapshot_written(&mut self) {
        if let Some(w) = self.writing.take() {
            let _ = w.await;
        }
    }

    /// Writes the current views as the named snapshot, now.
    pub async fn save_snapshot(&mut self) -> Result<(), RunnerError> {
        self.snapshot_written().await;
        let snapshot = self.encode().await;
        write_snapshot(&self.store, &self.name, snapshot).await?;
        self.since_snapshot = 0;
        self.snapshot_at = tokio::time::Instant::now();
        Ok(())
    }
}

/// The length of the views' JSON text, without keeping it: a buffer that
/// doubles as it fills is, with some allocators, copied at every doubling
/// (old and new held at once) — at the last, most of the text twice.
fn encoded_len(views: &Projections) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, views).expect("views serialise");
    count.0
}

/// Writes the snapshot, handing its text to the store (not a copy of it),
/// then the checkpoint it was taken at.
async fn write_snapshot<S: EventStore>(
    store: &S,
    name: &str,
    snapshot: Snapshot,
) -> Result<(), RunnerError> {
    let checkpoint = snapshot.checkpoint.clone();
    store.save_snapshot(name, snapshot).await?;
    store.save_checkpoint(name, &checkpoint).await?;
    Ok(())
}
