//! Periodic anchors: the leader records the chain head in the log every N
//! events (or T), hands each to its sinks signed with the server's key,
//! and records its timings when it takes office.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use llmgw_control::anchor::{ANCHOR_CONTEXT, AnchorConfig};
use llmgw_domain::Event;
use llmgw_domain::event::LeadershipEvent;
use llmgw_eventstore::signing::{Checked, Signature, SigningKey, generate};
use llmgw_eventstore::{EventStore, hash};
use llmgw_testkit::{Backend, Scratch};
use serde_json::Value;

use super::harness::{Agent, Server, eventually, fast, register};

fn decode(e: &llmgw_eventstore::RecordedEvent) -> Event {
    Event::decode(&e.event_type, e.schema_version, &e.payload).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_few_events_the_leader_anchors_the_head_in_the_log_and_in_its_signed_sinks() {
    let (addr, _db) = Scratch::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let key = Arc::new(SigningKey::parse(&generate().unwrap()).unwrap());
    let public = key.public();
    let file = dir.path().join("anchors.jsonl");
    let from_command = dir.path().join("command.jsonl");
    let mut config = fast("a", vec![]);
    config.anchors = AnchorConfig {
        every_events: Some(3),
        every: None,
        file: Some(file.clone()),
        command: Some(format!(
            "cat >> {0}; echo \"$LLMGW_ANCHOR\" >> {0}.env",
            from_command.display()
        )),
        key: Some(key),
    };
    let s = Server::start(&addr, config).await;
    s.wait_leader().await;
    // Office is taken with the timings recorded.
    let events = s.events().await;
    let Event::Leadership(LeadershipEvent::LeadershipAcquired { settings, .. }) =
        decode(&events[0])
    else {
        panic!("the log begins with LeadershipAcquired: {events:?}");
    };
    let settings = settings.expect("the timings are recorded");
    assert_eq!(
        (
            settings.unreachable_after_ms,
            settings.lost_after_ms,
            settings.reconcile_interval_ms
        ),
        (600, 1500, 100)
    );
    assert_eq!(settings.anchor_every_events, Some(3));

    let mut agents = Vec::new();
    for n in ["n1", "n2", "n3"] {
        let mut a = Agent::connect(s.agent_addr, register(n)).await.unwrap();
        a.keep_alive();
        agents.push(a);
    }
    // Both sinks: the command runs on its own, a moment after the file
    // is written (its .env line is its last write).
    let env_file = format!("{}.env", from_command.display());
    let anchors = eventually(&s, "an anchor in the log and both sinks", || async {
        let lines = std::fs::read_to_string(&file).unwrap_or_default();
        let by_command = std::fs::read_to_string(&env_file).unwrap_or_default();
        let events = s.events().await;
        let anchors: Vec<_> = events
            .iter()
            .filter(|e| e.event_type == "AnchorRecorded")
            .cloned()
            .collect();
        (!anchors.is_empty()
            && lines.lines().count() >= anchors.len()
            && by_command.lines().count() >= anchors.len())
        .then_some(anchors)
    })
    .await;
    let first = &anchors[0];
    assert_eq!(first.stream_id, "anchors");
    let Event::Leadership(LeadershipEvent::AnchorRecorded { position, hash: h }) = decode(first)
    else {
        panic!("{first:?}");
    };
    assert!(position >= 3 && position < first.position, "{position}");
    let stored = s.store.hash_at(position).await.unwrap().unwrap();
    assert_eq!(h, hash::to_hex(&stored), "the anchor is the head it saw");

    // The sinks got the same anchor, signed by the server's key.
    let line: Value = serde_json::from_str(
        std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(line["anchor"], format!("{h}@{position}"));
    assert_eq!(line["event"], first.position);
    let mut unsigned = line.clone();
    let sig: Signature = serde_json::from_value(
        unsigned
            .as_object_mut()
            .unwrap()
            .remove("signature")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        sig.check(ANCHOR_CONTEXT, &unsigned, Some(&public)),
        Ok(Checked::Proven(public))
    );
    let by_command = std::fs::read_to_string(&from_command).unwrap();
    assert_eq!(
        by_command
            .lines()
            .next()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()),
        Some(line.clone())
    );
    let env = std::fs::read_to_string(&env_file).unwrap();
    assert_eq!(env.lines().next(), Some(format!("{h}@{position}").as_str()));
    assert_eq!(s.cp.anchor_stats.sink_failures.load(Ordering::Relaxed), 0);

    // An anchor is not itself counted: a quiet log gets no more of them.
    let n = s
        .events()
        .await
        .iter()
        .filter(|e| e.event_type == "AnchorRecorded")
        .count();
    s.passes(5).await;
    let later = s.events().await;
    let after_last = later
        .iter()
        .rev()
        .take_while(|e| e.event_type != "AnchorRecorded")
        .count();
    assert!(after_last < 3, "{after_last} events after the last anchor");
    assert!(
        later
            .iter()
            .filter(|e| e.event_type == "AnchorRecorded")
            .count()
            >= n
    );
    drop(agents);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anchor_is_taken_in_time_and_a_failing_sink_is_counted_not_fatal() {
    let (addr, _db) = Scratch::new(Backend::Sqlite).await;
    let mut config = fast("a", vec![]);
    config.anchors = AnchorConfig {
        every_events: None,
        every: Some(Duration::from_secs(1)),
        file: None,
        command: Some("echo refused >&2; exit 3".into()),
        key: None,
    };
    let s = Server::start(&addr, config).await;
    s.wait_leader().await;
    let mut agent = Agent::connect(s.agent_addr, register("n1")).await.unwrap();
    agent.keep_alive();
    eventually(&s, "a timed anchor whose sink failed", || async {
        let anchored = s
            .events()
            .await
            .iter()
            .any(|e| e.event_type == "AnchorRecorded");
        (anchored && s.cp.anchor_stats.sink_failures.load(Ordering::Relaxed) >= 1).then_some(())
    })
    .await;
    assert!(s.cp.anchor_stats.recorded.load(Ordering::Relaxed) >= 1);
    drop(agent);
    s.stop().await;
}
