//! What a heartbeat changes: nothing for most beats; a node back from
//! unreachable; the inventory facts that moved.

use std::collections::BTreeMap;

use llmgw_domain::heartbeat::{GPU_NOT_SEEN, GpuLook, Heartbeat, plan};
use llmgw_domain::nodes::{Gpu, Inventory, Node, NodeCommand, NodeEvent, Reachability};
use llmgw_domain::{Command, Event, State};

fn node() -> Node {
    let mut s = State::default();
    s.evolve(&Event::Node(NodeEvent::NodeRegistered {
        node_id: "n1".into(),
        inventory: Inventory {
            hostname: "n1".into(),
            gpus: (0..2)
                .map(|i| Gpu {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    class: "h100-80g".into(),
                    memory_mb: 81_920,
                    nvlink_peers: vec![],
                    problems: vec![],
                })
                .collect(),
            memory_total_mb: 64_000,
            disk_free_gb: Some(500),
            engines: [("vllm".to_string(), "0.9".to_string())].into(),
            weights: vec!["/models/a".into()],
            ..Inventory::default()
        },
    }));
    s.nodes.nodes["n1"].clone()
}

fn inventory_of(commands: &[Command]) -> &Inventory {
    match commands {
        [Command::Node(NodeCommand::ReportInventory { node_id, inventory })] => {
            assert_eq!(node_id, "n1");
            inventory
        }
        other => panic!("expected one inventory report, got {other:?}"),
    }
}

#[test]
fn a_beat_that_repeats_what_the_log_knows_asks_for_nothing() {
    let n = node();
    assert!(plan(&n, &Heartbeat::default()).is_empty());
    let same = Heartbeat {
        memory_total_mb: Some(64_000),
        disk_free_gb: Some(Some(500)),
        weights: Some(vec!["/models/a".into()]),
        engines: Some([("vllm".to_string(), "0.9".to_string())].into()),
        gpus: Some(vec![
            GpuLook {
                index: 0,
                problems: vec![],
            },
            GpuLook {
                index: 1,
                problems: vec![],
            },
        ]),
    };
    assert!(plan(&n, &same).is_empty());
}

/// Free disk at a gigabyte's edge is not news: a move of two is, or of
/// one where under ten are left.
#[test]
fn free_disk_wobbling_by_a_gigabyte_asks_for_nothing_unless_it_is_scarce() {
    let mut n = node();
    let beat = |gb| Heartbeat {
        disk_free_gb: Some(Some(gb)),
        ..Heartbeat::default()
    };
    assert!(plan(&n, &beat(499)).is_empty());
    assert!(plan(&n, &beat(501)).is_empty());
    assert_eq!(inventory_of(&plan(&n, &beat(498))).disk_free_gb, Some(498));
    n.inventory.disk_free_gb = Some(9);
    assert_eq!(inventory_of(&plan(&n, &beat(8))).disk_free_gb, Some(8));
    assert_eq!(inventory_of(&plan(&n, &beat(10))).disk_free_gb, Some(10));
}

#[test]
fn a_node_not_ready_is_revived_by_its_beat() {
    let mut n = node();
    n.reachability = Reachability::Unreachable;
    assert_eq!(
        plan(&n, &Heartbeat::default()),
        vec![Command::Node(NodeCommand::Heartbeat {
            node_id: "n1".into()
        })]
    );
}

#[test]
fn changed_facts_become_one_inventory_report_keeping_what_the_beat_left_out() {
    let n = node();
    let hb = Heartbeat {
        disk_free_gb: Some(Some(120)),
        engines: Some(BTreeMap::new()),
        ..Heartbeat::default()
    };
    let commands = plan(&n, &hb);
    let inv = inventory_of(&commands);
    assert_eq!(inv.disk_free_gb, Some(120));
    assert!(inv.engines.is_empty());
    assert_eq!(inv.memory_total_mb, 64_000);
    assert_eq!(inv.weights, vec!["/models/a".to_string()]);

    // Storage all shared: free disk becomes unknown, not kept.
    let commands = plan(
        &n,
        &Heartbeat {
            disk_free_gb: Some(None),
            ..Heartbeat::default()
        },
    );
    assert_eq!(inventory_of(&commands).disk_free_gb, None);
}

#[test]
fn a_gpu_with_problems_or_gone_from_the_nodes_look_is_marked() {
    let n = node();
    let hb = Heartbeat {
        gpus: Some(vec![GpuLook {
            index: 1,
            problems: vec!["2 uncorrectable ECC errors".into()],
        }]),
        ..Heartbeat::default()
    };
    let commands = plan(&n, &hb);
    let inv = inventory_of(&commands);
    assert_eq!(inv.gpus[0].problems, vec![GPU_NOT_SEEN.to_string()]);
    assert_eq!(
        inv.gpus[1].problems,
        vec!["2 uncorrectable ECC errors".to_string()]
    );
    // Everything else about the cards stays as registered.
    assert_eq!(inv.gpus[1].uuid, "GPU-1");
}

#[test]
fn a_revived_node_with_changes_gets_both_in_order() {
    let mut n = node();
    n.reachability = Reachability::Lost;
    let commands = plan(
        &n,
        &Heartbeat {
            memory_total_mb: Some(128_000),
            ..Heartbeat::default()
        },
    );
    assert_eq!(commands.len(), 2);
    assert!(matches!(
        &commands[0],
        Command::Node(NodeCommand::Heartbeat { .. })
    ));
    assert!(matches!(
        &commands[1],
        Command::Node(NodeCommand::ReportInventory { inventory, .. }) if inventory.memory_total_mb == 128_000
    ));
}
