//! The agent service: one stream per node, opened by the agent.
//!
//! Registration and inventory changes become commands (and events only when
//! something changed); heartbeats only move a clock in memory. What a
//! registration or a heartbeat means is the domain's plan
//! (`llmgw_domain::registration`, `llmgw_domain::heartbeat`); this module
//! converts from the wire, carries the plan out and keeps what agents
//! report in `crate::observed`. Commands to a node ride its stream, so only
//! the leader accepts streams.
//!
//! A standby refuses a stream with whom to dial and when to ask again
//! (`llmgw_api::refusal`): the leader's instance and agent address, and the
//! time its lease runs out. A standby whose lease is about to be free holds
//! the stream open for a moment instead, and takes it the instant it leads,
//! so that agents are back as soon as a new leader is in office.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use llmgw_api::v1::{self, agent_message, control_message};
use llmgw_api::{AgentMessage, ControlMessage};
use llmgw_domain::Command;
use llmgw_domain::ids::{NodeId, ReplicaId, ShardId};
use llmgw_domain::nodes::NodeCommand;
use llmgw_domain::registration::{self, StopReason};
use llmgw_domain::replicas::{ReplicaCommand, ShardState};
use tokio::time::Instant;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use llmgw_eventstore::LeaseToken;

use crate::{ControlError, ControlPlane, convert};

/// The common name of the first (leaf) certificate.
fn common_name(certs: &[tonic::transport::CertificateDer<'static>]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(certs.first()?.as_ref()).ok()?;
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned)
}

#[derive(Debug)]
struct Session {
    generation: u64,
    /// The lease epoch the stream was let in under: on every message, so
    /// that the agent can tell a deposed sender. Sessions never outlive
    /// it (losing the lease drops them all).
    epoch: u64,
    /// Where the agent said its node is reached: a second agent claiming
    /// the node from elsewhere is another machine, not a restart.
    mgmt_addr: String,
    /// Whether it came with a client certificate: only then does removing
    /// the node keep it out (the deny list is of certificates).
    certified: bool,
    tx: crate::outbox::Sender<Outgoing>,
}

/// A message queued to an agent, boxed: a queue keeps the room it grew
/// to while messages wait, and an unboxed slot (the largest message, a
/// shard's start, beside a `Status`) is hundreds of bytes.
type Outgoing = Box<Result<ControlMessage, Status>>;

/// The agents' streams, in memory only (what they report is in
/// `crate::observed`).
#[derive(Debug)]
pub(crate) struct Registry {
    sessions: Mutex<HashMap<NodeId, Session>>,
    /// Registrations in progress at once (see `connect`).
    registering: tokio::sync::Semaphore,
    /// LogsRequests awaiting their reply, by request id.
    logs: Mutex<HashMap<String, tokio::sync::oneshot::Sender<v1::LogsReply>>>,
    generation: AtomicU64,
}

/// How many streams register at once; more wait for a turn.
const REGISTERING: usize = 32;

impl Default for Registry {
    fn default() -> Self {
        Registry {
            sessions: Mutex::default(),
            registering: tokio::sync::Semaphore::new(REGISTERING),
            logs: Mutex::default(),
            generation: AtomicU64::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    pub(crate) fn drop_all(&self) {
        lock(&self.sessions).clear();
    }

    /// Ends a node's stream (it was removed); when it had one, whether
    /// that stream came with a client certificate.
    pub(crate) fn disconnect(&self, node: &NodeId) -> Option<bool> {
        lock(&self.sessions).remove(node).map(|s| s.certified)
    }

    pub(crate) fn connected(&self, node: &NodeId) -> bool {
        lock(&self.sessions).contains_key(node)
    }

    /// Ends the stream `generation` of `node` with `status`, which the
    /// agent reads as the reason; a newer stream of the node is left alone.
    fn refuse(&self, node: &NodeId, generation: u64, status: Status) {
        let mut sessions = lock(&self.sessions);
        if let Some(s) = sessions.get(node)
            && s.generation == generation
        {
            let _ = s.tx.try_send(Box::new(Err(status)));
            sessions.remove(node);
        }
    }

    /// Queues a message to a node; false when it has no stream (it gets the
    /// message again when it re-registers, where that matters).
    pub(crate) fn send(&self, node: &NodeId, msg: control_message::Msg) -> bool {
        let sessions = lock(&self.sessions);
        let Some(s) = sessions.get(node) else {
            return false;
        };
        s.tx.try_send(Box::new(Ok(ControlMessage {
            msg: Some(msg),
            epoch: s.epoch,
        })))
        .is_ok()
    }
}

/// How long before the lease is free a standby starts holding agents'
/// streams open rather than refusing them (at most half the ttl: a leader
/// that renews keeps more than that, so a live leader's agents are never
/// held), and how long after it is free it goes on holding them while it
/// takes office.
const HOLD: Duration = Duration::from_secs(2);
/// How old a look at the lease may be when an agent knocks (a refusal is
/// read afresh).
const OFFICE_MAX_AGE: Duration = Duration::from_millis(100);
/// How often a held stream looks at the lease again.
const HOLD_RECHECK: Duration = Duration::from_millis(100);

impl ControlPlane {
    /// Lets an agent's stream in when this server leads. A standby whose
    /// lease is about to be free (or is free) holds it open until it takes
    /// office, for a few seconds at most; otherwise, and when that wait
    /// runs out, it refuses, saying whom to dial and when to ask again.
    pub(crate) async fn admit(&self) -> Result<LeaseToken, Status> {
        let mut leadership = self.leadership();
        let mut deadline: Option<Instant> = None;
        let arrived = Instant::now();
        let mut since = arrived.checked_sub(OFFICE_MAX_AGE).unwrap_or(arrived);
        loop {
            if let Some(token) = self.lease.borrow().clone() {
                return Ok(token);
            }
            let office = self.office(since).await.map_err(|e| to_status(e.into()))?;
            let now = Instant::now();
            let until_free = office.until_free();
            let taking_office = office.holder.as_deref() == Some(self.config.instance.as_str());
            let about_to_free = HOLD.min(self.config.lease_ttl / 2);
            let deadline = *deadline.get_or_insert(now + until_free.min(about_to_free) + HOLD);
            if now >= deadline || (!taking_office && until_free > about_to_free) {
                // Never refused on a look older than the knock: the
                // leader may have stepped down just before it.
                if since < arrived {
                    since = arrived;
                    continue;
                }
                return Err(self.refusal(&office));
            }
            since = Instant::now()
                .checked_sub(OFFICE_MAX_AGE)
                .unwrap_or(arrived);
            if until_free.is_zero() && !taking_office {
                self.nudge.notify_one();
            }
            let wake = (now + until_free.max(HOLD_RECHECK)).min(deadline);
            tokio::select! {
                _ = leadership.changed() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// A standby's refusal: UNAVAILABLE, naming the leader and its agent
    /// address where known, and when this server may lead.
    fn refusal(&self, office: &crate::forward::Office) -> Status {
        use llmgw_api::refusal;
        let until_free = office.until_free();
        let leader = office
            .holder
            .as_deref()
            .filter(|h| *h != self.config.instance);
        let retry_after = match leader {
            Some(_) => until_free,
            // Free, or this server is taking office: soon.
            None => self.config.lease_poll,
        };
        let secs = |d: Duration| format!("{:.1} s", d.as_secs_f64());
        let message = match (leader, &office.agent) {
            (Some(l), Some(at)) => format!(
                "this server ({}) is a standby; the leader is {l} at {at} (its lease runs out in {}): dial the leader",
                self.config.instance,
                secs(until_free)
            ),
            (Some(l), None) => format!(
                "this server ({}) is a standby; the leader is {l} (its lease runs out in {}): dial the leader",
                self.config.instance,
                secs(until_free)
            ),
            (None, _) => format!(
                "this server ({}) is a standby and no leader is in office yet: try again in {}",
                self.config.instance,
                secs(retry_after)
            ),
        };
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert(
            refusal::RETRY_AFTER_MS,
            tonic::metadata::MetadataValue::from(retry_after.as_millis() as u64),
        );
        if let Some(l) = leader.and_then(|l| l.parse().ok()) {
            metadata.insert(refusal::LEADER, l);
        }
        if leader.is_some()
            && let Some(at) = office.agent.as_deref().and_then(|a| a.parse().ok())
        {
            metadata.insert(refusal::LEADER_AGENT, at);
        }
        if office.epoch > 0 {
            metadata.insert(
                refusal::EPOCH,
                tonic::metadata::MetadataValue::from(office.epoch),
            );
        }
        Status::with_metadata(tonic::Code::Unavailable, message, metadata)
    }
}

/// A message that could not be decoded: tonic says INTERNAL, which reads
/// as this server's fault; it is the sender's.
fn unreadable(s: Status) -> Status {
    if s.code() == tonic::Code::Internal {
        return Status::invalid_argument(format!(
            "a message on this stream is not an AgentMessage: {}",
            s.message()
        ));
    }
    s
}

/// The tonic service over a control plane.
#[derive(Debug, Clone)]
pub struct AgentSvc(pub Arc<ControlPlane>);

type Outbound = Pin<Box<dyn tokio_stream::Stream<Item = Result<ControlMessage, Status>> + Send>>;

fn to_status(e: ControlError) -> Status {
    match e {
        ControlError::Standby { .. } | ControlError::Lease(_) => Status::unavailable(e.to_string()),
        ControlError::Rejected(r) => Status::invalid_argument(r.reason),
        // What the agent sent cannot be stored as it is (a NUL in a name,
        // say): its message is at fault, not the store, and retrying the
        // same message would fail the same way.
        ControlError::Store(e @ llmgw_eventstore::StoreError::Invalid(_)) => {
            Status::invalid_argument(format!("the event store refuses it: {e}"))
        }
        ControlError::Store(e) => Status::unavailable(format!("the event store: {e}")),
        ControlError::Conflict { .. } => Status::aborted(e.to_string()),
    }
}

#[tonic::async_trait]
impl llmgw_api::AgentService for AgentSvc {
    type ConnectStream = Outbound;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Outbound>, Status> {
        let cp = self.0.clone();
        let token = cp.admit().await?;
        // With mutual TLS, the certificate names the node. A listener that
        // lets nodes join takes connections without one (a joining node has
        // none yet), so a stream asks for it here.
        let tls = request
            .extensions()
            .get::<tonic::transport::server::TlsConnectInfo<tonic::transport::server::TcpConnectInfo>>()
            .is_some();
        let peer = request
            .remote_addr()
            .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
        let certified = match request.peer_certs() {
            Some(certs) if !certs.is_empty() => {
                let cn = common_name(&certs).ok_or_else(|| {
                    Status::unauthenticated("the client certificate names no node (no common name)")
                })?;
                Some((
                    NodeId::from(cn),
                    crate::authority::fingerprint(certs[0].as_ref()),
                ))
            }
            _ if tls => {
                tracing::warn!(%peer, "refused a stream without a client certificate");
                return Err(Status::unauthenticated(
                    "this server requires a client certificate: join the node with a token (`llmgw ctl node token`, then `LLMGW_AGENT_JOIN=TOKEN llmgw agent run …` on the node) or give --tls-ca, --tls-cert and --tls-key",
                ));
            }
            _ => None,
        };
        let mut inbound = request.into_inner();
        // A stream that never says who it is would hold a task and a
        // connection for ever.
        let within = cp.config.register_within;
        let first = tokio::time::timeout(within, inbound.message())
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "no Register within {} s of opening the stream",
                    within.as_secs_f64()
                ))
            })?
            .map_err(unreadable)?
            .ok_or_else(|| Status::invalid_argument("the stream ended before Register"))?;
        let Some(agent_message::Msg::Register(reg)) = first.msg else {
            return Err(Status::invalid_argument(
                "the first message on a stream must be Register",
            ));
        };
        let node = NodeId::from(reg.node_id.as_str());
        if let Some((cn, fingerprint)) = &certified {
            let denied = cp
                .views
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .cluster
                .joining
                .refusal(cn, fingerprint);
            if let Some(why) = denied {
                tracing::warn!(%peer, node = %cn, reason = %why, "refused a removed node's certificate");
                return Err(Status::permission_denied(why));
            }
        }
        crate::wire::register(&reg).map_err(|why| {
            tracing::warn!(node = %node, reason = %why, "refused a registration");
            Status::invalid_argument(format!("the registration of node {node:?}: {why}"))
        })?;
        heartbeat_fits(&node, reg.heartbeat_ms, cp.config.unreachable_after)?;
        if let Some((cn, _)) = &certified
            && node != *cn
        {
            tracing::warn!(claimed = %node, certificate = %cn, "refused a stream whose node id is not its certificate's");
            return Err(Status::permission_denied(format!(
                "this certificate is for node {cn}, not {node}: issue one with `llmgw ctl cert issue-client {node}`"
            )));
        }
        // Two machines under one node id (a cloned image's hostname, say)
        // would take the node from each other on every reconnect, each
        // failing the other's replicas. A restart keeps its address, and
        // a node that moved is let in once the old stream has gone quiet.
        let holder = lock(&cp.agents.sessions)
            .get(&node)
            .filter(|s| s.mgmt_addr != reg.mgmt_addr)
            .map(|s| s.mgmt_addr.clone());
        if let Some(other) = holder
            && cp
                .observed
                .last_seen(&node)
                .is_some_and(|t| t.elapsed() < cp.config.unreachable_after)
        {
            tracing::warn!(node = %node, connected = %other, claimed_by = %reg.mgmt_addr, "refused a second agent for a connected node");
            return Err(Status::already_exists(format!(
                "node {node} is connected from {other}; this agent at {} claims the same id: give each machine its own --node-id",
                reg.mgmt_addr
            )));
        }
        // The session's span: what the server does for this node, from its
        // registration to the stream's end, carries the node's name.
        let span = tracing::info_span!("agent_session", node = %node);
        // A fleet arriving at once opens thousands of streams together, and
        // registrations go through the decider one after another anyway:
        // the rest wait here, small, rather than each holding the whole
        // state of a registration (boxed below, built only with a permit).
        let registering = cp
            .agents
            .registering
            .acquire()
            .await
            .map_err(|_| Status::unavailable("the server is stopping"))?;
        // An agent that has seen a higher epoch may know that this server
        // is deposed: the store decides.
        let lowered = if reg.epoch_seen > token.epoch {
            Box::pin(cp.confirm_lease(&token, &node, reg.epoch_seen))
                .instrument(span.clone())
                .await
                .map_err(to_status)?;
            true
        } else {
            false
        };
        Box::pin(cp.register(&node, &reg))
            .instrument(span.clone())
            .await
            .map_err(to_status)?;
        let (tx, rx) = crate::outbox::outbox::<Outgoing>(256);
        let generation = cp.agents.generation.fetch_add(1, Ordering::Relaxed);
        let _ = tx.try_send(Box::new(Ok(ControlMessage {
            msg: Some(control_message::Msg::Ack(v1::Ack {
                message_id: "register".into(),
                ok: true,
                error: String::new(),
                epoch_lowered: lowered,
            })),
            epoch: token.epoch,
        })));
        {
            let mut sessions = lock(&cp.agents.sessions);
            // Leadership lost while this stream was let in: the drop of
            // every stream may have come before this one was added.
            if cp.lease.borrow().as_ref() != Some(&token) {
                return Err(to_status(ControlError::Standby { leader: None }));
            }
            sessions.insert(
                node.clone(),
                Session {
                    generation,
                    epoch: token.epoch,
                    mgmt_addr: reg.mgmt_addr.clone(),
                    certified: certified.is_some(),
                    tx,
                },
            );
        }
        span.in_scope(|| {
            tracing::info!(node = %node, shards = reg.running_shards.len(), "agent connected");
        });
        // The engines this node should have: every stream is told (the
        // configuration may have changed while it was away).
        cp.agents.send(
            &node,
            control_message::Msg::Provision(v1::Provision {
                engines: cp.config.engines.clone(),
            }),
        );
        Box::pin(cp.after_register(&node, &reg))
            .instrument(span.clone())
            .await;
        drop(registering);
        tokio::spawn(read_stream(cp, node, generation, inbound).instrument(span));
        Ok(Response::new(Box::pin(tokio_stream::StreamExt::map(
            rx,
            |m| *m,
        ))))
    }
}

async fn read_stream(
    cp: Arc<ControlPlane>,
    node: NodeId,
    generation: u64,
    mut inbound: Streaming<AgentMessage>,
) {
    loop {
        let msg = match inbound.message().await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) if e.code() == tonic::Code::Internal => {
                // Bytes that are no AgentMessage: the agent is told why
                // its stream ends.
                let status = unreadable(e);
                tracing::warn!(node = %node, reason = %status.message(), "ended an agent's stream");
                cp.agents.refuse(&node, generation, status);
                break;
            }
            Err(e) => {
                // The status's message, not its Display, which dumps its
                // source's Debug form into the journal.
                tracing::info!(node = %node, code = %e.code(), error = %e.message(), "agent stream broke");
                break;
            }
        };
        // Boxed: this task lives as long as the agent, and waits between
        // messages far longer than it spends on one; inline, the message
        // and the work on it (a heartbeat's future) made each of
        // thousands of idle tasks about 1.8 KiB instead of a few hundred
        // bytes. One short-lived allocation a message is the price.
        if Box::pin(handle(&cp, &node, generation, msg))
            .await
            .is_break()
        {
            break;
        }
    }
    let mut sessions = lock(&cp.agents.sessions);
    if sessions
        .get(&node)
        .is_some_and(|s| s.generation == generation)
    {
        sessions.remove(&node);
        tracing::info!(node = %node, "agent disconnected");
    }
}

/// One message of an agent's stream; `Break` ends the stream.
async fn handle(
    cp: &ControlPlane,
    node: &NodeId,
    generation: u64,
    msg: AgentMessage,
) -> ControlFlow<()> {
    let result = match msg.msg {
        Some(agent_message::Msg::Heartbeat(hb)) => {
            if let Err(why) = crate::wire::heartbeat(&hb) {
                tracing::warn!(node = %node, reason = %why, "ended an agent's stream");
                cp.agents.refuse(
                    node,
                    generation,
                    Status::invalid_argument(format!("a heartbeat of node {node:?}: {why}")),
                );
                return ControlFlow::Break(());
            }
            cp.heartbeat(node, hb).await
        }
        // Boxed (and the heartbeat's rare append): a future that appends
        // (through the decider and the store) inline would make the
        // handling of every heartbeat as large as that path.
        Some(agent_message::Msg::Shard(st)) => Box::pin(cp.shard_status(node, st)).await,
        Some(agent_message::Msg::Register(_)) => {
            tracing::warn!(node = %node, "a second Register on one stream is ignored");
            Ok(())
        }
        Some(agent_message::Msg::Refused(r)) => {
            Box::pin(cp.refused(node, r)).await;
            Ok(())
        }
        Some(agent_message::Msg::Logs(reply)) => {
            if let Some(waiter) = lock(&cp.agents.logs).remove(&reply.request_id) {
                let _ = waiter.send(reply);
            }
            Ok(())
        }
        None => Ok(()),
    };
    if let Err(e) = result {
        tracing::warn!(node = %node, error = %e, "could not apply an agent's report");
    }
    ControlFlow::Continue(())
}

impl ControlPlane {
    /// The tail of one of a node's logs, asked over its stream.
    pub(crate) async fn node_logs(
        &self,
        node: &NodeId,
        source: &str,
        lines: i32,
    ) -> Result<v1::LogsReply, ControlError> {
        self.leader_token().await?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (tx, rx) = tokio::sync::oneshot::channel();
        lock(&self.agents.logs).insert(id.clone(), tx);
        let asked = self.agents.send(
            node,
            control_message::Msg::Logs(v1::LogsRequest {
                request_id: id.clone(),
                source: source.to_owned(),
                lines,
            }),
        );
        let reply = if asked {
            tokio::time::timeout(std::time::Duration::from_secs(5), rx)
                .await
                .ok()
                .and_then(Result::ok)
        } else {
            None
        };
        lock(&self.agents.logs).remove(&id);
        reply.ok_or_else(|| {
            ControlError::Rejected(llmgw_domain::Rejection::not_found(format!(
                "node {node} is not connected to this server (or did not answer in 5 s)"
            )))
        })
    }

    async fn register(&self, node: &NodeId, reg: &v1::Register) -> Result<(), ControlError> {
        self.execute(
            &self.own(),
            vec![Command::Node(NodeCommand::Register {
                node_id: node.clone(),
                inventory: convert::inventory(reg),
            })],
        )
        .await?;
        // Its clock restarts, but it is heard (and placed on) only once
        // what it runs is known: `after_register`.
        self.observed.start_clock(node);
        // A new stream: the agent reports its engines afresh (its first
        // heartbeat), so what an earlier stream said is not kept.
        self.observed.set_provision(node, Vec::new());
        self.telemetry.registered(reg);
        Ok(())
    }

    /// Adopts, reports or stops the shards the agent says it runs, and
    /// re-sends starts the agent never got (`llmgw_domain::registration`);
    /// then the node is heard, and new work may go there.
    async fn after_register(&self, node: &NodeId, reg: &v1::Register) {
        self.carry_out_registration(node, reg).await;
        // What the node runs is known now (adopted, reported, or gathered
        // and held): until here a pass placed nothing on it, or an engine
        // the log did not know (a restore from an older backup) could
        // clash with that placement and be stopped. The registration's
        // own append may have woken a pass before this: another is asked.
        self.observed.seen(node);
        self.wake.notify_one();
    }

    async fn carry_out_registration(&self, node: &NodeId, reg: &v1::Register) {
        let running: Vec<_> = reg
            .running_shards
            .iter()
            .map(convert::running_shard)
            .collect();
        let stopped_on_exit: Vec<ShardId> = (reg.stopped_on_exit.iter())
            .map(|s| s.as_str().into())
            .collect();
        // Planned under a read of the state (no copy of it per
        // registration: a fleet registering at once would make that
        // quadratic) and under the lock of the groups awaiting adoption
        // (registrations of one replica's nodes may run at once); carried
        // out after both are released.
        let planned = self
            .decider
            .read(|state| {
                self.observed.adopting(|gathered| {
                    let mut plan =
                        registration::plan(state, node, &running, &stopped_on_exit, gathered);
                    let left = std::mem::take(&mut plan.adopting);
                    (plan, left)
                })
            })
            .await;
        let plan = match planned {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the state after a registration");
                return;
            }
        };
        let mut held = Vec::new();
        for stop in plan.stops {
            self.stop_shard(stop, &mut held);
        }
        for start in &plan.starts {
            self.send_start(start);
        }
        let mut commands = plan.commands;
        for adoption in plan.adoptions {
            let p = &adoption.placement;
            match self
                .execute(
                    &self.own(),
                    vec![Command::Replica(ReplicaCommand::Adopt(p.clone()))],
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(replica = %p.replica_id, model = %p.model, "adopted a running replica");
                    commands.extend(adoption.reports());
                }
                Err(e) => {
                    tracing::warn!(replica = %p.replica_id, error = %e, "cannot adopt; stopping its shards");
                    for stop in adoption.stops() {
                        self.stop_shard(stop, &mut held);
                    }
                }
            }
        }
        self.observed.set_held(node, held);
        for c in commands {
            if let Err(e) = self.execute(&self.own(), vec![c]).await {
                tracing::warn!(%node, error = %e, "could not record a reported shard");
            }
        }
    }

    /// Tells a node to stop a shard; what its process holds is kept in
    /// `held` until the node says the shard stopped, or registers again.
    fn stop_shard(&self, stop: registration::Stop, held: &mut Vec<llmgw_domain::placement::Held>) {
        if stop.why == StopReason::LeftCatalog {
            tracing::info!(node = %stop.node_id, shard = %stop.shard_id, replica = %stop.held.replica_id, "stopping a shard whose model or profile left the catalog");
        }
        self.agents.send(
            &stop.node_id,
            control_message::Msg::Stop(v1::StopShard {
                shard_id: stop.shard_id.into_string(),
            }),
        );
        held.push(stop.held);
    }

    /// Sends a start to its shard's node; false when the node has no
    /// stream (it gets the start again when it registers).
    pub(crate) fn send_start(&self, start: &registration::Start) -> bool {
        let mut msg = convert::start_shard(start, &self.config.mgmt_interface);
        msg.mirror_url = self.config.mirror_url.clone().unwrap_or_default();
        self.agents
            .send(&start.shard.node_id, control_message::Msg::Start(msg))
    }

    /// The hot path of a fleet: one per node every few seconds. It reads
    /// the views under a read lock and touches the log only when the node
    /// must be revived or its inventory changed; the decider re-checks
    /// against the log, so a view a moment behind costs at most a no-op.
    async fn heartbeat(&self, node: &NodeId, hb: v1::Heartbeat) -> Result<(), ControlError> {
        self.observed.seen(node);
        self.telemetry.heartbeat(node, &hb);
        if hb.provision_changed {
            self.observed
                .set_provision(node, convert::provision(&hb.provision));
        }
        // What it changes is `llmgw_domain::heartbeat`'s decision.
        let commands = {
            let views = self.views.read().unwrap_or_else(|p| p.into_inner());
            let Some(current) = views.cluster.nodes.nodes.get(node) else {
                return Ok(());
            };
            llmgw_domain::heartbeat::plan(current, &convert::heartbeat(hb))
        };
        if !commands.is_empty() {
            // Boxed: see `handle`.
            Box::pin(self.execute(&self.own(), commands)).await?;
        }
        Ok(())
    }

    async fn shard_status(&self, node: &NodeId, st: v1::ShardStatus) -> Result<(), ControlError> {
        let Some(state) = convert::state_from_wire(st.state) else {
            return Ok(());
        };
        if *node != st.node_id && !st.node_id.is_empty() {
            tracing::warn!(%node, claimed = %st.node_id, "a shard status claims another node; ignored");
            return Ok(());
        }
        let progress = st
            .fetch
            .as_ref()
            .filter(|_| state == ShardState::Pending)
            .map(|f| (f.bytes_done.max(0) as u64, f.bytes_total.max(0) as u64));
        let shard_id = ShardId::from(st.shard_id.as_str());
        self.observed.fetching(&shard_id, progress);
        if let Ok(port) = u16::try_from(st.port_taken)
            && port > 0
        {
            self.observed.port_taken(node, port);
        }
        let replica_id = ReplicaId::from(st.replica_id.as_str());
        if matches!(state, ShardState::Stopped | ShardState::Failed) {
            self.observed.released(node, &replica_id);
        }
        let tail = (!st.last_output.is_empty()).then(|| st.last_output.join("\n"));
        let error = crate::wire::clip(&st.error, crate::wire::MAX_ERROR);
        let command = Command::Replica(ReplicaCommand::ReportShard {
            replica_id,
            shard_id,
            state,
            error: (!error.is_empty()).then_some(error),
            exit_code: (state == ShardState::Failed).then_some(st.exit_code),
            log_tail: tail,
        });
        match self.execute(&self.own(), vec![command]).await {
            Ok(_) => Ok(()),
            // A report about a replica the log does not know (or no longer
            // tracks) is stale, not an error worth a warning.
            Err(ControlError::Rejected(r)) if r.code == llmgw_domain::RejectionCode::NotFound => {
                tracing::debug!(%node, replica = %st.replica_id, "status for an unknown replica");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// A node that heartbeats no more often than this server waits before
/// taking it as unreachable would be unreachable between every two beats
/// (no placements, and lost, its work rebuilt elsewhere, past
/// `lost_after`): refused with both figures. One whose single late beat
/// would do it is let in with a warning.
fn heartbeat_fits(node: &NodeId, heartbeat_ms: u64, unreachable: Duration) -> Result<(), Status> {
    let beat = Duration::from_millis(heartbeat_ms);
    if beat.is_zero() || beat * 2 <= unreachable {
        return Ok(());
    }
    let (every, after) = (beat.as_secs_f64(), unreachable.as_secs_f64());
    if beat >= unreachable {
        tracing::warn!(node = %node, heartbeat_s = every, unreachable_after_s = after, "refused a node that heartbeats less often than control.unreachable_after");
        return Err(Status::failed_precondition(format!(
            "node {node} heartbeats every {every} s, but this control plane takes a node as unreachable after {after} s without one (control.unreachable_after): give the agent --heartbeat-s of at most {:.1} s, or raise control.unreachable_after",
            after / 3.0
        )));
    }
    tracing::warn!(node = %node, heartbeat_s = every, unreachable_after_s = after, "one late heartbeat makes this node unreachable: keep --heartbeat-s under half of control.unreachable_after");
    Ok(())
}
