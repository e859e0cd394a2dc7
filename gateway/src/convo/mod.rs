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
pub(crate) mod threads;
mod tokenize;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use llmgw_convo::{Convo, ConvoError, Keep, Retention};
use llmgw_domain::conversations::ThreadsSetting;

use crate::{ApiError, Gateway};

/// The most a memory note or an MCP message may be: the 2 MiB axum's
/// extractors allowed, read only once the caller's key is good.
const BODY_LIMIT: usize = 2 * 1024 * 1024;

pub(crate) use mcp::routes as mcp_routes;
pub(crate) use memory::routes as memory_routes;
pub(crate) use threads::{Turn, thread_header};

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

    /// Per project, how long threads and notes are kept: with keys, each
    /// project the tenancy view knows (switched off: nothing); without,
    /// the ownerless pool (project `""`). What this server does not know
    /// of (another kind of server's, on the same store) is not named, so
    /// the sweep leaves it alone.
    pub fn retention(&self) -> Retention {
        let mut keep = Retention::default();
        if let Some(keys) = &self.keys {
            let views = keys.views.read().unwrap_or_else(|p| p.into_inner());
            let t = &views.tenancy.tenancy;
            let per_project = |hours: &dyn Fn(&str) -> Option<u32>| {
                t.projects
                    .keys()
                    .map(|p| (p.clone(), hours(p).map_or(Keep::Nothing, Keep::Hours)))
                    .collect()
            };
            keep.threads = per_project(&|p| t.threads.get(p).map(|s| s.retain_hours));
            keep.notes = per_project(&|p| t.memory.get(p).map(|s| s.retain_hours));
        } else if let Some(open) = self.convo.get().and_then(|k| k.settings.open_threads) {
            keep.threads
                .insert(String::new(), Keep::Hours(open.retain_hours));
        }
        keep
    }
}

/// Sweeps the conversation tables every `period` (the first at once):
/// what outlived its retention goes, and everything of a project that
/// switched a kind off; what this server does not know of stays (see
/// [`Gateway::retention`]). Any server may sweep: deletions are
/// idempotent.
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

/// What a request does with what is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Use {
    /// Keeps more: only where the project keeps that kind.
    Write,
    /// Reads or deletes what is kept: also once the project switched the
    /// kind off, until the sweep deletes it, so that a client can always
    /// read and delete its own.
    Reach,
}

/// `GET /v1/threads/{id}`, for a project that switched threads off too.
pub(crate) async fn read_thread(
    gw: axum::extract::State<Arc<Gateway>>,
    headers: HeaderMap,
    thread: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    let by = key_of(&gw, &headers);
    keyed(by.as_deref(), threads::read(gw, headers, thread).await)
}

/// `DELETE /v1/threads/{id}`, for a project that switched threads off too.
pub(crate) async fn delete_thread(
    gw: axum::extract::State<Arc<Gateway>>,
    headers: HeaderMap,
    thread: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    let by = key_of(&gw, &headers);
    keyed(by.as_deref(), threads::delete(gw, headers, thread).await)
}

/// The request's key, where it has a good one (the handler refuses it
/// otherwise).
fn key_of(gw: &Gateway, headers: &HeaderMap) -> Option<Arc<llmgw_projections::KeyEntry>> {
    crate::proxy::identify(gw, headers).ok()?.key
}

/// The answer to `by`'s request: its access line (the edge's plain one)
/// names the key, as an inference line does, so that what a key wrote or
/// deleted is on record.
fn keyed(by: Option<&llmgw_projections::KeyEntry>, mut answer: Response) -> Response {
    if let Some(k) = by {
        answer
            .extensions_mut()
            .insert(crate::access::KeyOf(k.key_id.clone()));
    }
    answer
}

/// Where a caller's thread turns are kept, and how: its project, which
/// must keep threads, or the ownerless pool.
fn threads_of(
    gw: &Gateway,
    key: Option<&llmgw_projections::KeyEntry>,
) -> Result<(String, ThreadsSetting), ApiError> {
    match threads_for(gw, key, Use::Write)? {
        (project, Some(setting)) => Ok((project, setting)),
        // threads_for refuses a write there already, with how to turn
        // threads on.
        (project, None) => Err(refusal(
            StatusCode::FORBIDDEN,
            "threads_off",
            format!("project {project} keeps no threads"),
        )),
    }
}

/// The project whose threads the caller's key reaches, and its setting
/// (None: switched off, where `need` allows that: reading and deleting
/// `/v1/threads/{id}` do).
pub(super) fn threads_for(
    gw: &Gateway,
    key: Option<&llmgw_projections::KeyEntry>,
    need: Use,
) -> Result<(String, Option<ThreadsSetting>), ApiError> {
    let keeper = keeper(gw)?;
    match (key, &gw.keys) {
        (Some(k), Some(keys)) => {
            let views = keys.views.read().unwrap_or_else(|p| p.into_inner());
            match views.tenancy.tenancy.threads.get(&*k.project_id) {
                Some(s) => Ok((k.project_id.to_string(), Some(*s))),
                None if need == Use::Reach => Ok((k.project_id.to_string(), None)),
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
            Some(s) => Ok((String::new(), Some(s))),
            None => Err(refusal(
                StatusCode::FORBIDDEN,
                "conversations_off",
                "this gateway keeps no conversations".into(),
            )),
        },
    }
}

/// Whose notes a request reaches: its key's project and agent. Writing
/// needs the project to keep notes; reading, searching and deleting do
/// not (see [`Use::Reach`]).
fn memory_of(
    gw: &Gateway,
    key: Option<&llmgw_projections::KeyEntry>,
    headers: &HeaderMap,
    need: Use,
) -> Result<llmgw_convo::Owner, ApiError> {
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
    let keeps = {
        let views = keys.views.read().unwrap_or_else(|p| p.into_inner());
        views.tenancy.tenancy.memory.contains_key(&*k.project_id)
    };
    if !keeps && need == Use::Write {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "memory_off",
            format!(
                "project {p} keeps no memory notes: an operator turns them on with \
                 `llmgw keys memory --project {p} --retain-hours N`",
                p = k.project_id
            ),
        ));
    }
    let agent = match headers.get("x-llmgw-agent") {
        None => "default".to_owned(),
        Some(v) => {
            let a = v.to_str().unwrap_or("?").trim().to_owned();
            llmgw_convo::limits::check_name("agent", &a).map_err(convo_error)?;
            a
        }
    };
    Ok(llmgw_convo::Owner {
        project: k.project_id.to_string(),
        agent,
    })
}
