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

use sqlx::SqliteConnection;

use crate::Result;
use crate::append::Planned;

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
    let rows = planned.rows.len();
    let streams = planned.stream_versions.len();
    let sql = sql(rows, streams);
    let mut q = sqlx::query(&sql);
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
    }
    for chunk in planned.stream_versions.chunks(MAX_ROWS) {
        for (stream, version) in chunk {
            q = q.bind(*stream).bind(*version as i64);
        }
        for _ in 0..(shape(chunk.len()) - chunk.len()) * 2 {
            q = q.bind(None::<i64>);
        }
    }
    q.bind(planned.head as i64)
        .bind(planned.head_hash.as_slice())
        .execute(conn)
        .await?;
    Ok(())
}

/// How many rows a statement for `n` of them has places for.
fn shape(n: usize) -> usize {
    n.next_power_of_two().min(MAX_ROWS)
}

/// The statements for `rows` events over `streams` streams. The parameters
/// are plain `?`, taken in order across the statements: the driver binds
/// numbered ones wrongly when a statement skips some.
fn sql(rows: usize, streams: usize) -> String {
    let mut sql = String::with_capacity(4096);
    for chunk in chunks(rows) {
        sql.push_str(
            "INSERT INTO es_events (position, stream_id, stream_version, event_id, event_type,
                 schema_version, payload, metadata, epoch, recorded_at, hash)
             SELECT * FROM (VALUES ",
        );
        places(&mut sql, shape(chunk), "(?,?,?,?,?,?,?,?,?,?,?)");
        sql.push_str(") WHERE column1 IS NOT NULL;\n");
    }
    for chunk in chunks(streams) {
        // The WHERE also keeps the parser from reading ON CONFLICT as a
        // join's constraint.
        sql.push_str("INSERT INTO es_streams (stream_id, version) SELECT * FROM (VALUES ");
        places(&mut sql, shape(chunk), "(?,?)");
        sql.push_str(
            ") WHERE column1 IS NOT NULL
             ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version;\n",
        );
    }
    sql.push_str("UPDATE es_control SET last_position = ?, last_hash = ? WHERE id = 1;\nCOMMIT");
    sql
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

    #[test]
    fn statements_come_in_few_shapes() {
        // 100 rows and 3 streams: one INSERT of 128 places, one of 4.
        let s = sql(100, 3);
        assert_eq!(s.matches("INSERT INTO es_events").count(), 1);
        assert_eq!(s.matches('?').count(), 128 * 11 + 4 * 2 + 2);
        // Every size from 65 to 128 shares one statement.
        assert_eq!(sql(65, 1), sql(128, 1));
        assert_ne!(sql(64, 1), sql(65, 1));
        // Beyond MAX_ROWS the rows are split, each part its own INSERT.
        assert_eq!(chunks(2500).collect::<Vec<_>>(), [1024, 1024, 452]);
        assert_eq!(sql(2500, 1).matches("INSERT INTO es_events").count(), 3);
    }
}
