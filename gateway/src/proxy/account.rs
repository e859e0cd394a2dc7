//! Stage four: what a request cost, when it ends (its stream finished, the
//! client went away, or nothing answered). The rates charged at admission
//! are settled with the engine's count; a served request becomes a usage
//! record naming the model asked for and the model that served (which is
//! the one priced) and feeds the metrics.

use std::sync::Arc;
use std::time::Duration;

use llmgw_domain::tenancy::Band;
use llmgw_projections::KeyEntry;

use crate::Gateway;
use crate::access::StreamEnd;
use crate::limits::Charge;
use crate::usage::Tokens;

/// An admitted request's account, open until it is dropped.
#[derive(Debug)]
pub(crate) struct Ticket {
    gw: Arc<Gateway>,
    /// None with authentication off.
    key: Option<Arc<KeyEntry>>,
    pub(crate) band: Band,
    /// The canonical model the client asked for.
    pub(crate) asked: Arc<str>,
    charge: Charge,
    pub(crate) started: tokio::time::Instant,
    /// Tokens used, once known; the charge is settled to this.
    used: u64,
    /// The access line, written when the last of its holders lets go.
    pub(crate) access: crate::access::Access,
    /// Its estimate in the budget figures, released after its usage is
    /// queued (so it is never counted by neither).
    _hold: Option<super::resolve::Hold>,
}

impl Ticket {
    pub(crate) fn open(
        gw: Arc<Gateway>,
        key: Option<&Arc<KeyEntry>>,
        asked: Arc<str>,
        admitted: super::admit::Admitted,
        started: tokio::time::Instant,
        access: crate::access::Access,
        hold: Option<super::resolve::Hold>,
    ) -> Self {
        Ticket {
            gw,
            key: key.cloned(),
            band: admitted.band,
            asked,
            charge: admitted.charge,
            started,
            used: 0,
            access,
            _hold: hold,
        }
    }
}

impl Ticket {
    pub(crate) fn gateway(&self) -> &Arc<Gateway> {
        &self.gw
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // A finished request may let a held-back one in.
        self.gw.admission.load_changed();
        // With authentication off nothing was charged.
        if let Some(key) = &self.key {
            let now = tokio::time::Instant::now();
            let levels = &key.limits.rates;
            self.gw.rates.settle(levels, &self.charge, self.used, now);
        }
    }
}

static REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn request_id() -> String {
    // The process id once: `std::process::id` is a system call each time.
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let pid = PID.get_or_init(std::process::id);
    let n = REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("req-{pid}-{n}")
}

/// The key and project of a request made with authentication off: one
/// empty name shared by all of them.
fn none() -> Arc<str> {
    static NONE: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    NONE.get_or_init(|| Arc::from("")).clone()
}

/// A request its client gave up on, as proxies log it.
pub(crate) const GIVEN_UP: u16 = 499;
/// The usage status of a stream its engine broke off: a bad gateway's.
const BROKEN_OFF: u16 = 502;

/// A served request: recorded when dropped, at the end of its stream or
/// when the client goes away mid-stream.
#[derive(Debug)]
pub(crate) struct Finish {
    ticket: Ticket,
    served: Arc<str>,
    status: u16,
    pub(crate) first_content: Option<Duration>,
    pub(crate) tokens: Option<Tokens>,
    /// How a stream ended, when it did (None: still running when
    /// dropped, so the client went away).
    pub(crate) end: Option<crate::access::StreamEnd>,
    /// Relayed as a stream: one dropped before its end was cut off by
    /// its client.
    pub(crate) streamed: bool,
}

impl Finish {
    /// `served` shares the ticket's name when the model asked for served.
    pub(crate) fn new(ticket: Ticket, served: &str, status: u16) -> Self {
        let served = if served == &*ticket.asked {
            ticket.asked.clone()
        } else {
            served.into()
        };
        ticket.access.served(&served, status);
        Finish {
            ticket,
            served,
            status,
            first_content: None,
            tokens: None,
            end: None,
            streamed: false,
        }
    }

    /// The model that served, as the usage record and the metrics name it.
    pub(crate) fn served(&self) -> &Arc<str> {
        &self.served
    }

    pub(crate) fn started(&self) -> tokio::time::Instant {
        self.ticket.started
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        let gw = &self.ticket.gw;
        // Named before the access line is written, which carries it.
        let usage_id = gw.usage.as_ref().map(|_| request_id());
        // A stream that ended without its end being seen was left by its
        // client, or cut by a graceful stop's end (which a client did not
        // choose, and is counted as the server's).
        let cut = self.streamed && self.end.is_none() && gw.cut.fired();
        if cut {
            self.end = Some(StreamEnd::ServerStopping);
            self.status = 503;
        }
        let end = match (self.streamed, self.end) {
            (false, _) => None,
            (true, None) => Some(StreamEnd::ClientGone),
            (true, end) => end,
        };
        self.ticket
            .access
            .finished(self.tokens, self.first_content, end, usage_id.as_deref());
        let tokens = self.tokens.unwrap_or_default();
        gw.metrics.tokens(tokens.prompt, tokens.completion);
        // The ticket, dropped after this, settles the rates to this count.
        self.ticket.used = tokens.prompt.saturating_add(tokens.completion);
        if let Some(t) = self.first_content {
            gw.metrics.ttft(&self.served, t.as_secs_f64());
        }
        let (Some(q), Some(request_id)) = (&gw.usage, usage_id) else {
            return;
        };
        let t = &self.ticket;
        let millis = |d: Duration| d.as_millis().min(u128::from(u32::MAX)) as u32;
        let at = llmgw_domain::UnixMillis::now();
        // Priced now: the flush that takes it to the log may come after a
        // price change, which must not reach back. What it costs its
        // budgets counts here from now, not from that flush.
        let price = gw.price_of(&self.served);
        let spending = t
            .key
            .as_ref()
            .filter(|k| !k.limits.budgets.is_empty())
            .and_then(|k| {
                let cost = price.cost(tokens.prompt, tokens.completion);
                crate::usage::Spending::of(k, cost, at.0)
            });
        let request = llmgw_domain::usage::FinishedRequest {
            request_id,
            key_id: t.key.as_ref().map_or_else(none, |k| k.key_id.clone()),
            project_id: t.key.as_ref().map_or_else(none, |k| k.project_id.clone()),
            model_asked: t.asked.clone(),
            model_served: self.served.clone(),
            prompt_tokens: tokens.prompt,
            completion_tokens: tokens.completion,
            // A stream its client left is recorded as given up, as a
            // plain request left before its answer is; one its engine broke
            // off (nowhere left to go on) as the failure it was, though its
            // head said 200 (what it was sent is charged, as for a cut).
            status: match end {
                Some(StreamEnd::ClientGone) if self.status < 300 => GIVEN_UP,
                Some(StreamEnd::UpstreamError) if self.status < 300 => BROKEN_OFF,
                _ => self.status,
            },
            latency_ms: millis(t.started.elapsed()),
            ttft_ms: self.first_content.map(millis),
            band: t.band,
            at,
            price,
        };
        // A record the queue could not take exists nowhere: the access line
        // says so, where its id sent an auditor looking for it.
        if !q.record_spending(request, spending) {
            self.ticket.access.usage_lost();
        }
    }
}
