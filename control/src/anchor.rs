//! Periodic anchors: while it leads, the control plane records the log's
//! chain head (`AnchorRecorded`, through the decider) every N events or T
//! minutes, and hands each anchor to a sink outside the database (a file
//! it appends to, or a command it runs), signed with the server's key when
//! one is configured. An auditor who holds the sink's anchors can prove
//! that the log they are later shown is the one that was running: a log
//! rewritten and rechained since does not have those hashes.
//!
//! A sink that fails is logged and counted, never retried into the log:
//! the anchor is in the log either way, and the next one carries on.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use llmgw_domain::Event;
use llmgw_domain::event::LeadershipEvent;
use llmgw_eventstore::signing::{Signature, SigningKey};
use llmgw_eventstore::{EventFilter, EventStore, LeaseToken, Writer, hash};
use serde_json::json;

use crate::ControlPlane;

/// When anchors are taken and where they go.
#[derive(Debug, Clone, Default)]
pub struct AnchorConfig {
    /// An anchor once this many events follow the last one.
    pub every_events: Option<u64>,
    /// An anchor at least this often while events are appended.
    pub every: Option<Duration>,
    /// Each anchor appended as a JSON line to this file.
    pub file: Option<PathBuf>,
    /// Each anchor given to this command (`sh -c`) as a JSON line on its
    /// standard input, and as `LLMGW_ANCHOR=HASH@POSITION`.
    pub command: Option<String>,
    /// Signs each line the sinks get.
    pub key: Option<Arc<SigningKey>>,
}

impl AnchorConfig {
    pub fn enabled(&self) -> bool {
        self.every_events.is_some() || self.every.is_some()
    }
}

/// How long a sink command may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// What a signed anchor line's signature is over.
pub const ANCHOR_CONTEXT: &str = "anchor";

/// Anchors taken and sink failures, for the metrics page.
#[derive(Debug, Default)]
pub struct AnchorStats {
    pub recorded: AtomicU64,
    pub sink_failures: AtomicU64,
}

/// The last anchor in the log: the position of its event and when.
#[derive(Debug, Clone, Copy)]
struct Last {
    at_position: u64,
    recorded_at: DateTime<Utc>,
}

async fn last_anchor(cp: &ControlPlane) -> Result<Option<Last>, llmgw_eventstore::StoreError> {
    let filter = EventFilter {
        streams: vec!["anchors".into()],
        ..EventFilter::default()
    };
    let found = cp.store.read_backward_raw(&filter, 0..u64::MAX, 1).await?;
    Ok(found.first().map(|e| Last {
        at_position: e.position,
        recorded_at: e.recorded_at,
    }))
}

/// Runs for the server's life: anchors while it leads.
pub(crate) async fn run(cp: Arc<ControlPlane>) {
    let config = cp.config.anchors.clone();
    if !config.enabled() {
        return;
    }
    let mut leadership = cp.leadership();
    loop {
        let token = leadership.borrow_and_update().clone();
        match token {
            Some(token) => {
                tokio::select! {
                    _ = lead(&cp, &config, &token) => {}
                    _ = leadership.changed() => {}
                }
            }
            None => {
                if leadership.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// While `token` leads: wait for enough events or enough time, anchor.
async fn lead(cp: &ControlPlane, config: &AnchorConfig, token: &LeaseToken) {
    let mut last = loop {
        match last_anchor(cp).await {
            Ok(l) => break l,
            Err(e) => {
                tracing::warn!(error = %e, "anchors: cannot read the last anchor");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let mut views_at = cp.views_at.clone();
    // A time-based anchor is looked for at least this often.
    let tick = config
        .every
        .map_or(Duration::from_secs(3600), |t| t.min(Duration::from_secs(1)));
    loop {
        let head = *views_at.borrow_and_update();
        let since = last.map_or(0, |l| l.at_position);
        // Events after the last anchor, not counting it.
        let pending = head.saturating_sub(since);
        let by_count = config.every_events.is_some_and(|n| pending >= n);
        let by_time = config.every.is_some_and(|t| {
            pending > 0
                && last.is_none_or(|l| {
                    Utc::now() - l.recorded_at
                        >= chrono::Duration::from_std(t).unwrap_or(chrono::Duration::MAX)
                })
        });
        if by_count || by_time {
            match anchor(cp, config, token).await {
                Ok(Some(l)) => last = Some(l),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "anchors: could not record an anchor");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            continue;
        }
        tokio::select! {
            r = views_at.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(tick) => {}
        }
    }
}

/// Records one anchor of the head and hands it to the sinks.
async fn anchor(
    cp: &ControlPlane,
    config: &AnchorConfig,
    token: &LeaseToken,
) -> Result<Option<Last>, llmgw_eventstore::StoreError> {
    let (position, head_hash) = cp.store.head().await?;
    if position == 0 {
        return Ok(None);
    }
    let hash = hash::to_hex(&head_hash);
    let event = Event::Leadership(LeadershipEvent::AnchorRecorded {
        position,
        hash: hash.clone(),
    });
    let appended = cp
        .decider
        .record(&Writer::Leader(token.clone()), &cp.own(), event)
        .await?;
    let recorded_at = Utc::now();
    cp.anchor_stats.recorded.fetch_add(1, Ordering::Relaxed);
    tracing::info!(position, hash = %hash, "anchor recorded");
    let line = sink_line(
        &cp.config.instance,
        position,
        &hash,
        appended.last_position,
        recorded_at,
        config.key.as_deref(),
    );
    if let Err(e) = deliver(config, &line, &format!("{hash}@{position}")).await {
        cp.anchor_stats
            .sink_failures
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %e, position, "anchors: the sink did not take the anchor");
    }
    Ok(Some(Last {
        at_position: appended.last_position,
        recorded_at,
    }))
}

/// One anchor as the sinks get it: `{"anchor": "HASH@POSITION", …}`, with
/// the server's signature over the rest when it has a key.
pub fn sink_line(
    instance: &str,
    position: u64,
    hash: &str,
    event: u64,
    at: DateTime<Utc>,
    key: Option<&SigningKey>,
) -> String {
    let mut value = json!({
        "anchor": format!("{hash}@{position}"),
        "event": event,
        "instance": instance,
        "at": at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    });
    if let Some(key) = key {
        let sig = Signature::over(key, ANCHOR_CONTEXT, &value);
        value["signature"] = serde_json::to_value(sig).expect("a signature serialises");
    }
    value.to_string()
}

async fn deliver(config: &AnchorConfig, line: &str, anchor: &str) -> Result<(), String> {
    let mut failed = Vec::new();
    if let Some(path) = &config.file {
        let (path, text) = (path.clone(), format!("{line}\n"));
        let written = tokio::task::spawn_blocking(move || append_line(&path, &text))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        if let Err(e) = written {
            failed.push(e);
        }
    }
    if let Some(command) = &config.command
        && let Err(e) = run_command(command, line, anchor).await
    {
        failed.push(e);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// Appends and syncs: an anchor the sink acknowledged is on its disk.
fn append_line(path: &std::path::Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_data())
        .map_err(|e| format!("{}: {e}", path.display()))
}

async fn run_command(command: &str, line: &str, anchor: &str) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("LLMGW_ANCHOR", anchor)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run the anchor command: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its input still gets to run.
        let _ = stdin.write_all(format!("{line}\n").as_bytes()).await;
    }
    let out = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| format!("the anchor command ran past {COMMAND_TIMEOUT:?}; killed"))?
        .map_err(|e| format!("the anchor command: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let tail: String = err
        .trim()
        .chars()
        .rev()
        .take(300)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Err(format!(
        "the anchor command failed ({}): {tail}",
        out.status
    ))
}
