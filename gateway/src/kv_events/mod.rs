//! What engines say their KV caches hold: vLLM's KV-cache events
//! (`--kv-events-config`), subscribed to per endpoint that offers them
//! (`kv_events=tcp://HOST:PORT`), kept as an exact index of which
//! endpoint holds which prompt blocks. Routing asks it for the prefix of a
//! request each such endpoint holds; endpoints without events (or whose
//! events stopped) are left to the approximate index in `affinity`.
//!
//! The index is never stale: it starts empty, and a lost subscription, a
//! gap in the batches' sequence numbers that the engine's replay socket
//! (`kv_replay=`) cannot fill, or an engine that restarted (its sequence
//! back at 0), drops what it held for that endpoint; until events flow
//! again, the endpoint is not live and the approximate index routes for
//! it. What an engine stored before the gateway listened is learnt from
//! replay when the engine still buffers it, else not at all (the index
//! may miss blocks, never invent them). A subscriber whose first batch is
//! not the engine's first (the engine published before the subscription
//! reached it) asks the replay socket from 0 for what it missed; blocks
//! whose parent the index never learnt are counted (`unchained`), the
//! sign of events lost.
//!
//! An endpoint live but silent (no batch applied since it was subscribed
//! to) and sent nothing since is `cold`: routing sends it a request first,
//! so that it has something to announce (see `affinity`). One is enough,
//! and more, sent before its first batch arrives (many at once under
//! load), would each be a prefill of what another engine holds. An engine
//! still silent after `COLD_REQUESTS` requests is taken to publish
//! nothing, with a warning.
//!
//! A request's blocks are keyed from its tokens, so the gateway must
//! tokenize as the engine does: `tokenizer=` names how, and only the sim
//! engine's (`sim`: its chat rendering, four bytes a token) is shipped;
//! any other endpoint's `kv_events` is refused at start.

mod index;
mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::watch;
use zeromq::{DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use index::Blocks;

/// How a gateway turns a request into the engine's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenizer {
    /// The sim engine's: a chat rendered as `role: content` lines and
    /// `assistant: `, four bytes a token (little-endian).
    Sim,
}

impl std::str::FromStr for Tokenizer {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sim" => Ok(Tokenizer::Sim),
            other => Err(format!(
                "tokenizer {other:?} is not supported: the gateway ships only the sim engine's (sim); an engine whose tokenizer it lacks cannot have its kv_events used"
            )),
        }
    }
}

/// An endpoint's KV-cache events, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsSpec {
    /// The engine's PUB socket, `tcp://HOST:PORT`.
    pub publish: String,
    /// Its replay (ROUTER) socket, if it has one.
    pub replay: Option<String>,
    pub tokenizer: Tokenizer,
}

/// `tcp://HOST:PORT`, checked.
pub(crate) fn check_address(s: &str) -> Result<(), String> {
    let ok = s
        .strip_prefix("tcp://")
        .and_then(|a| a.rsplit_once(':'))
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if ok {
        Ok(())
    } else {
        Err(format!("{s:?} is not tcp://HOST:PORT"))
    }
}

/// An endpoint's subscription as routing and tests see it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvState {
    /// Subscribed and caught up: routing trusts the index.
    pub live: bool,
    /// The last batch applied (None before the first).
    pub applied: Option<u64>,
    /// Blocks the engine holds, as far as its events tell.
    pub blocks: usize,
    /// Gaps that dropped the endpoint's entries (a lost subscription, an
    /// unfilled gap, an engine restart).
    pub resets: u64,
    /// Stored blocks whose parent the index did not know: a chain broken
    /// by batches lost (or stored before the gateway listened).
    pub unchained: u64,
    /// Requests routed to it while it was silent (since its entries were
    /// last dropped).
    pub cold_sent: u32,
}

/// Requests a live endpoint is sent in silence before it is taken to
/// announce nothing, with a warning: enough for an engine to publish its
/// first batch many times over.
pub const COLD_REQUESTS: u32 = 16;

impl KvState {
    /// Live, nothing announced yet, and sent nothing since.
    pub fn cold(&self) -> bool {
        self.silent() && self.cold_sent == 0
    }

    fn silent(&self) -> bool {
        self.live && self.applied.is_none()
    }

    /// Counts a request routed to it, if it is silent; true when that was
    /// the `COLD_REQUESTS`th (the moment to warn).
    fn sent(&mut self) -> bool {
        if !self.silent() {
            return false;
        }
        self.cold_sent = self.cold_sent.saturating_add(1);
        self.cold_sent == COLD_REQUESTS
    }
}

#[derive(Debug)]
struct Subscribed {
    spec: KvEventsSpec,
    blocks: Mutex<Blocks>,
    state: watch::Sender<KvState>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Subscribed {
    fn stop(&self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }
}

/// The exact index over every endpoint with events.
#[derive(Debug, Default)]
pub struct KvIndex {
    endpoints: Mutex<HashMap<String, Arc<Subscribed>>>,
}

/// A request's tokens, computed once for every endpoint asked.
#[derive(Debug, Default)]
pub(crate) struct RequestTokens {
    tokens: Vec<u32>,
    /// Block keys per block size, as endpoints ask.
    keys: Mutex<HashMap<usize, Arc<Vec<u64>>>>,
}

impl RequestTokens {
    /// The sim tokenizer's tokens of a rendered prompt.
    pub(crate) fn sim(rendered: &[u8]) -> Self {
        RequestTokens {
            tokens: rendered
                .chunks(4)
                .map(|t| {
                    let mut b = [0u8; 4];
                    b[..t.len()].copy_from_slice(t);
                    u32::from_le_bytes(b)
                })
                .collect(),
            keys: Mutex::default(),
        }
    }

    fn keys(&self, block_size: usize) -> Arc<Vec<u64>> {
        self.keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(block_size)
            .or_insert_with(|| Arc::new(index::block_keys(&self.tokens, block_size)))
            .clone()
    }
}

impl KvIndex {
    /// Follows the endpoint set: subscribes to the endpoints that offer
    /// events and were not yet subscribed to (or whose setting changed),
    /// and drops the rest. Needs a tokio runtime.
    pub(crate) fn follow(&self, specs: &[Arc<crate::Endpoint>]) {
        let mut all = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        let wanted: HashMap<&str, &KvEventsSpec> = specs
            .iter()
            .filter_map(|e| Some((e.spec.id.as_str(), e.spec.kv_events.as_ref()?)))
            .collect();
        all.retain(|id, s| {
            let keep = wanted.get(id.as_str()).is_some_and(|w| **w == s.spec);
            if !keep {
                s.stop();
            }
            keep
        });
        for (id, spec) in wanted {
            if all.contains_key(id) {
                continue;
            }
            let s = Arc::new(Subscribed {
                spec: spec.clone(),
                blocks: Mutex::default(),
                state: watch::Sender::new(KvState::default()),
                task: Mutex::new(None),
            });
            let task = tokio::spawn(subscribe(id.to_owned(), Arc::downgrade(&s)));
            *s.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
            all.insert(id.to_owned(), s);
        }
    }

    /// Ends every subscription (the gateway stops serving).
    pub(crate) fn stop(&self) {
        for (_, s) in self
            .endpoints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            s.stop();
        }
    }

    fn get(&self, endpoint: &str) -> Option<Arc<Subscribed>> {
        self.endpoints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(endpoint)
            .cloned()
    }

    /// The endpoint's subscription, to watch (None: it offers no events).
    pub fn state(&self, endpoint: &str) -> Option<watch::Receiver<KvState>> {
        self.get(endpoint).map(|s| s.state.subscribe())
    }

    /// Every subscription's state, by endpoint.
    pub fn states(&self) -> Vec<(String, KvState)> {
        let mut v: Vec<(String, KvState)> = self
            .endpoints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, s)| (id.clone(), *s.state.borrow()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Bytes of the request's prompt the endpoint is known to hold, when
    /// its events are live (None: ask the approximate index).
    pub(crate) fn held(&self, endpoint: &str, request: &RequestTokens) -> Option<usize> {
        let s = self.get(endpoint)?;
        if !s.state.borrow().live {
            return None;
        }
        let blocks = s.blocks.lock().unwrap_or_else(|p| p.into_inner());
        let Some(size) = blocks.block_size else {
            return Some(0);
        };
        let keys = request.keys(size);
        // The sim tokenizer: four bytes a token.
        Some(blocks.prefix(&keys) * size * 4)
    }

    /// Whether routing should prefer the endpoint for being cold.
    pub(crate) fn cold(&self, endpoint: &str) -> bool {
        self.get(endpoint).is_some_and(|s| s.state.borrow().cold())
    }

    /// A request was routed to the endpoint: counted while it is silent.
    pub(crate) fn sent(&self, endpoint: &str) {
        let Some(s) = self.get(endpoint) else { return };
        if !s.state.borrow().silent() {
            return;
        }
        let mut mute = false;
        s.state.send_modify(|st| mute = st.sent());
        if mute {
            tracing::warn!(endpoint = %endpoint, requests = COLD_REQUESTS, "kv events are live but the engine has announced nothing after this many requests were sent to it; check that it publishes its KV events (until it does, routing knows nothing of what it holds)");
        }
    }
}

/// Keeps the subscriptions in step with the endpoint set, checked every
/// `every` (configured endpoints, the only ones with events, change only
/// with the configuration).
pub(crate) async fn follow(gw: std::sync::Weak<crate::Gateway>, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
    loop {
        tick.tick().await;
        let Some(gw) = gw.upgrade() else { return };
        gw.kv_events.follow(&gw.endpoints.snapshot());
    }
}

/// The subscription's life: connect, catch up, follow; start again
/// (index dropped) whenever it breaks. Ends when the endpoint is gone.
async fn subscribe(id: String, me: std::sync::Weak<Subscribed>) {
    let mut backoff = Duration::from_millis(100);
    let mut warned = false;
    loop {
        let Some(s) = me.upgrade() else { return };
        let outcome = session(&s).await;
        s.reset(outcome.is_ok());
        match outcome {
            Ok(()) => {
                tracing::warn!(endpoint = %id, "kv events subscription lost; routing by the approximate index until it is back");
                backoff = Duration::from_millis(100);
                warned = false;
            }
            Err(e) if !warned => {
                tracing::warn!(endpoint = %id, error = %e, "kv events: cannot subscribe; routing by the approximate index meanwhile");
                warned = true;
            }
            Err(e) => {
                tracing::debug!(endpoint = %id, error = %e, "kv events: still cannot subscribe")
            }
        }
        drop(s);
        // Not synchronisation: the pause between attempts to reach an
        // engine that is away.
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

impl Subscribed {
    fn blocks(&self) -> std::sync::MutexGuard<'_, Blocks> {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops the endpoint's entries (routing asks the approximate index
    /// until it is live again); `counted` when a break forced it.
    fn reset(&self, counted: bool) {
        self.blocks().clear();
        self.state.send_modify(|st| {
            st.live = false;
            st.blocks = 0;
            st.applied = None;
            st.resets += u64::from(counted);
            st.cold_sent = 0;
        });
    }

    fn apply(&self, seq: u64, payload: &[u8]) {
        let mut b = self.blocks();
        match wire::decode_batch(payload) {
            Ok(events) => events.iter().for_each(|e| b.apply(e)),
            Err(e) => tracing::debug!(error = %e, "kv events batch skipped"),
        }
        let (blocks, unchained) = (b.len(), b.unchained);
        drop(b);
        self.state.send_modify(|st| {
            st.applied = Some(seq);
            st.blocks = blocks;
            st.unchained = unchained;
        });
    }

    fn set_live(&self) {
        self.state.send_modify(|st| st.live = true);
    }
}

type Error = String;

/// One subscription, until it breaks: Ok when the engine went away after
/// the subscription was made, Err when it could not be made.
async fn session(s: &Subscribed) -> Result<(), Error> {
    let mut sub = SubSocket::new();
    sub.subscribe("").await.map_err(|e| e.to_string())?;
    let mut monitor = sub.monitor();
    tokio::time::timeout(Duration::from_secs(5), sub.connect(&s.spec.publish))
        .await
        .map_err(|_| "connecting timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    // What the engine still buffers, from its first batch: whatever it
    // stored before the gateway listened (as far back as it buffers).
    let mut expected = match &s.spec.replay {
        Some(r) => catch_up(s, r, 0).await?,
        None => None,
    };
    s.set_live();
    loop {
        tokio::select! {
            ev = monitor.next() => match ev {
                Some(SocketEvent::Disconnected(_)) | None => return Ok(()),
                Some(_) => {}
            },
            m = sub.recv() => {
                let m = m.map_err(|e| e.to_string())?;
                let Some((seq, payload)) = frames(&m) else { continue };
                // Where a replay must start: after a gap, or from the
                // engine's first batch when the first one seen is not it
                // (the engine published before the subscription reached
                // it, and the replay at the start found nothing yet).
                let missed = match expected {
                    // The engine restarted: its cache is new.
                    Some(e) if seq == 0 && e > 0 => {
                        s.reset_keep_live();
                        None
                    }
                    // Already applied from a replay.
                    Some(e) if seq < e => continue,
                    Some(e) if seq > e => Some(e),
                    None if seq > 0 => Some(0),
                    _ => None,
                };
                if let Some(from) = missed {
                    match fill(s, from).await {
                        Some(next) => {
                            s.set_live();
                            expected = Some(next);
                            if seq < next {
                                continue;
                            }
                        }
                        // A gap in what was held: it may be wrong now.
                        None if expected.is_some() => s.reset_keep_live(),
                        // Nothing held yet: these blocks are unchained.
                        None => {}
                    }
                }
                s.apply(seq, payload);
                expected = Some(seq + 1);
            }
        }
    }
}

impl Subscribed {
    /// A reset while events keep flowing: entries dropped, counted, and
    /// the endpoint live again from the next batch on.
    fn reset_keep_live(&self) {
        self.reset(true);
        self.set_live();
    }
}

/// `[topic, seq, payload]`.
fn frames(m: &ZmqMessage) -> Option<(u64, &Bytes)> {
    let seq = m.get(1)?;
    let seq = u64::from_be_bytes(<[u8; 8]>::try_from(&seq[..]).ok()?);
    Some((seq, m.get(2)?))
}

/// The batches from `from` on, from the replay socket if the engine has
/// one and it answers: the next sequence number expected.
async fn fill(s: &Subscribed, from: u64) -> Option<u64> {
    let replay = s.spec.replay.as_ref()?;
    catch_up(s, replay, from).await.ok().flatten()
}

/// Asks the replay socket for the batches from `from` and applies them;
/// when its buffer no longer reaches back to `from`, the endpoint's
/// entries are dropped first (not at 0: nothing is held yet). Returns the
/// next sequence number expected, None when nothing was buffered.
async fn catch_up(s: &Subscribed, replay: &str, from: u64) -> Result<Option<u64>, Error> {
    let batches = tokio::time::timeout(Duration::from_secs(5), fetch(replay, from))
        .await
        .map_err(|_| "replay timed out".to_owned())??;
    if from > 0 && batches.first().is_none_or(|(seq, _)| *seq != from) {
        s.reset(true);
    }
    let mut next = None;
    for (seq, payload) in &batches {
        s.apply(*seq, payload);
        next = Some(seq + 1);
    }
    Ok(next)
}

/// The replay socket's answer: `["", seq, payload]…` then `["", -1, ""]`.
async fn fetch(replay: &str, from: u64) -> Result<Vec<(u64, Bytes)>, Error> {
    let mut dealer = DealerSocket::new();
    dealer.connect(replay).await.map_err(|e| e.to_string())?;
    let ask = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&from.to_be_bytes()),
    ])
    .map_err(|e| e.to_string())?;
    dealer.send(ask).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    loop {
        let m = dealer.recv().await.map_err(|e| e.to_string())?;
        let Some((seq, payload)) = frames(&m) else {
            return Err("a malformed replay answer".into());
        };
        if seq == u64::MAX {
            return Ok(out);
        }
        out.push((seq, payload.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_endpoint_is_cold_until_it_is_sent_a_request_or_announces() {
        let mut st = KvState::default();
        assert!(!st.cold(), "not live: the approximate index routes for it");
        st.live = true;
        assert!(st.cold());
        // Its first batch, whatever it says, ends it.
        let announced = KvState {
            applied: Some(0),
            ..st
        };
        assert!(!announced.cold());
        // One request sent to it ends its preference; silent through
        // COLD_REQUESTS requests, one warning.
        assert!(!st.sent());
        assert!(!st.cold(), "sent one: no longer preferred");
        let warnings = (1..COLD_REQUESTS + 3).filter(|_| st.sent()).count();
        assert_eq!(warnings, 1);
        assert_eq!(st.cold_sent, COLD_REQUESTS + 3);
        // Once it announced, nothing is counted.
        let mut announced = KvState {
            applied: Some(0),
            cold_sent: 0,
            ..st
        };
        assert!(!announced.sent());
        assert_eq!(announced.cold_sent, 0);
    }

    #[test]
    fn dropping_an_endpoints_entries_makes_it_cold_again() {
        let s = Subscribed {
            spec: KvEventsSpec {
                publish: "tcp://127.0.0.1:1".into(),
                replay: None,
                tokenizer: Tokenizer::Sim,
            },
            blocks: Mutex::default(),
            state: watch::Sender::new(KvState::default()),
            task: Mutex::new(None),
        };
        s.set_live();
        s.state.send_modify(|st| {
            st.applied = Some(3);
            st.cold_sent = COLD_REQUESTS;
        });
        assert!(!s.state.borrow().cold());
        // Its entries dropped: until its next batch it is fresh, and the
        // count of requests sent to it in silence starts again.
        s.reset_keep_live();
        assert!(s.state.borrow().cold());
    }
}
