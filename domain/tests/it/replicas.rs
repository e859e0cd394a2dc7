use llmgw_domain::replicas::{
    Placement, ReplicaCommand as C, ReplicaEvent as E, ReplicaStatus, Replicas, ShardPlacement,
    ShardState,
};

pub(crate) fn placement(id: &str, nodes: &[(&str, Vec<u32>, u16)]) -> Placement {
    Placement {
        replica_id: id.into(),
        model: "llama-70b".into(),
        profile: "h100x8".into(),
        profile_fp: "0123abcd".into(),
        pool: "ib-a/h100-80g".into(),
        fabric: Some("ib-a".into()),
        shards: nodes
            .iter()
            .enumerate()
            .map(|(rank, (node, gpus, port))| ShardPlacement {
                shard_id: format!("{id}-{rank}").into(),
                rank: rank as u32,
                node_id: (*node).into(),
                gpu_indices: gpus.clone(),
                hcas: vec!["mlx5_0".into()],
                port: *port,
                memory_mb: 0,
            })
            .collect(),
        why: "highest-priority profile that fits".into(),
    }
}

fn run(r: &mut Replicas, cmd: C) -> Vec<E> {
    let events = r.decide(cmd).expect("accepted");
    for e in &events {
        r.evolve(e);
    }
    events
}

fn report(replica: &str, shard: &str, state: ShardState, error: Option<&str>) -> C {
    C::ReportShard {
        replica_id: replica.into(),
        shard_id: shard.into(),
        state,
        error: error.map(Into::into),
        exit_code: error.map(|_| 1),
        log_tail: error.map(|e| format!("...\n{e}")),
    }
}

#[test]
fn ready_only_when_every_shard_is_ready() {
    let mut r = Replicas::default();
    run(
        &mut r,
        C::Place(placement(
            "r1",
            &[("a", vec![0, 1], 20000), ("b", vec![0, 1], 20000)],
        )),
    );
    run(&mut r, report("r1", "r1-0", ShardState::Ready, None));
    assert_eq!(r.replicas["r1"].status, ReplicaStatus::Starting);
    let events = run(&mut r, report("r1", "r1-1", ShardState::Ready, None));
    assert!(matches!(
        &events[..],
        [E::ShardStateChanged { .. }, E::ReplicaReady { .. }]
    ));
    assert_eq!(
        run(&mut r, report("r1", "r1-1", ShardState::Ready, None)),
        vec![]
    );
}

#[test]
fn one_failed_shard_fails_the_whole_replica() {
    let mut r = Replicas::default();
    run(
        &mut r,
        C::Place(placement(
            "r1",
            &[("a", vec![0], 20000), ("b", vec![0], 20000)],
        )),
    );
    run(&mut r, report("r1", "r1-0", ShardState::Loading, None));
    let events = run(
        &mut r,
        report("r1", "r1-1", ShardState::Failed, Some("NCCL timeout")),
    );
    match &events[..] {
        [
            E::ShardStateChanged { log_tail, .. },
            E::ReplicaFailed { reason, .. },
        ] => {
            assert!(reason.contains("shard r1-1 failed: NCCL timeout"));
            assert!(
                log_tail
                    .as_deref()
                    .is_some_and(|t| t.contains("NCCL timeout"))
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.replicas["r1"].status, ReplicaStatus::Failed);
}

#[test]
fn no_gpu_or_port_is_handed_out_twice_while_its_replica_lives() {
    let mut r = Replicas::default();
    run(
        &mut r,
        C::Place(placement("r1", &[("a", vec![0, 1], 20000)])),
    );
    let clash = r
        .decide(C::Place(placement("r2", &[("a", vec![1, 2], 20001)])))
        .unwrap_err();
    assert!(
        clash.reason.contains("GPU 1 on a is held by replica r1"),
        "{}",
        clash.reason
    );
    let port = r
        .decide(C::Place(placement("r2", &[("a", vec![2], 20000)])))
        .unwrap_err();
    assert!(port.reason.contains("port 20000 on a"), "{}", port.reason);
    let reuse = r
        .decide(C::Place(placement("r1", &[("b", vec![0], 20000)])))
        .unwrap_err();
    assert!(reuse.reason.contains("never reused"));
    run(
        &mut r,
        C::Stop {
            replica_id: "r1".into(),
            reason: "scale down".into(),
        },
    );
    assert!(
        r.decide(C::Place(placement("r2", &[("a", vec![0, 1], 20000)])))
            .is_ok()
    );
}
