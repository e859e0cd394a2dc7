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
/// stream that looks complete. Bodies of known length are sent whole.
pub(crate) fn cut_stream(response: Response, cut: &Signal) -> Response {
    if response.body().size_hint().exact().is_some() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let stream = CutStream {
        inner: body.into_data_stream(),
        cut: Some(cut.clone()),
    };
    Response::from_parts(parts, Body::from_stream(stream))
}

struct CutStream<S> {
    inner: S,
    /// None once cut: the stream has ended.
    cut: Option<Signal>,
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
            self.cut = None;
            return Poll::Ready(Some(Err(std::io::Error::other(
                "cut: the shutdown grace period is over",
            ))));
        }
        Pin::new(&mut self.inner)
            .poll_next(cx)
            .map(|item| item.map(|r| r.map_err(std::io::Error::other)))
    }
}
