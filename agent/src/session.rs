//! The agent's one outbound stream to the control plane.
//!
//! Register (the whole inventory and the running shards) on every stream,
//! heartbeats with changed-only sections, shard status as it changes; starts
//! and stops from the control plane carried out by the supervisor. The
//! stream is redialled forever with jittered backoff, through every
//! configured server in turn (a standby refuses and the next is tried).
//! Engines outlive both the stream and the agent: a stop signal ends the
//! agent and leaves them serving.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use llmgw_api::v1::{self, agent_message, control_message};
use llmgw_api::{AgentMessage, AgentServiceClient};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use crate::discovery::{self, Options};
use crate::engines::{GpuInfo, Profile, Registry, ShardSpec};
use crate::state_files;
use crate::supervisor::{self, State, SupervisorOptions};

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
    /// Stop every engine when the agent stops (for `llmgw up`, where the
    /// agent and its engines are one trial); a node agent leaves them.
    pub stop_engines_on_exit: bool,
}

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
            log_lines: 200,
            engines_installed: [("sim".to_string(), env!("CARGO_PKG_VERSION").to_string())].into(),
            stop_engines_on_exit: false,
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
    /// Draining is the control plane's word; the process keeps serving.
    draining: bool,
    /// The download its weights wait on, if any.
    fetch: Option<tokio::task::JoinHandle<()>>,
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
    engines_checked: Option<Instant>,
    fetcher: crate::fetch::Fetcher,
    fetched_tx: mpsc::UnboundedSender<Fetched>,
    fetched_rx: mpsc::UnboundedReceiver<Fetched>,
    /// Downloads in flight, by the shard waiting on them.
    progress: Arc<std::sync::Mutex<BTreeMap<String, crate::fetch::Progress>>>,
}

type Fetched = (String, Result<String, crate::fetch::FetchError>);

/// How often installed engines are looked for again.
const ENGINE_RECHECK: Duration = Duration::from_secs(60);

/// The engines configured, plus `llama-server` when it is on PATH.
pub fn installed_engines(configured: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = configured.clone();
    if !out.contains_key("llamacpp")
        && let Some(paths) = std::env::var_os("PATH")
        && let Some(bin) = std::env::split_paths(&paths)
            .map(|d| d.join("llama-server"))
            .find(|p| p.is_file())
    {
        out.insert("llamacpp".into(), bin.display().to_string());
    }
    out
}

fn wire_weights(w: &[discovery::weights::LocalWeights]) -> Vec<v1::LocalWeights> {
    w.iter()
        .map(|w| v1::LocalWeights {
            path: w.path.clone(),
            size_bytes: w.size_bytes as i64,
            shared: w.shared,
        })
        .collect()
}

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
        let fetcher = crate::fetch::Fetcher::new(config.cache_dir.clone());
        Agent {
            config,
            engines: Arc::new(engines),
            shards: BTreeMap::new(),
            changes_tx,
            changes_rx,
            sent_weights: Vec::new(),
            sent_engines: BTreeMap::new(),
            engines_checked: None,
            fetcher,
            fetched_tx,
            fetched_rx,
            progress: Arc::default(),
        }
    }

    /// Runs until `shutdown` turns true. Engines are left running unless
    /// the configuration says otherwise.
    pub async fn run(mut self, shutdown: watch::Receiver<bool>) {
        self.adopt_orphans().await;
        self.serve(shutdown).await;
        if self.config.stop_engines_on_exit {
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
            tokio::select! {
                r = self.session(&server) => match r {
                    Ok(()) => tracing::info!(server = %server, "the control plane closed the stream"),
                    Err(e) => tracing::warn!(server = %server, error = %e, "no session with the control plane"),
                },
                _ = shutdown.wait_for(|s| *s) => return,
            }
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

    fn register(&mut self) -> v1::Register {
        let inv = discovery::discover(&self.config.discovery).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "discovery failed; registering without GPUs");
            discovery::Inventory {
                source: "none".into(),
                gpus: vec![],
                hcas: vec![],
                host: discovery::host::discover(&self.config.discovery.root),
                memory_total_mb: 0,
                weights: vec![],
                storage: vec![],
                fabrics: vec![],
            }
        });
        v1::Register {
            node_id: self.config.node_id.clone(),
            hostname: self.config.node_id.clone(),
            mgmt_addr: self.config.mgmt_addr.clone(),
            labels: self.config.labels.clone().into_iter().collect(),
            gpus: inv
                .gpus
                .iter()
                .map(|g| v1::Gpu {
                    index: g.index as i32,
                    uuid: g.uuid.clone(),
                    name: g.name.clone(),
                    memory_total_mb: g.memory_total_mb as i32,
                    memory_used_mb: g.memory_used_mb as i32,
                    compute_capability: g.compute_capability.clone(),
                    numa_node: g.numa_node,
                    pci_bus_id: g.pci_bus_id.clone(),
                    driver_version: g.driver_version.clone(),
                    cuda_version: g.cuda_version.clone(),
                    nvlink_peers: g.nvlink_peers.iter().map(|p| *p as i32).collect(),
                    problems: g.health.problems.clone(),
                    temperature_c: g.health.temperature_c as i32,
                    ecc_errors: g.health.ecc_errors as i32,
                    utilization_percent: g.utilization_percent as i32,
                    class: g.class.clone(),
                })
                .collect(),
            fabrics: inv
                .fabrics
                .iter()
                .filter(|f| !f.usable.is_empty())
                .map(|f| v1::FabricAttachment {
                    fabric: f.fabric.clone(),
                    hcas: f.usable.clone(),
                    rate_gbps: f.rate_gbps as i32,
                })
                .collect(),
            agent_version: env!("CARGO_PKG_VERSION").into(),
            engine_versions: {
                let engines = installed_engines(&self.config.engines_installed);
                self.sent_engines = engines.clone();
                self.engines_checked = Some(Instant::now());
                engines.into_iter().collect()
            },
            running_shards: self.running_shards(),
            memory_total_mb: inv.memory_total_mb as i64,
            weights: {
                let w = wire_weights(&inv.weights);
                self.sent_weights = w.clone();
                w
            },
            storage: storage(&inv.storage),
            host: Some(v1::Host {
                os_id: inv.host.os_id.clone(),
                os_version: inv.host.os_version.clone(),
                os_codename: inv.host.os_codename.clone(),
                arch: inv.host.arch.clone(),
                cpu_flags: inv.host.cpu_flags.clone(),
                nvidia_driver: inv.host.nvidia_driver.clone(),
            }),
            engines_probed: true,
        }
    }

    fn running_shards(&mut self) -> Vec<v1::RunningShard> {
        self.reap();
        self.shards
            .values()
            .map(|r| {
                let s = &r.start;
                let state = if r.draining {
                    State::Draining
                } else {
                    r.status.borrow().state
                };
                v1::RunningShard {
                    replica_id: s.replica_id.clone(),
                    shard_id: s.shard_id.clone(),
                    rank: s.rank,
                    nnodes: s.nnodes,
                    gpu_indices: s.gpu_indices.clone(),
                    hcas: s.hcas.clone(),
                    http_port: s.http_port,
                    state: wire_state(state),
                    model: s.model.clone(),
                    profile: s
                        .profile
                        .as_ref()
                        .map(|p| p.name.clone())
                        .unwrap_or_default(),
                    pool: s.pool.clone(),
                    fabric: s.fabric.clone(),
                    leader_addr: s.leader_addr.clone(),
                    leader_port: s.leader_port,
                    profile_fp: s.profile_fp.clone(),
                    uptime_s: r.started.elapsed().as_secs() as i64,
                }
            })
            .collect()
    }

    /// Forgets shards whose processes are gone for good.
    fn reap(&mut self) {
        let done: Vec<String> = self
            .shards
            .iter()
            .filter(|(_, r)| matches!(r.status.borrow().state, State::Stopped | State::Failed))
            .map(|(id, _)| id.clone())
            .collect();
        for id in done {
            self.shards.remove(&id);
            self.forget(&id);
        }
    }

    /// Storage and memory always (a few numbers); weights when they
    /// changed; installed engines, looked for once a minute, when they
    /// changed. The flags say a list is meant, so an empty one is never
    /// ambiguous.
    fn heartbeat(&mut self) -> v1::Heartbeat {
        let o = &self.config.discovery;
        let mut hb = v1::Heartbeat {
            node_id: self.config.node_id.clone(),
            storage: storage(&discovery::storage::scan(&o.model_dirs)),
            memory_total_mb: discovery::memory::total_mb(&o.root.join("proc/meminfo")) as i64,
            ..v1::Heartbeat::default()
        };
        if !o.model_dirs.is_empty() {
            let weights = wire_weights(&discovery::weights::scan(&o.model_dirs));
            if weights != self.sent_weights {
                hb.weights_changed = true;
                hb.weights = weights.clone();
                self.sent_weights = weights;
            }
        }
        if self
            .engines_checked
            .is_none_or(|t| t.elapsed() >= ENGINE_RECHECK)
        {
            self.engines_checked = Some(Instant::now());
            let engines = installed_engines(&self.config.engines_installed);
            if engines != self.sent_engines {
                hb.engines_changed = true;
                hb.engine_versions = engines.clone().into_iter().collect();
                self.sent_engines = engines;
            }
        }
        hb
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
            .map_err(|e| SessionError(format!("cannot connect: {e}")))?;
        let mut client = AgentServiceClient::new(channel);
        let (tx, rx) = mpsc::channel::<AgentMessage>(256);
        let send = |tx: &mpsc::Sender<AgentMessage>, msg| {
            let _ = tx.try_send(AgentMessage { msg: Some(msg) });
        };
        send(&tx, agent_message::Msg::Register(self.register()));
        let mut inbound = client
            .connect(ReceiverStream::new(rx))
            .await
            .map_err(|s| SessionError(format!("refused: {}", s.message())))?
            .into_inner();
        tracing::info!(server, node = %self.config.node_id, "connected to the control plane");
        let mut beat = tokio::time::interval(self.config.heartbeat);
        beat.tick().await;
        loop {
            tokio::select! {
                _ = beat.tick() => send(&tx, agent_message::Msg::Heartbeat(self.heartbeat())),
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
                    for reply in self.handle(msg.msg).await {
                        send(&tx, agent_message::Msg::Shard(reply));
                    }
                }
            }
        }
    }

    fn shard_status(&mut self, shard_id: &str) -> Option<v1::ShardStatus> {
        let r = self.shards.get(shard_id)?;
        let st = r.status.borrow().clone();
        let state = if r.draining && st.state == State::Ready {
            State::Draining
        } else {
            st.state
        };
        let out = v1::ShardStatus {
            node_id: self.config.node_id.clone(),
            replica_id: r.start.replica_id.clone(),
            shard_id: shard_id.to_owned(),
            state: wire_state(state),
            error: st.error.clone().unwrap_or_default(),
            exit_code: st.exit_code.unwrap_or(0),
            last_output: if st.state == State::Failed {
                st.log_tail.lines().map(str::to_owned).collect()
            } else {
                vec![]
            },
            fetch: self
                .progress
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(shard_id)
                .map(|p| v1::FetchProgress {
                    source: p.source.clone(),
                    bytes_done: p.bytes_done as i64,
                    bytes_total: p.bytes_total as i64,
                }),
        };
        if matches!(st.state, State::Stopped | State::Failed) {
            self.shards.remove(shard_id);
            self.forget(shard_id);
        }
        Some(out)
    }

    async fn handle(&mut self, msg: Option<control_message::Msg>) -> Vec<v1::ShardStatus> {
        match msg {
            Some(control_message::Msg::Start(start)) => self.start(start).into_iter().collect(),
            Some(control_message::Msg::Stop(stop)) => {
                if let Some(mut r) = self.shards.remove(&stop.shard_id) {
                    tracing::info!(shard = %stop.shard_id, "stopping");
                    if let Some(f) = r.fetch.take() {
                        f.abort();
                    }
                    let node = self.config.node_id.clone();
                    let status = match r.shard.take() {
                        Some(s) => s.stop().await,
                        None => r.status.borrow().clone(),
                    };
                    self.forget(&stop.shard_id);
                    return vec![v1::ShardStatus {
                        node_id: node,
                        replica_id: r.start.replica_id.clone(),
                        shard_id: stop.shard_id,
                        state: wire_state(State::Stopped),
                        exit_code: status.exit_code.unwrap_or(0),
                        ..v1::ShardStatus::default()
                    }];
                }
                vec![]
            }
            Some(control_message::Msg::Drain(d)) => {
                if let Some(r) = self.shards.get_mut(&d.shard_id) {
                    r.draining = true;
                }
                self.shard_status(&d.shard_id).into_iter().collect()
            }
            Some(control_message::Msg::RemoveWeights(rw)) => {
                let refused =
                    crate::fetch::remove_weights(self.config.cache_dir.as_deref(), &rw.paths);
                for (path, why) in refused {
                    tracing::warn!(%path, %why, "refused to remove weights");
                }
                vec![]
            }
            Some(control_message::Msg::Ack(a)) => {
                if !a.ok {
                    tracing::warn!(error = %a.error, "the control plane refused a message");
                }
                vec![]
            }
            Some(_) | None => vec![],
        }
    }

    /// Idempotent by shard id: a repeat reports the running shard's state.
    /// Remote weights are fetched first, off the session's loop; the shard
    /// is Pending meanwhile, with the download's progress in its status.
    fn start(&mut self, start: v1::StartShard) -> Option<v1::ShardStatus> {
        let shard_id = start.shard_id.clone();
        if self.shards.contains_key(&shard_id) {
            return self.shard_status(&shard_id);
        }
        let remote = matches!(
            crate::fetch::classify(&start.source),
            Ok(crate::fetch::Source::Remote(_))
        );
        if !remote {
            return self.launch(start, None);
        }
        let pending = supervisor::Status {
            state: State::Pending,
            exit_code: None,
            error: None,
            log_tail: String::new(),
            pids: Vec::new(),
        };
        let (status_tx, status) = watch::channel(pending);
        let fetcher = self.fetcher.clone();
        let source = start.source.clone();
        let checksum = (!start.checksum.is_empty()).then(|| start.checksum.clone());
        let done = self.fetched_tx.clone();
        let id = shard_id.clone();
        let progress = self.progress.clone();
        let changes = self.changes_tx.clone();
        let task = tokio::spawn(async move {
            let id2 = id.clone();
            let fetcher = fetcher.on_progress(move |p| {
                progress
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id2.clone(), p);
                let _ = changes.send(id2.clone());
            });
            let result = fetcher.ensure(&source, checksum.as_deref()).await;
            let _ = done.send((id, result));
            drop(status_tx);
        });
        tracing::info!(shard = %shard_id, source = %start.source, "fetching weights before starting");
        self.shards.insert(
            shard_id.clone(),
            Running {
                start,
                status,
                shard: None,
                started: Instant::now(),
                draining: false,
                fetch: Some(task),
            },
        );
        self.shard_status(&shard_id)
    }

    /// The weights of a fetching shard arrived (or did not).
    fn fetched(
        &mut self,
        shard_id: &str,
        result: Result<String, crate::fetch::FetchError>,
    ) -> Option<v1::ShardStatus> {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(shard_id);
        let r = self.shards.remove(shard_id)?;
        match result {
            Ok(path) => self.launch(r.start, Some(path)),
            Err(e) => {
                tracing::warn!(shard = %shard_id, error = %e, "cannot fetch the weights");
                Some(v1::ShardStatus {
                    node_id: self.config.node_id.clone(),
                    replica_id: r.start.replica_id.clone(),
                    shard_id: shard_id.to_owned(),
                    state: wire_state(State::Failed),
                    error: e.to_string(),
                    ..v1::ShardStatus::default()
                })
            }
        }
    }

    fn launch(
        &mut self,
        start: v1::StartShard,
        weights: Option<String>,
    ) -> Option<v1::ShardStatus> {
        let shard_id = start.shard_id.clone();
        let fail = |error: String| v1::ShardStatus {
            node_id: self.config.node_id.clone(),
            replica_id: start.replica_id.clone(),
            shard_id: shard_id.clone(),
            state: wire_state(State::Failed),
            error,
            ..v1::ShardStatus::default()
        };
        let Some(p) = start.profile.clone() else {
            return Some(fail("StartShard carries no profile".into()));
        };
        let spec = ShardSpec {
            replica_id: start.replica_id.clone(),
            shard_id: shard_id.clone(),
            rank: start.rank.max(0) as u32,
            nnodes: start.nnodes.max(1) as u32,
            leader_addr: start.leader_addr.clone(),
            leader_port: u16::try_from(start.leader_port).unwrap_or(0),
            gpu_indices: start
                .gpu_indices
                .iter()
                .map(|g| (*g).max(0) as u32)
                .collect(),
            hcas: start.hcas.clone(),
            mgmt_interface: start.mgmt_interface.clone(),
            http_port: u16::try_from(start.http_port).unwrap_or(0),
            profile: Profile {
                name: p.name.clone(),
                engine: p.engine.clone(),
                tp: p.tp.max(1) as u32,
                pp: p.pp.max(1) as u32,
                nodes: p.nodes.max(1) as u32,
                gpus_per_node: p.gpus_per_node.max(0) as u32,
                args: p.args.clone(),
                env: p.env.clone().into_iter().collect(),
                model_path: weights.clone().unwrap_or_else(|| p.model_path.clone()),
                served_model_name: p.served_model_name.clone(),
            },
            bind_addr: self.config.engine_bind.clone().unwrap_or_default(),
        };
        let engine = match self.engines.get(&p.engine) {
            Ok(e) => e,
            Err(e) => return Some(fail(e.0)),
        };
        let gpus: Vec<GpuInfo> = Vec::new();
        if !spec.gpu_indices.is_empty() {
            // GPU facts come from discovery; without them validation of
            // class mixing falls to the control plane's placement.
        } else if let Err(e) = engine.validate(&spec.profile, &gpus) {
            return Some(fail(e.0));
        }
        let commands = match engine.commands(&spec) {
            Ok(c) => c,
            Err(e) => return Some(fail(e.0)),
        };
        let options = SupervisorOptions {
            http_port: engine.serves_http(&spec).then_some(spec.http_port),
            served_model: (!p.served_model_name.is_empty()).then(|| p.served_model_name.clone()),
            startup_timeout: (start.startup_timeout_ms > 0)
                .then(|| Duration::from_millis(start.startup_timeout_ms as u64)),
            health_host: self
                .config
                .engine_bind
                .clone()
                .unwrap_or_else(|| "127.0.0.1".into()),
            leader: (spec.nnodes > 1).then(|| (spec.leader_addr.clone(), spec.leader_port)),
            rendezvous_timeout: Duration::from_millis(start.startup_timeout_ms.max(1000) as u64),
            stop_timeout: self.config.stop_timeout,
            log_lines: self.config.log_lines,
            ..SupervisorOptions::default()
        };
        tracing::info!(shard = %shard_id, engine = %p.engine, port = spec.http_port, "starting");
        let options = SupervisorOptions {
            log_file: self
                .config
                .work_dir
                .as_deref()
                .and_then(|d| state_files::log_path(d, &shard_id).ok()),
            ..options
        };
        let main = commands.last().map(|c| {
            let mut argv = vec![c.path.display().to_string()];
            argv.extend(c.args.iter().cloned());
            argv
        });
        let count = commands.len();
        let shard = supervisor::start(commands, options);
        // Once every command runs, the state file records them, so that a
        // restarted agent adopts them.
        let record = self
            .config
            .work_dir
            .clone()
            .zip(main)
            .map(|(dir, cmdline)| {
                (
                    dir,
                    state_files::Record {
                        spec: state_files::Spec::of(&start),
                        pids: Vec::new(),
                        cmdline,
                        started_at: std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs()),
                    },
                )
            });
        self.watch(shard_id.clone(), shard.status(), record, count);
        self.shards.insert(
            shard_id.clone(),
            Running {
                start,
                status: shard.status(),
                shard: Some(shard),
                started: Instant::now(),
                draining: false,
                fetch: None,
            },
        );
        self.shard_status(&shard_id)
    }
}

impl Agent {
    /// Forwards a shard's status changes to the session, writing its state
    /// file once all its commands run.
    fn watch(
        &self,
        id: String,
        mut status: watch::Receiver<supervisor::Status>,
        mut record: Option<(std::path::PathBuf, state_files::Record)>,
        commands: usize,
    ) {
        let changes = self.changes_tx.clone();
        tokio::spawn(async move {
            let mut rewritten = false;
            while status.changed().await.is_ok() {
                let (pids, state) = {
                    let s = status.borrow();
                    (s.pids.clone(), s.state)
                };
                // Written once every command runs, and again once ready
                // with the command line as the kernel shows it then (a
                // script's interpreter, or a wrapper that exec'd).
                if pids.len() == commands
                    && let Some((dir, r)) = record.as_mut()
                    && (r.pids.is_empty() || (state == State::Ready && !rewritten))
                {
                    if state == State::Ready {
                        rewritten = true;
                        if let Some(c) = pids.last().and_then(|p| state_files::cmdline_of(*p)) {
                            r.cmdline = c;
                        }
                    }
                    r.pids = pids;
                    if let Err(e) = state_files::write(dir, r) {
                        tracing::warn!(error = %e, "no state file: a restarted agent will not adopt this shard");
                    }
                }
                if changes.send(id.clone()).is_err() {
                    return;
                }
            }
        });
    }

    fn forget(&self, shard_id: &str) {
        if let Some(dir) = &self.config.work_dir {
            state_files::remove(dir, shard_id);
        }
    }

    /// Adopts what a previous agent left running, and cleans up after what
    /// it did not.
    async fn adopt_orphans(&mut self) {
        let Some(dir) = self.config.work_dir.clone() else {
            return;
        };
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::error!(dir = %dir.display(), error = %e, "cannot create the work directory: engines will log nowhere and a restarted agent cannot adopt them");
            self.config.work_dir = None;
            return;
        }
        for found in state_files::scan(&dir) {
            match found {
                state_files::Found::Adopt(r) => {
                    let start = r.spec.start();
                    let serves = r.spec.rank == 0;
                    let options = SupervisorOptions {
                        http_port: serves.then(|| u16::try_from(r.spec.http_port).unwrap_or(0)),
                        served_model: (!r.spec.served_model_name.is_empty())
                            .then(|| r.spec.served_model_name.clone()),
                        health_host: self
                            .config
                            .engine_bind
                            .clone()
                            .unwrap_or_else(|| "127.0.0.1".into()),
                        stop_timeout: self.config.stop_timeout,
                        log_lines: self.config.log_lines,
                        log_file: state_files::log_path(&dir, &r.spec.shard_id).ok(),
                        ..SupervisorOptions::default()
                    };
                    tracing::info!(shard = %r.spec.shard_id, pids = ?r.pids, "adopted an engine a previous agent started");
                    let shard = supervisor::adopt(r.pids.clone(), options);
                    self.watch(r.spec.shard_id.clone(), shard.status(), None, 0);
                    let age = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs())
                        .saturating_sub(r.started_at);
                    self.shards.insert(
                        r.spec.shard_id.clone(),
                        Running {
                            start,
                            status: shard.status(),
                            shard: Some(shard),
                            started: Instant::now()
                                .checked_sub(Duration::from_secs(age))
                                .unwrap_or_else(Instant::now),
                            draining: false,
                            fetch: None,
                        },
                    );
                }
                state_files::Found::Unidentifiable { shard_id, pids } => {
                    tracing::warn!(shard = %shard_id, ?pids, "killing an engine its state file cannot describe");
                    state_files::kill_groups(&pids, self.config.stop_timeout).await;
                    state_files::remove(&dir, &shard_id);
                }
                state_files::Found::Gone(id) | state_files::Found::Stale(id) => {
                    state_files::remove(&dir, &id);
                }
            }
        }
    }
}

fn storage(s: &[discovery::storage::Storage]) -> Vec<v1::Storage> {
    s.iter()
        .map(|s| v1::Storage {
            path: s.path.clone(),
            free_bytes: s.free_bytes as i64,
            total_bytes: s.total_bytes as i64,
            shared: s.shared,
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SessionError(String);
