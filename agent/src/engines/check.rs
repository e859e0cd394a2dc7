//! Whether an engine build understands every flag llmgw would pass it,
//! checked against the engine's own full `--help`. A truncated help text
//! would make present flags look missing, so the whole output is read.

use std::collections::BTreeSet;

use super::{Engine, Profile, ShardSpec};

/// The flags llmgw itself passes to `engine`, over the launches it makes
/// (single node, multi-node leader and worker, with and without GPUs).
/// Ray's own flags are not the engine's and are left out.
pub fn flags_used(engine: &dyn Engine) -> BTreeSet<String> {
    let base = ShardSpec {
        nnodes: 1,
        http_port: 20000,
        leader_addr: "10.0.0.1".into(),
        leader_port: 20001,
        mgmt_interface: "eth0".into(),
        profile: Profile {
            name: "check".into(),
            tp: 2,
            pp: 2,
            nodes: 1,
            model_path: "/nonexistent/model.gguf".into(),
            served_model_name: "model".into(),
            context_length: 4096,
            ..Profile::default()
        },
        ..ShardSpec::default()
    };
    let mut specs = vec![
        base.clone(),
        ShardSpec {
            gpu_indices: vec![0, 1],
            ..base.clone()
        },
    ];
    for rank in [0, 1] {
        specs.push(ShardSpec {
            rank,
            nnodes: 2,
            gpu_indices: vec![0, 1],
            hcas: vec!["mlx5_0".into()],
            ..base.clone()
        });
    }
    let mut flags = BTreeSet::new();
    for s in specs {
        let Ok(cmds) = engine.commands(&s) else {
            continue;
        };
        for c in cmds.iter().filter(|c| c.name != "ray") {
            for a in &c.args {
                if a.starts_with('-') && a.len() > 1 && a != "-m" {
                    flags.insert(a.split('=').next().unwrap_or(a).to_owned());
                }
            }
        }
    }
    flags
}

/// The flags of `used` that `help` does not mention as a whole flag.
pub fn missing(used: &BTreeSet<String>, help: &str) -> Vec<String> {
    used.iter()
        .filter(|f| !mentions(help, f))
        .cloned()
        .collect()
}

fn mentions(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let before = help[..i].chars().next_back();
        let after = help[i + flag.len()..].chars().next();
        let boundary = |c: Option<char>| {
            c.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        };
        boundary(before) && boundary(after)
    })
}
