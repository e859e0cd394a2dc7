//! The agent's one outbound stream to the control plane.
//!
//! Register (the whole inventory and the running shards) on every stream,
//! and again on a new stream to the same server when a look at the GPUs
//! reads cards the registration did not have (a driver that came up after
//! the agent: only a registration carries cards); heartbeats with
//! changed-only sections, shard status as it changes; starts
//! and stops from the control plane carried out by the supervisor. The
//! stream is redialled forever through every configured server: a server
//! that cannot be reached is tried again after a jittered backoff of its
//! own; one that answers but cannot take the stream now (its store out of
//! reach, it is stopping) is asked again within `BUSY_MAX`, never backed
//! off from as if it were gone; a standby's refusal says whom to dial (the
//! leader, tried at once, and at once whatever failed there before when it
//! is newly in office) and when to ask it again (when the lease runs out,
//! asked at least every second), and never grows a backoff; a stream that
//! ends sends the agent to the other servers at once. Attempts at
//! different servers run side by side, so one that hangs (a frozen leader,
//! a machine gone: HTTP/2 pings find a dead stream within seconds) holds
//! up none of the others.
//! Only the current leader is obeyed: a message from a lower lease epoch
//! than the highest seen (`epoch.rs`) is refused and the stream left.
//! Engines outlive both the stream and the agent: a stop signal ends the
//! agent and leaves them serving.

mod adopt;
mod epoch;
mod inventory;
mod provision;
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
use crate::state_files;
use crate::supervisor::{self, State};
pub use provision::ProvisionSettings;

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
    /// Where engines the control plane asks for are installed, and how.
    pub provision: ProvisionSettings,
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
            provision: ProvisionSettings::default(),
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
    /// The cards the last registration carried: a later look that reads
    /// one it did not have registers again (`recheck::unregistered`).
    registered_cards: Vec<recheck::Card>,
    /// The configured fabrics the last registration left out, as logged.
    fabrics_said: Vec<String>,
    /// What the agent's metrics page shows.
    stats: Arc<crate::metrics::AgentStats>,
    /// The highest lease epoch seen: no command from a lower one is
    /// carried out.
    epochs: epoch::Epochs,
    /// The host as the last registration read it (which build suits it).
    host: crate::discovery::host::Host,
    /// Installs what the control plane wants; started by the first
    /// `Provision` that asks for anything.
    provisioner: Option<crate::provision::Provisioner>,
    /// The provisioning statuses this stream last sent.
    sent_provision: Vec<v1::ProvisionStatus>,
    /// The shards the last run stopped on its clean exit, told in every
    /// registration of this run (ids are never reused: a late repeat
    /// names replicas already stopped).
    stopped_on_exit: Vec<String>,
    /// A control plane has taken a registration of this run (and so heard
    /// of `stopped_on_exit`).
    registered: bool,
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

/// A standby that will not lead for a while is asked again this often.
const STANDBY_POLL: Duration = Duration::from_secs(1);
/// A ping on the stream when nothing was heard for this long…
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
/// …and the stream is given up when the ping is not answered in this.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a refusal is given to reach a deposed leader before the agent
/// leaves its stream.
const REFUSAL_FLUSH: Duration = Duration::from_secs(1);
/// One server is never dialled more often than this.
const MIN_GAP: Duration = Duration::from_millis(100);
/// The longest wait before asking again a server that answered but could
/// not take the stream (its store out of reach, a moment of stepping
/// down): it is up, and takes the stream the moment its store is back,
/// within a node's `unreachable_after` (15 s by default), so a wait that
/// grew up to `--reconnect-max-s` as for a server gone kept nodes away
/// from a leader long after a store outage and got them marked
/// unreachable.
const BUSY_MAX: Duration = Duration::from_secs(5);

/// A stream up this long was a session, not a server that takes streams
/// and drops them at once: its end starts the backoff afresh.
const STABLE: Duration = Duration::from_secs(5);

/// One configured server, as the dialling loop sees it.
#[derive(Debug)]
struct Dial {
    url: String,
    /// Attempts in a row that got no stream and no answer from the server
    /// (it could not be reached, or refused this agent), or streams that
    /// ended soon after they began.
    failures: u32,
    /// Answers in a row that the server cannot take the stream now
    /// ([`Ended::Busy`]).
    busy: u32,
    /// The highest lease epoch under which a standby named this server
    /// the leader: a higher one is a new term, which earlier failures
    /// here say nothing about.
    led_at: u64,
    /// Not dialled again before this.
    not_before: Instant,
    tried: Option<Instant>,
    /// The leader this server last named that is not among the servers
    /// dialled: warned about once, not at every refusal.
    unlisted_leader: Option<String>,
}

/// How one attempt at a session ended.
#[derive(Debug)]
enum Ended {
    /// The stream was up for this long; then the control plane closed it
    /// (None) or it broke.
    Served(Duration, Option<String>),
    /// A standby refused, saying whom and when.
    Refused(Refusal),
    /// The server answered that it cannot take a stream now (UNAVAILABLE
    /// without a standby's refusal: its store is out of reach, it is
    /// stopping, its lease is in doubt): up, and asked again soon.
    Busy(String),
    /// No stream.
    Failed(String),
    /// The agent left the stream to register again: a look at its GPUs
    /// read cards its registration did not have (a driver that came up
    /// after the agent), and only a registration carries cards.
    Reregister,
}

/// A standby's refusal, as the metadata of its status says
/// (`llmgw_api::refusal`).
#[derive(Debug)]
struct Refusal {
    retry_after: Duration,
    leader: Option<String>,
    leader_agent: Option<String>,
    /// The lease's epoch as the standby read it (0 when it did not say).
    epoch: u64,
    message: String,
}

impl Refusal {
    /// A standby's refusal, or None for any other status.
    fn from_status(s: &tonic::Status) -> Option<Refusal> {
        use llmgw_api::refusal;
        if s.code() != tonic::Code::Unavailable {
            return None;
        }
        let md = s.metadata();
        let text = |k: &str| {
            md.get(k)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .filter(|v| !v.is_empty())
        };
        let ms: u64 = text(refusal::RETRY_AFTER_MS)?.parse().ok()?;
        Some(Refusal {
            retry_after: Duration::from_millis(ms),
            leader: text(refusal::LEADER),
            leader_agent: text(refusal::LEADER_AGENT),
            epoch: text(refusal::EPOCH)
                .and_then(|e| e.parse().ok())
                .unwrap_or(0),
            message: s.message().to_owned(),
        })
    }

    /// When to ask this standby again: when it said, but at least every
    /// [`STANDBY_POLL`] (a leader may step down before its lease runs
    /// out), jittered so that a fleet does not knock in step.
    fn wait(&self) -> Duration {
        if self.retry_after > STANDBY_POLL {
            STANDBY_POLL.mul_f64(jitter())
        } else {
            self.retry_after.max(MIN_GAP)
        }
    }
}

/// Whether a leader's advertised agent address is this configured server.
fn same_server(url: &str, advertised: &str) -> bool {
    let norm = |u: &str| u.trim().trim_end_matches('/').to_ascii_lowercase();
    norm(url) == norm(advertised)
}

/// The wait after `failures` attempts in a row that found nobody.
fn backoff(base: Duration, max: Duration, failures: u32) -> Duration {
    let doubled = base.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    doubled.min(max).mul_f64(jitter())
}

/// When each server is dialled next, after an attempt at `dials[i]`.
fn replan(dials: &mut [Dial], i: usize, ended: Ended, base: Duration, max: Duration) {
    let now = Instant::now();
    let server = dials[i].url.clone();
    match ended {
        Ended::Served(lasted, why) => {
            match why {
                None => tracing::info!(server = %server, "the control plane closed the stream"),
                Some(e) => tracing::warn!(server = %server, error = %e, "the stream broke"),
            }
            // The leader is gone or stepped down: the others are asked
            // at once (one of them is about to lead). A stream that
            // served a while resets this server's backoff (the failures
            // counted while it was down ended when it took the stream: a
            // restart a few seconds into a stream was redialled 15 to 30 s
            // later); one that ended at once counts as a failure.
            for d in dials.iter_mut() {
                d.not_before = d.not_before.min(now);
            }
            let d = &mut dials[i];
            d.busy = 0;
            d.failures = if lasted >= STABLE.min(max) {
                0
            } else {
                d.failures + 1
            };
            d.not_before = now + backoff(base, max, d.failures.max(1));
        }
        Ended::Refused(r) => {
            let wait = r.wait();
            let leader = dials.iter().position(|d| {
                r.leader_agent
                    .as_deref()
                    .is_some_and(|a| same_server(&d.url, a))
            });
            tracing::info!(
                server = %server,
                leader = r.leader.as_deref().unwrap_or("none"),
                leader_agent = r.leader_agent.as_deref().unwrap_or("unknown"),
                retry_after_ms = r.retry_after.as_millis() as u64,
                retry_in_ms = wait.as_millis() as u64,
                "a standby refused the stream: {}", r.message
            );
            // A leader this agent does not dial is never reached: said
            // once, as what to change, where the refusals repeat at info.
            if leader.is_none()
                && let Some(addr) = r.leader_agent.as_deref()
                && dials[i].unlisted_leader.as_deref() != Some(addr)
            {
                tracing::warn!(
                    server = %server,
                    leader = r.leader.as_deref().unwrap_or("unknown"),
                    leader_agent = addr,
                    "the leader's agent address is not among --server, so this agent cannot connect; give --server every server (the standby and {addr})"
                );
                dials[i].unlisted_leader = Some(addr.to_owned());
            }
            // A standby answered: no backoff against it.
            dials[i].failures = 0;
            dials[i].busy = 0;
            dials[i].not_before = now + wait;
            // The leader it names is dialled next. A leader newly in office
            // (a higher epoch than any it was named under) is dialled
            // whatever failed there before: that was another term (a
            // restart, a store outage). One named again in the same term
            // that this agent cannot reach keeps its own backoff.
            if let Some(j) = leader.filter(|&j| j != i) {
                let d = &mut dials[j];
                let new_term = r.epoch > d.led_at;
                if new_term {
                    d.led_at = r.epoch;
                    d.failures = 0;
                }
                if new_term || d.failures == 0 {
                    d.not_before = d.tried.map_or(now, |t| (t + MIN_GAP).max(now));
                }
            }
        }
        Ended::Busy(e) => {
            // Up, and answering: not backed off from as from a server
            // gone, only paced (doubling up to BUSY_MAX).
            let d = &mut dials[i];
            d.failures = 0;
            d.busy += 1;
            let wait = backoff(base, max.min(BUSY_MAX), d.busy);
            d.not_before = now + wait;
            tracing::warn!(
                server = %server,
                error = %e,
                retry_in_ms = wait.as_millis() as u64,
                "no session with the control plane: the server answered but cannot take the stream now"
            );
        }
        Ended::Reregister => {
            // The same server, at once: it was answering a moment ago.
            let d = &mut dials[i];
            d.failures = 0;
            d.busy = 0;
            d.not_before = now;
        }
        Ended::Failed(e) => {
            let d = &mut dials[i];
            d.busy = 0;
            d.failures += 1;
            let wait = backoff(base, max, d.failures);
            d.not_before = now + wait;
            tracing::warn!(
                server = %server,
                error = %e,
                retry_in_ms = wait.as_millis() as u64,
                "no session with the control plane"
            );
        }
    }
}

/// A random factor in [0.5, 1.0), so that a fleet does not redial in step.
fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    0.5 + f64::from(nanos % 1000) / 2000.0
}

impl Agent {
    pub fn new(mut config: SessionConfig, engines: Registry) -> Self {
        // Discovery lists the cache's filesystem first: where fetched
        // weights land is the room `min_disk_gb` is checked against.
        if config.discovery.cache_dir.is_none() {
            config.discovery.cache_dir = config.cache_dir.clone();
        }
        let (changes_tx, changes_rx) = mpsc::unbounded_channel();
        let (fetched_tx, fetched_rx) = mpsc::unbounded_channel();
        let (stopped_tx, stopped_rx) = mpsc::unbounded_channel();
        let fetcher = crate::fetch::Fetcher::new(config.cache_dir.clone());
        let epochs = epoch::Epochs::load(config.work_dir.as_deref());
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
            registered_cards: Vec::new(),
            fabrics_said: Vec::new(),
            stats: Arc::default(),
            epochs,
            host: Default::default(),
            provisioner: None,
            sent_provision: Vec::new(),
            stopped_on_exit: Vec::new(),
            registered: false,
        }
    }

    /// Keeps `stats` (what the agent's metrics page shows) up to date
    /// while it runs: a page served before the agent is made (while it
    /// joins) shows it from then on.
    pub fn reporting_to(mut self, stats: Arc<crate::metrics::AgentStats>) -> Self {
        self.stats = stats;
        self
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
        // Builds installed before a restart are checked first, so that
        // the registration (and the first probe) has them.
        if tokio::select! {
            _ = self.resume_provisioning() => false,
            _ = shutdown.wait_for(|s| *s) => true,
        } {
            return;
        }
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
            // Only engines that ran: one that had failed is the failure
            // it was, not a clean stop. Those the last run stopped stay
            // listed until a control plane has heard of them.
            let mut stopped = Vec::new();
            if !self.registered {
                stopped.append(&mut self.stopped_on_exit);
            }
            for (id, mut r) in std::mem::take(&mut self.shards) {
                let ran = !matches!(r.status.borrow().state, State::Failed | State::Stopped);
                if let Some(s) = r.shard.take() {
                    s.stop().await;
                    if ran {
                        stopped.push(id.clone());
                    }
                }
                self.forget(&id);
            }
            if let Some(dir) = &self.config.work_dir
                && let Err(e) = state_files::write_stopped_on_exit(dir, &stopped)
            {
                tracing::warn!(error = %e, "cannot note the shards stopped on exit: the control plane will take them for failed");
            }
        }
    }

    async fn serve(&mut self, mut shutdown: watch::Receiver<bool>) {
        let start = Instant::now();
        let mut dials: Vec<Dial> = (self.config.servers.iter())
            .map(|url| Dial {
                url: url.clone(),
                failures: 0,
                busy: 0,
                led_at: 0,
                not_before: start,
                tried: None,
                unlisted_leader: None,
            })
            .collect();
        // Attempts run side by side, each until it has a stream or an
        // answer: a server that hangs (a frozen process, a machine gone)
        // holds up none of the others.
        let mut attempts: tokio::task::JoinSet<Result<Opened, Ended>> = tokio::task::JoinSet::new();
        // Which server each attempt dials; one attempt per server at most
        // (two streams of one node would replace each other).
        let mut in_flight: BTreeMap<tokio::task::Id, usize> = BTreeMap::new();
        let (base, max) = (self.config.reconnect_base, self.config.reconnect_max);
        loop {
            if *shutdown.borrow() {
                return;
            }
            let now = Instant::now();
            let due: Vec<usize> = (0..dials.len())
                .filter(|i| !in_flight.values().any(|j| j == i) && dials[*i].not_before <= now)
                .collect();
            if !due.is_empty() {
                self.publish_shards();
                let register = self.register().await;
                for i in due {
                    dials[i].tried = Some(Instant::now());
                    let (url, tls, register) = (
                        dials[i].url.clone(),
                        self.config.tls.clone(),
                        register.clone(),
                    );
                    let span = tracing::info_span!("agent_session", server = %url, node = %self.config.node_id);
                    let task = attempts.spawn(tracing::Instrument::instrument(
                        open(url, tls, register),
                        span,
                    ));
                    in_flight.insert(task.id(), i);
                }
            }
            let next = (0..dials.len())
                .filter(|i| !in_flight.values().any(|j| j == i))
                .map(|i| dials[i].not_before)
                .min();
            let (i, result) = tokio::select! {
                Some(done) = attempts.join_next_with_id() => match done {
                    Ok((id, r)) => match in_flight.remove(&id) {
                        Some(i) => (i, r),
                        None => continue,
                    },
                    Err(e) => {
                        tracing::error!(error = %e, "a dialling task failed");
                        if let Some(i) = in_flight.remove(&e.id()) {
                            dials[i].not_before = Instant::now() + base;
                        }
                        continue;
                    }
                },
                _ = tokio::time::sleep_until(next.unwrap_or(now + max)) => continue,
                _ = shutdown.wait_for(|s| *s) => return,
            };
            let ended = match result {
                Err(ended) => ended,
                Ok(opened) => {
                    // Only one server leads: the other attempts are moot
                    // (dropping the set ends them, finished or not).
                    attempts = tokio::task::JoinSet::new();
                    in_flight.clear();
                    let span = tracing::info_span!("agent_session", server = %dials[i].url, node = %self.config.node_id);
                    let url = dials[i].url.clone();
                    let ended = tokio::select! {
                        e = tracing::Instrument::instrument(self.session(&url, opened), span) => e,
                        _ = shutdown.wait_for(|s| *s) => return,
                    };
                    self.stats.stream_down();
                    self.publish_shards();
                    ended
                }
            };
            if let Ended::Refused(r) = &ended {
                // A standby names the lease's epoch: any leader under a
                // lower one is deposed.
                self.epochs.saw(r.epoch);
            }
            replan(&mut dials, i, ended, base, max);
        }
    }

    /// Serves a stream that is up until it ends.
    async fn session(&mut self, server: &str, opened: Opened) -> Ended {
        let Opened {
            tx,
            mut inbound,
            register,
        } = opened;
        // Heartbeats send what changed since the registration that was
        // accepted (a later one may have been built for another attempt).
        self.sent_weights = register.weights;
        self.sent_engines = register.engine_versions.into_iter().collect();
        // A registration carries no provisioning: the first heartbeat does.
        self.sent_provision = Vec::new();
        let send = |tx: &mpsc::Sender<AgentMessage>, msg| {
            let _ = tx.try_send(AgentMessage { msg: Some(msg) });
        };
        tracing::info!(server, node = %self.config.node_id, "connected to the control plane");
        self.registered = true;
        self.stats.stream_up();
        let up = Instant::now();
        let mut beat = tokio::time::interval(self.config.heartbeat);
        beat.tick().await;
        let mut first = true;
        loop {
            self.publish_shards();
            tokio::select! {
                _ = beat.tick() => {
                    if let Some(cards) = self.unregistered() {
                        tracing::info!(cards = %cards, "GPUs the registration did not have can be read now: registering again");
                        return Ended::Reregister;
                    }
                    send(&tx, agent_message::Msg::Heartbeat(self.heartbeat().await));
                }
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
                    let msg = match msg {
                        Ok(Some(m)) => m,
                        Ok(None) => return Ended::Served(up.elapsed(), None),
                        Err(s) => return Ended::Served(up.elapsed(), Some(format!("stream: {}", s.message()))),
                    };
                    if first {
                        first = false;
                        if let Some(control_message::Msg::Ack(a)) = &msg.msg
                            && a.epoch_lowered
                        {
                            self.epochs.lowered(msg.epoch);
                        }
                    }
                    if let epoch::Verdict::Refuse { highest } = self.epochs.judge(msg.epoch) {
                        return self.refuse(server, &tx, msg, highest, &mut inbound, up).await;
                    }
                    self.epochs.saw(msg.epoch);
                    if let Some(control_message::Msg::Logs(req)) = msg.msg {
                        send(&tx, agent_message::Msg::Logs(self.logs(&req)));
                        continue;
                    }
                    if let Some(control_message::Msg::Provision(p)) = msg.msg {
                        self.provision(p);
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

impl Agent {
    /// A message from a deposed leader: not carried out, said to the
    /// sender (which steps down once its store confirms it) and logged;
    /// then the stream is left, for the leader. The refusal is given a
    /// moment to reach the sender, and whatever else comes meanwhile is
    /// refused too.
    async fn refuse(
        &mut self,
        server: &str,
        tx: &mpsc::Sender<AgentMessage>,
        msg: v1::ControlMessage,
        highest: u64,
        inbound: &mut tonic::Streaming<v1::ControlMessage>,
        up: Instant,
    ) -> Ended {
        let mut msg = Some(msg);
        let flush = tokio::time::sleep(REFUSAL_FLUSH);
        tokio::pin!(flush);
        while let Some(m) = msg.take() {
            let (command, shard_id) = epoch::describe(m.msg.as_ref());
            tracing::warn!(
                server,
                command,
                shard = %shard_id,
                epoch = m.epoch,
                highest,
                "refused a command from a deposed leader (epoch {} < {highest})",
                m.epoch
            );
            self.stats.refused();
            let _ = tx.try_send(AgentMessage {
                msg: Some(agent_message::Msg::Refused(v1::CommandRefused {
                    command: command.into(),
                    shard_id,
                    epoch: m.epoch,
                    highest,
                })),
            });
            msg = tokio::select! {
                next = inbound.message() => next.ok().flatten(),
                _ = &mut flush => None,
            };
        }
        Ended::Served(
            up.elapsed(),
            Some(format!(
                "the server is deposed: its epoch is lower than {highest}"
            )),
        )
    }
}

/// A stream that is up, and the registration it was opened with.
#[derive(Debug)]
struct Opened {
    tx: mpsc::Sender<AgentMessage>,
    inbound: tonic::Streaming<v1::ControlMessage>,
    register: v1::Register,
}

/// Dials `server` and asks for a stream, registering with `register`:
/// the stream, or how the attempt ended (a standby's refusal, or none).
async fn open(
    server: String,
    tls: Option<(String, String, String)>,
    register: v1::Register,
) -> Result<Opened, Ended> {
    let channel = dial(&server, tls.as_ref())
        .await
        .map_err(|SessionError(e)| Ended::Failed(e))?;
    let mut client = AgentServiceClient::new(channel);
    let (tx, rx) = mpsc::channel::<AgentMessage>(256);
    let _ = tx.try_send(AgentMessage {
        msg: Some(agent_message::Msg::Register(register.clone())),
    });
    match client.connect(ReceiverStream::new(rx)).await {
        Ok(r) => Ok(Opened {
            tx,
            inbound: r.into_inner(),
            register,
        }),
        Err(s) => Err(match Refusal::from_status(&s) {
            Some(r) => Ended::Refused(r),
            None if busy(&s) => {
                Ended::Busy(format!("refused: {}", why::refused(&s, tls.is_some())))
            }
            None => {
                let failure = format!("refused: {}", why::refused(&s, tls.is_some()));
                if why::answers_http1(&server).await {
                    Ended::Failed(why::not_the_agent_listener(&server, &failure))
                } else {
                    Ended::Failed(failure)
                }
            }
        }),
    }
}

/// Whether `s` is the server's own answer that it cannot take a stream
/// now: UNAVAILABLE as a gRPC server sends it (its response's headers
/// come with it), not one tonic made of a connection that failed (no
/// headers, the transport error as its source), which says nothing of
/// whether the server is up.
fn busy(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::Unavailable
        && std::error::Error::source(s).is_none()
        && s.metadata()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"))
}

/// A channel to `server` (mutual TLS when the agent holds certificates:
/// the CA, the node's certificate and its key, PEM), as the agent dials
/// it; the control plane's scale bench dials the same way.
pub async fn dial(
    server: &str,
    tls: Option<&(String, String, String)>,
) -> Result<tonic::transport::Channel, SessionError> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(server.to_owned())
        .map_err(|e| SessionError(format!("{server} is not a URL: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        // A leader whose machine died or hangs closes nothing: pings
        // find it gone within seconds (before its lease runs out), so
        // the agent is at a standby's door when the standby takes
        // office.
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .tcp_nodelay(true);
    if let Some((ca, cert, key)) = tls {
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
    endpoint
        .connect()
        .await
        .map_err(|e| SessionError(format!("cannot connect: {}", why::explain(&e))))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dials(urls: &[&str]) -> Vec<Dial> {
        let now = Instant::now();
        urls.iter()
            .map(|u| Dial {
                url: (*u).to_owned(),
                failures: 0,
                busy: 0,
                led_at: 0,
                not_before: now,
                tried: Some(now - Duration::from_secs(1)),
                unlisted_leader: None,
            })
            .collect()
    }

    fn refusal(retry_after_ms: u64, leader_agent: Option<&str>) -> Ended {
        Ended::Refused(Refusal {
            retry_after: Duration::from_millis(retry_after_ms),
            leader: leader_agent.map(|_| "a".to_owned()),
            leader_agent: leader_agent.map(str::to_owned),
            epoch: 0,
            message: "standby".into(),
        })
    }

    const BASE: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);
    const A: &str = "http://10.0.0.1:7443";
    const B: &str = "http://10.0.0.2:7443";

    fn wait(d: &Dial) -> Duration {
        d.not_before.saturating_duration_since(Instant::now())
    }

    #[test]
    fn a_standby_that_refuses_is_asked_again_within_a_second_and_never_backed_off() {
        let mut d = dials(&[A, B]);
        for _ in 0..10 {
            replan(&mut d, 1, refusal(8_000, None), BASE, MAX);
            assert_eq!(d[1].failures, 0);
            assert!(wait(&d[1]) <= STANDBY_POLL, "{:?}", wait(&d[1]));
        }
        // When the lease runs out sooner, then.
        replan(&mut d, 1, refusal(300, None), BASE, MAX);
        let w = wait(&d[1]);
        assert!(
            w <= Duration::from_millis(300) && w > Duration::from_millis(200),
            "{w:?}"
        );
        // Never in a tight loop.
        replan(&mut d, 1, refusal(0, None), BASE, MAX);
        assert!(wait(&d[1]) > MIN_GAP / 2);
    }

    #[test]
    fn a_server_that_cannot_be_reached_backs_off_alone() {
        let mut d = dials(&[A, B]);
        let mut last = Duration::ZERO;
        for n in 1..=4 {
            replan(&mut d, 0, Ended::Failed("cannot connect".into()), BASE, MAX);
            assert_eq!(d[0].failures, n);
            let w = wait(&d[0]);
            assert!(w >= BASE.saturating_mul(1 << (n - 1)) / 2, "{n}: {w:?}");
            assert!(w > last / 2);
            last = w;
            // The standby's next attempt is not pushed out by it.
            replan(&mut d, 1, refusal(8_000, Some(A)), BASE, MAX);
            assert!(wait(&d[1]) <= STANDBY_POLL);
            // Nor is the dead leader it names dialled again before its time.
            assert!(wait(&d[0]) > Duration::ZERO);
        }
        assert!(d[1].not_before < d[0].not_before, "the standby comes first");
    }

    /// Failures counted while a server was down end with the stream it
    /// then took: a restart seconds into that stream is redialled from the
    /// base, not after the backoff the outage had reached. A stream that
    /// ends at once still counts as a failure.
    #[test]
    fn a_stream_that_served_a_while_starts_the_backoff_afresh() {
        let mut d = dials(&[A]);
        for _ in 0..5 {
            replan(&mut d, 0, Ended::Failed("cannot connect".into()), BASE, MAX);
        }
        replan(
            &mut d,
            0,
            Ended::Served(Duration::from_secs(14), None),
            BASE,
            MAX,
        );
        assert_eq!(d[0].failures, 0);
        assert!(wait(&d[0]) <= BASE * 2, "{:?}", wait(&d[0]));
        replan(
            &mut d,
            0,
            Ended::Served(Duration::from_millis(200), None),
            BASE,
            MAX,
        );
        replan(
            &mut d,
            0,
            Ended::Served(Duration::from_millis(200), None),
            BASE,
            MAX,
        );
        assert_eq!(d[0].failures, 2, "streams dropped at once back off");
    }

    #[test]
    fn the_leader_a_standby_names_is_dialled_next() {
        let mut d = dials(&[A, B]);
        replan(
            &mut d,
            1,
            refusal(9_000, Some("HTTP://10.0.0.1:7443/")),
            BASE,
            MAX,
        );
        assert!(wait(&d[0]).is_zero(), "the leader is dialled at once");
        assert!(wait(&d[1]) > Duration::ZERO);
    }

    #[test]
    fn a_server_that_answers_it_cannot_take_the_stream_is_asked_again_soon() {
        let mut d = dials(&[A, B]);
        for _ in 0..20 {
            replan(&mut d, 0, Ended::Busy("the event store".into()), BASE, MAX);
            assert_eq!(d[0].failures, 0, "it is up");
            assert!(wait(&d[0]) <= BUSY_MAX, "{:?}", wait(&d[0]));
        }
        // Once gone, its backoff starts from the base.
        replan(&mut d, 0, Ended::Failed("cannot connect".into()), BASE, MAX);
        assert!(wait(&d[0]) <= BASE);
    }

    #[test]
    fn a_leader_newly_in_office_is_dialled_at_once_whatever_failed_there() {
        let with_epoch = |epoch| {
            let Ended::Refused(mut r) = refusal(9_000, Some(A)) else {
                unreachable!()
            };
            r.epoch = epoch;
            Ended::Refused(r)
        };
        let mut d = dials(&[A, B]);
        for _ in 0..6 {
            replan(&mut d, 0, Ended::Failed("cannot connect".into()), BASE, MAX);
        }
        assert!(wait(&d[0]) > Duration::from_secs(10));
        replan(&mut d, 1, with_epoch(16), BASE, MAX);
        assert!(wait(&d[0]).is_zero(), "a new term: dialled at once");
        assert_eq!(d[0].failures, 0);
        // Not reached in this term either: its backoff stands while the
        // standby names it again, until a later term.
        replan(&mut d, 0, Ended::Failed("cannot connect".into()), BASE, MAX);
        replan(&mut d, 0, Ended::Failed("cannot connect".into()), BASE, MAX);
        replan(&mut d, 1, with_epoch(16), BASE, MAX);
        assert!(wait(&d[0]) > Duration::ZERO);
        replan(&mut d, 1, with_epoch(17), BASE, MAX);
        assert!(wait(&d[0]).is_zero());
    }

    #[test]
    fn a_leader_the_agent_does_not_dial_is_warned_about_once() {
        let mut d = dials(&[B]);
        replan(&mut d, 0, refusal(9_000, Some(A)), BASE, MAX);
        assert_eq!(d[0].unlisted_leader.as_deref(), Some(A));
        // A listed leader is dialled, not warned about.
        let mut d = dials(&[A, B]);
        replan(&mut d, 1, refusal(9_000, Some(A)), BASE, MAX);
        assert_eq!(d[1].unlisted_leader, None);
    }

    #[test]
    fn a_stream_that_ends_sends_the_agent_to_the_others_at_once() {
        let mut d = dials(&[A, B]);
        replan(&mut d, 1, Ended::Failed("cannot connect".into()), BASE, MAX);
        replan(&mut d, 1, Ended::Failed("cannot connect".into()), BASE, MAX);
        assert!(wait(&d[1]) > Duration::ZERO);
        replan(
            &mut d,
            0,
            Ended::Served(Duration::from_secs(3600), Some("broke".into())),
            BASE,
            MAX,
        );
        assert!(wait(&d[1]).is_zero(), "the other server is tried at once");
        assert_eq!(d[0].failures, 0, "a stream that lasted resets its backoff");
        assert!(wait(&d[0]) <= BASE);
        assert!(d[1].not_before < d[0].not_before);
        // A stream that ends at once, again and again, backs off.
        for _ in 0..5 {
            replan(&mut d, 0, Ended::Served(Duration::ZERO, None), BASE, MAX);
        }
        assert!(wait(&d[0]) >= Duration::from_secs(8));
    }

    #[test]
    fn a_refusal_is_read_from_the_status_metadata_only() {
        use llmgw_api::refusal;
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert(refusal::RETRY_AFTER_MS, "7250".parse().unwrap());
        md.insert(refusal::LEADER, "cp-a".parse().unwrap());
        md.insert(refusal::LEADER_AGENT, A.parse().unwrap());
        let s = tonic::Status::with_metadata(tonic::Code::Unavailable, "standby", md.clone());
        let r = Refusal::from_status(&s).unwrap();
        assert_eq!(r.retry_after, Duration::from_millis(7250));
        assert_eq!(r.leader.as_deref(), Some("cp-a"));
        assert_eq!(r.leader_agent.as_deref(), Some(A));
        // Another code, or no retry-after: not a standby's refusal.
        let other = tonic::Status::with_metadata(tonic::Code::PermissionDenied, "no", md);
        assert!(Refusal::from_status(&other).is_none());
        assert!(Refusal::from_status(&tonic::Status::unavailable("standby")).is_none());
    }
}
