//! The streamed answer, relayed event by event, and carried over to
//! another replica when its engine breaks mid-answer, or sends nothing for
//! `router.stream_idle_timeout` (request migration):
//! the answer so far goes to the next engine as the start of its answer
//! ([`super::continuation`]), and its events are spliced into the client's
//! stream as the same answer ([`super::splice`]). At most
//! `router.migration_limit` continuations are sent for one answer; past
//! that, or with no replica left, the client gets an error event, never a
//! body cut off without a word.

use std::sync::Arc;

use axum::body::Bytes;
use futures_util::{Stream, StreamExt};
use http_body_util::BodyExt;

use super::account::Finish;
use super::continuation::{NoContinuation, continuation};
use super::splice::{Form, Splice};
use crate::access::StreamEnd;
use crate::{Gateway, InFlight};

type Upstream = http_body_util::BodyDataStream<super::upstream::Body>;

/// What a continuation needs: the request as the first engine got it,
/// and who has been tried.
#[derive(Debug)]
pub(crate) struct Resume {
    pub(crate) gw: Arc<Gateway>,
    pub(crate) path: String,
    /// The body as forwarded (the model the engines know, usage asked for).
    pub(crate) body: Bytes,
    /// The model that serves (the metric's label).
    pub(crate) model: String,
    pub(crate) request_id: crate::access::RequestId,
    /// Endpoints this answer has been on: never sent a continuation.
    pub(crate) tried: Vec<String>,
    /// Continuations sent so far.
    pub(crate) sent: u32,
}

/// How a broken answer ends when no engine takes it over.
enum GiveUp {
    LengthReached,
    /// The outcome counted and the client's error message.
    Error(&'static str, String),
}

impl Resume {
    fn count(&self, outcome: &'static str) {
        self.gw.metrics.migration(&self.model, outcome);
    }

    /// Another engine's stream for the rest of the answer, or why not.
    async fn next(&mut self, splice: &Splice, form: Form) -> Result<(Upstream, InFlight), GiveUp> {
        if let Some(why) = splice.unresumable {
            return Err(GiveUp::Error("unresumable", why.to_owned()));
        }
        loop {
            if self.sent >= self.gw.config.migration_limit {
                return Err(GiveUp::Error(
                    "exhausted",
                    "the engine serving this answer failed and the migration limit is reached"
                        .into(),
                ));
            }
            let Some(flight) = self.gw.endpoints.pick(&self.model, &self.tried) else {
                return Err(GiveUp::Error(
                    "exhausted",
                    "the engine serving this answer failed and no other replica could continue it"
                        .into(),
                ));
            };
            let endpoint = flight.endpoint().clone();
            self.tried.push(endpoint.spec.id.clone());
            let body = match continuation(
                &self.body,
                form,
                &splice.text,
                splice.sent_tokens,
                endpoint.spec.engine,
            ) {
                Ok(b) => b,
                Err(NoContinuation::LengthReached) => return Err(GiveUp::LengthReached),
                Err(NoContinuation::Unresumable(why)) => {
                    return Err(GiveUp::Error("unresumable", why.to_owned()));
                }
            };
            self.sent += 1;
            let sent = tokio::time::timeout(
                self.gw.config.response_timeout,
                self.gw
                    .upstream
                    .send(&endpoint, &self.path, &self.request_id, body),
            )
            .await;
            let Ok(sent) = sent else {
                endpoint.record(false);
                tracing::warn!(endpoint = %endpoint.spec.id, "a continuation got no answer within router.response_timeout");
                self.count("failed");
                continue;
            };
            match sent {
                Ok(r) if r.status().is_success() => {
                    endpoint.record(true);
                    self.count("resumed");
                    tracing::info!(endpoint = %endpoint.spec.id, sent_tokens = splice.sent_tokens, "answer continued on another replica");
                    return Ok((r.into_body().into_data_stream(), flight));
                }
                Ok(r) => {
                    // A refusal of the continuation's form is no fault of
                    // the endpoint; a server error is.
                    if r.status().is_server_error() {
                        endpoint.record(false);
                    }
                    tracing::warn!(endpoint = %endpoint.spec.id, status = %r.status(), "a continuation was refused");
                }
                Err(e) => {
                    endpoint.record(false);
                    tracing::warn!(endpoint = %endpoint.spec.id, error = %e, "a continuation could not be sent");
                }
            }
            self.count("failed");
        }
    }
}

/// Everything the relay holds: the in-flight count and the account end
/// when the stream ends or the client goes away (which also drops the
/// upstream request).
struct State {
    upstream: Upstream,
    flight: InFlight,
    finish: Finish,
    splice: Splice,
    form: Form,
    /// `router.stream_idle_timeout`.
    idle: std::time::Duration,
    /// None for an answer that is not a success (an error's body): relayed
    /// as it is, never continued.
    resume: Option<Resume>,
    done: bool,
}

pub(crate) fn relay(
    upstream: super::upstream::Body,
    flight: InFlight,
    finish: Finish,
    splice: Splice,
    form: Form,
    idle: std::time::Duration,
    resume: Option<Resume>,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> {
    let state = State {
        upstream: upstream.into_data_stream(),
        flight,
        finish,
        splice,
        form,
        idle,
        resume,
        done: false,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            let mut queued = false;
            let broke = match tokio::time::timeout(st.idle, st.upstream.next()).await {
                // A hung engine (a stuck GPU, a route lost without a
                // reset) is as dead as one whose connection broke. Before
                // its first token it may only be queued in a busy engine:
                // moved on, but not held against its breaker.
                Err(_) => {
                    queued = !st.splice.saw_content;
                    format!(
                        "no byte from the engine in {} s (router.stream_idle_timeout)",
                        st.idle.as_secs_f64()
                    )
                }
                Ok(Some(Ok(chunk))) => {
                    let out = st.splice.feed(&chunk);
                    st.note();
                    if !out.is_empty() {
                        return Some((Ok(out), st));
                    }
                    continue;
                }
                Ok(Some(Err(e))) => e.to_string(),
                // An answer that ends before its finish ended badly too.
                Ok(None) if st.resume.is_some() && st.splice.broken_off() => {
                    "the engine ended the stream before the answer".to_owned()
                }
                Ok(None) => {
                    st.done = true;
                    st.finish.end = Some(StreamEnd::Complete);
                    let rest = st.splice.finish();
                    return Some((Ok(rest), st));
                }
            };
            if !queued {
                st.flight.endpoint().record(false);
            }
            tracing::warn!(endpoint = %st.flight.endpoint().spec.id, error = %broke, "the upstream broke mid-answer");
            let Some(resume) = st.resume.as_mut() else {
                st.done = true;
                st.finish.end = Some(StreamEnd::UpstreamError);
                return Some((Err(std::io::Error::other(broke)), st));
            };
            if st.splice.finished {
                // Whole already: only the end was lost.
                st.done = true;
                st.finish.end = Some(StreamEnd::Complete);
                let tail = st.splice.tail();
                return Some((Ok(tail), st));
            }
            match resume.next(&st.splice, st.form).await {
                Ok((upstream, flight)) => {
                    // llama.cpp's server repeats a prefilled assistant
                    // message before its new text.
                    let echoes = st.form == Form::Chat
                        && flight.endpoint().spec.engine == crate::scrape::EngineKind::Llamacpp;
                    st.splice.continue_elsewhere(echoes);
                    st.upstream = upstream;
                    st.flight = flight;
                }
                Err(GiveUp::LengthReached) => {
                    st.done = true;
                    st.finish.end = Some(StreamEnd::Complete);
                    let out = st.splice.length_reached();
                    st.note();
                    return Some((Ok(out), st));
                }
                Err(GiveUp::Error(outcome, why)) => {
                    resume.count(outcome);
                    tracing::warn!(outcome, "{why}");
                    st.done = true;
                    st.finish.end = Some(StreamEnd::UpstreamError);
                    return Some((Ok(Splice::error_event(&why)), st));
                }
            }
        }
    })
}

impl State {
    /// What the account needs to know so far.
    fn note(&mut self) {
        if self.splice.saw_content && self.finish.first_content.is_none() {
            self.finish.first_content = Some(self.finish.started().elapsed());
        }
        // Until the engine reports usage (its last event), what was
        // streamed counts: a client that leaves early pays for the prompt
        // and the tokens it was sent.
        self.finish.tokens = Some(self.splice.tokens());
        // Ended once `[DONE]` reached the client (every choice's finish
        // comes before it): a client that hangs up there, before the
        // engine's connection ends, took all of it (it was recorded as
        // given up). After an engine's error event it ended badly.
        if self.splice.done && self.finish.end.is_none() {
            self.finish.end = Some(if self.splice.engine_errored() {
                StreamEnd::UpstreamError
            } else {
                StreamEnd::Complete
            });
        }
    }
}
