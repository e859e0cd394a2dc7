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
        named: false,
    };
    Response::from_parts(parts, Body::from_stream(stream))
}

/// What an event stream is told at the cut: OpenAI's form of an error
/// mid-stream, and no `[DONE]` (the answer is not complete).
const STOPPING_EVENT: &[u8] = b"data: {\"error\":{\"message\":\"the server is stopping and its shutdown grace period is over: the answer was cut; send the request again\",\"type\":\"server_error\",\"code\":\"server_stopping\"}}\n\n";

/// The same for a stream of named events (the Responses API's), in its
/// own form: an `error` event.
const STOPPING_NAMED_EVENT: &[u8] = b"event: error\ndata: {\"type\":\"error\",\"code\":\"server_stopping\",\"message\":\"the server is stopping and its shutdown grace period is over: the answer was cut; send the request again\",\"param\":null}\n\n";

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
    /// Its events are named (`event: …` lines): the Responses API's.
    named: bool,
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
                let event = if self.named {
                    STOPPING_NAMED_EVENT
                } else {
                    STOPPING_EVENT
                };
                return Poll::Ready(Some(Ok(Bytes::from_static(event))));
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
            self.named |= bytes.starts_with(b"event: ");
        }
        polled.map(|item| item.map(|r| r.map_err(std::io::Error::other)))
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use futures_util::StreamExt;

    use super::*;

    /// A stream of `chunks`, then nothing more for ever (a long answer).
    fn streaming(kind: &str, chunks: &[&'static str]) -> Response {
        let chunks: Vec<Result<Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        let body = futures_util::stream::iter(chunks).chain(futures_util::stream::pending());
        Response::builder()
            .header("content-type", kind)
            .body(Body::from_stream(body))
            .unwrap()
    }

    /// What the client reads of `response` once `cut` fires after the
    /// chunks: the bytes, and whether it then broke off.
    async fn read_after_cut(response: Response, chunks: usize) -> (String, bool) {
        let cut = Signal::default();
        let mut body = cut_stream(response, &cut).into_body().into_data_stream();
        let mut text = String::new();
        for _ in 0..chunks {
            text.push_str(&String::from_utf8_lossy(
                &body.next().await.unwrap().unwrap(),
            ));
        }
        cut.fire();
        let mut broke = false;
        while let Some(item) = body.next().await {
            match item {
                Ok(b) => text.push_str(&String::from_utf8_lossy(&b)),
                Err(_) => {
                    broke = true;
                    break;
                }
            }
        }
        (text, broke)
    }

    #[tokio::test]
    async fn a_stream_cut_between_events_is_told_why_in_its_own_form() {
        let chat = streaming("text/event-stream", &["data: {\"a\":1}\n\n"]);
        let (text, broke) = read_after_cut(chat, 1).await;
        assert!(broke);
        assert!(
            text.ends_with("\"code\":\"server_stopping\"}}\n\n")
                && text.starts_with("data: {\"a\""),
            "{text}"
        );
        let responses = streaming(
            "text/event-stream",
            &["event: response.created\ndata: {\"type\":\"response.created\"}\n\n"],
        );
        let (text, broke) = read_after_cut(responses, 1).await;
        assert!(broke);
        assert!(
            text.contains("event: error\ndata: {\"type\":\"error\",\"code\":\"server_stopping\""),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_stream_cut_mid_event_or_not_of_events_only_breaks() {
        // An event half sent: another would be read as its end.
        let half = streaming("text/event-stream", &["data: {\"a\":"]);
        assert_eq!(
            read_after_cut(half, 1).await,
            ("data: {\"a\":".into(), true)
        );
        let plain = streaming("application/octet-stream", &["bytes\n\n"]);
        assert_eq!(read_after_cut(plain, 1).await, ("bytes\n\n".into(), true));
    }
}
