//! Stage three: the plan's models in order, the endpoints of each. A
//! failure before the first byte (an engine that says nothing within
//! `router.response_timeout` included) is retried on another endpoint (and
//! counted by its breaker: a server error the engine answers when another
//! endpoint serves the request, or once per request when none does, and a
//! busy 503 not at all; when none serves, the engine's error is the
//! client's answer), and so is a plain answer that breaks off
//! mid-body (the client has nothing of it yet); a stream that breaks after
//! its first byte is continued on another replica ([`super::relay`]). An
//! engine's refusal (a 4xx, a 501) is the client's answer, in OpenAI's
//! shape whatever the engine ([`super::refusal`]). A model with no
//! capacity (no endpoint lets the request through, none can be reached,
//! or its engines all answer 503: full) passes the request to the next
//! model of the plan, an on-demand one waited for; one whose endpoints
//! failed (an engine's other error, a timeout) ends it.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::response::Parts;
use axum::http::{HeaderName, header};
use axum::response::Response;

use super::account::{Finish, GIVEN_UP, Ticket};
use super::refusal::message_of;
use super::relay::{Resume, relay};
use super::request::{ClientRequest, with_model};
use super::resolve::{NotStarted, Plan};
use super::splice::{Form, Splice};
use crate::{ApiError, Gateway};

/// A name, not a `&str`: a map given a custom header's name as text makes
/// the name anew (an allocation) each time it is inserted.
pub(crate) const SERVED_MODEL: HeaderName = HeaderName::from_static("x-llmgw-served-model");

/// Sends the request to the first model of the plan that has capacity.
pub(crate) async fn forward(
    gw: &Arc<Gateway>,
    path: &str,
    request: &ClientRequest,
    session: Option<&str>,
    plan: &Plan<'_>,
    ticket: Ticket,
) -> Result<Response, ApiError> {
    let mut ticket = Some(ticket);
    let mut failed = None;
    let mut not_started = plan.not_started;
    for (i, model) in plan.candidates.iter().enumerate() {
        // A fallback reached only now (the models before it full or out
        // of reach) that is started on demand: started and waited for,
        // as the model asked for would be.
        if i > 0 && plan.waited != Some(*model) {
            let routes = gw.routes.load();
            if let Err(why) = super::resolve::wait_on_demand(gw, &routes, model).await {
                not_started = Some(why);
                continue;
            }
        }
        // The engine is asked for the model by its canonical name.
        let rewritten;
        let body = if *model == request.model {
            &request.body
        } else {
            let Some(b) = with_model(&request.body, model) else {
                continue;
            };
            rewritten = b;
            &rewritten
        };
        match attempt(gw, path, body, model, request, session, &mut ticket).await {
            Ok(r) => {
                // An on-demand fallback serving is wanted as much as the
                // model asked for: kept up for its idle time.
                if *model != plan.asked {
                    super::resolve::demand(gw, &gw.routes.load(), model);
                }
                return Ok(r);
            }
            // No capacity: the next model of the plan.
            Err(None) => continue,
            // No endpoint of it could be reached (refused, or gone before
            // an answer), and none is slow, or its engines said they are
            // full: as good as no capacity, so the next model of the plan,
            // said if none serves. (An engine's other errors are the
            // request's, and a timeout may be work under way: those end
            // here.)
            Err(Some(why)) if why.full || (why.answer.is_none() && !why.timed_out) => {
                failed = Some(why);
                continue;
            }
            Err(Some(why)) => {
                failed = Some(why);
                break;
            }
        }
    }
    Err(match failed {
        // An endpoint's id (a replica's, or the operator's label) and why
        // it could not be reached are internals; what an engine answered
        // about the request is the client's, as its 4xx are.
        Some(last) => {
            tracing::warn!(model = %plan.asked, last = %last.why, "no endpoint answered");
            if let Some(said) = last.answer {
                // Every endpoint tried answered an error of its own: what
                // the engine said is the client's answer. A 508 came from
                // this gateway itself, which an endpoint names.
                if said.status == axum::http::StatusCode::LOOP_DETECTED {
                    return Err(ApiError::loop_detected());
                }
                ApiError::engine_said(said.status, said.message, said.retry_after)
            } else if last.timed_out {
                ApiError::upstream_timeout(format!(
                    "no endpoint of the model answered within {} s (router.response_timeout); the x-request-id header names this request to the operator",
                    gw.config.response_timeout.as_secs_f64()
                ))
            } else {
                ApiError::upstream(
                    "no endpoint of the model answered; the x-request-id header names this request to the operator",
                )
            }
        }
        None => match not_started {
            Some(n) if n.fits_nowhere => ApiError::fits_nowhere(n.model, true),
            Some(NotStarted {
                model,
                held_back: Some(wait),
                ..
            }) => ApiError::start_failed(model, wait),
            Some(n) => ApiError::not_ready(n.model, gw.config.on_demand_wait),
            // No replica at all, and none could be placed as the cluster
            // stands: said so, not "right now" with a retry for ever.
            None if !gw.endpoints.knows_model(plan.asked) && gw.fits_nowhere(plan.asked) => {
                ApiError::fits_nowhere(plan.asked, false)
            }
            None => ApiError::no_capacity(plan.asked, gw.config.breaker.cool_down),
        },
    })
}

/// Why the last endpoint tried gave no answer.
struct Failure {
    why: String,
    /// It said nothing within `router.response_timeout`.
    timed_out: bool,
    /// The last error an engine answered (a 5xx), when one did: relayed
    /// when no endpoint serves the request.
    answer: Option<EngineError>,
    /// Every engine of the model that answered said 503 (full), the last
    /// endpoint tried among them: the model has no capacity now.
    full: bool,
}

impl Failure {
    fn said(why: String) -> Failure {
        Failure {
            why,
            timed_out: false,
            answer: None,
            full: false,
        }
    }
}

/// A server error an engine answered: its status, its message and when it
/// says to come back.
struct EngineError {
    status: axum::http::StatusCode,
    message: String,
    retry_after: Option<u32>,
}

impl EngineError {
    /// The engine says it is full for now, and when to come back.
    fn busy(&self) -> bool {
        self.status == axum::http::StatusCode::SERVICE_UNAVAILABLE && self.retry_after.is_some()
    }

    /// The engine's message ([`message_of`]), cut to a line's worth.
    fn read(status: axum::http::StatusCode, headers: &axum::http::HeaderMap, body: &[u8]) -> Self {
        let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
        let message: String = message_of(json.as_ref(), body).chars().take(500).collect();
        let retry_after = headers
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        EngineError {
            status,
            message,
            retry_after,
        }
    }
}

/// Tries the endpoints of `model`, retrying before the first byte only.
/// `Err(None)`: nothing could take it (no capacity); `Err(Some(_))`:
/// endpoints were tried and failed.
async fn attempt(
    gw: &Arc<Gateway>,
    path: &str,
    body: &Bytes,
    model: &str,
    request: &ClientRequest,
    session: Option<&str>,
    ticket: &mut Option<Ticket>,
) -> Result<Response, Option<Failure>> {
    let mut tried: Vec<String> = Vec::new();
    let mut last_error: Option<Failure> = None;
    // The server error the last endpoint answered, relayed when no
    // endpoint serves the request; and the endpoints that answered one
    // (not a busy 503), counted against their breakers once the outcome
    // is known.
    let mut answer: Option<EngineError> = None;
    let mut erred: Vec<Arc<crate::Endpoint>> = Vec::new();
    // An engine answered an error other than 503 (full): about the
    // request, perhaps, so not passed to a fallback.
    let mut other_error = false;
    // The engine logs the client's id, so one grep follows a request.
    let request_id = ticket
        .as_ref()
        .map_or_else(crate::access::RequestId::new, |t| t.access.id());
    // The request's tokens and the length of the rendering they were cut
    // from, once, if an endpoint publishes KV events.
    let mut tokens: Option<(crate::kv_events::RequestTokens, usize)> = None;
    for _ in 0..=gw.config.retries {
        let candidates = gw.endpoints.candidates(model, &tried);
        if candidates.is_empty() {
            break;
        }
        if tokens.is_none() && candidates.iter().any(|(e, _)| e.spec.kv_events.is_some()) {
            let rendered = request.rendered();
            let sim = crate::kv_events::RequestTokens::sim(&rendered);
            tokens = Some((sim, rendered.len()));
        }
        let view: Vec<crate::affinity::Candidate<'_>> = candidates
            .iter()
            .map(|(e, _)| crate::affinity::Candidate {
                id: &e.spec.id,
                load: gw.endpoints.load_of(e),
                exact: tokens
                    .as_ref()
                    .and_then(|(t, _)| gw.kv_events.held(&e.spec.id, t)),
                cold: e.spec.kv_events.is_some() && gw.kv_events.cold(&e.spec.id),
            })
            .collect();
        let (i, decision) = gw.affinity.choose(
            model,
            session,
            &request.prompt,
            // Read only beside an exact count, which needs the tokens.
            tokens.as_ref().map_or(0, |(_, len)| *len),
            &view,
        );
        let endpoint = candidates[i].0.clone();
        tried.push(endpoint.spec.id.clone());
        let Some(flight) = gw.endpoints.take(&endpoint) else {
            continue;
        };
        gw.metrics.decision(decision);
        if endpoint.spec.kv_events.is_some() {
            gw.kv_events.sent(&endpoint.spec.id);
        }
        // A client that leaves while the engine has its request pays for
        // its prompt, as one that leaves a stream does: the engine did that
        // work (what it generated before it saw the client go is unknown).
        let waiting = Waiting {
            ticket: &mut *ticket,
            model,
            prompt: request.prompt_estimate,
            armed: true,
        };
        let exchanged = exchange(
            gw,
            &endpoint,
            path,
            &request_id,
            body,
            model,
            request.stream,
        )
        .await;
        waiting.disarm();
        let (head, body_answer) = match exchanged {
            Ok(a) => a,
            Err(mut failure) => {
                let again = !failure.timed_out || request.stream;
                // The last failure's own answer, if it was one: an earlier
                // engine's error does not stand for a later timeout.
                answer = failure.answer.take();
                if let Some(said) = &answer {
                    other_error |= said.status != axum::http::StatusCode::SERVICE_UNAVAILABLE;
                    if !said.busy() {
                        erred.push(endpoint.clone());
                    }
                }
                last_error = Some(failure);
                if again {
                    continue;
                }
                // A plain answer past the timeout may only be slow: sent
                // again it would cost another engine as much.
                break;
            }
        };
        // Another endpoint served what they failed: each is broken.
        if head.status.is_success() {
            for e in erred.drain(..) {
                e.record(false);
            }
        }
        let mut content_type = head.headers.get(header::CONTENT_TYPE).cloned();
        // The engine's refusal, said as OpenAI says it whatever the engine.
        let (status, body_answer, final_answer) = match body_answer {
            Answer::Whole(bytes) if refused(head.status) => {
                let said = super::refusal::normalise(head.status, &bytes, path, model);
                content_type = Some(header::HeaderValue::from_static("application/json"));
                (said.status, Answer::Whole(said.body), said.final_answer)
            }
            answer => (head.status, answer, false),
        };
        // A hosted service's 429 says when to come back; an SDK waits that
        // long only if it is passed on.
        let retry_after = head.headers.get(header::RETRY_AFTER).cloned();
        let Some(t) = ticket.take() else {
            return Err(last_error);
        };
        let mut finish = Finish::new(t, model, status.as_u16());
        let served = finish.served().clone();
        let body = match body_answer {
            Answer::Stream(upstream) => {
                let form = if path.ends_with("/chat/completions") {
                    Form::Chat
                } else {
                    Form::Text
                };
                // Only an answer can be continued; an error's body is relayed.
                let resume = status.is_success().then(|| Resume {
                    gw: gw.clone(),
                    path: path.to_owned(),
                    body: body.clone(),
                    model: model.to_owned(),
                    request_id: request_id.clone(),
                    tried: vec![endpoint.spec.id.clone()],
                    sent: 0,
                });
                // An error the engine sent did no work there: nothing is
                // estimated for it (a plain error answer counts nothing too).
                let estimate = if status.is_success() {
                    request.prompt_estimate
                } else {
                    0
                };
                finish.streamed = true;
                let splice = Splice::new(form, request.strip_usage, estimate);
                let idle = gw.config.stream_idle_timeout;
                let relayed = relay(upstream, flight, finish, splice, form, idle, resume);
                Body::from_stream(relayed)
            }
            Answer::Whole(bytes) => {
                finish.tokens = crate::usage::Tokens::from_answer(&bytes);
                drop((finish, flight));
                Body::from(bytes)
            }
        };
        gw.metrics.request(served, status.as_u16());
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        if let Some(ct) = content_type {
            headers.insert(header::CONTENT_TYPE, ct);
        }
        if let Some(ra) = retry_after {
            headers.insert(header::RETRY_AFTER, ra);
        }
        if final_answer {
            headers.insert(
                HeaderName::from_static("x-should-retry"),
                header::HeaderValue::from_static("false"),
            );
        }
        if let Some(v) = endpoint.model_header(model) {
            headers.insert(SERVED_MODEL, v);
        }
        return Ok(response);
    }
    // None served it: the request may be what they fail on, so each
    // counts it once however often it comes (`record_erred`).
    for e in erred {
        e.record_erred(body);
    }
    Err(last_error.map(|mut f| {
        f.full = !other_error
            && !f.timed_out
            && (answer.as_ref())
                .is_some_and(|a| a.status == axum::http::StatusCode::SERVICE_UNAVAILABLE);
        f.answer = answer;
        f
    }))
}

/// An engine's answer: a stream to relay, or a plain answer read whole
/// (one JSON document, whose usage is noted).
enum Answer {
    Stream(super::upstream::Body),
    Whole(Bytes),
}

/// Sends the request to `endpoint` and takes its answer's head and, for a
/// plain answer, its body; any failure is counted by the endpoint's breaker.
/// Nothing has reached the client yet, so a failure is retried elsewhere.
async fn exchange(
    gw: &Gateway,
    endpoint: &crate::Endpoint,
    path: &str,
    request_id: &crate::access::RequestId,
    body: &Bytes,
    model: &str,
    stream: bool,
) -> Result<(Parts, Answer), Failure> {
    // One deadline (one timer) for the answer's head and, of a plain
    // answer, its whole body: engines send a plain answer's head at its end.
    let exchanged = async {
        let upstream = match gw
            .upstream
            .send(endpoint, path, request_id, body.clone())
            .await
        {
            // Counted in `attempt`, once the request's outcome is known;
            // never when the engine says it is busy (503 with when to come
            // back): a full engine is not a broken one, and the client is
            // told to come back when it says. A bare 503 (a proxy with no
            // engine behind it) counts as any server error. A 501 is the
            // engine saying what it does not do (llama.cpp's embeddings
            // without --embeddings): about the request, answered as a
            // final 400 ([`super::refusal`]), never the engine's health;
            // three of them, any client's, opened the breaker and took
            // the model from everyone.
            Ok(r)
                if r.status().is_server_error()
                    && r.status() != reqwest::StatusCode::NOT_IMPLEMENTED =>
            {
                let status = r.status();
                let (head, body) = r.into_parts();
                let body = super::whole(body).await.unwrap_or_default();
                let said = EngineError::read(status, &head.headers, &body);
                tracing::warn!(endpoint = %endpoint.spec.id, %status, message = %said.message, "the engine answered a server error; trying another endpoint");
                return Err(Failure {
                    answer: Some(said),
                    ..Failure::said(format!("endpoint {} answered {status}", endpoint.spec.id))
                });
            }
            // The engine refused the gateway's credentials, not the
            // client's: relayed, its 401 told the client its own key was
            // bad (an SDK's AuthenticationError). The endpoint's key is
            // the operator's to fix; another endpoint may serve meanwhile.
            // (A 403 is relayed: it may be about this request or model
            // alone, and must not open the endpoint's breaker.)
            Ok(r) if r.status() == reqwest::StatusCode::UNAUTHORIZED => {
                endpoint.record(false);
                tracing::warn!(endpoint = %endpoint.spec.id, status = %r.status(), "the engine refused the gateway's credentials: check the endpoint's api key; trying another endpoint");
                return Err(Failure::said(format!(
                    "endpoint {} refused the gateway's credentials ({})",
                    endpoint.spec.id,
                    r.status()
                )));
            }
            Ok(r) => r,
            Err(e) => {
                endpoint.record(false);
                tracing::warn!(endpoint = %endpoint.spec.id, error = %e, "upstream request failed; trying another endpoint");
                return Err(Failure::said(format!(
                    "endpoint {} is unreachable",
                    endpoint.spec.id
                )));
            }
        };
        endpoint.record(true);
        let (head, upstream) = upstream.into_parts();
        // An error is answered whole, streamed request or not (engines
        // refuse before they stream), and read whole to be said in
        // OpenAI's shape; one sent as events is relayed as it is.
        if stream && (!refused(head.status) || event_stream(&head.headers)) {
            return Ok((head, Answer::Stream(upstream)));
        }
        match super::whole(upstream).await {
            Ok(bytes) => Ok((head, Answer::Whole(bytes))),
            Err(e) => {
                endpoint.record(false);
                gw.metrics.migration(model, "retried");
                tracing::warn!(endpoint = %endpoint.spec.id, error = %e, "a plain answer broke off mid-body; sending it again elsewhere");
                Err(Failure::said(format!(
                    "endpoint {} broke off: {e}",
                    endpoint.spec.id
                )))
            }
        }
    };
    tokio::time::timeout(gw.config.response_timeout, exchanged)
        .await
        .unwrap_or_else(|_| Err(timed_out(endpoint, gw.config.response_timeout, stream)))
}

/// An engine's refusal, to be said in OpenAI's shape (a redirect is
/// relayed as it came).
fn refused(status: axum::http::StatusCode) -> bool {
    status.is_client_error() || status.is_server_error()
}

fn event_stream(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// The request's account while an engine has it and nothing has come
/// back. Dropped armed (its future dropped: the client went away), it
/// records the request as given up (499) with its prompt's estimate and
/// no completion; disarmed when the engine answered or failed.
struct Waiting<'t> {
    ticket: &'t mut Option<Ticket>,
    model: &'t str,
    prompt: u64,
    armed: bool,
}

impl Waiting<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Some(t) = self.ticket.take() else { return };
        let gw = t.gateway().clone();
        let mut finish = Finish::new(t, self.model, GIVEN_UP);
        finish.tokens = Some(crate::usage::Tokens {
            prompt: self.prompt,
            completion: 0,
        });
        gw.metrics.request(finish.served().clone(), GIVEN_UP);
    }
}

/// An endpoint that said nothing in time. A stream's head comes at once
/// from an engine that works, however busy: without it the engine is as
/// good as down, so its breaker counts it and the request goes elsewhere.
/// A plain answer comes whole at its end, so one past the timeout may only
/// be a long answer on a busy engine: neither counted nor sent again.
fn timed_out(endpoint: &crate::Endpoint, after: std::time::Duration, stream: bool) -> Failure {
    if stream {
        endpoint.record(false);
        tracing::warn!(endpoint = %endpoint.spec.id, after_s = after.as_secs_f64(), "the endpoint did not begin a stream within router.response_timeout; trying another");
    } else {
        tracing::warn!(endpoint = %endpoint.spec.id, after_s = after.as_secs_f64(), "a plain answer took longer than router.response_timeout; given up, not sent again");
    }
    Failure {
        timed_out: true,
        ..Failure::said(format!(
            "endpoint {} did not answer in time",
            endpoint.spec.id
        ))
    }
}
