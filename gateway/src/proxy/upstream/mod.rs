//! The proxy hop's HTTP client: the gateway's request to an engine on the
//! proxied paths, and the answer as an `http::Response`.
//!
//! A plain-http endpoint is sent to over HTTP/1.1 connections of our own
//! pool ([`pool`]), each polled by the task whose request it carries,
//! without reqwest's layers: its retry layer and its redirect layer (which
//! re-parsed every answer's URL) were ~11% of a saturated gateway. llmgw
//! retries by its own rules ([`super::forward`]), and an engine has no
//! reason to redirect: a 3xx is relayed to the client as the engine's
//! answer, never followed. The settings are those reqwest's client had:
//! the connect timeout over resolution and connection, TCP_NODELAY, TCP
//! keepalive 15 s (3 probes 15 s apart), idle connections kept 90 s, no
//! proxy, `Accept: */*`.
//!
//! Any other URL (https, credentials in the URL, one `http::Uri` refuses)
//! is sent by reqwest as before, with TLS as this build of reqwest has it,
//! and redirects not followed either.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, InvalidHeaderValue};
use axum::http::{HeaderValue, Method, Request, Response, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;

use crate::Endpoint;

mod pool;

/// An engine's answer's body, whichever client fetched it.
pub(crate) type Body = UnsyncBoxBody<Bytes, Error>;

/// reqwest's defaults, which the hop had until it had its own client.
const KEEPALIVE: Duration = Duration::from_secs(15);
const KEEPALIVE_RETRIES: u32 = 3;

/// Why an engine's answer did not come (or broke off).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// No connection: refused, unreachable, or timed out.
    #[error("connecting: {}", chain(&**.0))]
    Connect(Box<dyn std::error::Error + Send + Sync>),
    /// No answer's head: the connection was lost.
    #[error("{}", chain(.0))]
    Send(hyper::Error),
    /// The answer's body broke off.
    #[error("{}", chain(.0))]
    Body(hyper::Error),
    #[error("the endpoint's API key is not a header value: {0}")]
    Key(InvalidHeaderValue),
    /// Either, from reqwest's client (see the module's comment).
    #[error(transparent)]
    Reqwest(#[from] reqwest::Error),
}

/// An error and its sources: hyper's own message is only the kind
/// ("connection error"), the why is in the sources.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[derive(Debug, thiserror::Error)]
#[error("connecting timed out after {0:?}")]
struct ConnectTimedOut(Duration);

/// Both clients of the hop.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    plain: std::sync::Arc<pool::Pool>,
    other: reqwest::Client,
}

impl Client {
    pub(crate) fn new(connect_timeout: Duration) -> Result<Self, reqwest::Error> {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        http.set_keepalive(Some(KEEPALIVE));
        http.set_keepalive_interval(Some(KEEPALIVE));
        http.set_keepalive_retries(Some(KEEPALIVE_RETRIES));
        let plain = pool::Pool::new(Connector {
            http,
            timeout: connect_timeout,
        });
        let other = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .tcp_nodelay(true)
            // Engines are reached directly: an HTTP_PROXY set for the
            // machine's way out (weights, packages) must not catch them.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Client { plain, other })
    }

    /// POSTs `body` to `path` on `endpoint` with the client's request id
    /// (the engine logs it, so one grep follows a request) and the
    /// upstream's key if it has one.
    pub(crate) async fn send(
        &self,
        endpoint: &Endpoint,
        path: &str,
        id: &crate::access::RequestId,
        body: Bytes,
    ) -> Result<Response<Body>, Error> {
        let request_id = &id.value;
        let Some(target) = endpoint.target(path) else {
            let mut r = self
                .other
                .post(format!("{}{path}", endpoint.spec.url))
                .header(CONTENT_TYPE, "application/json")
                .header(crate::access::REQUEST_ID, request_id.clone())
                .header(HOP, onward(id.via()))
                .body(body);
            if let Some(key) = &endpoint.spec.api_key {
                r = r.bearer_auth(key.expose());
            }
            let answer = Response::from(r.send().await?);
            return Ok(answer.map(|b| b.map_err(Error::Reqwest).boxed_unsync()));
        };
        let uri = &target.uri;
        let (Some(address), Some(path)) = (uri.authority(), uri.path_and_query()) else {
            unreachable!("Endpoint::target is absolute");
        };
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        // On the connection, the origin-form: the path alone.
        *request.uri_mut() = Uri::from(path.clone());
        let headers = request.headers_mut();
        headers.insert(HOST, target.host.clone());
        headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(crate::access::REQUEST_ID, request_id.clone());
        headers.insert(HOP, onward(id.via()));
        if let Some(key) = &endpoint.spec.api_key {
            let mut bearer =
                HeaderValue::try_from(format!("Bearer {}", key.expose())).map_err(Error::Key)?;
            bearer.set_sensitive(true);
            headers.insert(AUTHORIZATION, bearer);
        }
        let answer = self.plain.send(address, uri, request).await?;
        Ok(answer.map(|b| b.map_err(Error::Body).boxed_unsync()))
    }
}

/// Marks what this gateway sends an engine, so that a request that comes
/// back to it (an endpoint that names the gateway's own address, or one of
/// another gateway that names this one) is told apart and refused, not
/// forwarded round until connections run out. The value is the marks of
/// every gateway the request passed, comma-separated, this one's last.
pub(crate) const HOP: axum::http::HeaderName = axum::http::HeaderName::from_static("x-llmgw-hop");

/// More gateways than this in a row is taken for a loop whose marks are
/// lost (a proxy between that drops or rewrites the header would hide it
/// from the check of marks alone only if it kept a growing chain, so this
/// bounds what a client can make a gateway carry too).
const MOST_HOPS: usize = 8;

/// Whether a request that came with `via` (its `x-llmgw-hop`) has been
/// here before, or through more gateways than any sane chain.
pub(crate) fn came_back(via: Option<&HeaderValue>) -> bool {
    let Some(via) = via else {
        return false;
    };
    let mine = hop().as_bytes();
    let mut marks = 0;
    for mark in via.as_bytes().split(|b| *b == b',') {
        marks += 1;
        if mark.trim_ascii() == mine || marks >= MOST_HOPS {
            return true;
        }
    }
    false
}

/// What this gateway sends on: the marks it was given, then its own.
fn onward(via: Option<&HeaderValue>) -> HeaderValue {
    let Some(via) = via else {
        return hop().clone();
    };
    let mut chain = Vec::with_capacity(via.len() + 2 + hop().len());
    chain.extend_from_slice(via.as_bytes());
    chain.extend_from_slice(b", ");
    chain.extend_from_slice(hop().as_bytes());
    HeaderValue::from_bytes(&chain).unwrap_or_else(|_| hop().clone())
}

/// This process's mark: random, so that one gateway in front of another is
/// no loop.
pub(crate) fn hop() -> &'static HeaderValue {
    static HOP_VALUE: std::sync::OnceLock<HeaderValue> = std::sync::OnceLock::new();
    HOP_VALUE.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        HeaderValue::from(h.finish())
    })
}

/// The connector with reqwest's connect timeout: over name resolution and
/// connecting both (the connector's own bounds only the connecting).
#[derive(Debug, Clone)]
struct Connector {
    http: HttpConnector,
    timeout: Duration,
}

type Connecting = Pin<
    Box<
        dyn Future<
                Output = Result<
                    hyper_util::rt::TokioIo<tokio::net::TcpStream>,
                    Box<dyn std::error::Error + Send + Sync>,
                >,
            > + Send,
    >,
>;

impl tower_service::Service<Uri> for Connector {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.http.call(uri);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(connected) => connected.map_err(Into::into),
                Err(_) => Err(ConnectTimedOut(timeout).into()),
            }
        })
    }
}
