use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The gateway's one client-facing error, in the OpenAI envelope
/// `{"error":{"message","type","code"}}`. Messages never carry internals.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: &'static str,
    pub message: String,
    /// Seconds, sent as Retry-After.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_request",
            message,
        )
    }

    pub fn unknown_model(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("The model `{model}` does not exist."),
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("the request body is over {limit} bytes"),
        )
    }

    /// The body did not arrive whole within `connections.body_timeout`.
    pub fn body_timeout(after: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "request_timeout",
            format!(
                "the request body did not arrive within {} s",
                after.as_secs_f64()
            ),
        )
    }

    /// The body broke off (the client went away, or sent a broken chunked
    /// encoding).
    pub fn unreadable_body() -> Self {
        Self::bad_request("the request body could not be read to its end")
    }

    pub fn upstream(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            "upstream_error",
            message,
        )
    }

    pub fn no_capacity(model: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "no_capacity",
            format!("no endpoint can serve `{model}` right now"),
        )
    }

    /// The one answer to a missing, unknown or revoked key.
    pub fn invalid_key() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "Incorrect API key provided.",
        )
    }

    /// A level's requests or tokens per minute are used up: the message
    /// names the level (a team's limit counts all its keys).
    pub fn rate_limited(refusal: crate::limits::Refusal) -> Self {
        use crate::limits::Exceeded;
        let who = format!("{} {}", refusal.scope.name(), refusal.scope_id);
        let group = match refusal.scope {
            llmgw_domain::tenancy::Scope::Key => "",
            _ => " (all its keys together, at this gateway)",
        };
        let (kind, message) = match refusal.exceeded {
            Exceeded::Requests { rpm } => (
                "requests",
                format!(
                    "{who} may make {rpm} requests a minute{group}; retry after the Retry-After seconds"
                ),
            ),
            Exceeded::Tokens { tpm } => (
                "tokens",
                format!(
                    "{who} may use {tpm} tokens a minute{group}; retry after the Retry-After seconds"
                ),
            ),
        };
        ApiError {
            retry_after: Some(refusal.wait.as_secs().max(1)),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                kind,
                "rate_limit_exceeded",
                message,
            )
        }
    }

    /// A budget on the key's way up (key, project, team or org) is spent
    /// for its period.
    pub fn budget_spent(scope: &str, id: &str, period: &str) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "insufficient_quota",
            "insufficient_quota",
            format!(
                "the {period} budget of {scope} {id} is spent; it renews with the next {period}"
            ),
        )
    }

    /// A budget is not spent yet, but has less left than this request may
    /// cost (its prompt and the completion it allows itself).
    pub fn budget_short(scope: &str, id: &str, period: &str, left_micros: u64) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "insufficient_quota",
            "insufficient_quota",
            format!(
                "the {period} budget of {scope} {id} has {left_micros} micro-units left, \
                 less than this request may cost; ask for fewer tokens, or wait for the next {period}"
            ),
        )
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            message,
        )
    }

    pub fn overloaded(band: &str) -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "overloaded",
                format!(
                    "the models are busy; requests of band {band} are held back, retry shortly"
                ),
            )
        }
    }

    fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            kind,
            code,
            message: message.into(),
            retry_after: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            json!({ "error": { "message": self.message, "type": self.kind, "code": self.code } });
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        response
    }
}
