//! The pages, server-rendered: how to connect, sign-in and sign-up, the
//! profile (keys, password), claim links, chat, and the admin dashboard
//! with the event-log browser.
//!
//! The pages never write the log themselves: a person's facts (signed up,
//! changed a password, claimed a key) are observed through the decider,
//! and everything decided (approve, suspend, a key made or revoked) is a
//! request to the admin API, served in-process, so that a standby forwards
//! it to the leader like any operator's command.
//!
//! Two doors: the client listener serves everyone's pages and `/admin/…`
//! to signed-in admins (404 to anyone else, so the pages' existence is not
//! revealed); the admin listener (loopback) serves the same admin pages
//! read-only without sign-in: shell access on the host is the credential.

mod admin;
mod admin_api;
mod chrome;
mod error;
mod events;
mod headers;
mod pages;
mod session;

use std::sync::{Arc, RwLock};

use axum::Router;
use llmgw_eventstore::AnyStore;
use llmgw_people::People;
use llmgw_projections::Projections;

pub(crate) use chrome::Chrome;
pub(crate) use error::{WebError, render};
pub(crate) use session::{Viewer, Visitor};

/// What the pages say and allow, from `landing:` and `auth:`.
#[derive(Debug, Clone, Default)]
pub struct WebSettings {
    /// People can sign in (auth is on).
    pub accounts: bool,
    /// `auth.signup_open`.
    pub signup_open: bool,
    /// `auth.signup_pending_max`: sign-up pauses at this many pending
    /// (None: no bound, as a page test may run).
    pub signup_pending_max: Option<usize>,
    /// `landing.contact`: an email, an http(s) address, or plain text.
    pub contact: Option<String>,
    /// `landing.notice`: a line shown on `/`.
    pub notice: Option<String>,
    /// Cookies get `Secure` (served over TLS, or behind a TLS proxy).
    pub secure_cookies: bool,
    /// `auth.flush_interval` where usage is recorded: how far behind the
    /// log's usage (the usage pages' figures) may be.
    pub usage_flush: Option<std::time::Duration>,
    /// The base URL clients use, when configured (else from `Host`).
    pub base_url: Option<String>,
    /// The control plane's placement ranges, so the dashboard explains a
    /// placement as `llmgw ctl explain-placement` does.
    pub place: llmgw_domain::placement::PlaceOptions,
    /// No control plane here: the dashboard shows the static endpoints
    /// that serve, and says that the cluster it reads from the log (if
    /// any) is as a control plane last left it, not live.
    pub router_only: bool,
}

/// Everything a page reads or asks for.
#[derive(Debug)]
pub struct Web {
    pub settings: WebSettings,
    /// The server's views (one set, shared with the gateway).
    pub views: Arc<RwLock<Projections>>,
    /// The log, for the event-log browser; None when the server keeps none.
    pub store: Option<AnyStore>,
    /// Accounts, sessions and claims; None when auth is off.
    pub people: Option<Arc<People>>,
    /// For chat (`llmgw_gateway::chat_as`) and the models a person may
    /// pick (`llmgw_gateway::model_cards`).
    pub gateway: Arc<llmgw_gateway::Gateway>,
    /// The admin API, served in-process (`tower::ServiceExt::oneshot`):
    /// approve, suspend, keys made and revoked on a person's behalf. On a
    /// standby it forwards to the leader like any operator's request.
    pub admin: Router,
    /// Appends a person's facts (signed up, changed a password, claimed a
    /// key) as observations; None when the server keeps no log.
    pub decider: Option<llmgw_decider::Decider>,
    /// This server's name, as it appears in what it appends.
    pub instance: String,
}

impl Web {
    /// The views, for reading (a poisoned lock still holds the last good
    /// state: views are replaced whole, never half-applied).
    pub(crate) fn views(&self) -> std::sync::RwLockReadGuard<'_, Projections> {
        self.views.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// The client listener's pages: `/`, sign-in, profile, claim, chat, and
/// `/admin/…` for signed-in admins.
pub fn client_routes(web: Arc<Web>) -> Router {
    let admin_pages = admin_pages().layer(axum::middleware::from_fn_with_state(
        web.clone(),
        session::admins_only,
    ));
    Router::new()
        .merge(statics())
        .merge(pages::routes())
        .merge(admin_pages)
        .layer(axum::middleware::from_fn_with_state(
            web.clone(),
            error::dressed,
        ))
        .layer(axum::middleware::from_fn(headers::secure))
        .with_state(web)
}

/// The admin listener's pages: the same `/admin/…`, read-only, no sign-in.
pub fn admin_routes(web: Arc<Web>) -> Router {
    Router::new()
        // The pages' "llmgw" link, and a person opening the address.
        .route(
            "/",
            axum::routing::get(|| async { axum::response::Redirect::to("/admin") }),
        )
        .merge(statics())
        .merge(admin_pages())
        .layer(axum::middleware::from_fn_with_state(
            web.clone(),
            error::dressed,
        ))
        .layer(axum::middleware::from_fn(session::local_viewer))
        .layer(axum::middleware::from_fn(headers::secure))
        .with_state(web)
}

/// Every `/admin/…` page; who may see it is the listener's concern.
fn admin_pages() -> Router<Arc<Web>> {
    // Set here, under the layers the listeners add: a 405 must not tell a
    // stranger that an `/admin/…` address exists.
    admin::routes()
        .merge(events::routes())
        .method_not_allowed_fallback(error::wrong_method)
}

fn statics() -> Router<Arc<Web>> {
    Router::new().route("/static/style.css", axum::routing::get(headers::style))
}
