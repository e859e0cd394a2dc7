//! `/admin/users`: the people, pending first, with approve and suspend
//! for a signed-in admin. The decision goes to the admin API like an
//! operator's command; promote, password resets and erasure stay with the
//! CLI.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::Method;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::SecondsFormat;
use llmgw_api::admin::{Approve, Changed};
use llmgw_domain::tenancy::UserStatus;
use serde::Deserialize;

use super::{Pager, page_number, segment};
use crate::{Chrome, Viewer, Web, WebError, admin_api, render};

const PER_PAGE: usize = 100;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct UsersQuery {
    page: Option<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct UserRow {
    pub id: String,
    /// For the form's action.
    pub path: String,
    pub email: String,
    pub name: String,
    pub status: &'static str,
    pub pending: bool,
    pub active: bool,
    pub project: String,
    pub admin: bool,
    pub created: String,
    pub last_login: String,
    /// Approve (pending), reinstate (suspended): the project picker.
    pub approvable: bool,
    pub suspendable: bool,
    /// Whom the row's buttons act on, for their accessible names: a
    /// screen reader heard a column of identical "Approve" and "Suspend".
    pub who: String,
}

/// A person as a button names them: name and email, the email alone, or
/// (erased, or no people tables here) the id.
fn who(id: &str, person: Option<&llmgw_people::Person>) -> String {
    match person {
        Some(p) if !p.name.is_empty() && p.name != p.email => format!("{} ({})", p.name, p.email),
        Some(p) if !p.email.is_empty() => p.email.clone(),
        _ => id.to_owned(),
    }
}

#[derive(askama::Template)]
#[template(path = "admin/users.html")]
struct UsersPage {
    chrome: Chrome,
    users: Vec<UserRow>,
    pager: Pager,
    pending: usize,
    projects: Vec<(String, String)>,
    /// The people tables are not on this server (auth is off).
    no_accounts: bool,
}

pub(crate) async fn page(
    State(web): State<Arc<Web>>,
    viewer: Viewer,
    Query(q): Query<UsersQuery>,
) -> Result<Response, WebError> {
    // Names and emails live outside the log, in the erasable people
    // tables; the log has who is pending, active or suspended.
    let persons = match &web.people {
        Some(people) => people
            .people()
            .await
            .map_err(|e| WebError::people("listing people", e))?,
        None => Vec::new(),
    };
    let by_id: BTreeMap<&str, &llmgw_people::Person> =
        persons.iter().map(|p| (p.user_id.as_str(), p)).collect();
    let stamp = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(SecondsFormat::Secs, true);
    let page = {
        let views = web.views();
        let t = &views.tenancy.tenancy;
        let mut all: Vec<_> = t
            .users
            .values()
            .map(|u| (u, by_id.get(u.user_id.as_str()).copied()))
            .collect();
        // Pending first (they wait on someone), then oldest first.
        all.sort_by(|(a, pa), (b, pb)| {
            (
                a.status != UserStatus::Pending,
                pa.map(|p| p.created_at),
                &a.user_id,
            )
                .cmp(&(
                    b.status != UserStatus::Pending,
                    pb.map(|p| p.created_at),
                    &b.user_id,
                ))
        });
        let pending = all
            .iter()
            .filter(|(u, _)| u.status == UserStatus::Pending)
            .count();
        let pager = Pager::new(all.len(), PER_PAGE, page_number(q.page.as_deref()), |n| {
            format!("/admin/users?page={n}")
        });
        let users = all[pager.range()]
            .iter()
            .map(|(u, p)| UserRow {
                id: u.user_id.clone(),
                path: segment(&u.user_id),
                email: p.map(|p| p.email.clone()).unwrap_or_default(),
                name: p.map(|p| p.name.clone()).unwrap_or_default(),
                status: u.status.name(),
                pending: u.status == UserStatus::Pending,
                active: u.status == UserStatus::Active,
                project: u.project_id.clone().unwrap_or_default(),
                admin: u.admin,
                created: p.map(|p| stamp(p.created_at)).unwrap_or_default(),
                last_login: p
                    .and_then(|p| p.last_login_at)
                    .map(stamp)
                    .unwrap_or_else(|| "never".into()),
                approvable: matches!(u.status, UserStatus::Pending | UserStatus::Suspended),
                suspendable: matches!(u.status, UserStatus::Pending | UserStatus::Active),
                who: who(&u.user_id, *p),
            })
            .collect();
        UsersPage {
            chrome: Chrome::for_viewer(&web, &viewer),
            users,
            pager,
            pending,
            projects: t
                .projects
                .iter()
                .map(|(id, p)| (id.clone(), p.name.clone()))
                .collect(),
            no_accounts: web.people.is_none(),
        }
    };
    render(&page)
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ApproveForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    project: String,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

pub(crate) async fn approve(
    State(web): State<Arc<Web>>,
    viewer: Viewer,
    Path(id): Path<String>,
    Form(form): Form<ApproveForm>,
) -> Result<Response, WebError> {
    let admin = viewer.actor()?;
    admin.check_csrf(&form.csrf)?;
    if form.project.is_empty() {
        return Err(WebError::Bad("pick a project to approve them into".into()));
    }
    let _: Changed = admin_api::call(
        &web,
        Method::POST,
        &format!("/api/v1/users/{}/approve", segment(&id)),
        &admin.user_id,
        Some(&Approve {
            project: form.project,
        }),
    )
    .await?;
    Ok(Redirect::to("/admin/users").into_response())
}

pub(crate) async fn suspend(
    State(web): State<Arc<Web>>,
    viewer: Viewer,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, WebError> {
    let admin = viewer.actor()?;
    admin.check_csrf(&form.csrf)?;
    let _: Changed = admin_api::call(
        &web,
        Method::POST,
        &format!("/api/v1/users/{}/suspend", segment(&id)),
        &admin.user_id,
        None::<&()>,
    )
    .await?;
    Ok(Redirect::to("/admin/users").into_response())
}
