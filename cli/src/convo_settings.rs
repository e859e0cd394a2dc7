//! The `conversations:` and `threads:` sections: how threads are trimmed
//! and captured, how often the conversation tables are swept, and, without
//! keys, the one shared pool of threads. Whether a project keeps threads or
//! notes is not configuration: it is switched per project in the log
//! (`llmgw keys threads`, `llmgw keys memory`).

use std::time::Duration;

use llmgw_domain::conversations::{ThreadsSetting, check_retention};
use serde::Deserialize;

use crate::config::{ConfigError, duration};

/// How conversations are kept, where they are.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConversationsSection {
    /// Tokens a thread is trimmed to when the catalog gives the model no
    /// context_length (default 8192).
    pub default_context: Option<u32>,
    /// The most of a captured reply kept, in bytes (default 16384).
    pub capture_max_bytes: Option<usize>,
    /// How often expired threads and notes are deleted (default 1h).
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub sweep_interval: Option<String>,
}

/// Without keys only: one shared, ownerless pool of threads, for one
/// trusted machine.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ThreadsSection {
    /// Where the threads are kept (as `--store`); default the server's
    /// store.
    pub store: Option<String>,
    /// Hours a thread is kept after its last write (mandatory).
    pub retain_hours: u32,
    /// Keep the model's replies too (capped). Default false.
    #[serde(default)]
    pub capture: bool,
}

/// What the composition root needs.
#[derive(Debug, Clone)]
pub(crate) struct ConvoPlan {
    pub settings: llmgw_gateway::ConvoSettings,
    /// Where the conversation tables are: None means the server's store.
    pub store: Option<String>,
    /// Whether this server keeps conversations at all.
    pub enabled: bool,
    pub sweep: Duration,
}

impl Default for ConvoPlan {
    fn default() -> Self {
        ConvoPlan {
            settings: Default::default(),
            store: None,
            enabled: false,
            sweep: Duration::from_secs(3600),
        }
    }
}

pub(crate) fn convo_plan(
    c: &ConversationsSection,
    threads: Option<&ThreadsSection>,
    auth: bool,
) -> Result<ConvoPlan, ConfigError> {
    let mut plan = ConvoPlan::default();
    match (threads, auth) {
        (Some(_), true) => {
            return Err(ConfigError(
                "threads: is the shared pool of a gateway without keys; with auth.enabled, \
                 threads are switched on per project: llmgw keys threads --project P"
                    .into(),
            ));
        }
        (Some(t), false) => {
            // Without keys capture is the pool's one switch; with keys it is
            // each project's, so the cap is read whenever one turns it on.
            if !t.capture && c.capture_max_bytes.is_some() {
                return Err(ConfigError(
                    "conversations.capture_max_bytes applies only where replies are captured: \
                     set threads.capture: true or remove it"
                        .into(),
                ));
            }
            check_retention(t.retain_hours)
                .map_err(|r| ConfigError(format!("threads.retain_hours: {}", r.reason)))?;
            plan.settings.open_threads = Some(ThreadsSetting {
                capture: t.capture,
                retain_hours: t.retain_hours,
            });
            // Read now, so that --check and the start refuse a bad
            // address alike (exit 2), not the first open at run.
            if let Some(address) = &t.store {
                llmgw_eventstore::StoreAddress::parse(address)
                    .map_err(|e| ConfigError(format!("threads.store: {e}")))?;
            }
            plan.store = t.store.clone();
            plan.enabled = true;
        }
        (None, true) => plan.enabled = true,
        (None, false) => {
            let set = [
                (c.default_context.is_some(), "conversations.default_context"),
                (
                    c.capture_max_bytes.is_some(),
                    "conversations.capture_max_bytes",
                ),
                (c.sweep_interval.is_some(), "conversations.sweep_interval"),
            ];
            if let Some((_, key)) = set.iter().find(|(s, _)| *s) {
                return Err(ConfigError(format!(
                    "{key} applies only where conversations are kept: \
                     set auth.enabled (per-project switches) or a threads: block"
                )));
            }
        }
    }
    if let Some(n) = c.default_context {
        if n == 0 {
            return Err(ConfigError(
                "conversations.default_context must be above 0".into(),
            ));
        }
        plan.settings.default_context = n;
    }
    if let Some(n) = c.capture_max_bytes {
        plan.settings.capture_max_bytes = n;
    }
    if let Some(v) = &c.sweep_interval {
        plan.sweep = duration("conversations.sweep_interval", v)?;
        if plan.sweep.is_zero() {
            return Err(ConfigError(
                "conversations.sweep_interval must be above 0".into(),
            ));
        }
    }
    Ok(plan)
}
