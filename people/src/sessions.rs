//! Browser sessions: a cookie token and a CSRF token, stored as hashes.

use chrono::{DateTime, Utc};
use subtle::ConstantTimeEq;

use crate::store::NewSession;
use crate::{Opened, People, PeopleError, Result, Session, secret, time};

/// Longer than any token this crate issues: not worth a lookup.
const MAX_TOKEN_LEN: usize = 256;

impl Session {
    /// Whether `submitted` is this session's CSRF token (constant time).
    pub fn csrf_ok(&self, submitted: &str) -> bool {
        if submitted.is_empty() || self.csrf_hash.is_empty() {
            return false;
        }
        let hash = secret::token_hash(submitted);
        bool::from(hash.as_bytes().ct_eq(self.csrf_hash.as_bytes()))
    }
}

impl People {
    /// A fresh session and CSRF token for `user_id`, not yet stored.
    pub(crate) fn new_session(
        &self,
        user_id: &str,
        now: DateTime<Utc>,
    ) -> Result<(Opened, NewSession)> {
        let (token, csrf) = (secret::token()?, secret::token()?);
        let row = NewSession {
            token_hash: secret::token_hash(&token),
            user_id: user_id.to_owned(),
            csrf_hash: secret::token_hash(&csrf),
            created_at: now,
            expires_at: time::plus(now, self.config.session_max),
        };
        let opened = Opened {
            user_id: user_id.to_owned(),
            token,
            csrf,
        };
        Ok((opened, row))
    }

    /// Opens a session with no password or state check: callers have made
    /// them.
    pub(crate) async fn open_session(&self, user_id: &str, now: DateTime<Utc>) -> Result<Opened> {
        let (opened, row) = self.new_session(user_id, now)?;
        self.db.open_session(&row).await?;
        Ok(opened)
    }

    /// The live session behind a cookie: `NoSession` when the token is
    /// empty or unknown, when the session has been idle longer than
    /// `session_idle`, or when it is older than `session_max`. Using a
    /// session keeps it alive.
    pub async fn resolve(&self, token: &str, now: DateTime<Utc>) -> Result<Session> {
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return Err(PeopleError::NoSession);
        }
        let now = time::exact(now);
        let hash = secret::token_hash(token);
        let Some(row) = self.db.session(&hash).await? else {
            return Err(PeopleError::NoSession);
        };
        let idle = time::more_than(row.last_seen_at, now, self.config.session_idle);
        if idle || now >= row.expires_at {
            // It can never be used again: forget it now rather than at the
            // next sweep.
            if let Err(e) = self.db.close_session(&hash).await {
                tracing::debug!(error = %e, "could not delete an expired session");
            }
            return Err(PeopleError::NoSession);
        }
        if let Err(e) = self.db.touch_session(&hash, now).await {
            tracing::debug!(error = %e, "could not note a session's use");
        }
        Ok(Session {
            user_id: row.user_id,
            csrf_hash: row.csrf_hash,
            opened_at: row.created_at,
        })
    }

    /// Ends one session; an empty or unknown token is no error.
    pub async fn sign_out(&self, token: &str) -> Result<()> {
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return Ok(());
        }
        self.db.close_session(&secret::token_hash(token)).await
    }

    /// Ends every session of the person (suspension, erasure, a reset);
    /// how many there were.
    pub async fn close_sessions(&self, user_id: &str) -> Result<u64> {
        self.db.close_sessions(user_id).await
    }
}
