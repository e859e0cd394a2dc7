//! The admin dashboard: the cluster (nodes, GPUs, replicas, models and why
//! a model is not placed), the tenancy groups with their limits and spend,
//! and usage per key, person and model (`/admin`),
//! the people and their approval (`/admin/users`), and usage over time as
//! charts (`/admin/usage`). The event-log browser is `crate::events`.
//!
//! Every page reads the views in memory and renders one page of each long
//! list, so that 10,000 keys cost a sort, not 10,000 rows of markup.

pub(crate) mod chart;
mod cluster;
mod dashboard;
pub(crate) mod fmt;
mod groups;
#[cfg(test)]
mod page_tests;
pub(crate) mod spend;
mod usage;
mod users;

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::{Viewer, Web};

pub(crate) fn routes() -> Router<Arc<Web>> {
    Router::new()
        .route("/admin", get(dashboard::page))
        .route("/admin/users", get(users::page))
        .route("/admin/users/{id}/approve", post(users::approve))
        .route("/admin/users/{id}/suspend", post(users::suspend))
        .route("/admin/usage", get(usage::page))
        .route("/admin/usage.csv", get(usage::csv))
        .route("/static/admin.css", get(css))
}

async fn css() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        include_str!("../../static/admin.css"),
    )
        .into_response()
}

/// Who reads the admin API on a page's behalf: the admin, or the host's
/// shell on the admin listener (an audit label; reads record nothing).
fn reader(viewer: &Viewer) -> &str {
    match viewer {
        Viewer::Admin(p) => &p.user_id,
        Viewer::Local => "admin-listener",
    }
}

/// A page number from the query (1-based); anything else is page 1.
fn page_number(raw: Option<&str>) -> usize {
    raw.and_then(|s| s.parse::<usize>().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// One page of a long list, with links to its neighbours.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pager {
    pub page: usize,
    pub pages: usize,
    pub total: usize,
    pub first: usize,
    pub last: usize,
    pub prev: Option<String>,
    pub next: Option<String>,
}

impl Pager {
    /// Page `page` of `total` items, `per_page` a page; `href(n)` links to
    /// page n. A page past the end shows the last one.
    fn new(total: usize, per_page: usize, page: usize, href: impl Fn(usize) -> String) -> Pager {
        let pages = total.div_ceil(per_page).max(1);
        let page = page.clamp(1, pages);
        let first = (page - 1) * per_page;
        let last = (first + per_page).min(total);
        Pager {
            page,
            pages,
            total,
            first,
            last,
            prev: (page > 1).then(|| href(page - 1)),
            next: (page < pages).then(|| href(page + 1)),
        }
    }

    fn range(&self) -> std::ops::Range<usize> {
        self.first..self.last
    }

    /// Whether there is more than one page (else the pager is not shown).
    pub fn several(&self) -> bool {
        self.pages > 1
    }

    /// The 1-based number of the first item shown, for "11–20 of 57".
    pub fn from(&self) -> usize {
        if self.total == 0 { 0 } else { self.first + 1 }
    }
}

/// A path segment as it may appear in a URL (ids are plain, but a page
/// never trusts that).
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pager_clamps_and_links_its_neighbours() {
        let p = Pager::new(57, 10, 3, |n| format!("?page={n}"));
        assert_eq!((p.range(), p.pages), (20..30, 6));
        assert_eq!(p.prev.as_deref(), Some("?page=2"));
        assert_eq!(p.next.as_deref(), Some("?page=4"));
        let last = Pager::new(57, 10, 99, |n| n.to_string());
        assert_eq!((last.page, last.range(), last.next), (6, 50..57, None));
        let empty = Pager::new(0, 10, 1, |n| n.to_string());
        assert_eq!(
            (empty.range(), empty.from(), empty.several()),
            (0..0, 0, false)
        );
    }

    #[test]
    fn page_numbers_and_segments_are_read_defensively() {
        assert_eq!(page_number(Some("4")), 4);
        assert_eq!(page_number(Some("0")), 1);
        assert_eq!(page_number(Some("-2")), 1);
        assert_eq!(page_number(None), 1);
        assert_eq!(segment("u-1.a_b"), "u-1.a_b");
        assert_eq!(segment("a/../b?x"), "a%2F..%2Fb%3Fx");
    }
}
