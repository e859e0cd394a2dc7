//! `/claim/{token}`: a claim link reveals its key once. The GET only asks
//! (link previews and prefetchers must not use the link up); the button
//! posts, guarded by the pre-session token like sign-in. The token is a
//! secret: it is never logged nor put in an error.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::Utc;
use llmgw_decider::Actor;
use llmgw_domain::Event;
use llmgw_domain::tenancy::TenancyEvent;
use llmgw_people::PeopleError;

use super::account::CsrfForm;
use super::{pre, with_cookies, with_status};
use crate::{Chrome, Visitor, Web, WebError, render};

#[derive(Debug, askama::Template)]
#[template(path = "pages/claim.html")]
struct Ask {
    chrome: Chrome,
    pre: String,
    /// The form posts back to this page's own address.
    action: String,
}

#[derive(Debug, askama::Template)]
#[template(path = "pages/claim_gone.html")]
struct Gone {
    chrome: Chrome,
}

#[derive(Debug, askama::Template)]
#[template(path = "pages/claimed.html")]
struct Revealed {
    chrome: Chrome,
    key_id: String,
    secret: String,
    base: String,
    curl: String,
}

/// Missing, expired and used links get this one answer.
fn gone(web: &Web, visitor: &Visitor) -> Result<Response, WebError> {
    let page = Gone {
        chrome: Chrome::for_visitor(web, visitor),
    };
    Ok(with_status(render(&page)?, StatusCode::NOT_FOUND))
}

pub(super) async fn page(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
    headers: HeaderMap,
    Path(token): Path<String>,
) -> Result<Response, WebError> {
    let people = super::people(&web)?;
    let open = people
        .claim_open(&token, Utc::now())
        .await
        .map_err(|e| failed("looking up a claim link", &e))?;
    if !open {
        return gone(&web, &visitor);
    }
    let pre_token = pre::token(&web, &headers)?;
    let page = Ask {
        chrome: Chrome::for_visitor(&web, &visitor),
        pre: pre_token.clone(),
        action: format!("/claim/{}", super::encode(&token)),
    };
    with_cookies(render(&page)?, &[pre::set(&web, &pre_token)])
}

pub(super) async fn reveal(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
    headers: HeaderMap,
    Path(token): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, WebError> {
    let people = super::people(&web)?;
    pre::check(&web, &headers, &form.csrf)?;
    let claimed = match people.claim(&token, Utc::now()).await {
        Ok(c) => c,
        Err(PeopleError::ClaimInvalid) => return gone(&web, &visitor),
        Err(e) => return Err(failed("claiming a key", &e)),
    };
    // A key revoked since the link was made is dead: its secret is not
    // shown, and the link (wiped by the take above) is used up.
    let revoked = web
        .views()
        .tenancy
        .tenancy
        .keys
        .get(&claimed.key_id)
        .is_some_and(|k| k.revoked);
    if revoked {
        tracing::warn!(key_id = %claimed.key_id, "a claim link for a revoked key was used; nothing shown");
        return gone(&web, &visitor);
    }
    let event = Event::Tenancy(TenancyEvent::KeyClaimed {
        key_id: claimed.key_id.clone(),
    });
    // Whoever holds the link: a signed-in person by their id, else only
    // "a claim link" (the key's history already says who it was made for).
    let by = match &visitor {
        Visitor::Person(p) => Actor::Person(p.user_id.clone()),
        Visitor::Anonymous => Actor::Visitor("claim-link".into()),
    };
    if let Err(why) = super::observe(&web, by, event).await {
        // The sealed copy is already wiped: this is the only chance to
        // show the key, so show it; only the log's note is missing.
        tracing::error!(key_id = %claimed.key_id, error = %why, "recording a claim");
    }
    let base = super::base_url(&web, &headers);
    // One the revealed key may use.
    let entry = web.views().tenancy.key_entry(&claimed.key_id);
    let model = super::landing::example_model(&entry.map_or_else(Vec::new, |k| {
        llmgw_gateway::model_cards(&web.gateway, Some(&k))
    }));
    let page = Revealed {
        chrome: Chrome::for_visitor(&web, &visitor),
        key_id: claimed.key_id,
        curl: super::curl_example(&base, Some(&claimed.secret), &model),
        secret: claimed.secret,
        base,
    };
    render(&page)
}

/// A people error fit for the log: only the store's failures carry text
/// we did not write, and none of ours carries the token.
fn safe(e: &PeopleError) -> String {
    match e {
        PeopleError::Store(_) => "the people tables failed".to_owned(),
        other => other.to_string(),
    }
}

/// The answer to a failed look-up or claim: the store unreachable says
/// so (503), anything else is ours (500).
fn failed(doing: &str, e: &PeopleError) -> WebError {
    match e {
        PeopleError::Store(_) => WebError::StoreDown(format!("{doing}: {}", safe(e))),
        _ => WebError::Internal(format!("{doing}: {}", safe(e))),
    }
}
