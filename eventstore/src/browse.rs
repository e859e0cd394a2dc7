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
///
/// Exact streams are read one by one, each down its (stream_id,
/// stream_version) index (within a stream, versions grow with positions,
/// so that order is the log's), and the branches merged: a planner handed
/// `stream_id IN (…) ORDER BY position` walks the whole log backwards when
/// it misjudges how rare the streams are.
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
    let mut clauses = Vec::new();
    // Positions are i64 in both schemas. A bound that excludes nothing is
    // left out: given `position >= 1`, a planner without statistics may
    // read the whole primary key to intersect it with another index.
    if positions.start > 1 {
        let start = to_i64(positions.start.min(i64::MAX as u64), "position")?;
        clauses.push(format!("position >= {}", q.bind(dialect, Arg::Int(start))));
    }
    if positions.end < i64::MAX as u64 {
        let end = to_i64(positions.end, "position")?;
        clauses.push(format!("position < {}", q.bind(dialect, Arg::Int(end))));
    }
    if let Some(t) = &filter.event_type {
        clauses.push(format!(
            "event_type = {}",
            q.bind(dialect, Arg::Text(t.clone()))
        ));
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
    let limit = q.bind(dialect, Arg::Int(limit.min(i64::MAX as usize) as i64));
    let conditions = |clauses: Vec<String>| {
        if clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", clauses.join(" AND "))
        }
    };
    if filter.streams.is_empty() {
        q.sql = format!(
            "{select}{} ORDER BY position DESC LIMIT {limit}",
            conditions(clauses)
        );
        return Ok(q);
    }
    let mut branches = Vec::with_capacity(filter.streams.len());
    for (i, stream) in filter.streams.iter().enumerate() {
        let mut own = vec![format!(
            "stream_id = {}",
            q.bind(dialect, Arg::Text(stream.clone()))
        )];
        own.extend(clauses.iter().cloned());
        branches.push(format!(
            "SELECT * FROM ({select}{} ORDER BY stream_version DESC LIMIT {limit}) AS s{i}",
            conditions(own)
        ));
    }
    q.sql = format!(
        "{} ORDER BY position DESC LIMIT {limit}",
        branches.join(" UNION ALL ")
    );
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SELECT: &str = "SELECT * FROM es_events";

    #[test]
    fn placeholders_are_numbered_in_binding_order() {
        let filter = EventFilter {
            event_type: Some("KeyIssued".into()),
            streams: Vec::new(),
            stream_prefix: Some("key-".into()),
            actor: Some("alice".into()),
            from: Some(DateTime::UNIX_EPOCH),
            to: None,
        };
        let q = backward(SELECT, Dialect::Sqlite, &filter, 2..10, 5).expect("query");
        assert_eq!(
            q.sql,
            "SELECT * FROM es_events WHERE position >= ?1 AND position < ?2 AND event_type = ?3 \
             AND substr(stream_id, 1, ?4) = ?5 AND json_extract(metadata, '$.actor') = ?6 \
             AND recorded_at >= ?7 ORDER BY position DESC LIMIT ?8"
        );
        assert_eq!(q.args[3], Arg::Int(4));
        assert_eq!(q.args.len(), 8);
    }

    #[test]
    fn bounds_that_exclude_nothing_are_left_out() {
        let q = backward(
            SELECT,
            Dialect::Postgres,
            &EventFilter::default(),
            0..u64::MAX,
            5,
        )
        .expect("query");
        assert_eq!(
            q.sql,
            "SELECT * FROM es_events ORDER BY position DESC LIMIT $1"
        );
    }

    #[test]
    fn each_stream_is_walked_down_its_versions_and_the_walks_merged() {
        let filter = EventFilter {
            streams: vec!["node-a".into(), "audit-node-a".into()],
            actor: Some("bob".into()),
            ..EventFilter::default()
        };
        let q = backward(SELECT, Dialect::Postgres, &filter, 1..7, 5).expect("query");
        assert_eq!(
            q.sql,
            "SELECT * FROM (SELECT * FROM es_events WHERE stream_id = $4 AND position < $1 \
             AND metadata->>'actor' = $2 ORDER BY stream_version DESC LIMIT $3) AS s0 \
             UNION ALL SELECT * FROM (SELECT * FROM es_events WHERE stream_id = $5 \
             AND position < $1 AND metadata->>'actor' = $2 ORDER BY stream_version DESC \
             LIMIT $3) AS s1 ORDER BY position DESC LIMIT $3"
        );
        assert_eq!(q.args[3], Arg::Text("node-a".into()));
    }
}
