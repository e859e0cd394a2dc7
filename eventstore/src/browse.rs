//! Browsing the log newest first with filters (the auditor's page): the
//! filter, and the query each backend runs for it.
//!
//! The query walks the position primary key downwards from the top of the
//! range, with the filters in `WHERE` and a `LIMIT`: a common filter stops
//! after a page's worth of rows, and the caller bounds a rare one by
//! narrowing the range (no `OFFSET`: a deep page costs what the first does).

use std::ops::Range;

use chrono::{DateTime, Utc};

use crate::{Result, to_i64};

/// Which events a browsing read returns: every field that is set must
/// match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// The event's type name, exactly.
    pub event_type: Option<String>,
    /// Any of these stream ids, exactly (empty: any stream).
    pub streams: Vec<String>,
    /// The stream id starts with this (case-sensitive).
    pub stream_prefix: Option<String>,
    /// The metadata's `actor`, exactly.
    pub actor: Option<String>,
    /// Recorded at or after this time.
    pub from: Option<DateTime<Utc>>,
    /// Recorded before this time.
    pub to: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    Sqlite,
}

/// A value bound to a placeholder.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Arg {
    Text(String),
    Int(i64),
    Time(DateTime<Utc>),
}

/// SQL with numbered placeholders and the values to bind to them, in order.
#[derive(Debug)]
pub(crate) struct Query {
    pub sql: String,
    pub args: Vec<Arg>,
}

impl Query {
    fn bind(&mut self, dialect: Dialect, arg: Arg) -> String {
        self.args.push(arg);
        match dialect {
            Dialect::Postgres => format!("${}", self.args.len()),
            Dialect::Sqlite => format!("?{}", self.args.len()),
        }
    }
}

/// `select` (a `SELECT … FROM es_events`) narrowed to `filter` within
/// `positions`, newest first.
pub(crate) fn backward(
    select: &str,
    dialect: Dialect,
    filter: &EventFilter,
    positions: Range<u64>,
    limit: usize,
) -> Result<Query> {
    let mut q = Query {
        sql: String::new(),
        args: Vec::new(),
    };
    // Positions are i64 in both schemas; a range past that is "to the end".
    let clamp = |p: u64| to_i64(p.min(i64::MAX as u64), "position");
    let mut clauses = vec![
        format!(
            "position >= {}",
            q.bind(dialect, Arg::Int(clamp(positions.start)?))
        ),
        format!(
            "position < {}",
            q.bind(dialect, Arg::Int(clamp(positions.end)?))
        ),
    ];
    if let Some(t) = &filter.event_type {
        clauses.push(format!(
            "event_type = {}",
            q.bind(dialect, Arg::Text(t.clone()))
        ));
    }
    if !filter.streams.is_empty() {
        let list: Vec<String> = filter
            .streams
            .iter()
            .map(|s| q.bind(dialect, Arg::Text(s.clone())))
            .collect();
        clauses.push(format!("stream_id IN ({})", list.join(", ")));
    }
    if let Some(prefix) = &filter.stream_prefix {
        clauses.push(match dialect {
            Dialect::Postgres => format!(
                "starts_with(stream_id, {})",
                q.bind(dialect, Arg::Text(prefix.clone()))
            ),
            // substr counts characters, as does the bound length.
            Dialect::Sqlite => {
                let len = q.bind(dialect, Arg::Int(prefix.chars().count() as i64));
                format!(
                    "substr(stream_id, 1, {len}) = {}",
                    q.bind(dialect, Arg::Text(prefix.clone()))
                )
            }
        });
    }
    if let Some(actor) = &filter.actor {
        let field = match dialect {
            Dialect::Postgres => "metadata->>'actor'",
            Dialect::Sqlite => "json_extract(metadata, '$.actor')",
        };
        clauses.push(format!(
            "{field} = {}",
            q.bind(dialect, Arg::Text(actor.clone()))
        ));
    }
    let time = |t: DateTime<Utc>| match dialect {
        Dialect::Postgres => Arg::Time(t),
        Dialect::Sqlite => Arg::Int(t.timestamp_micros()),
    };
    if let Some(from) = filter.from {
        clauses.push(format!("recorded_at >= {}", q.bind(dialect, time(from))));
    }
    if let Some(to) = filter.to {
        clauses.push(format!("recorded_at < {}", q.bind(dialect, time(to))));
    }
    // Within one stream, versions grow with positions: ordering by version
    // lets the (stream_id, stream_version) index serve the order, where
    // ordering by position would sort every event of a long stream.
    let order = if filter.streams.len() == 1 {
        "stream_version"
    } else {
        "position"
    };
    let limit = q.bind(dialect, Arg::Int(limit.min(i64::MAX as usize) as i64));
    q.sql = format!(
        "{select} WHERE {} ORDER BY {order} DESC LIMIT {limit}",
        clauses.join(" AND ")
    );
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_in_binding_order() {
        let filter = EventFilter {
            event_type: Some("KeyIssued".into()),
            streams: vec!["key-a".into(), "audit-key-a".into()],
            stream_prefix: Some("key-".into()),
            actor: Some("alice".into()),
            from: Some(DateTime::UNIX_EPOCH),
            to: None,
        };
        let q = backward(
            "SELECT * FROM es_events",
            Dialect::Sqlite,
            &filter,
            1..10,
            5,
        )
        .expect("query");
        assert_eq!(
            q.sql,
            "SELECT * FROM es_events WHERE position >= ?1 AND position < ?2 AND event_type = ?3 \
             AND stream_id IN (?4, ?5) AND substr(stream_id, 1, ?6) = ?7 \
             AND json_extract(metadata, '$.actor') = ?8 AND recorded_at >= ?9 \
             ORDER BY position DESC LIMIT ?10"
        );
        assert_eq!(q.args[5], Arg::Int(4));
        assert_eq!(q.args.len(), 10);
    }

    #[test]
    fn one_stream_is_walked_by_its_versions() {
        let filter = EventFilter {
            streams: vec!["node-a".into()],
            ..EventFilter::default()
        };
        let q = backward(
            "SELECT * FROM es_events",
            Dialect::Postgres,
            &filter,
            0..u64::MAX,
            5,
        )
        .expect("query");
        assert!(
            q.sql.ends_with("ORDER BY stream_version DESC LIMIT $4"),
            "{}",
            q.sql
        );
        assert_eq!(q.args[1], Arg::Int(i64::MAX));
    }
}
