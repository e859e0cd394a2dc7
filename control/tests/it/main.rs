//! The control plane against a real store over real sockets, with agents
//! driven message by message through the real protocol.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod anchors;
mod clocks;
mod fence;
mod harness;
mod hostile;
mod provision;
mod restore;

use harness::{Agent, Server, eventually, fast, register, running, sim_model, types};
use llmgw_api::v1::control_message::Msg;
use llmgw_api::v1::shard_status::State as Wire;
use llmgw_testkit::{Backend, Scratch};

async fn count(server: &Server, event_type: &str) -> usize {
    types(&server.events().await)
        .iter()
        .filter(|t| **t == event_type)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_is_an_event_only_when_something_changed() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let s = Server::start(&addr, fast("a", vec![])).await;
    s.wait_leader().await;
    let mut agent = Agent::connect(s.agent_addr, register("n1")).await.unwrap();
    assert!(matches!(agent.next().await, Msg::Ack(a) if a.ok));
    agent.keep_alive();
    drop(agent);
    // The same inventory again: no new event.
    let mut again = Agent::connect(s.agent_addr, register("n1")).await.unwrap();
    assert!(matches!(again.next().await, Msg::Ack(_)));
    let mut changed = register("n1");
    changed.memory_total_mb = 32_000;
    let mut third = Agent::connect(s.agent_addr, changed).await.unwrap();
    assert!(matches!(third.next().await, Msg::Ack(_)));
    assert_eq!(count(&s, "NodeRegistered").await, 1);
    assert_eq!(count(&s, "NodeInventoryChanged").await, 1);
    // A bad registration is refused with its reason and appends nothing.
    let mut bad = register("n2");
    bad.fabrics = vec![
        llmgw_api::v1::FabricAttachment {
            fabric: "ib-a".into(),
            hcas: vec!["mlx5_0".into()],
            rate_gbps: 200,
        },
        llmgw_api::v1::FabricAttachment {
            fabric: "ib-b".into(),
            hcas: vec!["mlx5_0".into()],
            rate_gbps: 200,
        },
    ];
    let err = match Agent::connect(s.agent_addr, bad).await {
        Err(e) => e,
        Ok(_) => panic!("an adapter under two fabrics is refused"),
    };
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("two fabrics"), "{}", err.message());
    // An agent that heartbeats less often than this server (600 ms here)
    // waits before taking a node as unreachable would flap for ever:
    // refused with both figures. One that says nothing (an older agent)
    // and one within half are let in.
    let mut slow = register("n3");
    slow.heartbeat_ms = 1_000;
    let err = match Agent::connect(s.agent_addr, slow).await {
        Err(e) => e,
        Ok(_) => panic!("a heartbeat slower than unreachable_after is refused"),
    };
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message().contains("heartbeats every 1 s")
            && err.message().contains("unreachable after 0.6 s"),
        "{}",
        err.message()
    );
    assert_eq!(count(&s, "NodeRegistered").await, 1);
    let mut fit = register("n4");
    fit.heartbeat_ms = 200;
    let mut fit = Agent::connect(s.agent_addr, fit).await.unwrap();
    assert!(matches!(fit.next().await, Msg::Ack(a) if a.ok));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_is_placed_started_and_ready_through_the_stream() {
    let (addr, _db) = Scratch::new(Backend::Sqlite).await;
    let s = Server::start(&addr, fast("a", vec![sim_model("chat", 1)])).await;
    s.wait_leader().await;
    let mut agent = Agent::connect(s.agent_addr, register("n1")).await.unwrap();
    agent.keep_alive();
    let start = agent.next_start().await;
    assert_eq!(start.model, "chat");
    assert_eq!(start.http_port, 20000);
    assert_eq!(start.profile.as_ref().unwrap().engine, "sim");
    assert_eq!(start.nnodes, 1);
    agent.report(&start, Wire::Loading).await;
    agent.report(&start, Wire::Ready).await;
    let rows = eventually(&s, "the replica is ready", || async {
        let r = s.get("/api/v1/replicas").await;
        (r[0]["status"] == "ready").then_some(r)
    })
    .await;
    assert_eq!(rows[0]["shards"][0]["node"], "n1");
    let status = s.get("/api/v1/status").await;
    assert_eq!(status["models_ready"], 1);
    assert_eq!(status["leader"]["is_leader"], true);
    // Nothing more to do: the reconciler is idempotent.
    let before = s.events().await.len();
    s.cp.demand("chat");
    s.passes(3).await;
    let after = s.events().await;
    assert!(
        types(&after[before..])
            .iter()
            .all(|t| *t != "ReplicaPlaced"),
        "{:?}",
        types(&after[before..])
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_goes_unreachable_then_lost_and_its_replica_is_rebuilt() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let s = Server::start(&addr, fast("a", vec![sim_model("chat", 1)])).await;
    s.wait_leader().await;
    let mut a = Agent::connect(s.agent_addr, register("a")).await.unwrap();
    a.keep_alive();
    let first = a.next_start().await;
    a.report(&first, Wire::Ready).await;
    let mut b = Agent::connect(s.agent_addr, register("b")).await.unwrap();
    b.keep_alive();
    eventually(&s, "ready", || async {
        (s.get("/api/v1/status").await["replicas_ready"] == 1).then_some(())
    })
    .await;
    a.silence();
    let rebuilt = b.next_start().await;
    assert_ne!(rebuilt.replica_id, first.replica_id);
    let t = types(&s.events().await)
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    let at = |name: &str| {
        t.iter()
            .position(|x| x == name)
            .unwrap_or_else(|| panic!("{name} in {t:?}"))
    };
    assert!(at("NodeUnreachable") < at("NodeLost"));
    // Its engines may well serve: only its agent is silent. It is not
    // failed, and is routed, until its replacement serves.
    assert!(!t.iter().any(|x| x == "ReplicaFailed"), "{t:?}");
    let routed = s.get("/api/v1/replicas").await;
    assert!(
        (routed.as_array().unwrap().iter())
            .any(|r| r["id"] == first.replica_id.as_str() && r["status"] == "ready"),
        "{routed}"
    );
    b.report(&rebuilt, Wire::Ready).await;
    let why = eventually(&s, "the lost node's replica drained", || async {
        s.events().await.into_iter().find_map(|e| {
            (e.event_type == "ReplicaDraining"
                && e.payload["replica_id"] == first.replica_id.as_str())
            .then(|| e.payload["why"].as_str().unwrap_or_default().to_owned())
        })
    })
    .await;
    assert_eq!(why, "replaced: its node a is lost");
    // A heartbeat revives the node.
    a.keep_alive();
    eventually(&s, "recovered", || async {
        let nodes = s.get("/api/v1/nodes").await;
        (nodes[0]["state"] == "ready").then_some(())
    })
    .await;
    s.stop().await;
}

/// A node back from lost is told to stop its orphaned engine; once it says
/// the engine stopped, the engine's GPU is free and the model that fits
/// only there is placed on it again (its GPU was held until the agent
/// registered once more: the model stayed down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_an_orphan_held_is_free_once_its_node_says_it_stopped() {
    let (addr, _db) = Scratch::new(Backend::Sqlite).await;
    let mut model = sim_model("g", 1);
    model.profiles[0].gpu_class = Some("h100-80g".into());
    model.profiles[0].gpus_per_node = 1;
    let s = Server::start(&addr, fast("a", vec![model])).await;
    s.wait_leader().await;
    let mut reg = register("a");
    reg.gpus = vec![llmgw_api::v1::Gpu {
        index: 0,
        memory_total_mb: 81_559,
        name: "NVIDIA H100 80GB HBM3".into(),
        class: "h100-80g".into(),
        ..llmgw_api::v1::Gpu::default()
    }];
    let mut a = Agent::connect(s.agent_addr, reg.clone()).await.unwrap();
    a.keep_alive();
    let first = a.next_start().await;
    assert_eq!(first.gpu_indices, vec![0]);
    a.report(&first, Wire::Ready).await;
    eventually(&s, "ready", || async {
        (s.get("/api/v1/status").await["replicas_ready"] == 1).then_some(())
    })
    .await;
    // Node a goes silent, so lost: its replica serves on until the one
    // on b does, then is drained and stopped while a is away.
    let mut on_b = reg.clone();
    on_b.node_id = "b".into();
    let mut b = Agent::connect(s.agent_addr, on_b).await.unwrap();
    b.keep_alive();
    a.silence();
    let moved = b.next_start().await;
    b.report(&moved, Wire::Ready).await;
    eventually(&s, "the lost node's replica stopped", || async {
        (count(&s, "ReplicaStopped").await == 1).then_some(())
    })
    .await;
    drop(a);
    // b goes away in turn: its replica is to be placed on a again.
    b.silence();

    // Back, with the old engine still running: told to stop it.
    reg.running_shards = vec![running(&first)];
    let mut a = Agent::connect(s.agent_addr, reg).await.unwrap();
    a.keep_alive();
    loop {
        match a.next().await {
            Msg::Stop(stop) => {
                assert_eq!(stop.shard_id, first.shard_id);
                break;
            }
            Msg::Ack(_) => {}
            other => panic!("expected the orphan's stop, got {other:?}"),
        }
    }
    a.report(&first, Wire::Stopped).await;
    let again = a.next_start().await;
    assert_ne!(again.replica_id, first.replica_id);
    assert_eq!(again.gpu_indices, vec![0]);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_control_plane_adopts_running_shards_instead_of_restarting_them() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let s = Server::start(&addr, fast("a", vec![sim_model("chat", 1)])).await;
    s.wait_leader().await;
    let mut a = Agent::connect(s.agent_addr, register("a")).await.unwrap();
    a.keep_alive();
    let start = a.next_start().await;
    a.report(&start, Wire::Ready).await;
    eventually(&s, "ready", || async {
        (s.get("/api/v1/status").await["replicas_ready"] == 1).then_some(())
    })
    .await;
    drop(a);
    s.stop().await;

    let s2 = Server::start(&addr, fast("b", vec![sim_model("chat", 1)])).await;
    s2.wait_leader().await;
    let mut reg = register("a");
    reg.running_shards = vec![running(&start)];
    let mut a = Agent::connect(s2.agent_addr, reg).await.unwrap();
    a.keep_alive();
    assert!(matches!(a.next().await, Msg::Ack(_)));
    // Served throughout; nothing is placed or stopped.
    s2.passes(3).await;
    let t = types(&s2.events().await)
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    assert_eq!(
        t.iter().filter(|x| *x == "ReplicaPlaced").count(),
        1,
        "{t:?}"
    );
    assert!(!t.contains(&"ReplicaStopped".to_owned()), "{t:?}");
    assert_eq!(s2.get("/api/v1/status").await["replicas_ready"], 1);
    s2.stop().await;

    // A fresh log (the store was lost) adopts the reported replica whole.
    let (fresh, _db2) = Scratch::new(Backend::Postgres).await;
    let s3 = Server::start(&fresh, fast("c", vec![sim_model("chat", 1)])).await;
    s3.wait_leader().await;
    let mut reg = register("a");
    reg.running_shards = vec![running(&start)];
    let mut a = Agent::connect(s3.agent_addr, reg).await.unwrap();
    a.keep_alive();
    let rows = eventually(&s3, "adopted and ready", || async {
        let r = s3.get("/api/v1/replicas").await;
        (r[0]["status"] == "ready").then_some(r)
    })
    .await;
    assert_eq!(rows[0]["id"], start.replica_id.as_str());
    assert_eq!(rows[0]["adopted"], true);
    assert_eq!(count(&s3, "ReplicaPlaced").await, 0);
    s3.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_whose_model_left_the_catalog_are_stopped() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let s = Server::start(&addr, fast("a", vec![])).await;
    s.wait_leader().await;
    let mut reg = register("a");
    let ghost = llmgw_api::v1::StartShard {
        replica_id: "r-ghost".into(),
        shard_id: "r-ghost-0".into(),
        nnodes: 1,
        http_port: 20000,
        model: "gone".into(),
        profile: Some(llmgw_api::v1::EngineProfile {
            name: "sim".into(),
            engine: "sim".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    reg.running_shards = vec![running(&ghost)];
    let mut a = Agent::connect(s.agent_addr, reg).await.unwrap();
    a.keep_alive();
    loop {
        match a.next().await {
            Msg::Stop(stop) => {
                assert_eq!(stop.shard_id, "r-ghost-0");
                break;
            }
            Msg::Ack(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_refuses_agents_and_changes_and_takes_over_when_the_leader_stops() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let leader = Server::start(&addr, fast("first", vec![sim_model("chat", 1)])).await;
    leader.wait_leader().await;
    let standby = Server::start(&addr, fast("second", vec![sim_model("chat", 1)])).await;
    let err = match Agent::connect(standby.agent_addr, register("n1")).await {
        Err(e) => e,
        Ok(_) => panic!("a standby refuses agent streams"),
    };
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("first"), "{}", err.message());
    let (code, body) = standby.post("/api/v1/nodes/n1/cordon").await;
    assert_eq!(code, 503);
    assert!(
        body["error"].as_str().unwrap().contains("standby"),
        "{body}"
    );

    let mut a = Agent::connect(leader.agent_addr, register("n1"))
        .await
        .unwrap();
    a.keep_alive();
    let start = a.next_start().await;
    a.report(&start, Wire::Ready).await;
    eventually(&standby, "ready on the standby's views", || async {
        (standby.get("/api/v1/status").await["replicas_ready"] == 1).then_some(())
    })
    .await;

    let stopped = tokio::time::Instant::now();
    leader.stop().await;
    standby.wait_leader().await;
    let took = stopped.elapsed();
    assert!(
        took < std::time::Duration::from_secs(3),
        "handover took {took:?}"
    );
    // The agent moves to the new leader and its shard is adopted in place.
    let mut reg = register("n1");
    reg.running_shards = vec![running(&start)];
    let mut a = Agent::connect(standby.agent_addr, reg).await.unwrap();
    a.keep_alive();
    assert!(matches!(a.next().await, Msg::Ack(_)));
    standby.passes(3).await;
    assert_eq!(
        count(&standby, "ReplicaPlaced").await,
        1,
        "nothing placed twice"
    );
    let epochs: std::collections::BTreeSet<u64> =
        standby.events().await.iter().map(|e| e.epoch).collect();
    assert!(
        epochs.len() >= 2,
        "both leaders appended, each under its epoch"
    );
    standby.stop().await;
}

/// A new leader had heard from no node yet, but showed every one as
/// heartbeating a moment ago (its clocks start at its office): it shows
/// none until the node's agent reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_shows_no_heartbeat_it_has_not_heard() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let first = Server::start(&addr, fast("first", vec![])).await;
    first.wait_leader().await;
    let second = Server::start(&addr, fast("second", vec![])).await;
    let a = Agent::connect(first.agent_addr, register("n1"))
        .await
        .unwrap();
    eventually(&first, "a heartbeat", || async {
        first.get("/api/v1/nodes").await[0]["last_heartbeat_s"]
            .as_f64()
            .map(|_| ())
    })
    .await;
    drop(a);
    first.stop().await;
    second.wait_leader().await;
    let nodes = second.get("/api/v1/nodes").await;
    assert_eq!(nodes[0]["id"], "n1", "{nodes}");
    assert!(nodes[0]["last_heartbeat_s"].is_null(), "{nodes}");
    let mut a = Agent::connect(second.agent_addr, register("n1"))
        .await
        .unwrap();
    a.keep_alive();
    eventually(&second, "the node heard by the new leader", || async {
        second.get("/api/v1/nodes").await[0]["last_heartbeat_s"]
            .as_f64()
            .map(|_| ())
    })
    .await;
    second.stop().await;
}

/// A model held back after failures is the leader's reconciler's to
/// know: a standby said it waited for a place. `ctl models` at a standby
/// asks the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_says_a_model_backs_off_as_the_leader_does() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let leader = Server::start_advertised(&addr, fast("first", vec![sim_model("chat", 1)])).await;
    leader.wait_leader().await;
    let standby = Server::start_advertised(&addr, fast("second", vec![sim_model("chat", 1)])).await;
    let mut a = Agent::connect(leader.agent_addr, register("n1"))
        .await
        .unwrap();
    a.keep_alive();
    let start = a.next_start().await;
    a.report_failed(&start, "the engine exited").await;
    async fn backing_off(s: &Server) -> Option<String> {
        let rows = s.get("/api/v1/models").await;
        let failure = rows[0]["last_failure"].as_str()?.to_owned();
        failure
            .contains("backing off after failures")
            .then_some(failure)
    }
    eventually(&leader, "the leader to back off", || backing_off(&leader)).await;
    eventually(&standby, "the standby to say so", || backing_off(&standby)).await;
    standby.stop().await;
    leader.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordon_stops_new_placement_and_drain_moves_the_replica_replacement_first() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let s = Server::start(&addr, fast("a", vec![sim_model("chat", 1)])).await;
    s.wait_leader().await;
    let mut a = Agent::connect(s.agent_addr, register("a")).await.unwrap();
    a.keep_alive();
    let first = a.next_start().await;
    a.report(&first, Wire::Ready).await;
    let mut b = Agent::connect(s.agent_addr, register("b")).await.unwrap();
    b.keep_alive();
    assert!(matches!(b.next().await, Msg::Ack(_)));

    let (code, body) = s.post("/api/v1/nodes/b/cordon").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["events"][0], "NodeCordoned");
    let e = s.get("/api/v1/explain?model=chat").await;
    let b_row = e["profiles"][0]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["node"] == "b")
        .unwrap()
        .clone();
    assert_eq!(b_row["reason"], "cordoned");
    let (_, again) = s.post("/api/v1/nodes/b/cordon").await;
    assert!(again["events"].as_array().unwrap().is_empty());
    s.post("/api/v1/nodes/b/uncordon").await;

    let (code, body) = s.post("/api/v1/nodes/a/drain").await;
    assert_eq!(code, 200, "{body}");
    let replacement = b.next_start().await;
    // The original is not touched until the replacement serves.
    s.passes(3).await;
    assert_eq!(count(&s, "ReplicaDraining").await, 0);
    b.report(&replacement, Wire::Ready).await;
    loop {
        match a.next().await {
            Msg::Drain(d) => assert_eq!(d.shard_id, first.shard_id),
            Msg::Stop(st) => {
                assert_eq!(st.shard_id, first.shard_id);
                break;
            }
            _ => {}
        }
    }
    eventually(&s, "the drain finishes", || async {
        let n = s.get("/api/v1/nodes").await;
        let a_row = n
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == "a")
            .unwrap()
            .clone();
        (a_row["draining"] == false && a_row["cordoned"] == true).then_some(())
    })
    .await;
    let (code, _) = s.post("/api/v1/nodes/zz/cordon").await;
    assert_eq!(code, 404);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weights_download_shows_in_the_replicas_until_the_shard_moves_on() {
    let (addr, _db) = Scratch::new(Backend::Sqlite).await;
    let s = Server::start(&addr, fast("a", vec![sim_model("chat", 1)])).await;
    s.wait_leader().await;
    let mut agent = Agent::connect(s.agent_addr, register("n1")).await.unwrap();
    agent.keep_alive();
    let start = agent.next_start().await;
    agent.report_fetch(&start, 50_000_000, 200_000_000).await;
    let fetch = eventually(&s, "the progress is visible", || async {
        let r = s.get("/api/v1/replicas").await;
        let f = r[0]["shards"][0]["fetch"].clone();
        (!f.is_null()).then_some(f)
    })
    .await;
    assert_eq!(fetch["bytes_done"], 50_000_000);
    assert_eq!(fetch["bytes_total"], 200_000_000);
    agent.report(&start, Wire::Starting).await;
    eventually(&s, "gone once the shard starts", || async {
        let r = s.get("/api/v1/replicas").await;
        (r[0]["shards"][0]["fetch"].is_null() && r[0]["shards"][0]["state"] == "starting")
            .then_some(())
    })
    .await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_is_gone_stops_acting_at_its_next_renewal() {
    use llmgw_eventstore::EventStore;
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let a = Server::start(&addr, fast("a", vec![])).await;
    a.wait_leader().await;
    let mut agent = Agent::connect(a.agent_addr, register("n1")).await.unwrap();
    assert!(matches!(agent.next().await, Msg::Ack(_)));
    // The lease vanishes under it (an operator, a clock, a partition).
    let token = a.cp.leadership().borrow().clone().unwrap();
    assert!(a.store.release_lease(&token).await.unwrap());
    let mut l = a.cp.leadership();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        l.wait_for(|t| t.is_none()),
    )
    .await
    .expect("it stops acting within a renewal")
    .unwrap();
    // Its agents are sent on (their stream ends), and it decides nothing.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            match agent.try_next().await {
                None => return,
                Some(_) => continue,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the agent's stream was closed");
    // The lease is free again, so it takes office anew: under a new epoch,
    // after catching up, never with the old token.
    let mut l = a.cp.leadership();
    let again = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        l.wait_for(|t| t.is_some()),
    )
    .await
    .expect("it leads again")
    .unwrap()
    .clone()
    .unwrap();
    assert!(again.epoch > token.epoch, "{again:?} after {token:?}");
    a.stop().await;
}

/// An on-demand model asked of a standby is placed by the leader as soon
/// as the ask reaches its views, not at its next interval: the client
/// waits meanwhile (a cold start through a standby took 8 s more than
/// through the leader). The leader's interval here is an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demand_recorded_by_a_standby_is_acted_on_at_once() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let slow = llmgw_control::ControlConfig {
        interval: std::time::Duration::from_secs(3600),
        ..fast("first", vec![sim_model("lazy", 0)])
    };
    let leader = Server::start(&addr, slow).await;
    leader.wait_leader().await;
    let standby = Server::start(&addr, fast("second", vec![sim_model("lazy", 0)])).await;
    let mut a = Agent::connect(leader.agent_addr, register("n1"))
        .await
        .unwrap();
    a.keep_alive();
    assert!(matches!(a.next().await, Msg::Ack(_)));
    standby.cp.demand("lazy");
    let start = a.next_start().await;
    assert_eq!(start.model, "lazy");
    standby.stop().await;
    leader.stop().await;
}

/// A server taking office reads back the asks for on-demand models with
/// the times the log recorded them: one made moments ago, within the
/// model's idle time, starts the model there. (That one older than the
/// idle time starts nothing is `reconciler::tests`: it needs the clock
/// to pass.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_starts_a_model_asked_for_lately_by_the_logs_time() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let first = Server::start(&addr, fast("first", vec![sim_model("lazy", 0)])).await;
    first.wait_leader().await;
    let second = Server::start(&addr, fast("second", vec![sim_model("lazy", 0)])).await;
    // Asked of the standby while no node can take it.
    second.cp.demand("lazy");
    eventually(&first, "the ask is in the log", || async {
        types(&first.events().await)
            .contains(&"ModelDemanded")
            .then_some(())
    })
    .await;
    first.stop().await;
    second.wait_leader().await;
    let mut a = Agent::connect(second.agent_addr, register("n1"))
        .await
        .unwrap();
    a.keep_alive();
    assert_eq!(a.next_start().await.model, "lazy");
    second.stop().await;
}

/// `status` counts what waits for a place model by model, and a standby,
/// which cannot know the leader's asks for on-demand models, counts a
/// running one as wanted: one model's running replica hid another's
/// missing one, and the standby said fewer were wanted than ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_what_waits_model_by_model_on_either_server() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let mut big = sim_model("big", 1);
    big.profiles[0]
        .node_selector
        .insert("zone".into(), "mars".into());
    let models = vec![sim_model("lazy", 0), big];
    let leader = Server::start(&addr, fast("first", models.clone())).await;
    leader.wait_leader().await;
    let standby = Server::start(&addr, fast("second", models)).await;
    let mut a = Agent::connect(leader.agent_addr, register("n1"))
        .await
        .unwrap();
    a.keep_alive();
    leader.cp.demand("lazy");
    let start = a.next_start().await;
    a.report(&start, Wire::Ready).await;
    for s in [&leader, &standby] {
        let status = eventually(s, "the on-demand replica ready", || async {
            let st = s.get("/api/v1/status").await;
            (st["replicas_ready"] == 1).then_some(st)
        })
        .await;
        assert_eq!(
            (&status["replicas_wanted"], &status["replicas_waiting"]),
            (&serde_json::json!(2), &serde_json::json!(1)),
            "{status}"
        );
    }
    standby.stop().await;
    leader.stop().await;
}
