//! The end of a graceful stop: once the grace period is over, whatever is
//! still in flight is cut, so that a stop is bounded however long a stream
//! would have run. Before that, the listeners have stopped accepting and
//! idle connections have closed (axum's graceful shutdown); requests in
//! flight run on untouched.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;

use crate::listen::Signal;

/// The answer to a request still waiting for its answer at the cut.
pub(crate) fn stopping() -> Response {
    crate::ApiError::stopping().into_response()
}

/// A body of unknown length (a stream) still being sent at the cut ends
/// with an error, so the client sees the connection break rather than a
/// stream that looks complete; an event stream cut between two events
/// first gets an error event saying why (as when its engine dies), which
/// SDKs raise as the server's error rather than a broken connection.
/// Bodies of known length are sent whole.
pub(crate) fn cut_stream(response: Response, cut: &Signal) -> Response {
    if response.body().size_hint().exact().is_some() {
        return response;
    }
    let events = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
    let (parts, body) = response.into_parts();
    let stream = CutStream {
        inner: body.into_data_stream(),
        cut: Some(cut.clone()),
        // Nothing sent yet is a boundary too.
        between_events: events,
        events,
        said: false,
        flushed: false,
    };
    Response::from_parts(parts, Body::from_stream(stream))
}

/// What an event stream is told at the cut: OpenAI's form of an error
/// mid-stream, and no `[DONE]` (the answer is not complete).
const STOPPING_EVENT: &[u8] = b"data: {\"error\":{\"message\":\"the server is stopping and its shutdown grace period is over: the answer was cut; send the request again\",\"type\":\"server_error\",\"code\":\"server_stopping\"}}\n\n";

struct CutStream<S> {
    inner: S,
    /// None once cut: the stream has ended.
    cut: Option<Signal>,
    /// An event stream's last bytes sent ended an event: an event added
    /// there is read whole.
    between_events: bool,
    events: bool,
    /// The stopping event was sent; the error follows once it could be
    /// written (hyper drops what it holds unwritten when a body fails).
    said: bool,
    flushed: bool,
}

impl<S> Stream for CutStream<S>
where
    S: Stream<Item = Result<Bytes, axum::Error>> + Unpin,
{
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(cut) = &self.cut else {
            return Poll::Ready(None);
        };
        if cut.fired() {
            if self.events && self.between_events && !self.said {
                self.said = true;
                return Poll::Ready(Some(Ok(Bytes::from_static(STOPPING_EVENT))));
            }
            if self.said && !self.flushed {
                // One turn of the connection's loop, which flushes what it
                // holds before it polls the body again.
                self.flushed = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.cut = None;
            return Poll::Ready(Some(Err(std::io::Error::other(
                "cut: the shutdown grace period is over",
            ))));
        }
        let polled = Pin::new(&mut self.inner).poll_next(cx);
        if let Poll::Ready(Some(Ok(bytes))) = &polled
            && !bytes.is_empty()
        {
            self.between_events = bytes.ends_with(b"\n\n");
        }
        polled.map(|item| item.map(|r| r.map_err(std::io::Error::other)))
    }
}
