//! `engines:` (configuration, not events): every agent stream is told
//! what to install, and what the agents report is the leader's observed
//! state, shown on the nodes API.

use std::time::Duration;

use llmgw_api::v1::{self, agent_message};
use llmgw_testkit::{Backend, Scratch};

use super::harness::{Agent, Server, eventually, fast, register};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_is_told_the_engines_and_their_reports_show_on_the_node() {
    let (addr, _db) = Scratch::new(Backend::Sqlite).await;
    let mut config = fast("a", vec![]);
    let want = v1::EngineWant {
        engine: "llamacpp".into(),
        version: "b1".into(),
        source: "https://files.example/{asset}".into(),
        manifest: String::new(),
        sha256: [(
            "llama-b1-bin-ubuntu-x64.tar.gz".to_string(),
            "ab".repeat(32),
        )]
        .into(),
    };
    config.engines = vec![want.clone()];
    let s = Server::start(&addr, config).await;
    s.wait_leader().await;
    let mut agent = Agent::connect(s.agent_addr, register("n1")).await.unwrap();
    let provision = tokio::time::timeout(Duration::from_secs(10), agent.provision())
        .await
        .expect("a Provision on the new stream");
    assert_eq!(provision.engines, vec![want.clone()]);
    let status = |state: &str, detail: &str| v1::ProvisionStatus {
        engine: "llamacpp".into(),
        version: "b1".into(),
        variant: "cpu".into(),
        state: state.into(),
        detail: detail.into(),
    };
    let beat = |changed: bool, p: Vec<v1::ProvisionStatus>| {
        agent_message::Msg::Heartbeat(v1::Heartbeat {
            node_id: "n1".into(),
            provision_changed: changed,
            provision: p,
            ..v1::Heartbeat::default()
        })
    };
    agent
        .say(beat(
            true,
            vec![status("failed", "libgomp.so.1 is not installed")],
        ))
        .await;
    eventually(&s, "the failure on the node", || async {
        let nodes = s.get("/api/v1/nodes").await;
        (nodes[0]["provision"][0]["detail"] == "libgomp.so.1 is not installed").then_some(())
    })
    .await;
    // A heartbeat that says nothing changed leaves the report; a change
    // replaces it.
    agent.say(beat(false, vec![])).await;
    agent
        .say(beat(true, vec![status("ready", "llama-server version: 1")]))
        .await;
    eventually(&s, "ready on the node", || async {
        let nodes = s.get("/api/v1/nodes").await;
        let p = &nodes[0]["provision"];
        (p.as_array().map(Vec::len) == Some(1) && p[0]["state"] == "ready").then_some(())
    })
    .await;
    // A reconnecting agent is told again.
    drop(agent);
    let mut again = Agent::connect(s.agent_addr, register("n1")).await.unwrap();
    let provision = tokio::time::timeout(Duration::from_secs(10), again.provision())
        .await
        .expect("told again");
    assert_eq!(provision.engines, vec![want]);
    s.stop().await;
}
