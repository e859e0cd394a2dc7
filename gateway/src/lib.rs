//! The OpenAI-compatible data plane: endpoint choice, the streaming proxy,
//! breakers and retries; keys, rate limits per level, budgets and prices,
//! admission and usage capture. The request path's stages are in
//! `proxy/` (admit → resolve → forward → account).
//!
//! What must not: blocking a request on the database. Everything a request
//! needs is in memory (the endpoint set, the routing table, the tenancy and
//! usage views); usage leaves the request path through a bounded queue.
//!
//! The hot path parses only what routing needs (`model`, `stream`) and
//! forwards the original bytes; response bodies stream through chunk by
//! chunk, never buffered.

mod access;
pub mod admission;
pub mod affinity;
pub mod auth;
pub mod breaker;
mod convo;
mod cors;
mod endpoints;
mod error;
mod info;
pub mod kv_events;
pub mod limits;
mod listen;
pub mod log_lines;
mod metrics;
mod proxy;
mod responses;
mod routes;
pub mod scrape;
mod shutdown;
mod tls;
mod unflushed;
pub mod usage;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

pub use access::RequestId;
pub use convo::{ConvoSettings, sweep_every as sweep_conversations};
pub use endpoints::{BreakerConfig, Endpoint, EndpointSpec, Endpoints, InFlight, UpstreamKey};
pub use error::ApiError;
pub use info::{ModelCard, model_cards};
pub use listen::ConnectionLimits;
pub use listen::admin_guard::AdminToken;
pub use listen::conn::{Acceptor, Conn, ConnectionStats, Which};
pub use listen::grpc::serve_grpc;
pub use metrics::Metrics;
pub use proxy::{body_of, chat_as, fit_chat_turn};
pub use tls::{Incoming, ServerTls, TlsError, TlsListener, handshakes};

/// A map the request path looks up several times a request, keyed by what
/// operators named (scope ids, engine addresses) or by the digest of a key
/// already found, never by a string a client chooses: foldhash (seeded per
/// map) instead of SipHash, whose resistance to chosen keys these maps do
/// not need and which was ~8% of a request's instructions (the rate
/// windows alone hashed 32 times a request at four levels).
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub endpoints: Vec<EndpointSpec>,
    /// Largest request body accepted (413 beyond).
    pub body_limit: usize,
    /// The header that names a conversation for session affinity
    /// (lowercase; the body's `user` when absent).
    pub session_header: String,
    /// Origins whose web pages may call the API from a browser (`*`: any);
    /// empty, no CORS headers are sent and preflights are not answered.
    pub cors_origins: Vec<String>,
    /// Other endpoints tried after a failure before the first byte (and
    /// after a plain answer broke off mid-body).
    pub retries: u32,
    /// Continuations of one streamed answer on other replicas after its
    /// engine broke mid-answer; 0 ends such a stream with an error event.
    pub migration_limit: u32,
    pub breaker: BreakerConfig,
    pub connect_timeout: Duration,
    /// The most an engine may take to start its answer once the request
    /// is sent (its headers; a plain answer: the whole of it). A stream
    /// not begun is a failure like a refused connection (counted by the
    /// breaker, sent elsewhere); a plain answer not whole is given up
    /// (504), neither counted nor sent again: it may only be long.
    pub response_timeout: Duration,
    /// The most a streamed answer may go without a byte from its engine;
    /// then the answer is continued on another replica (as when its
    /// connection breaks), counted against the engine once it had begun.
    pub stream_idle_timeout: Duration,
    /// How often engine metrics are scraped; figures older than three
    /// intervals are stale.
    pub scrape_interval: Duration,
    pub affinity: affinity::AffinityConfig,
    pub admission: admission::AdmissionConfig,
    /// Model → models to try, in order, when it has no capacity.
    pub fallbacks: std::collections::HashMap<String, Vec<String>>,
    /// How long a request for an on-demand model waits for it to start.
    pub on_demand_wait: Duration,
    /// The price of a model the catalog gives none (and of every model in
    /// router-only mode). Zero, the default, is exempt from budgets.
    pub default_price: llmgw_domain::catalog::Price,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            endpoints: Vec::new(),
            body_limit: 8 * 1024 * 1024,
            session_header: "x-session-id".into(),
            cors_origins: Vec::new(),
            retries: 2,
            migration_limit: 3,
            breaker: BreakerConfig::default(),
            connect_timeout: Duration::from_secs(2),
            // As long as the OpenAI SDK's own default: a long answer that
            // is not streamed arrives whole, and only at its end.
            response_timeout: Duration::from_secs(600),
            // Envoy's stream idle default; long enough for a request
            // queued in a busy engine before its first token.
            stream_idle_timeout: Duration::from_secs(300),
            scrape_interval: Duration::from_secs(2),
            affinity: affinity::AffinityConfig::default(),
            admission: admission::AdmissionConfig::default(),
            fallbacks: Default::default(),
            on_demand_wait: Duration::from_secs(120),
            default_price: llmgw_domain::catalog::Price::ZERO,
        }
    }
}

/// Shared by every request.
#[derive(Debug)]
pub struct Gateway {
    pub endpoints: Endpoints,
    pub metrics: Metrics,
    /// For scraping engines' metrics and asking their tokenizers.
    pub(crate) client: reqwest::Client,
    /// The proxy hop's (see `proxy::upstream`).
    pub(crate) upstream: proxy::upstream::Client,
    pub(crate) affinity: affinity::Affinity,
    /// What engines that publish KV-cache events hold.
    pub kv_events: kv_events::KvIndex,
    pub(crate) routes: routes::RouteTable,
    /// Keys are required when set.
    pub(crate) keys: Option<auth::KeyDirectory>,
    pub admission: admission::Admission,
    pub(crate) config: GatewayConfig,
    pub(crate) usage: Option<Arc<usage::UsageQueue>>,
    /// Told of every request for an on-demand model (the control plane
    /// starts it and keeps it for its idle time).
    pub(crate) demand: std::sync::OnceLock<DemandHook>,
    /// Asked, before a request waits for an on-demand model, whether any
    /// node of the cluster could take it at all.
    pub(crate) placeable: std::sync::OnceLock<PlaceableHook>,
    pub(crate) held_back: std::sync::OnceLock<HeldBackHook>,
    pub(crate) routes_changed: tokio::sync::Notify,
    /// Fired when a graceful stop's grace is over and what is in flight
    /// is cut: a stream ended by it was cut here, not left by its client.
    pub(crate) cut: listen::Signal,
    pub(crate) rates: limits::RateLimits,
    /// When this gateway started (seconds since the epoch): the `created`
    /// of a model no catalog dates, such as a configured endpoint's.
    pub(crate) started_s: i64,
    /// Threads and memory notes, when this gateway keeps them.
    pub(crate) convo: std::sync::OnceLock<Arc<convo::Keeper>>,
    /// Open connections and caps of this process's listeners (the agent
    /// listener's too), for the metrics page.
    pub connections: Arc<ConnectionStats>,
}

/// Called with the canonical name of an on-demand model a request asked for.
pub struct DemandHook(pub Box<dyn Fn(&str) + Send + Sync>);

impl std::fmt::Debug for DemandHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DemandHook")
    }
}

/// Whether some node of the cluster could ever take a model (canonical
/// name): false only when no wait would help.
pub struct PlaceableHook(pub Box<dyn Fn(&str) -> bool + Send + Sync>);

impl std::fmt::Debug for PlaceableHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlaceableHook")
    }
}

/// How long the control plane holds an on-demand model back after its
/// starts failed (canonical name; None while it is not held back).
pub struct HeldBackHook(pub Box<HeldBackFn>);

/// What a [`HeldBackHook`] calls.
pub type HeldBackFn = dyn Fn(&str) -> Option<Duration> + Send + Sync;

impl std::fmt::Debug for HeldBackHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeldBackHook")
    }
}

impl Gateway {
    /// A gateway that records usage into `usage` when given (see
    /// [`usage::run_batcher`] for the other end).
    pub fn new(
        config: GatewayConfig,
        usage: Option<Arc<usage::UsageQueue>>,
    ) -> Result<Arc<Self>, reqwest::Error> {
        Self::with_keys(config, usage, None)
    }

    /// A gateway that requires API keys, looked up in `keys`.
    pub fn with_keys(
        config: GatewayConfig,
        usage: Option<Arc<usage::UsageQueue>>,
        keys: Option<auth::KeyDirectory>,
    ) -> Result<Arc<Self>, reqwest::Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            // Engines are reached directly: an HTTP_PROXY set for the
            // machine's way out (weights, packages) must not catch them.
            .no_proxy()
            .build()?;
        let upstream = proxy::upstream::Client::new(config.connect_timeout)?;
        Ok(Arc::new_cyclic(|me| Gateway {
            endpoints: Endpoints::new(
                config.endpoints.clone(),
                config.breaker,
                config.scrape_interval * 3,
            )
            .with_ceilings(endpoints::Ceilings {
                waiting: config.admission.waiting_ceiling,
                kv: config.admission.kv_ceiling,
            }),
            metrics: Metrics::new(me.clone()),
            client,
            upstream,
            affinity: affinity::Affinity::new(config.affinity.clone()),
            kv_events: kv_events::KvIndex::default(),
            routes: routes::RouteTable::new(
                config.fallbacks.clone(),
                (config.endpoints.iter())
                    .flat_map(|e| e.models.iter().cloned())
                    .collect(),
            ),
            keys,
            admission: admission::Admission::new(config.admission.clone()),
            config,
            usage,
            demand: std::sync::OnceLock::new(),
            placeable: std::sync::OnceLock::new(),
            held_back: std::sync::OnceLock::new(),
            routes_changed: tokio::sync::Notify::new(),
            cut: listen::Signal::default(),
            rates: limits::RateLimits::default(),
            started_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
            convo: std::sync::OnceLock::new(),
            connections: Arc::default(),
        }))
    }

    /// Sets what is told of requests for on-demand models; once.
    pub fn on_demand(&self, hook: DemandHook) {
        let _ = self.demand.set(hook);
    }

    /// Sets what says whether an on-demand model could be placed at all;
    /// once. Without it every such request waits `router.on_demand_wait`.
    pub fn placeable_with(&self, hook: PlaceableHook) {
        let _ = self.placeable.set(hook);
    }

    /// Sets what says how long an on-demand model is held back after its
    /// starts failed; once. Without it a request waits for such a model
    /// the whole `router.on_demand_wait`.
    pub fn held_back_with(&self, hook: HeldBackHook) {
        let _ = self.held_back.set(hook);
    }

    /// How long the control plane holds `model` back after failed
    /// starts, if it does (never without one).
    pub(crate) fn held_back(&self, model: &str) -> Option<Duration> {
        self.held_back.get().and_then(|hook| (hook.0)(model))
    }

    /// Whether the control plane says no node could ever take `model`
    /// (false without one: a router-only server cannot tell).
    pub(crate) fn fits_nowhere(&self, model: &str) -> bool {
        self.placeable.get().is_some_and(|hook| !(hook.0)(model))
    }

    /// How full the engines serving `model` (canonical) are, as admission
    /// reads it: 1 or more is at the ceilings (`admission.waiting_ceiling`,
    /// `admission.kv_ceiling`) on every endpoint that serves it.
    pub fn saturation(&self, model: &str) -> f64 {
        let cfg = &self.admission.config;
        self.endpoints
            .saturation(model, cfg.waiting_ceiling, cfg.kv_ceiling)
    }

    /// What `model` (canonical) is charged at: the catalog's price, else
    /// the configured default. For the usage batcher: `move |m|
    /// gw.price_of(m)`, called with the model that served.
    pub fn price_of(&self, model: &str) -> llmgw_domain::catalog::Price {
        let routes = self.routes.load();
        proxy::price(self, &routes, model)
    }
}

/// The client-facing routes. Under `/v1` every answer is the API's JSON
/// envelope, a path or a method it does not have included: an SDK then
/// raises its own error with the reason rather than a bare status.
pub fn client_app(gw: Arc<Gateway>) -> Router {
    let cors = !gw.config.cors_origins.is_empty();
    let app = Router::new()
        .route("/v1/chat/completions", api(post(proxy::handle)))
        .route("/v1/completions", api(post(proxy::handle)))
        .route("/v1/embeddings", api(post(proxy::handle)))
        .route(responses::PATH, api(post(proxy::handle)))
        // Responses are not kept, so none can be read, cancelled or
        // deleted by id: said in the API's envelope.
        .route(
            "/v1/responses/{*id}",
            axum::routing::any(responses::not_kept),
        )
        .route("/v1/models", api(get(info::models)))
        // A model's name may hold a `/` (`org/model`), sent as is.
        .route("/v1/models/{*id}", api(get(info::model)))
        .route("/me", get(info::me))
        .route(
            "/v1/threads/{id}",
            api(get(convo::read_thread).delete(convo::delete_thread)),
        )
        .route("/v1", axum::routing::any(unknown_route))
        .route("/v1/", axum::routing::any(unknown_route))
        .route("/v1/{*rest}", axum::routing::any(unknown_route))
        // The API's paths without `/v1`: a client's base URL that lacks it
        // (a common slip) is told so in the API's envelope, where the
        // pages' HTML 404 left an SDK with a bare "404". (`/chat/
        // completions` is the chat page's, which says the same to a key.)
        .route("/models", axum::routing::any(without_v1))
        .route("/models/{*id}", axum::routing::any(without_v1))
        .route("/completions", axum::routing::any(without_v1))
        .route("/embeddings", axum::routing::any(without_v1))
        .route("/responses", axum::routing::any(without_v1))
        .route("/responses/{*id}", axum::routing::any(without_v1))
        .merge(convo::memory_routes())
        .merge(convo::mcp_routes())
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(info::ready));
    // Off by default: a request's path then meets no layer of it.
    let app = if cors {
        app.layer(axum::middleware::from_fn_with_state(
            gw.clone(),
            cors::layer,
        ))
    } else {
        app
    };
    app.with_state(gw)
}

/// An API route that answers a method it does not take in the envelope.
fn api<S: Clone + Send + Sync + 'static>(
    route: axum::routing::MethodRouter<S>,
) -> axum::routing::MethodRouter<S> {
    route.fallback(
        |method: axum::http::Method, uri: axum::http::Uri| async move {
            ApiError::wrong_method(&method, uri.path())
        },
    )
}

async fn unknown_route(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::unknown_route(&method, uri.path())
}

async fn without_v1(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    let mut e = ApiError::unknown_route(&method, uri.path());
    e.message
        .push_str(" The API is under /v1: give clients a base URL that ends in /v1.");
    e
}

/// The admin routes (loopback by default): health and metrics for now.
pub fn admin_app(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics::page))
        // An empty 404 left a person, or an SDK pointed here by mistake,
        // with nothing to go on.
        .fallback(|uri: axum::http::Uri| async move {
            // Under /api/ a bare 404 stays: `ctl` reads it as a server
            // with no control plane (router-only) and says so.
            let text = if uri.path().starts_with("/api/") {
                String::new()
            } else {
                format!(
                    "nothing at {} on the admin listener: its pages are under /admin, the admin API under /api/v1, with /metrics and /health; the OpenAI API is on the client listener\n",
                    uri.path()
                )
            };
            (axum::http::StatusCode::NOT_FOUND, text)
        })
        .with_state(gw)
}

/// Metrics only, for a port Prometheus may reach.
pub fn metrics_app(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/metrics", get(metrics::page))
        .with_state(gw)
}

/// Which listener was bound where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Client(SocketAddr),
    Admin(SocketAddr),
    Metrics(SocketAddr),
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving")]
    Io(#[from] std::io::Error),
}

/// Binds every listener, reports where, and serves until dropped.
pub async fn serve(
    gw: Arc<Gateway>,
    client: SocketAddr,
    admin: SocketAddr,
    metrics: Option<SocketAddr>,
    on_bound: impl FnMut(Listener),
) -> Result<(), ServeError> {
    let listen = Listen {
        client,
        client_tls: None,
        admin,
        admin_token: None,
        metrics,
        connections: ConnectionLimits::default(),
    };
    let stop = Stop {
        signal: Box::pin(std::future::pending()),
        grace: Duration::ZERO,
    };
    serve_with(gw, listen, Extra::default(), stop, on_bound).await
}

/// Routes served beside the gateway's own.
#[derive(Debug, Default)]
pub struct Extra {
    /// On the client listener (the pages).
    pub client: Router,
    /// On the admin listener (the control plane's API, the admin pages).
    pub admin: Router,
}

/// Where the listeners bind.
#[derive(Debug, Clone)]
pub struct Listen {
    /// The OpenAI API and the pages.
    pub client: SocketAddr,
    /// HTTPS on the client listener when set.
    pub client_tls: Option<ServerTls>,
    pub admin: SocketAddr,
    /// The token every admin request but `/health` must carry, when set.
    pub admin_token: Option<AdminToken>,
    /// Metrics only, when set.
    pub metrics: Option<SocketAddr>,
    /// Caps and timeouts of every listener.
    pub connections: ConnectionLimits,
}

/// How serving ends: at `signal` every listener stops accepting and idle
/// connections close; requests and streams in flight get `grace` to
/// finish, then they are cut.
pub struct Stop {
    pub signal: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    pub grace: Duration,
}

impl std::fmt::Debug for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stop").field("grace", &self.grace).finish()
    }
}

/// As [`serve`], with more routes on the client and admin listeners, and a
/// graceful stop: returns once `stop.signal` has come and every
/// connection has closed (at most `stop.grace` later).
pub async fn serve_with(
    gw: Arc<Gateway>,
    listen: Listen,
    extra: Extra,
    stop: Stop,
    mut on_bound: impl FnMut(Listener),
) -> Result<(), ServeError> {
    use std::future::Future;
    use tokio::sync::watch;
    let limits = listen.connections;
    let bind = |addr: SocketAddr, which: Which| {
        let stats = gw.connections.clone();
        async move {
            let tcp = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Bind { addr, source })?;
            Ok::<_, ServeError>(Acceptor::new(tcp, which, limits.max(which), None, stats))
        }
    };
    let client_l = bind(listen.client, Which::Client).await?;
    let admin_l = bind(listen.admin, Which::Admin).await?;
    let metrics_l = match listen.metrics {
        Some(m) => Some(bind(m, Which::Metrics).await?),
        None => None,
    };
    // Subscribed before the listeners are reported, so that whoever waits
    // for them finds every subscription's state.
    gw.kv_events.follow(&gw.endpoints.snapshot());
    on_bound(Listener::Client(client_l.local_addr()?));
    on_bound(Listener::Admin(admin_l.local_addr()?));
    if let Some(m) = &metrics_l {
        on_bound(Listener::Metrics(m.local_addr()?));
    }
    let scraper = tokio::spawn(scrape::run(gw.clone(), gw.config.scrape_interval));
    let _stop_scraper = AbortOnDrop(scraper);
    let kv = tokio::spawn(kv_events::follow(
        Arc::downgrade(&gw),
        gw.config.scrape_interval,
    ));
    let _stop_kv = (AbortOnDrop(kv), StopKv(gw.clone()));

    let (drain_tx, drain_rx) = watch::channel(false);
    let grace_over = gw.cut.clone();
    let draining = || {
        let mut rx = drain_rx.clone();
        async move {
            let _ = rx.wait_for(|d| *d).await;
        }
    };
    let idle = limits.idle_timeout;
    type Serving = std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>;
    let serving = |f: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>| -> Serving {
        Box::pin(async move {
            f.await;
            Ok(())
        })
    };
    let edge = |router: Router, body_timeout: Option<Duration>, request_ids: bool| listen::Edge {
        router,
        cut: grace_over.clone(),
        body_timeout,
        request_ids,
        peer: None,
    };
    // Request ids over the pages too: every answer of the client
    // listener, a refusal or a 404 included, has one.
    let client_app = edge(
        client_app(gw.clone()).merge(extra.client),
        Some(limits.body_timeout),
        true,
    );
    let client_srv: Serving = match &listen.client_tls {
        Some(tls) => serving(Box::pin(listen::serve_http(
            tls::TlsListener::new(client_l, tls, false)?,
            client_app,
            idle,
            draining(),
        ))),
        None => serving(Box::pin(listen::serve_http(
            client_l,
            client_app,
            idle,
            draining(),
        ))),
    };
    let loopback = listen.admin.ip().is_loopback();
    let token = listen.admin_token.clone();
    let admin_app = edge(
        admin_app(gw.clone())
            .merge(extra.admin)
            .layer(axum::middleware::from_fn(move |request, next| {
                listen::admin_guard::guard(loopback, token.clone(), request, next)
            })),
        Some(limits.body_timeout),
        false,
    );
    let admin_srv: Serving = serving(Box::pin(listen::serve_http(
        admin_l,
        admin_app,
        idle,
        draining(),
    )));
    let metrics_srv: Serving = match metrics_l {
        Some(m) => serving(Box::pin(listen::serve_http(
            m,
            edge(metrics_app(gw), None, false),
            idle,
            draining(),
        ))),
        None => Box::pin(async { Ok(()) }),
    };
    let servers = async {
        tokio::try_join!(client_srv, admin_srv, metrics_srv)?;
        Ok::<(), ServeError>(())
    };
    let grace = stop.grace;
    let stopping = async move {
        stop.signal.await;
        let _ = drain_tx.send(true);
        tokio::time::sleep(grace).await;
        tracing::warn!(
            grace_s = grace.as_secs_f64(),
            "the shutdown grace period is over: requests still in flight are cut"
        );
        grace_over.fire();
        // Holds the drain's sender until every connection has closed: a
        // dropped sender would read as "never" to the listeners.
        std::future::pending::<std::convert::Infallible>().await
    };
    tokio::select! {
        r = servers => r,
        never = stopping => match never {},
    }
}

/// Ends the KV-cache event subscriptions when serving ends.
struct StopKv(Arc<Gateway>);

impl Drop for StopKv {
    fn drop(&mut self) {
        self.0.kv_events.stop();
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
