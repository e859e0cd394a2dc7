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
    /// A method the address does not take (see [`wrong_method`]).
    #[error("{0}")]
    Method(&'static str),
    /// The leader, which decides every change, could not be reached (a
    /// standby between leaders, say); the reason is logged, not shown
    /// (it names internal addresses).
    #[error(
        "the change could not be made just now (the cluster's leader did not answer, or is being elected): try again in a few seconds"
    )]
    Unavailable(String),
    /// The people tables (accounts, sessions) could not be read or
    /// written: the store is unreachable. Not "signed out": a signed-in
    /// person sent to `/login` thought their session gone, and signing in
    /// answered a bare 500. The reason is logged, not shown.
    #[error(
        "the account store cannot be reached just now, so this server cannot tell who you are or sign you in; nothing about your account has changed: try again in a minute"
    )]
    StoreDown(String),
    /// Something on our side; logged where it is turned into a response.
    #[error("{0}")]
    Internal(String),
}

impl WebError {
    /// A people error that is not the visitor's to mend: the store
    /// unreachable (a 503 that says so), or ours.
    pub(crate) fn people(doing: &str, e: llmgw_people::PeopleError) -> WebError {
        match e {
            llmgw_people::PeopleError::Store(why) => WebError::StoreDown(format!("{doing}: {why}")),
            other => WebError::Internal(format!("{doing}: {other}")),
        }
    }
}

impl WebError {
    /// Logs what the visitor is not shown (our side's reasons), once,
    /// where the error becomes an answer.
    pub(crate) fn log(&self) {
        match self {
            WebError::Unavailable(why) => {
                tracing::warn!(error = %why, "a page's change could not reach the leader");
            }
            WebError::StoreDown(why) => {
                tracing::error!(error = %why, "a page could not reach the account store");
            }
            WebError::Internal(why) => tracing::error!(error = %why, "a page failed"),
            _ => {}
        }
    }
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        self.log();
        let status = match &self {
            WebError::NotFound => StatusCode::NOT_FOUND,
            WebError::Csrf => StatusCode::FORBIDDEN,
            WebError::SignIn => {
                let mut response = (
                    StatusCode::SEE_OTHER,
                    [(axum::http::header::LOCATION, "/login")],
                )
                    .into_response();
                // [`dressed`] knows the page that was asked for, and adds
                // it for the sign-in to return to.
                response.extensions_mut().insert(SignInFirst);
                return response;
            }
            WebError::Bad(_) => StatusCode::UNPROCESSABLE_ENTITY,
            WebError::Method(_) => StatusCode::METHOD_NOT_ALLOWED,
            WebError::Unavailable(_) | WebError::StoreDown(_) => StatusCode::SERVICE_UNAVAILABLE,
            WebError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let text = match &self {
            WebError::Internal(_) => "something went wrong on our side".to_owned(),
            other => other.to_string(),
        };
        let mut response = page(crate::Chrome::default(), status, text.clone(), None);
        // Dressed in the visitor's navigation by [`dressed`], which knows
        // who asked.
        response.extensions_mut().insert(Refusal { status, text });
        response
    }
}

/// A visit to an address that only receives forms (a link to
/// `/profile/password`, say), or a form sent to a page: a 405 as a page in
/// the site's chrome, where it was an empty answer a browser shows blank.
pub(crate) async fn wrong_method(method: axum::http::Method) -> WebError {
    WebError::Method(
        if method == axum::http::Method::GET || method == axum::http::Method::HEAD {
            "this address receives a form sent from one of the pages and has nothing to show: go back to the page the form is on"
        } else {
            "this page cannot receive that request"
        },
    )
}

/// A redirect to `/login` that [`dressed`] may point back at the page.
#[derive(Debug, Clone, Copy)]
struct SignInFirst;

/// What a refusal said, for [`dressed`] to render again.
#[derive(Debug, Clone)]
struct Refusal {
    status: StatusCode,
    text: String,
}

fn page(
    chrome: crate::Chrome,
    status: StatusCode,
    text: String,
    request_id: Option<String>,
) -> Response {
    let page = crate::chrome::ErrorPage {
        chrome,
        status: status.as_u16(),
        text,
        request_id,
    };
    match askama::Template::render(&page) {
        Ok(html) => (status, Html(html)).into_response(),
        Err(_) => (status, "error").into_response(),
    }
}

/// An error page with the navigation of whoever asked (a signed-in person
/// kept their menu and sign-out; the admin listener its read-only view),
/// where the error alone cannot know who that is. Only an error pays for
/// finding out.
pub(crate) async fn dressed(
    axum::extract::State(web): axum::extract::State<std::sync::Arc<crate::Web>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let viewer = request.extensions().get::<crate::Viewer>().cloned();
    let request_id = request_id(&request);
    let mut cookies = axum::http::HeaderMap::new();
    for c in request.headers().get_all(axum::http::header::COOKIE) {
        cookies.append(axum::http::header::COOKIE, c.clone());
    }
    // Only a page can be returned to: a form's post, asked again as a GET,
    // would not be there.
    let asked = (request.method() == axum::http::Method::GET)
        .then(|| request.uri().path_and_query().map(|p| p.to_string()))
        .flatten();
    let mut response = next.run(request).await;
    if response.extensions_mut().remove::<SignInFirst>().is_some() {
        if let Some(location) = asked
            .and_then(|page| crate::pages::local_path(&page).map(crate::pages::login_to_return))
            .and_then(|l| axum::http::HeaderValue::from_str(&l).ok())
        {
            response
                .headers_mut()
                .insert(axum::http::header::LOCATION, location);
        }
        return response;
    }
    let Some(refusal) = response.extensions_mut().remove::<Refusal>() else {
        return response;
    };
    let chrome = match viewer {
        Some(v) => crate::Chrome::for_viewer(&web, &v),
        // A 503 (the store down, or too busy): asking the store again who
        // is signed in would wait as long as the handler's ask did, or
        // add to the load.
        None if refusal.status == axum::http::StatusCode::SERVICE_UNAVAILABLE => {
            crate::Chrome::unsure(&web)
        }
        None => match crate::session::resolve(&web, &cookies).await {
            Ok(visitor) => crate::Chrome::for_visitor(&web, &visitor),
            // The store is down (the refusal itself says so, and was
            // logged): neither signed in nor out.
            Err(_) => crate::Chrome::unsure(&web),
        },
    };
    let (dressed, body) = page(chrome, refusal.status, refusal.text, request_id).into_parts();
    // What the handler set beside its page (cookies, headers) stays.
    let (mut parts, _) = response.into_parts();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    if let Some(kind) = dressed.headers.get(axum::http::header::CONTENT_TYPE) {
        parts
            .headers
            .insert(axum::http::header::CONTENT_TYPE, kind.clone());
    }
    Response::from_parts(parts, body)
}

/// The id the client listener gave the request, which its answer carries
/// in `x-request-id` and every log line about it names: an error page
/// shows it, so that a person can quote it to whoever runs the server.
/// `None` on the admin listener, which gives none.
fn request_id(request: &axum::extract::Request) -> Option<String> {
    llmgw_gateway::RequestId::of(request).map(|id| id.as_str().to_owned())
}

/// Renders a template into a page response.
pub(crate) fn render(t: &impl askama::Template) -> Result<Response, WebError> {
    t.render()
        .map(|html| Html(html).into_response())
        .map_err(|e| WebError::Internal(format!("rendering a page: {e}")))
}
