//! The admin API's switches for what a project keeps of conversations:
//! threads and memory notes, each off until switched on with a retention.
//! Decided through the [`Door`] like every tenancy change, so the log says
//! who switched what; the conversations themselves never enter it.

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::put;
use llmgw_api::admin as api;
use llmgw_domain::Command;
use llmgw_domain::conversations::{MemorySetting, ThreadsSetting};
use llmgw_domain::tenancy::TenancyCommand as T;

use crate::admin::Result;
use crate::door::Door;
use crate::tenancy_api::{TenancyState, bad, change, origin};

pub(crate) fn routes() -> Router<TenancyState> {
    Router::new()
        .route("/api/v1/projects/{project}/threads", put(set_threads))
        .route("/api/v1/projects/{project}/memory", put(set_memory))
}

fn retention(
    off: bool,
    hours: Option<u32>,
) -> std::result::Result<Option<u32>, crate::admin::AdminError> {
    match (off, hours) {
        (true, _) => Ok(None),
        (false, Some(h)) => Ok(Some(h)),
        (false, None) => Err(bad(
            "a retention is mandatory: give retain_hours (or off to switch it off)",
        )),
    }
}

async fn set_threads(
    State(door): State<Door>,
    headers: HeaderMap,
    Path(project): Path<String>,
    Json(s): Json<api::SetThreads>,
) -> Result<api::Changed> {
    let setting = retention(s.off, s.retain_hours)?.map(|retain_hours| ThreadsSetting {
        capture: s.capture,
        retain_hours,
    });
    let done = match &setting {
        Some(t) => format!(
            "project {project} keeps threads for {} h after their last write{}",
            t.retain_hours,
            if t.capture {
                ", with the model's replies"
            } else {
                ""
            }
        ),
        None => format!("project {project} keeps no threads; the next sweep deletes them"),
    };
    let c = T::SetThreads {
        project_id: project,
        setting,
        by: origin(&headers).actor.name().to_owned(),
    };
    change(&door, &headers, vec![Command::Tenancy(c)], &done).await
}

async fn set_memory(
    State(door): State<Door>,
    headers: HeaderMap,
    Path(project): Path<String>,
    Json(s): Json<api::SetMemory>,
) -> Result<api::Changed> {
    let setting =
        retention(s.off, s.retain_hours)?.map(|retain_hours| MemorySetting { retain_hours });
    let done = match &setting {
        Some(m) => format!(
            "project {project} keeps memory notes for {} h after their last write",
            m.retain_hours
        ),
        None => format!("project {project} keeps no memory notes; the next sweep deletes them"),
    };
    let c = T::SetMemory {
        project_id: project,
        setting,
        by: origin(&headers).actor.name().to_owned(),
    };
    change(&door, &headers, vec![Command::Tenancy(c)], &done).await
}
