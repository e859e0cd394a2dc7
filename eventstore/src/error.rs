use chrono::{DateTime, Utc};

use crate::ExpectedVersion;

/// Everything the event store can refuse or fail with. One type for the whole
/// surface, so that callers match on the cases they handle and report the rest.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("bad store address {address:?}: {reason}")]
    BadAddress { address: String, reason: String },

    #[error("cannot open the store at {address}")]
    Connect {
        address: String,
        #[source]
        source: sqlx::Error,
    },

    #[error(
        "the store at {address} has no llmgw schema yet; run `llmgw store migrate --store {address}`"
    )]
    NotMigrated { address: String },

    #[error("there is no log at {address}: no such file")]
    NoSuchFile { address: String },

    #[error("migration {version} ({name}) was changed after it was applied")]
    MigrationChanged { version: i64, name: String },

    #[error("the store's schema (version {found}) is newer than this binary knows ({known})")]
    SchemaTooNew { found: i64, known: i64 },

    #[error("stream {stream}: expected {expected}, but its version is {actual}")]
    VersionConflict {
        stream: String,
        expected: ExpectedVersion,
        actual: u64,
    },

    /// The writer no longer holds the append lease: it must stop acting.
    #[error(
        "append refused: the lease is {current_holder:?} at epoch {current_epoch}, not this writer's"
    )]
    Fenced {
        current_holder: Option<String>,
        current_epoch: u64,
    },

    #[error(
        "the append lease is held by {holder} (epoch {epoch}) until {}",
        expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    )]
    LeaseHeld {
        holder: String,
        epoch: u64,
        expires_at: DateTime<Utc>,
    },

    /// The request itself is malformed; nothing was written.
    #[error("invalid request: {0}")]
    Invalid(String),

    /// An import that does not fit the store or is not a faithful export;
    /// nothing was written.
    #[error("import refused: {0}")]
    ImportRefused(String),

    /// Writing an export failed (a full disk, a closed pipe).
    #[error("writing the export")]
    Export(#[source] std::io::Error),

    #[error("event {event_id} was already appended, but not in this batch")]
    DuplicateEventId { event_id: uuid::Uuid },

    #[error("no upcaster takes {event_type} from schema version {from} towards {to}")]
    MissingUpcaster {
        event_type: String,
        from: u32,
        to: u32,
    },

    #[error("upcasting {event_type} v{from} failed: {reason}")]
    Upcast {
        event_type: String,
        from: u32,
        reason: String,
    },

    #[error("checkpoint {name} is at position {position}, ahead of the log's surviving history")]
    CheckpointAhead { name: String, position: u64 },

    #[error("stored row at position {position} is unreadable: {reason}")]
    Corrupt { position: u64, reason: String },

    /// The store could not write for want of room: a full disk, a file
    /// that reached its size limit (SQLite), a full tablespace
    /// (PostgreSQL). The transaction was rolled back: nothing was written
    /// and nothing is damaged.
    #[error(
        "the store has no room to write ({detail}); nothing was written: free space on its disk"
    )]
    Full {
        detail: String,
        #[source]
        source: sqlx::Error,
    },

    /// SQLite's file stayed locked by another process's write past the
    /// wait (`busy_timeout`): a server, or another command, writing it.
    #[error(
        "the log is locked by another process writing it (a server, or another llmgw command) and stayed locked past the 5 s wait ({detail}); try again, or stop the other writer"
    )]
    Busy {
        detail: String,
        #[source]
        source: sqlx::Error,
    },

    #[error("database error: {0}")]
    Database(sqlx::Error),

    /// The task writing the append's group ended before it answered (a
    /// runtime shutting down): whether the append was written is unknown,
    /// and a retry with the same event ids is safe.
    #[error("the append was interrupted before it was answered")]
    Interrupted,
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        let full = match &e {
            sqlx::Error::Database(db) => match db.code().as_deref() {
                // SQLITE_FULL; SQLITE_IOERR_WRITE, which is what a write
                // refused whole with EFBIG (a file-size limit) or ENOSPC
                // mid-page becomes; PostgreSQL's disk_full.
                Some("13" | "778" | "53100") => Some(db.message().to_owned()),
                _ => None,
            },
            _ => None,
        };
        // SQLITE_BUSY and its extended codes (BUSY_RECOVERY, _SNAPSHOT,
        // _TIMEOUT), by SQLite's own numbers: PostgreSQL's are five
        // characters and never these.
        let busy = match &e {
            sqlx::Error::Database(db) => {
                matches!(db.code().as_deref(), Some("5" | "261" | "517" | "773"))
                    .then(|| db.message().to_owned())
            }
            _ => None,
        };
        match (full, busy) {
            (Some(detail), _) => StoreError::Full { detail, source: e },
            (None, Some(detail)) => StoreError::Busy { detail, source: e },
            (None, None) => StoreError::Database(e),
        }
    }
}

impl StoreError {
    /// True when retrying the same call later may succeed (lock timeouts,
    /// lost connections); false for refusals that a retry cannot change.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Busy { .. } => true,
            StoreError::Database(e) => match e {
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
                sqlx::Error::Database(db) => {
                    let code = db.code();
                    let code = code.as_deref().unwrap_or("");
                    // Connection exceptions (08…): the server went away.
                    code.starts_with("08")
                        || matches!(
                            code,
                            // lock_not_available, serialization_failure,
                            // deadlock, admin_shutdown, crash_shutdown,
                            // cannot_connect_now (a server starting or
                            // stopping), too_many_connections, SQLITE_BUSY,
                            // SQLITE_LOCKED, SQLITE_BUSY_SNAPSHOT
                            "55P03"
                                | "40001"
                                | "40P01"
                                | "57P01"
                                | "57P02"
                                | "57P03"
                                | "53300"
                                | "5"
                                | "6"
                                | "517"
                        )
                }
                _ => false,
            },
            StoreError::Connect { .. } | StoreError::Interrupted => true,
            _ => false,
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Times in messages are written as the docs and every table write
    /// them: RFC 3339, to the millisecond, in UTC with its Z.
    #[test]
    fn a_held_lease_says_until_when_as_rfc_3339() {
        let e = StoreError::LeaseHeld {
            holder: "server-a".into(),
            epoch: 3,
            expires_at: DateTime::parse_from_rfc3339("2026-12-07T18:30:21.993637Z")
                .unwrap()
                .with_timezone(&Utc),
        };
        assert_eq!(
            e.to_string(),
            "the append lease is held by server-a (epoch 3) until 2026-12-07T18:30:21.993Z"
        );
    }
}
