use llmgw_domain::audit::AuditEvent;
use llmgw_domain::catalog::{CatalogCommand, Model};
use llmgw_domain::nodes::NodeCommand;
use llmgw_domain::tenancy::{Limits, Scope, TenancyCommand as T};
use llmgw_domain::{Command, Event, State};

#[test]
fn a_command_names_the_stream_its_events_go_to() {
    let mut state = State::default();
    let commands = [
        Command::Tenancy(T::CreateOrg {
            org_id: "o".into(),
            name: "Acme".into(),
        }),
        Command::Tenancy(T::CreateTeam {
            team_id: "t".into(),
            org_id: "o".into(),
            name: "ML".into(),
        }),
        Command::Tenancy(T::CreateProject {
            project_id: "p".into(),
            team_id: "t".into(),
            name: "chat".into(),
        }),
        Command::Tenancy(T::IssueKey(crate::tenancy::key("key-1", "p"))),
        Command::Tenancy(T::SetLimits {
            scope: Scope::Key,
            scope_id: "key-1".into(),
            limits: Limits {
                rpm: Some(5),
                ..Limits::default()
            },
        }),
        Command::Tenancy(T::RevokeKey {
            key_id: "key-1".into(),
            by: "ops".into(),
        }),
        Command::Catalog(CatalogCommand::AddModel(Model::named("llama"))),
        Command::Node(NodeCommand::Register {
            node_id: "n1".into(),
            inventory: crate::nodes::inventory(1),
        }),
    ];
    for c in commands {
        let target = c.target();
        let events = state.decide(c.clone()).unwrap();
        assert!(!events.is_empty(), "{c:?} changes something");
        assert_eq!(events[0].stream_id(), target, "{}", c.describe());
        for e in &events {
            state.evolve(e);
        }
    }
}

#[test]
fn a_description_is_one_line_without_secrets() {
    let key = crate::tenancy::key("key-1", "p");
    let issue = Command::Tenancy(T::IssueKey(key.clone()));
    assert_eq!(
        issue.describe(),
        "IssueKey key-1 named \"ci-key-1\" in project p"
    );
    assert!(!issue.describe().contains(&key.hash));
    let revoke = Command::Tenancy(T::RevokeKey {
        key_id: "key-1".into(),
        by: "ops".into(),
    });
    assert_eq!(revoke.describe(), "RevokeKey key-1");
    assert_eq!(revoke.target(), "key-key-1");
    assert_eq!(
        Command::Catalog(CatalogCommand::ApplyModels(vec![])).target(),
        "catalog"
    );
}

#[test]
fn a_refusal_is_filed_next_to_what_it_was_about() {
    let refused = Event::Audit(AuditEvent::CommandRefused {
        actor: "alice".into(),
        command: "RevokeKey key-1".into(),
        target: "key-key-1".into(),
        reason: "no key key-1".into(),
    });
    assert_eq!(refused.stream_id(), "audit-key-key-1");
    let (kind, version, _) = refused.encode();
    assert_eq!((kind.as_str(), version), ("CommandRefused", 1));
    let mut state = State::default();
    state.evolve(&refused);
    assert_eq!(state, State::default(), "a refusal changes no decision");
}
