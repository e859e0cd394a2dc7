//! `/profile`: who you are, your use today and this month (with a link to
//! `/profile/usage`), your keys (made once-shown, revoked) and your
//! password.

use std::sync::Arc;

use axum::Form;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use chrono::Utc;
use llmgw_api::admin::{Changed, KeyCreated, KeyRow, NewKey};
use llmgw_decider::Actor;
use llmgw_domain::Event;
use llmgw_domain::tenancy::{TenancyEvent, UserStatus};
use llmgw_people::PeopleError;
use serde::Deserialize;

use super::account::CsrfForm;
use super::{encode, see_other, with_cookies, with_status};
use crate::session::{CSRF_COOKIE, Person, SESSION_COOKIE, set_cookie};
use crate::{Chrome, Visitor, Web, WebError, admin_api, render};

#[derive(Debug, askama::Template)]
#[template(path = "pages/profile.html")]
struct Profile {
    chrome: Chrome,
    email: String,
    name: String,
    user_id: String,
    project: Option<String>,
    status: &'static str,
    active: bool,
    keys: Vec<KeyRow>,
    /// Their use today and this month (keys and chat): the usage page
    /// has the rest.
    used_today: super::usage::Figures,
    used_month: super::usage::Figures,
    key_error: Option<String>,
    password_error: Option<String>,
    password_changed: bool,
}

#[derive(Debug, askama::Template)]
#[template(path = "pages/key_created.html")]
struct KeyMade {
    chrome: Chrome,
    name: String,
    key_id: String,
    secret: String,
    base: String,
    curl: String,
}

/// A resubmitted key form (a reload of the new key's page), or a name
/// the person already uses: the key exists and its secret cannot be shown
/// again.
#[derive(Debug, askama::Template)]
#[template(path = "pages/key_exists.html")]
struct KeyExists {
    chrome: Chrome,
    name: String,
    prefix: String,
}

/// `/profile?changed=password`: where a password change leads, so that a
/// reload asks for the page again rather than posting the form again.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ProfileQuery {
    #[serde(default)]
    changed: String,
}

/// What the last post left to say on the page.
#[derive(Debug, Default)]
struct Said {
    key_error: Option<String>,
    password_error: Option<String>,
    password_changed: bool,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct NewKeyForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct PasswordForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    current: String,
    #[serde(default)]
    next: String,
}

/// The signed-in person on a profile route (accounts on).
fn signed_in<'a>(web: &Web, visitor: &'a Visitor) -> Result<&'a Person, WebError> {
    super::people(web)?;
    visitor.person()
}

/// The person's project and status, from the log's view.
fn standing(web: &Web, user_id: &str) -> (Option<String>, UserStatus) {
    let views = web.views();
    match views.tenancy.tenancy.users.get(user_id) {
        Some(u) => (u.project_id.clone(), u.status),
        None => (None, UserStatus::Pending),
    }
}

fn status_word(s: UserStatus) -> &'static str {
    match s {
        UserStatus::Pending => "waiting for approval",
        UserStatus::Active => "active",
        UserStatus::Suspended => "suspended",
        UserStatus::Erased => "erased",
    }
}

/// The keys this person made for themselves (or were made for them), in
/// every project: one left in a project they have since moved from still
/// works, so it is theirs to see and revoke.
async fn own_keys(web: &Web, person: &Person) -> Result<Vec<KeyRow>, WebError> {
    let path = format!("/api/v1/keys?owner={}", encode(&person.user_id));
    let keys: Vec<KeyRow> =
        admin_api::call(web, Method::GET, &path, &person.user_id, None::<&()>).await?;
    Ok(keys
        .into_iter()
        .filter(|k| k.owner.as_deref() == Some(person.user_id.as_str()))
        .collect())
}

async fn profile_page(
    web: &Web,
    person: &Person,
    chrome: Chrome,
    said: Said,
) -> Result<Response, WebError> {
    let people = super::people(web)?;
    let Some(me) = people
        .person(&person.user_id)
        .await
        .map_err(|e| WebError::people("reading a person", e))?
    else {
        return Err(WebError::SignIn);
    };
    let (project, status) = standing(web, &person.user_id);
    let keys = match &project {
        Some(_) => own_keys(web, person).await?,
        None => Vec::new(),
    };
    let (used_today, used_month) = super::usage::summary(web, &person.user_id);
    let page = Profile {
        chrome,
        email: me.email,
        name: me.name,
        user_id: me.user_id,
        project,
        status: status_word(status),
        active: status == UserStatus::Active,
        keys,
        used_today,
        used_month,
        key_error: said.key_error,
        password_error: said.password_error,
        password_changed: said.password_changed,
    };
    let status = if page.key_error.is_some() || page.password_error.is_some() {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::OK
    };
    Ok(with_status(render(&page)?, status))
}

pub(super) async fn page(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
    query: Result<Query<ProfileQuery>, QueryRejection>,
) -> Result<Response, WebError> {
    let person = signed_in(&web, &visitor)?;
    let chrome = Chrome::for_visitor(&web, &visitor);
    let said = Said {
        password_changed: query.is_ok_and(|q| q.changed == "password"),
        ..Said::default()
    };
    profile_page(&web, person, chrome, said).await
}

pub(super) async fn create_key(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
    headers: HeaderMap,
    Form(form): Form<NewKeyForm>,
) -> Result<Response, WebError> {
    let person = signed_in(&web, &visitor)?;
    person.check_csrf(&form.csrf)?;
    let chrome = Chrome::for_visitor(&web, &visitor);
    let name = form.name.trim().to_owned();
    let refuse = |why: String| Said {
        key_error: Some(why),
        ..Said::default()
    };
    let (Some(project), UserStatus::Active) = standing(&web, &person.user_id) else {
        let said = refuse("your account is not in a project yet".into());
        return profile_page(&web, person, chrome, said).await;
    };
    if name.is_empty() {
        let said = refuse("give the key a name".into());
        return profile_page(&web, person, chrome, said).await;
    }
    let body = NewKey {
        project,
        name: name.clone(),
        band: None,
        owner: Some(person.user_id.clone()),
        claim: false,
        claim_ttl_secs: None,
        valid_for_secs: None,
    };
    let made: KeyCreated = match admin_api::call(
        &web,
        Method::POST,
        "/api/v1/keys",
        &person.user_id,
        Some(&body),
    )
    .await
    {
        Ok(made) => made,
        Err(WebError::Bad(why)) => {
            // Most often the new key's page reloaded, which posts its form
            // again: say that the key exists and why its secret is gone,
            // rather than "choose another name".
            let mine = own_keys(&web, person).await?;
            if let Some(k) = mine
                .iter()
                .find(|k| k.state == "active" && k.name == name && k.project == body.project)
            {
                let page = KeyExists {
                    chrome,
                    name,
                    prefix: k.prefix.clone(),
                };
                return Ok(with_status(render(&page)?, StatusCode::CONFLICT));
            }
            // The rule names the owner by id: here the owner is the reader.
            let why = why.replace(
                &format!("{} already has", person.user_id),
                "you already have",
            );
            return profile_page(&web, person, chrome, refuse(why)).await;
        }
        Err(e) => return Err(e),
    };
    let secret = made
        .secret
        .ok_or_else(|| WebError::Internal("the admin API made a key without a secret".into()))?;
    let base = super::base_url(&web, &headers);
    let model = super::landing::example_model(&super::landing::models_of_person(
        &web,
        Some(&person.user_id),
    ));
    // The secret goes into this page only: not stored, not in a URL.
    let page = KeyMade {
        chrome,
        name,
        key_id: made.key_id,
        curl: super::curl_example(&base, Some(&secret), &model),
        secret,
        base,
    };
    render(&page)
}

pub(super) async fn revoke_key(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
    Path(key_id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, WebError> {
    let person = signed_in(&web, &visitor)?;
    person.check_csrf(&form.csrf)?;
    // Only a key this person made: anyone else's, or none, is the same 404.
    let (Some(_), _) = standing(&web, &person.user_id) else {
        return Err(WebError::NotFound);
    };
    if !own_keys(&web, person)
        .await?
        .iter()
        .any(|k| k.key_id == key_id)
    {
        return Err(WebError::NotFound);
    }
    let path = format!("/api/v1/keys/{}/revoke", encode(&key_id));
    let _: Changed =
        admin_api::call(&web, Method::POST, &path, &person.user_id, None::<&()>).await?;
    Ok(see_other("/profile"))
}

pub(super) async fn change_password(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
    Form(form): Form<PasswordForm>,
) -> Result<Response, WebError> {
    let person = signed_in(&web, &visitor)?;
    person.check_csrf(&form.csrf)?;
    let people = super::people(&web)?;
    let chrome = Chrome::for_visitor(&web, &visitor);
    let opened = match people
        .change_password(&person.user_id, &form.current, &form.next, Utc::now())
        .await
    {
        Ok(opened) => opened,
        Err(e @ PeopleError::Store(_)) => {
            return Err(WebError::people("changing a password", e));
        }
        Err(e) => {
            // No email was typed here: the sign-in's wording would puzzle.
            let why = match e {
                PeopleError::BadCredentials => "that is not your current password".to_owned(),
                e => e.to_string(),
            };
            let said = Said {
                password_error: Some(why),
                ..Said::default()
            };
            return profile_page(&web, person, chrome, said).await;
        }
    };
    let event = Event::Tenancy(TenancyEvent::PasswordChanged {
        user_id: person.user_id.clone(),
    });
    if let Err(why) = super::observe(&web, Actor::Person(person.user_id.clone()), event).await {
        // The password has changed and the other browsers are signed out;
        // only the log's note of it is missing.
        tracing::error!(user_id = %person.user_id, error = %why, "recording a password change");
    }
    // This browser stays signed in, on the new session. A redirect, not
    // the page: a reload then shows the profile again instead of posting
    // the old password once more (which now fails).
    let cookies = [
        set_cookie(&web, SESSION_COOKIE, Some(&opened.token)),
        set_cookie(&web, CSRF_COOKIE, Some(&opened.csrf)),
    ];
    with_cookies(see_other("/profile?changed=password"), &cookies)
}
