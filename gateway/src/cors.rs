//! Cross-origin requests (CORS), when `router.cors_origins` names any: a
//! web page on one of those origins may call the API from a browser with
//! its own key. Browsers ask first (a preflight `OPTIONS` naming the
//! method and headers it will send); the answer says yes for the origins
//! listed, and each answer then carries the origin it may be read by.
//! No credentials are allowed: the API takes keys in a header, and the
//! session cookie of the chat page stays its own origin's.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::{ApiError, Gateway};

/// What a page's script may read of an answer beside the simple headers.
const EXPOSED: HeaderValue = HeaderValue::from_static(
    "x-request-id, retry-after, x-should-retry, x-llmgw-served-model, x-ratelimit-limit-requests, x-ratelimit-remaining-requests, x-ratelimit-reset-requests, x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, x-ratelimit-reset-tokens",
);
const METHODS: HeaderValue = HeaderValue::from_static("GET, POST, DELETE, OPTIONS");
/// How long a browser may keep a preflight's yes: ten minutes.
const MAX_AGE: HeaderValue = HeaderValue::from_static("600");

pub(crate) async fn layer(
    State(gw): State<Arc<Gateway>>,
    request: Request,
    next: Next,
) -> Response {
    let origins = &gw.config.cors_origins;
    let any = origins.iter().any(|o| o == "*");
    let Some(origin) = request
        .headers()
        .get(header::ORIGIN)
        .filter(|o| {
            any || origins
                .iter()
                .any(|allowed| o.as_bytes() == allowed.as_bytes())
        })
        .cloned()
    else {
        // Not a browser's cross-origin call, or an origin not listed: as
        // if CORS were off (the browser then keeps the answer from the
        // page).
        return next.run(request).await;
    };
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight {
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, METHODS);
        // The headers the page will send (its key's Authorization,
        // Content-Type, an SDK's own): whatever it names, as a key in a
        // header is what the API expects.
        if let Some(asked) = request
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        {
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
        }
        h.insert(header::ACCESS_CONTROL_MAX_AGE, MAX_AGE);
        r
    } else {
        next.run(request).await
    };
    let h = response.headers_mut();
    if any {
        h.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
    } else {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        // The answer differs by origin: a cache must not give one
        // origin's to another.
        h.append(header::VARY, HeaderValue::from_static("origin"));
    }
    h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, EXPOSED);
    response
}

/// A browser page may call the API only from an origin
/// `router.cors_origins` names: a request with any other `Origin` is
/// refused before its key is read or its body taken. Without it, any page a
/// person opened could make their browser run generations on a server
/// whose keys are off (a form post or a `text/plain` body needs no
/// preflight), or reach one on their network through a name rebound to
/// it. Clients that are not browsers (SDKs, curl) send no `Origin`. The
/// server's own host is no exception: a rebound name is the page's host
/// and origin alike (and the chat page calls its own path, not the API).
pub(crate) fn foreign_origin(gw: &Gateway, headers: &HeaderMap) -> Option<ApiError> {
    let origin = headers.get(header::ORIGIN)?;
    let allowed =
        (gw.config.cors_origins.iter()).any(|o| o == "*" || o.as_bytes() == origin.as_bytes());
    (!allowed).then(|| ApiError::foreign_origin(&String::from_utf8_lossy(origin.as_bytes())))
}
