//! Signing up, signing in, passwords and erasure.

use chrono::{DateTime, Utc};
use llmgw_domain::tenancy::UserStatus;

use crate::password::{self, check_strength, hash_blocking, verify_blocking};
use crate::store::{NewPassword, NewPerson, Rows};
use crate::{Opened, People, PeopleError, Person, Result, email, secret, time};

impl People {
    /// A new pending person; `Ok(None)` when the email is taken (the
    /// caller answers exactly as for a new one).
    pub async fn sign_up(
        &self,
        email: &str,
        name: &str,
        password: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<String>> {
        let email = email::check_email(email)?;
        check_strength(password)?;
        let name = match name.trim() {
            "" => email.as_str(),
            // Shown on the admin pages and kept until erased: a line.
            n if n.chars().count() > 100 || n.chars().any(llmgw_domain::tenancy::hidden_char) => {
                return Err(PeopleError::BadName);
            }
            n => n,
        };
        // Hashed whether or not the address is taken: the answer's timing
        // must not tell.
        let hash = hash_blocking(password).await?;
        let user_id = secret::new_user_id()?;
        let inserted = self
            .db
            .insert_person(&NewPerson {
                user_id: &user_id,
                email: &email,
                name,
                password_hash: &hash,
                created_at: time::exact(now),
            })
            .await?;
        if !inserted {
            tracing::info!("a sign-up for an address already registered; nothing changed");
            return Ok(None);
        }
        Ok(Some(user_id))
    }

    /// `status` reads a person's state from the log's view.
    pub async fn sign_in(
        &self,
        email: &str,
        password: &str,
        status: impl Fn(&str) -> Option<UserStatus> + Send,
        now: DateTime<Utc>,
    ) -> Result<Opened> {
        let now = time::exact(now);
        let email = email::normalize_email(email);
        // Before the lookup, so that guessing at unknown addresses counts.
        if !self.attempts.allow(&email, now) {
            return Err(self.attempts.locked(&email, now));
        }
        let found = match email::check_email(&email) {
            Ok(_) => self.db.login(&email).await?,
            Err(_) => None,
        };
        // A check the server was too busy to make costs no attempt: else
        // a flood of others' posts would lock a person out.
        let refund_if_busy = |r: Result<bool>| {
            if matches!(r, Err(PeopleError::Busy)) {
                self.attempts.refund(&email);
            }
            r
        };
        let Some((user_id, hash)) = found else {
            refund_if_busy(verify_blocking(password, password::DUMMY_HASH).await)?;
            return Err(PeopleError::BadCredentials);
        };
        if !refund_if_busy(verify_blocking(password, &hash).await)? {
            return Err(PeopleError::BadCredentials);
        }
        // Only a right password learns the account's state, and only of an
        // account that was approved once: a pending one is answered as a
        // wrong password (and counted as one), since whoever signed up
        // chose that password, perhaps for someone else's address.
        match status(&user_id) {
            None | Some(UserStatus::Erased) | Some(UserStatus::Pending) => {
                return Err(PeopleError::BadCredentials);
            }
            Some(UserStatus::Suspended) => {
                self.attempts.clear(&email);
                return Err(PeopleError::Suspended);
            }
            Some(UserStatus::Active) => self.attempts.clear(&email),
        }
        let opened = self.open_session(&user_id, now).await?;
        if let Err(e) = self.db.touch_login(&user_id, now).await {
            tracing::warn!(user_id, error = %e, "could not note a sign-in");
        }
        Ok(opened)
    }

    /// Closes every session of the person and opens one for this browser.
    pub async fn change_password(
        &self,
        user_id: &str,
        current: &str,
        next: &str,
        now: DateTime<Utc>,
    ) -> Result<Opened> {
        let now = time::exact(now);
        let key = format!("pw:{user_id}");
        if !self.attempts.allow(&key, now) {
            return Err(self.attempts.locked(&key, now));
        }
        let Some(old) = self.db.password_hash(user_id).await? else {
            return Err(PeopleError::NoPerson);
        };
        let verified = verify_blocking(current, &old).await;
        if matches!(verified, Err(PeopleError::Busy)) {
            self.attempts.refund(&key);
        }
        if !verified? {
            return Err(PeopleError::BadCredentials);
        }
        self.attempts.clear(&key);
        if verify_blocking(next, &old).await? {
            return Err(PeopleError::SamePassword);
        }
        let hash = hash_blocking(next).await?;
        let (opened, session) = self.new_session(user_id, now)?;
        let set = self
            .db
            .set_password(&NewPassword {
                user_id,
                hash: &hash,
                replaces: Some(&old),
                reopen: Some(&session),
            })
            .await?;
        if !set {
            // Changed or erased since `current` was checked against it.
            return Err(PeopleError::BadCredentials);
        }
        Ok(opened)
    }

    /// An operator's reset: sets the password, closes every session.
    pub async fn reset_password(&self, user_id: &str, password: &str) -> Result<()> {
        let hash = hash_blocking(password).await?;
        let set = self
            .db
            .set_password(&NewPassword {
                user_id,
                hash: &hash,
                replaces: None,
                reopen: None,
            })
            .await?;
        if !set {
            return Err(PeopleError::NoPerson);
        }
        Ok(())
    }

    /// Removes the person's personal data and sessions; false when none.
    pub async fn erase(&self, user_id: &str) -> Result<bool> {
        self.db.erase(user_id).await
    }

    pub async fn person(&self, user_id: &str) -> Result<Option<Person>> {
        self.db.person(user_id).await
    }

    /// Everyone, oldest first.
    pub async fn people(&self) -> Result<Vec<Person>> {
        self.db.people().await
    }

    /// Every person (with their password's hash) and claim link, for a
    /// copy of the store: `llmgw store copy`.
    pub async fn dump(&self) -> Result<Rows> {
        self.db.dump().await
    }

    /// Puts `rows` from another store's `dump` here, in one transaction;
    /// refused where anyone is here already.
    pub async fn load(&self, rows: &Rows) -> Result<()> {
        self.db.load(rows).await
    }
}
