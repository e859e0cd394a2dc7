//! Decisions the pages ask for go to the admin API, served in-process, so
//! that they take the operators' path: decided by the leader (a standby
//! forwards), recorded with who asked, refused with the same reasons.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tower::ServiceExt;

use crate::{Web, WebError};

/// `method path` with `body` (JSON), on behalf of `actor` (a signed-in
/// person's id, recorded as a person, not an operator);
/// the answer's JSON, or the API's refusal as a page error.
pub(crate) async fn call<T: DeserializeOwned>(
    web: &Web,
    method: Method,
    path: &str,
    actor: &str,
    body: Option<&impl Serialize>,
) -> Result<T, WebError> {
    let body = match body {
        Some(b) => {
            Body::from(serde_json::to_vec(b).map_err(|e| WebError::Internal(e.to_string()))?)
        }
        None => Body::empty(),
    };
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .header(llmgw_api::admin::ACTOR_HEADER, actor)
        .header(
            llmgw_api::admin::ACTOR_KIND_HEADER,
            llmgw_api::admin::ACTOR_KIND_PERSON,
        )
        .body(body)
        .map_err(|e| WebError::Internal(e.to_string()))?;
    let response = web
        .admin
        .clone()
        .oneshot(request)
        .await
        .map_err(|e| WebError::Internal(e.to_string()))?;
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .map_err(|e| WebError::Internal(e.to_string()))?;
    if status.is_success() {
        return serde_json::from_slice(&bytes)
            .map_err(|e| WebError::Internal(format!("the admin API's answer: {e}")));
    }
    // The API's refusals are written for people: pass them on.
    let why = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    Err(refusal(status, why))
}

/// The admin API's refusal as the page says it: its words for a refusal
/// of the change (written for people), "try again" when nothing was
/// decided because the leader could not be reached (503: a standby
/// between leaders), our fault otherwise (a 502 may have been decided).
fn refusal(status: StatusCode, why: String) -> WebError {
    match status {
        StatusCode::NOT_FOUND => WebError::NotFound,
        s if s.is_client_error() => WebError::Bad(why),
        StatusCode::SERVICE_UNAVAILABLE => WebError::Unavailable(why),
        _ => WebError::Internal(why),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;

    #[tokio::test]
    async fn a_leader_out_of_reach_is_a_try_again_not_our_fault() {
        let why =
            "this server is a standby: the leader cp-a at http://10.0.0.11:9090 did not answer";
        let page = super::refusal(StatusCode::SERVICE_UNAVAILABLE, why.into()).into_response();
        assert_eq!(page.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = axum::body::to_bytes(page.into_body(), 1 << 20)
            .await
            .unwrap();
        let html = String::from_utf8_lossy(&body);
        assert!(html.contains("try again in a few seconds"), "{html}");
        assert!(
            !html.contains("10.0.0.11"),
            "internal addresses stay in the log: {html}"
        );
    }
}
