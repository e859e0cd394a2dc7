//! The append-only event log that every cluster change goes into.
//!
//! What belongs here: the [`EventStore`] trait and its two backends,
//! PostgreSQL ([`PgStore`]) and SQLite ([`SqliteStore`], the embedded default),
//! chosen by [`StoreAddress`]; appends with expected versions and idempotent
//! retries; the append lease whose epoch fences every append inside the
//! database; the hash chain and its verification (also in the background,
//! [`ChainWatch`]); reads, subscriptions, projection checkpoints and
//! upcasting on read; running the migrations.
//!
//! What must not: knowledge of what the events mean. Payloads are JSON
//! values with a type name and a schema version; their Rust types live in
//! `llmgw-domain`.
//!
//! # Why one control row
//!
//! Every append locks the single `es_control` row, takes its positions from
//! the counter there and commits while still holding the lock. Positions are
//! therefore dense and in commit order: a reader that has seen position `p`
//! has seen everything below it, and needs no gap logic. The same row holds
//! the lease (holder, epoch, expiry), so the fence check and the write are
//! one atomic step: a takeover waits for an in-flight append to commit, and
//! an append that waited for a takeover finds the epoch changed and writes
//! nothing.

mod address;
mod append;
mod browse;
mod chain_watch;
mod copy_binary;
mod error;
mod export;
mod group;
pub mod hash;
mod import;
mod known;
mod migrate;
mod page_text;
mod postgres;
mod reader;
pub mod signing;
mod snapshot_zip;
mod sqlite;
mod subscribe;
mod text_page;
mod types;
mod upcast;

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

pub use address::StoreAddress;
pub use browse::EventFilter;
pub use chain_watch::ChainWatch;
pub use error::{Result, StoreError};
pub use export::{
    ExportLine, Exported, Trailer, export, header_hash, parse_line, write_header, write_trailer,
};
pub use group::GroupStats;
pub use import::{ChainCheck, ImportOptions, Imported};
pub use migrate::SchemaState;
pub use postgres::PgStore;
pub use reader::{DecodingReader, PageReader};
pub use sqlite::SqliteStore;
pub use subscribe::{Subscription, Wakeups};
pub use text_page::{EventRef, TextPage};
pub use types::{
    Appended, Checkpoint, EventText, ExpectedVersion, Lease, LeaseInfo, LeaseToken, NewEvent,
    RecordedEvent, Snapshot, Stats, StreamAppend, VerifyReport, Writer,
};
pub use upcast::{UpcastFn, Upcasters};

/// How many events one read returns at most, for callers that page.
pub const DEFAULT_PAGE: usize = 1000;

/// The log's operations; implemented by both backends and by [`AnyStore`].
///
/// The `*_raw` reads return events as stored; the plain reads pass them
/// through the store's [`Upcasters`] first.
pub trait EventStore: Clone + Send + Sync + 'static {
    fn address(&self) -> &StoreAddress;

    fn upcasters(&self) -> &Upcasters;

    /// Applies the migrations this binary knows and the database lacks.
    /// Returns the versions it applied.
    fn migrate(&self) -> impl Future<Output = Result<Vec<i64>>> + Send;

    /// Appends a batch atomically: all of it or nothing.
    fn append(
        &self,
        writer: &Writer,
        batch: &[StreamAppend],
    ) -> impl Future<Output = Result<Appended>> + Send;

    fn read_all_raw(
        &self,
        after: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>>> + Send;

    /// Events after `after` with their payloads as JSON text and without
    /// metadata or hash, as stored, in one [`TextPage`]: the cheap read for
    /// replaying. `reuse` is a spent page whose memory the backend may fill
    /// again (`TextPage::default()` when there is none).
    fn read_text_page_raw(
        &self,
        after: u64,
        limit: usize,
        reuse: TextPage,
    ) -> impl Future<Output = Result<TextPage>> + Send;

    fn read_stream_raw(
        &self,
        stream_id: &str,
        after_version: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>>> + Send;

    /// Events recorded in `[from, to)` with a position above `after`.
    fn read_time_range_raw(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        after: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>>> + Send;

    /// The events in `positions` that match `filter`, newest first, at most
    /// `limit`, as stored: for browsing. The read walks down from
    /// `positions.end`, so a narrow range bounds the cost of a rare filter;
    /// the next page is the range below the last event returned.
    fn read_backward_raw(
        &self,
        filter: &EventFilter,
        positions: Range<u64>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>>> + Send;

    /// The head position and the head of the hash chain.
    fn head(&self) -> impl Future<Output = Result<(u64, [u8; 32])>> + Send;

    /// Where the log begins: the position before its first event and that
    /// position's hash. `(0, GENESIS)` unless the log was imported from an
    /// export that starts later ([`ImportOptions::from_anchor`]); then the
    /// hash is the source's, taken on trust.
    fn base(&self) -> impl Future<Output = Result<(u64, [u8; 32])>> + Send;

    /// Writes an export's events exactly as they were (positions,
    /// `recorded_at`, epochs, hashes), in one transaction: all or nothing.
    ///
    /// `token` must hold the append lease, checked under the control row's
    /// lock as an append's fence is. Every event's hash is recomputed; the
    /// events must continue this store's log exactly (an empty store: from
    /// position 1, or from `options.prev_hash` with `from_anchor`; a store
    /// with events: linked to its head, where events the store already
    /// holds are checked by hash and skipped). Anything else is refused
    /// with [`StoreError::ImportRefused`] and nothing is written. An error
    /// from `events` (a line that is not an event) ends the import the same
    /// way. When the events carry a higher epoch than the store's, the
    /// control row's epoch moves up to it and the importer's lease ends.
    fn import<I>(
        &self,
        token: &LeaseToken,
        options: &ImportOptions,
        events: I,
    ) -> impl Future<Output = Result<Imported>> + Send
    where
        I: IntoIterator<Item = Result<RecordedEvent>> + Send,
        I::IntoIter: Send;

    fn stats(&self) -> impl Future<Output = Result<Stats>> + Send;

    /// Takes the lease if it is free or expired, or renews it under a new
    /// epoch for the same holder. The epoch grows on every grant.
    fn acquire_lease(
        &self,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Lease>> + Send;

    /// As [`EventStore::acquire_lease`], for a process that must not take
    /// the lease from another process under the same name: held under
    /// `holder`, it is granted again only at `mine`, the epoch this caller
    /// last held (a lapsed renewal of its own); `None` for a caller that
    /// held none. In one statement, so two processes given one name
    /// cannot both be granted it.
    fn take_lease(
        &self,
        holder: &str,
        ttl: Duration,
        mine: Option<u64>,
    ) -> impl Future<Output = Result<Lease>> + Send;

    /// Extends a lease that is still held; `Fenced` once it is not.
    fn renew_lease(
        &self,
        token: &LeaseToken,
        ttl: Duration,
    ) -> impl Future<Output = Result<Lease>> + Send;

    /// Steps down so that a successor need not wait out the ttl. Returns false
    /// when the token no longer held the lease.
    fn release_lease(&self, token: &LeaseToken) -> impl Future<Output = Result<bool>> + Send;

    fn lease_info(&self) -> impl Future<Output = Result<LeaseInfo>> + Send;

    fn save_checkpoint(
        &self,
        name: &str,
        checkpoint: &Checkpoint,
    ) -> impl Future<Output = Result<()>> + Send;

    fn load_checkpoint(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Checkpoint>>> + Send;

    /// Takes the snapshot by value: its text is tens of megabytes for a
    /// large fleet, and a driver that is handed it owned does not copy it
    /// (SQLite's binding copies borrowed text; PostgreSQL's frees ours as
    /// soon as it is encoded into the message).
    fn save_snapshot(
        &self,
        name: &str,
        snapshot: Snapshot,
    ) -> impl Future<Output = Result<()>> + Send;

    fn load_snapshot(&self, name: &str) -> impl Future<Output = Result<Option<Snapshot>>> + Send;

    /// A source of "something was appended" hints for subscriptions.
    fn wakeups(&self) -> impl Future<Output = Result<Wakeups>> + Send;

    /// How often a subscription polls when no hint arrives.
    fn poll_interval(&self) -> Duration;

    fn read_all(
        &self,
        after: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>>> + Send {
        async move {
            self.upcasters()
                .upcast_all(self.read_all_raw(after, limit).await?)
        }
    }

    /// [`EventStore::read_text_page_raw`], upcast: a payload is parsed only
    /// when its type has a newer schema version to reach.
    fn read_text_page(
        &self,
        after: u64,
        limit: usize,
        reuse: TextPage,
    ) -> impl Future<Output = Result<TextPage>> + Send {
        async move {
            let mut page = self.read_text_page_raw(after, limit, reuse).await?;
            self.upcasters().upcast_page(&mut page)?;
            Ok(page)
        }
    }

    /// [`EventStore::read_text_page`], each event with its own texts.
    fn read_all_text(
        &self,
        after: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<EventText>>> + Send {
        async move {
            let page = self.read_text_page(after, limit, TextPage::default());
            Ok(page.await?.into_events())
        }
    }

    fn read_stream(
        &self,
        stream_id: &str,
        after_version: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>>> + Send {
        async move {
            let raw = self
                .read_stream_raw(stream_id, after_version, limit)
                .await?;
            self.upcasters().upcast_all(raw)
        }
    }

    fn read_time_range(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        after: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>>> + Send {
        async move {
            let raw = self.read_time_range_raw(from, to, after, limit).await?;
            self.upcasters().upcast_all(raw)
        }
    }

    /// The event at `position` as stored (not upcast), if there is one.
    fn event_at(
        &self,
        position: u64,
    ) -> impl Future<Output = Result<Option<RecordedEvent>>> + Send {
        async move {
            if position == 0 {
                return Ok(None);
            }
            let mut events = self.read_all_raw(position - 1, 1).await?;
            Ok(events.pop().filter(|e| e.position == position))
        }
    }

    /// The hash of the event at `position`: genesis for 0, the base hash at
    /// the log's base, `None` where the log holds no event.
    fn hash_at(&self, position: u64) -> impl Future<Output = Result<Option<[u8; 32]>>> + Send {
        async move {
            if position == 0 {
                return Ok(Some(hash::GENESIS));
            }
            let (base, base_hash) = self.base().await?;
            if position == base {
                return Ok(Some(base_hash));
            }
            Ok(self.event_at(position).await?.map(|e| e.hash))
        }
    }

    /// Recomputes the hash chain over `[from, to]` (`to` defaults to the
    /// head) and reports the first position whose stored hash does not match
    /// its content. The link into `from` trusts the stored hash of `from - 1`
    /// (or the log's base hash: a range never starts before the base).
    fn verify(
        &self,
        from: u64,
        to: Option<u64>,
    ) -> impl Future<Output = Result<VerifyReport>> + Send {
        async move {
            let (head, head_hash) = self.head().await?;
            let (base, base_hash) = self.base().await?;
            let from = from.max(base + 1);
            let to = to.unwrap_or(head).min(head);
            let mut report = VerifyReport {
                from,
                to,
                checked: 0,
                first_mismatch: None,
                missing: false,
                head_matches: None,
            };
            if from > to {
                return Ok(report);
            }
            let mut prev = if from - 1 == base {
                base_hash
            } else {
                match self.event_at(from - 1).await? {
                    Some(e) => e.hash,
                    // The link into the range is gone: that is the break
                    // (the range's first event would be blamed for it).
                    None => {
                        report.first_mismatch = Some(from - 1);
                        report.missing = true;
                        return Ok(report);
                    }
                }
            };
            let mut after = from - 1;
            'pages: while after < to {
                let page = self.read_all_raw(after, DEFAULT_PAGE).await?;
                if page.is_empty() {
                    break;
                }
                for event in page {
                    if event.position > to {
                        break 'pages;
                    }
                    if event.position != after + 1 {
                        report.first_mismatch = Some(after + 1);
                        report.missing = true;
                        return Ok(report);
                    }
                    after = event.position;
                    let computed = hash::chain(&prev, &event);
                    if computed != event.hash {
                        report.first_mismatch = Some(event.position);
                        return Ok(report);
                    }
                    report.checked += 1;
                    prev = computed;
                }
            }
            if after < to {
                report.first_mismatch = Some(after + 1);
                report.missing = true;
            } else if to == head {
                report.head_matches = Some(prev == head_hash);
            }
            Ok(report)
        }
    }

    /// Loads a projection's checkpoint and checks it against the log: a
    /// checkpoint whose position is past the head, or whose event id is not
    /// the event now at that position, is ahead of the surviving history and
    /// the projection must be rebuilt.
    fn resume_checkpoint(&self, name: &str) -> impl Future<Output = Result<Checkpoint>> + Send {
        async move {
            let Some(cp) = self.load_checkpoint(name).await? else {
                return Ok(Checkpoint::START);
            };
            if cp.position == 0 {
                return Ok(cp);
            }
            let ahead = || StoreError::CheckpointAhead {
                name: name.to_owned(),
                position: cp.position,
            };
            match self.event_at(cp.position).await? {
                None => Err(ahead()),
                Some(e) if cp.event_id.is_some_and(|id| id != e.event_id) => Err(ahead()),
                Some(_) => Ok(cp),
            }
        }
    }

    /// Every event after `after`, first those already in the log, then new
    /// ones as they are appended.
    fn subscribe(&self, after: u64) -> Subscription<Self> {
        Subscription::new(self.clone(), after)
    }
}

/// Points inside an append where a test can hold the writer, to race it
/// against a takeover. Not for production use.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendPoint {
    /// An append has joined the queue for the next group (called on the
    /// appending task).
    Queued,
    /// A group of this many appends is about to be written in one
    /// transaction.
    Writing { appends: usize },
    /// The writer has a connection but has not yet checked its fence.
    BeforeFence,
    /// The fence check passed and the control row is locked.
    AfterFence,
}

/// A test seam: called at each [`AppendPoint`].
#[doc(hidden)]
pub trait AppendHook: Send + Sync + std::fmt::Debug {
    fn at(&self, point: AppendPoint) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// What opening a store does about its schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// Refuse a store without the current schema ([`StoreError::NotMigrated`]).
    Require,
    /// Apply pending migrations first.
    Migrate,
    /// Check nothing: for a caller that runs [`EventStore::migrate`] itself.
    Unchecked,
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Create the SQLite file if it is missing (PostgreSQL databases are
    /// never created).
    pub create: bool,
    /// What to do about the schema on open.
    pub schema: Schema,
    /// Only read: a SQLite file is opened `mode=ro` and keeps its journal
    /// mode, so reading a backup, a read-only copy or another user's file
    /// changes nothing in it (appends fail).
    pub read_only: bool,
    pub max_connections: u32,
    pub poll_interval: Duration,
    pub upcasters: Upcasters,
    #[doc(hidden)]
    pub append_hook: Option<Arc<dyn AppendHook>>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            create: false,
            schema: Schema::Require,
            read_only: false,
            max_connections: 8,
            poll_interval: Duration::from_millis(500),
            upcasters: Upcasters::new(),
            append_hook: None,
        }
    }
}

impl OpenOptions {
    /// For `llmgw store migrate` and servers: create and migrate.
    pub fn migrating() -> Self {
        OpenOptions {
            create: true,
            schema: Schema::Migrate,
            ..Self::default()
        }
    }

    /// For the operator's reading commands (`events`, `lease show`): an
    /// existing, migrated store, read and never written.
    pub fn reading() -> Self {
        OpenOptions {
            read_only: true,
            ..Self::default()
        }
    }
}

/// Either backend, chosen at run time from the address.
#[derive(Debug, Clone)]
pub enum AnyStore {
    Postgres(PgStore),
    Sqlite(SqliteStore),
}

impl AnyStore {
    pub async fn open(address: &StoreAddress, options: OpenOptions) -> Result<Self> {
        Ok(match address {
            StoreAddress::Postgres(_) => AnyStore::Postgres(PgStore::open(address, options).await?),
            StoreAddress::Sqlite(_) => AnyStore::Sqlite(SqliteStore::open(address, options).await?),
        })
    }

    /// Where the schema of the store at `address` stands against this
    /// binary's, refused as a migrating open refuses it (a newer schema,
    /// an edited migration): for a check before a start, which must change
    /// nothing. A PostgreSQL database is read in read-only transactions; a
    /// SQLite file with nothing beside it is read `immutable`, which makes
    /// no `-wal` or `-shm` file either ([`StoreError::NoSuchFile`] where
    /// there is no file).
    pub async fn schema_state(address: &StoreAddress) -> Result<SchemaState> {
        match address {
            StoreAddress::Postgres(_) => {
                let options = OpenOptions {
                    schema: Schema::Unchecked,
                    max_connections: 1,
                    ..OpenOptions::reading()
                };
                PgStore::open(address, options).await?.schema_state().await
            }
            StoreAddress::Sqlite(path) => sqlite::schema_state(address, path).await,
        }
    }

    /// The groups this store (and its clones) has written so far.
    pub fn group_stats(&self) -> GroupStats {
        match self {
            AnyStore::Postgres(s) => s.group_stats(),
            AnyStore::Sqlite(s) => s.group_stats(),
        }
    }

    /// At a clean stop, when nothing writes any more: SQLite's write-ahead
    /// log is folded into the database file, so that a copy of the file
    /// alone holds every event. Nothing to do for PostgreSQL.
    pub async fn fold_wal(&self) {
        if let AnyStore::Sqlite(s) = self {
            s.fold_wal().await;
        }
    }

    /// Read as it was when opened, and never after: a SQLite file opened
    /// `immutable` ([`OpenOptions::read_only`] where its directory cannot
    /// be written). A follower of it would wait for events it cannot see.
    pub fn is_snapshot(&self) -> bool {
        matches!(self, AnyStore::Sqlite(s) if s.is_snapshot())
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            AnyStore::Postgres($s) => $e,
            AnyStore::Sqlite($s) => $e,
        }
    };
}

impl EventStore for AnyStore {
    fn address(&self) -> &StoreAddress {
        delegate!(self, s => s.address())
    }
    fn upcasters(&self) -> &Upcasters {
        delegate!(self, s => s.upcasters())
    }
    fn poll_interval(&self) -> Duration {
        delegate!(self, s => s.poll_interval())
    }
    async fn migrate(&self) -> Result<Vec<i64>> {
        delegate!(self, s => s.migrate().await)
    }
    async fn append(&self, writer: &Writer, batch: &[StreamAppend]) -> Result<Appended> {
        use tracing::Instrument;
        // Every write passes here: its span shows in a trace what a
        // request or a reconciler pass wrote and how long the database took.
        let events: usize = batch.iter().map(|s| s.events.len()).sum();
        let span = tracing::info_span!(
            "append",
            streams = batch.len(),
            events,
            positions = tracing::field::Empty
        );
        let result = delegate!(self, s => s.append(writer, batch).instrument(span.clone()).await);
        if let Ok(a) = &result {
            span.record(
                "positions",
                format_args!("{}..={}", a.first_position, a.last_position),
            );
        }
        result
    }
    async fn read_all_raw(&self, after: u64, limit: usize) -> Result<Vec<RecordedEvent>> {
        delegate!(self, s => s.read_all_raw(after, limit).await)
    }
    async fn read_text_page_raw(
        &self,
        after: u64,
        limit: usize,
        reuse: TextPage,
    ) -> Result<TextPage> {
        delegate!(self, s => s.read_text_page_raw(after, limit, reuse).await)
    }
    async fn read_stream_raw(
        &self,
        stream_id: &str,
        after_version: u64,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>> {
        delegate!(self, s => s.read_stream_raw(stream_id, after_version, limit).await)
    }
    async fn read_time_range_raw(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>> {
        delegate!(self, s => s.read_time_range_raw(from, to, after, limit).await)
    }
    async fn read_backward_raw(
        &self,
        filter: &EventFilter,
        positions: Range<u64>,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>> {
        delegate!(self, s => s.read_backward_raw(filter, positions, limit).await)
    }
    async fn head(&self) -> Result<(u64, [u8; 32])> {
        delegate!(self, s => s.head().await)
    }
    async fn base(&self) -> Result<(u64, [u8; 32])> {
        delegate!(self, s => s.base().await)
    }
    async fn import<I>(
        &self,
        token: &LeaseToken,
        options: &ImportOptions,
        events: I,
    ) -> Result<Imported>
    where
        I: IntoIterator<Item = Result<RecordedEvent>> + Send,
        I::IntoIter: Send,
    {
        delegate!(self, s => s.import(token, options, events).await)
    }
    async fn stats(&self) -> Result<Stats> {
        delegate!(self, s => s.stats().await)
    }
    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> Result<Lease> {
        delegate!(self, s => s.acquire_lease(holder, ttl).await)
    }
    async fn take_lease(&self, holder: &str, ttl: Duration, mine: Option<u64>) -> Result<Lease> {
        delegate!(self, s => s.take_lease(holder, ttl, mine).await)
    }
    async fn renew_lease(&self, token: &LeaseToken, ttl: Duration) -> Result<Lease> {
        delegate!(self, s => s.renew_lease(token, ttl).await)
    }
    async fn release_lease(&self, token: &LeaseToken) -> Result<bool> {
        delegate!(self, s => s.release_lease(token).await)
    }
    async fn lease_info(&self) -> Result<LeaseInfo> {
        delegate!(self, s => s.lease_info().await)
    }
    async fn save_checkpoint(&self, name: &str, checkpoint: &Checkpoint) -> Result<()> {
        delegate!(self, s => s.save_checkpoint(name, checkpoint).await)
    }
    async fn load_checkpoint(&self, name: &str) -> Result<Option<Checkpoint>> {
        delegate!(self, s => s.load_checkpoint(name).await)
    }
    async fn save_snapshot(&self, name: &str, snapshot: Snapshot) -> Result<()> {
        delegate!(self, s => s.save_snapshot(name, snapshot).await)
    }
    async fn load_snapshot(&self, name: &str) -> Result<Option<Snapshot>> {
        delegate!(self, s => s.load_snapshot(name).await)
    }
    async fn wakeups(&self) -> Result<Wakeups> {
        delegate!(self, s => s.wakeups().await)
    }
}

pub(crate) fn ttl_millis(ttl: Duration) -> Result<i64> {
    let ms = ttl.as_millis();
    if ms == 0 || ms > 24 * 3600 * 1000 {
        return Err(StoreError::Invalid(
            "lease ttl must be between 1 ms and 24 h".into(),
        ));
    }
    Ok(ms as i64)
}

pub(crate) fn to_i64(v: u64, what: &str) -> Result<i64> {
    i64::try_from(v).map_err(|_| StoreError::Invalid(format!("{what} {v} is out of range")))
}

/// Whom a store grants the lease to again while it is held under their
/// name: `acquire_lease` anyone asking under it, `take_lease` only the
/// caller that last held that epoch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Again {
    AnyEpoch,
    /// The epoch the caller last held; None when it held none.
    At(Option<u64>),
}

impl Again {
    /// (whether the epoch is checked, the epoch), as the statements bind
    /// them; -1 is no epoch.
    pub(crate) fn condition(self) -> Result<(bool, i64)> {
        match self {
            Again::AnyEpoch => Ok((false, -1)),
            Again::At(None) => Ok((true, -1)),
            Again::At(Some(e)) => i64::try_from(e)
                .map(|e| (true, e))
                .map_err(|_| StoreError::Invalid(format!("epoch {e} is out of range"))),
        }
    }
}
