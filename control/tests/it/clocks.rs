//! The backoff and drain clocks survive a failover (issue 14 §3): they are
//! read from the log, so a new leader continues its predecessor's instead
//! of starting them again from its own office.

use std::time::Duration;

use llmgw_api::v1::control_message::Msg;
use llmgw_api::v1::shard_status::State as Wire;
use llmgw_eventstore::RecordedEvent;
use llmgw_testkit::{Backend, Scratch};

use crate::harness::{Agent, Server, eventually, fast, register, running, sim_model};

fn config(instance: &str, min: u32) -> llmgw_control::ControlConfig {
    llmgw_control::ControlConfig {
        base_backoff: Duration::from_secs(3),
        max_backoff: Duration::from_secs(3),
        drain_grace: Duration::from_secs(4),
        ..fast(instance, vec![sim_model("chat", min)])
    }
}

/// When the log recorded the first event of `kind` (after `from`) that
/// `pick` accepts.
fn when(
    events: &[RecordedEvent],
    kind: &str,
    pick: impl Fn(&RecordedEvent) -> bool,
) -> Option<chrono::DateTime<chrono::Utc>> {
    events
        .iter()
        .find(|e| e.event_type == kind && pick(e))
        .map(|e| e.recorded_at)
}

fn ms(d: chrono::TimeDelta) -> i64 {
    d.num_milliseconds()
}

/// The last `LeadershipAcquired`: when the new leader took office.
fn office(events: &[RecordedEvent]) -> chrono::DateTime<chrono::Utc> {
    events
        .iter()
        .rfind(|e| e.event_type == "LeadershipAcquired")
        .unwrap()
        .recorded_at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_waits_out_the_backoff_its_predecessor_began() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let first = Server::start(&addr, config("a", 1)).await;
    first.wait_leader().await;
    let second = Server::start(&addr, config("b", 1)).await;
    let mut agent = Agent::connect(first.agent_addr, register("n1"))
        .await
        .unwrap();
    agent.keep_alive();
    let start = agent.next_start().await;
    agent.report(&start, Wire::Failed).await;
    eventually(&first, "the failed replica is stopped", || async {
        let events = first.events().await;
        when(&events, "ReplicaStopped", |_| true).map(|_| ())
    })
    .await;
    drop(agent);
    first.stop().await;
    second.wait_leader().await;
    let mut agent = Agent::connect(second.agent_addr, register("n1"))
        .await
        .unwrap();
    agent.keep_alive();
    let rebuilt = agent.next_start().await;
    assert_ne!(rebuilt.replica_id, start.replica_id);

    let events = second.events().await;
    let failed = when(&events, "ReplicaFailed", |_| true).unwrap();
    let placed = when(&events, "ReplicaPlaced", |e| {
        e.payload["replica_id"] == rebuilt.replica_id.as_str()
    })
    .unwrap();
    let took_office = office(&events);
    // 3 s for a first failure, jittered by at most a fifth.
    assert!(
        ms(took_office - failed) < 2_000,
        "the new leader was in office well inside the backoff"
    );
    assert!(
        ms(placed - failed) >= 2_400,
        "rebuilt {} ms after the failure: the new leader started the backoff again or ignored it",
        ms(placed - failed)
    );
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_stops_a_drained_replica_when_its_predecessors_grace_runs_out() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let first = Server::start(&addr, config("a", 1)).await;
    first.wait_leader().await;
    let second = Server::start(&addr, config("b", 1)).await;
    let mut a = Agent::connect(first.agent_addr, register("a"))
        .await
        .unwrap();
    a.keep_alive();
    let original = a.next_start().await;
    a.report(&original, Wire::Ready).await;
    let mut b = Agent::connect(first.agent_addr, register("b"))
        .await
        .unwrap();
    b.keep_alive();
    assert!(matches!(b.next().await, Msg::Ack(_)));
    // Drain node a: the replacement on b serves, then the original drains.
    let (code, body) = first.post("/api/v1/nodes/a/drain").await;
    assert_eq!(code, 200, "{body}");
    let replacement = b.next_start().await;
    b.report(&replacement, Wire::Ready).await;
    loop {
        if let Msg::Drain(d) = a.next().await {
            assert_eq!(d.shard_id, original.shard_id);
            break;
        }
    }
    // Half the grace passes under the first leader: the scenario's own
    // time, not a wait for something to happen.
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop((a, b));
    first.stop().await;
    second.wait_leader().await;
    let mut reg_a = register("a");
    reg_a.running_shards = vec![running(&original)];
    let mut a = Agent::connect(second.agent_addr, reg_a).await.unwrap();
    a.keep_alive();
    let mut reg_b = register("b");
    reg_b.running_shards = vec![running(&replacement)];
    let mut b = Agent::connect(second.agent_addr, reg_b).await.unwrap();
    b.keep_alive();
    loop {
        if let Msg::Stop(st) = a.next().await {
            assert_eq!(st.shard_id, original.shard_id);
            break;
        }
    }
    assert!(matches!(b.next().await, Msg::Ack(_)));

    let events = second.events().await;
    let is_original = |e: &RecordedEvent| e.payload["replica_id"] == original.replica_id.as_str();
    let draining = when(&events, "ReplicaDraining", is_original).unwrap();
    let stopped = when(&events, "ReplicaStopped", is_original).unwrap();
    let took_office = office(&events);
    assert!(
        ms(stopped - draining) >= 4_000,
        "stopped {} ms into a 4 s grace",
        ms(stopped - draining)
    );
    // The new leader took office 2 s into the grace: starting it again
    // would have stopped the replica 4 s after that.
    assert!(
        ms(stopped - took_office) < 3_500,
        "stopped {} ms after the new leader took office ({} ms into the grace): the grace began again",
        ms(stopped - took_office),
        ms(stopped - draining)
    );
    second.stop().await;
}
