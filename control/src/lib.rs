//! The control plane: command handling, the leadership loop around the append
//! lease, the reconciler, the agent stream service and the admin HTTP API.
//!
//! What must not: hot-path request routing (that is `llmgw-gateway`) or pure
//! decisions (those live in `llmgw-domain`, where they can be tested without
//! a database).
//!
//! Every server runs one [`ControlPlane`]. Only the holder of the append
//! lease acts: it accepts agent streams, runs the reconciler and decides
//! operator commands. A standby follows the log through its views, answers
//! reads, and refuses agents and writes with a status that names the leader.

pub mod admin;
mod agents;
pub mod anchor;
pub mod authority;
mod config;
mod convert;
mod convo_api;
mod door;
mod drain_watch;
mod fence;
mod forward;
mod groups_api;
mod join;
mod leadership;
pub mod metrics;
mod observed;
mod outbox;
mod people_api;
mod reconciler;
pub mod tenancy_api;
mod to_leader;
mod wire;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use llmgw_decider::{Actor, DecideError, Decided, Decider, Origin};
use llmgw_domain::{Command, Rejection};
use llmgw_eventstore::{AnyStore, EventStore, LeaseToken, StoreError, Writer};
use llmgw_projections::Projections;
use tokio::sync::{Notify, watch};

pub use agents::AgentSvc;
pub use config::{AdminSecret, ControlConfig};
pub use door::Door;
pub use forward::forward_writes;
pub use join::JoinSvc;
pub use to_leader::ToLeader;

/// Why a control-plane operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error("this server is a standby; the leader is {}: send the command to the leader", leader.as_deref().unwrap_or("not elected yet"))]
    Standby { leader: Option<String> },
    #[error("the event store: {0}")]
    Store(#[from] StoreError),
    #[error(
        "stream {stream} kept changing while the command was decided ({tries} tries); nothing was written: try again"
    )]
    Conflict { stream: String, tries: u32 },
    /// No control plane here, and a server leads the store: the command
    /// belongs to that server's admin API.
    #[error("{0}")]
    Lease(DecideError),
}

impl From<DecideError> for ControlError {
    fn from(e: DecideError) -> Self {
        match e {
            DecideError::Rejected(r) => ControlError::Rejected(r),
            DecideError::Store(e) => ControlError::Store(e),
            DecideError::Conflict { stream, tries } => ControlError::Conflict { stream, tries },
            e @ DecideError::LeaseHeld { .. } => ControlError::Lease(e),
        }
    }
}

/// Waits, for 5 s at most, until views at `at` have read `position`.
async fn reach(mut at: watch::Receiver<u64>, position: u64) {
    let _ = tokio::time::timeout(Duration::from_secs(5), at.wait_for(|p| *p >= position)).await;
}

/// How often a standby records demand for one model.
const DEMAND_EVERY_MS: i64 = 5_000;

/// What the control plane keeps in memory between reconciler passes. The
/// backoff and drain clocks are not among it: they are read from the log
/// (`llmgw_domain::clocks`) on every pass, so a new leader continues them.
#[derive(Debug, Default)]
struct Memory {
    rt: llmgw_domain::reconcile::Runtime,
    /// Set on taking office: the first pass takes over the replicas load
    /// grew (`reconcile::adopted`) instead of draining them.
    adopt_load: bool,
    /// Model → the last reason it could not be placed, logged on change.
    unplaced: BTreeMap<String, String>,
    /// Model → until when the last pass held it back after failures.
    backing_off: BTreeMap<String, Option<llmgw_domain::UnixMillis>>,
    /// The changes to on-demand the reconciler has taken as asks
    /// (`reconcile::asked_at_change`), each once.
    made_on_demand_taken: BTreeMap<String, llmgw_domain::UnixMillis>,
}

#[derive(Debug)]
pub struct ControlPlane {
    store: AnyStore,
    config: ControlConfig,
    decider: Decider,
    views: Arc<RwLock<Projections>>,
    views_at: watch::Receiver<u64>,
    lease: watch::Sender<Option<LeaseToken>>,
    agents: agents::Registry,
    /// What agents report that the log does not keep.
    observed: observed::Observed,
    memory: Mutex<Memory>,
    wake: Notify,
    /// Reconciler passes completed as leader: what "the reconciler has
    /// looked since" can be waited on.
    passes: watch::Sender<u64>,
    /// Where this server's admin API answers others, recorded on taking
    /// office so that standbys can forward commands here.
    admin_url: Mutex<Option<String>>,
    /// Where this server takes agent streams, recorded on taking office so
    /// that a standby's refusal can send agents here.
    agent_url: Mutex<Option<String>>,
    /// Wakes the lease loop for an attempt now (an agent came to a standby
    /// whose lease has run out), instead of at its next poll.
    nudge: Notify,
    /// Leaders' admin addresses, read from the log (for forwarding).
    leaders: tokio::sync::Mutex<forward::Leaders>,
    http: reqwest::Client,
    /// Disk and GPU figures from registrations and heartbeats (leader
    /// only): telemetry for the metrics page, never the log.
    telemetry: metrics::Telemetry,
    /// The epoch of the lease held, or last seen held by another.
    epoch_seen: AtomicU64,
    /// What joining nodes' certificates are signed with (`tls.ca_key`);
    /// unset, nodes cannot join with a token.
    authority: std::sync::OnceLock<authority::Authority>,
    /// A replica is draining: the reconciler passes more often.
    draining: std::sync::atomic::AtomicBool,
    /// Anchors recorded and sinks that failed, for the metrics page.
    pub anchor_stats: anchor::AnchorStats,
    /// How full the engines serving a model are, and whether they serve
    /// anything; unset, load grows no model.
    fullness: std::sync::OnceLock<Fullness>,
}

/// The load on a model's engines, as the gateway reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelLoad {
    /// 1 or more: at the admission ceilings on every endpoint requests go
    /// to.
    pub saturation: f64,
    /// Anything running or waiting on any of them.
    pub in_use: bool,
}

/// Reads the load on the engines serving a model, from the gateway's
/// figures (the composition root wires it).
pub struct Fullness(pub Box<dyn Fn(&str) -> ModelLoad + Send + Sync>);

impl std::fmt::Debug for Fullness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fullness")
    }
}

impl ControlPlane {
    /// A control plane over `store`, reading the server's views (kept by a
    /// projection runner that follows the same log).
    pub fn new(
        store: AnyStore,
        views: Arc<RwLock<Projections>>,
        views_at: watch::Receiver<u64>,
        config: ControlConfig,
    ) -> Arc<Self> {
        let (lease, _) = watch::channel(None);
        Arc::new(ControlPlane {
            decider: Decider::new(store.clone(), config.instance.clone()),
            store,
            config,
            views,
            views_at,
            lease,
            agents: agents::Registry::default(),
            observed: observed::Observed::default(),
            memory: Mutex::new(Memory::default()),
            wake: Notify::new(),
            passes: watch::channel(0).0,
            admin_url: Mutex::new(None),
            agent_url: Mutex::new(None),
            nudge: Notify::new(),
            leaders: tokio::sync::Mutex::new(forward::Leaders::default()),
            http: forward::client(),
            telemetry: metrics::Telemetry::default(),
            epoch_seen: AtomicU64::new(0),
            authority: std::sync::OnceLock::new(),
            draining: std::sync::atomic::AtomicBool::new(false),
            anchor_stats: anchor::AnchorStats::default(),
            fullness: std::sync::OnceLock::new(),
        })
    }

    /// Sets what says how full a model's engines are, so that load grows a
    /// model up to its `scaling.max`; once, before [`ControlPlane::run`].
    pub fn read_fullness_with(&self, fullness: Fullness) {
        let _ = self.fullness.set(fullness);
    }

    /// The admin address other servers forward commands to while this one
    /// leads; set it before [`ControlPlane::run`].
    pub fn advertise_admin(&self, url: String) {
        *self.admin_url.lock().unwrap_or_else(|p| p.into_inner()) = Some(url);
    }

    /// Where agents reach this server's agent listener (`http://…` or
    /// `https://…`), named to agents by standbys while this one leads; set
    /// it before [`ControlPlane::run`].
    pub fn advertise_agent(&self, url: String) {
        *self.agent_url.lock().unwrap_or_else(|p| p.into_inner()) = Some(url);
    }

    /// Lets nodes join with a token: their certificates are signed with
    /// this authority. Set it before [`ControlPlane::run`]; a second call
    /// changes nothing.
    pub fn sign_with(&self, authority: authority::Authority) {
        let _ = self.authority.set(authority);
    }

    /// The views this control plane reads (and the admin API answers from).
    pub fn views(&self) -> Arc<RwLock<Projections>> {
        self.views.clone()
    }

    pub fn config(&self) -> &ControlConfig {
        &self.config
    }

    pub fn is_leader(&self) -> bool {
        self.lease.borrow().is_some()
    }

    /// The count of reconciler passes completed as leader.
    pub fn passes(&self) -> watch::Receiver<u64> {
        self.passes.subscribe()
    }

    /// Changes to leadership: `Some` while this server leads.
    pub fn leadership(&self) -> watch::Receiver<Option<LeaseToken>> {
        self.lease.subscribe()
    }

    /// The origin of the control plane's own decisions and records.
    pub(crate) fn own(&self) -> Origin {
        Origin::new(Actor::Leader(self.config.instance.clone()))
    }

    /// Wall-clock milliseconds: the clocks read from the log are the
    /// times it recorded, and another server continues them.
    fn now(&self) -> llmgw_domain::UnixMillis {
        llmgw_domain::UnixMillis::now()
    }

    /// Seconds until `model` is tried again, while the reconciler holds
    /// it back after failures.
    pub(crate) fn next_try_s(&self, model: &str) -> Option<i64> {
        let until = (*self.memory().backing_off.get(model)?)?;
        Some(((until - self.now()).max(0) + 999) / 1000)
    }

    /// How long the reconciler holds `model` back after its failed
    /// starts, before it tries again; None while it is not held back, and
    /// on a standby (the backoff is the leader's, in its memory).
    pub fn held_back(&self, model: &str) -> Option<std::time::Duration> {
        let until = (*self.memory().backing_off.get(model)?)?;
        let left = u64::try_from(until - self.now()).unwrap_or(0);
        Some(std::time::Duration::from_millis(left))
    }

    /// The admin token this server sends with a command it forwards.
    pub(crate) fn admin_token(&self) -> Option<&str> {
        self.config.admin_token.as_ref().map(|t| t.0.as_str())
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether some node could take `model` were it free (false: none
    /// could, whatever stops or comes back; `placement::fits_as_built`).
    /// True for a model the catalog does not hold.
    pub fn fits_as_built(&self, model: &str) -> bool {
        let views = self.views.read().unwrap_or_else(|p| p.into_inner());
        let c = &views.cluster;
        (c.catalog.models.get(model)).is_none_or(|m| self.fits_on(m, &c.nodes))
    }

    /// Whether some node of `nodes` could take `model` were it free.
    pub(crate) fn fits_on(
        &self,
        model: &llmgw_domain::catalog::Model,
        nodes: &llmgw_domain::nodes::Nodes,
    ) -> bool {
        let options = llmgw_domain::placement::PlaceOptions {
            port_range: self.config.port_range,
        };
        llmgw_domain::placement::fits_as_built(model, nodes, options)
    }

    /// How many asks for on-demand models the views have read.
    fn demands_read(&self) -> u64 {
        let views = self.views.read().unwrap_or_else(|p| p.into_inner());
        views.cluster.demands_read
    }

    /// Somebody asked for an on-demand model: keep it up for its idle time.
    /// A standby records the request in the log (at most every few seconds
    /// per model), so that the leader sees it too.
    pub fn demand(self: &Arc<Self>, model: &str) {
        let now = self.now();
        let previous = self.memory().rt.demand.insert(model.to_owned(), now);
        if self.is_leader() {
            self.wake.notify_one();
            return;
        }
        if previous.is_some_and(|at| now - at < DEMAND_EVERY_MS) {
            // Keep the older stamp, so the limit counts from the last record.
            if let Some(at) = previous {
                self.memory().rt.demand.insert(model.to_owned(), at);
            }
            return;
        }
        let (cp, model) = (self.clone(), model.to_owned());
        tokio::spawn(async move {
            let event =
                llmgw_domain::Event::Demand(llmgw_domain::demand::DemandEvent::ModelDemanded {
                    model: model.clone(),
                });
            let origin = Origin::new(Actor::Gateway(cp.config.instance.clone()));
            if let Err(e) = cp.decider.observe(&origin, vec![event]).await {
                tracing::warn!(%model, error = %e, "could not record demand for the leader");
            }
        });
    }

    async fn leader_token(&self) -> Result<LeaseToken, ControlError> {
        if let Some(t) = self.lease.borrow().clone() {
            return Ok(t);
        }
        let info = self.store.lease_info().await?;
        Err(ControlError::Standby {
            leader: info.holder.filter(|_| info.held),
        })
    }

    /// Decides and appends as the leader on behalf of `origin`; wakes the
    /// reconciler.
    /// Records an operator's command refused by a rule the log does not
    /// hold (the leader's configuration file), as the decider records
    /// the refusals it decides.
    pub(crate) async fn record_refused(
        &self,
        origin: &Origin,
        command: &Command,
        rejection: &llmgw_domain::Rejection,
    ) {
        self.decider
            .record_refused(origin, command, rejection)
            .await;
    }

    pub(crate) async fn execute(
        &self,
        origin: &Origin,
        commands: Vec<Command>,
    ) -> Result<Decided, ControlError> {
        let token = self.leader_token().await?;
        match self
            .decider
            .execute(&Writer::Leader(token.clone()), origin, commands)
            .await
        {
            Ok(d) => {
                if !d.events.is_empty() {
                    self.wake.notify_one();
                }
                Ok(d)
            }
            Err(DecideError::Store(e @ StoreError::Fenced { .. })) => {
                tracing::error!(error = %e, "deposed: the store refused an append; stepping down");
                self.lose_leadership(&token);
                Err(ControlError::Standby { leader: None })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until this server's views have read `position`, so that a
    /// read after a write sees the write.
    pub(crate) async fn views_reach(&self, position: u64) {
        reach(self.views_at.clone(), position).await;
    }

    /// Leads while it can, until `shutdown` turns true; then steps down so
    /// that a standby need not wait out the ttl.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let reconciler = tokio::spawn(reconciler::run(self.clone()));
        let liveness = tokio::spawn(reconciler::liveness(self.clone()));
        let anchors = tokio::spawn(anchor::run(self.clone()));
        tokio::select! {
            _ = self.clone().lead() => {}
            _ = shutdown.wait_for(|s| *s) => {}
        }
        reconciler.abort();
        liveness.abort();
        anchors.abort();
        self.step_down().await;
    }
}
