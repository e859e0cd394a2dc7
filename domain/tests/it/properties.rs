//! Random command sequences across every area. Whatever the sequence:
//! replaying the accepted events from nothing gives the same state, a
//! rejected command changes nothing, every event survives its stored form,
//! and no GPU or port is held by two live replicas.

use llmgw_domain::catalog::{CatalogCommand, Engine, Model, Scaling};
use llmgw_domain::nodes::NodeCommand;
use llmgw_domain::replicas::{ReplicaCommand, ShardState};
use llmgw_domain::tenancy::{Limits, Period, Scope, TenancyCommand};
use llmgw_domain::{Command, Event, State};
use proptest::prelude::*;

fn name(prefix: &'static str, n: usize) -> impl Strategy<Value = String> {
    (0..n).prop_map(move |i| format!("{prefix}{i}"))
}

fn model() -> impl Strategy<Value = Model> {
    (
        name("m", 4),
        prop::collection::vec(name("a", 4), 0..2),
        prop::collection::vec(prop_oneof![name("m", 4), name("a", 4)], 0..2),
        (0u32..3, 1u32..3),
        (1u32..4, 1u32..3, 1u32..5),
        any::<bool>(),
    )
        .prop_map(
            |(n, aliases, fallbacks, (min, max), (tp, nodes, gpn), cpu)| {
                let mut m = Model::named(&n);
                m.aliases = aliases;
                m.fallbacks = fallbacks;
                m.scaling = Scaling {
                    min,
                    max,
                    idle_timeout_s: None,
                };
                let mut p = crate::catalog::gpu_profile("p", tp, nodes, gpn);
                if cpu {
                    p.gpu_class = None;
                    p.gpus_per_node = 0;
                    p.engine = if tp == 1 {
                        Engine::Llamacpp
                    } else {
                        Engine::Vllm
                    };
                }
                m.profiles.push(p);
                m
            },
        )
}

fn catalog() -> impl Strategy<Value = Command> {
    prop_oneof![
        model().prop_map(|m| Command::Catalog(CatalogCommand::AddModel(m))),
        model().prop_map(|m| Command::Catalog(CatalogCommand::UpdateModel(m))),
        name("m", 4).prop_map(|name| Command::Catalog(CatalogCommand::RemoveModel { name })),
    ]
}

fn node() -> impl Strategy<Value = Command> {
    let id = || name("n", 3);
    prop_oneof![
        (id(), 1u32..4).prop_map(|(node_id, g)| Command::Node(NodeCommand::Register {
            node_id: node_id.into(),
            inventory: crate::nodes::inventory(g)
        })),
        id().prop_map(|node_id| Command::Node(NodeCommand::Heartbeat {
            node_id: node_id.into()
        })),
        id().prop_map(|node_id| Command::Node(NodeCommand::MarkUnreachable {
            node_id: node_id.into()
        })),
        id().prop_map(|node_id| Command::Node(NodeCommand::MarkLost {
            node_id: node_id.into()
        })),
        id().prop_map(|node_id| Command::Node(NodeCommand::Cordon {
            node_id: node_id.into(),
            by: "ops".into(),
            reason: String::new()
        })),
        id().prop_map(|node_id| Command::Node(NodeCommand::Uncordon {
            node_id: node_id.into(),
            by: "ops".into()
        })),
        id().prop_map(|node_id| Command::Node(NodeCommand::Drain {
            node_id: node_id.into(),
            by: "ops".into()
        })),
    ]
}

fn replica() -> impl Strategy<Value = Command> {
    let state = prop_oneof![
        Just(ShardState::Starting),
        Just(ShardState::Loading),
        Just(ShardState::Ready),
        Just(ShardState::Failed),
        Just(ShardState::Stopped),
    ];
    prop_oneof![
        (
            name("r", 4),
            name("n", 3),
            prop::collection::btree_set(0u32..4, 1..3),
            20000u16..20003
        )
            .prop_map(|(id, node, gpus, port)| {
                let gpus: Vec<u32> = gpus.into_iter().collect();
                Command::Replica(ReplicaCommand::Place(crate::replicas::placement(
                    &id,
                    &[(&node, gpus, port)],
                )))
            }),
        (name("r", 4), state, any::<bool>()).prop_map(|(id, state, err)| Command::Replica(
            ReplicaCommand::ReportShard {
                shard_id: format!("{id}-0").into(),
                replica_id: id.into(),
                state,
                error: err.then(|| "boom".to_string()),
                exit_code: None,
                log_tail: None,
            }
        )),
        name("r", 4).prop_map(|replica_id| Command::Replica(ReplicaCommand::Drain {
            replica_id: replica_id.into(),
            why: None,
        })),
        name("r", 4).prop_map(|replica_id| Command::Replica(ReplicaCommand::Stop {
            replica_id: replica_id.into(),
            reason: "test".into()
        })),
    ]
}

fn tenancy() -> impl Strategy<Value = Command> {
    let limits = (
        prop::option::of(0u32..100),
        prop::option::of(1u64..10_000),
        any::<bool>(),
        prop::option::of(prop::collection::vec(name("m", 4), 0..3)),
    )
        .prop_map(|(rpm, budget, month, models)| Limits {
            rpm,
            tpm: None,
            budget_micros: budget,
            period: budget.map(|_| if month { Period::Month } else { Period::Day }),
            models,
        });
    let scope = prop_oneof![
        Just(Scope::Org).prop_flat_map(|s| name("o", 2).prop_map(move |id| (s, id))),
        Just(Scope::Team).prop_flat_map(|s| name("t", 2).prop_map(move |id| (s, id))),
        Just(Scope::Project).prop_flat_map(|s| name("p", 2).prop_map(move |id| (s, id))),
        Just(Scope::Key).prop_flat_map(|s| name("k", 3).prop_map(move |id| (s, id))),
    ];
    prop_oneof![
        name("o", 2).prop_map(|org_id| Command::Tenancy(TenancyCommand::CreateOrg {
            name: org_id.to_uppercase(),
            org_id
        })),
        (name("t", 2), name("o", 2)).prop_map(|(team_id, org_id)| Command::Tenancy(
            TenancyCommand::CreateTeam {
                name: team_id.clone(),
                team_id,
                org_id
            }
        )),
        (name("p", 2), name("t", 2)).prop_map(|(project_id, team_id)| Command::Tenancy(
            TenancyCommand::CreateProject {
                name: project_id.clone(),
                project_id,
                team_id
            }
        )),
        (scope, limits).prop_map(|((scope, scope_id), limits)| Command::Tenancy(
            TenancyCommand::SetLimits {
                scope,
                scope_id,
                limits
            }
        )),
        (name("k", 3), name("p", 2)).prop_map(|(k, p)| Command::Tenancy(TenancyCommand::IssueKey(
            crate::tenancy::key(&k, &p)
        ))),
        name("k", 3).prop_map(|key_id| Command::Tenancy(TenancyCommand::RevokeKey {
            key_id,
            by: "ops".into()
        })),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![catalog(), node(), replica(), tenancy()]
}

fn assert_no_double_allocation(state: &State) {
    let mut held = std::collections::BTreeMap::new();
    for r in state.replicas.replicas.values().filter(|r| r.is_live()) {
        for s in &r.placement.shards {
            for g in &s.gpu_indices {
                let prev = held.insert(
                    (s.node_id.clone(), format!("gpu{g}")),
                    &r.placement.replica_id,
                );
                assert!(prev.is_none(), "GPU {g} on {} held twice", s.node_id);
            }
            let prev = held.insert(
                (s.node_id.clone(), format!("port{}", s.port)),
                &r.placement.replica_id,
            );
            assert!(
                prev.is_none(),
                "port {} on {} held twice",
                s.port,
                s.node_id
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn replaying_the_accepted_events_rebuilds_the_same_state(commands in prop::collection::vec(command(), 1..60)) {
        let mut state = State::default();
        let mut log: Vec<Event> = Vec::new();
        for cmd in commands {
            let before = state.clone();
            match state.decide(cmd) {
                Ok(events) => {
                    for e in events {
                        let (kind, version, payload) = e.encode();
                        let stored = Event::decode(&kind, version, &payload).expect("decodes");
                        prop_assert_eq!(&stored, &e);
                        state.evolve(&e);
                        log.push(e);
                    }
                }
                Err(_) => prop_assert_eq!(&state, &before, "a rejected command changed nothing"),
            }
            prop_assert!(state.catalog.validate().is_ok(), "the catalog stays valid");
            assert_no_double_allocation(&state);
        }
        let mut replayed = State::default();
        for e in &log {
            replayed.evolve(e);
        }
        prop_assert_eq!(replayed, state);
    }
}
