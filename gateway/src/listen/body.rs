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
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body::Frame;
use tokio::time::{Instant, Sleep};

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

/// Puts `after`, where set, as the deadline on `request`'s body; what
/// comes back says whether a read ran past it (see [`Late::settle`]). A
/// request without a body gets none.
pub(crate) fn limit(request: Request, after: Option<Duration>) -> (Request, Option<Late>) {
    let Some(after) = after else {
        return (request, None);
    };
    if request.body().is_end_stream() {
        return (request, None);
    }
    let late = Late {
        flag: Arc::new(AtomicBool::new(false)),
        after,
    };
    let flag = late.flag.clone();
    let request = request.map(|inner| {
        Body::new(Timed {
            inner,
            after,
            due: far(after),
            timer: None,
            ended: false,
            late: flag,
        })
    });
    (request, Some(late))
}

/// Whether a request's body read ran past its deadline.
pub(crate) struct Late {
    flag: Arc<AtomicBool>,
    after: Duration,
}

impl Late {
    /// The answer to a request whose body read ran late: 408 whatever the
    /// handler answered, and the connection closed.
    pub(crate) fn settle(&self, mut response: Response) -> Response {
        if self.flag.load(Ordering::Relaxed) {
            if response.status() != StatusCode::REQUEST_TIMEOUT {
                response = ApiError::body_timeout(self.after).into_response();
            }
            // The rest of the body is unread: the connection cannot carry
            // another request.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// `after` from now; an absurd setting (centuries) is a deadline that
/// never comes, not an overflow.
fn far(after: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(60 * 60 * 24 * 365 * 30))
}

struct Timed {
    inner: Body,
    after: Duration,
    due: Instant,
    /// Made the first time the body is not all there: a body that came
    /// with its headers (most) never needs one.
    timer: Option<Pin<Box<Sleep>>>,
    /// The body has ended (or timed out).
    ended: bool,
    late: Arc<AtomicBool>,
}

impl Timed {
    fn end(&mut self) {
        self.ended = true;
        self.timer = None;
    }
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
                me.end();
                Poll::Ready(None)
            }
            Poll::Ready(Some(frame)) => {
                if me.inner.is_end_stream() {
                    me.end();
                }
                Poll::Ready(Some(frame.map_err(Into::into)))
            }
            Poll::Pending => {
                if me.ended {
                    return Poll::Pending;
                }
                let due = me.due;
                let timer = me
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                me.end();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A body timeout of centuries is a deadline that never comes, not a
    /// panic on every request with a body.
    #[tokio::test]
    async fn an_absurd_timeout_does_not_overflow() {
        let due = far(Duration::MAX);
        assert!(due > Instant::now() + Duration::from_secs(60 * 60 * 24 * 365));
    }
}
