//! The agent's real session (`Agent::run`) against two servers that speak
//! the agent protocol on real sockets, each playing what a control plane
//! does around a store outage: gone, up with its store out of reach
//! (UNAVAILABLE "the event store: …"), a standby naming the leader (the
//! refusal's metadata), or the leader taking the stream.
//!
//! Real time, not paused: with sockets in the test's runtime a paused
//! clock jumps to the next timer at every hop between the tasks, which
//! fires the streams' keepalive timeouts. The agent's backoff base is cut
//! to 20 ms so that the outage builds, in seconds, the backoff a real one
//! builds in half a minute.

use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llmgw_agent::engines::{LlamaCpp, Registry, Sglang, Sim, Vllm};
use llmgw_agent::session::{Agent, SessionConfig};
use llmgw_api::v1::ControlMessage;
use llmgw_api::{AgentMessage, AgentService, AgentServiceServer, refusal};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// What a server does with the next attempt.
#[derive(Debug, Clone)]
enum Mode {
    /// Nothing answers: the connection is closed at once.
    Gone,
    /// Up, its store out of reach.
    StoreDown,
    /// A standby: the leader is at `leader_agent`, under `epoch`; none
    /// leads when None.
    Standby(Option<(String, u64)>),
    /// Takes the stream.
    Leader,
}

/// What a server saw, in order.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Seen {
    /// A connection closed unanswered.
    Dropped,
    /// The same, where the agent looked whether plain HTTP answers (what
    /// it does last after a failed dial).
    Probe,
    /// "the event store" answered.
    StoreDown,
    /// A standby's refusal; naming a leader or not.
    Refused { named: bool },
    /// A stream taken.
    Stream,
}

type Log = watch::Sender<Vec<(Instant, Seen)>>;

struct Fake {
    url: String,
    mode: watch::Sender<Mode>,
    log: Log,
}

impl Fake {
    async fn start(mode: Mode) -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (mode, modes) = watch::channel(mode);
        let log: Log = watch::channel(Vec::new()).0;
        let (tx, rx) = mpsc::channel::<Result<tokio::net::TcpStream, std::io::Error>>(16);
        let (accepting, svc_modes, svc_log) = (modes.clone(), modes, log.clone());
        let dropped = log.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                if matches!(*accepting.borrow(), Mode::Gone) {
                    let mut head = [0u8; 3];
                    let read = tokio::time::timeout(Duration::from_secs(1), socket.peek(&mut head));
                    let probe = matches!(read.await, Ok(Ok(_))) && &head == b"GET";
                    drop(socket);
                    note(&dropped, if probe { Seen::Probe } else { Seen::Dropped });
                } else if tx.send(Ok(socket)).await.is_err() {
                    return;
                }
            }
        });
        let svc = Svc {
            mode: svc_modes,
            log: svc_log,
            streams: Arc::default(),
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AgentServiceServer::new(svc))
                .serve_with_incoming(ReceiverStream::new(rx)),
        );
        Fake { url, mode, log }
    }

    /// Waits until what this server saw passes `done`; what it saw then.
    async fn until(
        &self,
        what: &str,
        done: impl FnMut(&Vec<(Instant, Seen)>) -> bool,
    ) -> Vec<(Instant, Seen)> {
        let mut rx = self.log.subscribe();
        let seen = tokio::time::timeout(Duration::from_secs(120), rx.wait_for(done)).await;
        match seen {
            Ok(Ok(log)) => log.clone(),
            _ => panic!("{what} at {}: {:?}", self.url, *self.log.borrow()),
        }
    }

    /// Waits until `what` was seen `n` times; when the last was.
    async fn seen(&self, what: Seen, n: usize) -> Instant {
        let count = |l: &Vec<(Instant, Seen)>| l.iter().filter(|(_, s)| *s == what).count();
        let log = (self.until(&format!("{what:?} {n} times"), |l| count(l) >= n)).await;
        log.iter().filter(|(_, s)| *s == what).nth(n - 1).unwrap().0
    }
}

fn note(log: &Log, what: Seen) {
    log.send_modify(|l| l.push((Instant::now(), what)));
}

struct Svc {
    mode: watch::Receiver<Mode>,
    log: Log,
    /// The streams taken, kept open.
    streams: Arc<Mutex<Vec<Taken>>>,
}

/// A stream taken: what the agent sends, and where to answer.
type Taken = (
    Streaming<AgentMessage>,
    mpsc::Sender<Result<ControlMessage, Status>>,
);

type Outbound = Pin<Box<dyn tokio_stream::Stream<Item = Result<ControlMessage, Status>> + Send>>;

#[tonic::async_trait]
impl AgentService for Svc {
    type ConnectStream = Outbound;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Outbound>, Status> {
        let mode = self.mode.borrow().clone();
        match mode {
            Mode::Gone => unreachable!("closed before it is served"),
            Mode::StoreDown => {
                note(&self.log, Seen::StoreDown);
                // As the control plane words a store error.
                Err(Status::unavailable(
                    "the event store: database error: connection refused",
                ))
            }
            Mode::Standby(leader) => {
                note(
                    &self.log,
                    Seen::Refused {
                        named: leader.is_some(),
                    },
                );
                let mut md = tonic::metadata::MetadataMap::new();
                md.insert(refusal::RETRY_AFTER_MS, "9000".parse().unwrap());
                if let Some((agent, epoch)) = leader {
                    md.insert(refusal::LEADER, "cp-b".parse().unwrap());
                    md.insert(refusal::LEADER_AGENT, agent.parse().unwrap());
                    md.insert(refusal::EPOCH, epoch.to_string().parse().unwrap());
                }
                Err(Status::with_metadata(
                    tonic::Code::Unavailable,
                    "this server is a standby",
                    md,
                ))
            }
            Mode::Leader => {
                note(&self.log, Seen::Stream);
                let (tx, rx) = mpsc::channel(1);
                self.streams
                    .lock()
                    .unwrap()
                    .push((request.into_inner(), tx));
                Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
            }
        }
    }
}

/// The agent's real session, dialling `servers` in that order, with the
/// default ceiling on its backoff raised (60 s) and its base cut (20 ms).
fn agent(servers: &[&Fake]) -> watch::Sender<bool> {
    let mut config = SessionConfig::new(
        servers.iter().map(|s| s.url.clone()).collect(),
        "node2".into(),
    );
    config.discovery.skip_gpus = true;
    config.reconnect_base = Duration::from_millis(20);
    config.reconnect_max = Duration::from_secs(60);
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
    tokio::spawn(Agent::new(config, registry).run(stopped));
    stop
}

/// The audit's outage: both servers up, their store out of reach, for as
/// long as makes the backoff of a server that cannot be reached exceed
/// 10 s (eleven refusals); then cp-b leads and cp-a, a standby, names it.
/// A server that answers is no server gone: the agent asks every few
/// seconds at most, and is on the leader within that of the store's
/// return. It took up to `--reconnect-max-s` (a node waited 20 s and was
/// marked unreachable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_store_outage_the_agent_is_on_the_new_leader_within_seconds() {
    let a = Fake::start(Mode::StoreDown).await;
    let b = Fake::start(Mode::StoreDown).await;
    let stop = agent(&[&a, &b]);
    b.seen(Seen::StoreDown, 11).await;
    let back = Instant::now();
    b.mode.send_replace(Mode::Leader);
    a.mode
        .send_replace(Mode::Standby(Some((b.url.clone(), 16))));
    let on = b.seen(Seen::Stream, 1).await;
    let took = on - back;
    // Five seconds at most between asks, and as much again for a loaded
    // machine (CI runs many tests at once); the old backoff was at least
    // 10 s here.
    assert!(took < Duration::from_millis(9_000), "{took:?}");
    // Between asks while the store was out: never the long waits of a
    // server gone.
    let asks: Vec<Instant> = (a.log.borrow().iter())
        .filter(|(_, s)| *s == Seen::StoreDown)
        .map(|(t, _)| *t)
        .collect();
    let longest = asks.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(longest < Duration::from_millis(9_000), "{longest:?}");
    stop.send_replace(true);
}

/// A leader newly in office that the agent could not reach before (it
/// was restarting: its dials were closed unanswered until the agent
/// waited 4 s and more between them) is dialled as soon as a standby
/// names it: within moments of the standby's refusal, not when its old
/// backoff runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_naming_a_leader_newly_in_office_sends_the_agent_there_at_once() {
    let a = Fake::start(Mode::Standby(None)).await;
    let b = Fake::start(Mode::Gone).await;
    let stop = agent(&[&a, &b]);
    let long = Duration::from_millis(4_000);
    // Until a failed dial, over (its look for plain HTTP done), came
    // 4 s after the one before: the next is 4 s away at least.
    b.until("a wait of 4 s between dials", |l| {
        let probes: Vec<Instant> = (l.iter())
            .filter(|(_, s)| *s == Seen::Probe)
            .map(|(t, _)| *t)
            .collect();
        l.last().is_some_and(|(_, s)| *s == Seen::Probe)
            && probes
                .windows(2)
                .last()
                .is_some_and(|w| w[1] - w[0] >= long)
    })
    .await;
    let back = Instant::now();
    b.mode.send_replace(Mode::Leader);
    a.mode
        .send_replace(Mode::Standby(Some((b.url.clone(), 16))));
    let on = b.seen(Seen::Stream, 1).await;
    let named = (a.log.borrow().iter())
        .find(|(_, s)| *s == Seen::Refused { named: true })
        .map(|(t, _)| *t);
    let Some(named) = named.filter(|n| *n <= on) else {
        panic!(
            "{:?} after the leader took office, before any standby named it: on its own backoff",
            on - back
        );
    };
    // At once, with room for a loaded machine; the old backoff had 4 s
    // and more to run.
    assert!(
        on - named < Duration::from_secs(2),
        "{:?} after the standby named it, {:?} after it took office",
        on - named,
        on - back
    );
    stop.send_replace(true);
}
