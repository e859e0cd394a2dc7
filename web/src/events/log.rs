//! `/admin/events`: the log newest first, filtered, paged by position; or
//! one thing's history (`?thing=node:N`); with the chain's last
//! verification.
//!
//! Paging is by position (`?before=P`: the events below P), never by
//! offset, so a deep page costs what the first does. A filter on type,
//! stream prefix, actor or time is checked row by row walking down the
//! log, so one page searches at most [`WINDOW`] positions: a rare filter
//! answers quickly with what it found there and a link to search further
//! back, instead of reading the whole log for one page. Exact streams (a
//! thing's history, `stream=`) are read through the streams' index and
//! need no window.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use llmgw_eventstore::{AnyStore, EventStore};

use super::query::{LogParams, LogQuery};
use super::row::Row;
use super::thing::Thing;
use super::verify::{Verified, last_result};
use crate::{Chrome, Viewer, Web, WebError};

/// Rows on a page.
pub(crate) const PAGE: usize = 50;

/// The most positions one page of a row-by-row filter searches.
pub(crate) const WINDOW: u64 = 100_000;

#[derive(askama::Template)]
#[template(path = "events/log.html")]
struct LogPage {
    chrome: Chrome,
    q: LogParams,
    error: Option<String>,
    head: u64,
    /// The thing whose history this is, and the streams read for it.
    thing: Option<String>,
    thing_streams: Vec<String>,
    /// For a key: its usage records, as a stream filter.
    usage_link: Option<String>,
    rows: Vec<Row>,
    /// What this page searched, when a window bounded it.
    searched: Option<Searched>,
    older: Option<String>,
    newest: Option<String>,
    verified: Option<Verified>,
}

/// The positions a row-by-row filter searched for this page.
struct Searched {
    from: u64,
    to: u64,
}

/// `GET /admin/events`.
pub(crate) async fn page(
    State(web): State<Arc<Web>>,
    viewer: Viewer,
    params: Result<Query<LogParams>, QueryRejection>,
) -> Result<Response, WebError> {
    let chrome = Chrome::for_viewer(&web, &viewer);
    let Some(store) = &web.store else {
        return super::no_log(chrome);
    };
    let (head, _) = store.head().await.map_err(super::internal)?;
    let mut page = LogPage {
        chrome,
        q: LogParams::default(),
        error: None,
        head,
        thing: None,
        thing_streams: Vec::new(),
        usage_link: None,
        rows: Vec::new(),
        searched: None,
        older: None,
        newest: None,
        verified: last_result(store),
    };
    let query = params
        .map_err(|e| WebError::Bad(e.body_text()))
        .and_then(|Query(p)| {
            page.q = p.clone();
            LogQuery::parse(p)
        });
    let query = match query {
        Ok(q) => q,
        Err(WebError::Bad(why)) => {
            page.error = Some(why);
            return super::render_status(StatusCode::UNPROCESSABLE_ENTITY, &page);
        }
        Err(e) => return Err(e),
    };
    page.q = query.params.clone();
    fill(&web, store, &query, &mut page).await?;
    super::render_status(StatusCode::OK, &page)
}

async fn fill(
    web: &Web,
    store: &AnyStore,
    query: &LogQuery,
    page: &mut LogPage,
) -> Result<(), WebError> {
    let streams = match &query.thing {
        Some(thing) => {
            page.thing = Some(thing.title());
            if let Thing::Key(id) = thing {
                page.usage_link = Some(super::query::query_string(&[(
                    "stream",
                    Some(&format!("usage-{id}")),
                )]));
            }
            let streams = thing.streams(&web.views());
            page.thing_streams = streams.clone();
            streams
        }
        None => Vec::new(),
    };
    // Below `before`, else everything: the first page reads to whatever
    // the head is by then.
    let end = page.head + 1;
    let top = query.before.map_or(u64::MAX, |b| b.min(end));
    if query.before.is_some() {
        page.newest = Some(query.link(None));
    }
    let Some(filter) = query.filter(streams) else {
        return Ok(());
    };
    // Exact streams go through their index; anything else is a walk down
    // the log, bounded per page.
    let row_by_row = filter.streams.is_empty() && query.filtered();
    let bottom = if row_by_row {
        top.min(end).saturating_sub(WINDOW).max(1)
    } else {
        1
    };
    let events = store
        .read_backward_raw(&filter, bottom..top, PAGE)
        .await
        .map_err(super::internal)?;
    page.rows = events.iter().map(Row::of).collect();
    let next = match events.last() {
        Some(last) if events.len() == PAGE => Some(last.position),
        _ if bottom > 1 => Some(bottom),
        _ => None,
    };
    if row_by_row && events.len() < PAGE && top.min(end) > 1 {
        page.searched = Some(Searched {
            from: bottom,
            to: top.min(end) - 1,
        });
    }
    page.older = next.map(|b| query.link(Some(b)));
    Ok(())
}
