//! Read models built from the event log: the router, cluster, tenancy and
//! usage views, each a plain struct with `apply(&mut self, &RecordedEvent)`,
//! and the [`Runner`] that feeds them from a subscription, snapshots them
//! with their checkpoint and reports its lag, and [`Lag`], the views' lag
//! sampled from outside the runner for the metrics page.
//!
//! What must not: decisions (those are in `llmgw-domain`) or writes to the
//! event log (only the control plane appends, through `llmgw-eventstore`).
//! A view never fails on an event it does not understand: it skips it, so a
//! newer writer cannot stop an older reader.

mod cluster;
mod lag;
mod replay;
mod router;
mod runner;
pub mod story;
mod tenancy;
mod usage;

use llmgw_domain::Event;
use llmgw_eventstore::{Checkpoint, EventRef, RecordedEvent};
use serde::{Deserialize, Serialize};

pub use cluster::ClusterView;
pub use lag::{Lag, lag_of};
pub use replay::{parse_span, parse_time, position_at, replay_to};
pub use router::{Endpoint, RouterModel, RouterView};
pub use runner::{Runner, RunnerError, SnapshotFloor, VIEWS_SNAPSHOT};
pub use tenancy::{KeyEntry, TenancyView};
pub use usage::{
    Bucket, DAILY_KEPT, DAY_MS, GroupBy, HOUR_MS, HOURLY_KEPT, ModelStats, OPERATORS, PeriodSpend,
    SESSION_KEY_PREFIX, Series, Spend, UsageView, person_of_key,
};

/// Where an event sits in the log, for views that care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub position: u64,
    /// Milliseconds since the Unix epoch.
    pub recorded_at_ms: i64,
}

impl Stamp {
    /// Where and when a stored event was recorded.
    pub fn of(recorded: &RecordedEvent) -> Stamp {
        Stamp {
            position: recorded.position,
            recorded_at_ms: recorded.recorded_at.timestamp_millis(),
        }
    }
}

/// One read model.
pub trait View: Default + Clone + PartialEq + Serialize + for<'de> Deserialize<'de> {
    /// The name operators use: `--view router`.
    const NAME: &'static str;

    /// Applies one decoded event.
    fn apply_event(&mut self, stamp: Stamp, event: &Event);

    /// Applies one stored event; types this build does not know are skipped.
    fn apply(&mut self, recorded: &RecordedEvent) {
        if let Some((stamp, event)) = decode(recorded) {
            self.apply_event(stamp, &event);
        }
    }
}

/// The stored event as a domain event, or None for a type this build does
/// not know (logged, not fatal).
pub fn decode(recorded: &RecordedEvent) -> Option<(Stamp, Event)> {
    let event = decode_or_skip(recorded).ok()?;
    Some((Stamp::of(recorded), event))
}

/// The stored event decoded, or (logged) why not: its (type, schema
/// version) when this build does not know it, None when its payload was
/// at fault.
fn decode_or_skip(recorded: &RecordedEvent) -> Result<Event, Option<(String, u32)>> {
    let (kind, version) = (&recorded.event_type, recorded.schema_version);
    Event::decode(kind, version, &recorded.payload).map_err(|error| {
        let unknown = unknown(&error, kind, version);
        skipping(recorded.position, &error, unknown.as_ref());
        unknown
    })
}

/// Logged once per kind this build does not know (a log written by a
/// newer one holds thousands: a replay would bury everything else), and
/// each time for a payload at fault. The views count them all.
fn skipping(
    position: u64,
    error: &llmgw_domain::event::DecodeError,
    unknown: Option<&(String, u32)>,
) {
    static TOLD: std::sync::Mutex<std::collections::BTreeSet<(String, u32)>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    match unknown {
        Some(kind) => {
            let first = TOLD
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(kind.clone());
            if first {
                tracing::warn!(position, %error, "skipping events of a kind this build cannot read (the later ones are counted, not logged)");
            }
        }
        None => tracing::warn!(position, %error, "skipping an event this build cannot read"),
    }
}

/// The (type, schema version) of an event that did not decode because this
/// build does not know it; None when its payload was at fault.
fn unknown(
    error: &llmgw_domain::event::DecodeError,
    event_type: &str,
    schema_version: u32,
) -> Option<(String, u32)> {
    use llmgw_domain::event::DecodeError as E;
    matches!(error, E::UnknownType(_) | E::Version { .. })
        .then(|| (event_type.to_owned(), schema_version))
}

/// A stored event decoded for the views: what [`Projections::apply_decoded`]
/// takes. Made by [`decode_text`] straight from the payload's JSON text, in
/// the task that reads the page (see [`REPLAY_PAGE`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub checkpoint: Checkpoint,
    pub stamp: Stamp,
    pub recorded_at: chrono::DateTime<chrono::Utc>,
    /// None for an event this build cannot read: skipped and counted.
    pub event: Option<Event>,
    /// Its (type, schema version) when it was skipped for being unknown to
    /// this build.
    pub unknown: Option<(String, u32)>,
}

/// How many events a replay reads at a time: large pages keep the
/// database's per-query cost small next to the rows.
pub const REPLAY_PAGE: usize = 5000;

/// The event read as text, decoded into its typed form straight from the
/// page's text: no `serde_json::Value` and no copy of the texts on the way.
pub fn decode_text(e: EventRef<'_>) -> Decoded {
    let (event, unknown) = match Event::decode_json(e.event_type, e.schema_version, e.payload) {
        Ok(event) => (Some(event), None),
        Err(error) => {
            let unknown = unknown(&error, e.event_type, e.schema_version);
            skipping(e.position, &error, unknown.as_ref());
            (None, unknown)
        }
    };
    Decoded {
        checkpoint: Checkpoint {
            position: e.position,
            event_id: Some(e.event_id),
        },
        stamp: Stamp {
            position: e.position,
            recorded_at_ms: e.recorded_at.timestamp_millis(),
        },
        recorded_at: e.recorded_at,
        event,
        unknown,
    }
}

/// The names `--view` accepts.
pub const VIEW_NAMES: [&str; 4] = [
    RouterView::NAME,
    ClusterView::NAME,
    TenancyView::NAME,
    UsageView::NAME,
];

/// Every view at one checkpoint: what a server keeps in memory and what a
/// snapshot stores.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Projections {
    pub checkpoint: Checkpoint,
    /// Events this build could not decode and skipped.
    pub skipped: u64,
    /// The (type, schema version) of each kind of event skipped for being
    /// unknown to the build that applied it: a later build that reads one
    /// of them rebuilds from the log rather than start from a snapshot
    /// that left them out.
    #[serde(default)]
    pub unknown: std::collections::BTreeSet<(String, u32)>,
    pub router: RouterView,
    pub cluster: ClusterView,
    pub tenancy: TenancyView,
    pub usage: UsageView,
}

impl Projections {
    /// The format version of a snapshot of these views. Bump it whenever a
    /// view's fields change, so that old snapshots are rebuilt, not misread.
    /// 6: `unknown` kept (a snapshot of an older build may have skipped
    /// usage batches stored in columns without saying so). 7: the tenancy
    /// view's `revision`.
    pub const STATE_VERSION: u32 = 7;

    /// Whether these views left out events of a kind this build reads: a
    /// snapshot of them, written by an older build, is not to be used.
    pub fn left_out_readable(&self) -> bool {
        (self.unknown.iter()).any(|(kind, version)| Event::reads(kind, *version))
    }

    /// Decodes once and applies to every view.
    pub fn apply(&mut self, recorded: &RecordedEvent) {
        match decode_or_skip(recorded) {
            Ok(event) => {
                let stamp = Stamp::of(recorded);
                self.router.apply_event(stamp, &event);
                self.cluster.apply_event(stamp, &event);
                self.tenancy.apply_event(stamp, &event);
                self.usage.apply_event(stamp, &event);
            }
            Err(unknown) => self.skip(unknown),
        }
        self.checkpoint = Checkpoint::after(recorded);
    }

    fn skip(&mut self, unknown: Option<(String, u32)>) {
        self.skipped += 1;
        self.unknown.extend(unknown);
    }

    /// Applies one event decoded by [`decode_text`].
    pub fn apply_decoded(&mut self, decoded: &Decoded) {
        match &decoded.event {
            Some(event) => {
                let stamp = decoded.stamp;
                self.router.apply_event(stamp, event);
                self.cluster.apply_event(stamp, event);
                self.tenancy.apply_event(stamp, event);
                self.usage.apply_event(stamp, event);
            }
            None => self.skip(decoded.unknown.clone()),
        }
        self.checkpoint = decoded.checkpoint.clone();
    }

    /// One view as JSON, by its operator-facing name.
    pub fn view_json(&self, name: &str) -> Option<serde_json::Value> {
        let value = match name {
            RouterView::NAME => serde_json::to_value(&self.router),
            ClusterView::NAME => serde_json::to_value(&self.cluster),
            TenancyView::NAME => serde_json::to_value(self.tenancy.report()),
            UsageView::NAME => serde_json::to_value(&self.usage),
            _ => return None,
        };
        Some(value.expect("views serialise"))
    }
}

/// What the crate's unit tests build their events from.
#[cfg(test)]
pub(crate) mod testing {
    use llmgw_domain::UnixMillis;
    use llmgw_domain::tenancy::Band;
    use llmgw_domain::usage::UsageRecorded;
    use llmgw_eventstore::RecordedEvent;
    use serde_json::json;

    /// A stored event at position 7 of stream `s`.
    pub(crate) fn recorded(
        event_type: &str,
        schema_version: u32,
        payload: serde_json::Value,
    ) -> RecordedEvent {
        serde_json::from_value(json!({
            "position": 7,
            "stream_id": "s",
            "stream_version": 1,
            "event_id": "00000000-0000-0000-0000-000000000000",
            "event_type": event_type,
            "schema_version": schema_version,
            "payload": payload,
            "metadata": {},
            "epoch": 1,
            "recorded_at": "2026-12-01T09:00:00.123Z",
            "hash": "0".repeat(64),
        }))
        .expect("an event")
    }

    /// A served request of `key_id` to model `m` in project `p`, one token
    /// each way for one micro, answered 200 in 1 ms.
    pub(crate) fn request(request_id: &str, key_id: &str, at: i64) -> UsageRecorded {
        UsageRecorded {
            request_id: request_id.into(),
            key_id: key_id.into(),
            project_id: "p".into(),
            model_asked: "m".into(),
            model_served: "m".into(),
            prompt_tokens: 1,
            completion_tokens: 1,
            cost_micros: 1,
            status: 200,
            latency_ms: 1,
            ttft_ms: None,
            band: Band::Gold,
            at: UnixMillis(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::testing::recorded;
    use super::*;

    #[test]
    fn skipped_events_of_unknown_kinds_are_named_and_bad_payloads_only_counted() {
        let mut p = Projections::default();
        p.apply(&recorded("NodeTeleported", 1, json!({})));
        p.apply(&recorded("UsageBatchRecorded", 9, json!({})));
        p.apply(&recorded("NodeLost", 1, json!({"node": "n"})));
        assert_eq!(p.skipped, 3);
        let unknown: Vec<_> = p.unknown.iter().cloned().collect();
        assert_eq!(
            unknown,
            [
                ("NodeTeleported".to_owned(), 1),
                ("UsageBatchRecorded".to_owned(), 9)
            ]
        );
        assert!(!p.left_out_readable(), "this build reads none of them");
        p.unknown.insert(("UsageBatchRecorded".into(), 1));
        assert!(p.left_out_readable());
    }
}
