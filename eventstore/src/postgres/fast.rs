//! A group in one statement when the head is as this store last left it
//! (see `known`): one round trip and one implicit transaction instead of
//! four round trips.

use sqlx::Row;
use sqlx::postgres::PgConnection;

use super::{CHANNEL, Columns, PgStore};
use crate::append::Prepared;
use crate::known::CLOCK_SLACK_MS;
use crate::{Appended, Result};

/// The group's answers when the fast statement wrote it; `None` when it
/// wrote nothing and the group must go the careful way.
pub(super) async fn write(
    store: &PgStore,
    conn: &mut PgConnection,
    group: &[Prepared],
) -> Result<Option<Vec<Result<Appended>>>> {
    let Some((planned, expect)) = store.head.plan(store.hook.is_some(), group) else {
        return Ok(None);
    };
    let c = Columns::of(&planned);
    // The control row moves only if it is still the head this store left,
    // the lease is still the writer's (for a leader) and the group's time
    // is the database's (within the slack); the rows and the streams are
    // written only if it moved. Every sub-statement runs under the control
    // row's lock, taken by the UPDATE: an append committed meanwhile by
    // another process moves the head, and the UPDATE, re-checking the row
    // once that lock is granted, then matches nothing.
    let row = sqlx::query(
        "WITH ctl AS (
            UPDATE es_control SET last_position = $14, last_hash = $15
             WHERE id = 1 AND last_position = $16 AND last_hash = $17 AND epoch = $10
               AND ($18::text IS NULL OR (holder = $18 AND lease_expires_at > clock_timestamp()))
               AND $11 <= clock_timestamp()
               AND $11 > clock_timestamp() - $19 * interval '1 millisecond'
               AND $11 >= COALESCE((SELECT recorded_at FROM es_events WHERE position = $16),
                                   '-infinity')
            RETURNING 1
         ), ev AS (
            INSERT INTO es_events (position, stream_id, stream_version, event_id, event_type,
                schema_version, payload, metadata, epoch, recorded_at, hash)
            SELECT p, s, v, i, t, sv, pl::jsonb, md::jsonb, $10, $11, h
            FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::uuid[], $5::text[],
                        $6::int[], $7::text[], $8::text[], $9::bytea[])
                 AS u(p, s, v, i, t, sv, pl, md, h)
            WHERE EXISTS (SELECT FROM ctl)
         ), st AS (
            INSERT INTO es_streams (stream_id, version)
            SELECT * FROM unnest($12::text[], $13::bigint[]) WHERE EXISTS (SELECT FROM ctl)
            ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version
         ), note AS (
            SELECT pg_notify($20, $14::text) FROM ctl
         )
         SELECT EXISTS (SELECT FROM ctl), (SELECT count(*) FROM note),
                $11 <= clock_timestamp()
                AND $11 > clock_timestamp() - $19 * interval '1 millisecond'",
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
    .bind(expect.epoch as i64)
    .bind(expect.recorded_at)
    .bind(&c.touched)
    .bind(&c.touched_versions)
    .bind(planned.head as i64)
    .bind(planned.head_hash.as_slice())
    .bind(expect.position as i64)
    .bind(expect.hash.as_slice())
    .bind(expect.holder.as_deref())
    .bind(CLOCK_SLACK_MS)
    .bind(CHANNEL)
    .fetch_one(&mut *conn)
    .await;
    drop(c);
    match row {
        Ok(row) => {
            if row.try_get::<bool, _>(0)? {
                store.head.learn_fast(&planned, &expect);
                store.queue.wrote_in_one_statement();
                return Ok(Some(planned.outcomes));
            }
            if row.try_get::<bool, _>(2)? {
                // Another writer moved the head, or the lease changed.
                store.head.forget();
            } else {
                store.head.clock_off();
            }
            Ok(None)
        }
        // A refusal by the database (an event id already in the log: a
        // retry) wrote nothing; the careful way finds out what it was.
        Err(sqlx::Error::Database(e)) => {
            tracing::debug!(error = %e, "fast group append refused; writing it the careful way");
            store.head.forget();
            Ok(None)
        }
        Err(e) => {
            store.head.forget();
            Err(e.into())
        }
    }
}
