//! The one error of the pages' surface, and rendering.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub(crate) enum WebError {
    /// Missing, foreign, or not for this visitor: one answer for all.
    #[error("not found")]
    NotFound,
    /// A form without this session's token.
    #[error("this form has expired; reload the page and try again")]
    Csrf,
    /// Sign in first (answered with a redirect to /login).
    #[error("sign in first")]
    SignIn,
    #[error("{0}")]
    Bad(String),
    /// The leader, which decides every change, could not be reached (a
    /// standby between leaders, say); the reason is logged, not shown
    /// (it names internal addresses).
    #[error(
        "the change could not be made just now (the cluster's leader did not answer, or is being elected): try again in a few seconds"
    )]
    Unavailable(String),
    /// Something on our side; logged where it is turned into a response.
    #[error("{0}")]
    Internal(String),
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let status = match &self {
            WebError::NotFound => StatusCode::NOT_FOUND,
            WebError::Csrf => StatusCode::FORBIDDEN,
            WebError::SignIn => {
                return (
                    StatusCode::SEE_OTHER,
                    [(axum::http::header::LOCATION, "/login")],
                )
                    .into_response();
            }
            WebError::Bad(_) => StatusCode::UNPROCESSABLE_ENTITY,
            WebError::Unavailable(why) => {
                tracing::warn!(error = %why, "a page's change could not reach the leader");
                StatusCode::SERVICE_UNAVAILABLE
            }
            WebError::Internal(why) => {
                tracing::error!(error = %why, "a page failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let text = match &self {
            WebError::Internal(_) => "something went wrong on our side".to_owned(),
            other => other.to_string(),
        };
        let page = crate::chrome::ErrorPage {
            chrome: crate::Chrome::default(),
            status: status.as_u16(),
            text,
        };
        match askama::Template::render(&page) {
            Ok(html) => (status, Html(html)).into_response(),
            Err(_) => (status, "error").into_response(),
        }
    }
}

/// Renders a template into a page response.
pub(crate) fn render(t: &impl askama::Template) -> Result<Response, WebError> {
    t.render()
        .map(|html| Html(html).into_response())
        .map_err(|e| WebError::Internal(format!("rendering a page: {e}")))
}
