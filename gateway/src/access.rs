//! Request ids, the request's span and the access line.
//!
//! Every request on the client routes gets an id: the client's
//! `x-request-id` when it is sane, else a fresh one. It is returned on
//! the response (errors included), sent to the engine, and named by the
//! request's span, so every line logged for the request carries it.
//!
//! An inference request ends in one access line, written once when it is
//! over: when the answer is sent, or for a stream when the stream ends,
//! the client goes away or the engine breaks off. The stages fill in what
//! they learn (the key, the model asked for and the one that served, the
//! status, tokens, time to first token); the last of them to let go
//! writes the line.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};

use crate::usage::Tokens;

pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client request id kept; a longer one is replaced.
const MAX_ID: usize = 128;

/// The id of the request being served and where it came from (a request
/// extension): the address every line about the request names, and the
/// gateways it came through, which the engine's request names on.
#[derive(Debug, Clone)]
pub struct RequestId {
    pub(crate) value: HeaderValue,
    client: Option<IpAddr>,
    /// The client's `x-llmgw-hop`: the gateways it passed before this one.
    via: Option<HeaderValue>,
}

impl RequestId {
    /// The id the client listener gave `request` (and returns on its
    /// answer), for a handler that hands the request on in another form.
    pub fn of<B>(request: &axum::http::Request<B>) -> Option<RequestId> {
        request.extensions().get::<RequestId>().cloned()
    }

    /// The client's id when sane (1 to 128 visible ASCII characters, so it
    /// cannot split a log line or smuggle a header), else a new one.
    pub(crate) fn from_client(value: Option<&HeaderValue>) -> Self {
        match value {
            Some(v) if sane(v.as_bytes()) => RequestId::of_value(v.clone()),
            _ => RequestId::new(),
        }
    }

    pub(crate) fn new() -> Self {
        // Written on the stack, and the array itself owned by the header
        // value: one allocation, and clones (the answer's header, the
        // access line's) share it. A value copied from a slice allocated
        // again at its first clone, to make its buffer shared.
        let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
        uuid::Uuid::new_v4().hyphenated().encode_lower(&mut text);
        let value = HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(text));
        RequestId::of_value(value.unwrap_or(HeaderValue::from_static("-")))
    }

    fn of_value(value: HeaderValue) -> Self {
        RequestId {
            value,
            client: None,
            via: None,
        }
    }

    /// The peer's address, as the connection saw it (a proxy in front
    /// is the peer: its own log joins by the request id).
    pub(crate) fn client(&self) -> Option<IpAddr> {
        self.client
    }

    /// The gateways the request passed before this one, as their marks.
    pub(crate) fn via(&self) -> Option<&HeaderValue> {
        self.via.as_ref()
    }

    /// The id as the answer's `x-request-id` carries it.
    pub fn as_str(&self) -> &str {
        // Sane ids and uuids are ASCII.
        self.value.to_str().unwrap_or("-")
    }
}

fn sane(id: &[u8]) -> bool {
    (1..=MAX_ID).contains(&id.len()) && id.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// A client request's id (the client's, or a new one), put on the
/// request, and its span: what [`crate::listen::edge`] opens every client
/// request with. The id goes back on the answer.
pub(crate) fn open(request: &mut Request, client: Option<IpAddr>) -> (tracing::Span, HeaderValue) {
    let mut id = RequestId::from_client(request.headers().get(&REQUEST_ID));
    id.client = client;
    id.via = request.headers().get(crate::proxy::upstream::HOP).cloned();
    let path = logged_path(request.uri().path());
    let client = client.map(tracing::field::display);
    // Health checks come every few seconds from every balancer: their
    // spans are kept for debugging, out of an operator's traces.
    let span = if path.starts_with("/v1/") {
        tracing::info_span!("request", request_id = id.as_str(), client, method = %request.method(), path)
    } else {
        tracing::debug_span!("request", request_id = id.as_str(), client, method = %request.method(), path)
    };
    let header = id.value.clone();
    request.extensions_mut().insert(id);
    (span, header)
}

/// The path as a span records it: a claim link's token is a secret (it
/// opens the key once), so its path is recorded as the route, never with
/// the token in it.
fn logged_path(path: &str) -> &str {
    if path.starts_with("/claim/") {
        "/claim/{token}"
    } else {
        path
    }
}

/// Whether a request on the client listener gets a plain access line
/// from the edge: not inference (its own line names the key, models and
/// tokens), nor a balancer's health checks and the pages' static files,
/// which would bury the rest. Sign-ins, the memory and thread routes, MCP
/// and `/me` were in no line at all: a client refused there left no trace.
pub(crate) fn plain_line(path: &str) -> bool {
    !matches!(
        path,
        "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings"
            | "/v1/responses"
            | "/chat/completions"
            | "/health"
            | "/ready"
    ) && !path.starts_with("/static/")
}

/// The key a request was made with, put on its answer by a handler of a
/// route with a plain line (memory notes, threads, MCP), so that the line
/// names who wrote or deleted what, as an inference line does.
#[derive(Debug, Clone)]
pub(crate) struct KeyOf(pub(crate) Arc<str>);

/// A request's plain access line: method, path, status and time, and the
/// key where the handler named it ([`KeyOf`]).
pub(crate) struct Plain {
    id: Option<RequestId>,
    method: axum::http::Method,
    path: String,
    started: Instant,
}

impl Plain {
    pub(crate) fn start(request: &Request) -> Self {
        Plain {
            id: request.extensions().get::<RequestId>().cloned(),
            method: request.method().clone(),
            path: logged_path(request.uri().path()).to_owned(),
            started: Instant::now(),
        }
    }

    /// Names the request's id itself: outside `/v1` the request's span
    /// is kept for debugging, and at info it names nothing.
    pub(crate) fn finish(self, answer: &axum::response::Response) {
        let ms = (self.started.elapsed().as_micros() as f64) / 1000.0;
        tracing::info!(
            target: "llmgw::access",
            request_id = self.id.as_ref().map_or("-", RequestId::as_str),
            client = self.id.as_ref().and_then(RequestId::client).map(tracing::field::display),
            key_id = answer.extensions().get::<KeyOf>().map(|k| &*k.0),
            method = %self.method,
            path = self.path,
            status = answer.status().as_u16(),
            duration_ms = ms,
            "request"
        );
    }
}

/// How a streamed answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamEnd {
    /// The engine finished it.
    Complete,
    /// The engine broke off mid-stream.
    UpstreamError,
    /// The client went away before its end.
    ClientGone,
    /// A graceful stop's grace ran out before its end: cut here.
    ServerStopping,
}

/// The facts of one request's access line; shared by the stages that
/// learn them, written when the last of them lets go.
#[derive(Debug, Clone)]
pub(crate) struct Access(Arc<Mutex<Line>>);

#[derive(Debug)]
struct Line {
    id: RequestId,
    span: tracing::Span,
    started: Instant,
    key_id: Option<Arc<str>>,
    asked: Option<String>,
    served: Option<Arc<str>>,
    /// None until an answer is settled: a request dropped before that
    /// was given up by its client (499, as proxies log it).
    status: Option<u16>,
    tokens: Option<Tokens>,
    ttft: Option<Duration>,
    stream: bool,
    end: Option<StreamEnd>,
    /// The id of the request's usage row, when usage is recorded: the
    /// line joins the client's request id to what was billed.
    usage_id: Option<String>,
    /// Its usage record was lost, not queued.
    usage_lost: bool,
}

/// A client's model name, bounded for the log.
fn bounded(s: &str) -> String {
    let mut end = s.len().min(MAX_ID);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

impl Access {
    /// Opens the line of a request with `id` (one is made when the request
    /// came another way than the client routes), inside the current span.
    pub(crate) fn start(id: Option<&RequestId>) -> Self {
        Access(Arc::new(Mutex::new(Line {
            id: id.cloned().unwrap_or_else(RequestId::new),
            span: tracing::Span::current(),
            started: Instant::now(),
            key_id: None,
            asked: None,
            served: None,
            status: None,
            tokens: None,
            ttft: None,
            stream: false,
            end: None,
            usage_id: None,
            usage_lost: false,
        })))
    }

    fn with(&self, f: impl FnOnce(&mut Line)) {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()));
    }

    pub(crate) fn id(&self) -> RequestId {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).id.clone()
    }

    pub(crate) fn key(&self, key_id: Arc<str>) {
        self.with(|l| l.key_id = Some(key_id));
    }

    pub(crate) fn asked(&self, model: &str, stream: bool) {
        self.with(|l| {
            l.asked = Some(bounded(model));
            l.stream = stream;
        });
    }

    pub(crate) fn status(&self, status: u16) {
        self.with(|l| l.status = Some(status));
    }

    pub(crate) fn served(&self, model: &Arc<str>, status: u16) {
        self.with(|l| {
            l.served = Some(model.clone());
            l.status = Some(status);
        });
    }

    pub(crate) fn finished(
        &self,
        tokens: Option<Tokens>,
        ttft: Option<Duration>,
        end: Option<StreamEnd>,
        usage_id: Option<&str>,
    ) {
        self.with(|l| {
            l.tokens = tokens;
            l.ttft = ttft;
            l.end = end;
            l.usage_id = usage_id.map(str::to_owned);
        });
    }

    /// The request's usage record was lost (its queue full): no row will
    /// bear the id the line would have named.
    pub(crate) fn usage_lost(&self) {
        self.with(|l| {
            l.usage_id = None;
            l.usage_lost = true;
        });
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let _in = self.span.enter();
        // Milliseconds to the microsecond: enough, and short to read.
        let ms = |d: Duration| (d.as_micros() as f64) / 1000.0;
        // Only of an answer relayed as a stream: a refusal or an error
        // answered whole has no stream to end (it read client_gone).
        let stream_end = match self.end {
            None => None,
            Some(StreamEnd::Complete) => Some("complete"),
            Some(StreamEnd::UpstreamError) => Some("upstream_error"),
            Some(StreamEnd::ClientGone) => Some("client_gone"),
            Some(StreamEnd::ServerStopping) => Some("server_stopping"),
        };
        tracing::info!(
            target: "llmgw::access",
            request_id = self.id.as_str(),
            client = self.id.client().map(tracing::field::display),
            key_id = self.key_id.as_deref(),
            model_asked = self.asked.as_deref(),
            model_served = self.served.as_deref(),
            status = self.status.unwrap_or(499),
            prompt_tokens = self.tokens.map(|t| t.prompt),
            completion_tokens = self.tokens.map(|t| t.completion),
            ttft_ms = self.ttft.map(ms),
            duration_ms = ms(self.started.elapsed()),
            stream = self.stream,
            stream_end,
            usage_id = self.usage_id.as_deref(),
            usage_lost = self.usage_lost.then_some(true),
            "request"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's span records its path: a claim link's token must not
    /// be in it (at debug, every event of the request would carry it).
    #[test]
    fn a_claim_links_token_stays_out_of_the_requests_span() {
        let request = Request::builder()
            .uri("/claim/0123456789abcdef-secret")
            .body(axum::body::Body::empty())
            .unwrap();
        let request = std::sync::Mutex::new(request);
        let seen = crate::log_lines::written::written(
            |buf| tracing_subscriber::fmt::layer().with_writer(buf),
            tracing_subscriber::filter::LevelFilter::DEBUG,
            &|| {
                let (span, _) = open(&mut request.lock().unwrap(), None);
                span.in_scope(|| tracing::debug!("inside the request"));
            },
        );
        assert!(
            seen.contains("inside the request") && seen.contains("/claim/"),
            "{seen}"
        );
        assert!(!seen.contains("secret"), "{seen}");
        assert_eq!(logged_path("/v1/chat/completions"), "/v1/chat/completions");
    }

    #[test]
    fn only_short_visible_ascii_ids_are_kept() {
        let kept = |s: &[u8]| {
            let v = HeaderValue::from_bytes(s).unwrap();
            RequestId::from_client(Some(&v)).value == v
        };
        assert!(kept(b"abc-123"));
        assert!(kept(&[b'a'; 128]));
        assert!(!kept(&[b'a'; 129]));
        assert!(!kept(b"two words"));
        assert!(!kept(b"tab\there"));
        assert!(!kept("caf\u{e9}".as_bytes()));
        assert!(!kept(b""));
        let made = RequestId::from_client(None);
        assert_eq!(made.as_str().len(), 36, "a uuid: {}", made.as_str());
    }
}
