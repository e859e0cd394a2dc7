//! The end of a graceful stop: once the grace period is over, whatever is
//! still in flight is cut, so that a stop is bounded however long a stream
//! would have run. Before that, the listeners have stopped accepting and
//! idle connections have closed (axum's graceful shutdown); requests in
//! flight run on untouched.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use tokio::sync::watch;

/// Turns true when the grace period is over.
#[derive(Debug, Clone)]
pub(crate) struct Cut(pub(crate) watch::Receiver<bool>);

impl Cut {
    /// Resolves at the cut; never, if whoever would cut is gone.
    async fn wait(mut self) {
        if self.0.wait_for(|cut| *cut).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

fn stopping() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, "the server is stopping").into_response()
}

/// A request still waiting for its answer at the cut gets 503; a body of
/// unknown length (a stream) still being sent ends with an error, so the
/// client sees the connection break rather than a stream that looks
/// complete. Bodies of known length are sent whole.
pub(crate) async fn cut_at_grace(State(cut): State<Cut>, req: Request, next: Next) -> Response {
    if *cut.0.borrow() {
        return stopping();
    }
    let response = tokio::select! {
        r = next.run(req) => r,
        () = cut.clone().wait() => return stopping(),
    };
    if response.body().size_hint().exact().is_some() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let stream = CutStream {
        inner: body.into_data_stream(),
        cut: Some(Box::pin(cut.wait())),
    };
    Response::from_parts(parts, Body::from_stream(stream))
}

struct CutStream<S> {
    inner: S,
    /// None once cut: the stream has ended.
    cut: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<S> Stream for CutStream<S>
where
    S: Stream<Item = Result<Bytes, axum::Error>> + Unpin,
{
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(cut) = self.cut.as_mut() else {
            return Poll::Ready(None);
        };
        if cut.as_mut().poll(cx).is_ready() {
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
