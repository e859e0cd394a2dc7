//! What each view answers, event by event, without a store.

use llmgw_domain::catalog::CatalogCommand;
use llmgw_domain::nodes::NodeCommand;
use llmgw_domain::replicas::ReplicaCommand;
use llmgw_domain::tenancy::{Limits, Period, Scope, TenancyCommand};
use llmgw_domain::{Command, Event, State};
use llmgw_projections::{ClusterView, RouterView, Stamp, TenancyView, UsageView, View};

fn feed<V: View>(view: &mut V, state: &mut State, commands: Vec<Command>) {
    for c in commands {
        for e in state.decide(c).expect("valid") {
            state.evolve(&e);
            view.apply_event(
                Stamp {
                    position: 0,
                    recorded_at_ms: 0,
                },
                &e,
            );
        }
    }
}

#[test]
fn router_routes_ready_replicas_by_name_or_alias_and_flags_edited_profiles() {
    let (mut router, mut state) = (RouterView::default(), State::default());
    feed(&mut router, &mut state, crate::story(1));
    let m = router.resolve("model-1-latest").expect("alias resolves");
    assert_eq!(m.name, "model-1");
    let eps: Vec<_> = router.endpoints_for("model-1").collect();
    assert_eq!(eps.len(), 1);
    assert_eq!(
        (eps[0].url.as_str(), eps[0].weight, eps[0].current),
        ("http://10.0.0.1:20000", 2, true)
    );

    assert_eq!((m.price, m.description.as_str()), (None, ""));

    let mut edited = crate::gpu_model("model-1");
    edited.profiles[0].args = vec!["--enforce-eager".into()];
    // The catalog's price and description reach the gateway through here.
    edited.price = Some(llmgw_domain::catalog::Price {
        prompt_per_1k: 2,
        completion_per_1k: 3,
    });
    edited.description = "a chat model".into();
    feed(
        &mut router,
        &mut state,
        vec![Command::Catalog(CatalogCommand::UpdateModel(edited))],
    );
    assert!(
        !router.endpoints["r1"].current,
        "an edited profile marks the running replica"
    );
    let m = &router.models["model-1"];
    assert_eq!(
        (m.price.map(|p| p.completion_per_1k), m.description.as_str()),
        (Some(3), "a chat model")
    );
    // Renamed, and to another engine: the running replica is still routed
    // as the engine it runs (its load read, its answers continued, in
    // that engine's terms) until its replacement serves.
    let placed_with = router.endpoints["r1"].engine;
    let mut renamed = crate::gpu_model("model-1");
    renamed.profiles[0].name = "other".into();
    renamed.profiles[0].engine = llmgw_domain::catalog::Engine::Llamacpp;
    assert_ne!(placed_with, llmgw_domain::catalog::Engine::Llamacpp);
    feed(
        &mut router,
        &mut state,
        vec![Command::Catalog(CatalogCommand::UpdateModel(renamed))],
    );
    assert_eq!(router.endpoints["r1"].engine, placed_with);
    assert!(!router.endpoints["r1"].current);

    feed(
        &mut router,
        &mut state,
        vec![Command::Node(NodeCommand::MarkLost {
            node_id: "node-1".into(),
        })],
    );
    // Only its agent is known to be silent: its serving replica is
    // still routed until the reconciler drains it, once its replacement
    // serves (a dead machine's engines refuse, and breakers take over).
    assert_eq!(
        router.endpoints_for("model-1").count(),
        1,
        "a lost node's serving replica is still routed"
    );
    feed(
        &mut router,
        &mut state,
        vec![Command::Node(NodeCommand::Heartbeat {
            node_id: "node-1".into(),
        })],
    );
    assert_eq!(router.endpoints_for("model-1").count(), 1);
    feed(
        &mut router,
        &mut state,
        vec![Command::Replica(ReplicaCommand::Drain {
            replica_id: "r1".into(),
            why: None,
        })],
    );
    assert_eq!(
        router.endpoints_for("model-1").count(),
        0,
        "a draining replica takes no new requests"
    );
}

#[test]
fn tenancy_finds_live_keys_by_hash_with_composed_limits() {
    let (mut view, mut state) = (TenancyView::default(), State::default());
    let mut story = crate::story(1);
    story.push(Command::Tenancy(TenancyCommand::SetLimits {
        scope: Scope::Project,
        scope_id: "p1".into(),
        limits: Limits {
            rpm: Some(10),
            models: Some(vec!["model-1-latest".into()]),
            ..Limits::default()
        },
    }));
    // The tenancy view learns aliases from the catalog events.
    for c in story {
        for e in state.decide(c).unwrap() {
            state.evolve(&e);
            view.apply_event(
                Stamp {
                    position: 0,
                    recorded_at_ms: 0,
                },
                &e,
            );
        }
    }
    let hash = format!("{:064x}", 1);
    let entry = view.lookup(&hash).expect("live key");
    assert_eq!(
        (
            &*entry.project_id,
            entry.team_id.as_deref(),
            entry.org_id.as_deref()
        ),
        ("p1", Some("t1"), Some("o1"))
    );
    assert_eq!(entry.limits.rpm, Some(10));
    assert_eq!(
        entry
            .limits
            .rates
            .iter()
            .map(|r| (r.scope, r.scope_id.as_str(), r.rpm))
            .collect::<Vec<_>>(),
        vec![
            (Scope::Team, "t1", Some(100)),
            (Scope::Project, "p1", Some(10))
        ],
        "each level's rate is counted at its level"
    );
    assert_eq!(entry.limits.budgets.len(), 1);
    assert!(
        entry.limits.models.permits("model-1"),
        "the alias in the allowlist is the canonical model"
    );
    let revoke = state
        .decide(Command::Tenancy(TenancyCommand::RevokeKey {
            key_id: "k1".into(),
            by: "ops".into(),
        }))
        .unwrap();
    for e in &revoke {
        view.apply_event(
            Stamp {
                position: 0,
                recorded_at_ms: 0,
            },
            e,
        );
    }
    assert!(
        view.lookup(&hash).is_none(),
        "a revoked key no longer authenticates"
    );
}

#[test]
fn usage_spend_rolls_over_with_the_period_and_reaches_team_and_org() {
    let (mut view, mut state) = (UsageView::default(), State::default());
    feed(&mut view, &mut state, crate::story(1));
    let stamp = Stamp {
        position: 0,
        recorded_at_ms: 0,
    };
    let day = 86_400_000;
    let at = |e: Event, ms: i64| match e {
        Event::Usage(llmgw_domain::usage::UsageEvent::UsageRecorded(mut u)) => {
            u.at = llmgw_domain::UnixMillis(ms);
            Event::Usage(llmgw_domain::usage::UsageEvent::UsageRecorded(u))
        }
        other => other,
    };
    let t0 = 1_780_000_000_000 / day * day + 3_600_000;
    view.apply_event(stamp, &at(crate::usage(1, 1), t0));
    view.apply_event(stamp, &at(crate::usage(1, 2), t0 + 60_000));
    let team = view.spend_of(Scope::Team, "t1");
    // 101 and 102 prompt tokens at 1000/1k, 20 completion tokens at 3000/1k.
    let cost = (101 + 60) + (102 + 60);
    assert_eq!(team.in_period(Period::Day, t0 + 120_000), cost);
    assert_eq!(view.spend_of(Scope::Org, "o1").day.micros, cost);
    // Next day: the day's spend starts again; the total keeps counting.
    view.apply_event(stamp, &at(crate::usage(1, 3), t0 + day));
    let key = view.spend_of(Scope::Key, "k1");
    assert_eq!(key.day.requests, 1);
    assert_eq!(key.in_period(Period::Day, t0 + day), 103 + 60);
    assert_eq!(key.total_micros, cost + 163);
    assert_eq!(
        key.in_period(Period::Day, t0 + 2 * day),
        0,
        "spend of a past period is not spend today"
    );
}

#[test]
fn cluster_tracks_allocations_until_a_replica_stops() {
    let (mut view, mut state) = (ClusterView::default(), State::default());
    feed(&mut view, &mut state, crate::story(1));
    assert_eq!(view.allocations["node-1"][&0], "r1");
    feed(
        &mut view,
        &mut state,
        vec![Command::Node(NodeCommand::Cordon {
            node_id: "node-1".into(),
            by: "ops".into(),
            reason: "x".into(),
        })],
    );
    assert!(view.nodes.nodes["node-1"].cordoned);
    feed(
        &mut view,
        &mut state,
        vec![Command::Replica(ReplicaCommand::Stop {
            replica_id: "r1".into(),
            reason: "done".into(),
        })],
    );
    assert!(view.allocations.is_empty());
}
