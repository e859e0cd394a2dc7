//! The SQLite backend: the same schema and semantics as PostgreSQL for one
//! machine. WAL with `synchronous=FULL` (a commit survives power loss), one
//! writer connection, and every write transaction `BEGIN IMMEDIATE`, so that
//! a writer takes the lock before it reads instead of failing with
//! SQLITE_BUSY half way. SQLite has no trusted clock of its own: lease times
//! come from this machine's clock, which every process on it shares.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::sync::watch;
use uuid::Uuid;

use crate::append::{self, Existing, Locked, Prepared};
use crate::browse::{self, Arg, Dialect};
use crate::group::{self, GroupWriter, Queue};
use crate::import::{CHUNK, Pending, Run, StoreHead, chunk_full};
use crate::known::Head;
use crate::page_text;
use crate::{
    AppendHook, AppendPoint, Appended, Checkpoint, EventFilter, EventStore, ImportOptions,
    Imported, Lease, LeaseInfo, LeaseToken, OpenOptions, RecordedEvent, Result, Schema, Snapshot,
    Stats, StoreAddress, StoreError, StreamAppend, TextPage, Upcasters, Wakeups, Writer, hash,
    to_i64, ttl_millis,
};

mod rows;

#[derive(Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    address: StoreAddress,
    upcasters: Arc<Upcasters>,
    poll_interval: Duration,
    hook: Option<Arc<dyn AppendHook>>,
    appended: Arc<watch::Sender<u64>>,
    queue: Arc<Queue>,
    /// The head as this store's group writer last left it.
    head: Arc<Head>,
    /// Opened `immutable`: see [`crate::AnyStore::is_snapshot`].
    snapshot: bool,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// One "appended" signal per database file in this process, so that every
/// store opened on the same file wakes every subscriber on it. Other
/// processes' appends are found by polling.
fn signal_for(path: &Path) -> Arc<watch::Sender<u64>> {
    static SIGNALS: OnceLock<Mutex<HashMap<PathBuf, Weak<watch::Sender<u64>>>>> = OnceLock::new();
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let mut map = SIGNALS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    map.retain(|_, w| w.strong_count() > 0);
    if let Some(existing) = map.get(&key).and_then(Weak::upgrade) {
        return existing;
    }
    let signal = Arc::new(watch::Sender::new(0));
    map.insert(key, Arc::downgrade(&signal));
    signal
}

fn now_micros() -> i64 {
    Utc::now().timestamp_micros()
}

fn from_micros(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or_default()
}

impl SqliteStore {
    /// The lease, when free or expired, or under `holder` again as `again`
    /// allows; one statement, so two callers under one name cannot both
    /// be granted it.
    async fn grant_lease(&self, holder: &str, ttl: Duration, again: crate::Again) -> Result<Lease> {
        if holder.is_empty() {
            return Err(StoreError::Invalid("empty lease holder".into()));
        }
        let ttl = ttl_millis(ttl)?;
        let (checked, epoch) = again.condition()?;
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let now = now_micros();
        let row = sqlx::query(
            "UPDATE es_control SET epoch = epoch + 1, holder = ?1, lease_expires_at = ?2
              WHERE id = 1 AND (lease_expires_at <= ?3 OR (holder = ?1 AND (NOT ?4 OR epoch = ?5)))
             RETURNING epoch, lease_expires_at, last_position",
        )
        .bind(holder)
        .bind(now + ttl * 1000)
        .bind(now)
        .bind(checked)
        .bind(epoch)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        match row {
            Some(r) => lease_row(&r, holder),
            None => Err(self.lease_info().await?.held()),
        }
    }

    /// See [`crate::AnyStore::fold_wal`]. A checkpoint another process
    /// keeps from finishing (a reader mid-read) leaves the rest in the WAL
    /// file, where the next open finds it.
    pub async fn fold_wal(&self) {
        // (busy, pages in the WAL, pages folded): busy when another
        // process's reader keeps it from finishing.
        let done = sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(TRUNCATE)")
            .fetch_one(&self.writer)
            .await;
        match done {
            Ok((0, _, _)) => {}
            Ok(_) => tracing::warn!(
                "another process is reading the log: its newest events stay in the write-ahead log beside the database file (llmgw.db-wal); copy both"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "could not fold the write-ahead log into the database file; it stays beside it")
            }
        }
    }

    pub async fn open(address: &StoreAddress, options: OpenOptions) -> Result<Self> {
        let StoreAddress::Sqlite(path) = address else {
            return Err(StoreError::BadAddress {
                address: address.redacted(),
                reason: "not a SQLite address".into(),
            });
        };
        if !options.create && !path.exists() {
            return Err(StoreError::NoSuchFile {
                address: address.redacted(),
            });
        }
        if options.create && !options.read_only {
            private_file(path).map_err(|e| StoreError::BadAddress {
                address: address.redacted(),
                reason: format!("cannot create the file: {e}"),
            })?;
        }
        let mut connect = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(options.create && !options.read_only)
            .read_only(options.read_only)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true)
            // A row deleted (an erased person, a swept conversation) is
            // overwritten with zeros, not left in the file's free space
            // for anyone with a copy of it to read.
            .pragma("secure_delete", "ON");
        // WAL (readers beside the writer) is set where a store is made or
        // migrated, and the file keeps it; any other open keeps the mode
        // the file has, so reading a copy does not rewrite it.
        if options.create || options.schema == Schema::Migrate {
            connect = connect.journal_mode(SqliteJournalMode::Wal);
        }
        // A WAL file read where its shared-memory file cannot be made (a
        // read-only directory, another user's) opens only as immutable:
        // safe while nothing lies beside it (no writer at work, no events
        // the file lacks); it is then read as it is now (`is_snapshot`).
        let snapshot = options.read_only && !wal_beside(path) && !reads_read_only(path).await;
        if snapshot {
            connect = connect.immutable(true);
        }
        let connect_err = |source| StoreError::Connect {
            address: address.redacted(),
            source,
        };
        // A local file needs no liveness ping before each use.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            // A COMMIT that fails for want of room (a full disk) leaves a
            // transaction SQLite has already rolled back, whose ROLLBACK
            // then fails, and sqlx goes on counting it as open: every later
            // BEGIN would be refused. Such a connection is closed (SQLite
            // rolls back whatever is left) and the next write opens a
            // fresh one. The ping first lets a rollback queued by a dropped
            // transaction finish.
            .after_release(|conn, _| {
                Box::pin(async move {
                    conn.ping().await?;
                    Ok(!conn.is_in_transaction())
                })
            })
            .connect_with(connect.clone())
            .await
            .map_err(connect_err)?;
        let reader = SqlitePoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .test_before_acquire(false)
            .connect_with(connect)
            .await
            .map_err(connect_err)?;
        let store = SqliteStore {
            writer,
            reader,
            address: address.clone(),
            upcasters: Arc::new(options.upcasters),
            poll_interval: options.poll_interval,
            hook: options.append_hook,
            appended: signal_for(path),
            queue: Arc::default(),
            head: Arc::default(),
            snapshot,
        };
        match options.schema {
            Schema::Migrate => {
                store.migrate().await?;
            }
            Schema::Require => store.check_schema().await?,
            Schema::Unchecked => {}
        }
        Ok(store)
    }

    /// The groups this store (and its clones) has written so far.
    pub fn group_stats(&self) -> crate::GroupStats {
        self.queue.stats()
    }

    /// See [`crate::AnyStore::is_snapshot`].
    pub fn is_snapshot(&self) -> bool {
        self.snapshot
    }

    /// The writer pool, for tests and tools that inspect the tables directly.
    pub fn pool(&self) -> &SqlitePool {
        &self.writer
    }

    /// The readers' pool, for tools that read the tables directly.
    pub fn read_pool(&self) -> &SqlitePool {
        &self.reader
    }

    async fn check_schema(&self) -> Result<()> {
        let tables: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master
              WHERE type = 'table' AND name IN ('es_control', 'es_schema_migrations')",
        )
        .fetch_one(&self.reader)
        .await?;
        if tables < 2 {
            return Err(StoreError::NotMigrated {
                address: self.address.redacted(),
            });
        }
        let found: Option<i64> =
            sqlx::query_scalar("SELECT max(version) FROM es_schema_migrations")
                .fetch_one(&self.reader)
                .await?;
        crate::migrate::check_current(llmgw_migrations::SQLITE, found, &self.address.redacted())
    }

    async fn hook(&self, point: AppendPoint) {
        if let Some(h) = &self.hook {
            h.at(point).await;
        }
    }
}

/// Whether a write-ahead log or its shared memory lies beside `path`: a
/// writer may be at work, or have left events the file lacks. Only a
/// file alone (a clean stop folds and removes both) is read immutable.
fn wal_beside(path: &std::path::Path) -> bool {
    ["-wal", "-shm"].iter().any(|end| {
        let mut beside = path.as_os_str().to_owned();
        beside.push(end);
        std::path::Path::new(&beside).exists()
    })
}

/// See [`crate::AnyStore::schema_state`]. Immutable while nothing lies
/// beside the file (no writer at work): `mode=ro` would make the `-wal`
/// and `-shm` files a WAL file's reader needs, and leave them. With a
/// `-wal` beside it (a server at work, or one that crashed), the events
/// and migrations in it count, so it is read through it.
pub(crate) async fn schema_state(
    address: &StoreAddress,
    path: &std::path::Path,
) -> Result<crate::SchemaState> {
    if !path.exists() {
        return Err(StoreError::NoSuchFile {
            address: address.redacted(),
        });
    }
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .immutable(!wal_beside(path))
        .busy_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|source| StoreError::Connect {
            address: address.redacted(),
            source,
        })?;
    let applied = applied_migrations(&mut conn).await;
    let _ = conn.close().await;
    crate::migrate::state(llmgw_migrations::SQLITE, &applied?.into_iter().collect())
}

/// Every applied migration's version and checksum; none where the table
/// is not there yet.
async fn applied_migrations(conn: &mut sqlx::SqliteConnection) -> Result<Vec<(i64, Vec<u8>)>> {
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master
          WHERE type = 'table' AND name = 'es_schema_migrations'",
    )
    .fetch_one(&mut *conn)
    .await?;
    if tables == 0 {
        return Ok(Vec::new());
    }
    Ok(
        sqlx::query_as("SELECT version, checksum FROM es_schema_migrations")
            .fetch_all(&mut *conn)
            .await?,
    )
}

/// Whether `path` can be read with `mode=ro` as it lies: a WAL file needs
/// its shared-memory file, which a read-only directory cannot take.
async fn reads_read_only(path: &std::path::Path) -> bool {
    let Ok(mut conn) = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .connect()
        .await
    else {
        return false;
    };
    let read = sqlx::query("SELECT count(*) FROM sqlite_master")
        .fetch_one(&mut conn)
        .await
        .is_ok();
    let _ = conn.close().await;
    read
}

/// Writes one chunk of an import inside its transaction, after checking
/// that it continues the store's streams and reuses none of its event ids.
async fn import_chunk(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    run: &mut Run,
    chunk: &[Pending],
) -> Result<()> {
    let ask = run.unknown_streams(chunk);
    if !ask.is_empty() {
        let found: Vec<(String, i64)> = sqlx::query_as(
            "SELECT stream_id, version FROM es_streams
              WHERE stream_id IN (SELECT value FROM json_each(?1))",
        )
        .bind(serde_json::to_string(&ask).expect("strings serialise"))
        .fetch_all(&mut **tx)
        .await?;
        run.learn_versions(ask, found.into_iter().map(|(s, v)| (s, v as u64)).collect());
    }
    run.check_versions(chunk)?;
    if run.store_had_events() {
        let ids: Vec<String> = chunk
            .iter()
            .map(|p| p.event.event_id.hyphenated().to_string())
            .collect();
        let existing: Vec<(String, i64)> = sqlx::query_as(
            "SELECT event_id, position FROM es_events
              WHERE event_id IN (SELECT value FROM json_each(?1))
              ORDER BY position LIMIT 1",
        )
        .bind(serde_json::to_string(&ids).expect("strings serialise"))
        .fetch_all(&mut **tx)
        .await?;
        let existing = existing
            .into_iter()
            .map(|(id, p)| Ok((parse_uuid(&id, p as u64)?, p as u64)))
            .collect::<Result<Vec<_>>>()?;
        Run::check_ids(chunk, &existing)?;
    }
    let mut rows = String::with_capacity(chunk.len() * 320);
    rows.push('[');
    for (i, p) in chunk.iter().enumerate() {
        if i > 0 {
            rows.push(',');
        }
        let e = &p.event;
        let cells = (
            to_i64(e.position, "position")?,
            &e.stream_id,
            to_i64(e.stream_version, "version")?,
            e.event_id,
            &e.event_type,
            e.schema_version,
            &p.payload,
            &p.metadata,
            to_i64(e.epoch, "epoch")?,
            e.recorded_at.timestamp_micros(),
            hash::to_hex(&e.hash),
        );
        rows.push_str(&serde_json::to_string(&cells).expect("plain values serialise"));
    }
    rows.push(']');
    sqlx::query(
        "INSERT INTO es_events (position, stream_id, stream_version, event_id, event_type,
             schema_version, payload, metadata, epoch, recorded_at, hash)
         SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4,
                value ->> 5, value ->> 6, value ->> 7, value ->> 8, value ->> 9,
                unhex(value ->> 10)
           FROM json_each(?1)",
    )
    .bind(rows)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn parse_uuid(text: &str, position: u64) -> Result<Uuid> {
    text.parse().map_err(|_| StoreError::Corrupt {
        position,
        reason: format!("bad event id {text:?}"),
    })
}

const SELECT_EVENT: &str = "SELECT position, stream_id, stream_version, event_id, event_type,
    schema_version, payload, metadata, epoch, recorded_at, hash FROM es_events";

fn event_row(r: &SqliteRow) -> Result<RecordedEvent> {
    let position = r.try_get::<i64, _>(0)? as u64;
    let json = |i: usize| -> Result<Value> {
        let text: &str = r.try_get(i)?;
        serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
            position,
            reason: e.to_string(),
        })
    };
    Ok(RecordedEvent {
        position,
        stream_id: r.try_get(1)?,
        stream_version: r.try_get::<i64, _>(2)? as u64,
        event_id: parse_uuid(r.try_get(3)?, position)?,
        event_type: r.try_get(4)?,
        schema_version: r.try_get::<i64, _>(5)? as u32,
        payload: json(6)?,
        metadata: json(7)?,
        epoch: r.try_get::<i64, _>(8)? as u64,
        recorded_at: from_micros(r.try_get(9)?),
        hash: hash::to_array(r.try_get::<&[u8], _>(10)?, position)?,
    })
}

fn lease_row(r: &SqliteRow, holder: &str) -> Result<Lease> {
    Ok(Lease {
        token: LeaseToken {
            holder: holder.to_owned(),
            epoch: r.try_get::<i64, _>(0)? as u64,
        },
        expires_at: from_micros(r.try_get(1)?),
        head_at_grant: r.try_get::<i64, _>(2)? as u64,
    })
}

impl GroupWriter for SqliteStore {
    fn queue(&self) -> &Queue {
        &self.queue
    }

    async fn hook_at(&self, point: AppendPoint) {
        self.hook(point).await
    }

    async fn write_group(&self, group: &[Prepared]) -> Result<Vec<Result<Appended>>> {
        self.hook(AppendPoint::BeforeFence).await;
        let mut conn = Writing(Some(self.writer.acquire().await?));
        let outcomes = write_group_on(self, conn.get(), group).await?;
        conn.done();
        Ok(outcomes)
    }
}

/// The writer connection while a group is written on it: the group's
/// transaction is begun and ended by the statements themselves (sqlx does
/// not count it as open), so a connection left half way (an error, the
/// task dropped) is closed, which rolls back whatever is open, rather than
/// handed back to the pool.
struct Writing(Option<sqlx::pool::PoolConnection<sqlx::Sqlite>>);

impl Writing {
    fn get(&mut self) -> &mut sqlx::SqliteConnection {
        self.0.as_mut().expect("the connection until done")
    }

    fn done(mut self) {
        self.0.take();
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.0 {
            conn.close_on_drop();
        }
    }
}

/// One group's transaction in two calls to the driver's thread: the lock
/// with the reads, then the writes with the commit. Each call is a hand-off
/// to that thread and back, and under load each hand-off waits for the
/// scheduler: with a call each for BEGIN, the reads, the writes and COMMIT,
/// those waits, not SQLite's work, were most of a small group's time
/// besides the flush.
async fn write_group_on(
    store: &SqliteStore,
    conn: &mut sqlx::SqliteConnection,
    group: &[Prepared],
) -> Result<Vec<Result<Appended>>> {
    if let Some(outcomes) = rows::fast(store, conn, group).await? {
        return Ok(outcomes);
    }
    let event_ids: Vec<String> = group
        .iter()
        .flat_map(|p| p.event_ids.iter().map(|id| id.hyphenated().to_string()))
        .collect();
    let stream_ids: Vec<&str> = group
        .iter()
        .flat_map(|p| p.stream_ids.iter().map(String::as_str))
        .collect();
    // BEGIN IMMEDIATE is the lock; then the control row (kind 2), the
    // group's event ids already in the log (0) and its streams' versions
    // (1), read under it.
    let rows = sqlx::query(
        "BEGIN IMMEDIATE;
         SELECT 2, holder, last_position, NULL, epoch, last_hash, lease_expires_at
           FROM es_control WHERE id = 1
         UNION ALL
         SELECT 0, event_id, position, stream_id, stream_version, NULL, NULL FROM es_events
          WHERE event_id IN (SELECT value FROM json_each(?1))
         UNION ALL
         SELECT 1, NULL, 0, stream_id, version, NULL, NULL FROM es_streams
          WHERE stream_id IN (SELECT value FROM json_each(?2))",
    )
    .bind(serde_json::to_string(&event_ids).expect("strings serialise"))
    .bind(serde_json::to_string(&stream_ids).expect("strings serialise"))
    .fetch_all(&mut *conn)
    .await?;
    // Taken with the lock held: the fences are checked against it.
    let now = now_micros();
    let mut lock = None;
    let mut existing = Vec::new();
    let mut versions = HashMap::new();
    for r in &rows {
        match r.try_get::<i64, _>(0)? {
            2 => {
                lock = Some(Locked {
                    position: r.try_get::<i64, _>(2)? as u64,
                    hash: hash::to_array(r.try_get::<&[u8], _>(5)?, 0)?,
                    epoch: r.try_get::<i64, _>(4)? as u64,
                    holder: r.try_get(1)?,
                    live: r.try_get::<i64, _>(6)? > now,
                    now: from_micros(now),
                })
            }
            0 => {
                let position = r.try_get::<i64, _>(2)? as u64;
                existing.push(Existing {
                    event_id: parse_uuid(r.try_get(1)?, position)?,
                    position,
                    stream_id: r.try_get(3)?,
                    stream_version: r.try_get::<i64, _>(4)? as u64,
                });
            }
            _ => {
                versions.insert(r.try_get(3)?, r.try_get::<i64, _>(4)? as u64);
            }
        }
    }
    let lock = lock.ok_or_else(|| StoreError::Corrupt {
        position: 0,
        reason: "the control row is missing".into(),
    })?;
    if group.iter().any(|p| lock.admits(&p.writer)) {
        store.hook(AppendPoint::AfterFence).await;
    }
    let planned = append::plan_group(group, &lock, &existing, &versions);
    if planned.rows.is_empty() {
        sqlx::query("ROLLBACK").execute(&mut *conn).await?;
        store.head.learn_locked(group, &lock, &versions, None);
        return Ok(planned.outcomes);
    }

    // The rows, the streams' versions, the head and the commit in one
    // trip, every value a parameter, in statements of a few fixed shapes
    // that stay prepared on the connection.
    // Unknown until the commit is answered.
    store.head.forget();
    rows::write(conn, &planned, lock.epoch, now).await?;
    store
        .head
        .learn_locked(group, &lock, &versions, Some(&planned));
    store.appended.send_replace(planned.head);
    Ok(planned.outcomes)
}

impl EventStore for SqliteStore {
    fn address(&self) -> &StoreAddress {
        &self.address
    }

    fn upcasters(&self) -> &Upcasters {
        &self.upcasters
    }

    fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    async fn migrate(&self) -> Result<Vec<i64>> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS es_schema_migrations (
                version    INTEGER PRIMARY KEY,
                name       TEXT    NOT NULL,
                checksum   BLOB    NOT NULL,
                applied_at INTEGER NOT NULL) STRICT",
        )
        .execute(&mut *tx)
        .await?;
        let applied: Vec<(i64, Vec<u8>)> =
            sqlx::query_as("SELECT version, checksum FROM es_schema_migrations ORDER BY version")
                .fetch_all(&mut *tx)
                .await?;
        let applied: HashMap<i64, Vec<u8>> = applied.into_iter().collect();
        let mut done = Vec::new();
        for (m, sum) in crate::migrate::pending(llmgw_migrations::SQLITE, &applied)? {
            sqlx::Executor::execute(&mut *tx, m.sql).await?;
            sqlx::query(
                "INSERT INTO es_schema_migrations (version, name, checksum, applied_at)
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .bind(m.version)
            .bind(m.name)
            .bind(sum)
            .bind(now_micros())
            .execute(&mut *tx)
            .await?;
            done.push(m.version);
        }
        tx.commit().await?;
        Ok(done)
    }

    async fn append(&self, writer: &Writer, batch: &[StreamAppend]) -> Result<Appended> {
        group::append(self, writer, batch).await
    }

    async fn read_text_page_raw(
        &self,
        after: u64,
        limit: usize,
        // The page is the text SQLite hands over: nothing to reuse.
        _reuse: TextPage,
    ) -> Result<TextPage> {
        // The whole page as one text value built by SQLite: the driver
        // copies every column of every row into its own allocation and hands
        // rows over one at a time, which costs more than reading them; one
        // value per page is one copy. See `page_text` for its format.
        let page: Option<String> = sqlx::query_scalar(
            "SELECT group_concat(
                        printf('%d %d %d %d %s %d %d %d ', position, stream_version,
                               schema_version, recorded_at, event_id, octet_length(event_type),
                               octet_length(stream_id), octet_length(payload))
                        || event_type || stream_id || payload, '')
               FROM (SELECT * FROM es_events WHERE position > ?1 ORDER BY position LIMIT ?2)",
        )
        .bind(to_i64(after, "position")?)
        .bind(limit as i64)
        .fetch_one(&self.reader)
        .await?;
        match page {
            Some(page) => page_text::parse(page, after),
            None => Ok(TextPage::default()),
        }
    }

    async fn read_all_raw(&self, after: u64, limit: usize) -> Result<Vec<RecordedEvent>> {
        let rows = sqlx::query(&format!(
            "{SELECT_EVENT} WHERE position > ?1 ORDER BY position LIMIT ?2"
        ))
        .bind(to_i64(after, "position")?)
        .bind(limit as i64)
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(event_row).collect()
    }

    async fn read_stream_raw(
        &self,
        stream_id: &str,
        after_version: u64,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>> {
        let rows = sqlx::query(&format!(
            "{SELECT_EVENT} WHERE stream_id = ?1 AND stream_version > ?2
             ORDER BY stream_version LIMIT ?3"
        ))
        .bind(stream_id)
        .bind(to_i64(after_version, "version")?)
        .bind(limit as i64)
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(event_row).collect()
    }

    async fn read_time_range_raw(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>> {
        let rows = sqlx::query(&format!(
            "{SELECT_EVENT} WHERE recorded_at >= ?1 AND recorded_at < ?2 AND position > ?3
             ORDER BY position LIMIT ?4"
        ))
        .bind(from.timestamp_micros())
        .bind(to.timestamp_micros())
        .bind(to_i64(after, "position")?)
        .bind(limit as i64)
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(event_row).collect()
    }

    async fn read_backward_raw(
        &self,
        filter: &EventFilter,
        positions: Range<u64>,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>> {
        let q = browse::backward(SELECT_EVENT, Dialect::Sqlite, filter, positions, limit)?;
        let mut query = sqlx::query(&q.sql);
        for arg in q.args {
            query = match arg {
                Arg::Text(t) => query.bind(t),
                Arg::Int(i) => query.bind(i),
                // SQLite times are bound as microseconds.
                Arg::Time(t) => query.bind(t.timestamp_micros()),
            };
        }
        let rows = query.fetch_all(&self.reader).await?;
        rows.iter().map(event_row).collect()
    }

    async fn head(&self) -> Result<(u64, [u8; 32])> {
        let row = sqlx::query("SELECT last_position, last_hash FROM es_control WHERE id = 1")
            .fetch_one(&self.reader)
            .await?;
        Ok((
            row.try_get::<i64, _>(0)? as u64,
            hash::to_array(row.try_get::<&[u8], _>(1)?, 0)?,
        ))
    }

    async fn base(&self) -> Result<(u64, [u8; 32])> {
        let row = sqlx::query("SELECT base_position, base_hash FROM es_control WHERE id = 1")
            .fetch_one(&self.reader)
            .await?;
        Ok((
            row.try_get::<i64, _>(0)? as u64,
            hash::to_array(row.try_get::<&[u8], _>(1)?, 0)?,
        ))
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
        // BEGIN IMMEDIATE is the lock; the fence is checked right after it.
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let row = sqlx::query(
            "SELECT last_position, last_hash, base_position, base_hash FROM es_control
              WHERE id = 1 AND epoch = ?1 AND holder = ?2 AND lease_expires_at > ?3",
        )
        .bind(to_i64(token.epoch, "epoch")?)
        .bind(&token.holder)
        .bind(now_micros())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            tx.rollback().await?;
            return Err(self.lease_info().await?.fenced());
        };
        let mut run = Run::new(
            StoreHead {
                position: row.try_get::<i64, _>(0)? as u64,
                hash: hash::to_array(row.try_get::<&[u8], _>(1)?, 0)?,
                base: row.try_get::<i64, _>(2)? as u64,
                base_hash: hash::to_array(row.try_get::<&[u8], _>(3)?, 0)?,
            },
            options,
        );
        let mut chunk = Vec::with_capacity(CHUNK);
        let mut bytes = 0;
        for event in events {
            if let Some(p) = run.accept(event?)? {
                bytes += p.bytes();
                chunk.push(p);
            }
            if chunk_full(&chunk, bytes) {
                import_chunk(&mut tx, &mut run, &chunk).await?;
                chunk.clear();
                bytes = 0;
            }
        }
        if !chunk.is_empty() {
            import_chunk(&mut tx, &mut run, &chunk).await?;
        }
        if let Some(at) = run.finish()? {
            let stored: Option<Vec<u8>> =
                sqlx::query_scalar("SELECT hash FROM es_events WHERE position = ?1")
                    .bind(to_i64(at.0, "position")?)
                    .fetch_optional(&mut *tx)
                    .await?;
            let stored = stored.map(|h| hash::to_array(&h, at.0)).transpose()?;
            run.check_stored(at, stored)?;
        }
        let control = run.control();
        if let Some(c) = control {
            let streams: Vec<Value> = run
                .stream_versions()
                .into_iter()
                .map(|(s, v)| Value::Array(vec![s.into(), v.into()]))
                .collect();
            sqlx::query(
                "INSERT INTO es_streams (stream_id, version)
                 SELECT value ->> 0, value ->> 1 FROM json_each(?1) WHERE true
                 ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version",
            )
            .bind(Value::Array(streams).to_string())
            .execute(&mut *tx)
            .await?;
            // The importer's lease ends if the epoch moves past it.
            sqlx::query(
                "UPDATE es_control
                    SET last_position = ?1, last_hash = ?2,
                        lease_expires_at = CASE WHEN ?3 > epoch THEN ?6 ELSE lease_expires_at END,
                        epoch = max(epoch, ?3),
                        base_position = coalesce(?4, base_position),
                        base_hash = coalesce(?5, base_hash)
                  WHERE id = 1",
            )
            .bind(to_i64(c.head, "position")?)
            .bind(c.head_hash.as_slice())
            .bind(to_i64(c.epoch, "epoch")?)
            .bind(c.base.map(|(p, _)| p as i64))
            .bind(c.base.map(|(_, h)| h.to_vec()))
            .bind(now_micros())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        if let Some(c) = control {
            self.appended.send_replace(c.head);
        }
        Ok(run.imported())
    }

    async fn stats(&self) -> Result<Stats> {
        let by_type: Vec<(String, i64)> = sqlx::query_as(
            "SELECT event_type, count(*) FROM es_events GROUP BY event_type ORDER BY 2 DESC, 1",
        )
        .fetch_all(&self.reader)
        .await?;
        let streams: i64 = sqlx::query_scalar("SELECT count(*) FROM es_streams")
            .fetch_one(&self.reader)
            .await?;
        let (head, _) = self.head().await?;
        Ok(Stats::from_counts(by_type, streams, head))
    }

    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> Result<Lease> {
        self.grant_lease(holder, ttl, crate::Again::AnyEpoch).await
    }

    async fn take_lease(&self, holder: &str, ttl: Duration, mine: Option<u64>) -> Result<Lease> {
        self.grant_lease(holder, ttl, crate::Again::At(mine)).await
    }

    async fn renew_lease(&self, token: &LeaseToken, ttl: Duration) -> Result<Lease> {
        let ttl = ttl_millis(ttl)?;
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let now = now_micros();
        let row = sqlx::query(
            "UPDATE es_control SET lease_expires_at = ?3
              WHERE id = 1 AND epoch = ?1 AND holder = ?2 AND lease_expires_at > ?4
             RETURNING epoch, lease_expires_at, last_position",
        )
        .bind(to_i64(token.epoch, "epoch")?)
        .bind(&token.holder)
        .bind(now + ttl * 1000)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        match row {
            Some(r) => lease_row(&r, &token.holder),
            None => Err(self.lease_info().await?.fenced()),
        }
    }

    async fn release_lease(&self, token: &LeaseToken) -> Result<bool> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let now = now_micros();
        let done = sqlx::query(
            "UPDATE es_control SET lease_expires_at = ?3
              WHERE id = 1 AND epoch = ?1 AND holder = ?2 AND lease_expires_at > ?3",
        )
        .bind(to_i64(token.epoch, "epoch")?)
        .bind(&token.holder)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    async fn lease_info(&self) -> Result<LeaseInfo> {
        let (holder, epoch, expires, head): (Option<String>, i64, i64, i64) = sqlx::query_as(
            "SELECT holder, epoch, lease_expires_at, last_position FROM es_control WHERE id = 1",
        )
        .fetch_one(&self.reader)
        .await?;
        Ok(LeaseInfo {
            holder,
            epoch: epoch as u64,
            expires_at: (expires != 0).then(|| from_micros(expires)),
            held: expires > now_micros(),
            head: head as u64,
        })
    }

    async fn save_checkpoint(&self, name: &str, checkpoint: &Checkpoint) -> Result<()> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "INSERT INTO es_checkpoints (name, position, event_id, updated_at)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (name) DO UPDATE
                SET position = excluded.position, event_id = excluded.event_id,
                    updated_at = excluded.updated_at",
        )
        .bind(name)
        .bind(to_i64(checkpoint.position, "position")?)
        .bind(checkpoint.event_id.map(|id| id.hyphenated().to_string()))
        .bind(now_micros())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn load_checkpoint(&self, name: &str) -> Result<Option<Checkpoint>> {
        let row: Option<(i64, Option<String>)> =
            sqlx::query_as("SELECT position, event_id FROM es_checkpoints WHERE name = ?1")
                .bind(name)
                .fetch_optional(&self.reader)
                .await?;
        row.map(|(position, event_id)| {
            Ok(Checkpoint {
                position: position as u64,
                event_id: event_id
                    .map(|id| parse_uuid(&id, position as u64))
                    .transpose()?,
            })
        })
        .transpose()
    }

    async fn save_snapshot(&self, name: &str, snapshot: Snapshot) -> Result<()> {
        // Before the write lock: appends must not queue behind compression.
        let packed = crate::snapshot_zip::pack(snapshot.state).await?;
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "INSERT INTO es_snapshots (name, position, event_id, state_version, state, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (name) DO UPDATE
                SET position = excluded.position, event_id = excluded.event_id,
                    state_version = excluded.state_version, state = excluded.state,
                    updated_at = excluded.updated_at",
        )
        .bind(name)
        .bind(to_i64(snapshot.checkpoint.position, "position")?)
        .bind(
            snapshot
                .checkpoint
                .event_id
                .map(|id| id.hyphenated().to_string()),
        )
        .bind(i64::from(snapshot.state_version))
        .bind(packed)
        .bind(now_micros())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn load_snapshot(&self, name: &str) -> Result<Option<Snapshot>> {
        let row: Option<(i64, Option<String>, i64, Vec<u8>)> = sqlx::query_as(
            "SELECT position, event_id, state_version, state FROM es_snapshots WHERE name = ?1",
        )
        .bind(name)
        .fetch_optional(&self.reader)
        .await?;
        let Some((position, event_id, state_version, packed)) = row else {
            return Ok(None);
        };
        let Some(state) = crate::snapshot_zip::unpack(name, packed).await? else {
            return Ok(None);
        };
        let position = position as u64;
        Ok(Some(Snapshot {
            checkpoint: Checkpoint {
                position,
                event_id: event_id.map(|id| parse_uuid(&id, position)).transpose()?,
            },
            state_version: state_version as u32,
            state,
        }))
    }

    async fn wakeups(&self) -> Result<Wakeups> {
        Ok(Wakeups::Local(self.appended.subscribe()))
    }
}

/// Makes the store's file, if it is not there, readable by its owner
/// alone: it holds people's emails and password hashes, and the
/// conversations kept, and SQLite made it as the umask said (0644
/// usually, any local user's to read). SQLite gives its `-wal` and `-shm`
/// files the database file's mode.
fn private_file(path: &std::path::Path) -> std::io::Result<()> {
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    match open.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}
