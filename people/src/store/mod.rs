//! The people tables, written once per backend (`pg.rs`, `sqlite.rs`) with
//! plain binds: there is no database at build time to check macros against.
//!
//! Both backends use the event store's pools: PostgreSQL's pool, SQLite's
//! single writer connection (so writes here queue behind the log's, never
//! race them for the file lock).

mod pg;
mod sqlite;

use chrono::{DateTime, Utc};
use llmgw_eventstore::AnyStore;
use sqlx::{PgPool, SqlitePool};

use crate::{PeopleError, Person, Result, Swept};

#[derive(Debug)]
pub(crate) enum Db {
    Pg(PgPool),
    Lite(SqlitePool),
}

pub(crate) struct NewPerson<'a> {
    pub user_id: &'a str,
    pub email: &'a str,
    pub name: &'a str,
    pub password_hash: &'a str,
    pub created_at: DateTime<Utc>,
}

/// A session to insert; it is last seen when created.
pub(crate) struct NewSession {
    pub token_hash: String,
    pub user_id: String,
    pub csrf_hash: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

pub(crate) struct SessionRow {
    pub user_id: String,
    pub csrf_hash: String,
    pub created_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

pub(crate) struct NewClaim<'a> {
    pub token_hash: &'a str,
    pub key_id: &'a str,
    pub sealed: &'a [u8],
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// A password to set, and what the caller believes it replaces.
pub(crate) struct NewPassword<'a> {
    pub user_id: &'a str,
    pub hash: &'a str,
    /// Set only if the stored hash is still this one: a change verified
    /// against a hash that another change replaced meanwhile fails.
    pub replaces: Option<&'a str>,
    /// Opened in the same transaction that closes every other session.
    pub reopen: Option<&'a NewSession>,
}

/// Every person and claim link of a store, as `llmgw store copy` moves
/// them to another. Sessions stay behind: people sign in again.
#[derive(Debug, Default)]
pub struct Rows {
    pub(crate) people: Vec<PersonRow>,
    pub(crate) claims: Vec<ClaimRow>,
}

impl Rows {
    /// People, then claim links.
    pub fn counts(&self) -> (usize, usize) {
        (self.people.len(), self.claims.len())
    }
}

#[derive(Debug)]
pub(crate) struct PersonRow {
    pub user_id: String,
    pub email: String,
    pub name: String,
    pub password_hash: String,
    pub created_at: DateTime<Utc>,
    pub last_login_at: Option<DateTime<Utc>>,
}

#[derive(Debug)]
pub(crate) struct ClaimRow {
    pub token_hash: String,
    pub key_id: String,
    pub sealed: Option<Vec<u8>>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub claimed_at: Option<DateTime<Utc>>,
}

pub(crate) fn db_err(e: sqlx::Error) -> PeopleError {
    PeopleError::Store(e.to_string())
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
    pub(crate) fn new(store: &AnyStore) -> Self {
        match store {
            AnyStore::Postgres(s) => Db::Pg(s.pool().clone()),
            AnyStore::Sqlite(s) => Db::Lite(s.pool().clone()),
        }
    }

    /// False when the email is taken (nothing changes).
    pub(crate) async fn insert_person(&self, p: &NewPerson<'_>) -> Result<bool> {
        each!(self, insert_person(p))
    }

    /// The id and password hash of the person with this (normalised) email.
    pub(crate) async fn login(&self, email: &str) -> Result<Option<(String, String)>> {
        each!(self, login(email))
    }

    pub(crate) async fn password_hash(&self, user_id: &str) -> Result<Option<String>> {
        each!(self, password_hash(user_id))
    }

    pub(crate) async fn touch_login(&self, user_id: &str, now: DateTime<Utc>) -> Result<()> {
        each!(self, touch_login(user_id, now))
    }

    pub(crate) async fn open_session(&self, s: &NewSession) -> Result<()> {
        each!(self, open_session(s))
    }

    /// The session with this token hash, if its person still exists.
    pub(crate) async fn session(&self, token_hash: &str) -> Result<Option<SessionRow>> {
        each!(self, session(token_hash))
    }

    pub(crate) async fn touch_session(&self, token_hash: &str, now: DateTime<Utc>) -> Result<()> {
        each!(self, touch_session(token_hash, now))
    }

    pub(crate) async fn close_session(&self, token_hash: &str) -> Result<()> {
        each!(self, close_session(token_hash))
    }

    pub(crate) async fn close_sessions(&self, user_id: &str) -> Result<u64> {
        each!(self, close_sessions(user_id))
    }

    /// Sets the password and closes every session of the person, in one
    /// transaction; false when there is no such person (or `replaces` no
    /// longer matches).
    pub(crate) async fn set_password(&self, p: &NewPassword<'_>) -> Result<bool> {
        each!(self, set_password(p))
    }

    /// Deletes the person and their sessions; whether the person existed.
    pub(crate) async fn erase(&self, user_id: &str) -> Result<bool> {
        each!(self, erase(user_id))
    }

    pub(crate) async fn person(&self, user_id: &str) -> Result<Option<Person>> {
        each!(self, person(user_id))
    }

    pub(crate) async fn people(&self) -> Result<Vec<Person>> {
        each!(self, people())
    }

    pub(crate) async fn insert_claim(&self, c: &NewClaim<'_>) -> Result<()> {
        each!(self, insert_claim(c))
    }

    pub(crate) async fn claim_open(&self, token_hash: &str, now: DateTime<Utc>) -> Result<bool> {
        each!(self, claim_open(token_hash, now))
    }

    /// Marks the link used and wipes its sealed key in one transaction, if
    /// it was unused and unexpired; the key id and sealed bytes it held.
    pub(crate) async fn take_claim(
        &self,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<(String, Vec<u8>)>> {
        each!(self, take_claim(token_hash, now))
    }

    pub(crate) async fn dump(&self) -> Result<Rows> {
        each!(self, dump())
    }

    /// Inserts `rows` in one transaction; refused (nothing written) where
    /// any person is already there.
    pub(crate) async fn load(&self, rows: &Rows) -> Result<()> {
        each!(self, load(rows))
    }

    pub(crate) async fn sweep(
        &self,
        now: DateTime<Utc>,
        idle_cutoff: DateTime<Utc>,
    ) -> Result<Swept> {
        each!(self, sweep(now, idle_cutoff))
    }
}
