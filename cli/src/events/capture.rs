//! `llmgw events capture NAME --from P|TIME --to P|TIME`: an incident
//! turned into a replay test in one command. It writes, in the
//! replay-tests crate of a checkout:
//!
//! - `fixtures/NAME.jsonl`: a header (the control plane's timings as the
//!   log recorded them, and the views before the first event when the
//!   range starts after position 1), the events exactly as stored, and a
//!   trailer naming the header's hash, signed when a key is given;
//! - `tests/it/captured/NAME.rs`: a test that replays it, registered in
//!   `tests/it/captured/mod.rs`;
//! - the test's first snapshot: the story of the incident (the views'
//!   differences at each point of interest, redacted), so the test passes
//!   as written and a later change of behaviour shows as a diff.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use llmgw_domain::Event;
use llmgw_domain::event::LeadershipEvent;
use llmgw_eventstore::{AnyStore, EventFilter, EventStore, ExportLine, RecordedEvent};
use llmgw_projections::Projections;
use llmgw_projections::story::{self, CaptureHeader};

use super::history::Point;
use crate::Outcome;

/// Where a captured test goes, inside the replay-tests crate.
const CAPTURED: &str = "tests/it/captured";

pub(crate) struct Args {
    pub(crate) name: String,
    pub(crate) from: Point,
    pub(crate) to: Point,
    pub(crate) dir: PathBuf,
    pub(crate) sign_key: Option<PathBuf>,
}

/// A fixture's name: lowercase words joined by `-`, which is also a Rust
/// module's name once the dashes are underscores.
fn check_name(name: &str) -> anyhow::Result<String> {
    let ok = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
        && !name.contains("--");
    if !ok {
        bail!(
            "{name:?} is not a fixture name: lowercase letters, digits and single dashes, starting with a letter (node-lost-on-gpu-b)"
        );
    }
    Ok(name.replace('-', "_"))
}

/// The first position recorded at or after `t`.
async fn first_at(store: &AnyStore, t: chrono::DateTime<chrono::Utc>) -> anyhow::Result<u64> {
    let before =
        llmgw_projections::position_at(store, t - chrono::Duration::microseconds(1)).await?;
    Ok(before + 1)
}

/// The leader in office at `from`: its `LeadershipAcquired` at or before
/// it, or else the first one in the range.
fn leader_of(
    before: Option<RecordedEvent>,
    events: &[RecordedEvent],
) -> Option<(String, u64, Option<llmgw_domain::event::ControlSettings>)> {
    let e = before.or_else(|| {
        events
            .iter()
            .find(|e| e.event_type == "LeadershipAcquired")
            .cloned()
    })?;
    match Event::decode(&e.event_type, e.schema_version, &e.payload).ok()? {
        Event::Leadership(LeadershipEvent::LeadershipAcquired {
            holder, settings, ..
        }) => Some((holder, e.position, settings)),
        _ => None,
    }
}

pub(crate) async fn run(store: &AnyStore, a: Args) -> anyhow::Result<Outcome> {
    let module = check_name(&a.name)?;
    let fixtures = a.dir.join("fixtures");
    let captured = a.dir.join(CAPTURED);
    if !fixtures.is_dir() || !a.dir.join("tests/it/main.rs").is_file() {
        bail!(
            "{} is not the replay-tests crate (no fixtures/ and tests/it/main.rs there): run this at the root of an llmgw checkout, or give --dir",
            a.dir.display()
        );
    }
    let fixture = fixtures.join(format!("{}.jsonl", a.name));
    let test = captured.join(format!("{module}.rs"));
    for p in [&fixture, &test] {
        if p.exists() {
            bail!(
                "{} exists: choose another name, or remove it to capture again",
                p.display()
            );
        }
    }
    let key = a
        .sign_key
        .as_deref()
        .map(llmgw_eventstore::signing::SigningKey::read)
        .transpose()?;

    let (head, _) = store.head().await?;
    let from = match a.from {
        Point::Position(p) => p,
        Point::Time { first, .. } => first_at(store, first).await?,
    };
    let to = a.to.end(store).await?;
    let (base_pos, _) = store.base().await?;
    if from <= base_pos || from == 0 || from > to || to > head {
        bail!(
            "--from {from} --to {to} is not a range of this log, which holds {}..={head}",
            base_pos + 1
        );
    }

    // The views before the range, so that a range that starts late still
    // replays into the catalog and nodes it refers to.
    if base_pos > 0 && from > base_pos + 1 {
        eprintln!(
            "warning: this log begins at position {} (imported from an anchor): the views before the range hold only positions {}..={}, so the catalog and nodes from before may be missing; export the source from position 1 for a whole picture",
            base_pos + 1,
            base_pos + 1,
            from - 1
        );
    }
    let base = if from > 1 {
        let mut views = Projections::default();
        llmgw_projections::replay_to(store, &mut views, from - 1).await?;
        Some(serde_json::to_value(&views)?)
    } else {
        None
    };
    let acquired = EventFilter {
        event_type: Some("LeadershipAcquired".into()),
        ..EventFilter::default()
    };
    let before = store
        .read_backward_raw(&acquired, 0..from + 1, 1)
        .await?
        .into_iter()
        .next();

    // The events as `events export` writes them (the first names its
    // predecessor's hash), read back for the story.
    let mut body = Vec::new();
    let done = llmgw_eventstore::export(store, from, Some(to), &mut body).await?;
    let events: Vec<RecordedEvent> = std::str::from_utf8(&body)?
        .lines()
        .map(|l| match llmgw_eventstore::parse_line(l) {
            Ok(ExportLine::Event(e)) => Ok(*e),
            Ok(_) => bail!("the export wrote a line that is not an event"),
            Err(e) => Err(e.into()),
        })
        .collect::<anyhow::Result<_>>()?;
    let leader = leader_of(before, &events);
    let header = CaptureHeader {
        capture: a.name.clone(),
        from,
        to,
        settings: leader.as_ref().and_then(|l| l.2.clone()),
        leader: leader.as_ref().map(|l| l.0.clone()),
        leader_since: leader.as_ref().map(|l| l.1),
        views_format: Projections::STATE_VERSION,
        base,
    };
    let header_value = serde_json::to_value(&header)?;

    let mut file = Vec::with_capacity(body.len() + 4096);
    llmgw_eventstore::write_header(&mut file, &header_value)?;
    file.extend_from_slice(&body);
    let mut trailer = super::trailer(store, &done, head).await?;
    trailer.header_hash = Some(llmgw_eventstore::header_hash(&header_value));
    if let Some(key) = &key {
        trailer.sign(key);
    }
    llmgw_eventstore::write_trailer(&mut file, &trailer)?;

    // The story as the test will tell it: from the header as written.
    let base_views = header.base_views().map_err(anyhow::Error::msg)?;
    let told = story::story(&base_views, &events, story::of_interest);
    let snapshot = captured
        .join("snapshots")
        .join(format!("it__captured__{module}__story.snap"));

    std::fs::create_dir_all(snapshot.parent().expect("a parent"))?;
    write_new(&fixture, &file)?;
    write_new(
        &test,
        skeleton(&a.name, &module, &header, &events).as_bytes(),
    )?;
    std::fs::write(&snapshot, snap_file(&module, &told))
        .with_context(|| format!("cannot write {}", snapshot.display()))?;
    register(&captured.join("mod.rs"), &module)?;

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "captured positions {from}..={to} ({} events) as {}",
        done.events,
        fixture.display()
    )?;
    match &header.settings {
        Some(s) => writeln!(
            out,
            "control timings of {} recorded in its header: unreachable after {} ms, lost after {} ms",
            header.leader.as_deref().unwrap_or("the leader"),
            s.unreachable_after_ms,
            s.lost_after_ms
        )?,
        None => writeln!(
            out,
            "no control timings: no leader in this log recorded them (an older server)"
        )?,
    }
    writeln!(out, "test      {}", test.display())?;
    writeln!(out, "snapshot  {}", snapshot.display())?;
    writeln!(
        out,
        "next: cargo test -p llmgw-replay-tests -- {module}; then write what should have happened in the test, review the snapshot, and commit all three"
    )?;
    Ok(Outcome::Ok)
}

fn write_new(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes)?;
    Ok(())
}

/// Adds `mod NAME;` to the captured tests' list, keeping it sorted.
fn register(list: &Path, module: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(list).unwrap_or_default();
    let line = format!("mod {module};");
    let (mut mods, rest): (Vec<&str>, Vec<&str>) = text
        .lines()
        .partition(|l| l.starts_with("mod ") && l.ends_with(';'));
    if mods.contains(&line.as_str()) {
        return Ok(());
    }
    mods.push(&line);
    mods.sort_unstable();
    let mut out = String::new();
    for l in rest.iter().filter(|l| !l.trim().is_empty()) {
        out.push_str(l);
        out.push('\n');
    }
    if !out.is_empty() {
        out.push('\n');
    }
    for m in mods {
        out.push_str(m);
        out.push('\n');
    }
    std::fs::write(list, out).with_context(|| format!("cannot write {}", list.display()))
}

/// The snapshot file insta reads for the test's `assert_snapshot!("story", …)`.
pub(crate) fn snap_file(module: &str, story: &str) -> String {
    format!("---\nsource: replay-tests/{CAPTURED}/{module}.rs\nexpression: t.story()\n---\n{story}")
}

/// The test, as written: it replays the fixture and compares the story;
/// the account of what should have happened is the engineer's to write,
/// and the comment suggests one from what the fixture holds.
pub(crate) fn skeleton(
    name: &str,
    module: &str,
    header: &CaptureHeader,
    events: &[RecordedEvent],
) -> String {
    let mut ideas = Vec::new();
    let mut names = story::Redactor::new(0);
    if let Ok(base) = header.base_views() {
        names.learn_views(&base);
    }
    events.iter().for_each(|e| names.learn_event(e));
    let lost = events.iter().find(|e| e.event_type == "NodeLost");
    if let Some((node, at)) = lost.and_then(|e| Some((e.payload["node_id"].as_str()?, e.position)))
    {
        ideas.push(format!(
            "let lost = t.first(\"NodeLost\", \"{node}\");\nassert!(t.between(t.first(\"NodeUnreachable\", \"{node}\"), lost) <= t.setting(\"lost_after\"));"
        ));
        // The first replica ready after the loss: the replacement.
        let replacement = events
            .iter()
            .filter(|e| e.position > at && e.event_type == "ReplicaReady")
            .find_map(|e| e.payload["replica_id"].as_str())
            .map(|id| names.name(id).unwrap_or(id).to_owned());
        if let Some(r) = replacement {
            ideas.push(format!(
                "let ready = t.first(\"ReplicaReady\", \"{r}\");\nassert!(t.between(lost, ready) < std::time::Duration::from_secs(60));"
            ));
        }
    }
    // The first replica to serve, and its model: never unroutable after.
    let served = events
        .iter()
        .filter(|e| e.event_type == "ReplicaReady")
        .find_map(|e| e.payload["replica_id"].as_str());
    let model = served.and_then(|id| {
        events.iter().find_map(|e| {
            let p = &e.payload;
            (e.event_type == "ReplicaPlaced" && p["replica_id"] == id)
                .then(|| p["model"].as_str().map(str::to_owned))
                .flatten()
        })
    });
    if let (Some(id), Some(m)) = (served, model) {
        let r = names.name(id).unwrap_or(id);
        ideas.push(format!(
            "let served = t.first(\"ReplicaReady\", \"{r}\");\nt.never(\"{m} unroutable once served\", |v| v.checkpoint.position > served.position && v.router.endpoints_for(\"{m}\").count() == 0);"
        ));
    }
    if ideas.is_empty() {
        ideas.push("let first = t.first(\"EventType\", \"thing\");\nassert!(t.between(first, t.first(\"OtherType\", \"thing\")) < std::time::Duration::from_secs(60));".into());
    }
    let ideas: String = ideas
        .iter()
        .flat_map(|i| i.lines())
        .map(|l| format!("    // {l}\n"))
        .collect();
    format!(
        r#"//! {name}: positions {from}..={to}, captured with
//! `llmgw events capture {name} --from {from} --to {to}`.
//! The snapshot is the incident as the views saw it (ids named in order
//! of appearance, host facts blanked, times from the first event). Say
//! below what should have happened, as you would tell it.

use llmgw_replay_tests::timeline::Timeline;

#[test]
fn {module}() {{
    let t = Timeline::fixture("{name}");
    insta::assert_snapshot!("story", t.story());
    // What should have happened, for example:
{ideas}}}
"#,
        from = header.from,
        to = header.to,
    )
}
