//! The write half of a group's transaction on SQLite: the rows, the
//! streams' versions, the head and the commit, in one trip to the driver's
//! thread.
//!
//! Every value is a bound parameter. The rows used to travel as one JSON
//! array taken apart by `json_each`; building that text, escaping every
//! payload in it and SQLite parsing it back cost about as much as the
//! inserts themselves. A statement with a parameter per value is only
//! faster while it stays prepared on the connection, though: preparing a
//! hundred-row INSERT costs about what executing it does. So statements
//! come in a few shapes (rows and streams rounded up to a power of two,
//! the unused places bound to NULL and skipped), which the connection's
//! statement cache keeps.

use sqlx::query::Query;
use sqlx::sqlite::{Sqlite, SqliteArguments};
use sqlx::{Row, SqliteConnection};

use super::SqliteStore;
use crate::append::{Planned, Prepared};
use crate::{Appended, Result};

/// The most rows one INSERT takes: 11 parameters a row keeps a statement
/// far below SQLite's 32,766.
const MAX_ROWS: usize = 1024;

const EVENT_COLUMNS: usize = 11;

pub(super) async fn write(
    conn: &mut SqliteConnection,
    planned: &Planned<'_>,
    epoch: u64,
    now_micros: i64,
) -> Result<()> {
    let mut sql = String::with_capacity(4096);
    inserts(
        &mut sql,
        planned.rows.len(),
        planned.stream_versions.len(),
        "",
    );
    sql.push_str("UPDATE es_control SET last_position = ?, last_hash = ? WHERE id = 1;\nCOMMIT");
    bind_rows(sqlx::query(&sql), planned, epoch, now_micros, None)
        .bind(planned.head as i64)
        .bind(planned.head_hash.as_slice())
        .execute(conn)
        .await?;
    Ok(())
}

/// The group in one trip when the head is as this store last left it
/// (see `known`): the control row moves only if it still holds that head,
/// epoch and (for a leader) a live lease of the writer's, and the rows are
/// written only if it moved. `None` when nothing was written and the group
/// must go the careful way.
pub(super) async fn fast(
    store: &SqliteStore,
    conn: &mut SqliteConnection,
    group: &[Prepared],
) -> Result<Option<Vec<Result<Appended>>>> {
    let Some((planned, expect)) = store.head.plan(store.hook.is_some(), group) else {
        return Ok(None);
    };
    let at = expect.recorded_at.timestamp_micros();
    let mut sql = String::with_capacity(4096);
    sql.push_str(
        "BEGIN IMMEDIATE;
         UPDATE es_control SET last_position = ?, last_hash = ?
          WHERE id = 1 AND last_position = ? AND last_hash = ? AND epoch = ?
            AND (? IS NULL OR (holder = ? AND lease_expires_at > ?));\n",
    );
    // The new head's hash is in the control row only if the UPDATE moved
    // it: no other log reaches that hash.
    let moved = " AND (SELECT last_hash FROM es_control WHERE id = 1) = ?";
    inserts(
        &mut sql,
        planned.rows.len(),
        planned.stream_versions.len(),
        moved,
    );
    sql.push_str("SELECT (SELECT last_hash FROM es_control WHERE id = 1) = ?;\nCOMMIT");
    let head_hash = planned.head_hash.as_slice();
    let mut q = sqlx::query(&sql)
        .bind(planned.head as i64)
        .bind(head_hash)
        .bind(expect.position as i64)
        .bind(expect.hash.as_slice())
        .bind(expect.epoch as i64)
        .bind(expect.holder.as_deref())
        .bind(expect.holder.as_deref())
        .bind(at);
    // bind_rows binds each row's guard after its statement's places.
    q = bind_rows(q, &planned, expect.epoch, at, Some(head_hash));
    let answer = q.bind(head_hash).fetch_all(&mut *conn).await;
    match answer {
        Ok(rows) => {
            let moved = match rows.first() {
                Some(r) => r.try_get::<bool, _>(0)?,
                None => false,
            };
            if !moved {
                // Another writer moved the head, or the lease changed.
                store.head.forget();
                return Ok(None);
            }
            store.head.learn_fast(&planned, &expect);
            store.queue.wrote_in_one_statement();
            store.appended.send_replace(planned.head);
            Ok(Some(planned.outcomes))
        }
        // A refusal by the database (an event id already in the log: a
        // retry) stopped the trip inside its transaction: roll it back and
        // let the careful way find out what it was.
        Err(sqlx::Error::Database(e)) => {
            tracing::debug!(error = %e, "fast group append refused; writing it the careful way");
            store.head.forget();
            sqlx::query("ROLLBACK").execute(&mut *conn).await?;
            Ok(None)
        }
        Err(e) => {
            store.head.forget();
            Err(e.into())
        }
    }
}

/// Binds the parameters of [`inserts`]: the rows, then the streams.
fn bind_rows<'q>(
    mut q: Query<'q, Sqlite, SqliteArguments<'q>>,
    planned: &'q Planned<'_>,
    epoch: u64,
    now_micros: i64,
    guard: Option<&'q [u8]>,
) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    for chunk in planned.rows.chunks(MAX_ROWS) {
        for r in chunk {
            q = q
                .bind(r.position as i64)
                .bind(r.stream_id)
                .bind(r.stream_version as i64)
                .bind(r.event.event_id.hyphenated().to_string())
                .bind(r.event.event_type.as_str())
                .bind(i64::from(r.event.schema_version))
                .bind(r.event.payload.as_str())
                .bind(r.event.metadata.as_str())
                .bind(epoch as i64)
                .bind(now_micros)
                .bind(r.hash.as_slice());
        }
        for _ in 0..(shape(chunk.len()) - chunk.len()) * EVENT_COLUMNS {
            q = q.bind(None::<i64>);
        }
        if let Some(g) = guard {
            q = q.bind(g);
        }
    }
    for chunk in planned.stream_versions.chunks(MAX_ROWS) {
        for (stream, version) in chunk {
            q = q.bind(*stream).bind(*version as i64);
        }
        for _ in 0..(shape(chunk.len()) - chunk.len()) * 2 {
            q = q.bind(None::<i64>);
        }
        if let Some(g) = guard {
            q = q.bind(g);
        }
    }
    q
}

/// How many rows a statement for `n` of them has places for.
fn shape(n: usize) -> usize {
    n.next_power_of_two().min(MAX_ROWS)
}

/// The INSERTs of a group's `rows` and `streams`' versions, each row
/// written only if `guard` (an SQL condition, or empty) holds. The
/// parameters are plain `?`, taken in order across the statements: the
/// driver binds numbered ones wrongly when a statement skips some.
fn inserts(sql: &mut String, rows: usize, streams: usize, guard: &str) {
    for chunk in chunks(rows) {
        sql.push_str(
            "INSERT INTO es_events (position, stream_id, stream_version, event_id, event_type,
                 schema_version, payload, metadata, epoch, recorded_at, hash)
             SELECT * FROM (VALUES ",
        );
        places(sql, shape(chunk), "(?,?,?,?,?,?,?,?,?,?,?)");
        sql.push_str(") WHERE column1 IS NOT NULL");
        sql.push_str(guard);
        sql.push_str(";\n");
    }
    for chunk in chunks(streams) {
        // The WHERE also keeps the parser from reading ON CONFLICT as a
        // join's constraint.
        sql.push_str("INSERT INTO es_streams (stream_id, version) SELECT * FROM (VALUES ");
        places(sql, shape(chunk), "(?,?)");
        sql.push_str(") WHERE column1 IS NOT NULL");
        sql.push_str(guard);
        sql.push_str(
            "
             ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version;\n",
        );
    }
}

/// The sizes of the statements `n` rows are written in.
fn chunks(n: usize) -> impl Iterator<Item = usize> {
    (0..n.div_ceil(MAX_ROWS)).map(move |i| (n - i * MAX_ROWS).min(MAX_ROWS))
}

fn places(sql: &mut String, n: usize, place: &str) {
    for i in 0..n {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str(place);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(rows: usize, streams: usize) -> String {
        let mut sql = String::new();
        inserts(&mut sql, rows, streams, "");
        sql
    }

    #[test]
    fn statements_come_in_few_shapes() {
        // 100 rows and 3 streams: one INSERT of 128 places, one of 4.
        let s = sql(100, 3);
        assert_eq!(s.matches("INSERT INTO es_events").count(), 1);
        assert_eq!(s.matches('?').count(), 128 * 11 + 4 * 2);
        // Every size from 65 to 128 shares one statement.
        assert_eq!(sql(65, 1), sql(128, 1));
        assert_ne!(sql(64, 1), sql(65, 1));
        // Beyond MAX_ROWS the rows are split, each part its own INSERT.
        assert_eq!(chunks(2500).collect::<Vec<_>>(), [1024, 1024, 452]);
        assert_eq!(sql(2500, 1).matches("INSERT INTO es_events").count(), 3);
    }
}
