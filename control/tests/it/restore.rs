//! A new leader and engines its log does not know: after a restore from an
//! older backup (or a failover), what a node runs is adopted, never
//! stopped for a placement the new leader made before its agent was back.

use llmgw_api::v1::control_message::Msg;
use llmgw_api::v1::shard_status::State as Wire;
use llmgw_api::v1::{EngineProfile, StartShard};
use llmgw_testkit::{Backend, Scratch};

use crate::count;
use crate::harness::{Agent, Server, eventually, fast, register, running, sim_model};

/// The engine of a replica of `model` (the harness's sim model) on `port`,
/// as its agent reports it: rank 0 of `nnodes`.
fn engine(replica: &str, model: &str, port: i32, nnodes: i32) -> StartShard {
    let m = sim_model(model, 1);
    StartShard {
        replica_id: replica.into(),
        shard_id: format!("{replica}-0"),
        nnodes,
        http_port: port,
        model: model.into(),
        profile: Some(EngineProfile {
            name: "sim".into(),
            engine: "sim".into(),
            ..EngineProfile::default()
        }),
        profile_fp: m.profile_fp(&m.profiles[0]),
        pool: "cpu".into(),
        ..StartShard::default()
    }
}

/// The auditor's restore: the log (an older copy) holds the node but not
/// the replica its engine serves. The new leader placed a replica on the
/// node at once, before the agent was back; the agent's engine then
/// clashed with it on its port, the adoption was refused and the serving
/// engine stopped. A node not heard from in this office takes nothing
/// new: the engine is adopted, serves on, and nothing is placed or
/// stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_adopts_an_engine_its_older_log_does_not_know() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    // The backup: the node registered, no replica yet.
    let s1 = Server::start(&addr, fast("a", vec![])).await;
    s1.wait_leader().await;
    let mut a = Agent::connect(s1.agent_addr, register("n1")).await.unwrap();
    assert!(matches!(a.next().await, Msg::Ack(a) if a.ok));
    drop(a);
    s1.stop().await;

    let s2 = Server::start(&addr, fast("b", vec![sim_model("chat", 1)])).await;
    s2.wait_leader().await;
    // Passes before the agent is back: each placed chat on n1 (its first
    // port, the one the engine holds) when the node was known but unheard.
    s2.passes(3).await;
    assert_eq!(
        count(&s2, "ReplicaPlaced").await,
        0,
        "placed before n1 was heard"
    );

    let serving = engine("r-serving", "chat", 20000, 1);
    let mut reg = register("n1");
    reg.running_shards = vec![running(&serving)];
    let mut a = Agent::connect(s2.agent_addr, reg).await.unwrap();
    a.keep_alive();
    assert!(matches!(a.next().await, Msg::Ack(_)));
    let rows = eventually(&s2, "the engine adopted and ready", || async {
        let r = s2.get("/api/v1/replicas").await;
        (r[0]["status"] == "ready").then_some(r)
    })
    .await;
    assert_eq!(rows[0]["id"], "r-serving");
    assert_eq!(rows[0]["adopted"], true);
    // Settled: nothing placed beside it, nothing stopped.
    s2.passes(3).await;
    assert_eq!(count(&s2, "ReplicaPlaced").await, 0);
    assert_eq!(count(&s2, "ReplicaStopped").await, 0);
    assert_eq!(
        s2.get("/api/v1/replicas").await.as_array().unwrap().len(),
        1
    );
    assert_eq!(s2.get("/api/v1/status").await["replicas_ready"], 1);
    s2.stop().await;
}

/// A rank of a replica spread over two nodes waits for the other's report
/// before it is adopted; meanwhile it runs. A placement onto its port (or
/// GPUs) would clash with its adoption and have the running engine
/// stopped: what it holds is left alone, until it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_awaiting_adoption_keeps_its_port() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let s = Server::start(&addr, fast("a", vec![sim_model("chat", 1)])).await;
    s.wait_leader().await;
    let rank = engine("r-pair", "chat", 20000, 2);
    let mut reg = register("n1");
    reg.running_shards = vec![running(&rank)];
    let mut a = Agent::connect(s.agent_addr, reg).await.unwrap();
    a.keep_alive();
    let start = a.next_start().await;
    assert_eq!(start.model, "chat");
    assert_ne!(start.http_port, 20000, "the port the waiting rank holds");
    // Once the rank has stopped, its port is free again: the replica
    // rebuilt after a failure takes it.
    a.report(&rank, Wire::Stopped).await;
    a.report_failed(&start, "boom").await;
    let again = loop {
        match a.next().await {
            Msg::Start(s) => break s,
            Msg::Stop(stop) => assert_eq!(stop.shard_id, start.shard_id),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_ne!(again.replica_id, start.replica_id);
    assert_eq!(again.http_port, 20000);
    s.stop().await;
}
