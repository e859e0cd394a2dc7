//! Agents obey only the current leader (issue 14 §2), the control plane's
//! half: every message carries the lease epoch, and a leader that meets an
//! agent who has seen a higher one asks the store, stepping down at once
//! when its lease does not renew, or telling the agent to follow its epoch
//! when it does (the store went back).

use std::time::Duration;

use llmgw_api::v1::{self, agent_message, control_message::Msg};
use llmgw_eventstore::EventStore;
use llmgw_testkit::{Backend, Scratch};

use crate::harness::{Agent, Server, fast, register, sim_model};

fn epoch(s: &Server) -> u64 {
    s.cp.leadership().borrow().clone().expect("leading").epoch
}

/// Timings where the leader renews only every 20 s: whatever it notices
/// sooner, it learned from an agent.
fn slow_renewal(instance: &str) -> llmgw_control::ControlConfig {
    llmgw_control::ControlConfig {
        lease_ttl: Duration::from_secs(60),
        ..fast(instance, vec![])
    }
}

/// Takes the lease from `s` behind its back, as another server would once
/// `s` had been paused past its lease: the epoch after `s`'s.
async fn depose(s: &Server) -> u64 {
    let token = s.cp.leadership().borrow().clone().expect("leading");
    assert!(s.store.release_lease(&token).await.unwrap());
    let other = s
        .store
        .acquire_lease("b", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(other.token.epoch, token.epoch + 1);
    other.token.epoch
}

async fn steps_down(s: &Server) {
    let mut l = s.cp.leadership();
    tokio::time::timeout(Duration::from_secs(5), l.wait_for(Option::is_none))
        .await
        .expect("the deposed leader stops acting within 5 s, not at its next renewal (20 s)")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_to_an_agent_carries_the_leaders_epoch() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let s = Server::start(&addr, fast("a", vec![sim_model("chat", 1)])).await;
    s.wait_leader().await;
    let e = epoch(&s);
    assert!(e > 0);
    let mut agent = Agent::connect(s.agent_addr, register("n1")).await.unwrap();
    agent.keep_alive();
    let ack = agent.next_whole().await;
    assert_eq!(ack.epoch, e);
    assert!(matches!(ack.msg, Some(Msg::Ack(a)) if a.ok && !a.epoch_lowered));
    let start = agent.next_whole().await;
    assert!(matches!(start.msg, Some(Msg::Start(_))), "{start:?}");
    assert_eq!(start.epoch, e, "a start carries the epoch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_store_went_back_tells_the_agent_to_follow_its_epoch() {
    let (addr, _db) = Scratch::new(Backend::Sqlite).await;
    let s = Server::start(&addr, fast("a", vec![])).await;
    s.wait_leader().await;
    let e = epoch(&s);
    // An agent that saw epoch e + 100: of another store, or of this one
    // before it was restored from an older copy.
    let reg = v1::Register {
        epoch_seen: e + 100,
        ..register("n1")
    };
    let mut agent = Agent::connect(s.agent_addr, reg).await.unwrap();
    let ack = agent.next_whole().await;
    assert_eq!(ack.epoch, e);
    assert!(
        matches!(ack.msg, Some(Msg::Ack(a)) if a.ok && a.epoch_lowered),
        "the agent is told to follow the store's epoch"
    );
    assert!(s.cp.is_leader(), "the store renewed this leader's lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_that_meets_a_higher_epoch_at_registration_refuses_and_stops_acting() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let s = Server::start(&addr, slow_renewal("a")).await;
    s.wait_leader().await;
    let newer = depose(&s).await;
    assert!(s.cp.is_leader(), "it does not know yet");
    let reg = v1::Register {
        epoch_seen: newer,
        ..register("n1")
    };
    let refused = Agent::connect(s.agent_addr, reg)
        .await
        .err()
        .expect("the deposed leader refuses the stream");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    steps_down(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_told_by_an_agent_that_refused_its_command_stops_acting() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let s = Server::start(&addr, slow_renewal("a")).await;
    s.wait_leader().await;
    let old = epoch(&s);
    let mut agent = Agent::connect(s.agent_addr, register("n1")).await.unwrap();
    agent.keep_alive();
    assert!(matches!(agent.next().await, Msg::Ack(_)));
    let newer = depose(&s).await;
    agent
        .say(agent_message::Msg::Refused(v1::CommandRefused {
            command: "start".into(),
            shard_id: "s-1".into(),
            epoch: old,
            highest: newer,
        }))
        .await;
    steps_down(&s).await;
    assert!(
        tokio::time::timeout(Duration::from_secs(5), agent.try_next())
            .await
            .expect("the stream ends")
            .is_none(),
        "a deposed leader keeps no agent's stream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standbys_refusal_names_the_lease_epoch() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let leader = Server::start(&addr, fast("a", vec![])).await;
    leader.wait_leader().await;
    let standby = Server::start(&addr, fast("b", vec![])).await;
    let refused = Agent::connect(standby.agent_addr, register("n1"))
        .await
        .err()
        .expect("a standby refuses");
    let named = refused
        .metadata()
        .get(llmgw_api::refusal::EPOCH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    assert_eq!(named, Some(epoch(&leader)), "{refused:?}");
}

/// Two servers given one `control.instance` (a copied configuration): the
/// second does not take the lease under the first's name, which would
/// depose the first, and the first it in turn, for ever; it stands by, and
/// leads once the first has stepped down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_under_the_leaders_name_stands_by_instead_of_deposing_it() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let first = Server::start(&addr, fast("twin", vec![])).await;
    first.wait_leader().await;
    let e = epoch(&first);
    let second = Server::start(&addr, fast("twin", vec![])).await;
    // Long enough for the second's lease polls (every 50 ms) and two of
    // the first's renewals (every second).
    first.passes(25).await;
    assert_eq!(
        epoch(&first),
        e,
        "the first leads under its own epoch still"
    );
    assert!(second.cp.leadership().borrow().is_none());
    assert_eq!(first.store.lease_info().await.unwrap().epoch, e);
    first.stop().await;
    second.wait_leader().await;
    assert!(epoch(&second) > e);
}
