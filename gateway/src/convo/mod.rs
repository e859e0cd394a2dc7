//! What the gateway keeps of conversations, for projects that switched it
//! on: threads (`x-llmgw-thread` on a chat completion: the history is
//! prepended, the turn kept, the reply too when the project captures)
//! and memory notes (`/v1/memory`). The text lives in the `convo_*`
//! tables (`llmgw-convo`), never in the log; whether a project keeps
//! anything, and for how long, is read from the tenancy view.
//!
//! A request that names a thread reads its history from the store: the
//! one place a request waits on the database, and only when it asked to.

mod mcp;
mod memory;
mod threads;
mod tokenize;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use llmgw_convo::{Convo, ConvoError, Retention};
use llmgw_domain::conversations::{MemorySetting, ThreadsSetting};

use crate::{ApiError, Gateway};

/// The most a memory note or an MCP message may be: the 2 MiB axum's
/// extractors allowed, read only once the caller's key is good.
const BODY_LIMIT: usize = 2 * 1024 * 1024;

pub(crate) use mcp::routes as mcp_routes;
pub(crate) use memory::routes as memory_routes;
pub(crate) use threads::{Turn, delete as delete_thread, read as read_thread, thread_header};

/// How conversations are kept, beside the per-project switches.
#[derive(Debug, Clone)]
pub struct ConvoSettings {
    /// Without keys: the one shared, ownerless pool of threads (the
    /// `threads:` block); None keeps none. Ignored with keys: the
    /// composition root refuses the block at start.
    pub open_threads: Option<ThreadsSetting>,
    /// The context a thread is trimmed to when the catalog gives the
    /// model none, in tokens.
    pub default_context: u32,
    /// The most of a reply kept, in bytes of its text.
    pub capture_max_bytes: usize,
}

impl Default for ConvoSettings {
    fn default() -> Self {
        ConvoSettings {
            open_threads: None,
            default_context: 8192,
            capture_max_bytes: 16 * 1024,
        }
    }
}

/// The tables and the settings, set once by the composition root.
#[derive(Debug)]
pub(crate) struct Keeper {
    pub(crate) store: Convo,
    pub(crate) settings: ConvoSettings,
}

impl Gateway {
    /// Keeps conversations in `store` for the projects that switched them
    /// on (and, without keys, in `settings.open_threads`' pool); once.
    pub fn keep_conversations(&self, store: Convo, settings: ConvoSettings) {
        let _ = self.convo.set(Arc::new(Keeper { store, settings }));
    }

    /// Per project, how long threads and notes are kept: the tenancy
    /// view's switches, and the ownerless pool (project `""`).
    pub fn retention(&self) -> Retention {
        let mut keep = Retention::default();
        if let Some(keys) = &self.keys {
            let views = keys.views.read().unwrap_or_else(|p| p.into_inner());
            let t = &views.tenancy.tenancy;
            keep.threads = t
                .threads
                .iter()
                .map(|(p, s)| (p.clone(), s.retain_hours))
                .collect();
            keep.notes = t
                .memory
                .iter()
                .map(|(p, s)| (p.clone(), s.retain_hours))
                .collect();
        } else if let Some(open) = self.convo.get().and_then(|k| k.settings.open_threads) {
            keep.threads.insert(String::new(), open.retain_hours);
        }
        keep
    }
}

/// Sweeps the conversation tables every `period` (the first at once):
/// what outlived its retention goes, and everything of a project that
/// switched a kind off. Any server may sweep: deletions are idempotent.
pub async fn sweep_every(gw: Arc<Gateway>, period: Duration) {
    let Some(keeper) = gw.convo.get().cloned() else {
        return;
    };
    let mut every = tokio::time::interval(period);
    loop {
        every.tick().await;
        match keeper
            .store
            .sweep(&gw.retention(), chrono::Utc::now())
            .await
        {
            Ok(s) if s.threads + s.notes > 0 => {
                tracing::info!(threads = s.threads, notes = s.notes, "swept conversations");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "sweeping conversations"),
        }
    }
}

fn refusal(status: StatusCode, code: &'static str, message: String) -> ApiError {
    ApiError::new(status, "invalid_request_error", code, message)
}

/// A store failure as the client sees it: no internals.
fn unavailable(e: &ConvoError) -> ApiError {
    tracing::warn!(error = %e, "the conversation tables");
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "conversations_unavailable",
            "conversations cannot be read or kept right now; try again shortly",
        )
    }
}

fn convo_error(e: ConvoError) -> ApiError {
    match e {
        ConvoError::Invalid(m) => ApiError::bad_request(m),
        e @ ConvoError::TooManyNotes { .. } => {
            refusal(StatusCode::CONFLICT, "too_many_notes", e.to_string())
        }
        e @ ConvoError::Store(_) => unavailable(&e),
    }
}

/// The keeper, or the refusal of a gateway that keeps nothing.
fn keeper(gw: &Gateway) -> Result<Arc<Keeper>, ApiError> {
    gw.convo.get().cloned().ok_or_else(|| {
        refusal(
            StatusCode::FORBIDDEN,
            "conversations_off",
            "this gateway keeps no conversations".into(),
        )
    })
}

/// Where a caller's threads are kept: its project, or the ownerless pool.
fn threads_of(
    gw: &Gateway,
    key: Option<&llmgw_projections::KeyEntry>,
) -> Result<(String, ThreadsSetting), ApiError> {
    let keeper = keeper(gw)?;
    match (key, &gw.keys) {
        (Some(k), Some(keys)) => {
            let views = keys.views.read().unwrap_or_else(|p| p.into_inner());
            match views.tenancy.tenancy.threads.get(&*k.project_id) {
                Some(s) => Ok((k.project_id.to_string(), *s)),
                None => Err(refusal(
                    StatusCode::FORBIDDEN,
                    "threads_off",
                    format!(
                        "project {p} keeps no threads, so this request would lose its history: \
                         an operator turns them on with `llmgw keys threads --project {p}`",
                        p = k.project_id
                    ),
                )),
            }
        }
        _ => match keeper.settings.open_threads {
            Some(s) => Ok((String::new(), s)),
            None => Err(refusal(
                StatusCode::FORBIDDEN,
                "conversations_off",
                "this gateway keeps no conversations".into(),
            )),
        },
    }
}

/// Where a caller's notes are kept: its project and agent.
fn memory_of(
    gw: &Gateway,
    key: Option<&llmgw_projections::KeyEntry>,
    headers: &HeaderMap,
) -> Result<(llmgw_convo::Owner, MemorySetting), ApiError> {
    keeper(gw)?;
    let (Some(k), Some(keys)) = (key, &gw.keys) else {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "conversations_off",
            "memory notes belong to a project's key, and this gateway runs without keys: \
             it keeps no notes"
                .into(),
        ));
    };
    let setting = {
        let views = keys.views.read().unwrap_or_else(|p| p.into_inner());
        views.tenancy.tenancy.memory.get(&*k.project_id).copied()
    };
    let Some(setting) = setting else {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "memory_off",
            format!(
                "project {p} keeps no memory notes: an operator turns them on with \
                 `llmgw keys memory --project {p} --retain-hours N`",
                p = k.project_id
            ),
        ));
    };
    let agent = match headers.get("x-llmgw-agent") {
        None => "default".to_owned(),
        Some(v) => {
            let a = v.to_str().unwrap_or("?").trim().to_owned();
            llmgw_convo::limits::check_name("agent", &a).map_err(convo_error)?;
            a
        }
    };
    Ok((
        llmgw_convo::Owner {
            project: k.project_id.to_string(),
            agent,
        },
        setting,
    ))
}
