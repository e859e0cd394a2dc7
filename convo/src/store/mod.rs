//! The conversation tables, written once per backend (`pg.rs`,
//! `sqlite.rs`) with plain binds, on the event store's pools (SQLite's
//! single writer connection, so writes here queue behind the log's).

mod pg;
mod sqlite;

use llmgw_eventstore::AnyStore;
use sqlx::{PgPool, SqlitePool};

use crate::{Appended, ConvoError, Note, Owner, Put, Result, Search, Seen, Thread};

#[derive(Debug, Clone)]
pub(crate) enum Db {
    Pg(PgPool),
    Lite(SqlitePool),
}

pub(crate) fn db_err(e: sqlx::Error) -> ConvoError {
    ConvoError::Store(e.to_string())
}

/// A stored row's tags back into a list.
pub(crate) fn tags_of(json: &str) -> Result<Vec<String>> {
    serde_json::from_str(json).map_err(|e| ConvoError::Store(format!("a note's tags: {e}")))
}

pub(crate) type NoteRow = (String, String, String, i64, i64);

pub(crate) fn note_of((key, text, tags, created_at, updated_at): NoteRow) -> Result<Note> {
    Ok(Note {
        key,
        text,
        tags: tags_of(&tags)?,
        created_at,
        updated_at,
    })
}

/// Every thread, turn and note of a store, as `llmgw store copy` moves
/// them to another: the same columns on both backends (a note's tags as
/// JSON text).
#[derive(Debug, Default)]
pub struct Rows {
    pub(crate) threads: Vec<(String, String, i64, i64, i64)>,
    pub(crate) turns: Vec<(String, String, i64, String)>,
    pub(crate) notes: Vec<(String, String, String, String, String, i64, i64)>,
}

impl Rows {
    /// Threads, then notes.
    pub fn counts(&self) -> (usize, usize) {
        (self.threads.len(), self.notes.len())
    }
}

macro_rules! each {
    ($self:ident, $f:ident($($arg:expr),*)) => {
        match $self {
            Db::Pg(pool) => pg::$f(pool, $($arg),*).await,
            Db::Lite(pool) => sqlite::$f(pool, $($arg),*).await,
        }
    };
}

impl Db {
    pub(crate) async fn dump(&self) -> Result<Rows> {
        each!(self, dump())
    }

    pub(crate) async fn load(&self, rows: &Rows) -> Result<()> {
        each!(self, load(rows))
    }

    pub(crate) fn new(store: &AnyStore) -> Self {
        match store {
            AnyStore::Postgres(s) => Db::Pg(s.pool().clone()),
            AnyStore::Sqlite(s) => Db::Lite(s.pool().clone()),
        }
    }

    pub(crate) async fn put_note(
        &self,
        owner: &Owner,
        key: &str,
        text: &str,
        tags: &str,
        now: i64,
    ) -> Result<Put> {
        each!(self, put_note(owner, key, text, tags, now))
    }

    pub(crate) async fn note(&self, owner: &Owner, key: &str) -> Result<Option<Note>> {
        each!(self, note(owner, key))
    }

    pub(crate) async fn delete_note(&self, owner: &Owner, key: &str) -> Result<bool> {
        each!(self, delete_note(owner, key))
    }

    pub(crate) async fn search(
        &self,
        owner: &Owner,
        search: &Search,
        limit: i64,
    ) -> Result<Vec<Note>> {
        each!(self, search(owner, search, limit))
    }

    pub(crate) async fn thread(&self, project: &str, thread: &str) -> Result<Thread> {
        each!(self, thread(project, thread))
    }

    /// Appends to the thread made at `seen` (None: to whichever there is,
    /// made if there is none).
    pub(crate) async fn append(
        &self,
        project: &str,
        thread: &str,
        seen: Option<i64>,
        messages: &[String],
        now: i64,
    ) -> Result<Appended> {
        each!(self, append(project, thread, seen, messages, now))
    }

    pub(crate) async fn delete_thread(&self, project: &str, thread: &str) -> Result<bool> {
        each!(self, delete_thread(project, thread))
    }

    pub(crate) async fn projects_with_threads(&self) -> Result<Vec<String>> {
        each!(self, projects_with_threads())
    }

    pub(crate) async fn projects_with_notes(&self) -> Result<Vec<String>> {
        each!(self, projects_with_notes())
    }

    /// Deletes the project's threads last written before `before`.
    pub(crate) async fn sweep_threads(&self, project: &str, before: i64) -> Result<u64> {
        each!(self, sweep_threads(project, before))
    }

    pub(crate) async fn sweep_notes(&self, project: &str, before: i64) -> Result<u64> {
        each!(self, sweep_notes(project, before))
    }
}

/// The columns a thread is read with, on both backends: the thread's
/// creation and its turns, in one statement so that they are of one
/// thread even while it is deleted and made again.
pub(crate) const THREAD_SQL: &str = "SELECT t.created_at, u.message FROM convo_threads t
      LEFT JOIN convo_turns u ON u.project_id = t.project_id AND u.thread_id = t.thread_id
     WHERE t.project_id = $1 AND t.thread_id = $2
     ORDER BY u.seq";

/// A thread from its rows (none: no thread), its turns parsed.
pub(crate) fn thread_of(rows: Vec<(i64, Option<String>)>) -> Result<Thread> {
    let seen = Seen(rows.first().map(|(created, _)| *created));
    let messages = rows
        .iter()
        .filter_map(|(_, m)| m.as_deref())
        .map(|m| {
            serde_json::from_str(m).map_err(|e| ConvoError::Store(format!("a stored turn: {e}")))
        })
        .collect::<Result<_>>()?;
    Ok(Thread { messages, seen })
}

/// A turn's write to a thread it did not read first: made if missing, and
/// the first turn's number (both backends' upsert reads it alike).
pub(crate) const APPEND_SQL: &str =
    "INSERT INTO convo_threads (project_id, thread_id, created_at, updated_at, next_seq)
     VALUES ($1, $2, $3, $3, $4)
     ON CONFLICT (project_id, thread_id)
     DO UPDATE SET updated_at = EXCLUDED.updated_at,
                   next_seq = convo_threads.next_seq + EXCLUDED.next_seq
     RETURNING next_seq - $4";

/// A turn's closing write of the thread it read (made at `$5`): the
/// first turn's number, or no row where that thread is gone.
pub(crate) const APPEND_SEEN_SQL: &str = "UPDATE convo_threads
        SET updated_at = $3, next_seq = next_seq + $4
      WHERE project_id = $1 AND thread_id = $2 AND created_at = $5
     RETURNING next_seq - $4";
