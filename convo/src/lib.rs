//! What the gateway keeps of conversations: the turns of threads and the
//! memory notes of agents, in their own tables beside the event log (the
//! `convo_*` tables of migration 0005), deletable and swept by retention.
//!
//! What belongs here: storage, the notes' limits and search, the sweep.
//! What must not: deciding who may keep anything. Whether a project keeps
//! threads or notes, and for how long, is the log's (`ThreadsSet`,
//! `MemorySet`); callers pass that in. Conversation text never enters an
//! event.
//!
//! Every lookup is keyed by the project: another project's thread or note
//! answers exactly like a missing one. Every method takes `now`.

pub mod limits;
mod store;

pub use store::Rows;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use llmgw_eventstore::AnyStore;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ConvoError {
    /// A limit or a malformed value; the message says which.
    #[error("{0}")]
    Invalid(String),
    #[error(
        "agent {agent} already keeps {max} notes, the most one agent may: delete some first",
        max = limits::MAX_NOTES_PER_AGENT
    )]
    TooManyNotes { agent: String },
    #[error("the conversation tables: {0}")]
    Store(String),
}

pub type Result<T> = std::result::Result<T, ConvoError>;

/// Whose notes: a project's, one agent's of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// `""` is the ownerless pool of a gateway without keys.
    pub project: String,
    pub agent: String,
}

/// A note as stored and answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    pub key: String,
    pub text: String,
    pub tags: Vec<String>,
    /// Microseconds since the Unix epoch.
    pub created_at: i64,
    pub updated_at: i64,
}

/// How notes are looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Search {
    /// Every word (full text over key and text).
    Words(Vec<String>),
    Tag(String),
}

/// Whether a put made a note or replaced one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    Created,
    Replaced,
}

/// A thread as a turn read it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Thread {
    /// Oldest first; empty for a thread that does not exist.
    pub messages: Vec<serde_json::Value>,
    pub seen: Seen,
}

/// Which thread was read: its creation time, or none where there was no
/// thread (the default). A thread deleted and made again under the same
/// id is another thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen(pub(crate) Option<i64>);

/// What became of a turn's closing write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    Kept,
    /// The thread the turn read was deleted since: nothing was written.
    Deleted,
}

/// How long a project keeps one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Until unwritten this many hours.
    Hours(u32),
    /// Nothing: the kind is switched off, and the sweep deletes what the
    /// project still has.
    Nothing,
}

impl Keep {
    /// What was last written before this goes.
    fn before(self, now: DateTime<Utc>) -> i64 {
        match self {
            Keep::Hours(h) => micros(now) - i64::from(h) * 3_600_000_000,
            Keep::Nothing => i64::MAX,
        }
    }
}

/// Per project, how long each kind is kept: only the projects the
/// sweeping server knows of. A project absent from a map is left alone:
/// servers of different kinds may share one store (a gateway without
/// keys keeps the ownerless pool, one with keys its projects), and none
/// may judge what another keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retention {
    pub threads: BTreeMap<String, Keep>,
    pub notes: BTreeMap<String, Keep>,
}

/// What a sweep deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub threads: u64,
    pub notes: u64,
}

/// The conversation tables of one store.
#[derive(Debug, Clone)]
pub struct Convo {
    db: store::Db,
}

fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

impl Convo {
    pub fn new(store: &AnyStore) -> Self {
        Convo {
            db: store::Db::new(store),
        }
    }

    /// Writes a note (the limits checked first), replacing one of the same
    /// key. A new key past the agent's limit is refused.
    pub async fn put_note(
        &self,
        owner: &Owner,
        key: &str,
        text: &str,
        tags: &[String],
        now: DateTime<Utc>,
    ) -> Result<Put> {
        limits::check_name("agent", &owner.agent)?;
        limits::check_key(key)?;
        limits::check_text(text)?;
        let tags = limits::check_tags(tags)?;
        let tags = serde_json::to_string(&tags).map_err(|e| ConvoError::Store(e.to_string()))?;
        self.db.put_note(owner, key, text, &tags, micros(now)).await
    }

    pub async fn note(&self, owner: &Owner, key: &str) -> Result<Option<Note>> {
        self.db.note(owner, key).await
    }

    /// Whether there was such a note.
    pub async fn delete_note(&self, owner: &Owner, key: &str) -> Result<bool> {
        self.db.delete_note(owner, key).await
    }

    /// The owner's notes that match, newest write first, at most `limit`.
    pub async fn search(&self, owner: &Owner, search: &Search, limit: u32) -> Result<Vec<Note>> {
        if let Search::Tag(t) = search {
            limits::check_tag(t)?;
        }
        self.db.search(owner, search, i64::from(limit)).await
    }

    /// A thread's messages, oldest first; empty for a thread that does not
    /// exist (here: in this project).
    pub async fn history(&self, project: &str, thread: &str) -> Result<Vec<serde_json::Value>> {
        Ok(self.thread(project, thread).await?.messages)
    }

    /// A thread's messages, and which thread they are: what a turn reads
    /// when it opens, so that its closing write ([`Convo::append_seen`])
    /// goes to the same thread or nowhere.
    pub async fn thread(&self, project: &str, thread: &str) -> Result<Thread> {
        self.db.thread(project, thread).await
    }

    /// Appends messages to a thread, making it if new, whatever became of
    /// it meanwhile (a turn's closing write is [`Convo::append_seen`]).
    pub async fn append(
        &self,
        project: &str,
        thread: &str,
        messages: &[serde_json::Value],
        now: DateTime<Utc>,
    ) -> Result<()> {
        self.append_seen(project, thread, Seen::default(), messages, now)
            .await
            .map(drop)
    }

    /// Appends a turn's messages to the thread it read when it opened
    /// (`seen`): a thread deleted since, or deleted and made again, is
    /// not written (the delete wins over a turn in flight); a thread that
    /// did not exist then is made, or appended to if another turn made it
    /// meanwhile.
    pub async fn append_seen(
        &self,
        project: &str,
        thread: &str,
        seen: Seen,
        messages: &[serde_json::Value],
        now: DateTime<Utc>,
    ) -> Result<Appended> {
        limits::check_name("thread", thread)?;
        let messages: Vec<String> = messages.iter().map(|m| m.to_string()).collect();
        self.db
            .append(project, thread, seen.0, &messages, micros(now))
            .await
    }

    /// Whether there was such a thread.
    pub async fn delete_thread(&self, project: &str, thread: &str) -> Result<bool> {
        self.db.delete_thread(project, thread).await
    }

    /// Every thread, turn and note, for a copy of the store (`llmgw store
    /// copy`).
    pub async fn dump(&self) -> Result<Rows> {
        self.db.dump().await
    }

    /// Puts `rows` from another store's `dump` here, in one transaction;
    /// refused where a thread or a note is here already.
    pub async fn load(&self, rows: &Rows) -> Result<()> {
        self.db.load(rows).await
    }

    /// Deletes what has outlived its project's retention, and everything
    /// of a project that no longer keeps that kind; a project `keep` does
    /// not name is not touched.
    pub async fn sweep(&self, keep: &Retention, now: DateTime<Utc>) -> Result<Swept> {
        let mut swept = Swept::default();
        for project in self.db.projects_with_threads().await? {
            if let Some(k) = keep.threads.get(&project) {
                swept.threads += self.db.sweep_threads(&project, k.before(now)).await?;
            }
        }
        for project in self.db.projects_with_notes().await? {
            if let Some(k) = keep.notes.get(&project) {
                swept.notes += self.db.sweep_notes(&project, k.before(now)).await?;
            }
        }
        Ok(swept)
    }
}
