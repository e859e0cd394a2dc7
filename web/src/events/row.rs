//! One event as a row of the page: when, what, where, who, and its payload.

use chrono::{DateTime, Utc};
use llmgw_eventstore::RecordedEvent;
use serde_json::Value;

use super::query::query_string;
use super::thing::Thing;

/// Everything a row shows, as text (the template escapes it).
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub position: u64,
    /// UTC, to the millisecond, with the zone.
    pub time: String,
    /// RFC 3339, for `<time datetime=…>`.
    pub time_attr: String,
    pub event_type: String,
    pub stream: String,
    pub stream_version: u64,
    pub actor: String,
    /// `operator`, `leader`, `gateway`, `recorder`; empty when unknown.
    pub actor_kind: String,
    /// The payload on one line, shortened: the row's summary.
    pub summary: String,
    /// The payload, pretty-printed.
    pub payload: String,
    /// The metadata, pretty-printed.
    pub metadata: String,
    /// Links that filter the log by this row's type, stream and actor.
    pub type_link: String,
    pub stream_link: String,
    pub actor_link: String,
    /// The history of the thing the stream belongs to, if it is one.
    pub thing_link: Option<String>,
}

/// UTC with milliseconds and the zone: `2026-12-01 10:00:00.123 UTC`.
pub(crate) fn time_text(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string()
}

/// How long a summary may be, in characters.
const SUMMARY: usize = 72;

impl Row {
    pub(crate) fn of(e: &RecordedEvent) -> Row {
        let (actor, actor_kind) = llmgw_decider::actor_of(e);
        // A usage batch's payload is hundreds of rows: its count says more
        // than its first characters. One request id a row in columns
        // (version 2), one object a row before.
        let column = if e.schema_version == 1 {
            "rows"
        } else {
            "request_id"
        };
        let rows = e.payload.get(column).and_then(Value::as_array);
        let summary = match rows {
            Some(rows) if e.event_type == "UsageBatchRecorded" => {
                format!("{} usage rows", rows.len())
            }
            _ => shorten(&e.payload.to_string(), SUMMARY),
        };
        let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
        Row {
            position: e.position,
            time: time_text(&e.recorded_at),
            time_attr: e
                .recorded_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            type_link: query_string(&[("type", Some(&e.event_type))]),
            stream_link: query_string(&[("stream", Some(&e.stream_id))]),
            actor_link: if actor.is_empty() {
                String::new()
            } else {
                query_string(&[("actor", Some(&actor))])
            },
            thing_link: Thing::of_stream(&e.stream_id)
                .map(|t| query_string(&[("thing", Some(&t.param()))])),
            event_type: e.event_type.clone(),
            stream: e.stream_id.clone(),
            stream_version: e.stream_version,
            actor,
            actor_kind,
            summary,
            payload: pretty(&e.payload),
            metadata: pretty(&e.metadata),
        }
    }
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    text.chars()
        .take(max - 1)
        .chain(std::iter::once('…'))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn recorded(payload: Value, metadata: Value) -> RecordedEvent {
        serde_json::from_value(json!({
            "position": 7,
            "stream_id": "key-k1",
            "stream_version": 1,
            "event_id": "00000000-0000-0000-0000-000000000000",
            "event_type": "KeyRevoked",
            "schema_version": 1,
            "payload": payload,
            "metadata": metadata,
            "epoch": 1,
            "recorded_at": "2026-12-01T09:00:00.123Z",
            "hash": "0".repeat(64),
        }))
        .expect("an event")
    }

    #[test]
    fn a_usage_batch_is_summed_up_by_its_row_count() {
        let mut e = recorded(
            json!({"gateway": "gateway-a", "rows": [{"request_id": "r1"}, {"request_id": "r2"}]}),
            json!({}),
        );
        e.event_type = "UsageBatchRecorded".into();
        assert_eq!(Row::of(&e).summary, "2 usage rows");
        // In columns, as batches are written since schema version 2.
        e.payload = json!({"gateway": "gateway-a", "names": ["k"], "key": [0, 0, 0],
            "request_id": ["r1", "r2", "r3"]});
        e.schema_version = 2;
        assert_eq!(Row::of(&e).summary, "3 usage rows");
    }

    #[test]
    fn a_row_names_who_acted_as_what_and_when_to_the_millisecond() {
        let r = Row::of(&recorded(
            json!({"key_id": "k1", "by": "cli"}),
            json!({"writer": "cp-1", "actor": "alice", "actor_kind": "operator"}),
        ));
        assert_eq!(
            (r.actor.as_str(), r.actor_kind.as_str()),
            ("alice", "operator")
        );
        assert_eq!(r.time, "2026-12-01 09:00:00.123 UTC");
        assert_eq!(r.time_attr, "2026-12-01T09:00:00.123Z");
        assert_eq!(
            r.thing_link.as_deref(),
            Some("/admin/events?thing=key%3Ak1")
        );
        assert!(
            r.payload.contains("\n  \"key_id\": \"k1\""),
            "{}",
            r.payload
        );
        let old = Row::of(&recorded(json!({"by": "ops"}), json!({"actor": "cli-9"})));
        assert_eq!((old.actor.as_str(), old.actor_kind.as_str()), ("ops", ""));
        let long = Row::of(&recorded(json!({"note": "x".repeat(500)}), json!({})));
        assert_eq!(long.summary.chars().count(), SUMMARY);
        assert_eq!(long.actor_link, "");
    }
}
