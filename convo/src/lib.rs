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

/// Per project, how long each kind is kept (hours since the last write).
/// A project absent from a map keeps nothing of that kind: the sweep
/// deletes what it still has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retention {
    pub threads: BTreeMap<String, u32>,
    pub notes: BTreeMap<String, u32>,
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

fn cutoff(now: DateTime<Utc>, hours: u32) -> i64 {
    micros(now) - i64::from(hours) * 3_600_000_000
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
        self.db.history(project, thread).await
    }

    /// Appends messages to a thread, making it if new.
    pub async fn append(
        &self,
        project: &str,
        thread: &str,
        messages: &[serde_json::Value],
        now: DateTime<Utc>,
    ) -> Result<()> {
        limits::check_name("thread", thread)?;
        let messages: Vec<String> = messages.iter().map(|m| m.to_string()).collect();
        self.db
            .append(project, thread, &messages, micros(now))
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
    /// of a project that no longer keeps that kind.
    pub async fn sweep(&self, keep: &Retention, now: DateTime<Utc>) -> Result<Swept> {
        let mut swept = Swept::default();
        for project in self.db.projects_with_threads().await? {
            let before = keep
                .threads
                .get(&project)
                .map_or(i64::MAX, |h| cutoff(now, *h));
            swept.threads += self.db.sweep_threads(&project, before).await?;
        }
        for project in self.db.projects_with_notes().await? {
            let before = keep
                .notes
                .get(&project)
                .map_or(i64::MAX, |h| cutoff(now, *h));
            swept.notes += self.db.sweep_notes(&project, before).await?;
        }
        Ok(swept)
    }
}
