//! The conversation tables on SQLite: the same shapes as `pg.rs`; search
//! through the FTS5 table the migration's triggers keep in step.

use sqlx::SqlitePool;

use super::{APPEND_SEEN_SQL, APPEND_SQL, NoteRow, THREAD_SQL, db_err, note_of, thread_of};
use crate::{Appended, ConvoError, Note, Owner, Put, Result, Search, Thread};

type Tx = sqlx::Transaction<'static, sqlx::Sqlite>;

/// A write transaction that takes the file's write lock at once, so the
/// count and the insert of a note see one state even against another
/// process.
async fn begin(pool: &SqlitePool) -> Result<Tx> {
    pool.begin_with("BEGIN IMMEDIATE").await.map_err(db_err)
}

pub(super) async fn put_note(
    pool: &SqlitePool,
    owner: &Owner,
    key: &str,
    text: &str,
    tags: &str,
    now: i64,
) -> Result<Put> {
    let mut tx = begin(pool).await?;
    let exists: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM convo_notes WHERE project_id = $1 AND agent = $2 AND key = $3",
    )
    .bind(&owner.project)
    .bind(&owner.agent)
    .bind(key)
    .fetch_optional(&mut *tx)
    .await
    .map_err(db_err)?;
    if exists.is_none() {
        let count: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM convo_notes WHERE project_id = $1 AND agent = $2",
        )
        .bind(&owner.project)
        .bind(&owner.agent)
        .fetch_one(&mut *tx)
        .await
        .map_err(db_err)?;
        if count as u64 >= crate::limits::MAX_NOTES_PER_AGENT {
            return Err(ConvoError::TooManyNotes {
                agent: owner.agent.clone(),
            });
        }
    }
    sqlx::query(
        "INSERT INTO convo_notes (project_id, agent, key, body, tags, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $6)
         ON CONFLICT (project_id, agent, key)
         DO UPDATE SET body = excluded.body, tags = excluded.tags, updated_at = excluded.updated_at",
    )
    .bind(&owner.project)
    .bind(&owner.agent)
    .bind(key)
    .bind(text)
    .bind(tags)
    .bind(now)
    .execute(&mut *tx)
    .await
    .map_err(db_err)?;
    tx.commit().await.map_err(db_err)?;
    Ok(if exists.is_some() {
        Put::Replaced
    } else {
        Put::Created
    })
}

const NOTE_COLUMNS: &str = "n.key, n.body, n.tags, n.created_at, n.updated_at";

pub(super) async fn note(pool: &SqlitePool, owner: &Owner, key: &str) -> Result<Option<Note>> {
    let row: Option<NoteRow> = sqlx::query_as(&format!(
        "SELECT {NOTE_COLUMNS} FROM convo_notes n
          WHERE n.project_id = $1 AND n.agent = $2 AND n.key = $3"
    ))
    .bind(&owner.project)
    .bind(&owner.agent)
    .bind(key)
    .fetch_optional(pool)
    .await
    .map_err(db_err)?;
    row.map(note_of).transpose()
}

pub(super) async fn delete_note(pool: &SqlitePool, owner: &Owner, key: &str) -> Result<bool> {
    let done =
        sqlx::query("DELETE FROM convo_notes WHERE project_id = $1 AND agent = $2 AND key = $3")
            .bind(&owner.project)
            .bind(&owner.agent)
            .bind(key)
            .execute(pool)
            .await
            .map_err(db_err)?;
    Ok(done.rows_affected() > 0)
}

pub(super) async fn search(
    pool: &SqlitePool,
    owner: &Owner,
    search: &Search,
    limit: i64,
) -> Result<Vec<Note>> {
    let (from, filter, arg) = match search {
        // Each word quoted: an FTS5 phrase of one token, ANDed with the
        // others; the words hold no quotes (limits::query_words).
        Search::Words(words) => (
            "convo_notes n JOIN convo_notes_fts f ON f.rowid = n.rowid",
            "convo_notes_fts MATCH $3",
            words
                .iter()
                .map(|w| format!("\"{w}\""))
                .collect::<Vec<_>>()
                .join(" AND "),
        ),
        Search::Tag(tag) => (
            "convo_notes n",
            "EXISTS (SELECT 1 FROM json_each(n.tags) t WHERE t.value = $3)",
            tag.clone(),
        ),
    };
    let rows: Vec<NoteRow> = sqlx::query_as(&format!(
        "SELECT {NOTE_COLUMNS} FROM {from}
          WHERE n.project_id = $1 AND n.agent = $2 AND {filter}
          ORDER BY n.updated_at DESC, n.key
          LIMIT $4"
    ))
    .bind(&owner.project)
    .bind(&owner.agent)
    .bind(arg)
    .bind(limit)
    .fetch_all(pool)
    .await
    .map_err(db_err)?;
    rows.into_iter().map(note_of).collect()
}

pub(super) async fn thread(pool: &SqlitePool, project: &str, thread: &str) -> Result<Thread> {
    let rows: Vec<(i64, Option<String>)> = sqlx::query_as(THREAD_SQL)
        .bind(project)
        .bind(thread)
        .fetch_all(pool)
        .await
        .map_err(db_err)?;
    thread_of(rows)
}

pub(super) async fn append(
    pool: &SqlitePool,
    project: &str,
    thread: &str,
    seen: Option<i64>,
    messages: &[String],
    now: i64,
) -> Result<Appended> {
    let mut tx = begin(pool).await?;
    let count = messages.len() as i64;
    let first: Option<i64> = match seen {
        None => sqlx::query_scalar(APPEND_SQL)
            .bind(project)
            .bind(thread)
            .bind(now)
            .bind(count)
            .fetch_optional(&mut *tx),
        Some(created) => sqlx::query_scalar(APPEND_SEEN_SQL)
            .bind(project)
            .bind(thread)
            .bind(now)
            .bind(count)
            .bind(created)
            .fetch_optional(&mut *tx),
    }
    .await
    .map_err(db_err)?;
    let Some(first) = first else {
        return Ok(Appended::Deleted);
    };
    for (i, m) in messages.iter().enumerate() {
        sqlx::query(
            "INSERT INTO convo_turns (project_id, thread_id, seq, message) VALUES ($1, $2, $3, $4)",
        )
        .bind(project)
        .bind(thread)
        .bind(first + i as i64)
        .bind(m)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
    }
    tx.commit().await.map_err(db_err)?;
    Ok(Appended::Kept)
}

/// Deletes the threads and their turns; SQLite does not enforce foreign
/// keys unless asked, so the turns are deleted here, first.
async fn delete_threads(pool: &SqlitePool, project: &str, which: &str, arg: &str) -> Result<u64> {
    let mut tx = begin(pool).await?;
    sqlx::query(&format!(
        "DELETE FROM convo_turns WHERE project_id = $1 AND thread_id IN
           (SELECT thread_id FROM convo_threads WHERE project_id = $1 AND {which})"
    ))
    .bind(project)
    .bind(arg)
    .execute(&mut *tx)
    .await
    .map_err(db_err)?;
    let done = sqlx::query(&format!(
        "DELETE FROM convo_threads WHERE project_id = $1 AND {which}"
    ))
    .bind(project)
    .bind(arg)
    .execute(&mut *tx)
    .await
    .map_err(db_err)?;
    tx.commit().await.map_err(db_err)?;
    Ok(done.rows_affected())
}

pub(super) async fn delete_thread(pool: &SqlitePool, project: &str, thread: &str) -> Result<bool> {
    Ok(delete_threads(pool, project, "thread_id = $2", thread).await? > 0)
}

pub(super) async fn projects_with_threads(pool: &SqlitePool) -> Result<Vec<String>> {
    sqlx::query_scalar("SELECT DISTINCT project_id FROM convo_threads")
        .fetch_all(pool)
        .await
        .map_err(db_err)
}

pub(super) async fn projects_with_notes(pool: &SqlitePool) -> Result<Vec<String>> {
    sqlx::query_scalar("SELECT DISTINCT project_id FROM convo_notes")
        .fetch_all(pool)
        .await
        .map_err(db_err)
}

pub(super) async fn sweep_threads(pool: &SqlitePool, project: &str, before: i64) -> Result<u64> {
    // Bound as text would not compare with the INTEGER column: cast.
    delete_threads(
        pool,
        project,
        "updated_at < CAST($2 AS INTEGER)",
        &before.to_string(),
    )
    .await
}

pub(super) async fn sweep_notes(pool: &SqlitePool, project: &str, before: i64) -> Result<u64> {
    let done = sqlx::query("DELETE FROM convo_notes WHERE project_id = $1 AND updated_at < $2")
        .bind(project)
        .bind(before)
        .execute(pool)
        .await
        .map_err(db_err)?;
    Ok(done.rows_affected())
}

pub(super) async fn dump(pool: &SqlitePool) -> Result<super::Rows> {
    let threads = sqlx::query_as(
        "SELECT project_id, thread_id, created_at, updated_at, next_seq FROM convo_threads",
    )
    .fetch_all(pool)
    .await
    .map_err(db_err)?;
    let turns = sqlx::query_as("SELECT project_id, thread_id, seq, message FROM convo_turns")
        .fetch_all(pool)
        .await
        .map_err(db_err)?;
    let notes = sqlx::query_as(
        "SELECT project_id, agent, key, body, tags, created_at, updated_at FROM convo_notes",
    )
    .fetch_all(pool)
    .await
    .map_err(db_err)?;
    Ok(super::Rows {
        threads,
        turns,
        notes,
    })
}

/// In one transaction; refused where the destination holds a thread or
/// a note already.
pub(super) async fn load(pool: &SqlitePool, rows: &super::Rows) -> Result<()> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(db_err)?;
    let there: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM convo_threads) + (SELECT count(*) FROM convo_notes)",
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(db_err)?;
    if there > 0 {
        return Err(ConvoError::Store(
            "the destination already holds threads or notes: copy into a new store".into(),
        ));
    }
    for (project, thread, created, updated, next) in &rows.threads {
        sqlx::query(
            "INSERT INTO convo_threads (project_id, thread_id, created_at, updated_at, next_seq)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(project)
        .bind(thread)
        .bind(created)
        .bind(updated)
        .bind(next)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
    }
    for (project, thread, seq, message) in &rows.turns {
        sqlx::query(
            "INSERT INTO convo_turns (project_id, thread_id, seq, message) VALUES ($1, $2, $3, $4)",
        )
        .bind(project)
        .bind(thread)
        .bind(seq)
        .bind(message)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
    }
    for (project, agent, key, body, tags, created, updated) in &rows.notes {
        sqlx::query(
            "INSERT INTO convo_notes (project_id, agent, key, body, tags, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(project)
        .bind(agent)
        .bind(key)
        .bind(body)
        .bind(tags)
        .bind(created)
        .bind(updated)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
    }
    tx.commit().await.map_err(db_err)
}
