use std::path::PathBuf;

use super::{
    Command, Engine, EngineError, GpuInfo, Profile, ShardSpec, base_env, strings, validate_common,
};

/// `llmgw sim-engine`: exercises placement, fabrics and multi-node
/// sequencing without GPUs. Its rendezvous flags are SGLang's
/// (`--nnodes --node-rank --dist-init-addr`), so the multi-node launch
/// path is the same one.
#[derive(Debug, Clone, Default)]
pub struct Sim {
    /// The llmgw binary; None uses the running one.
    pub bin: Option<PathBuf>,
}

impl Engine for Sim {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn validate(&self, p: &Profile, gpus: &[GpuInfo]) -> Result<(), EngineError> {
        validate_common(p, gpus)
    }

    fn serves_http(&self, s: &ShardSpec) -> bool {
        s.leader()
    }

    fn commands(&self, s: &ShardSpec) -> Result<Vec<Command>, EngineError> {
        let path = match &self.bin {
            Some(b) => b.clone(),
            None => std::env::current_exe().map_err(|e| {
                EngineError(format!("locating the llmgw binary for the sim engine: {e}"))
            })?,
        };
        let p = &s.profile;
        let mut args = strings(&[
            "sim-engine",
            "--listen",
            &super::host_port(s.host(), s.http_port),
            "--model",
            &p.served_model_name,
            // Its own metric names, which the gateway's scraper expects of
            // a sim endpoint.
            "--engine",
            "sim",
        ]);
        if s.nnodes > 1 {
            args.extend(strings(&[
                "--nnodes",
                &s.nnodes.to_string(),
                "--node-rank",
                &s.rank.to_string(),
            ]));
            args.extend(strings(&["--dist-init-addr", &s.dist_init()]));
        }
        args.extend(super::context_args(p, &["--max-model-len"]));
        args.extend(p.args.iter().cloned());
        Ok(vec![Command {
            name: "sim-engine".into(),
            path,
            args,
            env: base_env(s),
            wait_for_leader_port: s.nnodes > 1 && !s.leader(),
        }])
    }
}
