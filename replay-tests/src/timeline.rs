//! A captured incident as a test reads it: find the first event of a type
//! about a thing, measure the time between two events, look at the views
//! as they stood at an event, and check that something never happened at
//! any point, so that a test reads like the operator's account ("the node
//! was lost within the configured time; the replacement was ready within
//! a minute on the surviving node; the model was never unroutable").
//!
//! ```
//! use std::time::Duration;
//! use llmgw_replay_tests::timeline::Timeline;
//!
//! let t = Timeline::fixture("node-lost-live");
//! let unreachable = t.first("NodeUnreachable", "a");
//! let lost = t.first("NodeLost", "a");
//! assert!(t.between(unreachable, lost) <= t.setting("lost_after"));
//! // R3 (a short name, as the story shows it) replaced the lost replica.
//! let rebuilt = t.first("ReplicaReady", "R3");
//! assert!(t.between(lost, rebuilt) < Duration::from_secs(30));
//! assert_eq!(t.view_at(rebuilt).router.endpoints_for("chat").count(), 2);
//! ```

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use llmgw_domain::event::ControlSettings;
use llmgw_eventstore::{ChainCheck, ExportLine, RecordedEvent, Trailer, parse_line};
use llmgw_projections::Projections;
use llmgw_projections::story::{self, CaptureHeader, Redactor};
use serde_json::Value;

/// One event of the timeline: where and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    pub position: u64,
    /// Milliseconds since the Unix epoch.
    pub ms: i64,
}

/// A captured fixture, checked and ready to be questioned.
#[derive(Debug)]
pub struct Timeline {
    pub header: CaptureHeader,
    pub trailer: Option<Trailer>,
    events: Vec<RecordedEvent>,
    base: Projections,
    names: Redactor,
}

/// A captured file's parts, each checked: the chain, the trailer over the
/// events and the header.
pub fn read_capture(
    path: &Path,
) -> anyhow::Result<(Option<Value>, Vec<RecordedEvent>, Option<Trailer>)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut check = ChainCheck::default();
    let (mut header, mut events, mut trailer) = (None, Vec::new(), None);
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = || format!("{}:{}", path.display(), i + 1);
        match parse_line(line).with_context(at)? {
            ExportLine::Header(h) => {
                check.header(&h).map_err(|r| anyhow!("{}: {r}", at()))?;
                header = Some(h);
            }
            ExportLine::Event(e) => {
                if events.is_empty()
                    && let Some(prev) = serde_json::from_str::<Value>(line)?
                        .get("prev_hash")
                        .and_then(Value::as_str)
                        .and_then(llmgw_eventstore::hash::from_hex)
                {
                    check.set_predecessor(Some(prev));
                }
                check.push(&e).map_err(|r| anyhow!("{}: {r}", at()))?;
                events.push(*e);
            }
            ExportLine::Trailer(t) => {
                check
                    .check_trailer(&t)
                    .map_err(|r| anyhow!("{}: {r}", at()))?;
                t.check_signature(None)
                    .map_err(|r| anyhow!("{}: {r}", at()))?;
                trailer = Some(*t);
            }
        }
    }
    Ok((header, events, trailer))
}

impl Timeline {
    /// `fixtures/NAME.jsonl`; panics with the reason when it cannot be
    /// read (this is for tests).
    pub fn fixture(name: &str) -> Timeline {
        let path = crate::fixtures_dir().join(format!("{name}.jsonl"));
        Timeline::load(&path).unwrap_or_else(|e| panic!("{name}: {e:#}"))
    }

    pub fn load(path: &Path) -> anyhow::Result<Timeline> {
        let (header, events, trailer) = read_capture(path)?;
        let Some(header) = header else {
            bail!(
                "{} has no capture header: it was not written by `llmgw events capture`",
                path.display()
            );
        };
        let header: CaptureHeader = serde_json::from_value(header)?;
        let base = header.base_views().map_err(|e| anyhow!(e))?;
        let mut names = Redactor::new(
            events
                .first()
                .map_or(0, |e| e.recorded_at.timestamp_millis()),
        );
        names.learn_views(&base);
        events.iter().for_each(|e| names.learn_event(e));
        Ok(Timeline {
            header,
            trailer,
            events,
            base,
            names,
        })
    }

    pub fn events(&self) -> &[RecordedEvent] {
        &self.events
    }

    /// The control plane's timings as the log recorded them; panics when
    /// the capture has none (a log from before they were recorded).
    pub fn settings(&self) -> &ControlSettings {
        self.header
            .settings
            .as_ref()
            .expect("the capture records no control settings: its log is older than LeadershipAcquired.settings")
    }

    /// One timing by its configuration name (`lost_after`,
    /// `unreachable_after`, `interval`, `lease_ttl`, `base_backoff`,
    /// `max_backoff`, `drain_grace`).
    pub fn setting(&self, name: &str) -> Duration {
        let s = self.settings();
        let ms = match name {
            "lost_after" => s.lost_after_ms,
            "unreachable_after" => s.unreachable_after_ms,
            "interval" => s.reconcile_interval_ms,
            "lease_ttl" => s.lease_ttl_ms,
            "base_backoff" => s.base_backoff_ms,
            "max_backoff" => s.max_backoff_ms,
            "drain_grace" => s.drain_grace_ms,
            other => panic!("no control setting named {other}"),
        };
        Duration::from_millis(ms)
    }

    /// The id a short name (`R2`, `K1`) stands for, or the text itself.
    pub fn id<'a>(&'a self, name: &'a str) -> &'a str {
        self.names.id_of(name).unwrap_or(name)
    }

    /// The short name of an id, as the story shows it.
    pub fn name_of<'a>(&'a self, id: &'a str) -> &'a str {
        self.names.name(id).unwrap_or(id)
    }

    fn at(e: &RecordedEvent) -> At {
        At {
            position: e.position,
            ms: e.recorded_at.timestamp_millis(),
        }
    }

    /// Whether `e` is about `thing`: its stream is the thing's, or its
    /// payload names it anywhere (a node id, a model, a replica by id or
    /// short name).
    pub fn is_about(&self, e: &RecordedEvent, thing: &str) -> bool {
        let id = self.id(thing);
        e.stream_id == id
            || e.stream_id
                .split_once('-')
                .is_some_and(|(_, rest)| rest == id)
            || names(&e.payload, id)
    }

    /// Every event of `event_type` about `thing`.
    pub fn all(&self, event_type: &str, thing: &str) -> Vec<At> {
        self.events
            .iter()
            .filter(|e| e.event_type == event_type && self.is_about(e, thing))
            .map(Self::at)
            .collect()
    }

    /// The first event of `event_type` about `thing`, if there is one.
    pub fn try_first(&self, event_type: &str, thing: &str) -> Option<At> {
        self.all(event_type, thing).first().copied()
    }

    /// The first event of `event_type` about `thing`; panics naming what
    /// the fixture has instead.
    pub fn first(&self, event_type: &str, thing: &str) -> At {
        self.try_first(event_type, thing).unwrap_or_else(|| {
            let of_type: Vec<String> = self
                .events
                .iter()
                .filter(|e| e.event_type == event_type)
                .map(|e| format!("#{} {}", e.position, self.names.stream(&e.stream_id)))
                .collect();
            panic!("no {event_type} about {thing}; the {event_type} events are {of_type:?}")
        })
    }

    /// The last event of `event_type` about `thing`; panics when none.
    pub fn last(&self, event_type: &str, thing: &str) -> At {
        *self
            .all(event_type, thing)
            .last()
            .unwrap_or_else(|| panic!("no {event_type} about {thing}"))
    }

    /// The time from `a` to `b` (zero when `b` is not after `a`).
    pub fn between(&self, a: At, b: At) -> Duration {
        Duration::from_millis((b.ms - a.ms).max(0) as u64)
    }

    /// Every view as it stood just after `at`.
    pub fn view_at(&self, at: At) -> Projections {
        let mut views = self.base.clone();
        for e in self.events.iter().take_while(|e| e.position <= at.position) {
            views.apply(e);
        }
        views
    }

    /// Every view after the whole fixture.
    pub fn end(&self) -> Projections {
        let mut views = self.base.clone();
        self.events.iter().for_each(|e| views.apply(e));
        views
    }

    /// Panics when `condition` holds of the views after any event of the
    /// fixture, naming the first such event.
    pub fn never(&self, what: &str, condition: impl Fn(&Projections) -> bool) {
        let mut views = self.base.clone();
        for e in &self.events {
            views.apply(e);
            if condition(&views) {
                panic!(
                    "{what}: it happened at #{} {} {} ({} after the first event)",
                    e.position,
                    e.event_type,
                    self.names.stream(&e.stream_id),
                    self.names.time(e.recorded_at.timestamp_millis())
                );
            }
        }
    }

    /// Panics unless `condition` holds of the views after every event.
    pub fn always(&self, what: &str, condition: impl Fn(&Projections) -> bool) {
        self.never(&format!("not {what}"), |v| !condition(v));
    }

    /// The story at the default points of interest (every event but
    /// usage, demand and anchors): each with what it changed in the views.
    pub fn story(&self) -> String {
        story::story(&self.base, &self.events, story::of_interest)
    }

    /// The story at these events only.
    pub fn story_at(&self, points: &[At]) -> String {
        story::story(&self.base, &self.events, |e| {
            points.iter().any(|p| p.position == e.position)
        })
    }
}

/// Whether any string in `v` is `text`.
fn names(v: &Value, text: &str) -> bool {
    match v {
        Value::String(s) => s == text,
        Value::Array(items) => items.iter().any(|x| names(x, text)),
        Value::Object(m) => m.values().any(|x| names(x, text)),
        _ => false,
    }
}
