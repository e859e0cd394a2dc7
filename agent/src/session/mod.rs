//! The agent's one outbound stream to the control plane.
//!
//! Register (the whole inventory and the running shards) on every stream,
//! heartbeats with changed-only sections, shard status as it changes; starts
//! and stops from the control plane carried out by the supervisor. The
//! stream is redialled forever with jittered backoff, through every
//! configured server in turn (a standby refuses and the next is tried).
//! Engines outlive both the stream and the agent: a stop signal ends the
//! agent and leaves them serving.

mod adopt;
mod inventory;
mod recheck;
mod shards;
mod why;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use llmgw_api::v1::{self, agent_message, control_message};
use llmgw_api::{AgentMessage, AgentServiceClient};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use crate::discovery::Options;
use crate::engines::Registry;
use crate::supervisor::{self, State};

#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Control-plane agent endpoints (`http://host:7443`), tried in turn.
    pub servers: Vec<String>,
    pub node_id: String,
    pub mgmt_addr: String,
    pub labels: BTreeMap<String, String>,
    pub heartbeat: Duration,
    pub reconnect_base: Duration,
    pub reconnect_max: Duration,
    pub discovery: Options,
    pub stop_timeout: Duration,
    /// How often installed engines and the GPUs' health are looked at
    /// again (what changed goes with the next heartbeat).
    pub recheck: Duration,
    /// A worker rank alive this long counts as ready.
    pub alive_grace: Duration,
    pub log_lines: usize,
    /// Engine name → version, as installed and seen to run.
    pub engines_installed: BTreeMap<String, String>,
    /// Mutual TLS: (CA, certificate, key) PEMs. With them the agent
    /// refuses to dial `http://`.
    pub tls: Option<(String, String, String)>,
    /// Where fetched weights are cached (also scanned for weights); None
    /// fetches nothing.
    pub cache_dir: Option<std::path::PathBuf>,
    /// Where state files and engine logs live; None keeps neither (an
    /// agent restart then cannot adopt its engines).
    pub work_dir: Option<std::path::PathBuf>,
    /// Where engines listen (and are health-checked); None is every
    /// interface, checked on loopback.
    pub engine_bind: Option<String>,
    /// The agent's own recent log lines, served as the log source
    /// `agent`; None when the binary keeps none.
    pub agent_log: Option<crate::supervisor::LogTail>,
    /// Stop every engine when the agent stops (for `llmgw up`, where the
    /// agent and its engines are one trial); a node agent leaves them.
    pub stop_engines_on_exit: bool,
    /// How long the logs of stopped shards are kept in `work_dir`; None
    /// keeps them for ever.
    pub log_retention: Option<Duration>,
}

/// A week: long enough to read why an engine stopped after a weekend.
pub const DEFAULT_LOG_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

impl SessionConfig {
    pub fn new(servers: Vec<String>, node_id: String) -> Self {
        SessionConfig {
            servers,
            node_id,
            mgmt_addr: "127.0.0.1".into(),
            labels: BTreeMap::new(),
            heartbeat: Duration::from_secs(5),
            reconnect_base: Duration::from_secs(1),
            reconnect_max: Duration::from_secs(30),
            discovery: Options::default(),
            stop_timeout: Duration::from_secs(30),
            alive_grace: Duration::from_secs(5),
            recheck: recheck::DEFAULT_RECHECK,
            log_lines: 200,
            engines_installed: [("sim".to_string(), env!("CARGO_PKG_VERSION").to_string())].into(),
            stop_engines_on_exit: false,
            log_retention: Some(DEFAULT_LOG_RETENTION),
            agent_log: None,
            engine_bind: None,
            work_dir: None,
            cache_dir: None,
            tls: None,
        }
    }
}

#[derive(Debug)]
struct Running {
    start: v1::StartShard,
    shard: Option<supervisor::Shard>,
    status: watch::Receiver<supervisor::Status>,
    started: Instant,
    /// The download its weights wait on, if any.
    fetch: Option<tokio::task::JoinHandle<()>>,
    /// Drained by the control plane (while fetching: drained once it runs).
    drained: bool,
}

/// The agent: its shards outlive any one stream.
#[derive(Debug)]
pub struct Agent {
    config: SessionConfig,
    engines: Arc<Registry>,
    shards: BTreeMap<String, Running>,
    /// Status changes from every shard's watcher.
    changes_tx: mpsc::UnboundedSender<String>,
    changes_rx: mpsc::UnboundedReceiver<String>,
    /// What this stream last told the control plane, so that heartbeats
    /// carry only what changed.
    sent_weights: Vec<v1::LocalWeights>,
    sent_engines: BTreeMap<String, String>,
    /// The latest background look at engines and GPUs.
    rechecked: watch::Receiver<recheck::Rechecked>,
    /// The GPU problems last told to the control plane.
    sent_gpus: Vec<v1::GpuHealth>,
    /// When the last registration read the GPUs: an older background look
    /// must not overwrite it.
    registered_at: Instant,
    /// When a shard of ours last let go of each GPU: a look taken before
    /// then saw our engine's memory there, not another process's.
    released: BTreeMap<u32, Instant>,
    /// Stops carried out off the loop report here.
    stopped_tx: mpsc::UnboundedSender<v1::ShardStatus>,
    stopped_rx: mpsc::UnboundedReceiver<v1::ShardStatus>,
    /// Shards being stopped, with the port and GPUs they still hold.
    stopping: BTreeMap<String, (u16, Vec<u32>)>,
    /// Starts waiting for a stopping shard to let go of what they need.
    deferred: Vec<v1::StartShard>,
    /// The stops in flight, awaited when the agent stops its engines.
    stop_tasks: tokio::task::JoinSet<()>,
    fetcher: crate::fetch::Fetcher,
    fetched_tx: mpsc::UnboundedSender<Fetched>,
    fetched_rx: mpsc::UnboundedReceiver<Fetched>,
    /// Downloads in flight, by the shard waiting on them.
    progress: Arc<std::sync::Mutex<BTreeMap<String, crate::fetch::Progress>>>,
    /// The GPUs the last discovery found, for validating starts.
    gpus: Vec<crate::engines::GpuInfo>,
    /// The GPUs' figures as the registration read them, sent until a
    /// later look exists.
    registered_figures: Vec<v1::GpuFigures>,
    /// What the agent's metrics page shows.
    stats: Arc<crate::metrics::AgentStats>,
}

type Fetched = (String, Result<String, crate::fetch::FetchError>);

fn wire_state(s: State) -> i32 {
    use v1::shard_status::State as W;
    (match s {
        State::Pending => W::Pending,
        State::Starting => W::Starting,
        State::Loading => W::Loading,
        State::Ready => W::Ready,
        State::Draining => W::Draining,
        State::Stopped => W::Stopped,
        State::Failed => W::Failed,
    }) as i32
}

/// A random factor in [0.5, 1.0), so that a fleet does not redial in step.
fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    0.5 + f64::from(nanos % 1000) / 2000.0
}

impl Agent {
    pub fn new(config: SessionConfig, engines: Registry) -> Self {
        let (changes_tx, changes_rx) = mpsc::unbounded_channel();
        let (fetched_tx, fetched_rx) = mpsc::unbounded_channel();
        let (stopped_tx, stopped_rx) = mpsc::unbounded_channel();
        let fetcher = crate::fetch::Fetcher::new(config.cache_dir.clone());
        Agent {
            config,
            engines: Arc::new(engines),
            shards: BTreeMap::new(),
            changes_tx,
            changes_rx,
            sent_weights: Vec::new(),
            sent_engines: BTreeMap::new(),
            rechecked: watch::channel(recheck::Rechecked {
                engines: BTreeMap::new(),
                gpus: None,
            })
            .1,
            sent_gpus: Vec::new(),
            registered_at: Instant::now(),
            released: BTreeMap::new(),
            stopped_tx,
            stopped_rx,
            stopping: BTreeMap::new(),
            deferred: Vec::new(),
            stop_tasks: tokio::task::JoinSet::new(),
            fetcher,
            fetched_tx,
            fetched_rx,
            progress: Arc::default(),
            gpus: Vec::new(),
            registered_figures: Vec::new(),
            stats: Arc::default(),
        }
    }

    /// What the agent's metrics page shows, kept up to date while it runs.
    pub fn stats(&self) -> Arc<crate::metrics::AgentStats> {
        self.stats.clone()
    }

    /// Tells the metrics page which shards are supervised now.
    fn publish_shards(&self) {
        self.stats
            .supervising(self.shards.values().map(|r| r.status.clone()).collect());
    }

    /// Runs until `shutdown` turns true. Engines are left running unless
    /// the configuration says otherwise.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        self.adopt_orphans().await;
        self.publish_shards();
        // The first probe (an SGLang import can take seconds) must not
        // hold up a stop signal.
        let stopped = tokio::select! {
            r = self.start_rechecks() => {
                self.rechecked = r;
                false
            }
            _ = shutdown.wait_for(|s| *s) => true,
        };
        if !stopped {
            self.serve(shutdown).await;
        }
        if self.config.stop_engines_on_exit {
            // Stops already under way finish first.
            while self.stop_tasks.join_next().await.is_some() {}
            for (id, mut r) in std::mem::take(&mut self.shards) {
                if let Some(s) = r.shard.take() {
                    s.stop().await;
                }
                self.forget(&id);
            }
        }
    }

    async fn serve(&mut self, mut shutdown: watch::Receiver<bool>) {
        let mut delay = self.config.reconnect_base;
        let mut next = 0usize;
        loop {
            if *shutdown.borrow() {
                return;
            }
            let server = self.config.servers[next % self.config.servers.len().max(1)].clone();
            next += 1;
            let began = Instant::now();
            self.publish_shards();
            // One span per session: every line the session logs names the
            // server and this node.
            let span =
                tracing::info_span!("agent_session", server = %server, node = %self.config.node_id);
            tokio::select! {
                r = tracing::Instrument::instrument(self.session(&server), span) => match r {
                    Ok(()) => tracing::info!(server = %server, "the control plane closed the stream"),
                    Err(e) => tracing::warn!(server = %server, error = %e, "no session with the control plane"),
                },
                _ = shutdown.wait_for(|s| *s) => return,
            }
            self.stats.stream_down();
            self.publish_shards();
            // A session that lasted resets the backoff.
            if began.elapsed() > self.config.reconnect_max {
                delay = self.config.reconnect_base;
            }
            let wait = delay.mul_f64(jitter());
            delay = (delay * 2).min(self.config.reconnect_max);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }

    async fn session(&mut self, server: &str) -> Result<(), SessionError> {
        let mut endpoint = tonic::transport::Endpoint::from_shared(server.to_owned())
            .map_err(|e| SessionError(format!("{server} is not a URL: {e}")))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        if let Some((ca, cert, key)) = &self.config.tls {
            if !server.starts_with("https://") {
                return Err(SessionError(format!(
                    "{server}: this agent holds certificates and dials only https://"
                )));
            }
            use tonic::transport::{Certificate, ClientTlsConfig, Identity};
            endpoint = endpoint
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(Certificate::from_pem(ca))
                        .identity(Identity::from_pem(cert, key)),
                )
                .map_err(|e| SessionError(format!("the TLS files do not fit together: {e}")))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| SessionError(format!("cannot connect: {}", why::explain(&e))))?;
        let mut client = AgentServiceClient::new(channel);
        let (tx, rx) = mpsc::channel::<AgentMessage>(256);
        let send = |tx: &mpsc::Sender<AgentMessage>, msg| {
            let _ = tx.try_send(AgentMessage { msg: Some(msg) });
        };
        send(&tx, agent_message::Msg::Register(self.register().await));
        let mut inbound = client
            .connect(ReceiverStream::new(rx))
            .await
            .map_err(|s| {
                SessionError(format!(
                    "refused: {}",
                    why::refused(&s, self.config.tls.is_some())
                ))
            })?
            .into_inner();
        tracing::info!(server, node = %self.config.node_id, "connected to the control plane");
        self.stats.stream_up();
        let mut beat = tokio::time::interval(self.config.heartbeat);
        beat.tick().await;
        loop {
            self.publish_shards();
            tokio::select! {
                _ = beat.tick() => send(&tx, agent_message::Msg::Heartbeat(self.heartbeat().await)),
                Some(st) = self.stopped_rx.recv() => {
                    for reply in self.stop_finished(st) {
                        send(&tx, agent_message::Msg::Shard(reply));
                    }
                }
                Some((id, result)) = self.fetched_rx.recv() => {
                    if let Some(st) = self.fetched(&id, result) {
                        send(&tx, agent_message::Msg::Shard(st));
                    }
                }
                changed = self.changes_rx.recv() => {
                    if let Some(shard_id) = changed
                        && let Some(st) = self.shard_status(&shard_id)
                    {
                        send(&tx, agent_message::Msg::Shard(st));
                    }
                }
                msg = inbound.message() => {
                    let Some(msg) = msg.map_err(|s| SessionError(format!("stream: {}", s.message())))? else {
                        return Ok(());
                    };
                    if let Some(control_message::Msg::Logs(req)) = msg.msg {
                        send(&tx, agent_message::Msg::Logs(self.logs(&req)));
                        continue;
                    }
                    for reply in self.handle(msg.msg).await {
                        send(&tx, agent_message::Msg::Shard(reply));
                    }
                }
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SessionError(String);

/// Each control-plane address as a URL, in the order given: a bare
/// `host:port` gets `https://` with certificates and `http://` without;
/// with certificates `http://` is refused (the stream would go in the
/// clear); an address given twice is tried once.
pub fn server_urls(servers: &[String], tls: bool) -> Result<Vec<String>, SessionError> {
    let mut out: Vec<String> = Vec::new();
    for s in servers.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let url = match s.split_once("://") {
            None => format!("{}://{s}", if tls { "https" } else { "http" }),
            Some(("http" | "https", _)) => s.to_owned(),
            Some((scheme, _)) => {
                return Err(SessionError(format!(
                    "--server {s:?}: the scheme must be http or https, not {scheme}"
                )));
            }
        };
        if tls && url.starts_with("http://") {
            return Err(SessionError(format!(
                "--server {s:?}: with certificates the agent dials only https:// (refusing to send the stream in the clear)"
            )));
        }
        if !out.contains(&url) {
            out.push(url);
        }
    }
    if out.is_empty() {
        return Err(SessionError(
            "no --server given: the agent needs a control plane to dial".into(),
        ));
    }
    Ok(out)
}
