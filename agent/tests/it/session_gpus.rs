//! The agent's real session (`Agent::run`) against a server that speaks
//! the agent protocol on a real socket and records what the agent sends,
//! on a node whose nvidia-smi (a stub) cannot reach the driver when the
//! agent starts, as at boot, and answers later.

use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use llmgw_agent::engines::{LlamaCpp, Registry, Sglang, Sim, Vllm};
use llmgw_agent::session::{Agent, SessionConfig};
use llmgw_api::v1::{ControlMessage, Heartbeat, Register, agent_message};
use llmgw_api::{AgentMessage, AgentService, AgentServiceServer};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use super::{SMI_SAMPLE, executable};

/// What the agent sent, in order, over every stream.
#[derive(Debug)]
enum Sent {
    Register(Box<Register>),
    Heartbeat(Heartbeat),
}

struct Svc {
    sent: mpsc::UnboundedSender<Sent>,
}

type Outbound = Pin<Box<dyn tokio_stream::Stream<Item = Result<ControlMessage, Status>> + Send>>;

#[tonic::async_trait]
impl AgentService for Svc {
    type ConnectStream = Outbound;

    /// Takes every stream, and reads it until the agent leaves it.
    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Outbound>, Status> {
        let mut inbound = request.into_inner();
        let sent = self.sent.clone();
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            // Held while the stream is read: the agent's side stays open.
            let _tx = tx;
            while let Ok(Some(m)) = inbound.message().await {
                let _ = match m.msg {
                    Some(agent_message::Msg::Register(r)) => sent.send(Sent::Register(Box::new(r))),
                    Some(agent_message::Msg::Heartbeat(h)) => sent.send(Sent::Heartbeat(h)),
                    _ => Ok(()),
                };
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The next thing the agent sent that `pick` takes, within a minute.
async fn next<T>(
    sent: &mut mpsc::UnboundedReceiver<Sent>,
    what: &str,
    mut pick: impl FnMut(Sent) -> Option<T>,
) -> T {
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(s) = sent.recv().await {
            if let Some(t) = pick(s) {
                return Some(t);
            }
        }
        None
    });
    match found.await {
        Ok(Some(t)) => t,
        _ => panic!("no {what} within a minute"),
    }
}

/// At boot the driver was not up: the agent registered a CPU node, and
/// stayed one once nvidia-smi answered, since its looks at the GPUs only
/// sent the health of cards it had registered. It registers again, with
/// the cards, as soon as a look reads them; a card's problem later goes
/// with a heartbeat, as before, and no registration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_that_answer_after_the_agent_started_are_registered() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.csv");
    let smi = executable(
        dir.path(),
        "nvidia-smi",
        &format!(
            "if [ -f {rows} ]; then cat {rows}; exit 0; fi\n\
             echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\n\
             exit 9\n",
            rows = rows.display()
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, mut sent) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(Svc { sent: tx }))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let mut config = SessionConfig::new(vec![url], "boot-1".into());
    config.discovery.nvidia_smi = Some(smi);
    config.discovery.prefer_nvml = false;
    config.discovery.root = "/nonexistent".into();
    config.heartbeat = Duration::from_millis(100);
    config.recheck = Duration::from_millis(100);
    let absent = Path::new("/nonexistent/engine");
    let registry = Registry::new(
        Vllm {
            bin: Some(absent.into()),
            ..Vllm::default()
        },
        Sglang {
            python: Some(absent.into()),
        },
        LlamaCpp::new(Some(absent.into()), 0),
        Sim::default(),
    );
    let (stop, stopped) = watch::channel(false);
    let agent = tokio::spawn(Agent::new(config, registry).run(stopped));

    let first = next(&mut sent, "registration", |s| match s {
        Sent::Register(r) => Some(r),
        Sent::Heartbeat(_) => None,
    })
    .await;
    assert!(first.gpus.is_empty(), "{:?}", first.gpus);
    // Heartbeats flow while the driver is down: the stream is up.
    next(&mut sent, "heartbeat", |s| {
        matches!(s, Sent::Heartbeat(_)).then_some(())
    })
    .await;

    // The driver answers. Written aside and renamed: nvidia-smi never
    // reads half a file.
    let tmp = dir.path().join("rows.tmp");
    std::fs::write(&tmp, SMI_SAMPLE).unwrap();
    std::fs::rename(&tmp, &rows).unwrap();
    let again = next(&mut sent, "a registration with the GPUs", |s| match s {
        Sent::Register(r) if !r.gpus.is_empty() => Some(r),
        _ => None,
    })
    .await;
    let cards: Vec<(i32, &str, &str)> = again
        .gpus
        .iter()
        .map(|g| (g.index, g.class.as_str(), g.uuid.as_str()))
        .collect();
    assert_eq!(
        cards,
        [
            (0, "h100-80g", "GPU-11111111-2222-3333-4444-555555555555"),
            (1, "h100-80g", "GPU-66666666-7777-8888-9999-000000000000")
        ]
    );
    assert!(again.gpus.iter().all(|g| g.problems.is_empty()));

    // A card's problem is news for a heartbeat, not a registration.
    let sick = SMI_SAMPLE.replace("550.54.15, 36, 0", "550.54.15, 36, 4");
    std::fs::write(&tmp, sick).unwrap();
    std::fs::rename(&tmp, &rows).unwrap();
    let problems = next(&mut sent, "GPU 1's ECC errors", |s| match s {
        Sent::Register(r) => panic!("registered again for a problem: {:?}", r.gpus),
        Sent::Heartbeat(h) if h.gpus_changed => Some(h.gpus),
        Sent::Heartbeat(_) => None,
    })
    .await;
    assert_eq!(problems[1].problems, ["4 uncorrected ECC errors"]);
    stop.send_replace(true);
    agent.await.unwrap();
}
