//! Every event names who wrote it and why; refused operator commands are
//! recorded too.

use llmgw_decider::{Actor, DecideError, Origin};
use llmgw_domain::event::LeadershipEvent;
use llmgw_domain::tenancy::TenancyCommand as T;
use llmgw_domain::{Command, Event, RejectionCode};
use serde_json::json;

use crate::{BACKENDS, key, leader, log, of_type, operator, store, with_key};

#[tokio::test]
async fn every_event_names_its_writer_actor_and_command() {
    for backend in BACKENDS {
        let (store, _scratch) = store(backend).await;
        let (d, writer) = with_key(&store).await;
        let alice = operator("alice");
        d.execute(
            &writer,
            &alice,
            vec![Command::Tenancy(T::IssueKey(key("k2", "batch")))],
        )
        .await
        .unwrap();
        let gateway = Origin::new(Actor::Gateway("gw-1".into()));
        d.observe(
            &gateway,
            vec![Event::Demand(
                llmgw_domain::demand::DemandEvent::ModelDemanded {
                    model: "llama".into(),
                },
            )],
        )
        .await
        .unwrap();
        let ctl = leader();
        d.record(
            &writer,
            &ctl,
            Event::Leadership(LeadershipEvent::LeadershipReleased {
                holder: "ctl".into(),
                epoch: 1,
            }),
        )
        .await
        .unwrap();
        let events = log(&store).await;
        let meta = |t: &str| {
            events
                .iter()
                .rfind(|e| e.event_type == t)
                .unwrap()
                .metadata
                .clone()
        };
        assert_eq!(
            meta("KeyIssued"),
            json!({"writer": "ctl", "actor": "alice", "actor_kind": "operator", "command_id": alice.command_id}),
            "{backend:?}"
        );
        assert_eq!(
            meta("ModelDemanded"),
            json!({"writer": "ctl", "actor": "gw-1", "actor_kind": "gateway", "command_id": gateway.command_id})
        );
        assert_eq!(
            meta("LeadershipReleased"),
            json!({"writer": "ctl", "actor": "ctl", "actor_kind": "leader", "command_id": ctl.command_id})
        );
        // One command, one id, however many events it wrote.
        let tree: Vec<_> = events
            .iter()
            .filter(|e| {
                ["OrgCreated", "TeamCreated", "ProjectCreated"].contains(&e.event_type.as_str())
            })
            .map(|e| e.metadata["command_id"].clone())
            .collect();
        assert_eq!(tree.len(), 3);
        assert!(tree.iter().all(|id| *id == tree[0]));
    }
}

#[tokio::test]
async fn a_refused_operator_command_leaves_exactly_one_audit_event() {
    for backend in BACKENDS {
        let (store, _scratch) = store(backend).await;
        let (d, writer) = with_key(&store).await;
        let bob = operator("bob");
        let err = d
            .execute(
                &writer,
                &bob,
                vec![Command::Tenancy(T::IssueKey(key("k2", "ci")))],
            )
            .await
            .unwrap_err();
        let DecideError::Rejected(r) = &err else {
            panic!("{backend:?}: {err:?}");
        };
        assert_eq!(r.code, RejectionCode::Conflict);
        let refused = of_type(&store, "CommandRefused").await;
        assert_eq!(refused.len(), 1, "{backend:?}");
        assert_eq!(refused[0].stream_id, "audit-key-k2");
        assert_eq!(
            refused[0].payload,
            json!({
                "actor": "bob",
                "command": "IssueKey k2 named \"ci\" in project p",
                "target": "key-k2",
                "reason": "project p already has a key named ci: choose another name",
            })
        );
        assert_eq!(refused[0].metadata["command_id"], json!(bob.command_id));
        assert_eq!(of_type(&store, "KeyIssued").await.len(), 1, "nothing else");
        // The control plane's own refusals are routine, not an audit matter.
        let _ = d
            .execute(
                &writer,
                &leader(),
                vec![Command::Tenancy(T::RevokeKey {
                    key_id: "ghost".into(),
                    by: "ctl".into(),
                })],
            )
            .await
            .unwrap_err();
        assert_eq!(of_type(&store, "CommandRefused").await.len(), 1);
        // A refusal leaves the decider's state as the log has it.
        d.execute(
            &writer,
            &bob,
            vec![Command::Tenancy(T::IssueKey(key("k3", "other")))],
        )
        .await
        .unwrap();
    }
}
