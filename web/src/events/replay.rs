//! A view as it stood at a position or a time: the CLI's `events replay`,
//! as a page (`/admin/events/replay?view=…&until=…`).
//!
//! A time stands for everything recorded up to it: the replay stops at the
//! first event recorded after it, as the CLI's does. The fold starts from
//! the server's own views when they are not past the point (rebuilding
//! from position 0 gives exactly the views followed live, an invariant of
//! the projections), so a recent point costs only the events since; an
//! older one replays from the start.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use llmgw_eventstore::{AnyStore, EventStore};
use llmgw_projections::{Projections, VIEW_NAMES};
use serde::Deserialize;

use super::query::{Bound, parse_time};
use super::row::time_text;
use crate::{Chrome, Viewer, Web, WebError};

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ReplayParams {
    view: Option<String>,
    until: Option<String>,
}

/// Where the replay stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    Head,
    Position(u64),
    Time(DateTime<Utc>),
}

impl Until {
    fn parse(text: Option<&str>) -> Result<Until, WebError> {
        let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
            return Ok(Until::Head);
        };
        if let Ok(p) = text.parse::<u64>() {
            return Ok(Until::Position(p));
        }
        parse_time(text, Bound::Start)
            .map(Until::Time)
            .map_err(|_| {
                WebError::Bad(format!(
                    "until={text:?} is neither a position nor a time \
                     (2026-12-01T10:00:00Z, or a date for the start of that day)"
                ))
            })
    }
}

/// The replayed view, for showing.
struct Replayed {
    view: String,
    position: u64,
    recorded_at: Option<String>,
    json: String,
    applied: u64,
    skipped: u64,
    from_views: bool,
    millis: u128,
}

#[derive(askama::Template)]
#[template(path = "events/replay.html")]
struct ReplayPage {
    chrome: Chrome,
    views: Vec<&'static str>,
    view: String,
    until: String,
    head: u64,
    error: Option<String>,
    replayed: Option<Replayed>,
}

/// `GET /admin/events/replay`.
pub(crate) async fn page(
    State(web): State<Arc<Web>>,
    viewer: Viewer,
    params: Result<Query<ReplayParams>, QueryRejection>,
) -> Result<Response, WebError> {
    let chrome = Chrome::for_viewer(&web, &viewer);
    let Some(store) = &web.store else {
        return super::no_log(chrome);
    };
    let params = params.map(|Query(p)| p).unwrap_or_default();
    let (head, _) = store.head().await.map_err(super::internal)?;
    let view = params.view.as_deref().map(str::trim).unwrap_or_default();
    let mut page = ReplayPage {
        chrome,
        views: VIEW_NAMES.to_vec(),
        view: view.to_owned(),
        until: params.until.clone().unwrap_or_default(),
        head,
        error: None,
        replayed: None,
    };
    // No view asked for yet: the form alone.
    if view.is_empty() {
        return super::render_status(StatusCode::OK, &page);
    }
    let checked = if VIEW_NAMES.contains(&view) {
        Until::parse(params.until.as_deref())
    } else {
        Err(WebError::Bad(format!(
            "there is no view {view:?}; the views are {}",
            VIEW_NAMES.join(", ")
        )))
    };
    let until = match checked {
        Ok(u) => u,
        Err(WebError::Bad(why)) => {
            page.error = Some(why);
            return super::render_status(StatusCode::UNPROCESSABLE_ENTITY, &page);
        }
        Err(e) => return Err(e),
    };
    let stop = resolve(store, until, head).await?;
    page.replayed = Some(replay(&web, store, view, stop).await?);
    super::render_status(StatusCode::OK, &page)
}

/// The last position the replay includes.
async fn resolve(store: &AnyStore, until: Until, head: u64) -> Result<u64, WebError> {
    Ok(match until {
        Until::Head => head,
        Until::Position(p) => p.min(head),
        Until::Time(t) => llmgw_projections::position_at(store, t)
            .await
            .map_err(super::internal)?
            .min(head),
    })
}

async fn replay(web: &Web, store: &AnyStore, view: &str, stop: u64) -> Result<Replayed, WebError> {
    // One replay at a time: each may hold a whole set of views in memory.
    static ONE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
    let _permit = ONE
        .acquire()
        .await
        .map_err(|e| WebError::Internal(e.to_string()))?;
    let started = Instant::now();
    let live = {
        let views = web.views();
        (views.checkpoint.position <= stop).then(|| views.clone())
    };
    let from_views = live.is_some();
    let mut p = live.unwrap_or_else(Projections::default);
    let skipped_before = p.skipped;
    let start = p.checkpoint.position;
    let mut recorded_at = llmgw_projections::replay_to(store, &mut p, stop)
        .await
        .map_err(super::internal)?;
    if recorded_at.is_none() && p.checkpoint.position > 0 {
        recorded_at = store
            .event_at(p.checkpoint.position)
            .await
            .map_err(super::internal)?
            .map(|e| e.recorded_at);
    }
    let value = p
        .view_json(view)
        .ok_or_else(|| WebError::Internal(format!("no view {view}")))?;
    let json = serde_json::to_string_pretty(&value)
        .map_err(|e| WebError::Internal(format!("showing the {view} view: {e}")))?;
    Ok(Replayed {
        view: view.to_owned(),
        position: p.checkpoint.position,
        recorded_at: recorded_at.as_ref().map(time_text),
        json,
        applied: p.checkpoint.position - start,
        skipped: p.skipped - skipped_before,
        from_views,
        millis: started.elapsed().as_millis(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_is_the_head_a_position_or_a_time() {
        assert_eq!(Until::parse(None).expect("head"), Until::Head);
        assert_eq!(Until::parse(Some(" ")).expect("head"), Until::Head);
        assert_eq!(Until::parse(Some("42")).expect("42"), Until::Position(42));
        assert!(matches!(
            Until::parse(Some("2026-12-01T10:00:00Z")),
            Ok(Until::Time(_))
        ));
        assert!(matches!(
            Until::parse(Some("last tuesday")),
            Err(WebError::Bad(why)) if why.contains("neither a position nor a time")
        ));
    }
}
