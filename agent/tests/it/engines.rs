//! Engine command lines and validation, with the original tests' fixtures.

use std::collections::BTreeMap;
use std::path::Path;

use llmgw_agent::engines::{
    Engine, GpuInfo, LaunchMode, LlamaCpp, Probe, Profile, Registry, Sglang, ShardSpec, Sim, Vllm,
};

fn single_node() -> ShardSpec {
    ShardSpec {
        replica_id: "r1".into(),
        shard_id: "r1-0".into(),
        rank: 0,
        nnodes: 1,
        gpu_indices: vec![0, 1, 2, 3],
        mgmt_interface: "eth0".into(),
        http_port: 20000,
        profile: Profile {
            name: "h100-tp4".into(),
            engine: "vllm".into(),
            tp: 4,
            model_path: "/models/llama".into(),
            ..Profile::default()
        },
        ..ShardSpec::default()
    }
}

fn multi_node(rank: u32) -> ShardSpec {
    let mut s = single_node();
    s.rank = rank;
    s.nnodes = 2;
    s.gpu_indices = (0..8).collect();
    s.hcas = vec!["mlx5_0".into(), "mlx5_1".into()];
    s.leader_addr = "10.0.0.10".into();
    s.leader_port = 20001;
    s.profile.tp = 16;
    s.profile.gpus_per_node = 8;
    s.profile.nodes = 2;
    s
}

fn h100(n: u32) -> Vec<GpuInfo> {
    (0..n)
        .map(|i| GpuInfo {
            index: i,
            name: "NVIDIA H100 80GB HBM3".into(),
            compute_capability: "9.0".into(),
            memory_total_mb: 81559,
        })
        .collect()
}

fn vllm(mode: &str) -> Vllm {
    Vllm {
        bin: Some("/opt/vllm/bin/vllm".into()),
        launch_mode: mode.into(),
        ray_bin: None,
    }
}

fn joined(args: &[String]) -> String {
    args.join(" ")
}

#[test]
fn the_environment_pins_gpus_and_the_fabric() {
    let single = &vllm("").commands(&single_node()).unwrap()[0];
    assert_eq!(single.env["CUDA_VISIBLE_DEVICES"], "0,1,2,3");
    assert_eq!(single.env["NCCL_IB_DISABLE"], "1");
    assert!(!single.env.contains_key("NCCL_IB_HCA"));
    let multi = vllm("").commands(&multi_node(0)).unwrap();
    let last = multi.last().unwrap();
    assert_eq!(
        (
            last.env["NCCL_IB_HCA"].as_str(),
            last.env["NCCL_IB_DISABLE"].as_str()
        ),
        ("mlx5_0,mlx5_1", "0")
    );
    assert_eq!(
        (
            last.env["NCCL_SOCKET_IFNAME"].as_str(),
            last.env["GLOO_SOCKET_IFNAME"].as_str()
        ),
        ("eth0", "eth0")
    );

    let mut spec = single_node();
    spec.profile.env = BTreeMap::from([
        ("NCCL_IB_HCA".into(), "mlx5_9".into()),
        ("NCCL_NET_GDR_LEVEL".into(), "SYS".into()),
    ]);
    let cmd = &vllm("").commands(&spec).unwrap()[0];
    assert_eq!(
        (
            cmd.env["NCCL_IB_HCA"].as_str(),
            cmd.env["NCCL_NET_GDR_LEVEL"].as_str()
        ),
        ("mlx5_9", "SYS"),
        "the profile wins"
    );

    let env = cmd.materialize_env([
        ("LLMGW_TEST_MARKER".to_string(), "present".to_string()),
        ("CUDA_VISIBLE_DEVICES".into(), "7".into()),
    ]);
    assert!(
        env.contains(&"LLMGW_TEST_MARKER=present".to_string()),
        "the process environment is inherited"
    );
    assert!(
        env.contains(&"CUDA_VISIBLE_DEVICES=0,1,2,3".to_string()),
        "and overridden by ours"
    );
    let mut sorted = env.clone();
    sorted.sort();
    assert_eq!(env, sorted);
}

#[test]
fn vllm_single_node_ray_and_mp_launches() {
    let cmds = vllm("").commands(&single_node()).unwrap();
    assert_eq!(cmds.len(), 1);
    assert_eq!(cmds[0].path, Path::new("/opt/vllm/bin/vllm"));
    assert_eq!(
        joined(&cmds[0].args),
        "serve /models/llama --host 0.0.0.0 --port 20000 --tensor-parallel-size 4"
    );

    let leader = vllm("ray").commands(&multi_node(0)).unwrap();
    assert_eq!(leader.len(), 2);
    assert_eq!(
        (
            leader[0].name.as_str(),
            joined(&leader[0].args).as_str(),
            leader[0].wait_for_leader_port
        ),
        (
            "ray",
            "start --block --head --port 20001 --num-gpus 8",
            true
        )
    );
    assert_eq!(
        joined(&leader[1].args),
        "serve /models/llama --host 0.0.0.0 --port 20000 --tensor-parallel-size 16 --distributed-executor-backend ray"
    );
    assert_eq!(
        (
            leader[1].env["RAY_ADDRESS"].as_str(),
            leader[1].env["VLLM_HOST_IP"].as_str()
        ),
        ("10.0.0.10:20001", "10.0.0.10")
    );

    let worker = vllm("ray").commands(&multi_node(1)).unwrap();
    assert_eq!(worker.len(), 1, "a worker only joins the Ray cluster");
    assert_eq!(
        joined(&worker[0].args),
        "start --block --address 10.0.0.10:20001 --num-gpus 8"
    );

    let mp = vllm("mp").commands(&multi_node(0)).unwrap();
    assert_eq!(mp.len(), 1);
    assert!(joined(&mp[0].args).ends_with("--distributed-executor-backend mp"));
    assert_eq!(
        (
            mp[0].env["VLLM_HOST_IP"].as_str(),
            mp[0].env["VLLM_PORT"].as_str()
        ),
        ("10.0.0.10", "20001")
    );

    let err = vllm("sorcery").commands(&multi_node(0)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "vllm: unknown launch_mode \"sorcery\" (want \"ray\" or \"mp\")"
    );
    assert_eq!(
        vllm("ray").commands(&single_node()).unwrap()[0].name,
        "vllm",
        "no Ray on one node"
    );
    assert_eq!(
        Vllm {
            launch_mode: LaunchMode::Mp,
            ..Vllm::default()
        }
        .commands(&single_node())
        .unwrap()[0]
            .path,
        Path::new("vllm")
    );

    let mut spec = single_node();
    spec.profile.args = vec!["--max-model-len".into(), "32768".into()];
    spec.profile.pp = 2;
    spec.profile.tp = 2;
    spec.profile.served_model_name = "llama".into();
    let args = joined(&vllm("").commands(&spec).unwrap()[0].args);
    assert!(args.ends_with("--tensor-parallel-size 2 --pipeline-parallel-size 2 --served-model-name llama --max-model-len 32768"), "{args}");
}

#[test]
fn sglang_runs_on_every_rank_and_only_the_leader_serves() {
    let sg = Sglang {
        python: Some("/opt/sglang/bin/python".into()),
    };
    let cmd = &sg.commands(&multi_node(1)).unwrap()[0];
    assert_eq!(cmd.path, Path::new("/opt/sglang/bin/python"));
    assert_eq!(
        joined(&cmd.args),
        "-m sglang.launch_server --model-path /models/llama --host 0.0.0.0 --port 20000 --tp 16 --nnodes 2 --node-rank 1 --dist-init-addr 10.0.0.10:20001"
    );
    let single = joined(&sg.commands(&single_node()).unwrap()[0].args);
    assert!(
        !single.contains("--nnodes")
            && !single.contains("--node-rank")
            && !single.contains("--dist-init-addr")
    );
    for e in [&vllm("") as &dyn Engine, &sg] {
        assert!(
            e.serves_http(&multi_node(0))
                && !e.serves_http(&multi_node(1))
                && e.serves_http(&single_node())
        );
        assert_eq!((e.health_path(), e.metrics_path()), ("/health", "/metrics"));
    }
}

#[test]
fn validation_refuses_what_would_hang_or_crawl() {
    let v = vllm("");
    let p = single_node().profile;
    assert!(v.validate(&p, &h100(4)).is_ok());
    let mut mixed = h100(2);
    mixed[1].name = "NVIDIA A100-SXM4-40GB".into();
    let two = Profile { tp: 2, ..p.clone() };
    assert!(
        v.validate(&two, &mixed)
            .unwrap_err()
            .to_string()
            .contains("may not mix GPU types")
    );
    let fp8 = Profile {
        args: vec!["--quantization".into(), "fp8".into()],
        ..p.clone()
    };
    let a100: Vec<GpuInfo> = h100(4)
        .into_iter()
        .map(|g| GpuInfo {
            name: "NVIDIA A100-SXM4-80GB".into(),
            compute_capability: "8.0".into(),
            ..g
        })
        .collect();
    let err = v.validate(&fp8, &a100).unwrap_err().to_string();
    assert!(
        err.contains(
            "fp8 quantization needs compute capability 8.9, GPU 0 (NVIDIA A100-SXM4-80GB) has 8.0"
        ),
        "{err}"
    );
    assert!(v.validate(&fp8, &h100(4)).is_ok());
    // The flag in its other spelling is read too; a dangling one names no
    // quantization, so it is left to the engine to refuse.
    let joined_fp8 = Profile {
        args: vec!["--quantization=fp8".into()],
        ..p.clone()
    };
    assert!(v.validate(&joined_fp8, &a100).is_err());
    let dangling = Profile {
        args: vec!["--quantization".into()],
        ..p.clone()
    };
    assert!(v.validate(&dangling, &a100).is_ok());
    let absurd = Profile {
        tp: u32::MAX,
        pp: u32::MAX,
        ..p.clone()
    };
    assert!(
        v.validate(&absurd, &h100(4)).is_err(),
        "refused, not overflowed"
    );
    let inconsistent = Profile {
        nodes: 2,
        gpus_per_node: 8,
        ..p.clone()
    };
    assert_eq!(
        v.validate(&inconsistent, &h100(8)).unwrap_err().to_string(),
        "profile \"h100-tp4\": 2 nodes x 8 GPUs does not match TP 4 x PP 1"
    );
    let eight = Profile { tp: 8, ..p.clone() };
    assert!(
        v.validate(&eight, &h100(4))
            .unwrap_err()
            .to_string()
            .contains("needs 8 GPUs per node, node has 4")
    );
    let no_path = Profile {
        model_path: String::new(),
        ..p.clone()
    };
    assert_eq!(
        v.validate(&no_path, &h100(4)).unwrap_err().to_string(),
        "profile \"h100-tp4\": model path is empty"
    );
}

#[test]
fn the_registry_names_its_engines() {
    let r = Registry::new(
        Vllm::default(),
        Sglang::default(),
        LlamaCpp::default(),
        Sim::default(),
    );
    assert_eq!(r.names(), vec!["llamacpp", "sglang", "sim", "vllm"]);
    assert_eq!(r.get("vllm").unwrap().name(), "vllm");
    assert_eq!(
        r.get("nope").unwrap_err().to_string(),
        "unknown engine \"nope\" (have llamacpp, sglang, sim, vllm)"
    );
    assert!(
        r.get("llama.cpp")
            .unwrap_err()
            .to_string()
            .contains("llamacpp")
    );
}

fn llama_spec(gpus: &[u32]) -> ShardSpec {
    ShardSpec {
        http_port: 8000,
        mgmt_interface: "eth0".into(),
        nnodes: 1,
        gpu_indices: gpus.to_vec(),
        profile: Profile {
            name: "qwen".into(),
            tp: 1,
            model_path: "/models/qwen.gguf".into(),
            served_model_name: "qwen-0.5b".into(),
            ..Profile::default()
        },
        ..ShardSpec::default()
    }
}

#[test]
fn llama_server_gets_metrics_the_model_template_and_real_concurrency() {
    let l = LlamaCpp::default();
    let cmd = &l.commands(&llama_spec(&[])).unwrap()[0];
    assert_eq!(cmd.path, Path::new("llama-server"));
    assert_eq!(
        joined(&cmd.args),
        "--model /models/qwen.gguf --host 0.0.0.0 --port 8000 --metrics --jinja --alias qwen-0.5b --parallel 4"
    );
    let env: Vec<(String, String)> = cmd.env.clone().into_iter().collect();
    assert_eq!(
        env,
        vec![
            ("CUDA_VISIBLE_DEVICES".into(), "".into()),
            ("GLOO_SOCKET_IFNAME".into(), "eth0".into()),
            ("NCCL_IB_DISABLE".into(), "1".into()),
            ("NCCL_SOCKET_IFNAME".into(), "eth0".into()),
        ]
    );
    let gpu = &l.commands(&llama_spec(&[2])).unwrap()[0];
    assert!(
        joined(&gpu.args).ends_with("--n-gpu-layers 999") && gpu.env["CUDA_VISIBLE_DEVICES"] == "2"
    );

    let mut s = llama_spec(&[]);
    s.profile.args = vec![
        "--parallel".into(),
        "16".into(),
        "--ctx-size".into(),
        "4096".into(),
    ];
    let args = l.commands(&s).unwrap()[0].args.clone();
    assert_eq!(args.iter().filter(|a| *a == "--parallel").count(), 1);
    assert!(joined(&args).ends_with("--parallel 16 --ctx-size 4096"));
    let mut s = llama_spec(&[0]);
    s.profile.args = vec!["-np".into(), "8".into(), "-ngl".into(), "20".into()];
    let args = joined(&l.commands(&s).unwrap()[0].args);
    assert!(
        !args.contains("--parallel") && !args.contains("--n-gpu-layers"),
        "{args}"
    );
    let mut s = llama_spec(&[]);
    s.profile.args = vec!["--no-jinja".into()];
    assert!(
        !l.commands(&s).unwrap()[0]
            .args
            .contains(&"--jinja".to_string())
    );

    let configured = LlamaCpp::new(Some("/opt/llama.cpp/bin/llama-server".into()), 2);
    let cmd = &configured.commands(&llama_spec(&[])).unwrap()[0];
    assert_eq!(cmd.path, Path::new("/opt/llama.cpp/bin/llama-server"));
    assert!(joined(&cmd.args).contains("--parallel 2"));
    // A provisioned build serves where no binary is configured; the
    // operator's explicit choice stands over it.
    let built = Path::new("/opt/llmgw/engines/llamacpp/b1-cpu/llama-b1/llama-server");
    assert!(configured.use_installed(Some((built.into(), "b1".into()))));
    assert_eq!(
        configured.commands(&llama_spec(&[])).unwrap()[0].path,
        Path::new("/opt/llama.cpp/bin/llama-server")
    );
    let provisioned = LlamaCpp::new(None, 0);
    provisioned.use_installed(Some((built.into(), "b1".into())));
    assert_eq!(
        provisioned.commands(&llama_spec(&[])).unwrap()[0].path,
        built
    );
    assert_eq!(provisioned.probe(), Some(Probe::Seen("b1".into())));
    provisioned.use_installed(None);
    assert_ne!(
        provisioned.commands(&llama_spec(&[])).unwrap()[0].path,
        built
    );
    assert!(l.serves_http(&llama_spec(&[])));
}

#[test]
fn llama_cpp_refuses_what_it_cannot_do() {
    let l = LlamaCpp::default();
    let two_nodes = Profile {
        nodes: 2,
        gpus_per_node: 1,
        tp: 2,
        ..llama_spec(&[]).profile
    };
    assert!(
        l.validate(&two_nodes, &h100(1))
            .unwrap_err()
            .to_string()
            .contains("llamacpp does not span nodes")
    );
    let tp2 = Profile {
        tp: 2,
        gpus_per_node: 2,
        ..llama_spec(&[]).profile
    };
    assert!(
        l.validate(&tp2, &h100(2))
            .unwrap_err()
            .to_string()
            .contains("does not do tensor parallelism")
    );
    assert!(
        l.validate(&llama_spec(&[]).profile, &[]).is_ok(),
        "a CPU profile validates"
    );
}

#[test]
fn a_model_directory_resolves_to_its_first_gguf_part() {
    use llmgw_agent::engines::llamacpp_gguf_in as gguf_in;
    let dir = tempfile::tempdir().unwrap();
    for part in [3, 1, 2] {
        std::fs::write(
            dir.path().join(format!("model-0000{part}-of-00003.gguf")),
            "x",
        )
        .unwrap();
    }
    assert_eq!(
        gguf_in(dir.path()).unwrap(),
        dir.path().join("model-00001-of-00003.gguf")
    );
    let file = dir.path().join("model-00002-of-00003.gguf");
    assert_eq!(gguf_in(&file).unwrap(), file, "a file is itself");
    let empty = tempfile::tempdir().unwrap();
    std::fs::write(empty.path().join("config.json"), "{}").unwrap();
    assert!(
        gguf_in(empty.path())
            .unwrap_err()
            .to_string()
            .ends_with("holds no .gguf file")
    );
    assert_eq!(
        gguf_in(Path::new("/nonexistent/model.gguf")).unwrap(),
        Path::new("/nonexistent/model.gguf")
    );
}

fn sim_spec(rank: u32, nnodes: u32) -> ShardSpec {
    ShardSpec {
        rank,
        nnodes,
        leader_addr: "10.0.0.5".into(),
        leader_port: 20001,
        gpu_indices: vec![0, 1],
        http_port: 20000,
        mgmt_interface: "eth0".into(),
        hcas: vec!["mlx5_0".into(), "mlx5_1".into()],
        profile: Profile {
            tp: 4,
            gpus_per_node: 2,
            nodes: nnodes,
            served_model_name: "big-model".into(),
            model_path: "/m".into(),
            ..Profile::default()
        },
        ..ShardSpec::default()
    }
}

#[test]
fn the_sim_engine_carries_its_rendezvous_and_stays_on_its_fabric() {
    let sim = Sim {
        bin: Some("/usr/local/bin/llmgw".into()),
    };
    assert!(sim.serves_http(&sim_spec(0, 2)) && !sim.serves_http(&sim_spec(1, 2)));
    let cmds = sim.commands(&sim_spec(1, 2)).unwrap();
    assert_eq!(cmds.len(), 1);
    assert_eq!(
        joined(&cmds[0].args),
        "sim-engine --listen 0.0.0.0:20000 --model big-model --engine sim --nnodes 2 --node-rank 1 --dist-init-addr 10.0.0.5:20001"
    );
    assert!(cmds[0].wait_for_leader_port);
    assert!(
        !sim.commands(&sim_spec(0, 2)).unwrap()[0].wait_for_leader_port,
        "the leader does not wait for itself"
    );
    let single = joined(&sim.commands(&sim_spec(0, 1)).unwrap()[0].args);
    for flag in ["--nnodes", "--node-rank", "--dist-init-addr"] {
        assert!(!single.contains(flag), "{flag} in {single}");
    }
    let env = &cmds[0].env;
    assert_eq!(
        (
            env["NCCL_IB_HCA"].as_str(),
            env["NCCL_SOCKET_IFNAME"].as_str(),
            env["CUDA_VISIBLE_DEVICES"].as_str(),
            env["NCCL_IB_DISABLE"].as_str()
        ),
        ("mlx5_0,mlx5_1", "eth0", "0,1", "0")
    );
    assert!(
        Sim::default().commands(&sim_spec(0, 1)).unwrap()[0]
            .path
            .is_absolute(),
        "defaults to the running binary"
    );
}

/// The catalog's context length reaches each engine as its own flag, and
/// a profile's args that set it themselves are left to (they come last).
/// llama-server splits its --ctx-size among its slots: the catalog's
/// context is each request's, so the whole is that times the slots (the
/// profile's own --parallel counts; a unified cache is shared, not split).
#[test]
fn llama_cpp_gets_the_context_for_each_of_its_slots() {
    let ctx = |args: &[&str], parallel: u32| {
        let mut s = llama_spec(&[]);
        s.profile.context_length = 2048;
        s.profile.args = args.iter().map(|a| a.to_string()).collect();
        let args = LlamaCpp::new(None, parallel).commands(&s).unwrap()[0]
            .args
            .clone();
        let at = args.iter().position(|a| a == "--ctx-size").unwrap();
        args[at + 1].clone()
    };
    assert_eq!(ctx(&[], 0), "8192");
    assert_eq!(ctx(&[], 2), "4096");
    assert_eq!(ctx(&["--parallel", "8"], 2), "16384");
    assert_eq!(ctx(&["-np=3"], 0), "6144");
    assert_eq!(ctx(&["--kv-unified"], 0), "2048");
}

#[test]
fn each_engine_is_started_with_the_catalogs_context_length() {
    let with = |mut s: ShardSpec, args: &[&str]| {
        s.profile.context_length = 4096;
        s.profile.args = args.iter().map(|a| a.to_string()).collect();
        s
    };
    let sg = Sglang {
        python: Some("python3".into()),
    };
    let sim = Sim {
        bin: Some("/usr/local/bin/llmgw".into()),
    };
    let cases: [(&dyn Engine, ShardSpec, &str); 4] = [
        (&vllm("mp"), single_node(), "--max-model-len 4096"),
        (&sg, single_node(), "--context-length 4096"),
        // Four slots, each with the whole context (llama-server splits
        // --ctx-size among them).
        (&LlamaCpp::default(), llama_spec(&[]), "--ctx-size 16384"),
        (&sim, sim_spec(0, 1), "--max-model-len 4096"),
    ];
    for (engine, spec, flag) in cases {
        let first = &engine.commands(&with(spec.clone(), &[])).unwrap()[0];
        assert!(
            joined(&first.args).contains(flag),
            "{}: {}",
            engine.name(),
            joined(&first.args)
        );
        let own = flag.split(' ').next().unwrap();
        let given = engine.commands(&with(spec, &[own, "128"])).unwrap();
        let args = joined(&given[0].args);
        assert!(
            !args.contains(flag) && args.ends_with(&format!("{own} 128")),
            "{}: {args}",
            engine.name()
        );
    }
}
