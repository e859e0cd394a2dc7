//! The pages people see on the client listener: how to connect (`/`),
//! sign-in and sign-up, the profile (keys, password, and the person's own
//! usage and limits), claim links and chat.
//!
//! A person's facts (signed up, changed a password, claimed a key) are
//! observed through the decider; keys are made and revoked by asking the
//! admin API in-process on the person's behalf, so those decisions take
//! the operators' path.

mod account;
mod chat;
mod claim;
mod contact;
mod landing;
mod pre;
mod profile;
#[cfg(test)]
mod tests;
mod usage;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use axum::routing::{get, post};
use llmgw_decider::{Actor, Origin};
use llmgw_domain::Event;
use llmgw_people::People;

use crate::{Web, WebError};

pub(crate) fn routes() -> Router<Arc<Web>> {
    Router::new()
        .route("/", get(landing::page))
        .route("/login", get(account::login_form).post(account::login))
        .route("/logout", get(account::logout_page).post(account::logout))
        .route("/signup", get(account::signup_form).post(account::signup))
        .route("/profile", get(profile::page))
        .route("/profile/usage", get(usage::page))
        .route("/profile/keys", post(profile::create_key))
        .route("/profile/keys/{key_id}/revoke", post(profile::revoke_key))
        .route("/profile/password", post(profile::change_password))
        .route("/claim/{token}", get(claim::page).post(claim::reveal))
        .route("/chat", get(chat::page))
        .route("/chat/completions", post(chat::completions))
        .route("/static/chat.js", get(chat::script))
        .route("/static/pages.css", get(chat::style))
        .method_not_allowed_fallback(crate::error::wrong_method)
}

/// The people tables, when this server has accounts; otherwise the pages
/// that need them do not exist.
fn people(web: &Web) -> Result<&Arc<People>, WebError> {
    match &web.people {
        Some(p) if web.settings.accounts => Ok(p),
        _ => Err(WebError::NotFound),
    }
}

/// The address clients use: the configured one, else this request's
/// `Host` (https when cookies are marked Secure, i.e. behind TLS).
fn base_url(web: &Web, headers: &HeaderMap) -> String {
    if let Some(url) = web.settings.base_url.as_deref().filter(|u| !u.is_empty()) {
        return url.trim_end_matches('/').to_owned();
    }
    let scheme = if web.settings.secure_cookies {
        "https"
    } else {
        "http"
    };
    // The Host header is the client's to write: only a plain host[:port]
    // goes into the examples people copy.
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        })
        .unwrap_or("localhost");
    format!("{scheme}://{host}")
}

/// A curl that calls chat completions at `base` with `model`; `key` is
/// what goes after `Bearer` (a real secret, or a variable), none when the
/// server needs no key.
fn curl_example(base: &str, key: Option<&str>, model: &str) -> String {
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Hello!"}],
    });
    let mut lines = vec![format!(
        "curl {}",
        shell_quote(&format!("{base}/v1/chat/completions"))
    )];
    if let Some(key) = key {
        lines.push(format!("-H \"Authorization: Bearer {key}\""));
    }
    lines.push("-H 'content-type: application/json'".to_owned());
    lines.push(format!("-d {}", shell_quote(&body.to_string())));
    lines.join(" \\\n  ")
}

/// `s` as one shell word, single-quoted when it needs to be.
fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Percent-encodes `s` for one path segment or query value.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `page` when it is an address on this site (one `/`, then no second
/// `/` or `\`, nothing but printable ASCII), so that a sign-in never
/// sends anyone to another site (`//evil.example`, `https://…`).
pub(crate) fn local_path(page: &str) -> Option<&str> {
    let rest = page.strip_prefix('/')?;
    let local = !rest.starts_with('/')
        && !page.contains('\\')
        && page.len() <= 2048
        && page.bytes().all(|b| b.is_ascii_graphic());
    local.then_some(page)
}

/// The sign-in page that returns to `page` afterwards (plain `/login`
/// where it would return to the profile anyway, or to itself).
pub(crate) fn login_to_return(page: &str) -> String {
    if page == "/profile" || page.starts_with("/login") {
        "/login".to_owned()
    } else {
        format!("/login?next={}", encode(page))
    }
}

/// Appends `Set-Cookie` values to a response.
fn with_cookies(mut response: Response, cookies: &[String]) -> Result<Response, WebError> {
    for c in cookies {
        let value = HeaderValue::from_str(c)
            .map_err(|e| WebError::Internal(format!("a cookie header: {e}")))?;
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    Ok(response)
}

/// A page response with another status.
fn with_status(mut response: Response, status: axum::http::StatusCode) -> Response {
    *response.status_mut() = status;
    response
}

/// A 303 to `to`.
fn see_other(to: &str) -> Response {
    use axum::response::IntoResponse;
    (
        axum::http::StatusCode::SEE_OTHER,
        [(header::LOCATION, to.to_owned())],
    )
        .into_response()
}

/// Appends a person's fact to the log (an observation: no lease needed).
async fn observe(web: &Web, actor: Actor, event: Event) -> Result<(), String> {
    let decider = web
        .decider
        .as_ref()
        .ok_or_else(|| "this server keeps no log".to_owned())?;
    decider
        .observe(&Origin::new(actor), vec![event])
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}
