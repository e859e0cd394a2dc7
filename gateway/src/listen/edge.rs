//! What every request of a listener goes through before its route and
//! after it, as one service around the router: the request's id and span
//! (client listener), the body's deadline ([`super::body`]) and the cut
//! at the end of a stop's grace ([`crate::shutdown`]).
//!
//! One service, not three `axum::middleware::from_fn` layers: each such
//! layer clones the service under it and boxes a future per request, and
//! the three cost about a fifth of a saturated gateway's CPU per request
//! (docs/benchmarks.md).

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::response::Response;
use tower_service::Service;
use tracing::Instrument;

use super::{Signal, body};
use crate::{access, shutdown};

/// A listener's router with what goes around it.
#[derive(Debug, Clone)]
pub(crate) struct Edge {
    pub(crate) router: Router,
    /// Fires when a stop's grace is over.
    pub(crate) cut: Signal,
    /// A request body must arrive whole within this of its headers.
    pub(crate) body_timeout: Option<Duration>,
    /// Give each request an id and a span (the client listener).
    pub(crate) request_ids: bool,
    /// The connection's peer, which every request on it came from (set
    /// by the serving loop on the connection's own copy).
    pub(crate) peer: Option<std::net::IpAddr>,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl<B> Service<Request<B>> for Edge
where
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<Request>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, request: Request<B>) -> Answer {
        let mut request = request.map(Body::new);
        let (span, id) = match self.request_ids {
            true => {
                let (span, id) = access::open(&mut request, self.peer);
                (span, Some(id))
            }
            false => (tracing::Span::none(), None),
        };
        // Inference writes its own, fuller line; anything else on the
        // client listener gets a plain one here.
        let plain = (self.request_ids && access::plain_line(request.uri().path()))
            .then(|| access::Plain::start(&request));
        if self.cut.fired() {
            return Box::pin(std::future::ready(Ok(with_id(shutdown::stopping(), id))));
        }
        let (request, late) = body::limit(request, self.body_timeout);
        let answer = {
            let _in = span.enter();
            self.router.call(request)
        };
        let cut = self.cut.clone();
        let answered = async move {
            let mut answer = std::pin::pin!(answer);
            // Read on every poll, never waited on: the connection's task,
            // which polls this, is woken at the cut.
            let answered = poll_fn(|cx| {
                if cut.fired() {
                    return Poll::Ready(None);
                }
                answer.as_mut().poll(cx).map(Some)
            })
            .await;
            let response = match answered {
                Some(Ok(r)) => shutdown::cut_stream(r, &cut),
                Some(Err(never)) => match never {},
                None => shutdown::stopping(),
            };
            let response = match &late {
                Some(late) => late.settle(response),
                None => response,
            };
            if let Some(plain) = plain {
                plain.finish(&response);
            }
            Ok(with_id(response, id))
        };
        Box::pin(answered.instrument(span))
    }
}

/// The answer with the request's id, where it has one.
fn with_id(mut response: Response, id: Option<HeaderValue>) -> Response {
    if let Some(id) = id {
        response.headers_mut().insert(access::REQUEST_ID, id);
    }
    response
}
