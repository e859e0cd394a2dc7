//! A control plane over a real store, served on real sockets, and an
//! in-test agent that speaks the protocol message by message.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use llmgw_api::v1::{self, agent_message, control_message};
use llmgw_api::{AgentMessage, AgentServiceClient, AgentServiceServer, ControlMessage};
use llmgw_control::{AgentSvc, ControlConfig, ControlPlane};
use llmgw_domain::catalog::{Engine, Model, Profile, Scaling};
use llmgw_eventstore::{AnyStore, EventStore, OpenOptions, RecordedEvent, StoreAddress};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

pub fn sim_model(name: &str, min: u32) -> Model {
    let mut m = Model::named(name);
    m.scaling = Scaling {
        min,
        max: min.max(1),
        idle_timeout_s: None,
    };
    m.profiles = vec![Profile::cpu("sim", Engine::Sim)];
    m
}

/// Timings shrunk so that a test takes seconds, not minutes.
pub fn fast(instance: &str, models: Vec<Model>) -> ControlConfig {
    ControlConfig {
        instance: instance.into(),
        // Long enough that a renewal delayed by a loaded machine (the
        // tests of this binary run side by side on two cores) does not
        // lose the lease: a lost lease drops every agent's stream, and a
        // test then fails far from the cause ("the stream is open").
        lease_ttl: Duration::from_secs(3),
        lease_poll: Duration::from_millis(50),
        interval: Duration::from_millis(100),
        unreachable_after: Duration::from_millis(600),
        lost_after: Duration::from_millis(1500),
        base_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_secs(2),
        drain_grace: Duration::from_millis(500),
        models,
        ..ControlConfig::default()
    }
}

/// One server: views, control plane, agent listener and admin API.
pub struct Server {
    pub cp: Arc<ControlPlane>,
    views_at: watch::Receiver<u64>,
    pub agent_addr: SocketAddr,
    pub admin: String,
    pub store: AnyStore,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Server {
    pub async fn start(address: &str, config: ControlConfig) -> Server {
        Self::start_as(address, config, false).await
    }

    /// As [`Server::start`], its admin address advertised as `llmgw server`
    /// does: a standby then sends commands and the leader's reads to it.
    pub async fn start_advertised(address: &str, config: ControlConfig) -> Server {
        Self::start_as(address, config, true).await
    }

    async fn start_as(address: &str, config: ControlConfig, advertised: bool) -> Server {
        let store = AnyStore::open(
            &StoreAddress::parse(address).unwrap(),
            OpenOptions::migrating(),
        )
        .await
        .unwrap();
        // As `llmgw server` names its views' snapshot.
        let mut runner =
            llmgw_projections::Runner::start(store.clone(), llmgw_projections::VIEWS_SNAPSHOT)
                .await
                .unwrap();
        let views_at = runner.watch_position();
        let cp = ControlPlane::new(store.clone(), runner.views(), views_at.clone(), config);
        let admin_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = format!("http://{}", admin_l.local_addr().unwrap());
        if advertised {
            cp.advertise_admin(admin.clone());
        }
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = vec![tokio::spawn(async move {
            let _ = runner.follow().await;
        })];
        tasks.push(tokio::spawn(cp.clone().run(stop_rx.clone())));
        let agents = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let agent_addr = agents.local_addr().unwrap();
        let svc = AgentServiceServer::new(AgentSvc(cp.clone()));
        let mut grpc_stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(agents),
                    async move {
                        let _ = grpc_stop.wait_for(|s| *s).await;
                    },
                )
                .await;
        }));
        let mut app = llmgw_control::admin::router(cp.clone());
        if advertised {
            // As the composition root layers it.
            app = app.layer(axum::middleware::from_fn_with_state(
                cp.clone(),
                llmgw_control::forward_writes,
            ));
        }
        tasks.push(tokio::spawn(async move {
            let _ = axum::serve(admin_l, app).await;
        }));
        Server {
            cp,
            views_at,
            agent_addr,
            admin,
            store,
            stop,
            tasks,
        }
    }

    /// Returns once the reconciler has completed `n` more passes: what it
    /// would do about the present state, it has done.
    pub async fn passes(&self, n: u64) {
        let mut p = self.cp.passes();
        let target = *p.borrow() + n;
        tokio::time::timeout(Duration::from_secs(10), p.wait_for(|c| *c >= target))
            .await
            .expect("reconciler passes")
            .unwrap();
    }

    pub async fn wait_leader(&self) {
        let mut l = self.cp.leadership();
        tokio::time::timeout(Duration::from_secs(10), l.wait_for(|t| t.is_some()))
            .await
            .expect("became leader")
            .unwrap();
    }

    /// A clean stop: steps down.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        let leading = self.tasks.remove(1);
        let _ = tokio::time::timeout(Duration::from_secs(5), leading).await;
        for t in &self.tasks {
            t.abort();
        }
    }

    pub async fn events(&self) -> Vec<RecordedEvent> {
        self.store.read_all(0, 100_000).await.unwrap()
    }

    pub async fn get(&self, path: &str) -> serde_json::Value {
        reqwest::get(format!("{}{path}", self.admin))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn post(&self, path: &str) -> (u16, serde_json::Value) {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", self.admin))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

pub fn types(events: &[RecordedEvent]) -> Vec<&str> {
    events.iter().map(|e| e.event_type.as_str()).collect()
}

/// Checks `check` now and again after every change `server` can see (an
/// event its views read, or a reconciler pass), for up to ten seconds.
pub async fn eventually<T, F, Fut>(server: &Server, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let mut views = server.views_at.clone();
    let mut passes = server.cp.passes();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        let changed = async {
            tokio::select! {
                _ = views.changed() => {}
                _ = passes.changed() => {}
            }
        };
        assert!(
            tokio::time::timeout_at(deadline, changed).await.is_ok(),
            "timed out waiting for {what}"
        );
    }
}

pub fn register(node: &str) -> v1::Register {
    v1::Register {
        node_id: node.into(),
        hostname: node.into(),
        mgmt_addr: "127.0.0.1".into(),
        engine_versions: [("sim".to_string(), "1".to_string())].into(),
        engines_probed: true,
        memory_total_mb: 16_000,
        ..v1::Register::default()
    }
}

/// The protocol, driven by hand.
pub struct Agent {
    pub node: String,
    tx: mpsc::Sender<AgentMessage>,
    inbound: tonic::Streaming<ControlMessage>,
    beats: Option<tokio::task::JoinHandle<()>>,
    /// The `Provision`s the server sent (every stream gets one), set
    /// aside so that the other messages are read in turn.
    pub provisions: Vec<v1::Provision>,
}

impl Agent {
    pub async fn connect(addr: SocketAddr, reg: v1::Register) -> Result<Agent, tonic::Status> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut client = AgentServiceClient::new(channel);
        let (tx, rx) = mpsc::channel(64);
        let node = reg.node_id.clone();
        tx.send(AgentMessage {
            msg: Some(agent_message::Msg::Register(reg)),
        })
        .await
        .unwrap();
        let inbound = client.connect(ReceiverStream::new(rx)).await?.into_inner();
        Ok(Agent {
            node,
            tx,
            inbound,
            beats: None,
            provisions: Vec::new(),
        })
    }

    /// Heartbeats every 100 ms until dropped or [`Agent::silence`]d.
    pub fn keep_alive(&mut self) {
        let (tx, node) = (self.tx.clone(), self.node.clone());
        self.beats = Some(tokio::spawn(async move {
            // Heartbeats on a clock, as an agent sends them.
            let mut every = tokio::time::interval(Duration::from_millis(100));
            loop {
                every.tick().await;
                let hb = v1::Heartbeat {
                    node_id: node.clone(),
                    ..v1::Heartbeat::default()
                };
                if tx
                    .send(AgentMessage {
                        msg: Some(agent_message::Msg::Heartbeat(hb)),
                    })
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }));
    }

    /// Stops heartbeats, keeping the stream: the node looks dead.
    pub fn silence(&mut self) {
        if let Some(b) = self.beats.take() {
            b.abort();
        }
    }

    pub async fn next(&mut self) -> control_message::Msg {
        self.next_whole().await.msg.expect("a message body")
    }

    /// The next message whole, with the epoch it carries (a `Provision`
    /// is set aside in `provisions`).
    pub async fn next_whole(&mut self) -> ControlMessage {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), self.inbound.message())
                .await
                .expect("a message within 10 s")
                .expect("the stream is healthy")
                .expect("the stream is open");
            match m.msg {
                Some(control_message::Msg::Provision(p)) => self.provisions.push(p),
                _ => return m,
            }
        }
    }

    /// The first `Provision` of the stream (read on until it comes).
    pub async fn provision(&mut self) -> v1::Provision {
        while self.provisions.is_empty() {
            let m = self
                .inbound
                .message()
                .await
                .expect("the stream is healthy")
                .expect("the stream is open");
            if let Some(control_message::Msg::Provision(p)) = m.msg {
                self.provisions.push(p);
            }
        }
        self.provisions[0].clone()
    }

    /// Says `msg` on the stream.
    pub async fn say(&self, msg: agent_message::Msg) {
        self.tx.send(AgentMessage { msg: Some(msg) }).await.unwrap();
    }

    /// The next message, or None once the server closed the stream.
    pub async fn try_next(&mut self) -> Option<control_message::Msg> {
        match self.inbound.message().await {
            Ok(Some(ControlMessage {
                msg: Some(control_message::Msg::Provision(p)),
                ..
            })) => {
                self.provisions.push(p);
                Box::pin(self.try_next()).await
            }
            Ok(Some(m)) => m.msg,
            Ok(None) | Err(_) => None,
        }
    }

    /// The next StartShard, skipping acks.
    pub async fn next_start(&mut self) -> v1::StartShard {
        loop {
            match self.next().await {
                control_message::Msg::Start(s) => return s,
                control_message::Msg::Ack(_) => {}
                other => panic!("expected a start, got {other:?}"),
            }
        }
    }

    /// A shard still waiting on its weights, with the download's progress.
    pub async fn report_fetch(&self, start: &v1::StartShard, done: i64, total: i64) {
        self.tx
            .send(AgentMessage {
                msg: Some(agent_message::Msg::Shard(v1::ShardStatus {
                    node_id: self.node.clone(),
                    replica_id: start.replica_id.clone(),
                    shard_id: start.shard_id.clone(),
                    state: v1::shard_status::State::Pending as i32,
                    fetch: Some(v1::FetchProgress {
                        source: start.source.clone(),
                        bytes_done: done,
                        bytes_total: total,
                    }),
                    ..v1::ShardStatus::default()
                })),
            })
            .await
            .unwrap();
    }

    /// The shard failed, saying `error`.
    pub async fn report_failed(&self, start: &v1::StartShard, error: &str) {
        self.send_status(start, v1::shard_status::State::Failed, error)
            .await;
    }

    pub async fn report(&self, start: &v1::StartShard, state: v1::shard_status::State) {
        self.send_status(start, state, "").await;
    }

    async fn send_status(
        &self,
        start: &v1::StartShard,
        state: v1::shard_status::State,
        error: &str,
    ) {
        self.tx
            .send(AgentMessage {
                msg: Some(agent_message::Msg::Shard(v1::ShardStatus {
                    node_id: self.node.clone(),
                    replica_id: start.replica_id.clone(),
                    shard_id: start.shard_id.clone(),
                    state: state as i32,
                    error: error.into(),
                    ..v1::ShardStatus::default()
                })),
            })
            .await
            .unwrap();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.silence();
    }
}

/// What an agent that runs `start` reports at registration.
pub fn running(start: &v1::StartShard) -> v1::RunningShard {
    v1::RunningShard {
        replica_id: start.replica_id.clone(),
        shard_id: start.shard_id.clone(),
        rank: start.rank,
        nnodes: start.nnodes,
        gpu_indices: start.gpu_indices.clone(),
        hcas: start.hcas.clone(),
        http_port: start.http_port,
        state: v1::shard_status::State::Ready as i32,
        model: start.model.clone(),
        profile: start.profile.as_ref().unwrap().name.clone(),
        pool: start.pool.clone(),
        fabric: start.fabric.clone(),
        leader_addr: start.leader_addr.clone(),
        leader_port: start.leader_port,
        profile_fp: start.profile_fp.clone(),
        uptime_s: 1,
    }
}
