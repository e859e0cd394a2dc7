use llmgw_domain::nodes::{
    FabricAttachment, Gpu, Inventory, NodeCommand as C, NodeEvent as E, Nodes, Reachability,
};

pub(crate) fn inventory(gpus: u32) -> Inventory {
    Inventory {
        hostname: "gpu-a-01".into(),
        mgmt_addr: "10.0.0.11".into(),
        gpus: (0..gpus)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i}"),
                class: "h100-80g".into(),
                memory_mb: 81_559,
                nvlink_peers: vec![],
                problems: vec![],
            })
            .collect(),
        memory_total_mb: 1_000_000,
        ..Inventory::default()
    }
}

fn run(nodes: &mut Nodes, cmd: C) -> Vec<E> {
    let events = nodes.decide(cmd).expect("accepted");
    for e in &events {
        nodes.evolve(e);
    }
    events
}

#[test]
fn a_cordon_survives_re_registration_and_heartbeats() {
    let mut n = Nodes::default();
    let id = || "gpu-a-01".to_string();
    assert_eq!(
        run(
            &mut n,
            C::Register {
                node_id: id().into(),
                inventory: inventory(8)
            }
        )
        .len(),
        1
    );
    run(
        &mut n,
        C::Cordon {
            node_id: id().into(),
            by: "ops".into(),
            reason: "bad fan".into(),
        },
    );
    run(
        &mut n,
        C::MarkUnreachable {
            node_id: id().into(),
        },
    );
    assert!(!n.nodes[id().as_str()].schedulable());
    // The agent comes back: registration and heartbeat revive it, cordon stays.
    let back = run(
        &mut n,
        C::Register {
            node_id: id().into(),
            inventory: inventory(8),
        },
    );
    assert_eq!(
        back,
        vec![E::NodeRecovered {
            node_id: id().into()
        }]
    );
    assert_eq!(
        run(
            &mut n,
            C::Heartbeat {
                node_id: id().into()
            }
        ),
        vec![]
    );
    let node = &n.nodes[id().as_str()];
    assert_eq!(
        (node.reachability, node.cordoned),
        (Reachability::Ready, true)
    );
    assert_eq!(
        run(
            &mut n,
            C::Uncordon {
                node_id: id().into(),
                by: "ops".into()
            }
        )
        .len(),
        1
    );
    assert!(n.nodes[id().as_str()].schedulable());
}

#[test]
fn only_real_changes_become_events() {
    let mut n = Nodes::default();
    let id = || "n1".to_string();
    run(
        &mut n,
        C::Register {
            node_id: id().into(),
            inventory: inventory(2),
        },
    );
    assert_eq!(
        run(
            &mut n,
            C::Register {
                node_id: id().into(),
                inventory: inventory(2)
            }
        ),
        vec![]
    );
    assert_eq!(
        run(
            &mut n,
            C::ReportInventory {
                node_id: id().into(),
                inventory: inventory(2)
            }
        ),
        vec![]
    );
    let changed = run(
        &mut n,
        C::ReportInventory {
            node_id: id().into(),
            inventory: inventory(4),
        },
    );
    assert!(matches!(&changed[..], [E::NodeInventoryChanged { .. }]));
    assert_eq!(
        run(
            &mut n,
            C::Cordon {
                node_id: id().into(),
                by: "a".into(),
                reason: String::new()
            }
        )
        .len(),
        1
    );
    assert_eq!(
        run(
            &mut n,
            C::Cordon {
                node_id: id().into(),
                by: "a".into(),
                reason: String::new()
            }
        ),
        vec![]
    );
    assert_eq!(
        run(
            &mut n,
            C::MarkLost {
                node_id: id().into()
            }
        ),
        vec![E::NodeLost {
            node_id: id().into()
        }]
    );
    assert_eq!(
        run(
            &mut n,
            C::MarkUnreachable {
                node_id: id().into()
            }
        ),
        vec![]
    );
}

#[test]
fn drain_cordons_and_uncordon_ends_it() {
    let mut n = Nodes::default();
    let id = || "n1".to_string();
    run(
        &mut n,
        C::Register {
            node_id: id().into(),
            inventory: inventory(2),
        },
    );
    let events = run(
        &mut n,
        C::Drain {
            node_id: id().into(),
            by: "ops".into(),
        },
    );
    assert!(matches!(
        &events[..],
        [E::NodeCordoned { .. }, E::NodeDrainRequested { .. }]
    ));
    // Uncordon ends the drain: one whose replicas have nowhere to go
    // would otherwise keep the node cordoned for good.
    let events = run(
        &mut n,
        C::Uncordon {
            node_id: id().into(),
            by: "ops".into(),
        },
    );
    assert!(matches!(&events[..], [E::NodeUncordoned { .. }]));
    let node = &n.nodes[id().as_str()];
    assert!(!node.cordoned && !node.draining, "{node:?}");
}

#[test]
fn an_adapter_under_two_fabrics_is_refused() {
    let mut inv = inventory(2);
    inv.fabrics = vec![
        FabricAttachment {
            fabric: "ib-a".into(),
            hcas: vec!["mlx5_0".into()],
            rate_gbps: 200,
        },
        FabricAttachment {
            fabric: "ib-b".into(),
            hcas: vec!["mlx5_0".into()],
            rate_gbps: 200,
        },
    ];
    let r = Nodes::default()
        .decide(C::Register {
            node_id: "n".into(),
            inventory: inv,
        })
        .unwrap_err();
    assert!(
        r.reason
            .contains("mlx5_0 is named under two fabrics (ib-a and ib-b)"),
        "{}",
        r.reason
    );
    let r = Nodes::default()
        .decide(C::Heartbeat {
            node_id: "ghost".into(),
        })
        .unwrap_err();
    assert!(r.reason.contains("no node ghost"));
}
