//! The PostgreSQL backend. See the crate docs for why every append goes
//! through the one `es_control` row.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, Row};
use uuid::Uuid;

use crate::append::{self, Existing, Locked, Planned, Prepared};
use crate::browse::{self, Arg, Dialect};
use crate::group::{self, GroupWriter, Parked, Queue};
use crate::import::{CHUNK, Pending, Run, StoreHead, chunk_full};
use crate::known::Head;
use crate::{
    AppendHook, AppendPoint, Appended, Checkpoint, EventFilter, EventStore, ImportOptions,
    Imported, Lease, LeaseInfo, LeaseToken, OpenOptions, RecordedEvent, Result, Schema, Snapshot,
    Stats, StoreAddress, StoreError, StreamAppend, TextPage, Upcasters, Wakeups, Writer, hash,
    to_i64, ttl_millis,
};

mod fast;

const CHANNEL: &str = "es_appended";
/// Serialises concurrent `migrate` calls across processes.
const MIGRATION_LOCK: i64 = 0x6c6c_6d67_7700_0001;

#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    address: StoreAddress,
    upcasters: Arc<Upcasters>,
    poll_interval: Duration,
    hook: Option<Arc<dyn AppendHook>>,
    queue: Arc<Queue>,
    writer: Arc<Parked<sqlx::Postgres>>,
    head: Arc<Head>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// The lease, when free or expired, or under `holder` again as `again`
    /// allows; one statement, so two callers under one name cannot both
    /// be granted it.
    async fn grant_lease(&self, holder: &str, ttl: Duration, again: crate::Again) -> Result<Lease> {
        if holder.is_empty() {
            return Err(StoreError::Invalid("empty lease holder".into()));
        }
        let ttl = ttl_millis(ttl)?;
        let (checked, epoch) = again.condition()?;
        let row = sqlx::query(
            "UPDATE es_control
                SET epoch = epoch + 1, holder = $1,
                    lease_expires_at = clock_timestamp() + $2 * interval '1 millisecond'
              WHERE id = 1 AND (lease_expires_at <= clock_timestamp()
                                OR (holder = $1 AND (NOT $3 OR epoch = $4)))
             RETURNING epoch, lease_expires_at, last_position",
        )
        .bind(holder)
        .bind(ttl)
        .bind(checked)
        .bind(epoch)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(r) => lease_row(&r, holder),
            None => Err(self.lease_info().await?.held()),
        }
    }

    pub async fn open(address: &StoreAddress, options: OpenOptions) -> Result<Self> {
        let StoreAddress::Postgres(url) = address else {
            return Err(StoreError::BadAddress {
                address: address.redacted(),
                reason: "not a postgres:// address".into(),
            });
        };
        let mut connect = url
            .parse::<PgConnectOptions>()
            .map_err(|e| StoreError::BadAddress {
                address: address.redacted(),
                reason: e.to_string(),
            })?
            .application_name("llmgw")
            // A writer waits this long for the control row before giving up
            // with a transient error rather than hanging. Notices stay on
            // the server: the schema's `IF NOT EXISTS` on every start
            // otherwise logs "already exists, skipping" at INFO.
            .options([("lock_timeout", "5s"), ("client_min_messages", "warning")]);
        if options.read_only {
            // Reading: a write, were one tried, is refused by the server.
            connect = connect.options([("default_transaction_read_only", "on")]);
        }
        // One connection up front, so that a wrong host, password or
        // database name is reported as such rather than as a pool timeout.
        let connect_err = |source| StoreError::Connect {
            address: address.redacted(),
            source,
        };
        sqlx::PgConnection::connect_with(&connect)
            .await
            .map_err(connect_err)?
            .close()
            .await
            .ok();
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(connect);
        let store = PgStore {
            pool,
            address: address.clone(),
            upcasters: Arc::new(options.upcasters),
            poll_interval: options.poll_interval,
            hook: options.append_hook,
            queue: Arc::default(),
            writer: Arc::default(),
            head: Arc::default(),
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

    /// The pool, for tests and tools that inspect the tables directly.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn check_schema(&self) -> Result<()> {
        let row = sqlx::query(
            "SELECT to_regclass('es_control') IS NOT NULL,
                    to_regclass('es_schema_migrations') IS NOT NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        if !row.try_get::<bool, _>(0)? || !row.try_get::<bool, _>(1)? {
            return Err(StoreError::NotMigrated {
                address: self.address.redacted(),
            });
        }
        let found: Option<i64> =
            sqlx::query_scalar("SELECT max(version) FROM es_schema_migrations")
                .fetch_one(&self.pool)
                .await?;
        crate::migrate::check_current(llmgw_migrations::POSTGRES, found, &self.address.redacted())
    }

    /// See [`crate::AnyStore::schema_state`].
    pub(crate) async fn schema_state(&self) -> Result<crate::SchemaState> {
        let exists: bool =
            sqlx::query_scalar("SELECT to_regclass('es_schema_migrations') IS NOT NULL")
                .fetch_one(&self.pool)
                .await?;
        let applied: Vec<(i64, Vec<u8>)> = if exists {
            sqlx::query_as("SELECT version, checksum FROM es_schema_migrations")
                .fetch_all(&self.pool)
                .await?
        } else {
            Vec::new()
        };
        crate::migrate::state(llmgw_migrations::POSTGRES, &applied.into_iter().collect())
    }

    async fn hook(&self, point: AppendPoint) {
        if let Some(h) = &self.hook {
            h.at(point).await;
        }
    }
}

/// Writes one chunk of an import inside its transaction, after checking
/// that it continues the store's streams and reuses none of its event ids.
async fn import_chunk(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    run: &mut Run,
    chunk: &[Pending],
) -> Result<()> {
    let ask = run.unknown_streams(chunk);
    if !ask.is_empty() {
        let found: Vec<(String, i64)> =
            sqlx::query_as("SELECT stream_id, version FROM es_streams WHERE stream_id = ANY($1)")
                .bind(&ask)
                .fetch_all(&mut **tx)
                .await?;
        run.learn_versions(ask, found.into_iter().map(|(s, v)| (s, v as u64)).collect());
    }
    run.check_versions(chunk)?;
    if run.store_had_events() {
        let ids: Vec<Uuid> = chunk.iter().map(|p| p.event.event_id).collect();
        let existing: Vec<(Uuid, i64)> = sqlx::query_as(
            "SELECT event_id, position FROM es_events WHERE event_id = ANY($1)
              ORDER BY position LIMIT 1",
        )
        .bind(&ids)
        .fetch_all(&mut **tx)
        .await?;
        let existing: Vec<(Uuid, u64)> = existing.into_iter().map(|(i, p)| (i, p as u64)).collect();
        Run::check_ids(chunk, &existing)?;
    }
    let n = chunk.len();
    let mut positions = Vec::with_capacity(n);
    let mut streams = Vec::with_capacity(n);
    let mut versions = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    let mut schema_versions = Vec::with_capacity(n);
    let mut epochs = Vec::with_capacity(n);
    let mut times = Vec::with_capacity(n);
    let mut hashes = Vec::with_capacity(n);
    for p in chunk {
        let e = &p.event;
        positions.push(to_i64(e.position, "position")?);
        streams.push(e.stream_id.as_str());
        versions.push(to_i64(e.stream_version, "version")?);
        ids.push(e.event_id);
        types.push(e.event_type.as_str());
        schema_versions.push(i32::try_from(e.schema_version).map_err(|_| {
            StoreError::ImportRefused(format!(
                "position {}: schema version out of range",
                e.position
            ))
        })?);
        epochs.push(to_i64(e.epoch, "epoch")?);
        // The chain covers whole microseconds; PostgreSQL would round.
        times.push(append::micros(e.recorded_at));
        hashes.push(e.hash.as_slice());
    }
    let payloads: Vec<&str> = chunk.iter().map(|p| p.payload.as_str()).collect();
    let metadata: Vec<&str> = chunk.iter().map(|p| p.metadata.as_str()).collect();
    sqlx::query(
        "INSERT INTO es_events (position, stream_id, stream_version, event_id, event_type,
             schema_version, payload, metadata, epoch, recorded_at, hash)
         SELECT p, s, v, i, t, sv, pl::jsonb, md::jsonb, ep, ra, h
           FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::uuid[], $5::text[],
                       $6::int[], $7::text[], $8::text[], $9::bigint[], $10::timestamptz[],
                       $11::bytea[])
                AS u(p, s, v, i, t, sv, pl, md, ep, ra, h)",
    )
    .bind(&positions)
    .bind(&streams)
    .bind(&versions)
    .bind(&ids)
    .bind(&types)
    .bind(&schema_versions)
    .bind(&payloads)
    .bind(&metadata)
    .bind(&epochs)
    .bind(&times)
    .bind(&hashes)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

const SELECT_EVENT: &str = "SELECT position, stream_id, stream_version, event_id, event_type,
    schema_version, payload::text, metadata::text, epoch, recorded_at, hash FROM es_events";

fn event_row(r: &PgRow) -> Result<RecordedEvent> {
    let position = r.try_get::<i64, _>(0)? as u64;
    let json = |i: usize| -> Result<serde_json::Value> {
        let text: String = r.try_get(i)?;
        serde_json::from_str(&text).map_err(|e| StoreError::Corrupt {
            position,
            reason: e.to_string(),
        })
    };
    Ok(RecordedEvent {
        position,
        stream_id: r.try_get(1)?,
        stream_version: r.try_get::<i64, _>(2)? as u64,
        event_id: r.try_get(3)?,
        event_type: r.try_get(4)?,
        schema_version: r.try_get::<i32, _>(5)? as u32,
        payload: json(6)?,
        metadata: json(7)?,
        epoch: r.try_get::<i64, _>(8)? as u64,
        recorded_at: r.try_get(9)?,
        hash: hash::to_array(r.try_get::<&[u8], _>(10)?, position)?,
    })
}

/// A connection reading a COPY: if the read stops half way (an error, or
/// the reader dropped), the rest of the data is still on its way, so the
/// connection is closed rather than handed back to the pool in that state.
struct Copying(Option<sqlx::pool::PoolConnection<sqlx::Postgres>>);

impl Copying {
    fn done(mut self) {
        self.0.take();
    }
}

impl Drop for Copying {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.0 {
            conn.close_on_drop();
        }
    }
}

fn lease_row(r: &PgRow, holder: &str) -> Result<Lease> {
    Ok(Lease {
        token: LeaseToken {
            holder: holder.to_owned(),
            epoch: r.try_get::<i64, _>(0)? as u64,
        },
        expires_at: r.try_get(1)?,
        head_at_grant: r.try_get::<i64, _>(2)? as u64,
    })
}

impl GroupWriter for PgStore {
    fn queue(&self) -> &Queue {
        &self.queue
    }

    async fn hook_at(&self, point: AppendPoint) {
        self.hook(point).await
    }

    async fn write_group(&self, group: &[Prepared]) -> Result<Vec<Result<Appended>>> {
        let (mut conn, parked) = self.writer.take(&self.pool).await?;
        let mut result = write_group_on(self, &mut conn, group).await;
        if parked && matches!(&result, Err(StoreError::Database(sqlx::Error::Io(_)))) {
            // The kept connection died while it waited (a restart, a cut
            // link): the pool would have noticed on acquire, so ask it.
            conn.close_on_drop();
            conn = self.pool.acquire().await?;
            result = write_group_on(self, &mut conn, group).await;
        }
        match &result {
            // Kept only where the pool has others for everything else.
            Ok(_) if self.pool.options().get_max_connections() > 1 => self.writer.park(conn),
            Ok(_) => {}
            // In whatever state it was left: not back into the pool.
            Err(_) => conn.close_on_drop(),
        }
        result
    }
}

/// One group on `conn`: in one statement if the head is as this store left
/// it, else in the careful transaction.
async fn write_group_on(
    store: &PgStore,
    conn: &mut PgConnection,
    group: &[Prepared],
) -> Result<Vec<Result<Appended>>> {
    if let Some(outcomes) = fast::write(store, conn, group).await? {
        return Ok(outcomes);
    }
    write_group_locked(store, conn, group).await
}

/// One group's transaction on `conn`, reading under the control row's lock
/// everything its plan needs.
async fn write_group_locked(
    store: &PgStore,
    conn: &mut PgConnection,
    group: &[Prepared],
) -> Result<Vec<Result<Appended>>> {
    let mut tx = conn.begin().await?;
    store.hook(AppendPoint::BeforeFence).await;
    let event_ids: Vec<Uuid> = group
        .iter()
        .flat_map(|p| p.event_ids.iter().copied())
        .collect();
    let stream_ids: Vec<&str> = group
        .iter()
        .flat_map(|p| p.stream_ids.iter().map(String::as_str))
        .collect();
    // Lock the control row and read the lease with it: each request's
    // fence is checked against this row while the lock is held, so a
    // takeover either committed before (and the row shows it) or waits for
    // this transaction to end. The lookups of the group's event ids and
    // streams ride in the same statement, but read its snapshot, taken
    // before the lock was granted: `seen` (the head in that snapshot) says
    // whether another writer committed in between, and only then are they
    // read again.
    let row = sqlx::query(
        "SELECT c.last_position, c.last_hash, c.epoch, c.holder, c.live, c.now,
                (SELECT last_position FROM es_control WHERE id = 1),
                (SELECT json_agg(json_build_array(event_id, position, stream_id, stream_version))
                   FROM es_events WHERE event_id = ANY($1))::text,
                (SELECT json_agg(json_build_array(stream_id, version))
                   FROM es_streams WHERE stream_id = ANY($2))::text
           FROM (SELECT last_position, last_hash, epoch, holder,
                        lease_expires_at > clock_timestamp() AS live, clock_timestamp() AS now
                   FROM es_control WHERE id = 1 FOR UPDATE) AS c",
    )
    .bind(&event_ids)
    .bind(&stream_ids)
    .fetch_one(&mut *tx)
    .await?;
    let lock = Locked {
        position: row.try_get::<i64, _>(0)? as u64,
        hash: hash::to_array(row.try_get::<&[u8], _>(1)?, 0)?,
        epoch: row.try_get::<i64, _>(2)? as u64,
        holder: row.try_get(3)?,
        live: row.try_get(4)?,
        now: append::micros(row.try_get::<DateTime<Utc>, _>(5)?),
    };
    if group.iter().any(|p| lock.admits(&p.writer)) {
        store.hook(AppendPoint::AfterFence).await;
    }
    let (existing, versions) = if row.try_get::<i64, _>(6)? as u64 == lock.position {
        found(
            lock.position,
            row.try_get::<Option<String>, _>(7)?,
            row.try_get::<Option<String>, _>(8)?,
        )?
    } else {
        let row = sqlx::query(
            "SELECT (SELECT json_agg(json_build_array(event_id, position, stream_id, stream_version))
                       FROM es_events WHERE event_id = ANY($1))::text,
                    (SELECT json_agg(json_build_array(stream_id, version))
                       FROM es_streams WHERE stream_id = ANY($2))::text",
        )
        .bind(&event_ids)
        .bind(&stream_ids)
        .fetch_one(&mut *tx)
        .await?;
        found(lock.position, row.try_get(0)?, row.try_get(1)?)?
    };
    let planned = append::plan_group(group, &lock, &existing, &versions);
    if planned.rows.is_empty() {
        tx.rollback().await?;
        store.head.learn_locked(group, &lock, &versions, None);
        return Ok(planned.outcomes);
    }
    let c = Columns::of(&planned);
    sqlx::query(
        "WITH ev AS (
            INSERT INTO es_events (position, stream_id, stream_version, event_id, event_type,
                schema_version, payload, metadata, epoch, recorded_at, hash)
            SELECT p, s, v, i, t, sv, pl::jsonb, md::jsonb, $10, $11, h
            FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::uuid[], $5::text[],
                        $6::int[], $7::text[], $8::text[], $9::bytea[])
                 AS u(p, s, v, i, t, sv, pl, md, h)
         ), st AS (
            INSERT INTO es_streams (stream_id, version)
            SELECT * FROM unnest($12::text[], $13::bigint[])
            ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version
         ), ctl AS (
            UPDATE es_control SET last_position = $14, last_hash = $15 WHERE id = 1
         )
         SELECT pg_notify($16, $14::text)",
    )
    .bind(&c.positions)
    .bind(&c.streams)
    .bind(&c.stream_versions)
    .bind(&c.ids)
    .bind(&c.types)
    .bind(&c.schema_versions)
    .bind(&c.payloads)
    .bind(&c.metadata)
    .bind(&c.hashes)
    .bind(lock.epoch as i64)
    .bind(lock.now)
    .bind(&c.touched)
    .bind(&c.touched_versions)
    .bind(planned.head as i64)
    .bind(planned.head_hash.as_slice())
    .bind(CHANNEL)
    .execute(&mut *tx)
    .await?;
    drop(c);
    store.head.forget();
    tx.commit().await?;
    store
        .head
        .learn_locked(group, &lock, &versions, Some(&planned));
    Ok(planned.outcomes)
}

/// A group's rows and streams as the arrays its insert takes.
struct Columns<'p> {
    positions: Vec<i64>,
    streams: Vec<&'p str>,
    stream_versions: Vec<i64>,
    ids: Vec<Uuid>,
    types: Vec<&'p str>,
    schema_versions: Vec<i32>,
    payloads: Vec<&'p str>,
    metadata: Vec<&'p str>,
    hashes: Vec<&'p [u8]>,
    touched: Vec<&'p str>,
    touched_versions: Vec<i64>,
}

impl<'p> Columns<'p> {
    fn of(planned: &'p Planned<'_>) -> Columns<'p> {
        let n = planned.rows.len();
        let mut c = Columns {
            positions: Vec::with_capacity(n),
            streams: Vec::with_capacity(n),
            stream_versions: Vec::with_capacity(n),
            ids: Vec::with_capacity(n),
            types: Vec::with_capacity(n),
            schema_versions: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            metadata: Vec::with_capacity(n),
            hashes: Vec::with_capacity(n),
            touched: Vec::new(),
            touched_versions: Vec::new(),
        };
        for r in &planned.rows {
            c.positions.push(r.position as i64);
            c.streams.push(r.stream_id);
            c.stream_versions.push(r.stream_version as i64);
            c.ids.push(r.event.event_id);
            c.types.push(r.event.event_type.as_str());
            c.schema_versions.push(r.event.schema_version as i32);
            c.payloads.push(r.event.payload.as_str());
            c.metadata.push(r.event.metadata.as_str());
            c.hashes.push(r.hash.as_slice());
        }
        (c.touched, c.touched_versions) = planned
            .stream_versions
            .iter()
            .map(|(s, v)| (*s, *v as i64))
            .unzip();
        c
    }
}

/// The group's events already in the log and its streams' versions, from
/// the lookup's JSON (`None`: nothing found).
fn found(
    position: u64,
    events: Option<String>,
    streams: Option<String>,
) -> Result<(Vec<Existing>, HashMap<String, u64>)> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt {
        position,
        reason: format!("append lookup: {e}"),
    };
    let events: Vec<(Uuid, u64, String, u64)> = match events {
        Some(text) => serde_json::from_str(&text).map_err(corrupt)?,
        None => Vec::new(),
    };
    let streams: Vec<(String, u64)> = match streams {
        Some(text) => serde_json::from_str(&text).map_err(corrupt)?,
        None => Vec::new(),
    };
    let existing = events
        .into_iter()
        .map(|(event_id, position, stream_id, stream_version)| Existing {
            event_id,
            position,
            stream_id,
            stream_version,
        })
        .collect();
    Ok((existing, streams.into_iter().collect()))
}

impl EventStore for PgStore {
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
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        // Transaction-scoped, so an error cannot leave the lock behind.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS es_schema_migrations (
                version    bigint      PRIMARY KEY,
                name       text        NOT NULL,
                checksum   bytea       NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT clock_timestamp())",
        )
        .execute(&mut *tx)
        .await?;
        let applied: Vec<(i64, Vec<u8>)> =
            sqlx::query_as("SELECT version, checksum FROM es_schema_migrations ORDER BY version")
                .fetch_all(&mut *tx)
                .await?;
        let applied: HashMap<i64, Vec<u8>> = applied.into_iter().collect();
        let mut done = Vec::new();
        for (m, sum) in crate::migrate::pending(llmgw_migrations::POSTGRES, &applied)? {
            sqlx::Executor::execute(&mut *tx, m.sql).await?;
            sqlx::query(
                "INSERT INTO es_schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            )
            .bind(m.version)
            .bind(m.name)
            .bind(sum)
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
        reuse: TextPage,
    ) -> Result<TextPage> {
        use futures_util::TryStreamExt;
        // The page as binary COPY (see `copy_binary`), taken apart while the
        // server is still sending it.
        let statement = crate::copy_binary::statement(to_i64(after, "position")?, limit);
        let mut parser = crate::copy_binary::Parser::new(after, limit, reuse);
        let mut copying = Copying(Some(self.pool.acquire().await?));
        {
            let conn = copying.0.as_deref_mut().ok_or(StoreError::Interrupted)?;
            let mut data = conn.copy_out_raw(&statement).await?;
            while let Some(chunk) = data.try_next().await? {
                parser.feed(&chunk)?;
            }
        }
        copying.done();
        parser.finish()
    }

    async fn read_all_raw(&self, after: u64, limit: usize) -> Result<Vec<RecordedEvent>> {
        let rows = sqlx::query(&format!(
            "{SELECT_EVENT} WHERE position > $1 ORDER BY position LIMIT $2"
        ))
        .bind(to_i64(after, "position")?)
        .bind(limit as i64)
        .fetch_all(&self.pool)
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
            "{SELECT_EVENT} WHERE stream_id = $1 AND stream_version > $2
             ORDER BY stream_version LIMIT $3"
        ))
        .bind(stream_id)
        .bind(to_i64(after_version, "version")?)
        .bind(limit as i64)
        .fetch_all(&self.pool)
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
            "{SELECT_EVENT} WHERE recorded_at >= $1 AND recorded_at < $2 AND position > $3
             ORDER BY position LIMIT $4"
        ))
        .bind(from)
        .bind(to)
        .bind(to_i64(after, "position")?)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(event_row).collect()
    }

    async fn read_backward_raw(
        &self,
        filter: &EventFilter,
        positions: Range<u64>,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>> {
        let q = browse::backward(SELECT_EVENT, Dialect::Postgres, filter, positions, limit)?;
        let mut query = sqlx::query(&q.sql);
        for arg in q.args {
            query = match arg {
                Arg::Text(t) => query.bind(t),
                Arg::Int(i) => query.bind(i),
                Arg::Time(t) => query.bind(t),
            };
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(event_row).collect()
    }

    async fn head(&self) -> Result<(u64, [u8; 32])> {
        let row = sqlx::query("SELECT last_position, last_hash FROM es_control WHERE id = 1")
            .fetch_one(&self.pool)
            .await?;
        Ok((
            row.try_get::<i64, _>(0)? as u64,
            hash::to_array(row.try_get::<&[u8], _>(1)?, 0)?,
        ))
    }

    async fn base(&self) -> Result<(u64, [u8; 32])> {
        let row = sqlx::query("SELECT base_position, base_hash FROM es_control WHERE id = 1")
            .fetch_one(&self.pool)
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
        let mut tx = self.pool.begin().await?;
        // The append's fence, and the lock that keeps every other writer
        // out until the import commits or rolls back.
        let row = sqlx::query(
            "SELECT last_position, last_hash, base_position, base_hash FROM es_control
              WHERE id = 1 AND epoch = $1 AND holder = $2
                AND lease_expires_at > clock_timestamp()
             FOR UPDATE",
        )
        .bind(to_i64(token.epoch, "epoch")?)
        .bind(&token.holder)
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
                sqlx::query_scalar("SELECT hash FROM es_events WHERE position = $1")
                    .bind(to_i64(at.0, "position")?)
                    .fetch_optional(&mut *tx)
                    .await?;
            let stored = stored.map(|h| hash::to_array(&h, at.0)).transpose()?;
            run.check_stored(at, stored)?;
        }
        if let Some(c) = run.control() {
            let (streams, versions): (Vec<String>, Vec<i64>) = run
                .stream_versions()
                .into_iter()
                .map(|(s, v)| (s, v as i64))
                .unzip();
            // The importer's lease ends if the epoch moves past it.
            sqlx::query(
                "WITH st AS (
                    INSERT INTO es_streams (stream_id, version)
                    SELECT * FROM unnest($1::text[], $2::bigint[])
                    ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version
                 ), ctl AS (
                    UPDATE es_control
                       SET last_position = $3, last_hash = $4,
                           lease_expires_at = CASE WHEN $5 > epoch THEN clock_timestamp()
                                                   ELSE lease_expires_at END,
                           epoch = GREATEST(epoch, $5),
                           base_position = COALESCE($6, base_position),
                           base_hash = COALESCE($7, base_hash)
                     WHERE id = 1
                 )
                 SELECT pg_notify($8, $3::text)",
            )
            .bind(&streams)
            .bind(&versions)
            .bind(to_i64(c.head, "position")?)
            .bind(c.head_hash.as_slice())
            .bind(to_i64(c.epoch, "epoch")?)
            .bind(c.base.map(|(p, _)| p as i64))
            .bind(c.base.map(|(_, h)| h.to_vec()))
            .bind(CHANNEL)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(run.imported())
    }

    async fn stats(&self) -> Result<Stats> {
        let by_type: Vec<(String, i64)> = sqlx::query_as(
            "SELECT event_type, count(*) FROM es_events GROUP BY event_type ORDER BY 2 DESC, 1",
        )
        .fetch_all(&self.pool)
        .await?;
        let streams: i64 = sqlx::query_scalar("SELECT count(*) FROM es_streams")
            .fetch_one(&self.pool)
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
        let row = sqlx::query(
            "UPDATE es_control
                SET lease_expires_at = clock_timestamp() + $3 * interval '1 millisecond'
              WHERE id = 1 AND epoch = $1 AND holder = $2 AND lease_expires_at > clock_timestamp()
             RETURNING epoch, lease_expires_at, last_position",
        )
        .bind(to_i64(token.epoch, "epoch")?)
        .bind(&token.holder)
        .bind(ttl)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(r) => lease_row(&r, &token.holder),
            None => Err(self.lease_info().await?.fenced()),
        }
    }

    async fn release_lease(&self, token: &LeaseToken) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE es_control SET lease_expires_at = clock_timestamp()
              WHERE id = 1 AND epoch = $1 AND holder = $2 AND lease_expires_at > clock_timestamp()",
        )
        .bind(to_i64(token.epoch, "epoch")?)
        .bind(&token.holder)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn lease_info(&self) -> Result<LeaseInfo> {
        let r = sqlx::query(
            "SELECT holder, epoch,
                    CASE WHEN lease_expires_at = '-infinity' THEN NULL ELSE lease_expires_at END,
                    lease_expires_at > clock_timestamp(), last_position
               FROM es_control WHERE id = 1",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(LeaseInfo {
            holder: r.try_get(0)?,
            epoch: r.try_get::<i64, _>(1)? as u64,
            expires_at: r.try_get(2)?,
            held: r.try_get(3)?,
            head: r.try_get::<i64, _>(4)? as u64,
        })
    }

    async fn save_checkpoint(&self, name: &str, checkpoint: &Checkpoint) -> Result<()> {
        sqlx::query(
            "INSERT INTO es_checkpoints (name, position, event_id) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE
                SET position = EXCLUDED.position, event_id = EXCLUDED.event_id,
                    updated_at = clock_timestamp()",
        )
        .bind(name)
        .bind(to_i64(checkpoint.position, "position")?)
        .bind(checkpoint.event_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn load_checkpoint(&self, name: &str) -> Result<Option<Checkpoint>> {
        let row: Option<(i64, Option<Uuid>)> =
            sqlx::query_as("SELECT position, event_id FROM es_checkpoints WHERE name = $1")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(position, event_id)| Checkpoint {
            position: position as u64,
            event_id,
        }))
    }

    async fn save_snapshot(&self, name: &str, snapshot: Snapshot) -> Result<()> {
        sqlx::query(
            "INSERT INTO es_snapshots (name, position, event_id, state_version, state)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (name) DO UPDATE
                SET position = EXCLUDED.position, event_id = EXCLUDED.event_id,
                    state_version = EXCLUDED.state_version, state = EXCLUDED.state,
                    updated_at = clock_timestamp()",
        )
        .bind(name)
        .bind(to_i64(snapshot.checkpoint.position, "position")?)
        .bind(snapshot.checkpoint.event_id)
        .bind(snapshot.state_version as i32)
        .bind(crate::snapshot_zip::pack(snapshot.state).await?)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn load_snapshot(&self, name: &str) -> Result<Option<Snapshot>> {
        let row: Option<(i64, Option<Uuid>, i32, Vec<u8>)> = sqlx::query_as(
            "SELECT position, event_id, state_version, state FROM es_snapshots WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        let Some((position, event_id, state_version, packed)) = row else {
            return Ok(None);
        };
        let Some(state) = crate::snapshot_zip::unpack(name, packed).await? else {
            return Ok(None);
        };
        Ok(Some(Snapshot {
            checkpoint: Checkpoint {
                position: position as u64,
                event_id,
            },
            state_version: state_version as u32,
            state,
        }))
    }

    async fn wakeups(&self) -> Result<Wakeups> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANNEL).await?;
        Ok(Wakeups::Postgres(Box::new(listener)))
    }
}
