//! `/chat`: a person talks to any model they may use, with no key in the
//! browser. The page's script posts each turn to `/chat/completions`,
//! where the session (and its CSRF token, sent as a header) stands for the
//! person's project; the gateway serves it as it would that project's key.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use llmgw_gateway::{ApiError, ModelCard};
use serde_json::{Map, Value};

use crate::{Chrome, Visitor, Web, WebError, render};

/// The most a chat turn may ask for.
pub(super) const MAX_TOKENS: u64 = 512;

/// The header the page's script sends the session's CSRF token in.
const CSRF_HEADER: &str = "x-csrf-token";

#[derive(Debug, askama::Template)]
#[template(path = "pages/chat.html")]
struct Chat {
    chrome: Chrome,
    models: Vec<ModelCard>,
    max_tokens: u64,
    /// Signed in but standing for no project (cannot happen for an
    /// active person; said rather than shown as an empty list).
    no_project: bool,
}

pub(super) async fn page(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
) -> Result<Response, WebError> {
    let (models, no_project) = if web.settings.accounts {
        let person = visitor.person()?;
        let entry = web.views().tenancy.person_entry(&person.user_id);
        match entry {
            Some(key) => (llmgw_gateway::model_cards(&web.gateway, Some(&key)), false),
            None => (Vec::new(), true),
        }
    } else {
        (llmgw_gateway::model_cards(&web.gateway, None), false)
    };
    let page = Chat {
        chrome: Chrome::for_visitor(&web, &visitor),
        models: super::landing::distinct(models),
        max_tokens: MAX_TOKENS,
        no_project,
    };
    render(&page)
}

/// A refusal in the API's envelope, which the script shows.
fn refuse(status: StatusCode, code: &'static str, message: &str) -> Response {
    ApiError::new(status, "invalid_request_error", code, message).into_response()
}

pub(super) async fn completions(
    State(web): State<Arc<Web>>,
    visitor: Result<Visitor, WebError>,
    request: axum::extract::Request,
) -> Response {
    // In the API's envelope, which the script shows, not as a page.
    let visitor = match visitor {
        Ok(v) => v,
        Err(e @ WebError::StoreDown(_)) => {
            e.log();
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                &e.to_string(),
            );
        }
        Err(e) => return e.into_response(),
    };
    let headers = request.headers().clone();
    // The page never sends a bearer key (a proxy's Basic credentials may
    // come along); an API client does, when its base URL lacks `/v1` (a
    // common slip): it would otherwise be answered here, its key ignored
    // and its answer capped at the page's limit.
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.get(..7)
                .is_some_and(|s| s.eq_ignore_ascii_case("bearer "))
        });
    if bearer {
        return refuse(
            StatusCode::NOT_FOUND,
            "unknown_url",
            "Unknown request URL: POST /chat/completions. The API is under /v1: give clients a base URL that ends in /v1.",
        );
    }
    let key = if web.settings.accounts {
        let Visitor::Person(person) = &visitor else {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "signed_out",
                "you are signed out; sign in again",
            );
        };
        let submitted = headers
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if person.check_csrf(submitted).is_err() {
            return refuse(
                StatusCode::FORBIDDEN,
                "csrf",
                "this page has expired; reload it and try again",
            );
        }
        let entry = web.views().tenancy.person_entry(&person.user_id);
        match entry {
            Some(key) => Some(key),
            None => return refuse(StatusCode::NOT_FOUND, "not_found", "not found"),
        }
    } else {
        None
    };
    let id = llmgw_gateway::RequestId::of(&request);
    let body = match llmgw_gateway::body_of(&web.gateway, request).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    match rewrite(&web.gateway, &body) {
        Ok(body) => llmgw_gateway::chat_as(web.gateway.clone(), key, body, id).await,
        Err(why) => refuse(StatusCode::BAD_REQUEST, "invalid_request", &why),
    }
}

/// The turn as the gateway gets it: at most [`MAX_TOKENS`] and never more
/// than the page asked for, in `max_tokens` alone (the newer
/// `max_completion_tokens` would win over it), one answer, fitted to the
/// model's context ([`llmgw_gateway::fit_chat_turn`]).
pub(super) fn rewrite(gw: &llmgw_gateway::Gateway, body: &[u8]) -> Result<Bytes, String> {
    let mut turn: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| format!("the request is not a JSON object: {e}"))?;
    let mut cap = MAX_TOKENS;
    for field in ["max_tokens", "max_completion_tokens"] {
        match turn.remove(field) {
            None | Some(Value::Null) => {}
            Some(v) => {
                let asked = v
                    .as_u64()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("`{field}` must be a positive whole number"))?;
                cap = cap.min(asked);
            }
        }
    }
    turn.insert("max_tokens".into(), Value::from(cap));
    // More than one answer a turn would multiply the tokens.
    turn.remove("n");
    llmgw_gateway::fit_chat_turn(gw, &mut turn);
    serde_json::to_vec(&turn)
        .map(Bytes::from)
        .map_err(|e| e.to_string())
}

pub(super) async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        include_str!("../../static/chat.js"),
    )
        .into_response()
}

pub(super) async fn style() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        include_str!("../../static/pages.css"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gateway that knows no model's context: nothing is fitted.
    fn gateway() -> Arc<llmgw_gateway::Gateway> {
        super::super::tests::harness::web(Default::default(), vec![])
            .gateway
            .clone()
    }

    fn rewritten(body: Value) -> Value {
        let out = rewrite(&gateway(), body.to_string().as_bytes()).expect("rewrite");
        serde_json::from_slice(&out).expect("json")
    }

    #[test]
    fn a_turn_asks_for_at_most_512_tokens() {
        let out = rewritten(serde_json::json!({"model": "m", "messages": [], "stream": true}));
        assert_eq!(out["max_tokens"], 512);
        assert_eq!(out["stream"], true);
        assert_eq!(out["model"], "m");
        let out = rewritten(serde_json::json!({"model": "m", "max_tokens": 100000}));
        assert_eq!(out["max_tokens"], 512);
    }

    #[test]
    fn never_more_than_the_page_asked() {
        let out = rewritten(serde_json::json!({"model": "m", "max_tokens": 40}));
        assert_eq!(out["max_tokens"], 40);
        // The newer field would win at the engine: it is folded in and dropped.
        let out = rewritten(
            serde_json::json!({"model": "m", "max_tokens": 300, "max_completion_tokens": 9000}),
        );
        assert_eq!(out["max_tokens"], 300);
        assert!(out.get("max_completion_tokens").is_none());
        let out = rewritten(serde_json::json!({"model": "m", "max_completion_tokens": 7, "n": 4}));
        assert_eq!(out["max_tokens"], 7);
        assert!(out.get("n").is_none());
    }

    #[test]
    fn nonsense_is_refused() {
        let gw = gateway();
        let rewrite = |body: &[u8]| rewrite(&gw, body);
        assert!(rewrite(b"[1,2]").is_err());
        assert!(rewrite(b"not json").is_err());
        assert!(rewrite(br#"{"model":"m","max_tokens":-1}"#).is_err());
        assert!(rewrite(br#"{"model":"m","max_tokens":0}"#).is_err());
        assert!(rewrite(br#"{"model":"m","max_tokens":"many"}"#).is_err());
    }
}
