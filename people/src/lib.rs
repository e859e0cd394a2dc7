//! People who sign in. SCAFFOLD: the API below is the contract the web
//! crate and the admin API code against; bodies are being written.

use std::time::Duration;

use chrono::{DateTime, Utc};
use llmgw_domain::tenancy::UserStatus;
use llmgw_eventstore::AnyStore;

#[derive(Debug, Clone)]
pub struct PeopleConfig {
    /// A session unused this long is closed.
    pub session_idle: Duration,
    /// A session older than this is closed however busy.
    pub session_max: Duration,
    pub max_attempts: u32,
    pub attempt_window: Duration,
    /// A claim link unused this long no longer works.
    pub claim_ttl: Duration,
}

impl Default for PeopleConfig {
    fn default() -> Self {
        PeopleConfig {
            session_idle: Duration::from_secs(8 * 3600),
            session_max: Duration::from_secs(7 * 24 * 3600),
            max_attempts: 10,
            attempt_window: Duration::from_secs(15 * 60),
            claim_ttl: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PeopleError {
    #[error("that email and password do not match an account")]
    BadCredentials,
    #[error("this account is waiting for approval")]
    NotApproved,
    #[error("this account has been suspended")]
    Suspended,
    #[error("too many attempts; try again shortly")]
    TooManyTries,
    #[error("that does not look like an email address")]
    InvalidEmail,
    #[error("a password must be at least 12 characters")]
    WeakPassword,
    #[error("that is the password you already have")]
    SamePassword,
    #[error("not signed in")]
    NoSession,
    #[error("this link is not valid, has expired or has already been used")]
    ClaimInvalid,
    #[error("no such person")]
    NoPerson,
    #[error("the people tables: {0}")]
    Store(String),
}

/// A browser session just opened: the cookie's token and the CSRF token
/// its forms carry. Neither is stored, only their hashes.
#[derive(Debug, Clone)]
pub struct Opened {
    pub user_id: String,
    pub token: String,
    pub csrf: String,
}

/// A live session, resolved from its cookie.
#[derive(Debug, Clone)]
pub struct Session {
    pub user_id: String,
    pub csrf_hash: String,
    pub opened_at: DateTime<Utc>,
}

impl Session {
    /// Whether `submitted` is this session's CSRF token (constant time).
    pub fn csrf_ok(&self, submitted: &str) -> bool {
        let _ = submitted;
        false
    }
}

/// A person's personal data, as shown to admins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    pub user_id: String,
    pub email: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub last_login_at: Option<DateTime<Utc>>,
}

/// A key revealed by its claim link (once).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub key_id: String,
    pub secret: String,
}

#[derive(Debug)]
pub struct People {
    _store: AnyStore,
    _config: PeopleConfig,
}

type Result<T> = std::result::Result<T, PeopleError>;

impl People {
    pub fn new(store: &AnyStore, config: PeopleConfig) -> Self {
        People {
            _store: store.clone(),
            _config: config,
        }
    }

    /// A new pending person; `Ok(None)` when the email is taken (the
    /// caller answers exactly as for a new one).
    pub async fn sign_up(
        &self,
        _email: &str,
        _name: &str,
        _password: &str,
        _now: DateTime<Utc>,
    ) -> Result<Option<String>> {
        Err(PeopleError::Store("scaffold".into()))
    }

    /// `status` reads a person's state from the log's view.
    pub async fn sign_in(
        &self,
        _email: &str,
        _password: &str,
        _status: impl Fn(&str) -> Option<UserStatus> + Send,
        _now: DateTime<Utc>,
    ) -> Result<Opened> {
        Err(PeopleError::Store("scaffold".into()))
    }

    pub async fn resolve(&self, _token: &str, _now: DateTime<Utc>) -> Result<Session> {
        Err(PeopleError::NoSession)
    }

    pub async fn sign_out(&self, _token: &str) -> Result<()> {
        Ok(())
    }

    /// Closes every session of the person and opens one for this browser.
    pub async fn change_password(
        &self,
        _user_id: &str,
        _current: &str,
        _next: &str,
        _now: DateTime<Utc>,
    ) -> Result<Opened> {
        Err(PeopleError::Store("scaffold".into()))
    }

    /// An operator's reset: sets the password, closes every session.
    pub async fn reset_password(&self, _user_id: &str, _password: &str) -> Result<()> {
        Err(PeopleError::Store("scaffold".into()))
    }

    pub async fn close_sessions(&self, _user_id: &str) -> Result<u64> {
        Ok(0)
    }

    /// Removes the person's personal data and sessions; false when none.
    pub async fn erase(&self, _user_id: &str) -> Result<bool> {
        Ok(false)
    }

    pub async fn person(&self, _user_id: &str) -> Result<Option<Person>> {
        Ok(None)
    }

    pub async fn people(&self) -> Result<Vec<Person>> {
        Ok(Vec::new())
    }

    /// Seals `secret` with a fresh link token and keeps only its hash;
    /// returns the token.
    pub async fn seal_claim(&self, _key_id: &str, _secret: &str, _now: DateTime<Utc>) -> Result<String> {
        Err(PeopleError::Store("scaffold".into()))
    }

    /// Whether the link still works (without using it).
    pub async fn claim_open(&self, _token: &str, _now: DateTime<Utc>) -> Result<bool> {
        Ok(false)
    }

    /// Reveals the key once: the sealed copy is wiped in the same step.
    pub async fn claim(&self, _token: &str, _now: DateTime<Utc>) -> Result<Claimed> {
        Err(PeopleError::ClaimInvalid)
    }
}
