//! The admin API's people routes: list, add, approve, suspend, promote,
//! reset a password, erase. The decision goes through the [`Door`] like every
//! operator command; what lives outside the log (sessions, password
//! hashes, personal data) is changed after the decision is recorded, so a
//! refused command touches nothing.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use llmgw_api::admin as api;
use llmgw_domain::Command;
use llmgw_domain::tenancy::{TenancyCommand as T, UserStatus};
use serde::{Deserialize, Serialize};

use crate::admin::{AdminError, Result};
use crate::tenancy_api::{TenancyState, bad, change, origin};

pub(crate) fn routes() -> Router<TenancyState> {
    Router::new()
        .route("/api/v1/users", get(list).post(add))
        .route("/api/v1/users/{id}/approve", post(approve))
        .route("/api/v1/users/{id}/suspend", post(suspend))
        .route("/api/v1/users/{id}/promote", post(promote))
        .route("/api/v1/users/{id}/reset-password", post(reset_password))
        .route("/api/v1/users/{id}/erase", post(erase))
}

fn internal(e: impl std::fmt::Display) -> AdminError {
    AdminError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    #[serde(default)]
    pending: bool,
}

/// Everyone the log knows, pending first, with what the people table
/// still holds of them (nothing once erased).
async fn list(
    State(s): State<TenancyState>,
    Query(q): Query<ListQuery>,
) -> Result<Vec<api::UserRow>> {
    let persons = s.people.people().await.map_err(internal)?;
    let views = s.door.views();
    let views = views.read().unwrap_or_else(|p| p.into_inner());
    let stamp =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut rows: Vec<api::UserRow> = views
        .tenancy
        .tenancy
        .users
        .values()
        .filter(|u| !q.pending || u.status == UserStatus::Pending)
        .map(|u| {
            let person = persons.iter().find(|p| p.user_id == u.user_id);
            api::UserRow {
                user_id: u.user_id.clone(),
                email: person.map(|p| p.email.clone()).unwrap_or_default(),
                name: person.map(|p| p.name.clone()).unwrap_or_default(),
                status: u.status.name().to_owned(),
                project: u.project_id.clone(),
                admin: u.admin,
                created_at: person.map(|p| stamp(p.created_at)),
                last_login: person.and_then(|p| p.last_login_at).map(stamp),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        (a.status != "pending", &a.created_at, &a.user_id).cmp(&(
            b.status != "pending",
            &b.created_at,
            &b.user_id,
        ))
    });
    Ok(Json(rows))
}

/// What `POST /api/v1/users` answers: what changed, and the new person's
/// id on its own, for `users add` to print alone.
#[derive(Debug, Serialize)]
struct Added {
    #[serde(flatten)]
    changed: api::Changed,
    user_id: String,
}

/// A person added by an operator, approved to a project in the same
/// decision. Their personal data is stored first, as a sign-up's is; a
/// decision the log refuses (no such project, a server that leads
/// elsewhere) takes it back out. An operator may learn that an address
/// has an account: this listener is theirs, on loopback.
async fn add(
    State(s): State<TenancyState>,
    headers: HeaderMap,
    Json(u): Json<api::NewUser>,
) -> Result<Added> {
    let user_id = match s
        .people
        .sign_up(&u.email, &u.name, &u.password, chrono::Utc::now())
        .await
    {
        Ok(Some(id)) => id,
        Ok(None) => {
            let why = format!("{} has an account already", u.email);
            record_taken_address(&s, &headers, &u.email).await;
            return Err(AdminError(StatusCode::CONFLICT, why));
        }
        Err(llmgw_people::PeopleError::Store(why)) => return Err(internal(why)),
        Err(e @ llmgw_people::PeopleError::Busy) => {
            return Err(AdminError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()));
        }
        Err(e) => return Err(bad(e.to_string())),
    };
    let by = origin(&headers).actor.name().to_owned();
    let done = format!(
        "{} is {user_id}, and may use project {}",
        u.email, u.project
    );
    let commands = vec![
        Command::Tenancy(T::SignUp {
            user_id: user_id.clone(),
        }),
        Command::Tenancy(T::Approve {
            user_id: user_id.clone(),
            project_id: u.project,
            by,
        }),
    ];
    match change(&s.door, &headers, commands, &done).await {
        Ok(Json(changed)) => Ok(Json(Added { changed, user_id })),
        // A refusal (no such project, a server leading elsewhere): the log
        // holds nothing of them, so neither does the people table.
        Err(refused) if refused.0.is_client_error() => {
            if let Err(e) = s.people.erase(&user_id).await {
                tracing::error!(user_id = %user_id, error = %e, "erasing a person the log did not take");
            }
            Err(refused)
        }
        // The store failed on the way: the decision may be in the log, so
        // the person is kept, and the answer says how to tell.
        Err(AdminError(status, why)) => Err(AdminError(
            status,
            format!(
                "{why}; {} ({user_id}) may have been added: users list tells",
                u.email
            ),
        )),
    }
}

/// `users add` refused for an address that has an account: recorded as
/// every refused operator command is, though the refusal came before any
/// decision (the people table knows the address, the log does not). The
/// log never holds personal data, so the refusal names the account the
/// address belongs to, in that person's stream (`events log --user`
/// shows it), never the address.
async fn record_taken_address(s: &TenancyState, headers: &HeaderMap, email: &str) {
    let address = llmgw_people::normalize_email(email);
    let holder = match s.people.people().await {
        Ok(people) => people.into_iter().find(|p| p.email == address),
        Err(e) => {
            tracing::warn!(error = %e, "could not record a refused users add");
            return;
        }
    };
    // Erased between the two reads: the next try adds them, nothing to say.
    let Some(holder) = holder else {
        return;
    };
    let command = Command::Tenancy(T::SignUp {
        user_id: holder.user_id.clone(),
    });
    let rejection = llmgw_domain::Rejection::conflict(format!(
        "users add: the email given has an account already, {} (the address is not recorded here)",
        holder.user_id
    ));
    s.door
        .record_refused(&origin(headers), &command, &rejection)
        .await;
}

async fn approve(
    State(s): State<TenancyState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Json(a): Json<api::Approve>,
) -> Result<api::Changed> {
    let by = origin(&headers).actor.name().to_owned();
    let done = format!("{id} may use project {}", a.project);
    let c = T::Approve {
        user_id: id,
        project_id: a.project,
        by,
    };
    let Json(mut changed) = change(&s.door, &headers, vec![Command::Tenancy(c)], &done).await?;
    // Moved from another project: their own keys there were revoked.
    let revoked = changed.events.iter().filter(|e| *e == "KeyRevoked").count();
    if revoked > 0 {
        let (keys, are) = if revoked == 1 {
            ("key", "is")
        } else {
            ("keys", "are")
        };
        changed.message.push_str(&format!(
            "; their {revoked} own {keys} in the project they left {are} revoked"
        ));
    }
    Ok(Json(changed))
}

/// Suspended in the log first (which already stops the sessions from
/// counting), then the sessions are closed. Keys keep working until
/// revoked.
async fn suspend(
    State(s): State<TenancyState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<api::Changed> {
    let by = origin(&headers).actor.name().to_owned();
    let done = format!("{id} is suspended");
    let c = T::Suspend {
        user_id: id.clone(),
        by,
    };
    let Json(mut changed) = change(&s.door, &headers, vec![Command::Tenancy(c)], &done).await?;
    s.people.close_sessions(&id).await.map_err(internal)?;
    if !changed.events.is_empty() {
        changed.message.push_str("; their keys work until revoked");
    }
    Ok(Json(changed))
}

async fn promote(
    State(s): State<TenancyState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<api::Changed> {
    let by = origin(&headers).actor.name().to_owned();
    let done = format!("{id} is an admin");
    let c = T::Promote { user_id: id, by };
    change(&s.door, &headers, vec![Command::Tenancy(c)], &done).await
}

async fn reset_password(
    State(s): State<TenancyState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Json(r): Json<api::ResetPassword>,
) -> Result<api::Changed> {
    // Checked before anything is recorded, so a weak password changes
    // nothing.
    if r.password.chars().count() < 12 {
        return Err(bad(llmgw_people::PeopleError::WeakPassword.to_string()));
    }
    let by = origin(&headers).actor.name().to_owned();
    let done = format!("{id} has a new password; their sessions are closed");
    let c = T::ResetPassword {
        user_id: id.clone(),
        by,
    };
    let changed = change(&s.door, &headers, vec![Command::Tenancy(c)], &done).await?;
    s.people
        .reset_password(&id, &r.password)
        .await
        .map_err(internal)?;
    Ok(changed)
}

/// The person's personal data leaves the people table; the log keeps
/// only the id and what was done, so its chain still verifies.
async fn erase(
    State(s): State<TenancyState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<api::Changed> {
    let by = origin(&headers).actor.name().to_owned();
    let done = format!("{id}'s personal data is erased");
    let c = T::Erase {
        user_id: id.clone(),
        by,
    };
    let Json(mut changed) = change(&s.door, &headers, vec![Command::Tenancy(c)], &done).await?;
    let deleted = s.people.erase(&id).await.map_err(internal)?;
    // Erased in the log already (a copy brought up to date by an import
    // before imports applied erasures), yet the table still held them:
    // "nothing to change" read as if their data were gone.
    if changed.events.is_empty() && deleted {
        changed.message = format!(
            "{id} was erased in the log already, but this store's people table still held their personal data: deleted now"
        );
    }
    Ok(Json(changed))
}
