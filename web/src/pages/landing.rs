//! `/`: how to connect.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use llmgw_gateway::ModelCard;

use super::contact::{self, Contact};
use crate::{Chrome, Visitor, Web, WebError, render};

#[derive(Debug, askama::Template)]
#[template(path = "pages/landing.html")]
struct Landing {
    chrome: Chrome,
    base: String,
    /// Keys are needed (accounts on).
    keys: bool,
    curl: String,
    models: Vec<ModelCard>,
    notice: Option<String>,
    contact: Option<Contact>,
}

pub(super) async fn page(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
    headers: HeaderMap,
) -> Result<Response, WebError> {
    let base = super::base_url(&web, &headers);
    let keys = web.settings.accounts;
    let person = visitor.person().ok().map(|p| p.user_id.as_str());
    let models = distinct(models_of_person(&web, person));
    let model = example_model(&models);
    let curl = super::curl_example(&base, keys.then_some("$LLMGW_KEY"), &model);
    let page = Landing {
        chrome: Chrome::for_visitor(&web, &visitor),
        keys,
        curl,
        base,
        models,
        notice: web.settings.notice.clone().filter(|n| !n.trim().is_empty()),
        contact: web
            .settings
            .contact
            .as_deref()
            .filter(|c| !c.trim().is_empty())
            .map(contact::classify),
    };
    render(&page)
}

/// The models a visitor may use: with keys required, a stranger's are
/// none (`/v1/models` answers a stranger 401, and the pages list no more),
/// a signed-in person's are their project's; without keys, all.
pub(super) fn models_of_person(web: &Web, user_id: Option<&str>) -> Vec<ModelCard> {
    if !web.settings.accounts {
        return llmgw_gateway::model_cards(&web.gateway, None);
    }
    let entry = user_id.and_then(|u| web.views().tenancy.person_entry(u));
    entry.map_or_else(Vec::new, |key| {
        llmgw_gateway::model_cards(&web.gateway, Some(&key))
    })
}

/// The model for a curl example: the first that serves now (the first
/// alphabetically may be one that only starts on demand, and a first try
/// that waits minutes for it reads as broken), else the first, else a
/// placeholder.
pub(super) fn example_model(models: &[ModelCard]) -> String {
    models
        .iter()
        .find(|m| !m.loading_on_demand)
        .or(models.first())
        .map_or_else(|| "MODEL".to_owned(), |m| m.id.clone())
}

/// Each model once, in the order given.
pub(super) fn distinct(models: Vec<ModelCard>) -> Vec<ModelCard> {
    let mut seen = std::collections::HashSet::new();
    models
        .into_iter()
        .filter(|m| seen.insert(m.id.clone()))
        .collect()
}
