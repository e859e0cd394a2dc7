//! An incident told as the operator would read it: at each point of
//! interest, the event and what it changed in the views, redacted so that
//! a snapshot of it shows what matters and stays the same from one
//! recording to the next.
//!
//! Redaction happens here, when the story is told, never in the recorded
//! log (whose hashes would break): replica, shard and key ids become short
//! names in order of appearance (`R1`, `R1-0`, `K1`), host facts (host
//! names, addresses, GPU ids, memory, disk) are blanked, and times are
//! shown relative to the first event of the story.
//!
//! `llmgw events capture` writes a story as a fixture's first snapshot, and
//! the replay tests tell it again from the fixture, so the two must agree:
//! both call [`story`].

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use llmgw_domain::event::ControlSettings;
use llmgw_eventstore::RecordedEvent;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Projections;

/// Host facts inside a node's inventory: blanked.
const HOST_FACTS: &[&str] = &[
    "hostname",
    "mgmt_addr",
    "uuid",
    "memory_total_mb",
    "memory_mb",
    "disk_free_gb",
    "disk_total_gb",
];

/// Blanked wherever they appear: addresses (`url`, `node_addrs`, any
/// `…_addr`), and a key's hash and prefix, which differ from one
/// recording to the next.
const ANYWHERE: &[&str] = &["url", "node_addrs", "hash", "prefix"];

fn blanked(key: &str, in_inventory: bool) -> bool {
    ANYWHERE.contains(&key) || key.ends_with("_addr") || (in_inventory && HOST_FACTS.contains(&key))
}

/// What a blanked fact shows.
pub const BLANK: &str = "…";

/// Event types that are not points of interest on their own (their
/// effects show at the next point).
const BACKGROUND: &[&str] = &[
    "UsageRecorded",
    "UsageBatchRecorded",
    "ModelDemanded",
    "AnchorRecorded",
];

/// A captured fixture's header (its first line, `{"header": …}`): what it
/// is, the control plane's timings while it was recorded, and the views
/// before its first event when it starts after position 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureHeader {
    /// The fixture's name.
    pub capture: String,
    /// The positions it holds.
    pub from: u64,
    pub to: u64,
    /// The timings of the leader in office at `from` (or the first to take
    /// office in the range), as its `LeadershipAcquired` recorded them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<ControlSettings>,
    /// That leader, and the position of its `LeadershipAcquired`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_since: Option<u64>,
    /// The views' format ([`Projections::STATE_VERSION`]) of `base`.
    pub views_format: u32,
    /// Every view as it stood at `from - 1`; absent from a capture that
    /// starts at position 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<Value>,
}

impl CaptureHeader {
    /// The views before the first event.
    /// Views of another format are refused even when they happen to
    /// parse: a field whose meaning changed would replay into a story
    /// that is quietly wrong.
    pub fn base_views(&self) -> Result<Projections, String> {
        let refused = |why: String| {
            format!(
                "the views before position {} were captured in format {}, and this build reads format {}{why}: capture the incident again, or from position 1",
                self.from,
                self.views_format,
                Projections::STATE_VERSION
            )
        };
        match &self.base {
            None => Ok(Projections::default()),
            Some(_) if self.views_format != Projections::STATE_VERSION => {
                Err(refused(String::new()))
            }
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|e| refused(format!(" and cannot read them ({e})"))),
        }
    }
}

/// Ids to short names, learnt in order of appearance.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    names: HashMap<String, String>,
    ids: HashMap<String, String>,
    replicas: usize,
    shards: usize,
    keys: usize,
    /// Times are shown relative to this (ms since the epoch).
    start_ms: i64,
}

impl Redactor {
    /// A redactor whose times count from `start_ms`.
    pub fn new(start_ms: i64) -> Self {
        Redactor {
            start_ms,
            ..Redactor::default()
        }
    }

    /// The short name of an id, once learnt.
    pub fn name(&self, id: &str) -> Option<&str> {
        self.names.get(id).map(String::as_str)
    }

    /// The id a short name stands for.
    pub fn id_of(&self, name: &str) -> Option<&str> {
        self.ids.get(name).map(String::as_str)
    }

    /// Every name and the id it stands for.
    pub fn names(&self) -> BTreeMap<&str, &str> {
        self.ids
            .iter()
            .map(|(n, i)| (n.as_str(), i.as_str()))
            .collect()
    }

    fn give(&mut self, id: &str, name: String) {
        if id.is_empty() || self.names.contains_key(id) {
            return;
        }
        self.names.insert(id.to_owned(), name.clone());
        self.ids.insert(name, id.to_owned());
    }

    fn replica(&mut self, id: &str) {
        if !self.names.contains_key(id) {
            self.replicas += 1;
            self.give(id, format!("R{}", self.replicas));
        }
    }

    fn shard(&mut self, id: &str) {
        if self.names.contains_key(id) {
            return;
        }
        // A shard's id is its replica's and its rank: keep that visible.
        let derived = self.names.iter().find_map(|(rid, name)| {
            let rest = id.strip_prefix(rid.as_str())?.strip_prefix('-')?;
            (name.starts_with('R') && rest.parse::<u32>().is_ok()).then(|| format!("{name}-{rest}"))
        });
        let name = derived.unwrap_or_else(|| {
            self.shards += 1;
            format!("S{}", self.shards)
        });
        self.give(id, name);
    }

    fn key(&mut self, id: &str) {
        if !self.names.contains_key(id) {
            self.keys += 1;
            self.give(id, format!("K{}", self.keys));
        }
    }

    /// Learns the ids a value names: fields `replica_id`, `shard_id`,
    /// `key_id` (and a key's `id` inside `key`), in document order.
    pub fn learn(&mut self, v: &Value) {
        match v {
            Value::Object(m) => {
                // Replicas before the shards they hold.
                if let Some(Value::String(id)) = m.get("replica_id") {
                    self.replica(id);
                }
                // The views keep keys by their hash, which names a line of
                // the story: named after the key, as the hash itself is
                // blanked (it differs from one recording to the next).
                if let (Some(Value::String(id)), Some(Value::String(hash))) =
                    (m.get("key_id"), m.get("hash"))
                {
                    self.key(id);
                    if let Some(name) = self.name(id).map(|n| format!("hash-of-{n}")) {
                        self.give(hash, name);
                    }
                }
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("replica_id", _) => {}
                        ("shard_id", Value::String(id)) => self.shard(id),
                        ("key_id", Value::String(id)) => self.key(id),
                        _ => self.learn(x),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|x| self.learn(x)),
            _ => {}
        }
    }

    /// Learns from a stored event's payload.
    pub fn learn_event(&mut self, e: &RecordedEvent) {
        // A usage batch in columns names its keys among `names`, by index:
        // decoded, its rows name them in order, as a list of rows did.
        if e.event_type == "UsageBatchRecorded"
            && let Ok(llmgw_domain::Event::Usage(u)) =
                llmgw_domain::Event::decode(&e.event_type, e.schema_version, &e.payload)
        {
            u.rows().iter().for_each(|row| self.key(&row.key_id));
            return;
        }
        self.learn(&e.payload);
    }

    /// Learns the ids the views hold (a fixture's base, before its
    /// events): replicas and keys as the views list them.
    pub fn learn_views(&mut self, views: &Projections) {
        for (id, r) in &views.cluster.replicas.replicas {
            self.replica(id);
            for shard in r.shards.keys() {
                self.shard(shard);
            }
        }
        if let Some(v) = views.view_json("tenancy") {
            self.learn(&v);
            // Keyed by hash, the entries do not hold it: named here.
            for (hash, entry) in v.as_object().into_iter().flatten() {
                if let Some(Value::String(id)) = entry.get("key_id")
                    && let Some(name) = self.name(id).map(|n| format!("hash-of-{n}"))
                {
                    self.give(hash, name);
                }
            }
        }
    }

    /// A time in ms since the epoch, relative to the start.
    pub fn time(&self, ms: i64) -> String {
        relative(ms - self.start_ms)
    }

    /// A stream id with the id in it named.
    pub fn stream(&self, stream: &str) -> String {
        match stream.split_once('-') {
            Some((kind, id)) => match self.name(id) {
                Some(n) => format!("{kind}-{n}"),
                None => stream.to_owned(),
            },
            None => stream.to_owned(),
        }
    }

    /// The value with ids named, host facts blanked and times relative.
    pub fn redact(&self, v: &Value) -> Value {
        self.redact_in(None, false, v)
    }

    fn redact_in(&self, key: Option<&str>, in_inventory: bool, v: &Value) -> Value {
        if let Some(k) = key
            && blanked(k, in_inventory)
            && !v.is_null()
        {
            return Value::String(BLANK.into());
        }
        let in_inventory = in_inventory || key == Some("inventory");
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| {
                        let k2 = self.name(k).map_or_else(|| k.clone(), str::to_owned);
                        (k2, self.redact_in(Some(k), in_inventory, x))
                    })
                    .collect(),
            ),
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|x| self.redact_in(None, in_inventory, x))
                    .collect(),
            ),
            Value::String(s) => match self.name(s) {
                Some(n) => Value::String(n.to_owned()),
                None => v.clone(),
            },
            Value::Number(n) => match (key, n.as_i64()) {
                // Milliseconds since the epoch (after 2001): relative.
                (Some(k), Some(ms)) if k.ends_with("_ms") && ms > 1_000_000_000_000 => {
                    Value::String(self.time(ms))
                }
                _ => v.clone(),
            },
            _ => v.clone(),
        }
    }
}

/// `+12.345s`, `-0.250s`.
pub fn relative(ms: i64) -> String {
    let sign = if ms < 0 { '-' } else { '+' };
    let ms = ms.unsigned_abs();
    format!("{sign}{}.{:03}s", ms / 1000, ms % 1000)
}

/// Whether an event is a point of interest by default: everything but the
/// background of usage, demand and anchors.
pub fn of_interest(e: &RecordedEvent) -> bool {
    !BACKGROUND.contains(&e.event_type.as_str())
}

/// The views as the story compares them.
fn views_json(p: &Projections, r: &Redactor) -> Value {
    let mut m = serde_json::Map::new();
    for name in crate::VIEW_NAMES {
        if let Some(v) = p.view_json(name) {
            m.insert(name.to_owned(), r.redact(&v));
        }
    }
    Value::Object(m)
}

/// One line per difference between `a` and `b`, under `path`.
pub fn diff(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                let p = format!("{path}/{k}");
                match y.get(k) {
                    Some(vb) => diff(&p, va, vb, out),
                    None => out.push(format!("- {p}")),
                }
            }
            for (k, vb) in y {
                if !x.contains_key(k) {
                    out.push(format!("+ {path}/{k} = {vb}"));
                }
            }
        }
        _ if a == b => {}
        _ => out.push(format!("~ {path}: {a} → {b}")),
    }
}

/// The story of `events` (after `base`, the views before the first of
/// them): a header naming the time origin, then, at each event `points`
/// keeps, a line for the event and one per difference in the views since
/// the previous point.
pub fn story(
    base: &Projections,
    events: &[RecordedEvent],
    points: impl Fn(&RecordedEvent) -> bool,
) -> String {
    let mut r = Redactor::new(
        events
            .first()
            .map_or(0, |e| e.recorded_at.timestamp_millis()),
    );
    r.learn_views(base);
    events.iter().for_each(|e| r.learn_event(e));
    let mut out = String::new();
    match (events.first(), events.last()) {
        (Some(f), Some(l)) => {
            let _ = writeln!(
                out,
                "positions {}..={}; times are from position {}; ids are named in order of appearance, host facts blanked",
                f.position, l.position, f.position
            );
        }
        _ => out.push_str("no events\n"),
    }
    let mut views = base.clone();
    let mut before = views_json(&views, &r);
    for e in events {
        views.apply(e);
        if !points(e) {
            continue;
        }
        let now = views_json(&views, &r);
        let _ = writeln!(
            out,
            "{} #{} {} {}",
            r.time(e.recorded_at.timestamp_millis()),
            e.position,
            e.event_type,
            r.stream(&e.stream_id)
        );
        let mut lines = Vec::new();
        diff("", &before, &now, &mut lines);
        for l in lines {
            let _ = writeln!(out, "    {}", l.trim_start_matches(['/']));
        }
        before = now;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn base_views_of_another_format_are_refused_though_they_parse() {
        let header = |views_format| CaptureHeader {
            capture: "c".into(),
            from: 5,
            to: 9,
            settings: None,
            leader: None,
            leader_since: None,
            views_format,
            base: Some(serde_json::to_value(Projections::default()).unwrap()),
        };
        assert!(header(Projections::STATE_VERSION).base_views().is_ok());
        let old = header(Projections::STATE_VERSION - 1)
            .base_views()
            .unwrap_err();
        assert!(old.contains("capture the incident again"), "{old}");
    }

    #[test]
    fn ids_are_named_in_order_and_host_facts_and_times_are_redacted() {
        let mut r = Redactor::new(1_800_000_000_000);
        r.learn(&json!({"replica_id": "9f1c", "shards": [{"shard_id": "9f1c-0"}, {"shard_id": "9f1c-1"}]}));
        r.learn(&json!({"replica_id": "0a2b", "key_id": "k-77"}));
        assert_eq!(r.name("9f1c"), Some("R1"));
        assert_eq!(r.name("9f1c-1"), Some("R1-1"));
        assert_eq!(r.name("0a2b"), Some("R2"));
        assert_eq!(r.name("k-77"), Some("K1"));
        assert_eq!(r.id_of("R2"), Some("0a2b"));
        let v = r.redact(&json!({
            "9f1c": {"url": "http://10.0.0.2:20002", "node_id": "gpu-b", "added_ms": 1_800_000_012_345_i64, "memory_mb": 0},
            "node_addrs": {"gpu-b": "10.0.0.2"},
            "inventory": {"hostname": "gpu-b.example", "mgmt_addr": "10.0.0.2", "memory_total_mb": 2_000_000, "gpus": [{"uuid": "GPU-1", "memory_mb": 81559, "class": "h100"}]},
            "replica_id": "0a2b",
            "count_ms": 40
        }));
        assert_eq!(
            v,
            json!({
                "R1": {"url": BLANK, "node_id": "gpu-b", "added_ms": "+12.345s", "memory_mb": 0},
                "node_addrs": BLANK,
                "inventory": {"hostname": BLANK, "mgmt_addr": BLANK, "memory_total_mb": BLANK, "gpus": [{"uuid": BLANK, "memory_mb": BLANK, "class": "h100"}]},
                "replica_id": "R2",
                "count_ms": 40
            })
        );
        assert_eq!(r.stream("replica-0a2b"), "replica-R2");
        assert_eq!(relative(-250), "-0.250s");
    }

    /// The tenancy view keeps keys by their hash: a line's path names the
    /// key, not the hash, which differs from one recording to the next.
    #[test]
    fn a_keys_hash_is_named_after_the_key_where_it_is_a_path() {
        let mut r = Redactor::new(0);
        let hash = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";
        let view = json!({hash: {"key_id": "k-9", "hash": hash, "prefix": "llmgw-5e88"}});
        r.learn(&view);
        assert_eq!(
            r.redact(&view),
            json!({"hash-of-K1": {"key_id": "K1", "hash": BLANK, "prefix": BLANK}})
        );
    }

    #[test]
    fn a_usage_batch_in_columns_names_its_keys_in_row_order() {
        use llmgw_domain::usage::{UsageBatchRecorded, UsageEvent};
        let row = |key: &str| crate::testing::request(&format!("req-{key}"), key, 0);
        let batch =
            llmgw_domain::Event::Usage(UsageEvent::UsageBatchRecorded(UsageBatchRecorded {
                gateway: "gw".into(),
                rows: vec![row("k-b"), row("k-a"), row("k-b")],
            }));
        let (kind, version, payload) = batch.encode();
        let e = crate::testing::recorded(&kind, version, payload);
        let mut r = Redactor::new(0);
        r.learn_event(&e);
        assert_eq!((r.name("k-b"), r.name("k-a")), (Some("K1"), Some("K2")));
        let redacted = r.redact(&e.payload);
        assert_eq!(redacted["names"], json!(["K1", "K2", "p", "m"]));
    }

    #[test]
    fn a_diff_names_what_changed_was_added_and_was_removed() {
        let mut out = Vec::new();
        diff(
            "",
            &json!({"a": {"x": 1, "gone": true}, "same": [1]}),
            &json!({"a": {"x": 2, "new": "n"}, "same": [1]}),
            &mut out,
        );
        assert_eq!(out, vec!["- /a/gone", "~ /a/x: 1 → 2", "+ /a/new = \"n\""]);
    }
}
