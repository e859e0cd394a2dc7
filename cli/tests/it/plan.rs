//! `llmgw ctl plan M` against a real server whose nodes report their GPUs
//! (stub nvidia-smi): a model's config.json and safetensors index, written
//! here, sized against each class of the fleet and the catalog's profiles.

use std::path::Path;

use serde_json::{Value, json};

use super::Child;
use super::cluster::{ctl, free_port, get, start_server, until};

/// Llama 3.1's published shapes, and their index's total size in bytes.
fn write_model(dir: &Path, hidden: u32, inter: u32, layers: u32, heads: u32, total_size: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let config = json!({"architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16"});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let index = json!({"metadata": {"total_size": total_size},
        "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

/// An agent whose nvidia-smi reports `cards` (name, MiB) lines.
fn gpu_agent(port: u16, node: &str, dir: &Path, cards: &[(&str, u64)]) -> Child {
    use std::os::unix::fs::PermissionsExt;
    let lines: String = cards
        .iter()
        .enumerate()
        .map(|(i, (name, mb))| {
            format!("echo '{i}, GPU-{node}-{i}, {name}, {mb}, 0, 9.0, 00000000:{i:02X}:00.0, 550.54, 30, 0'\n")
        })
        .collect();
    let smi = dir.join(format!("smi-{node}"));
    std::fs::write(&smi, format!("#!/bin/sh\n{lines}")).unwrap();
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    let work = dir.join(format!("work-{node}"));
    let cache = dir.join(format!("cache-{node}"));
    Child::spawn(&[
        "agent",
        "run",
        "--server",
        &format!("127.0.0.1:{port}"),
        "--node-id",
        node,
        "--mgmt-addr",
        "127.0.0.1",
        "--heartbeat-s",
        "0.2",
        "--no-nvml",
        "--nvidia-smi",
        smi.to_str().unwrap(),
        "--work-dir",
        work.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ])
}

fn plan_json(admin: &str, args: &[&str]) -> (bool, Value, String) {
    let mut all = vec!["plan"];
    all.extend_from_slice(args);
    all.push("--json");
    let (ok, out, err) = ctl(admin, &all);
    (ok, serde_json::from_str(&out).unwrap_or(Value::Null), err)
}

fn class<'a>(plan: &'a Value, name: &str) -> &'a Value {
    plan["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["class"] == name)
        .unwrap_or_else(|| panic!("no class {name} in {plan}"))
}

/// A 70B model in bf16 needs two 80 GB cards (the catalog's two-card
/// profile, not its one-card one) and no number of 24 GB cards a node
/// here has; in fp8 one 80 GB card holds it; an 8B model in bf16 fits one
/// 24 GB card, for which the catalog has no profile, so one is proposed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_sizes_a_model_against_the_fleets_gpu_classes_and_the_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("llama-70b");
    write_model(&big, 8192, 28672, 80, 64, 141_107_412_992);
    let small = dir.path().join("llama-8b");
    write_model(&small, 4096, 14336, 32, 32, 16_060_522_496);
    let port = free_port();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let config = dir.path().join("server.yaml");
    let profile = |name: &str, tp: u32| {
        format!(
            "      - name: {name}\n        engine: vllm\n        gpu_class: h100-80g\n        tp: {tp}\n        gpus_per_node: {tp}\n"
        )
    };
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\nagent_listen: \"127.0.0.1:{port}\"\nstore: \"{store}\"\ncontrol:\n  interval: 200ms\nmodels:\n  - name: big\n    source: {}\n    scaling: {{min: 0, max: 1}}\n    profiles:\n{}{}  - name: remote\n    source: hf:meta-llama/Llama-3.1-8B\n    scaling: {{min: 0, max: 1}}\n",
            big.display(),
            profile("h100-tp1", 1),
            profile("h100-tp2", 2),
        ),
    )
    .unwrap();
    let server = start_server(config.to_str().unwrap());
    let _h100 = gpu_agent(
        port,
        "h100-node",
        dir.path(),
        &[("NVIDIA H100 80GB HBM3", 81559); 2],
    );
    let _rtx = gpu_agent(
        port,
        "rtx-node",
        dir.path(),
        &[("NVIDIA GeForce RTX 4090", 24564)],
    );
    until("both nodes with their cards", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        let with_gpus = nodes
            .as_array()?
            .iter()
            .filter(|n| n["gpus"].as_u64() > Some(0))
            .count();
        (with_gpus == 2).then_some(())
    })
    .await;

    // From the catalog's source, a directory on this machine.
    let (ok, plan, err) = plan_json(&server.admin, &["big"]);
    assert!(ok, "{err}");
    assert_eq!(plan["params"], 70_553_706_496u64, "{plan}");
    assert_eq!(plan["params_exact"], true);
    assert_eq!(plan["dtype"], "bf16");
    let h100 = class(&plan, "h100-80g");
    assert_eq!(
        (h100["per_node"].as_u64(), h100["nodes"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(h100["split"]["tp"], 2, "{h100}");
    assert_eq!(h100["split"]["pp"], 1);
    assert_eq!(h100["catalog_profile"], "h100-tp2");
    assert_eq!(h100["catalog_profiles_too_small"], json!(["h100-tp1"]));
    assert_eq!(class(&plan, "4090-24g")["split"], Value::Null);

    // The table says the same to a person.
    let (ok, table, err) = ctl(&server.admin, &["plan", "big"]);
    assert!(ok, "{err}");
    assert!(
        table.contains("70.6 B parameters (from the weight index)"),
        "{table}"
    );
    let row = table.lines().find(|l| l.starts_with("h100-80g")).unwrap();
    assert!(
        row.contains("tp=2 pp=1") && row.contains("h100-tp2 (catalog); too small: h100-tp1"),
        "{table}"
    );

    // In fp8 one card holds it.
    let (ok, plan, err) = plan_json(&server.admin, &["big", "--dtype", "fp8"]);
    assert!(ok, "{err}");
    assert_eq!(class(&plan, "h100-80g")["split"]["tp"], 1);
    assert_eq!(class(&plan, "h100-80g")["catalog_profile"], "h100-tp1");

    // Any local copy, catalogued or not: an 8B model fits one 24 GB card.
    let (ok, plan, err) = plan_json(
        &server.admin,
        &["llama-8b", "--path", small.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    let rtx = class(&plan, "4090-24g");
    assert_eq!(rtx["split"]["tp"], 1, "{rtx}");
    assert_eq!(rtx["catalog_profile"], Value::Null);
    assert_eq!(
        rtx["suggested_profile"],
        "{gpu_class: 4090-24g, tp: 1, pp: 1, nodes: 1, gpus_per_node: 1}"
    );

    // A source that is not on this machine is not fetched.
    let (ok, _, err) = ctl(&server.admin, &["plan", "remote"]);
    assert!(!ok);
    assert!(
        err.contains("is not a path on this machine") && err.contains("--path"),
        "{err}"
    );

    // A --path that is not there is said before the cluster is asked
    // (here: at an address where nothing answers).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["ctl", "plan", "m", "--path", "/no/such/model", "--admin"])
        .arg(format!("http://127.0.0.1:{}", super::cluster::free_port()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--path /no/such/model: no such directory"),
        "{err}"
    );

    // A model no class holds: exit 1, with every class saying so.
    let huge = dir.path().join("huge");
    write_model(&huge, 16384, 53248, 126, 128, 810_000_000_000);
    let (ok, plan, _) = plan_json(&server.admin, &["huge", "--path", huge.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        plan["classes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["split"].is_null()),
        "{plan}"
    );
}

/// A catalog source on the mirror: plan reads the version's config.json
/// and index from the mirror's byte path (--mirror), and says what to give
/// when it is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_reads_a_mirrored_models_shape_from_the_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let version = models.join("llama-8b").join("2026-03");
    write_model(&version, 4096, 14336, 32, 32, 16_060_522_496);
    std::fs::write(version.join("model-00001-of-00002.safetensors"), b"w").unwrap();
    let mirror = super::mirror::start_mirror(&models, &[]);
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let config = dir.path().join("server.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\nagent_listen: \"127.0.0.1:{}\"\nstore: \"{store}\"\nmirror:\n  url: {}\nmodels:\n  - name: small\n    source: mirror:llama-8b/2026-03/model-00001-of-00002.safetensors\n    scaling: {{min: 0, max: 1}}\n",
            free_port(),
            mirror.bytes
        ),
    )
    .unwrap();
    let server = start_server(config.to_str().unwrap());
    until("the catalog", || async {
        let models = get(format!("{}/api/v1/models", server.admin)).await;
        (models.as_array()?.len() == 1).then_some(())
    })
    .await;
    let (_, plan, err) = plan_json(&server.admin, &["small", "--mirror", &mirror.bytes]);
    assert_eq!(plan["params"], 8_030_261_248u64, "{plan} {err}");
    assert_eq!(plan["params_exact"], true);
    assert_eq!(plan["path"], format!("{}/llama-8b/2026-03", mirror.bytes));
    let (ok, _, err) = ctl(&server.admin, &["plan", "small"]);
    assert!(!ok && err.contains("--mirror"), "{err}");
}
