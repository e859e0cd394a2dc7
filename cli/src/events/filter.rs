//! Which events `events tail` prints: by type (a list, with prefixes) and
//! by who acted.

use chrono::{DateTime, Utc};
use llmgw_eventstore::RecordedEvent;

/// Event types as an operator writes them: `NodeLost,Replica*`, a comma
/// list where a trailing `*` matches every type that starts so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TypePatterns(Vec<(String, bool)>);

impl std::str::FromStr for TypePatterns {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = Vec::new();
        for item in s.split(',').map(str::trim) {
            let (name, prefix) = match item.strip_suffix('*') {
                Some(p) => (p, true),
                None => (item, false),
            };
            if name.is_empty() || name.contains('*') {
                return Err(format!(
                    "{s:?}: give event types separated by commas, each a name or a name's start followed by * (NodeLost,Replica*)"
                ));
            }
            // A typo would print nothing, and an auditor read "none such".
            let known = || llmgw_domain::Event::types().map(|(t, _)| t);
            if !known().any(|t| {
                if prefix {
                    t.starts_with(name)
                } else {
                    t == name
                }
            }) {
                let lower = name.to_lowercase();
                let meant = if prefix {
                    // The prefix in the types' own case: `key*` means
                    // `Key*` (KeyIssued and KeyRevoked), not the first
                    // type that starts so.
                    known()
                        .find(|t| t.to_lowercase().starts_with(&lower))
                        .and_then(|t| t.get(..name.len()))
                        .map(|p| format!("{p}*"))
                } else {
                    // The same name in another case, else the nearest a
                    // letter or two away (KeyIsued, KeyIssue).
                    known()
                        .find(|t| t.to_lowercase() == lower)
                        .or_else(|| {
                            known()
                                .map(|t| (crate::config::edits(&t.to_lowercase(), &lower), t))
                                .filter(|(d, _)| *d <= 2)
                                .min_by_key(|(d, _)| *d)
                                .map(|(_, t)| t)
                        })
                        .map(str::to_owned)
                };
                return Err(match meant {
                    Some(t) => format!("no event type is {item}; did you mean {t}?"),
                    None => format!(
                        "no event type is {item} (`llmgw events stats` counts the types in this log)"
                    ),
                });
            }
            out.push((name.to_owned(), prefix));
        }
        Ok(TypePatterns(out))
    }
}

impl TypePatterns {
    pub(crate) fn matches(&self, event_type: &str) -> bool {
        self.0.iter().any(|(name, prefix)| {
            if *prefix {
                event_type.starts_with(name.as_str())
            } else {
                event_type == name
            }
        })
    }

    /// The one exact type asked for, which the store can filter on itself.
    pub(crate) fn single(&self) -> Option<&str> {
        match self.0.as_slice() {
            [(name, false)] => Some(name),
            _ => None,
        }
    }
}

/// What `tail` keeps; an empty filter keeps everything.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub(crate) types: Option<TypePatterns>,
    /// Who acted, as `events log` shows it in its BY column.
    pub(crate) actor: Option<String>,
}

impl Filter {
    pub(crate) fn is_empty(&self) -> bool {
        self.types.is_none() && self.actor.is_none()
    }

    pub(crate) fn keeps(&self, e: &RecordedEvent) -> bool {
        self.types.as_ref().is_none_or(|t| t.matches(&e.event_type))
            && self
                .actor
                .as_ref()
                // The name alone, or as the BY column shows it.
                .is_none_or(|a| {
                    llmgw_decider::actor_of(e).0 == *a || super::history::actor(e) == *a
                })
    }
}

/// Every time that `events` prints for people: UTC to the millisecond,
/// with its zone (`2026-12-03T07:45:12.345Z`).
pub(crate) fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_names_or_prefixes() {
        let t: TypePatterns = "NodeLost, Replica*".parse().unwrap();
        assert!(t.matches("NodeLost") && t.matches("ReplicaPlaced") && t.matches("Replica"));
        assert!(!t.matches("NodeLostAgain") && !t.matches("ShardStateChanged"));
        assert_eq!(t.single(), None);
        let one: TypePatterns = "KeyRevoked".parse().unwrap();
        assert_eq!(one.single(), Some("KeyRevoked"));
        for bad in ["", "A,,B", "Re*plica", "*"] {
            assert!(bad.parse::<TypePatterns>().is_err(), "{bad:?}");
        }
    }

    /// `--actor` takes the name, or the BY column's text with its kind.
    #[test]
    fn an_actor_is_its_name_or_as_the_by_column_shows_it() {
        let e = RecordedEvent {
            position: 1,
            stream_id: "leadership".into(),
            stream_version: 1,
            event_id: uuid::Uuid::nil(),
            event_type: "LeadershipAcquired".into(),
            schema_version: 1,
            payload: serde_json::json!({}),
            metadata: serde_json::json!({"actor": "up", "actor_kind": "leader"}),
            epoch: 1,
            recorded_at: DateTime::from_timestamp_micros(0).unwrap(),
            hash: [0; 32],
        };
        let by = |a: &str| Filter {
            types: None,
            actor: Some(a.into()),
        };
        assert!(by("up").keeps(&e) && by("up (leader)").keeps(&e));
        assert!(!by("up (gateway)").keeps(&e) && !by("Up").keeps(&e));
    }

    #[test]
    fn times_are_milliseconds_in_utc() {
        let t = DateTime::from_timestamp_micros(1_796_283_912_345_678).unwrap();
        assert_eq!(when(t), "2026-12-03T07:45:12.345Z");
    }
}
