//! The pages, server-rendered: how to connect, sign-in and sign-up, the
//! profile (keys, password), claim links, chat, and the admin dashboard
//! with the event-log browser. SCAFFOLD: modules are being written.
//!
//! The pages never write the log themselves: a person's facts (signed up,
//! changed a password) are observed through the decider, and everything
//! decided (approve, suspend, a key made or revoked) is a request to the
//! admin API, served in-process, so that a standby forwards it to the
//! leader like any operator's command.

use std::sync::{Arc, RwLock};

use llmgw_eventstore::AnyStore;
use llmgw_people::People;
use llmgw_projections::Projections;

/// What the pages say and allow, from `landing:` and `auth:`.
#[derive(Debug, Clone, Default)]
pub struct WebSettings {
    /// People can sign in (auth is on).
    pub accounts: bool,
    /// `auth.signup_open`.
    pub signup_open: bool,
    /// `landing.contact`: an email, an http(s) address, or plain text.
    pub contact: Option<String>,
    /// `landing.notice`: a line shown on `/`.
    pub notice: Option<String>,
    /// Cookies get `Secure` (served over TLS, or behind a TLS proxy).
    pub secure_cookies: bool,
    /// The base URL clients use, when configured (else from `Host`).
    pub base_url: Option<String>,
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
    pub admin: axum::Router,
    /// Appends a person's facts (signed up, changed a password, claimed a
    /// key) as observations; None when the server keeps no log.
    pub decider: Option<llmgw_decider::Decider>,
    /// This server's name, as it appears in what it appends.
    pub instance: String,
}
