use std::collections::BTreeSet;

use llmgw_domain::Event;
use llmgw_domain::catalog::{CatalogEvent, Model};
use llmgw_domain::event::LeadershipEvent;
use llmgw_domain::join::JoinEvent;
use llmgw_domain::nodes::NodeEvent;
use llmgw_domain::replicas::{ReplicaEvent, ShardState};
use llmgw_domain::tenancy::{Limits, Scope, TenancyEvent};
use llmgw_domain::usage::{UsageBatchRecorded, UsageEvent, UsageRecorded};
use llmgw_domain::{DecodeError, tenancy::Band};
use serde_json::json;

/// One of every event type.
pub(crate) fn every_event() -> Vec<Event> {
    let node = || "gpu-a-01".to_string();
    let rid = || "r1".to_string();
    let mut model = Model::named("llama");
    model
        .profiles
        .push(crate::catalog::gpu_profile("h100x2", 2, 1, 2));
    vec![
        Event::Catalog(CatalogEvent::ModelAdded {
            model: model.clone(),
        }),
        Event::Catalog(CatalogEvent::ModelUpdated { model }),
        Event::Catalog(CatalogEvent::ModelRemoved {
            name: "llama".into(),
        }),
        Event::Node(NodeEvent::NodeRegistered {
            node_id: node().into(),
            inventory: crate::nodes::inventory(2),
        }),
        Event::Node(NodeEvent::NodeInventoryChanged {
            node_id: node().into(),
            inventory: crate::nodes::inventory(4),
        }),
        Event::Node(NodeEvent::NodeUnreachable {
            node_id: node().into(),
        }),
        Event::Node(NodeEvent::NodeLost {
            node_id: node().into(),
        }),
        Event::Node(NodeEvent::NodeRecovered {
            node_id: node().into(),
        }),
        Event::Node(NodeEvent::NodeCordoned {
            node_id: node().into(),
            by: "ops".into(),
            reason: "fan".into(),
        }),
        Event::Node(NodeEvent::NodeUncordoned {
            node_id: node().into(),
            by: "ops".into(),
        }),
        Event::Node(NodeEvent::NodeDrainRequested {
            node_id: node().into(),
            by: "ops".into(),
        }),
        Event::Node(NodeEvent::NodeDrained {
            node_id: node().into(),
        }),
        Event::Replica(ReplicaEvent::ReplicaPlaced(crate::replicas::placement(
            "r1",
            &[("a", vec![0], 20000)],
        ))),
        Event::Replica(ReplicaEvent::ReplicaAdopted(crate::replicas::placement(
            "r2",
            &[("b", vec![0], 20000)],
        ))),
        Event::Replica(ReplicaEvent::ShardStateChanged {
            replica_id: rid().into(),
            shard_id: "r1-0".into(),
            state: ShardState::Failed,
            error: Some("oom".into()),
            exit_code: Some(137),
            log_tail: Some("killed".into()),
        }),
        Event::Replica(ReplicaEvent::ReplicaReady {
            replica_id: rid().into(),
        }),
        Event::Replica(ReplicaEvent::ReplicaFailed {
            replica_id: rid().into(),
            reason: "shard failed".into(),
        }),
        Event::Replica(ReplicaEvent::ReplicaDraining {
            replica_id: rid().into(),
            why: None,
        }),
        Event::Replica(ReplicaEvent::ReplicaStopped {
            replica_id: rid().into(),
            reason: "scale down".into(),
        }),
        Event::Tenancy(TenancyEvent::OrgCreated {
            org_id: "o".into(),
            name: "Acme".into(),
        }),
        Event::Tenancy(TenancyEvent::TeamCreated {
            team_id: "t".into(),
            org_id: "o".into(),
            name: "ML".into(),
        }),
        Event::Tenancy(TenancyEvent::ProjectCreated {
            project_id: "p".into(),
            team_id: "t".into(),
            name: "x".into(),
        }),
        Event::Tenancy(TenancyEvent::LimitsSet {
            scope: Scope::Project,
            scope_id: "p".into(),
            limits: Limits {
                rpm: Some(60),
                models: Some(vec![]),
                ..Limits::default()
            },
        }),
        Event::Tenancy(TenancyEvent::KeyIssued(crate::tenancy::key("k", "p"))),
        Event::Tenancy(TenancyEvent::KeyRotated {
            key_id: "k".into(),
            hash: "cd".repeat(32),
            prefix: "llmgw-sk-new".into(),
            previous_until: Some(llmgw_domain::time::UnixMillis(1_000)),
            by: "ops".into(),
        }),
        Event::Tenancy(TenancyEvent::KeyRevoked {
            key_id: "k".into(),
            by: "ops".into(),
        }),
        Event::Tenancy(TenancyEvent::UserSignedUp {
            user_id: "usr-1".into(),
        }),
        Event::Tenancy(TenancyEvent::UserApproved {
            user_id: "usr-1".into(),
            project_id: "p".into(),
            by: "ops".into(),
        }),
        Event::Tenancy(TenancyEvent::UserSuspended {
            user_id: "usr-1".into(),
            by: "ops".into(),
        }),
        Event::Tenancy(TenancyEvent::UserPromoted {
            user_id: "usr-1".into(),
            by: "ops".into(),
        }),
        Event::Tenancy(TenancyEvent::PasswordChanged {
            user_id: "usr-1".into(),
        }),
        Event::Tenancy(TenancyEvent::PasswordReset {
            user_id: "usr-1".into(),
            by: "ops".into(),
        }),
        Event::Tenancy(TenancyEvent::UserErased {
            user_id: "usr-1".into(),
            by: "ops".into(),
        }),
        Event::Tenancy(TenancyEvent::KeyClaimOffered {
            key_id: "k".into(),
            by: "ops".into(),
            until: Some(llmgw_domain::time::UnixMillis(1_800_000_000_000)),
        }),
        Event::Tenancy(TenancyEvent::KeyClaimed { key_id: "k".into() }),
        Event::Usage(UsageEvent::UsageRecorded(UsageRecorded {
            request_id: "req-1".into(),
            key_id: "k".into(),
            project_id: "p".into(),
            model_asked: "llama".into(),
            model_served: "llama".into(),
            prompt_tokens: 10,
            completion_tokens: 20,
            cost_micros: 3,
            status: 200,
            latency_ms: 100,
            ttft_ms: None,
            band: Band::Gold,
            at: llmgw_domain::UnixMillis(1),
        })),
        Event::Usage(UsageEvent::UsageBatchRecorded(UsageBatchRecorded {
            gateway: "gateway-a".into(),
            rows: vec![UsageRecorded {
                request_id: "req-2".into(),
                key_id: "k".into(),
                project_id: "p".into(),
                model_asked: "llama".into(),
                model_served: "llama".into(),
                prompt_tokens: 10,
                completion_tokens: 20,
                cost_micros: 3,
                status: 200,
                latency_ms: 100,
                ttft_ms: Some(12),
                band: Band::Gold,
                at: llmgw_domain::UnixMillis(2),
            }],
        })),
        Event::Leadership(LeadershipEvent::LeadershipAcquired {
            holder: "ctl-a".into(),
            epoch: 3,
            admin: None,
            agent: None,
            settings: Some(llmgw_domain::event::ControlSettings {
                lost_after_ms: 60_000,
                anchor_every_events: Some(1000),
                ..Default::default()
            }),
        }),
        Event::Leadership(LeadershipEvent::LeadershipReleased {
            holder: "ctl-a".into(),
            epoch: 3,
        }),
        Event::Leadership(LeadershipEvent::AnchorRecorded {
            position: 41,
            hash: "ab".repeat(32),
        }),
        Event::Demand(llmgw_domain::demand::DemandEvent::ModelDemanded {
            model: "llama".into(),
        }),
        Event::Audit(llmgw_domain::audit::AuditEvent::CommandRefused {
            actor: "alice".into(),
            command: "RevokeKey key-1".into(),
            target: "key-key-1".into(),
            reason: "no key key-1".into(),
        }),
        Event::Node(NodeEvent::NodeRemoved {
            node_id: node().into(),
            certificates: vec!["ab".repeat(32)],
        }),
        Event::Join(JoinEvent::JoinTokenIssued {
            token_id: "abababababab".into(),
            token_hash: "ab".repeat(32),
            node_id: Some(node().into()),
            expires_at: llmgw_domain::UnixMillis(1_700_000_000_000),
        }),
        Event::Join(JoinEvent::NodeJoined {
            token_id: "abababababab".into(),
            node_id: node().into(),
            certificate: "cd".repeat(32),
        }),
        Event::Tenancy(TenancyEvent::ThreadsSet {
            project_id: "p".into(),
            setting: Some(llmgw_domain::conversations::ThreadsSetting {
                capture: true,
                retain_hours: 24,
            }),
            by: "ops".into(),
        }),
        Event::Tenancy(TenancyEvent::MemorySet {
            project_id: "p".into(),
            setting: None,
            by: "ops".into(),
        }),
    ]
}

#[test]
fn every_event_type_round_trips_under_its_stable_name() {
    let events = every_event();
    let mut seen = BTreeSet::new();
    for e in &events {
        let (kind, version, payload) = e.encode();
        // A usage batch is in columns since version 2; every other type
        // is at its first.
        assert_eq!(version, if kind == "UsageBatchRecorded" { 2 } else { 1 });
        assert!(
            !payload.to_string().contains("\"type\""),
            "{kind}: the tag is not repeated in the payload"
        );
        let back =
            Event::decode(&kind, version, &payload).unwrap_or_else(|err| panic!("{kind}: {err}"));
        assert_eq!(&back, e);
        // Straight from the stored text too, as replay reads it, whatever
        // the spacing and key order the database gave it.
        let text = serde_json::to_string_pretty(&payload).unwrap();
        let from_text =
            Event::decode_json(&kind, version, &text).unwrap_or_else(|err| panic!("{kind}: {err}"));
        assert_eq!(&from_text, e);
        seen.insert(kind);
    }
    let known: BTreeSet<String> = Event::types().map(|(t, _)| t.to_owned()).collect();
    assert_eq!(seen, known, "the sample covers every type this build knows");
}

#[test]
fn stored_shapes_are_stable() {
    let (kind, _, payload) = Event::Node(NodeEvent::NodeCordoned {
        node_id: "n1".into(),
        by: "ops".into(),
        reason: "fan".into(),
    })
    .encode();
    assert_eq!(
        (kind.as_str(), payload),
        (
            "NodeCordoned",
            json!({"node_id": "n1", "by": "ops", "reason": "fan"})
        )
    );
}

#[test]
fn unknown_types_old_versions_and_bad_payloads_are_errors() {
    assert_eq!(
        Event::decode("NodeExploded", 1, &json!({})),
        Err(DecodeError::UnknownType("NodeExploded".into()))
    );
    assert!(matches!(
        Event::decode("NodeLost", 0, &json!({"node_id": "n"})),
        Err(DecodeError::Version {
            found: 0,
            current: 1,
            ..
        })
    ));
    let bad = Event::decode("NodeLost", 1, &json!({"node": "n"})).unwrap_err();
    assert!(
        bad.to_string()
            .starts_with("NodeLost: missing field `node_id`"),
        "{bad}"
    );
    // From text: the same refusals, and text that is not one JSON value.
    assert_eq!(
        Event::decode_json("NodeExploded", 1, "{}"),
        Err(DecodeError::UnknownType("NodeExploded".into()))
    );
    let bad = Event::decode_json("NodeLost", 1, r#"{"node": "n"}"#).unwrap_err();
    assert!(
        bad.to_string()
            .starts_with("NodeLost: missing field `node_id`"),
        "{bad}"
    );
    for text in [r#"{"node_id": "n"} {}"#, r#"{"node_id": "n""#, ""] {
        assert!(
            matches!(
                Event::decode_json("NodeLost", 1, text),
                Err(DecodeError::Payload { .. })
            ),
            "{text:?} is refused"
        );
    }
    assert_eq!(
        Event::decode_json("NodeLost", 1, r#" {"node_id": "n"} "#),
        Ok(Event::Node(NodeEvent::NodeLost {
            node_id: "n".into()
        }))
    );
}

#[test]
fn streams_group_events_by_the_thing_they_are_about() {
    let streams: Vec<String> = every_event().iter().map(Event::stream_id).collect();
    assert_eq!(streams[0], "model-llama");
    assert_eq!(streams[3], "node-gpu-a-01");
    assert_eq!(streams[12], "replica-r1");
    assert_eq!(streams[22], "project-p");
    assert_eq!(streams[23], "key-k");
    assert_eq!(streams[24], "key-k", "a rotation");
    assert_eq!(streams[31], "user-usr-1");
    assert_eq!(streams[33], "key-k");
    assert_eq!(streams[35], "usage-k");
    assert_eq!(streams[36], "usage-batches-gateway-a");
    assert_eq!(streams[37], "leadership");
    assert_eq!(streams[39], "anchors");
}

#[test]
fn usage_is_named_by_type_alone_and_leaves_the_decisions_state_as_it_was() {
    let every = every_event();
    let mut types = BTreeSet::new();
    for e in &every {
        let (event_type, ..) = e.encode();
        assert_eq!(
            Event::is_usage(&event_type),
            matches!(e, Event::Usage(_)),
            "{event_type}"
        );
        types.insert(event_type);
    }
    let known: BTreeSet<String> = Event::types().map(|(t, _)| t.to_owned()).collect();
    assert_eq!(types, known, "every type is in every_event()");
    // So the decider may skip them without decoding.
    let mut state = llmgw_domain::State::default();
    for e in every.iter().filter(|e| matches!(e, Event::Usage(_))) {
        state.evolve(e);
    }
    assert_eq!(state, llmgw_domain::State::default());
}
