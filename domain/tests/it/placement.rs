//! Placement: which profile, which nodes, which GPUs, and why not.

use std::collections::{BTreeMap, BTreeSet};

use llmgw_domain::catalog::{Engine, Model, Profile};
use llmgw_domain::ids::ReplicaId;
use llmgw_domain::nodes::{FabricAttachment, Gpu, Inventory, Node, Nodes, Reachability};
use llmgw_domain::placement::{Explanation, PlaceOptions, fits_as_built, place, place_quiet};
use llmgw_domain::replicas::{ReplicaEvent, Replicas};
use proptest::prelude::*;

fn gpu(index: u32, class: &str) -> Gpu {
    Gpu {
        index,
        uuid: format!("GPU-{index}"),
        class: class.into(),
        memory_mb: 81_559,
        nvlink_peers: vec![],
        problems: vec![],
    }
}

fn node(id: &str, gpus: Vec<Gpu>, fabrics: &[(&str, &[&str])]) -> Node {
    Node {
        id: id.into(),
        inventory: Inventory {
            hostname: id.into(),
            mgmt_addr: format!("{id}.example"),
            gpus,
            fabrics: fabrics
                .iter()
                .map(|(f, hcas)| FabricAttachment {
                    fabric: (*f).into(),
                    hcas: hcas.iter().map(|h| (*h).into()).collect(),
                    rate_gbps: 200,
                })
                .collect(),
            memory_total_mb: 64_000,
            disk_free_gb: Some(500),
            engines: [("vllm", "0.11.0"), ("llamacpp", "b10991"), ("sim", "1")]
                .into_iter()
                .map(|(a, b)| (a.into(), b.into()))
                .collect(),
            ..Inventory::default()
        },
        reachability: Reachability::Ready,
        cordoned: false,
        draining: false,
    }
}

fn nodes(list: Vec<Node>) -> Nodes {
    Nodes {
        nodes: list.into_iter().map(|n| (n.id.clone(), n)).collect(),
    }
}

fn profile(name: &str, class: Option<&str>, tp: u32, nodes: u32) -> Profile {
    Profile {
        name: name.into(),
        engine: if class.is_some() {
            Engine::Vllm
        } else {
            Engine::Llamacpp
        },
        gpu_class: class.map(Into::into),
        tp,
        pp: 1,
        nodes,
        gpus_per_node: if class.is_some() { tp / nodes } else { 0 },
        priority: 0,
        weight: 1,
        startup_timeout_s: None,
        min_disk_gb: 0,
        memory_mb: 0,
        node_selector: BTreeMap::new(),
        args: vec![],
        env: BTreeMap::new(),
    }
}

fn model(profiles: Vec<Profile>) -> Model {
    let mut m = Model::named("llama");
    m.source = "meta-llama/Llama-3.1-8B".into();
    m.profiles = profiles;
    m
}

fn placed(replicas: &mut Replicas, e: &Explanation) {
    let p = e.chosen.clone().expect("placed");
    replicas.evolve(&ReplicaEvent::ReplicaPlaced(p));
}

fn reason<'a>(e: &'a Explanation, node: &str) -> &'a str {
    e.profiles
        .last()
        .and_then(|p| p.candidates.iter().find(|c| c.node == node))
        .map(|c| c.reason.as_str())
        .unwrap_or("")
}

#[test]
fn the_highest_priority_profile_that_fits_wins_and_explain_says_why_others_did_not() {
    let mut big = profile("tp8", Some("h100-80g"), 8, 1);
    big.priority = 10;
    let small = profile("tp2", Some("h100-80g"), 2, 1);
    let n = nodes(vec![node(
        "a",
        (0..4).map(|i| gpu(i, "h100-80g")).collect(),
        &[],
    )]);
    let e = place(
        &model(vec![small, big]),
        &n,
        &Replicas::default(),
        &[],
        &ReplicaId::from("r1"),
        PlaceOptions::default(),
    );
    assert_eq!(e.profiles[0].profile, "tp8", "tried first for its priority");
    assert!(
        e.profiles[0].candidates[0]
            .reason
            .contains("needs 8 free h100-80g GPUs, has 4")
    );
    let p = e.chosen.expect("tp2 fits");
    assert_eq!(p.profile, "tp2");
    assert_eq!(p.shards[0].gpu_indices, vec![0, 1]);
    assert_eq!(p.shards[0].port, 20000);
    assert_eq!(p.shards[0].shard_id, "r1-0");
}

/// The one-line summary names the nodes' reason when they all give the
/// same one (what `ctl models` and the leader's log print), and only the
/// outcome when they differ.
#[test]
fn the_summary_names_the_one_reason_every_node_gives() {
    let mut wants_b = profile("zoned", None, 0, 1);
    wants_b.node_selector.insert("zone".into(), "b".into());
    let summary = |n: &Nodes, p: &Profile| {
        place(
            &model(vec![p.clone()]),
            n,
            &Replicas::default(),
            &[],
            &ReplicaId::from("r1"),
            PlaceOptions::default(),
        )
        .summary()
    };
    let one = nodes(vec![node("a", vec![], &[])]);
    assert!(
        summary(&one, &wants_b)
            .ends_with("(zoned: no node fits, a: no label zone, the profile wants zone=b)"),
        "{}",
        summary(&one, &wants_b)
    );
    let two = nodes(vec![node("a", vec![], &[]), node("b", vec![], &[])]);
    assert!(
        summary(&two, &wants_b).ends_with(
            "(zoned: no node fits, all 2 nodes: no label zone, the profile wants zone=b)"
        ),
        "{}",
        summary(&two, &wants_b)
    );
    let mut cordoned = node("b", vec![], &[]);
    cordoned.cordoned = true;
    let mixed = nodes(vec![node("a", vec![], &[]), cordoned]);
    assert!(
        summary(&mixed, &wants_b).ends_with("(zoned: no node fits)"),
        "{}",
        summary(&mixed, &wants_b)
    );
}

/// What no wait changes: a label or a GPU class no node has. A node that
/// is cordoned, lost, sick or full only fits later.
#[test]
fn as_built_a_model_fits_unless_no_node_could_ever_take_it() {
    let opts = PlaceOptions::default();
    let mut wants_b = profile("zoned", None, 0, 1);
    wants_b.node_selector.insert("zone".into(), "b".into());
    let tp2 = profile("tp2", Some("h100-80g"), 2, 1);
    let mut busy = node("a", vec![gpu(0, "h100-80g"), gpu(1, "h100-80g")], &[]);
    busy.cordoned = true;
    busy.reachability = Reachability::Unreachable;
    busy.inventory.gpus[0].problems.push("xid 79".into());
    busy.inventory.engines.clear();
    let fleet = nodes(vec![busy]);
    assert!(
        place_quiet(
            &model(vec![tp2.clone()]),
            &fleet,
            &Replicas::default(),
            &[],
            &ReplicaId::from("r"),
            opts
        )
        .is_none()
    );
    assert!(
        fits_as_built(&model(vec![tp2.clone()]), &fleet, opts),
        "fits once the node is back"
    );
    assert!(
        !fits_as_built(&model(vec![wants_b.clone()]), &fleet, opts),
        "no node is in zone b"
    );
    let tp8 = profile("tp8", Some("h100-80g"), 8, 1);
    assert!(
        !fits_as_built(&model(vec![tp8]), &fleet, opts),
        "no node has 8 such GPUs"
    );
    assert!(
        fits_as_built(&model(vec![wants_b]), &nodes(vec![]), opts),
        "no node yet: one may come"
    );
}

#[test]
fn every_per_node_constraint_has_its_reason() {
    let mut cordoned = node("cordoned", vec![gpu(0, "h100-80g")], &[]);
    cordoned.cordoned = true;
    let mut gone = node("unreachable", vec![gpu(0, "h100-80g")], &[]);
    gone.reachability = Reachability::Unreachable;
    let wrong_class = node("a100", vec![gpu(0, "a100-40g")], &[]);
    let mut sick = node("sick", vec![gpu(0, "h100-80g")], &[]);
    sick.inventory.gpus[0].problems = vec!["2 uncorrected ECC errors".into()];
    let mut no_engine = node("no-engine", vec![gpu(0, "h100-80g")], &[]);
    no_engine.inventory.engines.clear();
    let mut labelled = node("labelled", vec![gpu(0, "h100-80g")], &[]);
    labelled.inventory.labels.insert("zone".into(), "b".into());
    let mut full_disk = node("full-disk", vec![gpu(0, "h100-80g")], &[]);
    full_disk.inventory.disk_free_gb = Some(10);
    let n = nodes(vec![
        cordoned,
        gone,
        wrong_class,
        sick,
        no_engine,
        labelled,
        full_disk,
    ]);
    let plain = profile("p", Some("h100-80g"), 1, 1);
    let e = place(
        &model(vec![plain.clone()]),
        &n,
        &Replicas::default(),
        &[],
        &ReplicaId::from("r1"),
        PlaceOptions::default(),
    );
    assert_eq!(reason(&e, "cordoned"), "cordoned");
    assert!(reason(&e, "unreachable").starts_with("unreachable"));
    assert!(
        reason(&e, "a100").contains("no h100-80g GPUs (has a100-40g)"),
        "{}",
        reason(&e, "a100")
    );
    assert!(reason(&e, "sick").contains("ECC"), "{}", reason(&e, "sick"));
    assert!(reason(&e, "no-engine").contains("engine vllm is not installed"));

    let mut disk = plain.clone();
    disk.min_disk_gb = 100;
    let e = place(
        &model(vec![disk]),
        &n,
        &Replicas::default(),
        &[],
        &ReplicaId::from("r1"),
        PlaceOptions::default(),
    );
    assert!(
        reason(&e, "full-disk").contains("needs 100 GB of disk"),
        "{}",
        reason(&e, "full-disk")
    );

    let mut selective = plain;
    selective.node_selector.insert("zone".into(), "b".into());
    let e = place(
        &model(vec![selective]),
        &n,
        &Replicas::default(),
        &[],
        &ReplicaId::from("r1"),
        PlaceOptions::default(),
    );
    assert_eq!(
        e.chosen.clone().expect("the labelled node fits").shards[0].node_id,
        "labelled"
    );
    assert!(reason(&e, "full-disk").contains("no label zone"));
}

#[test]
fn weights_on_disk_excuse_the_disk_rule_and_are_preferred() {
    let mut holder = node("holder", vec![gpu(0, "h100-80g")], &[]);
    holder.inventory.disk_free_gb = Some(1);
    holder.inventory.weights = vec!["/models/Llama-3.1-8B".into()];
    let other = node("other", vec![gpu(0, "h100-80g")], &[]);
    let mut p = profile("p", Some("h100-80g"), 1, 1);
    p.min_disk_gb = 50;
    let e = place(
        &model(vec![p]),
        &nodes(vec![other, holder]),
        &Replicas::default(),
        &[],
        &ReplicaId::from("r1"),
        PlaceOptions::default(),
    );
    let chosen = e.chosen.expect("placed");
    assert_eq!(chosen.shards[0].node_id, "holder");
    assert!(chosen.why.contains("holds the weights"));
}

#[test]
fn single_node_replicas_bin_pack_and_never_share_a_gpu_or_port() {
    let n = nodes(vec![
        node("a", (0..8).map(|i| gpu(i, "h100-80g")).collect(), &[]),
        node("b", (0..4).map(|i| gpu(i, "h100-80g")).collect(), &[]),
    ]);
    let m = model(vec![profile("tp2", Some("h100-80g"), 2, 1)]);
    let mut r = Replicas::default();
    let mut seen = Vec::new();
    for i in 0..6 {
        let e = place(
            &m,
            &n,
            &r,
            &[],
            &format!("r{i}").into(),
            PlaceOptions::default(),
        );
        let s = e.chosen.clone().expect("fits").shards[0].clone();
        seen.push((s.node_id.clone(), s.gpu_indices.clone(), s.port));
        placed(&mut r, &e);
    }
    // The smaller node fills first, then the big one.
    assert_eq!(seen[0].0, "b");
    assert_eq!(seen[1].0, "b");
    assert_eq!(seen[2].0, "a");
    assert_eq!(seen[1].1, vec![2, 3]);
    assert_eq!(seen[1].2, 20001, "a second port on the same node");
    let e = place(
        &m,
        &n,
        &r,
        &[],
        &ReplicaId::from("r9"),
        PlaceOptions::default(),
    );
    assert!(e.chosen.is_none(), "12 GPUs hold 6 tp2 replicas");
    assert!(reason(&e, "a").contains("held by r"), "{}", reason(&e, "a"));
}

#[test]
fn a_multi_node_replica_stays_on_one_fabric_and_takes_only_its_adapters() {
    let g = |class| (0..8).map(|i| gpu(i, class)).collect::<Vec<_>>();
    let n = nodes(vec![
        node(
            "x1",
            g("h100-80g"),
            &[("ib-x", &["mlx5_0", "mlx5_1"]), ("ib-y", &["mlx5_2"])],
        ),
        node("y1", g("h100-80g"), &[("ib-y", &["mlx5_0"])]),
        node("y2", g("h100-80g"), &[("ib-y", &["mlx5_4"])]),
        node("solo", g("h100-80g"), &[]),
    ]);
    let m = model(vec![profile("tp16", Some("h100-80g"), 16, 2)]);
    let e = place(
        &m,
        &n,
        &Replicas::default(),
        &[],
        &ReplicaId::from("r1"),
        PlaceOptions::default(),
    );
    let p = e.chosen.clone().expect("two nodes on ib-y");
    assert_eq!(p.fabric.as_deref(), Some("ib-y"));
    assert_eq!(p.shards.len(), 2);
    for s in &p.shards {
        let inv = &n.nodes[&s.node_id].inventory;
        let on_y: Vec<String> = inv
            .fabrics
            .iter()
            .filter(|f| f.fabric == "ib-y")
            .flat_map(|f| f.hcas.clone())
            .collect();
        assert_eq!(s.hcas, on_y);
        assert_eq!(s.gpu_indices.len(), 8);
    }
    assert_eq!(
        reason(&e, "solo"),
        "a multi-node profile needs a fabric; this node has none"
    );
}

#[test]
fn cpu_replicas_spread_and_respect_memory() {
    let mut small = node("small", vec![], &[]);
    small.inventory.memory_total_mb = 8_000;
    let big = node("big", vec![], &[]);
    let mut p = profile("cpu", None, 1, 1);
    p.memory_mb = 16_000;
    let m = model(vec![p]);
    let n = nodes(vec![small, big, node("big2", vec![], &[])]);
    let mut r = Replicas::default();
    let e = place(
        &m,
        &n,
        &r,
        &[],
        &ReplicaId::from("r1"),
        PlaceOptions::default(),
    );
    assert!(
        reason(&e, "small").contains("needs 16000 MB of RAM"),
        "{}",
        reason(&e, "small")
    );
    placed(&mut r, &e);
    let e2 = place(
        &m,
        &n,
        &r,
        &[],
        &ReplicaId::from("r2"),
        PlaceOptions::default(),
    );
    let (a, b) = (
        e.chosen.expect("1").shards[0].node_id.clone(),
        e2.chosen.expect("2").shards[0].node_id.clone(),
    );
    assert_ne!(a, b, "CPU replicas spread");
}

/// A model's CPU replicas go to nodes apart, even where another node is
/// as loaded with other models' work: both replicas of a `min: 2` model
/// on one node were lost together with it.
#[test]
fn a_models_cpu_replicas_go_to_different_nodes() {
    let n = nodes(vec![node("a", vec![], &[]), node("b", vec![], &[])]);
    let m = model(vec![profile("cpu", None, 1, 1)]);
    let mut other = m.clone();
    other.name = "other".into();
    let mut r = Replicas::default();
    let first = place(&m, &n, &r, &[], &"m1".into(), PlaceOptions::default());
    placed(&mut r, &first);
    let o = place(&other, &n, &r, &[], &"o1".into(), PlaceOptions::default());
    placed(&mut r, &o);
    let second = place(&m, &n, &r, &[], &"m2".into(), PlaceOptions::default());
    let on = |e: &Explanation| e.chosen.as_ref().expect("fits").shards[0].node_id.clone();
    assert_ne!(on(&first), on(&o), "least loaded");
    assert_ne!(on(&first), on(&second), "apart from its first replica");
}

/// Two agents on one machine report one address: an engine port one of
/// them holds is not handed to the other (the second engine could not
/// bind), while a node at another address still gets the lowest port.
#[test]
fn nodes_that_share_an_address_share_its_ports() {
    let mut a = node("a", vec![], &[]);
    let mut b = node("b", vec![], &[]);
    a.inventory.mgmt_addr = "10.0.0.9".into();
    b.inventory.mgmt_addr = "10.0.0.9".into();
    let n = nodes(vec![a, b, node("c", vec![], &[])]);
    let m = model(vec![profile("cpu", None, 1, 1)]);
    let mut r = Replicas::default();
    let mut seen = BTreeMap::new();
    for i in 0..3 {
        let e = place(
            &m,
            &n,
            &r,
            &[],
            &format!("r{i}").into(),
            PlaceOptions::default(),
        );
        let s = e.chosen.clone().expect("fits").shards[0].clone();
        // `explain` names the port the placement gives, not the node's
        // own lowest free one that the other node there holds.
        let said = &e.profiles[0]
            .candidates
            .iter()
            .find(|c| c.node == s.node_id)
            .expect("a verdict")
            .reason;
        assert!(said.contains(&format!("port {}", s.port)), "{said}");
        seen.insert(s.node_id.to_string(), s.port);
        placed(&mut r, &e);
    }
    assert_eq!(
        seen.len(),
        3,
        "CPU replicas spread over the three nodes: {seen:?}"
    );
    let shared: BTreeSet<u16> = [seen["a"], seen["b"]].into();
    assert_eq!(shared, BTreeSet::from([20000, 20001]), "{seen:?}");
    assert_eq!(seen["c"], 20000, "another address has its own ports");
    // The quiet choice, the reconciler's, is the same.
    let q = place_quiet(&m, &n, &r, &[], &"r3".into(), PlaceOptions::default()).expect("fits");
    let e = place(&m, &n, &r, &[], &"r3".into(), PlaceOptions::default());
    assert_eq!(Some(q), e.chosen);
    // Two ports in the range, both held at the shared address: the node
    // that has none of its own still cannot take one.
    let two = PlaceOptions {
        port_range: (20000, 20001),
    };
    let mut r = Replicas::default();
    let only_ab = nodes(n.nodes.values().filter(|n| n.id != "c").cloned().collect());
    for i in 0..2 {
        let e = place(&m, &only_ab, &r, &[], &format!("r{i}").into(), two);
        placed(&mut r, &e);
    }
    let e = place(&m, &only_ab, &r, &[], &"r2".into(), two);
    assert!(e.chosen.is_none(), "{e:?}");
    // With a node elsewhere, that node takes it: an address out of ports
    // is passed over, not the whole profile refused (a and b come first
    // by id, all three holding one replica).
    let mut r = Replicas::default();
    for i in 0..3 {
        let e = place(&m, &n, &r, &[], &format!("r{i}").into(), two);
        placed(&mut r, &e);
    }
    let e = place(&m, &n, &r, &[], &"r3".into(), two);
    let chosen = e.chosen.expect("c fits");
    assert_eq!(
        (chosen.shards[0].node_id.as_str(), chosen.shards[0].port),
        ("c", 20001),
        "{chosen:?}"
    );
}

/// A GPU profile's `memory_mb` (host RAM beside its GPUs) is a constraint
/// too, and what a placed replica holds counts against the next.
#[test]
fn gpu_replicas_respect_host_memory_too() {
    let mut small = node("small", vec![gpu(0, "a100"), gpu(1, "a100")], &[]);
    small.inventory.memory_total_mb = 8_000;
    let big = node("big", vec![gpu(0, "a100"), gpu(1, "a100")], &[]);
    let mut p = profile("gpu", Some("a100"), 1, 1);
    p.memory_mb = 40_000;
    let m = model(vec![p]);
    let n = nodes(vec![small, big]);
    let mut r = Replicas::default();
    let e = place(
        &m,
        &n,
        &r,
        &[],
        &ReplicaId::from("r1"),
        PlaceOptions::default(),
    );
    assert!(
        reason(&e, "small").contains("needs 40000 MB of RAM"),
        "{}",
        reason(&e, "small")
    );
    assert_eq!(
        e.chosen.as_ref().expect("placed").shards[0]
            .node_id
            .as_str(),
        "big"
    );
    placed(&mut r, &e);
    // big has a GPU left, but 24,000 MB of its 64,000 MB RAM.
    let e2 = place(
        &m,
        &n,
        &r,
        &[],
        &ReplicaId::from("r2"),
        PlaceOptions::default(),
    );
    assert!(e2.chosen.is_none(), "{e2:?}");
    assert!(
        reason(&e2, "big").contains("24000 MB of 64000 MB are free"),
        "{}",
        reason(&e2, "big")
    );
}

#[test]
fn a_tp_group_stays_inside_one_nvlink_domain() {
    // Two NVLink domains of four; GPU 0 and 1 are taken.
    let mut gpus: Vec<Gpu> = (0..8).map(|i| gpu(i, "h100-80g")).collect();
    for g in &mut gpus {
        let base = g.index / 4 * 4;
        g.nvlink_peers = (base..base + 4).filter(|p| *p != g.index).collect();
    }
    let n = nodes(vec![node("a", gpus, &[])]);
    let mut r = Replicas::default();
    let m2 = model(vec![profile("tp2", Some("h100-80g"), 2, 1)]);
    let first = place(
        &m2,
        &n,
        &r,
        &[],
        &ReplicaId::from("r1"),
        PlaceOptions::default(),
    );
    placed(&mut r, &first);
    let m4 = model(vec![profile("tp4", Some("h100-80g"), 4, 1)]);
    let e = place(
        &m4,
        &n,
        &r,
        &[],
        &ReplicaId::from("r2"),
        PlaceOptions::default(),
    );
    assert_eq!(
        e.chosen.expect("fits").shards[0].gpu_indices,
        vec![4, 5, 6, 7]
    );
}

// ---- properties over random clusters ----

#[derive(Debug, Clone)]
struct Cluster {
    nodes: Nodes,
}

fn cluster() -> impl Strategy<Value = Cluster> {
    let classes = prop_oneof![Just("h100-80g"), Just("a100-40g"), Just("l40s-45g")];
    let gpu_s = (classes.clone(), 0u32..10).prop_map(|(c, sick)| (c, sick == 0));
    let node_s = (
        prop::collection::vec(gpu_s, 0..9),
        prop_oneof![Just(None), Just(Some("ib-a")), Just(Some("ib-b"))],
        0u32..8,
        any::<bool>(),
    );
    prop::collection::vec(node_s, 1..12).prop_map(|specs| {
        let mut list = Vec::new();
        for (i, (gpus, fabric, state, mixed)) in specs.into_iter().enumerate() {
            // Nodes are mostly one class; some mix.
            let first = gpus.first().map(|g| g.0).unwrap_or("h100-80g");
            let gs = gpus
                .iter()
                .enumerate()
                .map(|(j, (c, sick))| {
                    let mut g = gpu(j as u32, if mixed { c } else { first });
                    if *sick {
                        g.problems = vec!["memory held by another process".into()];
                    }
                    g
                })
                .collect();
            let id = format!("n{i:02}");
            let hcas: Vec<String> = (0..2).map(|h| format!("{id}-mlx5_{h}")).collect();
            let hca_refs: Vec<&str> = hcas.iter().map(String::as_str).collect();
            let fabrics: Vec<(&str, &[&str])> =
                fabric.map(|f| (f, &hca_refs[..])).into_iter().collect();
            let mut n = node(&id, gs, &fabrics);
            match state {
                0 => n.cordoned = true,
                1 => n.reachability = Reachability::Unreachable,
                _ => {}
            }
            list.push(n);
        }
        Cluster { nodes: nodes(list) }
    })
}

fn profiles() -> impl Strategy<Value = Vec<Profile>> {
    let class = prop_oneof![Just("h100-80g"), Just("a100-40g"), Just("l40s-45g")];
    let one = (
        class,
        prop_oneof![
            Just((1u32, 1u32)),
            Just((2, 1)),
            Just((4, 1)),
            Just((8, 1)),
            Just((4, 2)),
            Just((8, 2)),
            Just((16, 2)),
            Just((12, 3))
        ],
        -2i32..3,
    )
        .prop_map(|(c, (tp, nodes), prio)| {
            let mut p = profile(&format!("{c}-tp{tp}x{nodes}"), Some(c), tp, nodes);
            p.priority = prio;
            p
        });
    prop::collection::vec(one, 1..4).prop_map(|mut ps| {
        let mut names = BTreeSet::new();
        ps.retain(|p| names.insert(p.name.clone()));
        ps
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn placements_never_mix_never_double_allocate_and_never_use_sick_gpus(
        c in cluster(),
        models in prop::collection::vec(profiles(), 1..6),
    ) {
        let mut replicas = Replicas::default();
        for (i, ps) in models.iter().enumerate() {
            let m = model(ps.clone());
            for k in 0..3 {
                let e = place(&m, &c.nodes, &replicas, &[], &format!("r{i}-{k}").into(), PlaceOptions::default());
                // The reconciler places quietly; it must choose as explain does.
                let quiet = place_quiet(&m, &c.nodes, &replicas, &[], &format!("r{i}-{k}").into(), PlaceOptions::default());
                prop_assert_eq!(&quiet, &e.chosen, "the quiet placement chose otherwise");
                let Some(p) = e.chosen.clone() else { break };
                let profile = m.profiles.iter().find(|x| x.name == p.profile).expect("its profile");
                let class = profile.gpu_class.clone().expect("GPU profiles");
                prop_assert_eq!(p.shards.len() as u32, profile.nodes);
                let mut nodes_used = BTreeSet::new();
                for s in &p.shards {
                    prop_assert!(nodes_used.insert(s.node_id.clone()), "a node twice in one replica");
                    let n = &c.nodes.nodes[&s.node_id];
                    prop_assert!(n.schedulable(), "placed on {} which is not schedulable", n.id);
                    prop_assert_eq!(s.gpu_indices.len() as u32, profile.gpus_per_node);
                    for gi in &s.gpu_indices {
                        let g = n.inventory.gpus.iter().find(|g| g.index == *gi).expect("a real GPU");
                        prop_assert_eq!(&g.class, &class, "class mixing");
                        prop_assert!(g.problems.is_empty(), "an unhealthy GPU was used");
                    }
                    if profile.nodes > 1 {
                        let fabric = p.fabric.clone().expect("multi-node has a fabric");
                        let allowed: Vec<String> = n.inventory.fabrics.iter()
                            .filter(|f| f.fabric == fabric).flat_map(|f| f.hcas.clone()).collect();
                        prop_assert!(!allowed.is_empty(), "node {} is not on fabric {}", n.id, fabric);
                        prop_assert!(s.hcas.iter().all(|h| allowed.contains(h)), "an HCA from another fabric");
                    } else {
                        prop_assert!(s.hcas.is_empty());
                    }
                }
                placed(&mut replicas, &e);
            }
        }
        // No GPU or port held twice, across everything placed.
        let mut gpus = BTreeSet::new();
        let mut ports = BTreeSet::new();
        for r in replicas.replicas.values() {
            for s in &r.placement.shards {
                prop_assert!(ports.insert((s.node_id.clone(), s.port)), "port given twice");
                for g in &s.gpu_indices {
                    prop_assert!(gpus.insert((s.node_id.clone(), *g)), "GPU given twice");
                }
            }
        }
    }
}

#[test]
fn a_fetched_copy_in_the_agents_cache_counts_as_holding_the_weights() {
    use llmgw_domain::placement::{cache_name, holds_weights};
    // The same vectors as the agent's cache.
    assert_eq!(
        cache_name("https://one.example/model.gguf"),
        "56682ad3639faabd-model.gguf"
    );
    assert_eq!(
        cache_name("https://two.example/model.gguf"),
        "2684e6a67d978bee-model.gguf"
    );
    let mut n = node("a", vec![], &[]);
    n.inventory.weights = vec!["/var/lib/llmgw-weights/56682ad3639faabd-model.gguf".into()];
    assert!(holds_weights(&n, "https://one.example/model.gguf"));
    assert!(!holds_weights(&n, "https://two.example/other.gguf"));
}

#[test]
fn unwanted_cached_weights_are_generated_names_no_source_wants() {
    use llmgw_domain::catalog::Catalog;
    use llmgw_domain::placement::{cache_name, unwanted_cached};
    let mut catalog = Catalog::default();
    let mut m = Model::named("kept");
    m.source = "https://one.example/model.gguf".into();
    catalog.models.insert(m.name.clone(), m);
    let dir = "/var/lib/llmgw-weights";
    let weights = vec![
        format!("{dir}/{}", cache_name("https://one.example/model.gguf")),
        format!("{dir}/{}", cache_name("https://two.example/old.gguf")),
        format!("{dir}/{}.part", cache_name("https://three.example/x.gguf")),
        "/models/operators-own.gguf".to_string(),
    ];
    assert_eq!(
        unwanted_cached(&weights, &catalog),
        vec![weights[1].clone()]
    );
}
