//! Who is looking. A browser session is a random token in an HttpOnly,
//! SameSite=Lax cookie (only its hash is stored, by `llmgw-people`);
//! the CSRF token its forms carry sits in a second such cookie, so a
//! server-rendered form can include it and a post can prove it came from
//! one of our pages. Lax, not Strict: a link from an email or a wiki to
//! `/admin/users` or `/chat` must open signed in (Strict leaves the cookie
//! off that first navigation); no GET changes anything, and every post
//! checks its CSRF token, which another site cannot read. A session counts only while its person is active in
//! the log, so a suspension takes effect even before its sessions are
//! closed.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use llmgw_domain::tenancy::UserStatus;
use llmgw_people::PeopleError;

use crate::{Web, WebError};

pub(crate) const SESSION_COOKIE: &str = "llmgw_session";
pub(crate) const CSRF_COOKIE: &str = "llmgw_csrf";

/// A signed-in, active person.
#[derive(Debug, Clone)]
pub(crate) struct Person {
    pub user_id: String,
    pub admin: bool,
    /// This session's CSRF token (from its cookie, checked against the
    /// session); empty when the cookie is missing or foreign.
    pub csrf: String,
    /// The session itself, for checking a submitted token.
    pub session: llmgw_people::Session,
    /// The cookie's token, for signing out this browser.
    pub token: String,
}

impl Person {
    /// Whether a submitted form token is this session's.
    pub(crate) fn check_csrf(&self, submitted: &str) -> Result<(), WebError> {
        if self.session.csrf_ok(submitted) {
            Ok(())
        } else {
            Err(WebError::Csrf)
        }
    }
}

/// Who is on a client-listener page.
#[derive(Debug, Clone)]
pub(crate) enum Visitor {
    Person(Person),
    Anonymous,
}

impl Visitor {
    /// The signed-in person, or a redirect to `/login`.
    pub(crate) fn person(&self) -> Result<&Person, WebError> {
        match self {
            Visitor::Person(p) => Ok(p),
            Visitor::Anonymous => Err(WebError::SignIn),
        }
    }
}

/// A cookie's name as this server sets it: behind TLS with the `__Host-`
/// prefix, which a browser accepts only from this very host over HTTPS
/// (Secure, `Path=/`, no `Domain`), so a sibling subdomain or a plain-HTTP
/// page cannot plant one (a planted pre-sign-in token would let another
/// site forge our sign-in form). Plain HTTP cannot carry the prefix.
pub(crate) fn cookie_name(web: &Web, name: &str) -> String {
    if web.settings.secure_cookies {
        format!("__Host-{name}")
    } else {
        name.to_owned()
    }
}

/// One of our cookies' value from the request's `Cookie` headers.
pub(crate) fn cookie<'a>(web: &Web, headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    find_cookie(headers, &cookie_name(web, name))
}

/// A cookie's value by its exact name.
fn find_cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
}

/// A `Set-Cookie` value for one of our cookies; `None` clears it.
/// `SameSite=Lax` for the reason in the module's comment.
pub(crate) fn set_cookie(web: &Web, name: &str, value: Option<&str>) -> String {
    let secure = if web.settings.secure_cookies {
        "; Secure"
    } else {
        ""
    };
    let name = cookie_name(web, name);
    match value {
        Some(v) => format!("{name}={v}; Path=/; HttpOnly; SameSite=Lax{secure}"),
        None => format!("{name}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0{secure}"),
    }
}

/// The person behind the request's session cookie, if any and active;
/// `StoreDown` when the account store cannot say. An outage answered as
/// "signed out" sent people to `/login` with nothing logged, where signing
/// in failed too, while their sessions were intact all along.
pub(crate) async fn resolve(web: &Web, headers: &HeaderMap) -> Result<Visitor, WebError> {
    let (Some(people), Some(token)) = (&web.people, cookie(web, headers, SESSION_COOKIE)) else {
        return Ok(Visitor::Anonymous);
    };
    let session = match people.resolve(token, Utc::now()).await {
        Ok(session) => session,
        Err(PeopleError::Store(why)) => {
            return Err(WebError::StoreDown(format!("reading a session: {why}")));
        }
        Err(_) => return Ok(Visitor::Anonymous),
    };
    let admin = {
        let views = web.views();
        match views.tenancy.tenancy.users.get(&session.user_id) {
            Some(u) if u.status == UserStatus::Active => u.admin,
            _ => return Ok(Visitor::Anonymous),
        }
    };
    let csrf = cookie(web, headers, CSRF_COOKIE)
        .filter(|c| session.csrf_ok(c))
        .unwrap_or_default()
        .to_owned();
    Ok(Visitor::Person(Person {
        user_id: session.user_id.clone(),
        admin,
        csrf,
        session,
        token: token.to_owned(),
    }))
}

impl FromRequestParts<Arc<Web>> for Visitor {
    type Rejection = WebError;

    async fn from_request_parts(
        parts: &mut Parts,
        web: &Arc<Web>,
    ) -> Result<Self, Self::Rejection> {
        if let Some(v) = parts.extensions.get::<Visitor>() {
            return Ok(v.clone());
        }
        resolve(web, &parts.headers).await
    }
}

/// Who is on an `/admin/…` page: a signed-in admin (client listener) or
/// the host's shell (admin listener, read-only).
#[derive(Debug, Clone)]
pub(crate) enum Viewer {
    Admin(Person),
    Local,
}

impl Viewer {
    /// The admin allowed to act from a page; the admin listener only
    /// shows (steering stays with the CLI there).
    pub(crate) fn actor(&self) -> Result<&Person, WebError> {
        match self {
            Viewer::Admin(p) => Ok(p),
            Viewer::Local => Err(WebError::NotFound),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Viewer {
    type Rejection = WebError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Viewer>()
            .cloned()
            .ok_or(WebError::NotFound)
    }
}

/// The client listener's gate in front of `/admin/…`: a signed-in admin
/// passes; anyone else gets the same 404 as for a page that does not
/// exist.
pub(crate) async fn admins_only(
    State(web): State<Arc<Web>>,
    mut request: Request,
    next: Next,
) -> Response {
    match resolve(&web, request.headers()).await {
        Ok(Visitor::Person(p)) if p.admin => {
            request.extensions_mut().insert(Viewer::Admin(p));
            next.run(request).await
        }
        Ok(_) => WebError::NotFound.into_response(),
        // Only a request with a session cookie gets here: it cannot be
        // told whether an admin sent it.
        Err(e) => e.into_response(),
    }
}

/// The admin listener: everyone there is the host's shell.
pub(crate) async fn local_viewer(mut request: Request, next: Next) -> Response {
    request.extensions_mut().insert(Viewer::Local);
    next.run(request).await
}
