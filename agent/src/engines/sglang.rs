use std::path::PathBuf;

use super::{Command, Engine, EngineError, GpuInfo, Probe, Profile, ShardSpec, base_env, strings};

/// SGLang, run as a Python module: one process on every rank.
#[derive(Debug, Clone, Default)]
pub struct Sglang {
    pub python: Option<PathBuf>,
}

impl Engine for Sglang {
    fn name(&self) -> &'static str {
        "sglang"
    }

    fn validate(&self, p: &Profile, gpus: &[GpuInfo]) -> Result<(), EngineError> {
        super::validate_gpu_engine(p, gpus)
    }

    /// Only node-rank 0 binds HTTP.
    fn serves_http(&self, s: &ShardSpec) -> bool {
        s.leader()
    }

    /// The module must import in the configured Python: a Python without
    /// it (or no Python) means no SGLang here.
    fn probe(&self) -> Option<Probe> {
        Some(Probe::Run {
            program: self.python.clone().unwrap_or_else(|| "python3".into()),
            args: strings(&[
                "-c",
                "import sglang, sys; sys.stdout.write(getattr(sglang, '__version__', ''))",
            ]),
        })
    }

    fn commands(&self, s: &ShardSpec) -> Result<Vec<Command>, EngineError> {
        let p = &s.profile;
        let mut args = strings(&[
            "-m",
            "sglang.launch_server",
            "--model-path",
            &p.model_path,
            "--host",
            s.host(),
        ]);
        args.extend(strings(&[
            "--port",
            &s.http_port.to_string(),
            "--tp",
            &p.tp.to_string(),
        ]));
        if !p.served_model_name.is_empty() {
            args.extend(strings(&["--served-model-name", &p.served_model_name]));
        }
        args.extend(super::context_args(p, &["--context-length"]));
        if s.nnodes > 1 {
            args.extend(strings(&[
                "--nnodes",
                &s.nnodes.to_string(),
                "--node-rank",
                &s.rank.to_string(),
            ]));
            args.extend(strings(&["--dist-init-addr", &s.dist_init()]));
        }
        args.extend(p.args.iter().cloned());
        Ok(vec![Command {
            name: "sglang".into(),
            path: self.python.clone().unwrap_or_else(|| "python3".into()),
            args,
            env: base_env(s),
            wait_for_leader_port: false,
        }])
    }
}
