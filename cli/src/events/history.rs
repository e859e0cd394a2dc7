//! Looking back: a view as it stood at a point, one thing's timeline, and
//! what changed in a view between two points.

use std::io::Write;

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use llmgw_eventstore::{AnyStore, DEFAULT_PAGE, EventFilter, EventStore, RecordedEvent};
use llmgw_projections::{Projections, VIEW_NAMES};
use serde_json::Value;

use crate::Outcome;
use crate::output::{Table, json_line};

/// A point in the log: a position, or a time as written, which stands for
/// the instants of its last written unit (see
/// [`llmgw_projections::parse_span`]): a range starts at the first and
/// ends at the last, so that a time copied from a table that prints
/// milliseconds, or a date, covers what was printed beside it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Point {
    Position(u64),
    Time {
        first: DateTime<Utc>,
        last: DateTime<Utc>,
    },
}

impl std::str::FromStr for Point {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(p) = s.parse::<u64>() {
            return Ok(Point::Position(p));
        }
        llmgw_projections::parse_span(s)
            .map(|(first, last)| Point::Time { first, last })
            .ok_or_else(|| {
                format!(
                    "{s:?} is neither a position nor a time (2026-12-01T10:00:00Z, \"2026-12-01 10:00:00\" in UTC, or a date)"
                )
            })
    }
}

pub(crate) fn check_view(view: &str) -> anyhow::Result<()> {
    if !VIEW_NAMES.contains(&view) {
        return Err(crate::config::ConfigError(format!(
            "unknown view {view:?}; the views are {}",
            VIEW_NAMES.join(", ")
        ))
        .into());
    }
    Ok(())
}

impl Point {
    /// The last position at this point, a range's end: a time's whole
    /// unit included.
    pub(crate) async fn end(self, store: &AnyStore) -> anyhow::Result<u64> {
        Ok(match self {
            Point::Position(p) => p,
            Point::Time { last, .. } => llmgw_projections::position_at(store, last).await?,
        })
    }

    /// The last position before this point, where a range's views start:
    /// a time's whole unit left out.
    pub(crate) async fn before(self, store: &AnyStore) -> anyhow::Result<u64> {
        Ok(match self {
            Point::Position(p) => p,
            Point::Time { first, .. } => {
                let just_before = first - chrono::Duration::microseconds(1);
                llmgw_projections::position_at(store, just_before).await?
            }
        })
    }
}

/// What a view leaves out, said beside it: events this build cannot read
/// (a log written by a newer one) were skipped, and the view is short of
/// what they did.
fn skipped(out: &mut impl Write, p: &Projections) -> anyhow::Result<()> {
    if p.skipped == 0 {
        return Ok(());
    }
    let kinds: Vec<String> = p.unknown.iter().map(|(t, v)| format!("{t} v{v}")).collect();
    writeln!(
        out,
        "{} event(s) this build cannot read were skipped{}",
        p.skipped,
        if kinds.is_empty() {
            String::new()
        } else {
            format!(": {}", kinds.join(", "))
        }
    )?;
    Ok(())
}

/// Every view as it stood at position `stop`. Refused on a store that
/// begins part way (imported from an anchor): the views are built from the
/// whole log, and from a part of it they show a past that never was (no
/// nodes where there were some) as if it were true.
pub(crate) async fn fold(store: &AnyStore, stop: u64) -> anyhow::Result<Projections> {
    let (base, _) = store.base().await?;
    if base > 0 {
        anyhow::bail!(
            "this store begins after position {base} (imported from an anchor): the views are built from the whole log, so they cannot be rebuilt here; replay on the store it came from"
        );
    }
    let mut p = Projections::default();
    llmgw_projections::replay_to(store, &mut p, stop).await?;
    Ok(p)
}

pub(crate) async fn replay(
    store: &AnyStore,
    until: Point,
    view: &str,
    json: bool,
) -> anyhow::Result<Outcome> {
    check_view(view)?;
    let stop = until.end(store).await?;
    super::check_range(0, Some(stop), store.head().await?.0, "--until")?;
    let p = fold(store, stop).await?;
    let value = p.view_json(view).context("view")?;
    let mut out = std::io::stdout().lock();
    if json {
        json_line(&mut out, &value)?;
    } else {
        writeln!(out, "{view} view at position {}", p.checkpoint.position)?;
        skipped(&mut out, &p)?;
        render(&mut out, view, &p)?;
    }
    out.flush()?;
    Ok(Outcome::Ok)
}

fn render(out: &mut impl Write, view: &str, p: &Projections) -> anyhow::Result<()> {
    match view {
        "router" => {
            let mut t = Table::new(vec!["MODEL", "ALIASES", "FALLBACKS", "ENDPOINTS"]);
            for m in p.router.models.values() {
                let eps: Vec<String> = p
                    .router
                    .endpoints_for(&m.name)
                    .map(|e| {
                        format!(
                            "{}{}",
                            e.url,
                            if e.current { "" } else { " (edited profile)" }
                        )
                    })
                    .collect();
                t.row(vec![
                    m.name.clone(),
                    m.aliases.join(","),
                    m.fallbacks.join(","),
                    eps.join(" "),
                ]);
            }
            t.print(out)
        }
        "cluster" => {
            let mut t = Table::new(vec!["NODE", "STATE", "GPUS", "ALLOCATED", "CORDONED"]);
            for n in p.cluster.nodes.nodes.values() {
                let allocated = p.cluster.allocations.get(&n.id).map_or(0, |a| a.len());
                t.row(vec![
                    n.id.to_string(),
                    format!("{:?}", n.reachability).to_lowercase(),
                    n.inventory.gpus.len().to_string(),
                    allocated.to_string(),
                    if n.draining {
                        "draining".into()
                    } else {
                        n.cordoned.to_string()
                    },
                ]);
            }
            t.print(out)?;
            let mut t = Table::new(vec!["REPLICA", "MODEL", "STATUS", "SHARDS"]);
            for r in p.cluster.replicas.replicas.values() {
                let shards: Vec<String> = r
                    .shards
                    .values()
                    .map(|s| format!("{}:{:?}", s.placement.node_id, s.state).to_lowercase())
                    .collect();
                t.row(vec![
                    r.placement.replica_id.to_string(),
                    r.placement.model.clone(),
                    format!("{:?}", r.status).to_lowercase(),
                    shards.join(" "),
                ]);
            }
            writeln!(out)?;
            t.print(out)
        }
        "tenancy" => {
            let mut t = Table::new(vec![
                "KEY", "PREFIX", "PROJECT", "BAND", "RPM", "TPM", "BUDGETS", "MODELS",
            ]);
            for e in p.tenancy.report().values() {
                let opt = |v: Option<u32>| v.map_or("-".into(), |v| v.to_string());
                let budgets: Vec<String> = e
                    .limits
                    .budgets
                    .iter()
                    .map(|b| {
                        format!("{}:{}/{:?}", b.scope.name(), b.micros, b.period).to_lowercase()
                    })
                    .collect();
                let models = match &e.limits.models {
                    llmgw_domain::tenancy::Allowed::All => "all".to_owned(),
                    llmgw_domain::tenancy::Allowed::Only(s) if s.is_empty() => "none".to_owned(),
                    llmgw_domain::tenancy::Allowed::Only(s) => {
                        s.iter().cloned().collect::<Vec<_>>().join(",")
                    }
                };
                t.row(vec![
                    e.key_id.to_string(),
                    e.prefix.clone(),
                    e.project_id.to_string(),
                    format!("{:?}", e.band).to_lowercase(),
                    opt(e.limits.rpm),
                    opt(e.limits.tpm),
                    budgets.join(" "),
                    models,
                ]);
            }
            t.print(out)
        }
        _ => {
            let mut t = Table::new(vec![
                "MODEL",
                "REQUESTS",
                "ERRORS",
                "TOKENS",
                "MEAN LATENCY MS",
            ]);
            for (name, m) in &p.usage.models {
                t.row(vec![
                    name.clone(),
                    m.requests.to_string(),
                    m.errors.to_string(),
                    (m.prompt_tokens + m.completion_tokens).to_string(),
                    (m.latency_ms_total / m.requests.max(1)).to_string(),
                ]);
            }
            t.print(out)?;
            let mut t = Table::new(vec!["SCOPE", "ID", "TODAY µ", "MONTH µ", "TOTAL µ"]);
            for (scope, ids) in &p.usage.spend {
                for (id, s) in ids {
                    t.row(vec![
                        scope.name().into(),
                        id.clone(),
                        s.day.micros.to_string(),
                        s.month.micros.to_string(),
                        s.total_micros.to_string(),
                    ]);
                }
            }
            writeln!(out)?;
            t.print(out)
        }
    }
}

async fn read_stream(store: &AnyStore, stream: &str) -> anyhow::Result<Vec<RecordedEvent>> {
    let mut events = Vec::new();
    loop {
        let page = store
            .read_stream(stream, events.len() as u64, DEFAULT_PAGE)
            .await?;
        if page.is_empty() {
            return Ok(events);
        }
        events.extend(page);
    }
}

/// What `events log` shows the history of.
#[derive(Debug, Clone)]
pub(crate) enum Thing {
    /// One stream, such as `key-k1`.
    Stream(String),
    /// A node, and the replicas and shards placed on it.
    Node(String),
    /// A model, and its replicas.
    Model(String),
    /// A person (by user id), and the keys they made for themselves.
    User(String),
}

/// A replica as placed (or adopted): its model and where its shards ran.
#[derive(Debug)]
struct Placed {
    replica_id: String,
    model: String,
    /// Shard id and node id.
    shards: Vec<(String, String)>,
}

/// The payloads of every event of type `kind`, newest first; the store
/// filters on the type.
async fn payloads_of(store: &AnyStore, kind: &str) -> anyhow::Result<Vec<Value>> {
    let (head, _) = store.head().await?;
    let filter = EventFilter {
        event_type: Some(kind.to_owned()),
        ..EventFilter::default()
    };
    let mut out = Vec::new();
    let mut below = head + 1;
    while below > 1 {
        let page = store
            .read_backward_raw(&filter, 0..below, DEFAULT_PAGE)
            .await?;
        let Some(last) = page.last() else {
            break;
        };
        below = last.position;
        out.extend(page.into_iter().map(|e| e.payload));
    }
    Ok(out)
}

fn text(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(str::to_owned)
}

/// Every replica the log ever placed or adopted, read from the payloads.
async fn placements(store: &AnyStore) -> anyhow::Result<Vec<Placed>> {
    let mut out = Vec::new();
    for kind in ["ReplicaPlaced", "ReplicaAdopted"] {
        for payload in payloads_of(store, kind).await? {
            let shards = payload
                .get("shards")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|s| Some((text(s, "shard_id")?, text(s, "node_id")?)))
                        .collect()
                })
                .unwrap_or_default();
            if let (Some(replica_id), Some(model)) =
                (text(&payload, "replica_id"), text(&payload, "model"))
            {
                out.push(Placed {
                    replica_id,
                    model,
                    shards,
                });
            }
        }
    }
    Ok(out)
}

/// The streams of a thing's timeline, with the shard events to leave out
/// of each (a node's view of a replica shows only its own shards).
async fn streams_of(
    store: &AnyStore,
    thing: &Thing,
) -> anyhow::Result<(String, Vec<(String, Option<Vec<String>>)>)> {
    let own = match thing {
        Thing::Stream(s) => s.clone(),
        Thing::Node(n) => format!("node-{n}"),
        Thing::Model(m) => format!("model-{m}"),
        Thing::User(u) => format!("user-{u}"),
    };
    let mut streams = vec![(own.clone(), None), (format!("audit-{own}"), None)];
    match thing {
        Thing::Stream(_) => {}
        Thing::Node(n) => {
            // How it joined: the token's stream (who issued it, its use).
            for joined in payloads_of(store, "NodeJoined").await? {
                if text(&joined, "node_id").as_deref() == Some(n.as_str())
                    && let Some(token) = text(&joined, "token_id")
                {
                    streams.push((format!("jointoken-{token}"), None));
                }
            }
            for p in placements(store).await? {
                let here: Vec<String> = p
                    .shards
                    .iter()
                    .filter(|(_, node)| node == n)
                    .map(|(shard, _)| shard.clone())
                    .collect();
                if !here.is_empty() {
                    streams.push((format!("replica-{}", p.replica_id), Some(here)));
                }
            }
        }
        Thing::Model(m) => {
            for p in placements(store).await? {
                if p.model == *m {
                    streams.push((format!("replica-{}", p.replica_id), None));
                }
            }
        }
        Thing::User(u) => {
            for key in payloads_of(store, "KeyIssued").await? {
                let mine = key.get("owner").and_then(Value::as_str) == Some(u.as_str());
                if let Some(id) = text(&key, "key_id").filter(|_| mine) {
                    streams.push((format!("key-{id}"), None));
                    streams.push((format!("audit-key-{id}"), None));
                }
            }
        }
    }
    streams.sort();
    streams.dedup_by(|a, b| a.0 == b.0);
    Ok((own, streams))
}

/// One thing's timeline: its stream and the refused commands about it
/// (`audit-<stream>`), and for a node or a model the replicas concerned,
/// in log order, so that attempts show next to changes and a replica's
/// life next to its node's.
pub(crate) async fn log(store: &AnyStore, thing: &Thing, json: bool) -> anyhow::Result<Outcome> {
    let (own, streams) = streams_of(store, thing).await?;
    let mut events = Vec::new();
    for (stream, shards) in &streams {
        let mut these = read_stream(store, stream).await?;
        if let Some(shards) = shards {
            these.retain(|e| {
                e.event_type != "ShardStateChanged"
                    || e.payload
                        .get("shard_id")
                        .and_then(Value::as_str)
                        .is_some_and(|s| shards.iter().any(|mine| mine == s))
            });
        }
        events.extend(these);
    }
    // A key its owner's erasure stopped: that erasure is part of the key's
    // history, which showed it issued and nothing after while it answered
    // 401 (the person's other events are theirs, not the key's).
    if own.starts_with("key-")
        && let Some(owner) = events
            .iter()
            .find(|e| e.event_type == "KeyIssued")
            .and_then(|e| text(&e.payload, "owner"))
    {
        let theirs = read_stream(store, &format!("user-{owner}")).await?;
        events.extend(theirs.into_iter().filter(|e| e.event_type == "UserErased"));
    }
    events.sort_by_key(|e| e.position);
    if events.is_empty() {
        bail!("no events in stream {own}");
    }
    let mut out = std::io::stdout().lock();
    if json {
        for e in &events {
            json_line(&mut out, e)?;
        }
    } else {
        let mut t = Table::new(vec!["WHEN", "POSITION", "STREAM", "WHAT", "BY", "DETAILS"]);
        for e in &events {
            t.row(super::shown::cells(timeline_row(e)));
        }
        t.print(&mut out)?;
    }
    out.flush()?;
    Ok(Outcome::Ok)
}

/// Who acted, with the kind when it is not a person: the BY column, which
/// `--actor` also takes.
pub(crate) fn actor(e: &RecordedEvent) -> String {
    match llmgw_decider::actor_of(e) {
        (a, _) if a.is_empty() => "-".to_owned(),
        (a, kind) if kind.is_empty() || kind == "operator" => a,
        (a, kind) => format!("{a} ({kind})"),
    }
}

fn timeline_row(e: &RecordedEvent) -> Vec<String> {
    let field = |k: &str| e.payload.get(k).and_then(Value::as_str).unwrap_or("-");
    let details = if e.event_type == "CommandRefused" {
        format!("{}: {}", field("command"), field("reason"))
    } else if e.event_type == "ShardStateChanged" {
        // Which shard and what it became come first; the error's tail after.
        match e.payload.get("error").and_then(Value::as_str) {
            Some(error) => format!("{} {}: {error}", field("shard_id"), field("state")),
            None => format!("{} {}", field("shard_id"), field("state")),
        }
    } else if e.event_type == "UsageBatchRecorded" {
        crate::output::payload_summary(e)
    } else {
        let mut details = e.payload.clone();
        if let Value::Object(m) = &mut details {
            m.remove("by");
        }
        details.to_string()
    };
    let details = if details.chars().count() > 90 {
        details
            .chars()
            .take(89)
            .chain(std::iter::once('…'))
            .collect()
    } else {
        details
    };
    vec![
        super::filter::when(e.recorded_at),
        e.position.to_string(),
        e.stream_id.clone(),
        e.event_type.clone(),
        actor(e),
        details,
    ]
}

pub(crate) async fn diff(
    store: &AnyStore,
    from: Point,
    to: Point,
    view: &str,
    json: bool,
) -> anyhow::Result<Outcome> {
    check_view(view)?;
    let (start, end) = (from.before(store).await?, to.end(store).await?);
    super::check_range(start, Some(end), store.head().await?.0, "--to")?;
    let before = fold(store, start).await?;
    let after = fold(store, end).await?;
    let mut changes = Vec::new();
    compare(
        "",
        &before.view_json(view).context("view")?,
        &after.view_json(view).context("view")?,
        &mut changes,
    );
    let mut out = std::io::stdout().lock();
    if json {
        for (path, old, new) in &changes {
            json_line(
                &mut out,
                &serde_json::json!({ "path": path, "before": old, "after": new }),
            )?;
        }
    } else {
        writeln!(
            out,
            "{view} view from position {} to {}: {} change(s)",
            before.checkpoint.position,
            after.checkpoint.position,
            changes.len()
        )?;
        skipped(&mut out, &after)?;
        for (path, old, new) in &changes {
            match (old, new) {
                (None, Some(n)) => writeln!(out, "+ {path} = {n}")?,
                (Some(o), None) => writeln!(out, "- {path} = {o}")?,
                (Some(o), Some(n)) => writeln!(out, "~ {path}: {o} → {n}")?,
                (None, None) => {}
            }
        }
    }
    out.flush()?;
    Ok(Outcome::Ok)
}

type Change = (String, Option<Value>, Option<Value>);

/// The leaves that differ between two JSON values, by path.
fn compare(path: &str, a: &Value, b: &Value, out: &mut Vec<Change>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = format!("{path}/{k}");
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) => compare(&p, va, vb, out),
                    (va, vb) => out.push((p, va.cloned(), vb.cloned())),
                }
            }
        }
        _ if a != b => out.push((
            if path.is_empty() {
                "/".into()
            } else {
                path.to_owned()
            },
            Some(a.clone()),
            Some(b.clone()),
        )),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn recorded(event_type: &str, payload: Value, metadata: Value) -> RecordedEvent {
        RecordedEvent {
            position: 7,
            stream_id: "key-k1".into(),
            stream_version: 1,
            event_id: uuid::Uuid::nil(),
            event_type: event_type.into(),
            schema_version: 1,
            payload,
            metadata,
            epoch: 1,
            recorded_at: DateTime::UNIX_EPOCH,
            hash: [0; 32],
        }
    }

    #[test]
    fn the_timeline_names_who_acted_and_what_was_refused() {
        let revoked = recorded(
            "KeyRevoked",
            json!({"key_id": "k1", "by": "cli"}),
            json!({"writer": "cli-9-0", "actor": "alice", "actor_kind": "operator", "command_id": "c1"}),
        );
        assert_eq!(
            timeline_row(&revoked)[..3],
            ["1970-01-01T00:00:00.000Z", "7", "key-k1"]
        );
        assert_eq!(
            timeline_row(&revoked)[4..],
            ["alice", "{\"key_id\":\"k1\"}"]
        );
        let refused = recorded(
            "CommandRefused",
            json!({"actor": "bob", "command": "IssueKey k2 named \"ci\" in project p", "target": "key-k2", "reason": "project p already has a key named ci (k1)"}),
            json!({"writer": "cp-1", "actor": "bob", "actor_kind": "operator", "command_id": "c2"}),
        );
        assert_eq!(
            timeline_row(&refused)[3..],
            [
                "CommandRefused",
                "bob",
                "IssueKey k2 named \"ci\" in project p: project p already has a key named ci (k1)"
            ]
        );
        let limited = recorded(
            "LimitsSet",
            json!({"scope": "key", "scope_id": "k1", "limits": {"rpm": 5}}),
            json!({"writer": "cp-1", "actor": "cp-1", "actor_kind": "leader"}),
        );
        assert_eq!(timeline_row(&limited)[4], "cp-1 (leader)");
        let old = recorded(
            "KeyRevoked",
            json!({"key_id": "k1", "by": "ops"}),
            json!({}),
        );
        assert_eq!(
            timeline_row(&old)[4],
            "ops",
            "older events: the payload's by"
        );
    }
}
