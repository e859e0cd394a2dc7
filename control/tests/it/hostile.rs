//! Bad input on the agent listener, generated: arbitrary bytes as gRPC
//! messages, and well-formed messages with values no node has (negative
//! or giant numbers, huge lists, paths with `..`, absurd GPU counts). The
//! control plane never panics: a stream is accepted (an Ack) or refused
//! with INVALID_ARGUMENT (or DEADLINE_EXCEEDED) and a reason, an accepted
//! stream ends cleanly or with such a refusal, and the server goes on
//! serving agents.

use std::time::Duration;

use llmgw_api::v1::{self, agent_message, control_message};
use llmgw_api::{AgentMessage, AgentServiceClient, ControlMessage};
use llmgw_testkit::{Backend, Scratch};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use prost::Message;
use prost::bytes::{Buf, BufMut};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use crate::harness::{Agent, Server, eventually, fast, register, sim_model, types};

/// Messages as bytes, whatever they hold.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut v = vec![0; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

/// How a stream went.
#[derive(Debug)]
enum Outcome {
    /// Refused before it started.
    Refused(tonic::Status),
    /// Accepted: what the server said, and how the stream ended (None: a
    /// clean end).
    Ended(Vec<ControlMessage>, Option<tonic::Status>),
}

/// The server's answers until the stream ends, bounded: a stream that
/// outlives the client's half of it means a task died or hangs.
async fn drain(mut inbound: tonic::Streaming<Vec<u8>>) -> Result<Outcome, String> {
    let mut said = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), inbound.message()).await {
            Err(_) => return Err(format!("the stream did not end; it said {said:?}")),
            Ok(Ok(Some(bytes))) => said.push(
                ControlMessage::decode(bytes.as_slice())
                    .map_err(|e| format!("the server sent no ControlMessage: {e}"))?,
            ),
            Ok(Ok(None)) => return Ok(Outcome::Ended(said, None)),
            Ok(Err(s)) => return Ok(Outcome::Ended(said, Some(s))),
        }
    }
}

/// Opens a stream, sends `frames` as they are and closes its half.
async fn raw_stream(addr: std::net::SocketAddr, frames: Vec<Vec<u8>>) -> Result<Outcome, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| e.to_string())?;
    let call = grpc.streaming(
        tonic::Request::new(tokio_stream::iter(frames)),
        tonic::codegen::http::uri::PathAndQuery::from_static("/llmgw.v1.AgentService/Connect"),
        RawCodec,
    );
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Err(_) => Err("no answer to the stream within 10 s".into()),
        Ok(Err(status)) => Ok(Outcome::Refused(status)),
        Ok(Ok(r)) => drain(r.into_inner()).await,
    }
}

/// What an agent may expect of any stream.
fn check(outcome: Result<Outcome, String>) -> Result<(), TestCaseError> {
    let reason = |s: &tonic::Status| -> Result<(), TestCaseError> {
        prop_assert!(
            matches!(
                s.code(),
                tonic::Code::InvalidArgument | tonic::Code::DeadlineExceeded
            ),
            "refused as {:?}: {}",
            s.code(),
            s.message()
        );
        prop_assert!(!s.message().is_empty(), "refused without a reason");
        Ok(())
    };
    match outcome.map_err(TestCaseError::fail)? {
        Outcome::Refused(s) => reason(&s),
        Outcome::Ended(said, end) => {
            prop_assert!(
                matches!(
                    said.first().and_then(|m| m.msg.as_ref()),
                    Some(control_message::Msg::Ack(a)) if a.ok
                ),
                "an accepted stream starts with an Ack: {said:?}"
            );
            match end {
                None => Ok(()),
                Some(s) => reason(&s),
            }
        }
    }
}

fn message(m: agent_message::Msg) -> Vec<u8> {
    AgentMessage { msg: Some(m) }.encode_to_vec()
}

/// Bytes of every kind: noise, a real registration with bytes flipped, a
/// real registration followed by noise.
fn frames() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let noise = prop::collection::vec(any::<u8>(), 0..300);
    let flipped = (
        "[a-z]{1,8}",
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    )
        .prop_map(|(node, flips)| {
            let mut b = message(agent_message::Msg::Register(register(&node)));
            for (at, v) in flips {
                let i = at.index(b.len());
                b[i] = v;
            }
            vec![b]
        });
    let then_noise = (
        "[a-z]{1,8}",
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 1..4),
    )
        .prop_map(|(node, more)| {
            let mut v = vec![message(agent_message::Msg::Register(register(&node)))];
            v.extend(more);
            v
        });
    prop_oneof![prop::collection::vec(noise, 0..4), flipped, then_noise,]
}

fn int32() -> impl Strategy<Value = i32> {
    prop_oneof![
        4 => 0..16i32,
        1 => -8..0i32,
        1 => Just(i32::MIN),
        1 => Just(i32::MAX),
        1 => any::<i32>(),
    ]
}

fn int64() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => 0..1_000_000i64,
        1 => Just(-1i64),
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => any::<i64>(),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9-]{1,12}",
        1 => Just(String::new()),
        1 => Just("..".to_owned()),
        1 => Just("../../etc/passwd".to_owned()),
        1 => Just("/var/lib/llmgw-weights/../../../etc/shadow".to_owned()),
        1 => Just("\u{1b}[31mred\u{0}".to_owned()),
        1 => ".{0,40}",
        1 => "[a-z]{300}",
    ]
}

fn gpu() -> impl Strategy<Value = v1::Gpu> {
    (
        int32(),
        int32(),
        text(),
        prop::collection::vec(int32(), 0..4),
        prop::collection::vec(text(), 0..2),
    )
        .prop_map(|(index, memory, class, peers, problems)| v1::Gpu {
            index,
            memory_total_mb: memory,
            name: "NVIDIA H100".into(),
            class,
            nvlink_peers: peers,
            problems,
            ..v1::Gpu::default()
        })
}

fn gpus() -> impl Strategy<Value = Vec<v1::Gpu>> {
    prop_oneof![
        6 => prop::collection::vec(gpu(), 0..6),
        // More cards than any board has.
        1 => (257usize..600).prop_map(|n| {
            (0..n)
                .map(|i| v1::Gpu {
                    index: i as i32,
                    memory_total_mb: 81_559,
                    name: "NVIDIA H100".into(),
                    ..v1::Gpu::default()
                })
                .collect()
        }),
    ]
}

fn running() -> impl Strategy<Value = v1::RunningShard> {
    (
        text(),
        text(),
        int32(),
        int32(),
        prop::collection::vec(int32(), 0..4),
        int32(),
        prop::sample::select(vec!["m", "gone", ""]),
        prop::sample::select(vec!["sim", "other"]),
    )
        .prop_map(
            |(replica_id, shard_id, rank, nnodes, gpus, port, model, profile)| v1::RunningShard {
                replica_id,
                shard_id,
                rank,
                nnodes,
                gpu_indices: gpus,
                http_port: port.wrapping_add(20_000),
                state: v1::shard_status::State::Ready as i32,
                model: model.into(),
                profile: profile.into(),
                pool: "cpu".into(),
                ..v1::RunningShard::default()
            },
        )
}

fn storage() -> impl Strategy<Value = Vec<v1::Storage>> {
    prop::collection::vec(
        (text(), int64(), int64(), any::<bool>()).prop_map(|(path, free, total, shared)| {
            v1::Storage {
                path,
                free_bytes: free,
                total_bytes: total,
                shared,
            }
        }),
        0..3,
    )
}

fn weights() -> impl Strategy<Value = Vec<v1::LocalWeights>> {
    prop::collection::vec(
        (text(), int64()).prop_map(|(path, size)| v1::LocalWeights {
            path,
            size_bytes: size,
            shared: false,
        }),
        0..4,
    )
}

fn hostile_register() -> impl Strategy<Value = v1::Register> {
    (
        prop_oneof![3 => "n[0-9]{1,3}", 1 => text()],
        gpus(),
        prop::collection::vec(
            (text(), prop::collection::vec(text(), 0..3), int32()).prop_map(
                |(fabric, hcas, rate)| v1::FabricAttachment {
                    fabric,
                    hcas,
                    rate_gbps: rate,
                },
            ),
            0..3,
        ),
        int64(),
        storage(),
        weights(),
        prop::collection::btree_map(text(), text(), 0..3),
        prop::collection::vec(running(), 0..3),
    )
        .prop_map(
            |(node, gpus, fabrics, memory, storage, weights, labels, running)| v1::Register {
                gpus,
                fabrics,
                memory_total_mb: memory,
                storage,
                weights,
                labels: labels.into_iter().collect(),
                running_shards: running,
                ..register(&node)
            },
        )
}

/// What an accepted agent may send next.
fn hostile_messages() -> impl Strategy<Value = Vec<agent_message::Msg>> {
    let heartbeat = (
        storage(),
        any::<bool>(),
        weights(),
        int64(),
        any::<bool>(),
        prop::collection::vec(
            (int32(), prop::collection::vec(text(), 0..2))
                .prop_map(|(index, problems)| v1::GpuHealth { index, problems }),
            0..4,
        ),
        prop::collection::vec(
            (int32(), int64(), int64(), int32()).prop_map(|(index, used, total, temp)| {
                v1::GpuFigures {
                    index,
                    memory_used_mb: used,
                    memory_total_mb: total,
                    temperature_c: temp,
                    ..v1::GpuFigures::default()
                }
            }),
            0..4,
        ),
    )
        .prop_map(
            |(storage, weights_changed, weights, memory, gpus_changed, gpus, figures)| {
                agent_message::Msg::Heartbeat(v1::Heartbeat {
                    storage,
                    weights_changed,
                    weights,
                    memory_total_mb: memory,
                    gpus_changed,
                    gpus,
                    gpu_figures: figures,
                    ..v1::Heartbeat::default()
                })
            },
        );
    let status = (
        text(),
        text(),
        int32(),
        text(),
        int32(),
        prop::collection::vec(text(), 0..4),
        int32(),
        prop::option::of((int64(), int64())),
    )
        .prop_map(
            |(replica_id, shard_id, state, error, exit_code, last_output, port, fetch)| {
                agent_message::Msg::Shard(v1::ShardStatus {
                    replica_id,
                    shard_id,
                    state,
                    error,
                    exit_code,
                    last_output,
                    port_taken: port,
                    fetch: fetch.map(|(done, total)| v1::FetchProgress {
                        source: "../x".into(),
                        bytes_done: done,
                        bytes_total: total,
                    }),
                    ..v1::ShardStatus::default()
                })
            },
        );
    let logs = (text(), prop::collection::vec(text(), 0..3)).prop_map(|(id, lines)| {
        agent_message::Msg::Logs(v1::LogsReply {
            request_id: id,
            lines,
            ..v1::LogsReply::default()
        })
    });
    prop::collection::vec(prop_oneof![3 => heartbeat, 3 => status, 1 => logs], 0..5)
}

/// Registers with `reg`, sends `then`, and closes its half.
async fn typed_stream(
    addr: std::net::SocketAddr,
    reg: v1::Register,
    then: Vec<agent_message::Msg>,
) -> Result<Outcome, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut frames = vec![message(agent_message::Msg::Register(reg))];
    frames.extend(then.into_iter().map(message));
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| e.to_string())?;
    let call = grpc.streaming(
        tonic::Request::new(tokio_stream::iter(frames)),
        tonic::codegen::http::uri::PathAndQuery::from_static("/llmgw.v1.AgentService/Connect"),
        RawCodec,
    );
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Err(_) => Err("no answer to the stream within 10 s".into()),
        Ok(Err(status)) => Ok(Outcome::Refused(status)),
        Ok(Ok(r)) => drain(r.into_inner()).await,
    }
}

/// After the storm, a real agent still registers and is answered.
async fn still_serving(s: &Server) {
    let mut agent = Agent::connect(s.agent_addr, register("after"))
        .await
        .unwrap();
    assert!(matches!(
        agent.next().await,
        control_message::Msg::Ack(a) if a.ok
    ));
    // The Ack follows the append; the admin API reads the views, which
    // follow the log a moment later.
    eventually(
        s,
        "the node registered after the storm to be listed",
        || async {
            let nodes = s.get("/api/v1/nodes").await;
            nodes
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n["id"] == "after")
                .then_some(())
        },
    )
    .await;
}

#[test]
fn arbitrary_bytes_and_hostile_values_never_break_the_agent_service() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (s, _db) = rt.block_on(async {
        let (addr, db) = Scratch::new(Backend::Postgres).await;
        let s = Server::start(
            &addr,
            llmgw_control::ControlConfig {
                register_within: Duration::from_millis(500),
                ..fast("a", vec![sim_model("m", 0)])
            },
        )
        .await;
        s.wait_leader().await;
        (s, db)
    });
    let config = Config {
        cases: 48,
        failure_persistence: None,
        max_shrink_iters: 100,
        ..Config::default()
    };
    // Both ways out are taken: some streams accepted, some refused.
    let tally = [
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    ];
    let counted = |o: Result<Outcome, String>| {
        let i = usize::from(matches!(o, Ok(Outcome::Refused(_))));
        tally[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        o
    };
    TestRunner::new(config.clone())
        .run(&frames(), |frames| {
            check(counted(rt.block_on(raw_stream(s.agent_addr, frames))))
        })
        .unwrap();
    TestRunner::new(config)
        .run(&(hostile_register(), hostile_messages()), |(reg, then)| {
            check(counted(rt.block_on(typed_stream(s.agent_addr, reg, then))))
        })
        .unwrap();
    let [accepted, refused] = tally.map(|t| t.into_inner());
    assert!(
        accepted > 5 && refused > 5,
        "{accepted} accepted, {refused} refused"
    );
    rt.block_on(still_serving(&s));
    rt.block_on(s.stop());
}

/// Each value no node has, refused with the field that holds it, and
/// nothing appended for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_with_values_no_node_has_is_refused_with_its_reason() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let s = Server::start(&addr, fast("a", vec![sim_model("m", 0)])).await;
    s.wait_leader().await;
    let gpu = |index| v1::Gpu {
        index,
        memory_total_mb: 81_559,
        name: "NVIDIA H100".into(),
        ..v1::Gpu::default()
    };
    let shard = v1::RunningShard {
        replica_id: "r1".into(),
        shard_id: "r1-0".into(),
        nnodes: 1,
        http_port: 20_000,
        model: "m".into(),
        profile: "sim".into(),
        state: v1::shard_status::State::Ready as i32,
        ..v1::RunningShard::default()
    };
    let cases: Vec<(v1::Register, &str)> = vec![
        (
            v1::Register {
                gpus: vec![gpu(0), gpu(-1)],
                ..register("n1")
            },
            "a GPU index is -1, below 0",
        ),
        (
            v1::Register {
                gpus: (0..10_000).map(gpu).collect(),
                ..register("n1")
            },
            "10000 GPUs (at most 256)",
        ),
        (
            v1::Register {
                gpus: vec![gpu(0), gpu(0)],
                ..register("n1")
            },
            "GPU index 0 is reported twice",
        ),
        (
            v1::Register {
                memory_total_mb: -5,
                ..register("n1")
            },
            "memory_total_mb is -5, below 0",
        ),
        (
            v1::Register {
                running_shards: vec![v1::RunningShard {
                    http_port: 70_000,
                    ..shard.clone()
                }],
                ..register("n1")
            },
            "running shard r1-0: http_port 70000 is not a port",
        ),
        (
            v1::Register {
                running_shards: vec![v1::RunningShard {
                    nnodes: i32::MAX,
                    ..shard.clone()
                }],
                ..register("n1")
            },
            "nnodes 2147483647 is not 1 to 256",
        ),
        (
            v1::Register {
                running_shards: vec![v1::RunningShard {
                    gpu_indices: vec![-3],
                    ..shard.clone()
                }],
                ..register("n1")
            },
            "GPU index -3 is below 0",
        ),
        (
            v1::Register {
                fabrics: vec![v1::FabricAttachment {
                    fabric: "ib0".into(),
                    hcas: vec!["mlx5_0\0".into()],
                    rate_gbps: 400,
                }],
                ..register("n1")
            },
            "the event store refuses it",
        ),
        (register("\u{1b}[2Jn1"), "control characters"),
        (register("../../n1 x"), "without spaces"),
    ];
    for (reg, why) in cases {
        let status = match Agent::connect(s.agent_addr, reg.clone()).await {
            Err(status) => status,
            Ok(_) => panic!("accepted: {reg:?}"),
        };
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(why),
            "{why}: {}",
            status.message()
        );
    }
    assert!(!types(&s.events().await).contains(&"NodeRegistered"));
    // The same node, well described, is let in.
    let mut agent = Agent::connect(s.agent_addr, register("n1")).await.unwrap();
    assert!(matches!(agent.next().await, control_message::Msg::Ack(a) if a.ok));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_never_registers_or_turns_to_noise_is_ended_with_the_reason() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let s = Server::start(
        &addr,
        llmgw_control::ControlConfig {
            register_within: Duration::from_millis(300),
            ..fast("a", vec![])
        },
    )
    .await;
    s.wait_leader().await;

    // Opens a stream and says nothing: refused once the wait is over.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.agent_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (_keep, rx) = tokio::sync::mpsc::channel::<AgentMessage>(1);
    let status = AgentServiceClient::new(channel)
        .connect(ReceiverStream::new(rx))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("no Register within 0.3 s"),
        "{}",
        status.message()
    );

    // Registers, then sends bytes that are no AgentMessage.
    let noise = vec![0xff, 0xff, 0xff, 0xff, 0x0f];
    let outcome = raw_stream(
        s.agent_addr,
        vec![message(agent_message::Msg::Register(register("n1"))), noise],
    )
    .await
    .unwrap();
    let Outcome::Ended(said, Some(end)) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(matches!(
        said.first().and_then(|m| m.msg.as_ref()),
        Some(control_message::Msg::Ack(a)) if a.ok
    ));
    assert_eq!(end.code(), tonic::Code::InvalidArgument, "{end:?}");
    assert!(
        end.message().contains("not an AgentMessage"),
        "{}",
        end.message()
    );

    // A heartbeat with a list no node has.
    let outcome = typed_stream(
        s.agent_addr,
        register("n2"),
        vec![agent_message::Msg::Heartbeat(v1::Heartbeat {
            node_id: "n2".into(),
            gpu_figures: (0..1000)
                .map(|i| v1::GpuFigures {
                    index: i,
                    ..v1::GpuFigures::default()
                })
                .collect(),
            ..v1::Heartbeat::default()
        })],
    )
    .await
    .unwrap();
    let Outcome::Ended(_, Some(end)) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(end.code(), tonic::Code::InvalidArgument, "{end:?}");
    assert!(
        end.message().contains("1000 GPU figures (at most 256)"),
        "{}",
        end.message()
    );
    s.stop().await;
}
