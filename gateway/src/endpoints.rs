//! The endpoints a gateway can send requests to, with the live state that
//! must survive an update of the set: in-flight counts and breaker state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::breaker::{Breaker, Pass};
use crate::scrape::{EngineKind, Load};

/// What an endpoint is, as configured or as the router view says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSpec {
    pub id: String,
    /// Base URL, e.g. `http://10.0.0.7:20001`.
    pub url: String,
    pub models: Vec<String>,
    pub pool: String,
    pub weight: u32,
    /// A tier: the highest-priority endpoints of a model take its
    /// requests while one of them has room; the next priority takes them
    /// when every one is full or cannot be used.
    pub priority: i32,
    pub engine: EngineKind,
    /// The node a placed replica runs on (for its metrics' labels); None
    /// for a configured endpoint.
    pub node: Option<String>,
    /// The credential a hosted upstream wants, sent as a bearer token.
    pub api_key: Option<UpstreamKey>,
    /// The engine's KV-cache events, when it publishes them.
    pub kv_events: Option<crate::kv_events::KvEventsSpec>,
}

/// An upstream's API key: read from a variable or a file (never the
/// command line, where `ps` shows it), sent as a bearer token, and never
/// printed, not even by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamKey(String);

impl UpstreamKey {
    pub fn new(key: String) -> Self {
        UpstreamKey(key)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for UpstreamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UpstreamKey(…)")
    }
}

/// The key named by `key_env=VAR` or `key_file=PATH`.
fn upstream_key(s: &str, k: &str, v: &str) -> Result<UpstreamKey, String> {
    let key = match k {
        "key_env" => {
            std::env::var(v).map_err(|_| format!("{s:?}: key_env names {v}, which is not set"))?
        }
        _ => std::fs::read_to_string(v).map_err(|e| format!("{s:?}: key_file {v}: {e}"))?,
    };
    let key = key.trim();
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{s:?}: the key in {k} {v} is empty or not one printable word"
        ));
    }
    Ok(UpstreamKey(key.to_owned()))
}

impl std::str::FromStr for EndpointSpec {
    type Err = String;

    /// `id=URL=model[,model…][;engine=E][;weight=N][;priority=N]
    /// [;key_env=VAR|;key_file=PATH][;kv_events=tcp://H:P;tokenizer=T
    /// [;kv_replay=tcp://H:P]]`, as `llmgw server --endpoint` takes it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut options = s.split(';');
        let main = options.next().unwrap_or_default();
        let mut parts = main.splitn(3, '=');
        let (Some(id), Some(url), Some(models)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("{s:?}: expected id=URL=model[,model…]"));
        };
        if id.is_empty() {
            return Err(format!("{s:?}: the endpoint id is empty"));
        }
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "{s:?}: the URL must start with http:// or https://"
            ));
        }
        // The API's paths are added to the URL: a base URL as OpenAI's
        // clients write it sent every request to /v1/v1/…, answered 404.
        if url.trim_end_matches('/').ends_with("/v1") {
            return Err(format!(
                "{s:?}: give the engine's root URL, without /v1: the API's paths (/v1/chat/completions, /metrics) are added to it"
            ));
        }
        let models: Vec<String> = models
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
            .collect();
        if models.is_empty() {
            return Err(format!("{s:?}: name at least one model"));
        }
        let mut spec = EndpointSpec {
            id: id.to_owned(),
            url: url.trim_end_matches('/').to_owned(),
            models,
            pool: "default".into(),
            weight: 1,
            priority: 0,
            engine: EngineKind::default(),
            node: None,
            api_key: None,
            kv_events: None,
        };
        let (mut kv_events, mut kv_replay, mut tokenizer) = (None, None, None);
        let mut given: Vec<&str> = Vec::new();
        for opt in options.filter(|o| !o.is_empty()) {
            let (k, v) = opt
                .split_once('=')
                .ok_or_else(|| format!("{s:?}: option {opt:?} is not key=value"))?;
            // The last one given won, unsaid: refused, as a key given
            // twice in the file is.
            if given.contains(&k) {
                return Err(format!("{s:?}: {k} is given twice; give it once"));
            }
            given.push(k);
            let num = |v: &str| {
                v.parse::<i64>()
                    .map_err(|_| format!("{s:?}: {k} must be a number"))
            };
            match k {
                "engine" => spec.engine = v.parse()?,
                "weight" => {
                    spec.weight = u32::try_from(num(v)?)
                        .ok()
                        .filter(|w| *w > 0)
                        .ok_or(format!("{s:?}: weight must be positive"))?
                }
                "priority" => {
                    spec.priority = i32::try_from(num(v)?)
                        .map_err(|_| format!("{s:?}: priority must fit 32 bits"))?
                }
                // Never read by routing: refused rather than passed over.
                "pool" => {
                    return Err(format!(
                        "{s:?}: pool= is not used: a model's endpoints are one pool, ranked by priority=N and shared by weight=N"
                    ));
                }
                "key_env" | "key_file" => {
                    if spec.api_key.is_some() {
                        return Err(format!("{s:?}: give one of key_env and key_file"));
                    }
                    spec.api_key = Some(upstream_key(s, k, v)?);
                }
                "kv_events" | "kv_replay" => {
                    crate::kv_events::check_address(v).map_err(|e| format!("{id}: {k}: {e}"))?;
                    let slot = if k == "kv_events" {
                        &mut kv_events
                    } else {
                        &mut kv_replay
                    };
                    *slot = Some(v.to_owned());
                }
                "tokenizer" => {
                    tokenizer = Some(
                        v.parse::<crate::kv_events::Tokenizer>()
                            .map_err(|e| format!("{id}: {e}"))?,
                    )
                }
                "key" | "api_key" => {
                    return Err(format!(
                        "{id}: an upstream key is never given on the command line or in the file: use key_env=VARIABLE or key_file=PATH"
                    ));
                }
                other => {
                    return Err(format!(
                        "{s:?}: unknown option {other:?} (engine, weight, priority, pool, key_env, key_file, kv_events, kv_replay, tokenizer)"
                    ));
                }
            }
        }
        spec.kv_events = match (kv_events, kv_replay, tokenizer) {
            (None, None, None) => None,
            (Some(publish), replay, Some(tokenizer)) => Some(crate::kv_events::KvEventsSpec {
                publish,
                replay,
                tokenizer,
            }),
            (Some(_), _, None) => {
                return Err(format!(
                    "{id}: kv_events needs tokenizer=: the gateway keys a request's blocks from the engine's tokens, and ships only the sim engine's tokenizer (tokenizer=sim)"
                ));
            }
            (None, _, _) => {
                return Err(format!(
                    "{id}: kv_replay and tokenizer belong to kv_events, which is not set"
                ));
            }
        };
        Ok(spec)
    }
}

/// What is shared by every version of an endpoint across updates.
#[derive(Debug)]
struct Live {
    in_flight: AtomicU32,
    /// When it was last picked (a stamp of [`PICKS`]; 0: never): among
    /// endpoints equally loaded, the one picked longest ago goes first, so
    /// light traffic takes turns rather than all going to the first id (a
    /// new endpoint gets one turn, not every request until it catches up).
    picked: std::sync::atomic::AtomicU64,
    breaker: Mutex<Breaker>,
    load: Mutex<Option<Load>>,
    /// Our own requests in flight when `load` was read: the engine's count
    /// holds them, and they may be done since.
    ours_at_scrape: AtomicU32,
    /// A scrape has been tried at least once.
    scraped: std::sync::atomic::AtomicBool,
    contract_warned: std::sync::atomic::AtomicBool,
    /// A fingerprint of the last request the engine answered a server
    /// error: the same request failing again counts once.
    last_erred: std::sync::atomic::AtomicU64,
    /// Since when the scraper has found nothing listening (no answer of
    /// any kind); None while the engine answers.
    silent_since: Mutex<Option<std::time::Instant>>,
}

/// Picks so far, process-wide: the stamps of [`Live::picked`].
static PICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The paths proxied to engines, whose URLs each endpoint keeps parsed.
const PROXIED: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

/// `base` + `path` as a URI if it is plain http without credentials
/// (reqwest would send those as basic auth; hyper's client would not).
fn plain_http(base: &str, path: &str) -> Option<Target> {
    let uri: axum::http::Uri = format!("{base}{path}").parse().ok()?;
    if uri.scheme() != Some(&axum::http::uri::Scheme::HTTP) {
        return None;
    }
    let address = uri.authority().filter(|a| !a.as_str().contains('@'))?;
    let host = host(address);
    Some(Target { uri, host })
}

/// The Host header for `address`: its port left out where it is http's
/// own, as browsers and hyper-util's client write it.
fn host(address: &axum::http::uri::Authority) -> axum::http::HeaderValue {
    let value = match address.port_u16() {
        Some(80) => axum::http::HeaderValue::from_str(address.host()),
        _ => axum::http::HeaderValue::from_str(address.as_str()),
    };
    value.expect("an Authority is a header value")
}

/// Where the proxy hop's own client sends a path of an endpoint: the
/// absolute URI, and the Host header for it (made once, not a copy a
/// request).
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) uri: axum::http::Uri,
    pub(crate) host: axum::http::HeaderValue,
}

/// An endpoint with its live state.
#[derive(Debug)]
pub struct Endpoint {
    pub spec: EndpointSpec,
    live: Arc<Live>,
    /// The URIs of [`PROXIED`] on this endpoint, parsed on first use:
    /// parsing one per request was ~4% of a saturated gateway's time. A
    /// new spec is a new `Endpoint`, so never stale.
    urls: [std::sync::OnceLock<Option<Target>>; 3],
    /// Each of `spec.models` as the served-model header's value (None
    /// where a name is not a header value), made once: copied for every
    /// answer, it was an allocation a request.
    model_headers: Vec<Option<axum::http::HeaderValue>>,
}

impl Endpoint {
    fn new(spec: EndpointSpec, breaker: &BreakerConfig) -> Self {
        let live = Arc::new(Live {
            in_flight: AtomicU32::new(0),
            picked: std::sync::atomic::AtomicU64::new(0),
            breaker: Mutex::new(Breaker::new(breaker.threshold, breaker.cool_down)),
            load: Mutex::new(None),
            ours_at_scrape: AtomicU32::new(0),
            scraped: std::sync::atomic::AtomicBool::new(false),
            contract_warned: std::sync::atomic::AtomicBool::new(false),
            last_erred: std::sync::atomic::AtomicU64::new(0),
            silent_since: Mutex::new(None),
        });
        Endpoint::with_live(spec, live)
    }

    /// `spec` with the in-flight count and breaker of `live`.
    fn with_live(spec: EndpointSpec, live: Arc<Live>) -> Self {
        Endpoint {
            live,
            urls: Default::default(),
            model_headers: (spec.models.iter())
                .map(|m| axum::http::HeaderValue::from_str(m).ok())
                .collect(),
            spec,
        }
    }

    /// `model` as the value of an answer's served-model header, if this
    /// endpoint serves it and it is a header value.
    pub(crate) fn model_header(&self, model: &str) -> Option<axum::http::HeaderValue> {
        let i = self.spec.models.iter().position(|m| m == model)?;
        self.model_headers[i].clone()
    }

    /// Where `path` is on this endpoint if the proxy hop's own client
    /// sends to it: plain http, no credentials in it (None: reqwest's
    /// client sends it, or meets the error; see `proxy::upstream`).
    pub(crate) fn target(&self, path: &str) -> Option<Target> {
        match PROXIED.iter().position(|p| *p == path) {
            Some(i) => self.urls[i]
                .get_or_init(|| plain_http(&self.spec.url, path))
                .clone(),
            None => plain_http(&self.spec.url, path),
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.live.in_flight.load(Ordering::Relaxed)
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.live.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn breaker_open(&self) -> bool {
        self.breaker().is_open()
    }

    /// What the metric shows: open, or cooled down with no probe yet
    /// while the scraper finds the engine gone or without fresh figures.
    /// A breaker that read closed five seconds after each failure made an
    /// alert on it flap, and at low traffic never fire; one cooled down
    /// whose engine answers its metrics again is not held as open until
    /// some request comes.
    pub fn breaker_tripped(&self, max_age: Duration) -> bool {
        use crate::breaker::BreakerState;
        match self.breaker().state() {
            BreakerState::Closed { .. } => false,
            BreakerState::Open { .. } | BreakerState::HalfOpen { probing: true } => true,
            BreakerState::HalfOpen { probing: false } => {
                self.stale(max_age) || self.silent(max_age)
            }
        }
    }

    /// The engine answered `body` a server error: counted against it
    /// unless it is the request it failed last. One client's request that
    /// the engine cannot take, sent again by the client's retries (an
    /// SDK's two) and the gateway's, opened every endpoint's breaker, and
    /// every client got 503s for the cool-down; an engine that fails every
    /// request fails different ones.
    pub fn record_erred(&self, body: &[u8]) {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        body.hash(&mut h);
        let print = h.finish();
        if self.live.last_erred.swap(print, Ordering::Relaxed) != print {
            self.record(false);
        }
    }

    pub fn record(&self, ok: bool) {
        let mut b = self.breaker();
        if ok { b.success() } else { b.failure() }
    }

    /// The outcome of one scrape: fresh figures, or none (failed, or
    /// broke the vocabulary contract).
    pub(crate) fn scraped(&self, load: Option<Load>) {
        self.live.scraped.store(true, Ordering::Relaxed);
        if let Some(load) = load {
            let mut held = self.live.load.lock().unwrap_or_else(|p| p.into_inner());
            self.live
                .ours_at_scrape
                .store(self.in_flight(), Ordering::Relaxed);
            *held = Some(load);
        }
    }

    /// True the first time only, so a broken contract is logged once.
    pub(crate) fn warn_contract_once(&self) -> bool {
        !self.live.contract_warned.swap(true, Ordering::Relaxed)
    }

    /// Whether the scraper reached the engine at all (any answer, its
    /// metrics or not).
    pub(crate) fn heard(&self, answered: bool) {
        let mut since = self
            .live
            .silent_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match (answered, *since) {
            (true, _) => *since = None,
            (false, None) => *since = Some(std::time::Instant::now()),
            (false, Some(_)) => {}
        }
    }

    /// Nothing has answered the scraper at the engine's address for
    /// longer than `max_age`: the engine is gone (not merely without a
    /// metrics page, which a hosted API or an engine started without one
    /// may be).
    pub fn silent(&self, max_age: Duration) -> bool {
        self.live
            .silent_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| t.elapsed() > max_age)
    }

    /// The last scraped load, if any.
    pub fn load(&self) -> Option<Load> {
        *self.live.load.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Scraped, but without usable figures in the last `max_age`. A new
    /// endpoint is not stale before its first scrape.
    pub fn stale(&self, max_age: Duration) -> bool {
        self.live.scraped.load(Ordering::Relaxed)
            && self.load().is_none_or(|l| l.at.elapsed() > max_age)
    }

    /// Requests on the engine: ours in flight now, and the others its
    /// figures report (running and waiting, less ours when they were read:
    /// a scrape that caught our own answer made the engine look busy until
    /// the next one, and light traffic all went elsewhere meanwhile).
    fn queue(&self, max_age: Duration) -> f64 {
        let ours = f64::from(self.in_flight());
        match self.load() {
            Some(l) if l.at.elapsed() <= max_age => {
                let then = f64::from(self.live.ours_at_scrape.load(Ordering::Relaxed));
                ours + (l.running + l.waiting - then).max(0.0)
            }
            _ => ours,
        }
    }

    pub fn serves(&self, model: &str) -> bool {
        self.spec.models.iter().any(|m| m == model)
    }

    /// How full the engine is by its fresh figures: the worse of waiting
    /// requests and KV occupancy against their ceilings (1 is full); 0
    /// without fresh figures.
    fn fill(&self, max_age: Duration, ceilings: Ceilings) -> f64 {
        match self.load() {
            Some(l) if l.at.elapsed() <= max_age => {
                let queue = l.waiting / ceilings.waiting.max(f64::EPSILON);
                let kv = (l.kv_usage).map_or(0.0, |k| k / ceilings.kv.max(f64::EPSILON));
                queue.max(kv)
            }
            _ => 0.0,
        }
    }
}

/// Where an engine counts as full: `admission.waiting_ceiling` requests
/// waiting, `admission.kv_ceiling` of its KV cache in use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ceilings {
    pub(crate) waiting: f64,
    pub(crate) kv: f64,
}

impl Default for Ceilings {
    fn default() -> Self {
        let admission = crate::admission::AdmissionConfig::default();
        Ceilings {
            waiting: admission.waiting_ceiling,
            kv: admission.kv_ceiling,
        }
    }
}

/// Counts a request against an endpoint until dropped.
#[derive(Debug)]
pub struct InFlight(Arc<Endpoint>, Option<u64>);

impl InFlight {
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.live.in_flight.fetch_sub(1, Ordering::Relaxed);
        // A probe dropped before its outcome (the client left) frees the
        // half-open slot; one with an outcome changes nothing here.
        if let Some(n) = self.1 {
            self.0.breaker().abandon(n);
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct BreakerConfig {
    pub threshold: u32,
    pub cool_down: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            threshold: 3,
            cool_down: Duration::from_secs(5),
        }
    }
}

/// The current endpoints; replaced whole on update, live state carried over.
#[derive(Debug)]
pub struct Endpoints {
    all: RwLock<Vec<Arc<Endpoint>>>,
    breaker: BreakerConfig,
    /// Scraped figures older than this are stale.
    max_age: Duration,
    /// Where an engine is full, and a tier without room.
    ceilings: Ceilings,
}

impl Endpoints {
    pub fn new(specs: Vec<EndpointSpec>, breaker: BreakerConfig, max_age: Duration) -> Self {
        let e = Endpoints {
            all: RwLock::new(Vec::new()),
            breaker,
            max_age,
            ceilings: Ceilings::default(),
        };
        e.update(specs);
        e
    }

    /// The set, with engines full at `ceilings` (admission's).
    pub(crate) fn with_ceilings(mut self, ceilings: Ceilings) -> Self {
        self.ceilings = ceilings;
        self
    }

    /// Replaces the set. An endpoint whose id survives keeps its in-flight
    /// count and breaker, even if its other fields changed.
    pub fn update(&self, specs: Vec<EndpointSpec>) {
        let mut all = self.all.write().unwrap_or_else(|p| p.into_inner());
        let old: HashMap<String, Arc<Endpoint>> =
            all.drain(..).map(|e| (e.spec.id.clone(), e)).collect();
        *all = specs
            .into_iter()
            .map(|spec| match old.get(&spec.id) {
                Some(e) if e.spec == spec => e.clone(),
                Some(e) => Arc::new(Endpoint::with_live(spec, e.live.clone())),
                None => Arc::new(Endpoint::new(spec, &self.breaker)),
            })
            .collect();
    }

    pub fn snapshot(&self) -> Vec<Arc<Endpoint>> {
        self.all().clone()
    }

    /// The set, read in place: the request path reads it a few times a
    /// request, and a snapshot cost an allocation each time.
    fn all(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Endpoint>>> {
        self.all.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether some endpoint's breaker lets traffic through and its
    /// engine has not gone silent for `max_age`: what `/ready` asks (a
    /// server cut off from its engines, with no traffic to open a
    /// breaker, is not ready, and leaves a balancer's rotation).
    pub fn any_ready(&self, max_age: Duration) -> bool {
        self.all()
            .iter()
            .any(|e| !e.breaker_open() && !e.silent(max_age) && !e.spec.models.is_empty())
    }

    /// Models with at least one endpoint whose breaker lets traffic through.
    pub fn routable_models(&self) -> Vec<String> {
        let mut models: Vec<String> = self
            .snapshot()
            .iter()
            .filter(|e| !e.breaker_open())
            .flat_map(|e| e.spec.models.clone())
            .collect();
        models.sort();
        models.dedup();
        models
    }

    /// Every model an endpoint is configured for, whatever its breaker
    /// says: what the operator set up stays listed while an engine is
    /// down (a client lists models once, at its start).
    pub fn models(&self) -> Vec<String> {
        let mut models: Vec<String> = (self.all().iter())
            .flat_map(|e| e.spec.models.iter().cloned())
            .collect();
        models.sort();
        models.dedup();
        models
    }

    /// Whether any endpoint publishes KV-cache events (a request's sim
    /// rendering is made only then).
    pub fn any_publish_kv_events(&self) -> bool {
        self.all().iter().any(|e| e.spec.kv_events.is_some())
    }

    pub fn knows_model(&self, model: &str) -> bool {
        self.all().iter().any(|e| e.serves(model))
    }

    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// Filter (serves the model, not excluded, breaker lets it through,
    /// figures fresh when any are), keep the tier requests go to
    /// ([`Self::tier`]), and order by load per unit of weight, least first
    /// (the least loaded picked longest ago first, other ties by id).
    pub fn candidates(&self, model: &str, exclude: &[String]) -> Vec<(Arc<Endpoint>, f64)> {
        let mut candidates: Vec<(Arc<Endpoint>, bool)> = self
            .all()
            .iter()
            .filter(|e| e.serves(model) && !exclude.contains(&e.spec.id) && !e.breaker_open())
            .map(|e| (e.clone(), e.stale(self.max_age)))
            .collect();
        // Route around stale figures, unless nothing else is left.
        if candidates.iter().any(|(_, stale)| !stale) {
            candidates.retain(|(_, stale)| !stale);
        }
        let Some(top) = self.tier(candidates.iter().map(|(e, _)| e), self.ceilings) else {
            return Vec::new();
        };
        // Collected in place: a pair of the same size and alignment.
        let mut scored: Vec<(Arc<Endpoint>, f64)> = candidates
            .into_iter()
            .filter(|(e, _)| e.spec.priority == top)
            .map(|(e, _)| {
                let score = (e.queue(self.max_age) + 1.0) / f64::from(e.spec.weight.max(1));
                (e, score)
            })
            .collect();
        scored.sort_by(|(a, x), (b, y)| x.total_cmp(y).then_with(|| a.spec.id.cmp(&b.spec.id)));
        // Among the least loaded, the one picked longest ago goes first.
        // Each stamp is read once: requests move them while this runs, and
        // a sort's comparator must see one order.
        if let Some(least) = scored.first().map(|(_, s)| *s) {
            let equal = scored.iter().take_while(|(_, s)| *s == least).count();
            if equal > 1 {
                let oldest = scored[..equal]
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, (e, _))| e.live.picked.load(Ordering::Relaxed))
                    .map_or(0, |(i, _)| i);
                scored[..equal].rotate_left(oldest);
            }
        }
        scored
    }

    /// Counts a request against `e`, unless its breaker just refused (a
    /// half-open breaker lets one probe through).
    pub fn take(&self, e: &Arc<Endpoint>) -> Option<InFlight> {
        let probe = match e.breaker().try_acquire() {
            Pass::Refused => return None,
            Pass::Request => None,
            Pass::Probe(n) => Some(n),
        };
        e.live.in_flight.fetch_add(1, Ordering::Relaxed);
        e.live
            .picked
            .store(PICKS.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
        Some(InFlight(e.clone(), probe))
    }

    /// The least-loaded candidate, counted.
    pub fn pick(&self, model: &str, exclude: &[String]) -> Option<InFlight> {
        let mut exclude = exclude.to_vec();
        loop {
            let (best, _) = self.candidates(model, &exclude).into_iter().next()?;
            if let Some(f) = self.take(&best) {
                return Some(f);
            }
            exclude.push(best.spec.id.clone());
        }
    }

    /// The priority whose endpoints take requests, of `endpoints` (those
    /// that may be used): the highest with an endpoint that is not full
    /// ([`Endpoint::fill`] under 1), else, every one full, the highest. So
    /// a lower priority takes the overflow of a full higher one (it got
    /// nothing while the higher was full, and admission read the model
    /// as full though the lower sat idle), and a higher one takes
    /// everything while it has room.
    fn tier<'a>(
        &self,
        endpoints: impl Iterator<Item = &'a Arc<Endpoint>> + Clone,
        ceilings: Ceilings,
    ) -> Option<i32> {
        let top = endpoints.clone().map(|e| e.spec.priority).max()?;
        // One priority, as most models have: nothing to read.
        if endpoints.clone().all(|e| e.spec.priority == top) {
            return Some(top);
        }
        let room = endpoints
            .filter(|e| e.fill(self.max_age, ceilings) < 1.0)
            .map(|e| e.spec.priority)
            .max();
        Some(room.unwrap_or(top))
    }

    /// How full the pool serving `model` is, read where requests go: on
    /// the least saturated endpoint of the tier that takes them (as
    /// [`Self::candidates`] chooses it), the worse of waiting requests
    /// and KV occupancy against their ceilings. So it is full only when
    /// no tier has room. Endpoints without fresh figures count as empty.
    pub fn saturation(&self, model: &str, waiting_ceiling: f64, kv_ceiling: f64) -> f64 {
        self.saturation_of(model, waiting_ceiling, kv_ceiling)
            .unwrap_or(0.0)
    }

    /// [`Self::saturation`], or None when no endpoint of `model` lets
    /// requests through (none serves it, or every breaker is open).
    pub fn saturation_of(&self, model: &str, waiting_ceiling: f64, kv_ceiling: f64) -> Option<f64> {
        let ceilings = Ceilings {
            waiting: waiting_ceiling,
            kv: kv_ceiling,
        };
        let all = self.all();
        let open = || all.iter().filter(|e| e.serves(model) && !e.breaker_open());
        // Stale figures are routed around unless nothing else is left, so
        // they are read only then.
        let fresh = open().any(|e| !e.stale(self.max_age));
        let usable = || open().filter(move |e| !fresh || !e.stale(self.max_age));
        let top = self.tier(usable(), ceilings)?;
        usable()
            .filter(|e| e.spec.priority == top)
            .map(|e| e.fill(self.max_age, ceilings))
            .reduce(f64::min)
    }

    /// Whether anything runs or waits on an endpoint of `model`: by this
    /// gateway's count, or by the engine's own fresh figures (every
    /// server's requests).
    pub fn in_use(&self, model: &str) -> bool {
        self.all().iter().filter(|e| e.serves(model)).any(|e| {
            e.in_flight() > 0
                || e.load()
                    .is_some_and(|l| l.at.elapsed() <= self.max_age && l.running + l.waiting > 0.0)
        })
    }

    /// Requests on an endpoint by our count and the engine's, for affinity's
    /// overload guard.
    pub fn load_of(&self, e: &Endpoint) -> f64 {
        e.queue(self.max_age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, priority: i32, weight: u32) -> EndpointSpec {
        EndpointSpec {
            id: id.into(),
            url: format!("http://{id}"),
            models: vec!["m".into()],
            pool: "p".into(),
            weight,
            priority,
            engine: EngineKind::default(),
            node: None,
            api_key: None,
            kv_events: None,
        }
    }

    #[test]
    fn endpoint_flags_parse_and_bad_ones_say_why() {
        let e: EndpointSpec = "a=http://10.0.0.1:8000/=llama,qwen".parse().unwrap();
        assert_eq!(
            (e.id.as_str(), e.url.as_str(), e.models.len()),
            ("a", "http://10.0.0.1:8000", 2)
        );
        for bad in ["a=http://x", "=http://x=m", "a=ftp://x=m", "a=http://x="] {
            assert!(bad.parse::<EndpointSpec>().is_err(), "{bad}");
        }
        let e: EndpointSpec = "a=http://x=m;priority=-2147483648".parse().unwrap();
        assert_eq!(e.priority, i32::MIN);
        let e: EndpointSpec =
            "a=http://x=m;kv_events=tcp://x:5557;kv_replay=tcp://x:5558;tokenizer=sim"
                .parse()
                .unwrap();
        assert_eq!(e.kv_events.unwrap().replay.as_deref(), Some("tcp://x:5558"));
        for (bad, why) in [
            ("a=http://x=m;kv_events=tcp://x:5557", "needs tokenizer="),
            (
                "a=http://x=m;kv_events=tcp://x:5557;tokenizer=llama3",
                "not supported",
            ),
            (
                "a=http://x=m;kv_events=x:5557;tokenizer=sim",
                "not tcp://HOST:PORT",
            ),
            (
                "a=http://x=m;kv_replay=tcp://x:5558",
                "kv_events, which is not set",
            ),
            (
                "a=http://x=m;priority=4294967297",
                "priority must fit 32 bits",
            ),
            ("a=http://x=m;weight=0", "weight must be positive"),
            ("a=http://x=m;weight=2;weight=3", "weight is given twice"),
            ("a=http://x=m;pool=gpu", "pool= is not used"),
            ("a=http://x:8000/v1=m", "without /v1"),
            ("a=https://x/proxy/v1/=m", "without /v1"),
        ] {
            let e = bad.parse::<EndpointSpec>().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_least_loaded_per_weight_wins_within_the_highest_priority_pool() {
        let set = Endpoints::new(
            vec![spec("a", 0, 1), spec("b", 0, 2), spec("c", -1, 10)],
            BreakerConfig::default(),
            Duration::from_secs(6),
        );
        let first = set.pick("m", &[]).unwrap();
        assert_eq!(first.endpoint().spec.id, "b", "weight 2 halves its load");
        let second = set.pick("m", &[]).unwrap();
        assert_eq!(
            second.endpoint().spec.id,
            "a",
            "b now has one in flight: (1+1)/2 = 1 = a's (0+1)/1, tie by id"
        );
        let third = set.pick("m", &["a".into(), "b".into()]).unwrap();
        assert_eq!(
            third.endpoint().spec.id,
            "c",
            "a lower pool only when the higher has none"
        );
        assert!(set.pick("other", &[]).is_none());
    }

    /// A scrape that caught our own answer on an engine counts that answer
    /// only while it runs: done, the engine is as free as the other (it
    /// looked busy until the next scrape, and light traffic all went to
    /// the other); another gateway's requests it reports still count.
    #[test]
    fn our_own_requests_in_a_scrape_count_only_while_they_run() {
        let set = Endpoints::new(
            vec![spec("a", 0, 1), spec("b", 0, 1)],
            BreakerConfig::default(),
            Duration::from_secs(6),
        );
        let load = |running: f64| {
            Some(crate::scrape::Load {
                running,
                waiting: 0.0,
                kv_usage: None,
                at: tokio::time::Instant::now(),
            })
        };
        let held = set.pick("m", &[]).unwrap();
        assert_eq!(held.endpoint().spec.id, "a");
        let now = set.snapshot();
        now[0].scraped(load(1.0));
        now[1].scraped(load(0.0));
        assert_eq!(set.load_of(&now[0]), 1.0, "ours, running");
        drop(held);
        assert_eq!(set.load_of(&now[0]), 0.0, "ours, done");
        // Equally free, b's turn; two more than ours at its scrape are
        // another gateway's, still there once ours is done.
        let held = set.pick("m", &[]).unwrap();
        assert_eq!(held.endpoint().spec.id, "b");
        now[1].scraped(load(3.0));
        assert_eq!(set.load_of(&now[1]), 3.0);
        drop(held);
        assert_eq!(set.load_of(&now[1]), 2.0);
    }

    /// Saturation is read where requests go: a lower tier that gets none
    /// while the higher has room (a hosted overflow, say) does not make a
    /// busy one look empty; once the higher is full, the lower takes the
    /// requests and is read; with every tier full, the highest is.
    #[test]
    fn saturation_reads_the_tier_requests_go_to() {
        let set = Endpoints::new(
            vec![spec("hi", 10, 1), spec("lo", 0, 1)],
            BreakerConfig::default(),
            Duration::from_secs(6),
        );
        let waiting = |i: usize, waiting: f64| {
            set.snapshot()[i].scraped(Some(crate::scrape::Load {
                running: 1.0,
                waiting,
                kv_usage: None,
                at: tokio::time::Instant::now(),
            }))
        };
        let first = |set: &Endpoints| set.candidates("m", &[])[0].0.spec.id.clone();
        waiting(0, 4.0);
        assert_eq!(set.saturation("m", 8.0, 0.9), 0.5);
        assert_eq!(first(&set), "hi");
        assert_eq!(set.candidates("m", &[]).len(), 1, "lo gets nothing");
        waiting(0, 8.0);
        assert_eq!(set.saturation("m", 8.0, 0.9), 0.0, "lo has room");
        assert_eq!(first(&set), "lo", "the overflow");
        waiting(1, 12.0);
        assert_eq!(set.saturation("m", 8.0, 0.9), 1.0, "no tier has room");
        assert_eq!(first(&set), "hi");
        assert_eq!(set.saturation("other", 8.0, 0.9), 0.0);
        assert_eq!(set.saturation_of("other", 8.0, 0.9), None);
    }

    /// What `llmgw_endpoint_breaker_open` shows: a cooled-down breaker
    /// with no probe yet stays tripped while the engine's figures are
    /// stale, and reads closed once they are fresh again.
    #[tokio::test(start_paused = true)]
    async fn a_cooled_down_breaker_is_tripped_until_the_engine_shows_it_is_back() {
        let max_age = Duration::from_secs(6);
        let set = Endpoints::new(vec![spec("a", 0, 1)], BreakerConfig::default(), max_age);
        let e = set.snapshot()[0].clone();
        for _ in 0..3 {
            e.record(false);
        }
        e.scraped(None);
        assert!(e.breaker_tripped(max_age), "open");
        tokio::time::advance(BreakerConfig::default().cool_down + Duration::from_millis(1)).await;
        assert!(!e.breaker_open(), "cooled down: a probe may go");
        assert!(
            e.breaker_tripped(max_age),
            "but nothing shows the engine back"
        );
        e.scraped(Some(crate::scrape::Load {
            running: 0.0,
            waiting: 0.0,
            kv_usage: None,
            at: tokio::time::Instant::now(),
        }));
        assert!(!e.breaker_tripped(max_age), "its figures are fresh again");
    }

    #[test]
    fn an_update_keeps_the_live_state_of_surviving_endpoints() {
        let set = Endpoints::new(
            vec![spec("a", 0, 1), spec("b", 0, 1)],
            BreakerConfig::default(),
            Duration::from_secs(6),
        );
        let held = set.pick("m", &[]).unwrap();
        assert_eq!(held.endpoint().spec.id, "a");
        for _ in 0..3 {
            set.snapshot()[1].record(false);
        }
        set.update(vec![spec("a", 0, 1), spec("b", 0, 5), spec("c", 0, 1)]);
        let now = set.snapshot();
        assert_eq!(now[0].in_flight(), 1, "a kept its in-flight count");
        assert!(
            now[1].breaker_open(),
            "b kept its open breaker though its weight changed"
        );
        assert_eq!(now.len(), 3);
        drop(held);
        assert_eq!(set.snapshot()[0].in_flight(), 0);
    }

    /// A half-open probe whose request is dropped before its outcome (the
    /// client hung up) lets the next request probe; before, the endpoint
    /// got no traffic again until the gateway restarted.
    #[tokio::test(start_paused = true)]
    async fn a_probe_dropped_without_an_outcome_lets_the_next_request_probe() {
        let set = Endpoints::new(
            vec![spec("a", 0, 1)],
            BreakerConfig {
                threshold: 1,
                cool_down: Duration::from_secs(1),
            },
            Duration::from_secs(6),
        );
        set.pick("m", &[]).unwrap().endpoint().record(false);
        assert!(set.pick("m", &[]).is_none(), "open");
        tokio::time::advance(Duration::from_secs(1)).await;
        let probe = set.pick("m", &[]).expect("the probe");
        assert!(set.pick("m", &[]).is_none(), "one probe at a time");
        drop(probe);
        let next = set.pick("m", &[]).expect("the next request probes");
        next.endpoint().record(true);
        drop(next);
        assert!(!set.snapshot()[0].breaker_open());
        assert!(
            set.pick("m", &[]).is_some() && set.pick("m", &[]).is_some(),
            "closed"
        );
    }

    #[test]
    fn only_plain_http_urls_go_to_the_hops_own_client() {
        let uri = |base: &str| {
            let mut s = spec("a", 0, 1);
            s.url = base.into();
            Endpoint::new(s, &BreakerConfig::default())
                .target("/v1/chat/completions")
                .map(|t| t.uri.to_string())
        };
        assert_eq!(
            uri("http://10.0.0.1:8000").as_deref(),
            Some("http://10.0.0.1:8000/v1/chat/completions")
        );
        assert_eq!(
            uri("HTTP://engine/base").as_deref(),
            Some("http://engine/base/v1/chat/completions")
        );
        // reqwest's client sends these: TLS, credentials as basic auth,
        // and what only it parses (or reports).
        assert_eq!(uri("https://api.example.com"), None);
        assert_eq!(uri("http://user:pw@engine:8000"), None);
        assert_eq!(uri("http://engine /x"), None);
    }

    #[test]
    fn the_host_header_leaves_out_only_the_default_port() {
        let host = |base: &str| {
            let mut s = spec("a", 0, 1);
            s.url = base.into();
            let target = Endpoint::new(s, &BreakerConfig::default())
                .target("/v1/completions")
                .unwrap();
            target.host.to_str().unwrap().to_owned()
        };
        assert_eq!(host("http://10.0.0.1:8000"), "10.0.0.1:8000");
        assert_eq!(host("http://engine:80/base"), "engine");
        assert_eq!(host("http://engine"), "engine");
        assert_eq!(host("http://[::1]:8080"), "[::1]:8080");
    }
}
