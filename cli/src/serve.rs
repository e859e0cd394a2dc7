//! The one composition root: every mode of `llmgw server` (router-only,
//! control plane, or both) and `llmgw up` are built here, from one plan.
//! A mode is a choice inside this builder, never a second builder, so that
//! keys, limits, prices, usage recording, admission and affinity mean the
//! same in every mode.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use llmgw_control::{AgentSvc, ControlConfig, ControlPlane};
use llmgw_gateway::{Gateway, GatewayConfig, Listener};
use llmgw_projections::Projections;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Outcome;

/// Where a started server listens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bound {
    pub client: SocketAddr,
    pub admin: SocketAddr,
    /// None in router-only mode: no agents without a control plane.
    pub agent: Option<SocketAddr>,
}

#[derive(Debug, Clone)]
pub(crate) struct Listen {
    pub client: SocketAddr,
    /// HTTPS on the client listener; None is plain HTTP.
    pub client_tls: Option<llmgw_gateway::ServerTls>,
    pub admin: SocketAddr,
    /// What every admin request but `/health` must carry (`admin_token`),
    /// and what this server sends with a command it forwards to a leader.
    pub admin_token: Option<llmgw_control::AdminSecret>,
    pub metrics: Option<SocketAddr>,
    pub agent: SocketAddr,
    /// Mutual TLS on the agent listener; None is plaintext.
    pub agent_tls: Option<crate::config::TlsPems>,
    /// Caps and timeouts of every listener, the agent listener's included.
    pub connections: llmgw_gateway::ConnectionLimits,
    /// The caps the operator set (`connections.max.client`, ...): refused
    /// at start if the open-file limit cannot hold them, where the
    /// defaults are lowered to fit ([`crate::open_files`]).
    pub caps_set: Vec<&'static str>,
}

/// How usage records leave the request path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UsageSettings {
    pub flush: Duration,
    pub batch: usize,
    pub buffer: usize,
}

/// Everything a server is built from, checked before anything binds.
#[derive(Debug)]
pub(crate) struct Plan {
    pub store: String,
    /// The store was named (not the default): every mode opens it, and a
    /// router without keys or usage takes its catalog.
    pub store_named: bool,
    pub listen: Listen,
    /// Static endpoints, fallbacks, routing, admission and the default
    /// price.
    pub gateway: GatewayConfig,
    /// The control plane, when the catalog or `control.enabled` asks.
    pub control: Option<ControlConfig>,
    /// API keys required.
    pub auth: bool,
    /// Usage recorded (always with auth: budgets are spent by it).
    pub usage: Option<UsageSettings>,
    pub web: WebPlan,
    /// How long requests and streams in flight get to finish once a stop
    /// begins; then they are cut.
    pub shutdown_grace: Duration,
    /// Threads and memory notes.
    pub convo: crate::convo_settings::ConvoPlan,
}

impl Plan {
    /// Whether the server opens the log: a store named, the control
    /// plane, keys or usage.
    pub(crate) fn needs_log(&self) -> bool {
        self.store_named || self.control.is_some() || self.auth || self.usage.is_some()
    }

    /// The stores a start opens (the log, and where conversations are kept
    /// when that is elsewhere), with what `--check` reaches first.
    pub(crate) fn stores(&self) -> Vec<&str> {
        let mut stores = Vec::new();
        if self.needs_log() {
            stores.push(self.store.as_str());
        }
        if self.convo.enabled
            && let Some(other) = self.convo.store.as_deref()
        {
            stores.push(other);
        }
        stores
    }
}

/// `shutdown_grace` when none is configured.
pub(crate) const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The pages and the accounts behind them.
#[derive(Debug, Clone, Default)]
pub(crate) struct WebPlan {
    pub settings: llmgw_web::WebSettings,
    pub people: llmgw_people::PeopleConfig,
}

fn say(line: String) {
    let line = crate::logging::stdout_line(&line);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Says at start what the client listener offers to whoever reaches it
/// off loopback, when that is more than an operator may have meant (`:8080`
/// is every interface): models without keys, or keys and passwords over
/// plain HTTP. Not refused: a TLS proxy in front, or a private network,
/// makes either sound.
fn warn_exposure(plan: &Plan) {
    let client = plan.listen.client;
    if client.ip().is_loopback() {
        return;
    }
    if !plan.auth {
        tracing::warn!(
            %client,
            "auth is off: anyone who reaches this listener may use every model (auth.enabled: true asks for keys)"
        );
    } else if plan.listen.client_tls.is_none() {
        tracing::warn!(
            %client,
            "no client_tls: API keys, passwords and sessions cross the network in the clear unless a TLS proxy stands in front"
        );
    }
}

/// This server's name in the lease and in what it appends.
fn instance(plan: &Plan) -> String {
    match &plan.control {
        Some(c) => c.instance.clone(),
        None => default_instance(),
    }
}

/// `hostname-pid`: unique among the servers sharing a store.
pub(crate) fn default_instance() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let host = Some(host.trim())
        .filter(|h| !h.is_empty())
        .unwrap_or("llmgw");
    format!("{host}-{}", std::process::id())
}

/// The views every reader shares (keys, budgets, prices, routes and the
/// control plane), kept by one runner that follows the log.
struct Views {
    views: Arc<RwLock<Projections>>,
    position: watch::Receiver<u64>,
    follower: JoinHandle<()>,
}

async fn follow(log: &llmgw_eventstore::AnyStore, name: &str) -> anyhow::Result<Views> {
    let mut runner = llmgw_projections::Runner::start(log.clone(), name).await?;
    let views = runner.views();
    let position = runner.watch_position();
    let follower = tokio::spawn(async move {
        // The views serve from memory whatever the store does: a failure
        // the subscription could not ride out (a store that answers
        // nonsense while it restarts) only pauses them, and they read on
        // from where they were.
        loop {
            if let Err(e) = runner.follow().await {
                tracing::error!(error = %e, "the views stopped following the event log; following again in a second");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    Ok(Views {
        views,
        position,
        follower,
    })
}

/// Threads and notes in their tables (the log's store, or the no-key
/// pool's own), and the sweep that deletes what outlived its retention.
async fn keep_conversations(
    c: &crate::convo_settings::ConvoPlan,
    server_store: &str,
    log: Option<&llmgw_eventstore::AnyStore>,
    gw: &Arc<Gateway>,
) -> anyhow::Result<Option<JoinHandle<()>>> {
    if !c.enabled {
        return Ok(None);
    }
    let store = match (&c.store, log) {
        (None, Some(log)) => log.clone(),
        (address, _) => {
            let address =
                llmgw_eventstore::StoreAddress::parse(address.as_deref().unwrap_or(server_store))?;
            llmgw_eventstore::AnyStore::open(&address, llmgw_eventstore::OpenOptions::migrating())
                .await?
        }
    };
    gw.keep_conversations(llmgw_convo::Convo::new(&store), c.settings.clone());
    Ok(Some(tokio::spawn(llmgw_gateway::sweep_conversations(
        gw.clone(),
        c.sweep,
    ))))
}

/// Serves until SIGINT/SIGTERM or `stop`, then stops gracefully: the
/// listeners stop accepting, the leader steps down, requests and streams
/// in flight get `shutdown_grace` to finish, and the usage held is
/// flushed. Under systemd (`Type=notify`) it reports READY=1 once every
/// listener is bound and STOPPING=1 when the stop begins.
pub(crate) async fn run(
    mut plan: Plan,
    on_bound: impl FnOnce(Bound) + Send,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<Outcome> {
    survive_file_size_limit();
    fit_open_files(&mut plan)?;
    warn_exposure(&plan);
    let instance = instance(&plan);
    // Which log this server keeps, said in its "serving" line: a default
    // ./llmgw.db made in whatever directory it started in was silent.
    let mut store_said = "none".to_owned();
    let log = if plan.needs_log() {
        let address = llmgw_eventstore::StoreAddress::parse(&plan.store)?;
        store_said = match &address {
            llmgw_eventstore::StoreAddress::Sqlite(path) => std::path::absolute(path).map_or_else(
                |_| address.redacted(),
                |p| format!("sqlite://{}", p.display()),
            ),
            _ => address.redacted(),
        };
        Some(
            llmgw_eventstore::AnyStore::open(&address, llmgw_eventstore::OpenOptions::migrating())
                .await?,
        )
    } else {
        None
    };
    let views = match &log {
        Some(log) => Some(follow(log, llmgw_projections::VIEWS_SNAPSHOT).await?),
        None => None,
    };
    let keys = match (&views, plan.auth) {
        (Some(v), true) => Some(llmgw_gateway::auth::KeyDirectory::new(v.views.clone())),
        _ => None,
    };
    let mut batcher = None;
    let usage = match (&log, &views, plan.usage) {
        (Some(log), Some(_), Some(u)) => {
            // Each request comes priced as it was served (the model that
            // served it, at its price then).
            let (queue, rx) = llmgw_gateway::usage::UsageQueue::new(u.buffer);
            batcher = Some(tokio::spawn(llmgw_gateway::usage::run_batcher(
                log.clone(),
                format!("gateway-{instance}"),
                rx,
                u.batch,
                u.flush,
            )));
            Some(queue)
        }
        _ => None,
    };
    let with_control = plan.control.is_some();
    let usage_queue = usage.clone();
    let gw = Gateway::with_keys(plan.gateway, usage, keys)?;

    // The routing table follows the router view: with the control plane its
    // endpoints join the static ones; without it only the catalog (prices,
    // aliases, fallbacks) is taken, since nothing keeps its endpoints true.
    let routes = views.as_ref().map(|v| {
        let (gw, views, mut position) = (gw.clone(), v.views.clone(), v.position.clone());
        tokio::spawn(async move {
            loop {
                {
                    let v = views.read().unwrap_or_else(|p| p.into_inner());
                    if with_control {
                        gw.apply_router_view(&v.router);
                    } else {
                        gw.apply_catalog(&v.router);
                    }
                }
                if position.changed().await.is_err() {
                    return;
                }
            }
        })
    });

    let convo_sweeper = keep_conversations(&plan.convo, &plan.store, log.as_ref(), &gw).await?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    // The erasable tables beside the log: claim links (any mode with a
    // log), accounts and sessions (with auth).
    let people = log
        .as_ref()
        .map(|l| Arc::new(llmgw_people::People::new(l, plan.web.people.clone())));
    // Expired sessions and claim links leave the tables within the hour,
    // whoever leads (any server may sweep: deletions are idempotent).
    let sweeper = people.clone().map(|p| {
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(3600));
            loop {
                every.tick().await;
                if let Err(e) = p.sweep(chrono::Utc::now()).await {
                    tracing::warn!(error = %e, "sweeping expired sessions and claim links");
                }
            }
        })
    });
    let mut admin_routes = axum::Router::new();
    let mut cp = None;
    let mut grpc: Serving = Box::pin(std::future::pending());
    let mut agent_addr = None;
    let advertise = plan
        .control
        .as_ref()
        .and_then(|c| c.advertise_admin.clone());
    let advertise_agent = plan
        .control
        .as_ref()
        .and_then(|c| c.advertise_agent.clone());
    if let (Some(mut control), Some(log), Some(v), Some(people)) =
        (plan.control, &log, &views, &people)
    {
        control.admin_token = plan.listen.admin_token.clone();
        let plane = ControlPlane::new(log.clone(), v.views.clone(), v.position.clone(), control);
        {
            let plane = plane.clone();
            gw.on_demand(llmgw_gateway::DemandHook(Box::new(move |m| {
                plane.demand(m)
            })));
        }
        {
            let plane = plane.clone();
            gw.placeable_with(llmgw_gateway::PlaceableHook(Box::new(move |m| {
                plane.fits_as_built(m)
            })));
        }
        {
            let plane = plane.clone();
            gw.held_back_with(llmgw_gateway::HeldBackHook(Box::new(move |m| {
                plane.held_back(m)
            })));
        }
        {
            // How full a model's engines are, as admission reads it: the
            // engines' own figures, so every server's traffic counts.
            let gw = gw.clone();
            plane.read_fullness_with(llmgw_control::Fullness(Box::new(move |m| {
                llmgw_control::ModelLoad {
                    saturation: gw.saturation(m),
                    in_use: gw.endpoints.in_use(m),
                }
            })));
        }
        if let Some(authority) = plan.listen.agent_tls.as_ref().and_then(|t| t.authority()) {
            plane.sign_with(authority?);
        }
        let (addr, server) = agent_listener(
            &plan.listen,
            plane.clone(),
            gw.connections.clone(),
            shutdown_rx.clone(),
        )
        .await?;
        agent_addr = Some(addr);
        grpc = server;
        // Standbys name this to agents while this server leads.
        plane.advertise_agent(
            advertise_agent.unwrap_or_else(|| agent_url(addr, plan.listen.agent_tls.is_some())),
        );
        // A standby sends operators' writes on to the leader.
        admin_routes = llmgw_control::admin::router(plane.clone())
            .merge(llmgw_control::tenancy_api::router(
                llmgw_control::Door::Control(plane.clone()),
                people.clone(),
            ))
            .layer(axum::middleware::from_fn_with_state(
                plane.clone(),
                llmgw_control::forward_writes,
            ));
        say(format!("agent listening on {addr}"));
        cp = Some(plane);
    } else if let (Some(log), Some(v), Some(people)) = (&log, &views, &people) {
        // No control plane here: each command is decided under the lease,
        // or sent on to the leader while a control plane holds it, and so
        // is every control plane route (`llmgw ctl`) this server lacks.
        let token = plan.listen.admin_token.as_ref().map(|t| t.0.clone());
        admin_routes = llmgw_control::ToLeader::new(log.clone(), instance.clone(), token).around(
            llmgw_control::tenancy_api::router(
                llmgw_control::Door::Lease {
                    store: log.clone(),
                    views: v.views.clone(),
                    views_at: v.position.clone(),
                },
                people.clone(),
            ),
        );
    }
    let _metrics = crate::server_metrics::install(
        &gw,
        log.as_ref(),
        views.as_ref().map(|v| v.position.clone()),
        views.as_ref().map(|v| v.views.clone()),
        cp.as_ref(),
    );
    let web = Arc::new(llmgw_web::Web {
        settings: plan.web.settings.clone(),
        views: match &views {
            Some(v) => v.views.clone(),
            None => Arc::new(RwLock::new(Projections::default())),
        },
        store: log.clone(),
        people: people.filter(|_| plan.auth),
        gateway: gw.clone(),
        admin: admin_routes.clone(),
        decider: log
            .as_ref()
            .map(|l| llmgw_decider::Decider::new(l.clone(), format!("gateway-{instance}"))),
        instance: instance.clone(),
    });
    let extra = llmgw_gateway::Extra {
        client: llmgw_web::client_routes(web.clone()),
        admin: admin_routes.merge(llmgw_web::admin_routes(web)),
    };
    let mut leading = None;

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (drain_tx, mut drain_rx) = watch::channel(false);
    let grace = plan.shutdown_grace;
    let mut serve = Box::pin(llmgw_gateway::serve_with(
        gw,
        llmgw_gateway::Listen {
            client: plan.listen.client,
            client_tls: plan.listen.client_tls.clone(),
            admin: plan.listen.admin,
            admin_token: (plan.listen.admin_token.as_ref())
                .map(|t| llmgw_gateway::AdminToken::new(&t.0)),
            metrics: plan.listen.metrics,
            connections: plan.listen.connections,
        },
        extra,
        llmgw_gateway::Stop {
            signal: Box::pin(async move {
                let _ = drain_rx.wait_for(|d| *d).await;
            }),
            grace,
        },
        move |l| {
            let _ = tx.send(l);
        },
    ));
    let mut served = false;
    // Once, before READY=1: a signal is never lost between iterations.
    let mut signalled = std::pin::pin!(crate::sim::shutdown());
    let mut client = None;
    let mut admin = None;
    let mut on_bound = Some(on_bound);
    loop {
        tokio::select! {
            r = &mut serve => { r?; served = true; break; }
            r = &mut grpc => { r?; break; }
            Some(l) = rx.recv() => {
                match l {
                    Listener::Client(a) => {
                        client = Some(a);
                        say(format!("client listening on {a}"));
                        if plan.listen.client_tls.is_some() {
                            tracing::info!(addr = %a, "the client listener speaks HTTPS only");
                        }
                    }
                    Listener::Admin(a) => {
                        admin = Some(a);
                        say(format!("admin listening on {a}"));
                        // Leading starts once the admin address it records
                        // for standbys is known.
                        if let Some(cp) = cp.take() {
                            cp.advertise_admin(advertise.clone().unwrap_or_else(|| format!("http://{a}")));
                            leading = Some(tokio::spawn(cp.run(shutdown_rx.clone())));
                        }
                    }
                    Listener::Metrics(a) => say(format!("metrics listening on {a}")),
                }
                if let (Some(c), Some(a)) = (client, admin)
                    && let Some(f) = on_bound.take()
                {
                    // Every listener is bound by now: the gateway reports
                    // its own only once all of them are.
                    tracing::info!(
                        version = env!("CARGO_PKG_VERSION"),
                        client = %c,
                        admin = %a,
                        agent = agent_addr.map(tracing::field::display),
                        store = %store_said,
                        "serving"
                    );
                    crate::notify::notify(crate::notify::READY);
                    f(Bound { client: c, admin: a, agent: agent_addr });
                }
            }
            _ = &mut signalled => break,
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    crate::notify::notify(crate::notify::STOPPING);
    say(format!(
        "stopping: no new connections; requests in flight get up to {}",
        seconds(grace)
    ));
    // No new connections from here; those in flight run on.
    let _ = drain_tx.send(true);
    let _ = shutdown_tx.send(true);
    // Stepping down lets a standby take over at once instead of after the ttl.
    if let Some(leading) = leading {
        let _ = tokio::time::timeout(Duration::from_secs(5), leading).await;
    }
    // Agents' streams never end by themselves: they are closed now, and
    // the agents dial the next server.
    drop(grpc);
    // The gateway cuts what is left at the grace; the margin only guards
    // against a connection that ignores that.
    if !served {
        match tokio::time::timeout(grace + Duration::from_secs(5), &mut serve).await {
            Ok(Err(e)) => tracing::warn!(error = %e, "serving ended with an error while stopping"),
            Ok(Ok(())) => {}
            Err(_) => tracing::warn!("connections still open after the grace period: closed"),
        }
    }
    drop(serve);
    if let Some(r) = routes {
        r.abort();
        let _ = r.await;
    }
    if let Some(v) = views {
        v.follower.abort();
    }
    for s in [sweeper, convo_sweeper].into_iter().flatten() {
        s.abort();
    }
    // The requests are done: the batcher appends what is queued and ends.
    if let Some(mut b) = batcher
        && let Some(queue) = usage_queue
    {
        queue.close();
        let quick = Duration::from_secs(1);
        if tokio::time::timeout(quick, &mut b).await.is_err() {
            tracing::warn!(
                records = queue.pending(),
                up_to_s = STOP_FLUSH.as_secs(),
                "stopping: waiting for the log to take the usage still queued"
            );
            if tokio::time::timeout(STOP_FLUSH - quick, &mut b)
                .await
                .is_err()
            {
                // Its retries stop here: nothing writes once the log is folded.
                b.abort();
                tracing::error!(
                    records = queue.pending(),
                    "stopping with usage the log could not take; those records are lost"
                );
            }
        }
    }
    // Nothing writes any more: a copy of a SQLite file alone is the log.
    if let Some(log) = &log {
        log.fold_wal().await;
    }
    Ok(Outcome::Ok)
}

/// How long a stop waits for the log to take the usage still queued: a
/// store that stalls for a while (a lock held, PostgreSQL failing over;
/// its lock timeout alone is 5 s) loses nothing, and the 30 s grace plus
/// this stay inside the systemd unit's TimeoutStopSec (60 s).
const STOP_FLUSH: Duration = Duration::from_secs(20);

/// Under a file-size limit (`ulimit -f`, `LimitFSIZE=`) the kernel answers
/// a write past it with SIGXFSZ, whose default action kills the process:
/// with a handler installed the write fails with EFBIG instead, the store
/// says it has no room, and the server keeps serving. The handler stays
/// for the life of the process.
fn survive_file_size_limit() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let xfsz = rustix::process::Signal::XFSZ.as_raw();
        if let Err(e) = signal(SignalKind::from_raw(xfsz)) {
            tracing::warn!(error = %e, "cannot catch SIGXFSZ: a file-size limit would kill the server");
        }
    }
}

/// Raises the open-file limit and fits the connection caps into it
/// ([`crate::open_files`]): caps the operator set that cannot fit are a
/// configuration error; default ones are lowered and logged (a warning
/// when one loses more than a tenth).
pub(crate) fn fit_open_files(plan: &mut Plan) -> Result<(), crate::config::ConfigError> {
    use crate::open_files::{Fit, Opened};
    let limit = crate::open_files::raise();
    if limit.now > limit.was {
        tracing::info!(
            from = limit.was,
            to = limit.now,
            "open files: the soft limit raised to the hard one"
        );
    }
    let opened = Opened {
        metrics: plan.listen.metrics.is_some(),
        agents: plan.control.is_some(),
    };
    let listen = &mut plan.listen;
    match crate::open_files::fit(&mut listen.connections, opened, &listen.caps_set, limit.now) {
        Ok(Fit::AsSet) => Ok(()),
        Ok(Fit::Lowered(caps)) => {
            // A trim of a few per cent (a limit of 20,000, say) is no news.
            let deep = caps.iter().any(|(_, from, to)| to * 10 < from * 9);
            let caps = caps
                .iter()
                .map(|(key, from, to)| format!("{key} {from} -> {to}"))
                .collect::<Vec<_>>()
                .join(", ");
            let why = "the default connection caps do not fit this process's open-file limit, so they are lowered; raise the limit (LimitNOFILE= in a systemd unit, `ulimit -n`) to keep them";
            if deep {
                tracing::warn!(open_files = limit.now, %caps, "{why}");
            } else {
                tracing::info!(open_files = limit.now, %caps, "{why}");
            }
            Ok(())
        }
        Err(why) => Err(crate::config::ConfigError(why)),
    }
}

/// The agent listener as agents dial it: on every interface, by the host's
/// name.
fn agent_url(addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    if addr.ip().is_unspecified() {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        let host = Some(host.trim())
            .filter(|h| !h.is_empty())
            .unwrap_or("localhost");
        return format!("{scheme}://{host}:{}", addr.port());
    }
    format!("{scheme}://{addr}")
}

/// `30s`, `1.5s`.
fn seconds(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

type Serving = std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>;

/// Binds the agent listener (mutual TLS when configured) and returns its
/// address and the server, which stops when `shutdown` turns true. Its
/// connections are capped (`connections.max.agent`) and closed when an
/// agent sends nothing for `connections.idle_timeout` (agents ping every
/// few seconds, so only a dead or silent peer is).
async fn agent_listener(
    listen: &Listen,
    cp: Arc<ControlPlane>,
    stats: Arc<llmgw_gateway::ConnectionStats>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<(SocketAddr, Serving)> {
    let agent_l = tokio::net::TcpListener::bind(listen.agent)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {} for agents: {e}", listen.agent))?;
    let addr = agent_l.local_addr()?;
    let limits = listen.connections;
    let agent_l = llmgw_gateway::Acceptor::new(
        agent_l,
        llmgw_gateway::Which::Agent,
        limits.max_agent,
        Some(limits.idle_timeout),
        stats,
    );
    let routes =
        tonic::service::Routes::new(llmgw_api::AgentServiceServer::new(AgentSvc(cp.clone())));
    let stopped = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    let (tls, routes) = match &listen.agent_tls {
        Some(t) => {
            // The handshakes are ours, not tonic's, so that a refused one
            // is logged with the peer and the reason (tonic drops them
            // silently); the streams keep their certificates for the
            // node-id check.
            let (cert, key, ca) = (t.cert.as_bytes(), t.key.as_bytes(), t.ca.as_bytes());
            let joinable = t.ca_key.is_some();
            let tls = if joinable {
                llmgw_gateway::ServerTls::joinable(cert, key, ca)
            } else {
                llmgw_gateway::ServerTls::with_client_ca(cert, key, ca)
            }
            .map_err(|e| anyhow::anyhow!("the agent listener's TLS files: {e}"))?;
            if joinable {
                tracing::info!(%addr, "agent listener: mutual TLS; nodes may join with a token (tls.ca_key), and a stream needs a client certificate");
            } else {
                tracing::info!(%addr, "agent listener: mutual TLS, client certificates required");
            }
            let join = llmgw_api::JoinServiceServer::new(llmgw_control::JoinSvc(cp.clone()));
            (Some(tls), routes.add_service(join))
        }
        // On loopback, this host's agents: said where the default applied
        // (server::agent_addr), and the address by the line that follows.
        None if addr.ip().is_loopback() => (None, routes),
        None => {
            tracing::warn!(
                %addr,
                "agent listener: plaintext (agent_plaintext), for a trusted network only: anything that reaches it can register as a node (see `llmgw server init` and the tls: section)"
            );
            (None, routes)
        }
    };
    let server: Serving = Box::pin(async move {
        Ok(llmgw_gateway::serve_grpc(agent_l, tls.as_ref(), routes, stopped).await?)
    });
    Ok((addr, server))
}

/// The plan `llmgw up` runs: the control plane on the embedded store, no
/// keys, no usage.
pub(crate) fn up_plan(store: String, listen: Listen, control: ControlConfig) -> Plan {
    let mut web = WebPlan::default();
    web.settings.place.port_range = control.port_range;
    Plan {
        store,
        store_named: true,
        listen,
        gateway: GatewayConfig::default(),
        control: Some(control),
        auth: false,
        usage: None,
        web,
        shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        convo: Default::default(),
    }
}
