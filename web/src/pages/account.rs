//! Signing in and out, and signing up.

use std::sync::Arc;

use axum::Form;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::Utc;
use llmgw_decider::Actor;
use llmgw_domain::Event;
use llmgw_domain::tenancy::TenancyEvent;
use llmgw_people::PeopleError;
use serde::Deserialize;

use super::{pre, see_other, with_cookies, with_status};
use crate::session::{CSRF_COOKIE, SESSION_COOKIE, set_cookie};
use crate::{Chrome, Visitor, Web, WebError, render};

#[derive(Debug, askama::Template)]
#[template(path = "pages/login.html")]
struct Login {
    chrome: Chrome,
    pre: String,
    email: String,
    error: Option<String>,
    /// The page to return to after signing in (empty: the profile).
    next: String,
}

#[derive(Debug, askama::Template)]
#[template(path = "pages/signup.html")]
struct Signup {
    chrome: Chrome,
    pre: String,
    email: String,
    name: String,
    error: Option<String>,
}

#[derive(Debug, askama::Template)]
#[template(path = "pages/logout.html")]
struct Logout {
    chrome: Chrome,
}

#[derive(Debug, askama::Template)]
#[template(path = "pages/signup_done.html")]
struct SignupDone {
    chrome: Chrome,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct LoginForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    email: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    next: String,
}

/// `/login?next=…`: the page that sent the person to sign in.
#[derive(Debug, Default, Deserialize)]
pub(super) struct NextQuery {
    #[serde(default)]
    next: String,
}

/// Where a sign-in leads: back to the page that asked for it when that is
/// an address on this site, else the profile (a link crafted elsewhere
/// cannot send a person on to another site).
fn return_to(next: &str) -> &str {
    super::local_path(next).unwrap_or("/profile")
}

/// What the form carries on: only a page the sign-in would return to.
fn kept(next: &str) -> String {
    super::local_path(next).unwrap_or_default().to_owned()
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct SignupForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    email: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    password: String,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct CsrfForm {
    #[serde(default)]
    pub(super) csrf: String,
}

/// A form page with the pre-session token it carries set as a cookie.
fn form_page(
    web: &Web,
    page: &impl askama::Template,
    token: &str,
    status: StatusCode,
) -> Result<Response, WebError> {
    let response = with_status(render(page)?, status);
    with_cookies(response, &[pre::set(web, token)])
}

/// A form page refusing `e`: its status, and when a refusal of the
/// server's state ends, that in `Retry-After`.
fn refusal_page(
    web: &Web,
    page: &impl askama::Template,
    token: &str,
    e: &PeopleError,
) -> Result<Response, WebError> {
    let mut response = form_page(web, page, token, refused(e))?;
    if let Some(seconds) = retry_after(e) {
        response
            .headers_mut()
            .insert(axum::http::header::RETRY_AFTER, seconds.into());
    }
    Ok(response)
}

pub(super) async fn login_form(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
    headers: HeaderMap,
    query: Result<Query<NextQuery>, QueryRejection>,
) -> Result<Response, WebError> {
    super::people(&web)?;
    let next = query.map(|q| q.0.next).unwrap_or_default();
    if let Visitor::Person(_) = visitor {
        return Ok(see_other(return_to(&next)));
    }
    let token = pre::token(&web, &headers)?;
    let page = Login {
        chrome: Chrome::for_visitor(&web, &visitor),
        pre: token.clone(),
        email: String::new(),
        error: None,
        next: kept(&next),
    };
    form_page(&web, &page, &token, StatusCode::OK)
}

pub(super) async fn login(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response, WebError> {
    let people = super::people(&web)?;
    pre::check(&web, &headers, &form.csrf)?;
    let status = |user_id: &str| {
        web.views()
            .tenancy
            .tenancy
            .users
            .get(user_id)
            .map(|u| u.status)
    };
    match people
        .sign_in(&form.email, &form.password, status, Utc::now())
        .await
    {
        Ok(opened) => {
            let cookies = [
                set_cookie(&web, SESSION_COOKIE, Some(&opened.token)),
                set_cookie(&web, CSRF_COOKIE, Some(&opened.csrf)),
                pre::clear(&web),
            ];
            with_cookies(see_other(return_to(&form.next)), &cookies)
        }
        Err(e @ PeopleError::Store(_)) => Err(WebError::people("signing in", e)),
        // The people errors are written for the person at the form.
        Err(e) => {
            let page = Login {
                chrome: Chrome::for_visitor(&web, &visitor),
                pre: form.csrf.clone(),
                email: form.email,
                error: Some(e.to_string()),
                next: kept(&form.next),
            };
            refusal_page(&web, &page, &form.csrf, &e)
        }
    }
}

/// `GET /logout` (a typed address, a bookmark): a button that signs out,
/// since a visit must not sign anyone out by itself (a link elsewhere could
/// do it); someone signed out has nothing to do here.
pub(super) async fn logout_page(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
) -> Result<Response, WebError> {
    match &visitor {
        Visitor::Person(_) => render(&Logout {
            chrome: Chrome::for_visitor(&web, &visitor),
        }),
        Visitor::Anonymous => Ok(see_other("/")),
    }
}

pub(super) async fn logout(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
    Form(form): Form<CsrfForm>,
) -> Result<Response, WebError> {
    let people = super::people(&web)?;
    if let Visitor::Person(person) = &visitor {
        person.check_csrf(&form.csrf)?;
        people
            .sign_out(&person.token)
            .await
            .map_err(|e| WebError::people("signing out", e))?;
    }
    let cookies = [
        set_cookie(&web, SESSION_COOKIE, None),
        set_cookie(&web, CSRF_COOKIE, None),
    ];
    with_cookies(see_other("/"), &cookies)
}

/// A form's refusal: the person's mistake, too many tries (429: the
/// lockout answered 422, as if the password were wrong), or the server's
/// state (try again later).
fn refused(e: &PeopleError) -> StatusCode {
    match e {
        PeopleError::TooManyTries { .. } => StatusCode::TOO_MANY_REQUESTS,
        PeopleError::Busy | PeopleError::TooManyPending => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    }
}

/// How long the password checks' queue is given to drain before a retry:
/// it holds eight checks a core, each a fraction of a second.
const BUSY_RETRY_S: u64 = 5;

/// When a retry may succeed, in seconds: the lockout's end, or a moment
/// for a busy server. Sign-up paused for pending accounts ends when an
/// operator approves some, which no one can say.
fn retry_after(e: &PeopleError) -> Option<u64> {
    match e {
        PeopleError::TooManyTries { seconds, .. } => Some(*seconds),
        PeopleError::Busy => Some(BUSY_RETRY_S),
        _ => None,
    }
}

/// Sign-up exists only when accounts do and sign-up is open.
fn signup_open(web: &Web) -> Result<&Arc<llmgw_people::People>, WebError> {
    let people = super::people(web)?;
    if web.settings.signup_open {
        Ok(people)
    } else {
        Err(WebError::NotFound)
    }
}

pub(super) async fn signup_form(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
    headers: HeaderMap,
) -> Result<Response, WebError> {
    signup_open(&web)?;
    let token = pre::token(&web, &headers)?;
    let page = Signup {
        chrome: Chrome::for_visitor(&web, &visitor),
        pre: token.clone(),
        email: String::new(),
        name: String::new(),
        error: None,
    };
    form_page(&web, &page, &token, StatusCode::OK)
}

pub(super) async fn signup(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
    headers: HeaderMap,
    Form(form): Form<SignupForm>,
) -> Result<Response, WebError> {
    let people = signup_open(&web)?;
    pre::check(&web, &headers, &form.csrf)?;
    let chrome = Chrome::for_visitor(&web, &visitor);
    let pending = (web.views().tenancy.tenancy.users.values())
        .filter(|u| u.status == llmgw_domain::tenancy::UserStatus::Pending)
        .count();
    let outcome = if web
        .settings
        .signup_pending_max
        .is_some_and(|max| pending >= max)
    {
        Err(PeopleError::TooManyPending)
    } else {
        people
            .sign_up(&form.email, &form.name, &form.password, Utc::now())
            .await
    };
    match outcome {
        Ok(Some(user_id)) => {
            let event = Event::Tenancy(TenancyEvent::UserSignedUp {
                user_id: user_id.clone(),
            });
            if let Err(why) = super::observe(&web, Actor::Person(user_id.clone()), event).await {
                // Without its fact in the log the account could never be
                // approved: take the personal data back out.
                if let Err(e) = people.erase(&user_id).await {
                    tracing::error!(user_id = %user_id, error = %e, "erasing a sign-up the log did not take");
                }
                return Err(WebError::Internal(format!("recording a sign-up: {why}")));
            }
            render(&SignupDone { chrome })
        }
        // A taken address gets the same answer as a new account, so the
        // form does not tell who has one.
        Ok(None) => render(&SignupDone { chrome }),
        Err(e @ PeopleError::Store(_)) => Err(WebError::people("signing up", e)),
        Err(e) => {
            let page = Signup {
                chrome,
                pre: form.csrf.clone(),
                email: form.email,
                name: form.name,
                error: Some(e.to_string()),
            };
            refusal_page(&web, &page, &form.csrf, &e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hashing queue full answered 503 with no word of when to come
    /// back; filling the real one would make every test beside this one
    /// busy, so the answer is built from the error.
    #[test]
    fn a_busy_refusal_says_when_to_retry() {
        let web = crate::pages::tests::harness::web(crate::WebSettings::default(), Vec::new());
        let page = Login {
            chrome: Chrome::default(),
            pre: "t".into(),
            email: String::new(),
            error: Some(PeopleError::Busy.to_string()),
            next: String::new(),
        };
        let response = refusal_page(&web, &page, "t", &PeopleError::Busy).expect("page");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            response.headers().get(axum::http::header::RETRY_AFTER),
            Some(&axum::http::HeaderValue::from(BUSY_RETRY_S))
        );
        let wrong = refusal_page(&web, &page, "t", &PeopleError::BadCredentials).expect("page");
        assert_eq!(wrong.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(
            wrong
                .headers()
                .get(axum::http::header::RETRY_AFTER)
                .is_none()
        );
    }
}
