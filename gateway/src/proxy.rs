//! The request path: read the body once, parse only what routing needs,
//! pick an endpoint, forward the original bytes, and stream the answer back.
//! A failure before the first byte is retried on another endpoint; after
//! it, the stream ends with an error (a retry could duplicate output).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;

use crate::{ApiError, Gateway};

pub(crate) const SERVED_MODEL: &str = "x-llmgw-served-model";

/// The fields routing reads; everything else is forwarded untouched.
#[derive(Debug, Deserialize)]
struct Head {
    model: Option<String>,
}

pub(crate) async fn forward(
    State(gw): State<Arc<Gateway>>,
    uri: Uri,
    request: Request,
) -> Response {
    let path = uri.path().to_owned();
    match route(&gw, &path, request).await {
        Ok(r) => r,
        Err((model, e)) => {
            gw.metrics.request(&model, e.status.as_u16());
            e.into_response()
        }
    }
}

async fn route(
    gw: &Arc<Gateway>,
    path: &str,
    request: Request,
) -> Result<Response, (String, ApiError)> {
    let limit = gw.config.body_limit;
    let unknown = || String::from("-");
    let body = axum::body::to_bytes(request.into_body(), limit)
        .await
        .map_err(|_| (unknown(), ApiError::too_large(limit)))?;
    let head: Head = serde_json::from_slice(&body).map_err(|e| {
        (
            unknown(),
            ApiError::bad_request(format!("the body is not valid JSON: {e}")),
        )
    })?;
    let model = head
        .model
        .filter(|m| !m.is_empty())
        .ok_or_else(|| (unknown(), ApiError::bad_request("missing field `model`")))?;
    if !gw.endpoints.knows_model(&model) {
        return Err((model.clone(), ApiError::unknown_model(&model)));
    }
    let mut tried: Vec<String> = Vec::new();
    let mut last_error = None;
    for _ in 0..=gw.config.retries {
        let Some(flight) = gw.endpoints.pick(&model, &tried) else {
            break;
        };
        let endpoint = flight.endpoint().clone();
        tried.push(endpoint.spec.id.clone());
        let sent = gw
            .client
            .post(format!("{}{path}", endpoint.spec.url))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
            .await;
        let upstream = match sent {
            Ok(r) if r.status().is_server_error() => {
                endpoint.record(false);
                last_error = Some(format!(
                    "endpoint {} answered {}",
                    endpoint.spec.id,
                    r.status()
                ));
                continue;
            }
            Ok(r) => r,
            Err(e) => {
                endpoint.record(false);
                tracing::warn!(endpoint = %endpoint.spec.id, error = %e, "upstream request failed; trying another endpoint");
                last_error = Some(format!("endpoint {} is unreachable", endpoint.spec.id));
                continue;
            }
        };
        endpoint.record(true);
        let status =
            StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        gw.metrics.request(&model, status.as_u16());
        let content_type = upstream
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .cloned();
        // The stream owns the in-flight count: it ends when the body ends
        // or the client goes away (which drops the upstream request too).
        let stream = upstream.bytes_stream().map(move |chunk| {
            let _held = &flight;
            chunk.map_err(|e| {
                flight.endpoint().record(false);
                std::io::Error::other(e)
            })
        });
        let mut response = Response::new(Body::from_stream(stream));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        if let Some(ct) = content_type.and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok()) {
            headers.insert(header::CONTENT_TYPE, ct);
        }
        if let Ok(v) = HeaderValue::from_str(&model) {
            headers.insert(SERVED_MODEL, v);
        }
        return Ok(response);
    }
    let error = match last_error {
        Some(why) => ApiError::upstream(format!("no endpoint answered: {why}")),
        None => ApiError::no_capacity(&model),
    };
    Err((model, error))
}

pub(crate) async fn models(State(gw): State<Arc<Gateway>>) -> Response {
    let data: Vec<_> = gw
        .endpoints
        .routable_models()
        .into_iter()
        .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "llmgw"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

pub(crate) async fn ready(State(gw): State<Arc<Gateway>>) -> Response {
    if gw.endpoints.routable_models().is_empty() {
        (StatusCode::SERVICE_UNAVAILABLE, "nothing is routable").into_response()
    } else {
        (StatusCode::OK, Bytes::from_static(b"ready")).into_response()
    }
}
