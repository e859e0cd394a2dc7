//! A request body has a deadline: from its headers, `body_timeout` to
//! arrive whole. A client that starts a body and stalls (slowloris) gets
//! 408 and the connection closed, rather than holding a task and a
//! connection slot for as long as it likes.
//!
//! The body is not buffered here: the handler reads it as before, and a
//! read past the deadline fails with [`BodyTimedOut`]. Whatever the handler
//! then answered, the client is told 408.

use std::error::Error;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::Frame;
use tokio::time::Sleep;

use crate::ApiError;

/// The error a body read past its deadline fails with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyTimedOut(pub(crate) Duration);

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive within {} s",
            self.0.as_secs_f64()
        )
    }
}

impl Error for BodyTimedOut {}

/// Whether `e`, or anything that caused it, is a `T`.
pub(crate) fn caused_by<'a, T: Error + 'static>(e: &'a (dyn Error + 'static)) -> Option<&'a T> {
    let mut at = Some(e);
    while let Some(e) = at {
        if let Some(t) = e.downcast_ref::<T>() {
            return Some(t);
        }
        at = e.source();
    }
    None
}

/// Why reading a request body to its end failed, as the client is told.
pub(crate) fn body_refusal(e: &axum::Error, limit: usize) -> ApiError {
    if let Some(t) = caused_by::<BodyTimedOut>(e) {
        return ApiError::body_timeout(t.0);
    }
    if caused_by::<http_body_util::LengthLimitError>(e).is_some() {
        return ApiError::too_large(limit);
    }
    ApiError::unreadable_body()
}

/// The body's deadline, for [`deadline`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyDeadline(pub(crate) Duration);

/// Puts the deadline on every request's body; answers 408 (and closes
/// the connection) when the handler's read ran past it.
pub(crate) async fn deadline(
    State(BodyDeadline(after)): State<BodyDeadline>,
    request: Request,
    next: Next,
) -> Response {
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let late = Arc::new(AtomicBool::new(false));
    let request = request.map(|inner| {
        Body::new(Timed {
            inner,
            after,
            timer: Some(Box::pin(tokio::time::sleep(after))),
            late: late.clone(),
        })
    });
    let mut response = next.run(request).await;
    if late.load(Ordering::Relaxed) {
        if response.status() != StatusCode::REQUEST_TIMEOUT {
            response = ApiError::body_timeout(after).into_response();
        }
        // The rest of the body is unread: the connection cannot carry
        // another request.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

struct Timed {
    inner: Body,
    after: Duration,
    /// None once the body has ended (or timed out).
    timer: Option<Pin<Box<Sleep>>>,
    late: Arc<AtomicBool>,
}

impl HttpBody for Timed {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let me = self.get_mut();
        match Pin::new(&mut me.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                me.timer = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(frame)) => {
                if me.inner.is_end_stream() {
                    me.timer = None;
                }
                Poll::Ready(Some(frame.map_err(Into::into)))
            }
            Poll::Pending => {
                let Some(timer) = me.timer.as_mut() else {
                    return Poll::Pending;
                };
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                me.timer = None;
                me.late.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err(Box::new(BodyTimedOut(me.after)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
