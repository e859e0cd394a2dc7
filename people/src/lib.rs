//! People who sign in: accounts, password hashes, browser sessions and key
//! claim links.
//!
//! What belongs here: the personal data the event log must not hold (email,
//! name, password hash), kept in erasable tables next to the log, and the
//! rules for signing in. A person's state (pending, active, suspended,
//! erased) lives in the log; [`People::sign_in`] asks the caller for it.
//!
//! Every method takes `now`: this crate never reads the clock, so tests and
//! replays are deterministic.

mod account;
mod attempts;
mod claims;
mod email;
mod password;
mod secret;
mod sessions;
mod store;
mod time;

use std::time::Duration;

use chrono::{DateTime, Utc};
use llmgw_eventstore::AnyStore;

pub use email::{check_email, normalize_email};
pub use store::Rows;

/// 32 bytes from the operating system's CSPRNG, lowercase hex: for tokens
/// made outside these tables (the pages' pre-session CSRF token).
pub fn random_hex_token() -> Result<String> {
    Ok(secret::hex(&secret::random::<32>()?))
}
pub use password::{BadHash, MIN_PASSWORD_CHARS, hash_password, verify_password};

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

impl PeopleConfig {
    /// Zero means "not set": a zero limit would lock everyone out or close
    /// every session at once, which no operator means.
    fn or_defaults(self) -> Self {
        let d = PeopleConfig::default();
        let pick = |v: Duration, dv: Duration| if v.is_zero() { dv } else { v };
        PeopleConfig {
            session_idle: pick(self.session_idle, d.session_idle),
            session_max: pick(self.session_max, d.session_max),
            max_attempts: if self.max_attempts == 0 {
                d.max_attempts
            } else {
                self.max_attempts
            },
            attempt_window: pick(self.attempt_window, d.attempt_window),
            claim_ttl: pick(self.claim_ttl, d.claim_ttl),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PeopleError {
    /// A pending account says the same, right password or not: anyone
    /// may sign up with an address and a password of their own, and
    /// "waiting for approval" after it told a new address from a taken
    /// one.
    #[error(
        "that email and password do not match an account that may sign in (a new account may once an operator approves it)"
    )]
    BadCredentials,
    #[error("this account has been suspended")]
    Suspended,
    /// Locked, the right password too, until the attempt window ends:
    /// `seconds` from now (a page's `Retry-After`), `minutes` rounded up.
    #[error("too many attempts: try again in {minutes} minute{}", if *minutes == 1 { "" } else { "s" })]
    TooManyTries { minutes: u64, seconds: u64 },
    #[error(
        "that does not look like an email address: it needs one @ and a dot after it, and may hold no spaces, quotes, angle brackets, or control, invisible or direction characters"
    )]
    InvalidEmail,
    #[error("a password must be at least 12 characters")]
    WeakPassword,
    #[error("that is the password you already have")]
    SamePassword,
    #[error(
        "a name is at most 100 characters, none of them control, invisible or direction characters"
    )]
    BadName,
    #[error("not signed in")]
    NoSession,
    #[error("this link is not valid, has expired or has already been used")]
    ClaimInvalid,
    #[error("no such person")]
    NoPerson,
    #[error("the server is busy; try again in a moment")]
    Busy,
    #[error("sign-up is paused: many accounts are waiting for approval; try again later")]
    TooManyPending,
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

/// What [`People::sweep`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Sessions past their idle or absolute expiry, deleted.
    pub sessions: u64,
    /// Expired, unclaimed links whose sealed key was wiped.
    pub claims: u64,
}

#[derive(Debug)]
pub struct People {
    db: store::Db,
    config: PeopleConfig,
    attempts: attempts::Attempts,
}

type Result<T> = std::result::Result<T, PeopleError>;

impl People {
    pub fn new(store: &AnyStore, config: PeopleConfig) -> Self {
        let config = config.or_defaults();
        People {
            db: store::Db::new(store),
            attempts: attempts::Attempts::new(config.max_attempts, config.attempt_window),
            config,
        }
    }

    /// Deletes expired sessions and wipes the sealed keys of expired links;
    /// a server runs it now and then so that nothing lingers.
    pub async fn sweep(&self, now: DateTime<Utc>) -> Result<Swept> {
        let now = time::exact(now);
        let idle_cutoff = time::minus(now, self.config.session_idle);
        self.db.sweep(now, idle_cutoff).await
    }
}
