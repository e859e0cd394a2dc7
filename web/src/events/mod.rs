//! The auditor's page, `/admin/events`: the log newest first with filters
//! (type, stream, actor, time), one thing's history (a node, model, key or
//! person: who did what, when), the hash chain's verification, and any
//! view as it stood at a chosen position or time.
//!
//! Everything here reads: the log through the store, the present through
//! the server's views. On a server that keeps no log the pages say so.

mod log;
mod query;
mod replay;
mod row;
mod thing;
mod verify;

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

use crate::{Chrome, Web, WebError};

pub(crate) fn routes() -> Router<Arc<Web>> {
    Router::new()
        .route("/admin/events", get(log::page))
        .route("/admin/events/verify", get(verify::page))
        .route("/admin/events/replay", get(replay::page))
        .route("/static/events.css", get(style))
}

/// The page's own styles (the layout's stylesheet is shared and not ours).
async fn style() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        include_str!("../../static/events.css"),
    )
        .into_response()
}

#[derive(askama::Template)]
#[template(path = "events/no_log.html")]
struct NoLog {
    chrome: Chrome,
}

/// Every events page on a server without a log.
fn no_log(chrome: Chrome) -> Result<Response, WebError> {
    render_status(StatusCode::OK, &NoLog { chrome })
}

/// A page with a status of our choosing (a refused filter is shown on the
/// page itself, with the form to correct it).
fn render_status(status: StatusCode, t: &impl askama::Template) -> Result<Response, WebError> {
    t.render()
        .map(|html| (status, Html(html)).into_response())
        .map_err(|e| WebError::Internal(format!("rendering a page: {e}")))
}

fn internal(e: llmgw_eventstore::StoreError) -> WebError {
    WebError::Internal(format!("reading the log: {e}"))
}

#[cfg(test)]
mod tests;
