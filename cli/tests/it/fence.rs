//! Agents obey only the current leader (issue 14 §2), the agent's half:
//! the real agent binary against a control peer the test scripts message
//! by message over a real gRPC stream, so that it can send exactly what a
//! deposed leader would (a real server never sends a lower epoch than an
//! agent has told it of: the drill in `partition.rs` shows that side).

use std::time::Duration;

use llmgw_api::v1::{self, agent_message, control_message};
use llmgw_api::{AgentMessage, AgentService, AgentServiceServer, ControlMessage};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::Child;

/// One stream an agent opened, held by the test.
struct Conn {
    register: v1::Register,
    out: mpsc::Sender<Result<ControlMessage, Status>>,
    inbound: Streaming<AgentMessage>,
}

impl Conn {
    fn send(&self, epoch: u64, msg: control_message::Msg) {
        // A stream the agent already left takes nothing; the next read
        // says so.
        let _ = self.out.try_send(Ok(ControlMessage {
            msg: Some(msg),
            epoch,
        }));
    }

    /// The agent's next message other than a heartbeat; None when the
    /// agent ended the stream.
    async fn next(&mut self) -> Option<agent_message::Msg> {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), self.inbound.message())
                .await
                .expect("the agent said something within 10 s");
            match m {
                Ok(Some(AgentMessage {
                    msg: Some(agent_message::Msg::Heartbeat(_)),
                })) => continue,
                Ok(Some(AgentMessage { msg })) => return msg,
                Ok(None) | Err(_) => return None,
            }
        }
    }
}

#[derive(Clone)]
struct Peer(mpsc::UnboundedSender<Conn>);

#[tonic::async_trait]
impl AgentService for Peer {
    type ConnectStream = ReceiverStream<Result<ControlMessage, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let mut inbound = request.into_inner();
        let Some(AgentMessage {
            msg: Some(agent_message::Msg::Register(register)),
        }) = inbound.message().await?
        else {
            return Err(Status::invalid_argument("Register first"));
        };
        let (out, rx) = mpsc::channel(16);
        let _ = self.0.send(Conn {
            register,
            out,
            inbound,
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// A standby that refuses every stream, naming lease epoch 9.
#[derive(Clone)]
struct Standby;

#[tonic::async_trait]
impl AgentService for Standby {
    type ConnectStream = ReceiverStream<Result<ControlMessage, Status>>;

    async fn connect(
        &self,
        _: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        use llmgw_api::refusal;
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert(refusal::RETRY_AFTER_MS, 500.into());
        md.insert(refusal::EPOCH, 9.into());
        Err(Status::with_metadata(
            tonic::Code::Unavailable,
            "a standby",
            md,
        ))
    }
}

/// A scripted control peer on a port of its own: the streams agents open
/// arrive on the receiver.
async fn peer() -> (String, mpsc::UnboundedReceiver<Conn>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(Peer(tx)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (url, rx)
}

async fn next_conn(conns: &mut mpsc::UnboundedReceiver<Conn>) -> Conn {
    tokio::time::timeout(Duration::from_secs(20), conns.recv())
        .await
        .expect("the agent dialled within 20 s")
        .unwrap()
}

fn agent(server: &str, work: &std::path::Path) -> Child {
    Child::spawn_env(
        &[
            "agent",
            "run",
            "--server",
            server,
            "--node-id",
            "n1",
            "--mgmt-addr",
            "127.0.0.1",
            "--reconnect-max-s",
            "0.5",
            "--skip-gpus",
            "--work-dir",
            work.to_str().unwrap(),
        ],
        &[("LLMGW_LOG_FORMAT", "json".into())],
    )
}

fn ack(lowered: bool) -> control_message::Msg {
    control_message::Msg::Ack(v1::Ack {
        message_id: "register".into(),
        ok: true,
        error: String::new(),
        epoch_lowered: lowered,
    })
}

/// A request whose answer shows that the agent carried it out.
fn logs(id: &str) -> control_message::Msg {
    control_message::Msg::Logs(v1::LogsRequest {
        request_id: id.into(),
        source: String::new(),
        lines: 1,
    })
}

fn start(shard: &str) -> control_message::Msg {
    control_message::Msg::Start(v1::StartShard {
        replica_id: "r-1".into(),
        shard_id: shard.into(),
        nnodes: 1,
        http_port: 30_990,
        model: "chat".into(),
        profile: Some(v1::EngineProfile {
            name: "sim".into(),
            engine: "sim".into(),
            tp: 1,
            pp: 1,
            nodes: 1,
            ..v1::EngineProfile::default()
        }),
        ..v1::StartShard::default()
    })
}

fn epoch_file(work: &std::path::Path) -> String {
    std::fs::read_to_string(work.join("lease-epoch"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_refuses_a_deposed_leaders_commands_and_remembers_the_epoch_across_a_restart() {
    let (url, mut conns) = peer().await;
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("n1");
    let mut node = agent(&url, &work);

    // A leader at epoch 7: obeyed.
    let mut c = next_conn(&mut conns).await;
    assert_eq!(c.register.epoch_seen, 0, "a new agent has seen no epoch");
    c.send(7, ack(false));
    c.send(7, logs("q1"));
    match c.next().await {
        Some(agent_message::Msg::Logs(r)) => assert_eq!(r.request_id, "q1"),
        other => panic!("the agent answers epoch 7: {other:?}"),
    }
    assert_eq!(epoch_file(&work), "7", "written down before carrying out");

    // A start from epoch 6 (a deposed leader) is refused, said to the
    // sender, and the agent leaves that stream.
    c.send(6, start("s-stale"));
    match c.next().await {
        Some(agent_message::Msg::Refused(r)) => {
            assert_eq!(
                (r.command.as_str(), r.shard_id.as_str(), r.epoch, r.highest),
                ("start", "s-stale", 6, 7)
            );
        }
        other => panic!("the agent refuses epoch 6: {other:?}"),
    }
    // Nothing else about it: no status, no engine; then the stream ends.
    assert!(c.next().await.is_none(), "the agent leaves the stream");
    assert!(
        !work.join("shard-s-stale.json").exists(),
        "the refused start left no shard behind"
    );

    // It comes back registering with what it saw, and a restart does not
    // forget.
    let c = next_conn(&mut conns).await;
    assert_eq!(c.register.epoch_seen, 7);
    drop(c);
    drop(node);
    node = agent(&url, &work);
    // (A stream the first process opened as it was killed may still be
    // queued: a dead stream answers nothing, and the next one is taken.)
    loop {
        let mut c = next_conn(&mut conns).await;
        assert_eq!(c.register.epoch_seen, 7, "the restarted agent remembers");
        c.send(7, ack(false));
        c.send(5, logs("q-stale"));
        match c.next().await {
            None => continue,
            Some(agent_message::Msg::Refused(r)) => {
                assert_eq!((r.command.as_str(), r.epoch, r.highest), ("logs", 5, 7));
                break;
            }
            Some(other) => panic!("the restarted agent refuses epoch 5: {other:?}"),
        }
    }

    // A leader whose store went back (a restore) says so on the
    // registration's Ack: the agent follows its lower epoch.
    let mut c = next_conn(&mut conns).await;
    assert_eq!(c.register.epoch_seen, 7);
    c.send(3, ack(true));
    c.send(3, logs("q3"));
    match c.next().await {
        Some(agent_message::Msg::Logs(r)) => assert_eq!(r.request_id, "q3"),
        other => panic!("the agent follows the restored store's epoch: {other:?}"),
    }
    assert_eq!(epoch_file(&work), "3");

    // Its log says what it refused and why.
    let _ = node.process.kill();
    let _ = node.process.wait();
    let lines: Vec<serde_json::Value> = node
        .stderr
        .try_iter()
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    let refused: Vec<_> = lines
        .iter()
        .filter(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("refused a command from a deposed leader"))
        })
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["fields"]["command"], "logs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standbys_refusal_names_the_lease_epoch_and_the_agent_writes_it_down() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(Standby))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("n1");
    let _node = agent(&url, &work);
    super::until("the agent writes down the standby's epoch", || async {
        (epoch_file(&work) == "9").then_some(())
    })
    .await;
}
