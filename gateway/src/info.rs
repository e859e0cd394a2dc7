//! What a client may ask about itself and the models: `/v1/models` (every
//! model the key may use, whether serving now, down for a while or started
//! on demand, with the catalog's description), `/v1/models/{id}`, and
//! `/me` (the key's limits at every level, its spend this period, its
//! models).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use llmgw_projections::KeyEntry;
use serde_json::{Value, json};

use crate::routes::Routes;
use crate::{ApiError, Gateway};

/// The models the key (or anyone, with authentication off) may use,
/// sorted: each model a request may name and be routed for (a configured
/// endpoint's, the catalog's), each once by its canonical name. Whether it
/// serves right now is routing's to say (503, then the engine's return):
/// a model left out while its engine was down was lost to the clients
/// that list models once, at their start.
fn models_for(gw: &Gateway, routes: &Routes, key: Option<&KeyEntry>) -> Vec<String> {
    let mut all: Vec<String> = gw.endpoints.models();
    all.extend(routes.catalog_models().map(str::to_owned));
    all.sort();
    all.dedup();
    all.retain(|m| key.is_none_or(|k| k.limits.models.permits(m)));
    all
}

/// A model a person may pick on the chat page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCard {
    pub id: String,
    pub description: Option<String>,
    /// Started by asking; not serving now.
    pub loading_on_demand: bool,
}

/// The models `key` (None: anyone, with authentication off) may use, as
/// `/v1/models` lists them.
pub fn model_cards(gw: &Gateway, key: Option<&KeyEntry>) -> Vec<ModelCard> {
    let routes = gw.routes.load();
    let serving = gw.endpoints.routable_models();
    models_for(gw, &routes, key)
        .into_iter()
        .map(|id| ModelCard {
            description: routes.description(&id).map(str::to_owned),
            loading_on_demand: routes.on_demand(&id) && !serving.contains(&id),
            id,
        })
        .collect()
}

fn model_object(gw: &Gateway, routes: &Routes, id: &str) -> Value {
    let created = routes.created(id).unwrap_or(gw.started_s);
    let mut m = json!({"id": id, "object": "model", "created": created, "owned_by": "llmgw"});
    if let Some(d) = routes.description(id) {
        m["description"] = json!(d);
    }
    // The catalog's context length, which its engines are started with:
    // what a client may send, as OpenRouter and others name it (vLLM's
    // own listing says max_model_len).
    if let Some(c) = routes.context(id) {
        m["context_length"] = json!(c);
    }
    m
}

pub(crate) async fn models(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let caller = match crate::proxy::identify(&gw, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let routes = gw.routes.load();
    let data: Vec<Value> = models_for(&gw, &routes, caller.key.as_deref())
        .iter()
        .map(|m| model_object(&gw, &routes, m))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// One model; the same 404 whether it does not exist or is not the key's.
pub(crate) async fn model(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let caller = match crate::proxy::identify(&gw, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let routes = gw.routes.load();
    let canonical = routes.canonical(&id);
    let listed = crate::proxy::known(&gw, &routes, canonical)
        && caller
            .key
            .as_ref()
            .is_none_or(|k| k.limits.models.permits(canonical));
    if !listed {
        return ApiError::unknown_model(&id).into_response();
    }
    axum::Json(model_object(&gw, &routes, canonical)).into_response()
}

/// The key's own view of itself.
pub(crate) async fn me(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let Some(directory) = &gw.keys else {
        return ApiError::not_found(
            "authentication is off: requests carry no key, so there is no `me`",
        )
        .into_response();
    };
    let key = match directory.authenticate(&headers) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    let now = crate::proxy::now_ms();
    let unflushed = gw.usage.as_deref().map(|q| q.unflushed());
    let spent = directory.budget_spend(&key, unflushed, now);
    let spend: Vec<Value> = key
        .limits
        .budgets
        .iter()
        .zip(&spent)
        .map(|(b, s)| {
            json!({
                "scope": b.scope,
                "scope_id": b.scope_id,
                "period": b.period,
                "budget_micros": b.micros,
                "spent_micros": s,
                "left_micros": b.micros.saturating_sub(*s),
            })
        })
        .collect();
    let (day, month) = directory.key_spend(&key, unflushed, now);
    let routes = gw.routes.load();
    let models = models_for(&gw, &routes, Some(&*key));
    let mut me = json!({
        "key_id": key.key_id,
        "prefix": key.prefix,
        "project_id": key.project_id,
        "team_id": key.team_id,
        "org_id": key.org_id,
        "band": key.band,
        "limits": key.limits,
        "spend": spend,
        "used": {"day_micros": day, "month_micros": month},
        "models": models,
    });
    // When the secret presented stops working (its key's end, or a
    // rotated key's old secret's grace), so a client can renew in time.
    if let Some(at) = key
        .until
        .and_then(|u| chrono::DateTime::from_timestamp_millis(u.0))
    {
        me["expires_at"] = json!(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    }
    axum::Json(me).into_response()
}

pub(crate) async fn ready(State(gw): State<Arc<Gateway>>) -> Response {
    // Three scrapes that found nothing listening, as stale figures are.
    if !gw.endpoints.any_ready(gw.config.scrape_interval * 3) {
        (StatusCode::SERVICE_UNAVAILABLE, "nothing is routable").into_response()
    } else {
        (StatusCode::OK, Bytes::from_static(b"ready")).into_response()
    }
}
