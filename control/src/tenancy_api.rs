//! The admin API's tenancy routes: orgs, teams, projects, keys and limits.
//! Reads come from this server's views; writes go through the [`Door`]
//! with the operator the request names, so the log says who did what.

use std::sync::Arc;

use axum::extract::{FromRef, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use llmgw_api::admin as api;
use llmgw_decider::{Actor, Origin};
use llmgw_domain::Command;
use llmgw_domain::tenancy::{Band, Key, Limits, Period, Scope, TenancyCommand as T};
use llmgw_domain::time::UnixMillis;
use llmgw_people::People;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::admin::{AdminError, Result};
use crate::door::Door;

/// What the tenancy and people routes share: where commands go, and the
/// erasable tables (claim links, passwords, sessions).
#[derive(Debug, Clone)]
pub struct TenancyState {
    pub door: Door,
    pub people: Arc<People>,
}

impl FromRef<TenancyState> for Door {
    fn from_ref(s: &TenancyState) -> Door {
        s.door.clone()
    }
}

pub fn router(door: Door, people: Arc<People>) -> Router {
    Router::new()
        .route("/api/v1/tree", post(create_tree))
        .route("/api/v1/keys", get(list_keys).post(create_key))
        .route("/api/v1/keys/{key}/revoke", post(revoke_key))
        .route("/api/v1/keys/{key}/rotate", post(rotate_key))
        .route("/api/v1/limits", put(set_limits))
        .route("/api/v1/groups", get(crate::groups_api::list))
        .merge(crate::people_api::routes())
        .merge(crate::convo_api::routes())
        // An operator's name with a newline or an escape forged lines in
        // `events log`; refused on every route here (a layer covers the
        // routes added before it).
        .layer(axum::middleware::from_fn(
            crate::admin::refuse_unprintable_actor,
        ))
        .with_state(TenancyState { door, people })
}

/// The operator a request speaks for, and its command id (kept when a
/// standby forwards it, so both servers' logs name one command).
pub(crate) fn origin(headers: &HeaderMap) -> Origin {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty() && v.len() <= api::COMMAND_ID_MAX)
            .map(str::to_owned)
    };
    let actor = header(api::ACTOR_HEADER)
        .and_then(|a| api::actor_from_header(&a))
        .unwrap_or_else(|| "admin-api".to_owned());
    // Any other kind was refused before the route
    // (admin::refuse_unprintable_actor).
    let mut origin = Origin::new(match header(api::ACTOR_KIND_HEADER).as_deref() {
        Some(api::ACTOR_KIND_PERSON) => Actor::Person(actor),
        _ => Actor::Operator(actor),
    });
    if let Some(id) = header(api::COMMAND_HEADER) {
        origin.command_id = id;
    }
    origin
}

pub(crate) fn bad(why: impl Into<String>) -> AdminError {
    AdminError(StatusCode::UNPROCESSABLE_ENTITY, why.into())
}

pub(crate) async fn change(
    door: &Door,
    headers: &HeaderMap,
    commands: Vec<Command>,
    done: &str,
) -> Result<api::Changed> {
    let decided = door.execute(&origin(headers), commands).await?;
    door.views_reach(decided.position).await;
    Ok(Json(crate::admin::changed(&decided, done)))
}

/// The name a group is made with when none is given: the one it already
/// has (so that `keys init` again, without the names, changes nothing),
/// else its id.
fn name_held(
    door: &Door,
    groups: impl Fn(
        &llmgw_domain::tenancy::Tenancy,
    ) -> &std::collections::BTreeMap<String, llmgw_domain::tenancy::Named>,
    id: &str,
) -> String {
    let views = door.views();
    let views = views.read().unwrap_or_else(|p| p.into_inner());
    groups(&views.tenancy.tenancy)
        .get(id)
        .map_or_else(|| id.to_owned(), |g| g.name.clone())
}

/// The three as one change: a level refused (a team already in another
/// org, a project in another team) makes none of them, where three calls
/// left the levels before it made.
async fn create_tree(
    State(door): State<Door>,
    headers: HeaderMap,
    Json(t): Json<api::NewTree>,
) -> Result<api::Changed> {
    let done = format!(
        "project {} exists in team {} of org {}",
        t.project.id, t.team.id, t.org.id
    );
    let api::NewTree { org, team, project } = t;
    let org_name = (org.name).unwrap_or_else(|| name_held(&door, |g| &g.orgs, &org.id));
    let team_name = (team.name).unwrap_or_else(|| name_held(&door, |g| &g.teams, &team.id));
    let project_name =
        (project.name).unwrap_or_else(|| name_held(&door, |g| &g.projects, &project.id));
    let commands = vec![
        T::CreateOrg {
            org_id: org.id.clone(),
            name: org_name,
        },
        T::CreateTeam {
            team_id: team.id.clone(),
            org_id: org.id,
            name: team_name,
        },
        T::CreateProject {
            project_id: project.id,
            team_id: team.id,
            name: project_name,
        },
    ];
    let commands = commands.into_iter().map(Command::Tenancy).collect();
    change(&door, &headers, commands, &done).await
}

pub(crate) fn random_hex(n: usize) -> String {
    let mut s = String::new();
    while s.len() < n {
        s.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    s.truncate(n);
    s
}

fn band_of(s: Option<&str>) -> std::result::Result<Band, AdminError> {
    let s = s.unwrap_or("gold");
    Band::parse(s).ok_or_else(|| {
        bad(format!(
            "unknown band {s:?}: bronze, silver, gold or platinum"
        ))
    })
}

/// Makes the secret here, stores only its hash, and answers it once (or
/// seals it behind a one-time claim link, keeping only the link's hash).
async fn create_key(
    State(TenancyState { door, people }): State<TenancyState>,
    headers: HeaderMap,
    Json(k): Json<api::NewKey>,
) -> Result<api::KeyCreated> {
    let band = band_of(k.band.as_deref())?;
    let claim_ttl = claim_ttl(&k)?;
    let valid_for = bounded_secs(k.valid_for_secs, api::KEY_VALID_SECS, "a key")?;
    // One moment for the log's end of the link and the link's own.
    let now = chrono::Utc::now();
    let (secret, hash) = new_secret();
    let key = Key {
        key_id: format!("key-{}", random_hex(12)),
        project_id: k.project,
        name: k.name,
        hash,
        prefix: secret[..12].to_owned(),
        band,
        routing_profile: None,
        revoked: false,
        owner: k.owner,
        claim_by: None,
        expires_at: valid_for.map(|s| after(now, s)),
        previous: None,
    };
    let (key_id, prefix) = (key.key_id.clone(), key.prefix.clone());
    let origin = origin(&headers);
    let mut commands = vec![Command::Tenancy(T::IssueKey(key))];
    if k.claim {
        let ends = people.claim_ends(now, claim_ttl);
        commands.push(Command::Tenancy(T::OfferClaim {
            key_id: key_id.clone(),
            by: origin.actor.name().to_owned(),
            until: Some(UnixMillis(ends.timestamp_millis())),
        }));
    }
    let decided = door.execute(&origin, commands).await?;
    // The key works on this server once its views hold it.
    door.views_reach(decided.position).await;
    let (secret, claim) = if k.claim {
        let (token, ends) = people
            .seal_claim(&key_id, &secret, now, claim_ttl)
            .await
            .map_err(|e| AdminError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let ends = ends.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        (None, Some((token, ends)))
    } else {
        (Some(secret), None)
    };
    let (claim_token, claim_expires_at) = claim.unzip();
    Ok(Json(api::KeyCreated {
        key_id,
        prefix,
        secret,
        claim_token,
        claim_expires_at,
    }))
}

/// A new key's secret and the hash the log keeps.
fn new_secret() -> (String, String) {
    let secret = format!("{}{}", llmgw_domain::audit::SECRET_PREFIX, random_hex(48));
    let hash = Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    (secret, hash)
}

/// `secs` after `now`, as the log keeps a moment.
fn after(now: chrono::DateTime<chrono::Utc>, secs: u64) -> UnixMillis {
    UnixMillis(now.timestamp_millis()) + i64::try_from(secs).unwrap_or(i64::MAX / 1000) * 1000
}

fn rfc3339(at: UnixMillis) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(at.0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// A lifetime in seconds within its bounds, or the refusal naming them.
fn bounded_secs(
    secs: Option<u64>,
    bounds: std::ops::RangeInclusive<u64>,
    what: &str,
) -> std::result::Result<Option<u64>, AdminError> {
    match secs {
        Some(s) if !bounds.contains(&s) => Err(bad(format!(
            "{what} works for {} to {}, not {s} s",
            span(*bounds.start()),
            span(*bounds.end())
        ))),
        _ => Ok(secs),
    }
}

/// 60 → "1 minute", 3600 → "1 hour", 2592000 → "30 days".
fn span(secs: u64) -> String {
    let (n, unit) = match secs {
        s if s % 86_400 == 0 => (s / 86_400, "day"),
        s if s % 3600 == 0 => (s / 3600, "hour"),
        s if s % 60 == 0 => (s / 60, "minute"),
        s => (s, "second"),
    };
    let plural = if n == 1 { "" } else { "s" };
    format!("{n} {unit}{plural}")
}

/// A new secret for a key that keeps its id, limits, owner and history;
/// the old one works for the grace asked, or stops at once.
async fn rotate_key(
    State(door): State<Door>,
    headers: HeaderMap,
    axum::extract::Path(key_id): axum::extract::Path<String>,
    Json(r): Json<api::RotateKey>,
) -> Result<api::KeyRotated> {
    let grace = bounded_secs(r.grace_secs, api::GRACE_SECS, "an old secret")?;
    let now = chrono::Utc::now();
    let mut previous_until = grace.map(|s| after(now, s));
    let replaces = {
        let views = door.views();
        let views = views.read().unwrap_or_else(|p| p.into_inner());
        let tenancy = &views.tenancy.tenancy;
        // Its end came, or its claim link ended unused, as a change of
        // its limits is refused: the decision has no clock to tell.
        tenancy
            .limits_refusal_at(Scope::Key, &key_id, UnixMillis(now.timestamp_millis()))
            .map_err(|r| AdminError::from(crate::ControlError::Rejected(r)))?;
        let key = tenancy.keys.get(&key_id);
        // The old secret works no longer than the key does (it did; the
        // answer said it would).
        if let (Some(until), Some(end)) = (&mut previous_until, key.and_then(|k| k.expires_at)) {
            *until = (*until).min(end);
        }
        key.map(|k| k.hash.clone())
    };
    let (secret, hash) = new_secret();
    let prefix = secret[..12].to_owned();
    let origin = origin(&headers);
    let command = T::RotateKey {
        key_id: key_id.clone(),
        replaces,
        hash,
        prefix: prefix.clone(),
        previous_until,
        by: origin.actor.name().to_owned(),
    };
    let decided = door
        .execute(&origin, vec![Command::Tenancy(command)])
        .await?;
    // The new secret works on this server once its views hold it.
    door.views_reach(decided.position).await;
    Ok(Json(api::KeyRotated {
        key_id,
        prefix,
        secret,
        previous_until: previous_until.and_then(rfc3339),
    }))
}

/// The link's own lifetime, checked before anything is decided.
fn claim_ttl(k: &api::NewKey) -> std::result::Result<Option<std::time::Duration>, AdminError> {
    match k.claim_ttl_secs {
        None => Ok(None),
        Some(_) if !k.claim => Err(bad("a claim link's lifetime needs a claim link")),
        Some(s) if api::CLAIM_TTL_SECS.contains(&s) => Ok(Some(std::time::Duration::from_secs(s))),
        Some(s) => Err(bad(format!(
            "a claim link works for 1 minute to 30 days, not {s} s"
        ))),
    }
}

async fn revoke_key(
    State(door): State<Door>,
    headers: HeaderMap,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> Result<api::Changed> {
    let by = origin(&headers).actor.name().to_owned();
    let done = format!("{key} is revoked");
    let c = T::RevokeKey { key_id: key, by };
    change(&door, &headers, vec![Command::Tenancy(c)], &done).await
}

fn scope_of(s: &str) -> std::result::Result<Scope, AdminError> {
    Scope::parse(s).ok_or_else(|| bad(format!("unknown scope {s:?}: org, team, project or key")))
}

/// An allowlist's name that is no model or alias of the catalog, said
/// beside the change (one typo locks the scope out of the model, with a
/// 404 that hides why). Not refused: a static endpoint's model is in no
/// catalog, and a model may be added after.
fn unknown_model(door: &Door, models: &[String]) -> Option<String> {
    let views = door.views();
    let views = views.read().unwrap_or_else(|p| p.into_inner());
    let catalog = &views.cluster.catalog;
    if catalog.models.is_empty() {
        return None;
    }
    let unknown = models
        .iter()
        .find(|m| !m.is_empty() && catalog.resolve(m).is_none())?;
    let names: Vec<&str> = catalog.models.keys().map(String::as_str).collect();
    let listed = if names.len() <= 12 {
        names.join(", ")
    } else {
        "see `llmgw ctl models`".to_owned()
    };
    Some(format!(
        "{unknown:?} is no model or alias of the catalog ({listed}); requests for it are refused unless a static endpoint serves it"
    ))
}

fn period_of(s: &str) -> std::result::Result<Period, AdminError> {
    Period::parse(s).ok_or_else(|| bad(format!("unknown period {s:?}: day or month")))
}

/// One level's limits as the API shows them.
pub(crate) fn level(l: &Limits) -> api::LevelLimits {
    api::LevelLimits {
        rpm: l.rpm,
        tpm: l.tpm,
        models: l.models.clone(),
        budget_micros: l.budget_micros,
        period: l.period.map(|p| p.name().to_owned()),
    }
}

/// The level's limits after the request: what it had (unless `clear`),
/// with the given fields replaced.
async fn set_limits(
    State(door): State<Door>,
    headers: HeaderMap,
    Json(s): Json<api::SetLimits>,
) -> Result<api::Changed> {
    let scope = scope_of(&s.scope)?;
    let mut limits = {
        let views = door.views();
        let views = views.read().unwrap_or_else(|p| p.into_inner());
        let tenancy = &views.tenancy.tenancy;
        // A key whose claim link lapsed is refused as a revoked one is;
        // the decision has no clock to tell.
        tenancy
            .limits_refusal_at(scope, &s.id, UnixMillis::now())
            .map_err(|r| AdminError::from(crate::ControlError::Rejected(r)))?;
        if s.clear {
            Limits::default()
        } else {
            tenancy.limits_at(scope, &s.id).cloned().unwrap_or_default()
        }
    };
    let l = s.limits;
    let mut unknown = None;
    if l.rpm.is_some() {
        limits.rpm = l.rpm;
    }
    if l.tpm.is_some() {
        limits.tpm = l.tpm;
    }
    if s.all_models {
        limits.models = None;
    } else if let Some(models) = l.models {
        unknown = unknown_model(&door, &models);
        limits.models = Some(models);
    }
    if l.budget_micros.is_some() {
        limits.budget_micros = l.budget_micros;
    }
    if let Some(p) = &l.period {
        limits.period = Some(period_of(p)?);
    }
    let mut done = format!("limits of {} {} are set", s.scope, s.id);
    if let Some(note) = unknown {
        done.push_str(&format!("; note: {note}"));
    }
    let c = T::SetLimits {
        scope,
        scope_id: s.id,
        limits,
    };
    change(&door, &headers, vec![Command::Tenancy(c)], &done).await
}

#[derive(Debug, Deserialize)]
struct KeysQuery {
    project: Option<String>,
    /// A person's own keys, in every project (their profile's list).
    owner: Option<String>,
}

async fn list_keys(
    State(door): State<Door>,
    Query(q): Query<KeysQuery>,
) -> Result<Vec<api::KeyRow>> {
    let views = door.views();
    let views = views.read().unwrap_or_else(|p| p.into_inner());
    let t = &views.tenancy.tenancy;
    // A project that is not there is said, as `keys groups` says it: a
    // typo is not "no key yet".
    if let Some(p) = &q.project
        && !t.projects.contains_key(p)
    {
        return Err(AdminError(
            StatusCode::NOT_FOUND,
            format!("no project {p}; `llmgw keys groups` lists them"),
        ));
    }
    let now = UnixMillis::now();
    let rows = t
        .keys
        .values()
        .filter(|k| q.project.as_ref().is_none_or(|p| &k.project_id == p))
        .filter(|k| q.owner.is_none() || k.owner == q.owner)
        .map(|k| {
            let last = views.usage.spend_of(Scope::Key, &k.key_id).last_at;
            api::KeyRow {
                key_id: k.key_id.clone(),
                prefix: k.prefix.clone(),
                project: k.project_id.clone(),
                name: k.name.clone(),
                band: k.band.name().into(),
                state: if k.revoked {
                    "revoked"
                } else if !t.key_stands(k) {
                    // Its person was erased: it opens nothing.
                    "stopped"
                } else if k.ended(now) {
                    // Its claim link ended unused, or its own end came:
                    // it opens nothing.
                    "expired"
                } else if k.claim_by.is_some() {
                    "unclaimed"
                } else {
                    "active"
                }
                .into(),
                owner: k.owner.clone(),
                limits: t
                    .limits_at(Scope::Key, &k.key_id)
                    .map(level)
                    .unwrap_or_default(),
                last_used: (last > 0).then(|| rfc3339(UnixMillis(last))).flatten(),
                expires_at: k.expires_at.and_then(rfc3339),
                previous_until: (k.previous.as_ref())
                    .map(|p| p.until)
                    .filter(|u| *u > now)
                    .and_then(rfc3339),
                previous_prefix: (k.previous.as_ref())
                    .filter(|p| p.until > now)
                    .map(|p| p.prefix.clone()),
            }
        })
        .collect();
    Ok(Json(rows))
}
