//! What a migration run must do, decided once for both backends: which
//! known migrations the database lacks, and whether its history is one this
//! binary can work with.

use std::collections::HashMap;

use llmgw_migrations::Migration;
use sha2::{Digest, Sha256};

use crate::{Result, StoreError};

/// The migrations to apply, in order, each with the checksum to record.
/// Refuses a database with a newer schema or an edited applied migration.
pub(crate) fn pending<'a>(
    known: &'a [Migration],
    applied: &HashMap<i64, Vec<u8>>,
) -> Result<Vec<(&'a Migration, Vec<u8>)>> {
    let newest = known.last().map_or(0, |m| m.version);
    if let Some(&found) = applied.keys().max()
        && found > newest
    {
        return Err(StoreError::SchemaTooNew {
            found,
            known: newest,
        });
    }
    let mut todo = Vec::new();
    for m in known {
        let sum = Sha256::digest(m.sql.as_bytes()).to_vec();
        match applied.get(&m.version) {
            Some(stored) if *stored == sum => {}
            Some(_) => {
                return Err(StoreError::MigrationChanged {
                    version: m.version,
                    name: m.name.to_owned(),
                });
            }
            None => todo.push((m, sum)),
        }
    }
    Ok(todo)
}

/// Where a store's schema stands against this binary's, read without
/// changing the store (`llmgw server --check` before a start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaState {
    /// No llmgw schema yet: an open that migrates creates it (`known`).
    Empty { known: i64 },
    /// Older than this binary's: an open that migrates brings it to `known`.
    Behind { found: i64, known: i64 },
    /// This binary's.
    Current { version: i64 },
}

/// The state of a store with `applied` migrations (version to checksum),
/// refused as a migration run would refuse it: a newer schema, or an
/// applied migration edited since.
pub(crate) fn state(known: &[Migration], applied: &HashMap<i64, Vec<u8>>) -> Result<SchemaState> {
    let todo = pending(known, applied)?;
    let newest = known.last().map_or(0, |m| m.version);
    Ok(match applied.keys().max() {
        None => SchemaState::Empty { known: newest },
        Some(&found) if todo.is_empty() => SchemaState::Current { version: found },
        Some(&found) => SchemaState::Behind {
            found,
            known: newest,
        },
    })
}

/// Whether the database's newest applied version is the binary's newest.
pub(crate) fn check_current(known: &[Migration], found: Option<i64>, address: &str) -> Result<()> {
    let newest = known.last().map_or(0, |m| m.version);
    match found {
        Some(v) if v > newest => Err(StoreError::SchemaTooNew {
            found: v,
            known: newest,
        }),
        Some(v) if v == newest => Ok(()),
        _ => Err(StoreError::NotMigrated {
            address: address.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[Migration] = &[
        Migration {
            version: 1,
            name: "one",
            sql: "CREATE TABLE a (x int)",
        },
        Migration {
            version: 2,
            name: "two",
            sql: "CREATE TABLE b (x int)",
        },
    ];

    fn sum(sql: &str) -> Vec<u8> {
        Sha256::digest(sql.as_bytes()).to_vec()
    }

    #[test]
    fn only_missing_migrations_are_pending() {
        let applied = HashMap::from([(1, sum(KNOWN[0].sql))]);
        let todo = pending(KNOWN, &applied).unwrap();
        assert_eq!(
            todo.iter().map(|(m, _)| m.version).collect::<Vec<_>>(),
            vec![2]
        );
    }

    #[test]
    fn an_edited_or_newer_history_is_refused() {
        let edited = HashMap::from([(1, sum("CREATE TABLE a (y int)"))]);
        assert!(matches!(
            pending(KNOWN, &edited),
            Err(StoreError::MigrationChanged { version: 1, .. })
        ));
        let newer = HashMap::from([(3, vec![])]);
        assert!(matches!(
            pending(KNOWN, &newer),
            Err(StoreError::SchemaTooNew { found: 3, known: 2 })
        ));
        assert!(matches!(
            check_current(KNOWN, Some(1), "x"),
            Err(StoreError::NotMigrated { .. })
        ));
        assert!(check_current(KNOWN, Some(2), "x").is_ok());
    }

    #[test]
    fn a_state_is_read_as_a_migration_run_would_judge_it() {
        let one = HashMap::from([(1, sum(KNOWN[0].sql))]);
        let both = HashMap::from([(1, sum(KNOWN[0].sql)), (2, sum(KNOWN[1].sql))]);
        assert_eq!(
            state(KNOWN, &HashMap::new()).unwrap(),
            SchemaState::Empty { known: 2 }
        );
        assert_eq!(
            state(KNOWN, &one).unwrap(),
            SchemaState::Behind { found: 1, known: 2 }
        );
        assert_eq!(
            state(KNOWN, &both).unwrap(),
            SchemaState::Current { version: 2 }
        );
        let edited = HashMap::from([(1, sum("CREATE TABLE a (y int)"))]);
        assert!(matches!(
            state(KNOWN, &edited),
            Err(StoreError::MigrationChanged { version: 1, .. })
        ));
        let newer = HashMap::from([(3, vec![])]);
        assert!(matches!(
            state(KNOWN, &newer),
            Err(StoreError::SchemaTooNew { found: 3, known: 2 })
        ));
    }
}
