//! The SQL schema of the event store for both backends, as ordered, embedded
//! migrations.
//!
//! What belongs here: the `.sql` files under `postgres/` and `sqlite/` and the
//! lists that embed them. Both lists describe the same logical schema and
//! must stay in step: a migration added to one is added to the other, with
//! the same version and name.
//!
//! What must not: code that runs them (that is `llmgw-eventstore`, the only
//! crate that touches the event tables) or any dependency.

/// One migration: applied once, in version order, inside a transaction.
///
/// An applied migration is never edited: the runner stores a checksum of
/// `sql` and refuses to start against a database whose history differs.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Migrations for PostgreSQL, oldest first.
pub const POSTGRES: &[Migration] = &[
    Migration {
        version: 1,
        name: "event_store",
        sql: include_str!("../postgres/0001_event_store.sql"),
    },
    Migration {
        version: 2,
        name: "snapshots",
        sql: include_str!("../postgres/0002_snapshots.sql"),
    },
    Migration {
        version: 3,
        name: "people",
        sql: include_str!("../postgres/0003_people.sql"),
    },
    Migration {
        version: 4,
        name: "log_base",
        sql: include_str!("../postgres/0004_log_base.sql"),
    },
    Migration {
        version: 5,
        name: "conversations",
        sql: include_str!("../postgres/0005_conversations.sql"),
    },
    Migration {
        version: 6,
        name: "snapshots_compressed",
        sql: include_str!("../postgres/0006_snapshots_compressed.sql"),
    },
    Migration {
        version: 7,
        name: "notes_search",
        sql: include_str!("../postgres/0007_notes_search.sql"),
    },
];

/// Migrations for SQLite, oldest first.
pub const SQLITE: &[Migration] = &[
    Migration {
        version: 1,
        name: "event_store",
        sql: include_str!("../sqlite/0001_event_store.sql"),
    },
    Migration {
        version: 2,
        name: "snapshots",
        sql: include_str!("../sqlite/0002_snapshots.sql"),
    },
    Migration {
        version: 3,
        name: "people",
        sql: include_str!("../sqlite/0003_people.sql"),
    },
    Migration {
        version: 4,
        name: "log_base",
        sql: include_str!("../sqlite/0004_log_base.sql"),
    },
    Migration {
        version: 5,
        name: "conversations",
        sql: include_str!("../sqlite/0005_conversations.sql"),
    },
    Migration {
        version: 6,
        name: "snapshots_compressed",
        sql: include_str!("../sqlite/0006_snapshots_compressed.sql"),
    },
    Migration {
        version: 7,
        name: "notes_search",
        sql: include_str!("../sqlite/0007_notes_search.sql"),
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_backends_have_the_same_history() {
        let pg: Vec<_> = POSTGRES.iter().map(|m| (m.version, m.name)).collect();
        let lite: Vec<_> = SQLITE.iter().map(|m| (m.version, m.name)).collect();
        assert_eq!(pg, lite);
    }

    #[test]
    fn versions_ascend_without_holes() {
        for (i, m) in POSTGRES.iter().enumerate() {
            assert_eq!(m.version, i as i64 + 1, "migration {} out of order", m.name);
        }
    }
}
