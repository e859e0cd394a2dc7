use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The gateway's one client-facing error, in the OpenAI envelope
/// `{"error":{"message","type","param","code"}}`. Messages never carry
/// internals.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: &'static str,
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<&'static str>,
    /// Seconds, sent as Retry-After.
    /// (u32: a day is 86,400; it keeps the error small.)
    pub retry_after: Option<u32>,
    /// Sent as `x-should-retry: false`: OpenAI's SDKs otherwise retry
    /// every 429, and a spent budget does not come back in seconds.
    pub final_answer: bool,
    /// Sent as `x-ratelimit-*`: the limit a 429 met, none of it left.
    /// Boxed: only a 429 has it, and every other error stays small.
    pub ratelimit: Option<Box<crate::limits::Headroom>>,
}

/// When to ask again for an on-demand model that was not ready: often
/// enough to be served soon after it is, rarely enough not to pile up.
const ON_DEMAND_RETRY_S: u32 = 10;

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
        ApiError {
            param: Some("model"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                format!("The model `{model}` does not exist."),
            )
        }
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

    /// Every endpoint tried answered a server error of its own (none
    /// served the request): the engine's status, what it said, and when
    /// it says to come back (a busy engine's 503).
    pub fn engine_said(status: StatusCode, message: String, retry_after: Option<u32>) -> Self {
        let code = if status == StatusCode::SERVICE_UNAVAILABLE {
            "engine_busy"
        } else {
            "engine_error"
        };
        let message = if message.is_empty() {
            format!(
                "the engine answered {status}; the x-request-id header names this request to the operator"
            )
        } else {
            format!("the engine answered {status}: {message}")
        };
        ApiError {
            retry_after,
            ..Self::new(status, "server_error", code, message)
        }
    }

    /// Endpoints were tried and the last did not answer in time.
    pub fn upstream_timeout(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "server_error",
            "upstream_timeout",
            message,
        )
    }

    /// A model no node of the cluster could take (its labels, GPU classes
    /// and counts, memory): an on-demand one asked for, or one kept up
    /// that has no replica. No wait helps, so none is made. Which nodes
    /// refuse it and why is the operator's to read, not the client's.
    pub fn fits_nowhere(model: &str, on_demand: bool) -> Self {
        let what = match on_demand {
            true => "is started on demand, but",
            false => "has no replica:",
        };
        ApiError {
            // Nodes may yet join (a cluster coming up): a retry is cheap.
            retry_after: Some(ON_DEMAND_RETRY_S),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "model_unplaceable",
                format!(
                    "`{model}` {what} no node of this cluster can take it; the operator sees why with `llmgw ctl explain-placement {model}`"
                ),
            )
        }
    }

    /// An on-demand model asked for whose engine failed to start: the
    /// control plane holds it back `wait` before the next start. Why it
    /// failed is the operator's to read (an engine's flags, a path), not
    /// the client's.
    pub fn start_failed(model: &str, wait: std::time::Duration) -> Self {
        ApiError {
            retry_after: Some(secs(wait).max(1)),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "model_start_failed",
                format!(
                    "`{model}` is started on demand, but its engine failed to start; the next try is in {} s: retry then (`llmgw ctl models` tells the operator why)",
                    wait.as_secs_f64().ceil()
                ),
            )
        }
    }

    /// An on-demand model asked for was not serving within
    /// `router.on_demand_wait`: it may still be starting (a large one
    /// loads for minutes), or fit on no node; it is kept up for its idle
    /// time once it serves.
    pub fn not_ready(model: &str, waited: std::time::Duration) -> Self {
        ApiError {
            retry_after: Some(ON_DEMAND_RETRY_S),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "model_not_ready",
                format!(
                    "`{model}` is started on demand and was not serving within {} s (router.on_demand_wait); it may still be starting: retry later (`llmgw ctl explain-placement {model}` tells the operator whether it fits)",
                    waited.as_secs_f64()
                ),
            )
        }
    }

    /// `retry_after`: when capacity may be back (an open breaker's cool
    /// down), so that clients do not give up after their first quick
    /// retries.
    pub fn no_capacity(model: &str, retry_after: std::time::Duration) -> Self {
        ApiError {
            retry_after: Some(secs(retry_after)),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "no_capacity",
                format!("no endpoint can serve `{model}` right now"),
            )
        }
    }

    /// A graceful stop's cut: the request was not answered.
    pub fn stopping() -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "server_stopping",
                "the server is stopping; send the request again",
            )
        }
    }

    /// A path of the API that does not exist.
    pub fn unknown_route(method: &axum::http::Method, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown_url",
            format!("Unknown request URL: {method} {path}."),
        )
    }

    /// A path of the API asked with a method it does not take.
    pub fn wrong_method(method: &axum::http::Method, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_supported",
            format!("{path} does not take {method} requests."),
        )
    }

    /// A request this gateway sent an engine came back to it: an
    /// endpoint names the gateway's own address.
    pub fn loop_detected() -> Self {
        Self::new(
            StatusCode::LOOP_DETECTED,
            "server_error",
            "loop_detected",
            "an endpoint of this gateway, or of a gateway it forwards to, points back at the gateway itself: the request came back to it instead of reaching an engine; the operator should check the endpoints' URLs",
        )
    }

    /// A browser page on an origin `router.cors_origins` does not name.
    pub fn foreign_origin(origin: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            "origin_refused",
            format!(
                "requests from the origin {origin:?} are refused: a web page may call this API only from an origin router.cors_origins names"
            ),
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
        let none_left = crate::limits::Left {
            limit: 0,
            remaining: 0,
            reset: refusal.wait,
        };
        let ratelimit = match refusal.exceeded {
            Exceeded::Requests { rpm } => crate::limits::Headroom {
                requests: Some(crate::limits::Left {
                    limit: u64::from(rpm),
                    ..none_left
                }),
                tokens: None,
            },
            Exceeded::Tokens { tpm } => crate::limits::Headroom {
                requests: None,
                tokens: Some(crate::limits::Left {
                    limit: u64::from(tpm),
                    ..none_left
                }),
            },
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
            retry_after: Some(secs(refusal.wait)),
            ratelimit: Some(Box::new(ratelimit)),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                kind,
                "rate_limit_exceeded",
                message,
            )
        }
    }

    /// A budget refusal: 429 `insufficient_quota`, final (no other
    /// endpoint or retry changes it).
    fn quota(message: String) -> Self {
        ApiError {
            final_answer: true,
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "insufficient_quota",
                "insufficient_quota",
                message,
            )
        }
    }

    /// A budget on the key's way up (key, project, team or org) is spent
    /// for its period.
    pub fn budget_spent(scope: &str, id: &str, period: &str) -> Self {
        Self::quota(format!(
            "the {period} budget of {scope} {id} is spent; it renews with the next {period}"
        ))
    }

    /// A budget of nothing: only free models, for good (it never renews
    /// into anything).
    pub fn budget_none(scope: &str, id: &str) -> Self {
        Self::quota(format!(
            "{scope} {id} has a budget of 0: it may use only models priced 0"
        ))
    }

    /// A budget is not spent yet, but has less left than this request may
    /// cost (its prompt and the completion it allows itself).
    /// `unset`: the request set no `max_tokens`, so it may cost as much
    /// as 4,096 completion tokens.
    pub fn budget_short(
        scope: &str,
        id: &str,
        period: &str,
        left_micros: u64,
        unset: bool,
    ) -> Self {
        let fewer = if unset {
            "set a completion limit, max_tokens (max_output_tokens on /v1/responses): a request without one is counted at 4,096 completion tokens"
        } else {
            "ask for fewer tokens"
        };
        Self::quota(format!(
            "the {period} budget of {scope} {id} has {left_micros} micro-units left, \
             less than this request may cost; {fewer}, or wait for the next {period}"
        ))
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

    /// An error of its own kind and code, retried as any (no Retry-After).
    pub fn new(
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
            param: None,
            retry_after: None,
            final_answer: false,
            ratelimit: None,
        }
    }
}

/// Whole seconds to wait, rounded up and at least one: a client that
/// waits what `Retry-After` says must find the request passes (rounded
/// down, it came back a moment early to a second 429), and the header
/// agrees with `x-ratelimit-reset-*`, which rounds up too.
fn secs(d: std::time::Duration) -> u32 {
    let up = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    u32::try_from(up.max(1)).unwrap_or(u32::MAX)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        } });
        let mut response = (self.status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        if let Some(s) = self.retry_after {
            headers.insert(axum::http::header::RETRY_AFTER, s.into());
        }
        if self.final_answer {
            headers.insert(
                axum::http::HeaderName::from_static("x-should-retry"),
                axum::http::HeaderValue::from_static("false"),
            );
        }
        if let Some(room) = self.ratelimit {
            crate::limits::write_headroom(headers, *room);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// Waiting what Retry-After says is enough: never a moment short.
    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(super::secs(Duration::from_millis(59_200)), 60);
        assert_eq!(super::secs(Duration::from_secs(5)), 5);
        assert_eq!(super::secs(Duration::from_millis(300)), 1);
        assert_eq!(super::secs(Duration::ZERO), 1);
    }
}
