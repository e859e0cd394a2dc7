use std::path::PathBuf;

use super::{Command, Engine, EngineError, GpuInfo, Probe, Profile, ShardSpec, base_env, strings};

/// How a multi-node vLLM replica is launched.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LaunchMode {
    /// A Ray cluster: the leader runs a head then the server, a worker only joins.
    #[default]
    Ray,
    /// vLLM's own multiprocessing backend on every rank.
    Mp,
    /// A mode this build does not know, refused when a replica needs it.
    Other(String),
}

impl From<&str> for LaunchMode {
    fn from(s: &str) -> Self {
        match s {
            "" | "ray" => LaunchMode::Ray,
            "mp" => LaunchMode::Mp,
            other => LaunchMode::Other(other.to_owned()),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Vllm {
    pub bin: Option<PathBuf>,
    pub launch_mode: LaunchMode,
    pub ray_bin: Option<PathBuf>,
}

impl Engine for Vllm {
    fn name(&self) -> &'static str {
        "vllm"
    }

    fn validate(&self, p: &Profile, gpus: &[GpuInfo]) -> Result<(), EngineError> {
        super::validate_gpu_engine(p, gpus)
    }

    fn serves_http(&self, s: &ShardSpec) -> bool {
        s.leader()
    }

    fn probe(&self) -> Option<Probe> {
        // Configured: named by the operator, never run. Found on PATH:
        // it must run.
        Some(match &self.bin {
            Some(bin) => Probe::Binary(bin.clone()),
            None => Probe::Run {
                program: "vllm".into(),
                args: strings(&["--version"]),
            },
        })
    }

    fn commands(&self, s: &ShardSpec) -> Result<Vec<Command>, EngineError> {
        let p = &s.profile;
        let mut env = base_env(s);
        let mut args = strings(&[
            "serve",
            &p.model_path,
            "--host",
            s.host(),
            "--port",
            &s.http_port.to_string(),
        ]);
        args.extend(strings(&["--tensor-parallel-size", &p.tp.to_string()]));
        if p.pp > 1 {
            args.extend(strings(&["--pipeline-parallel-size", &p.pp.to_string()]));
        }
        if !p.served_model_name.is_empty() {
            args.extend(strings(&["--served-model-name", &p.served_model_name]));
        }
        args.extend(super::context_args(p, &["--max-model-len"]));
        let multi = s.nnodes > 1;
        if multi {
            env.insert("VLLM_HOST_IP".into(), s.leader_addr.clone());
            match &self.launch_mode {
                LaunchMode::Ray => {
                    env.insert("RAY_ADDRESS".into(), s.dist_init());
                    args.extend(strings(&["--distributed-executor-backend", "ray"]));
                }
                LaunchMode::Mp => {
                    env.insert("VLLM_PORT".into(), s.leader_port.to_string());
                    args.extend(strings(&["--distributed-executor-backend", "mp"]));
                }
                LaunchMode::Other(m) => {
                    return Err(EngineError(format!(
                        "vllm: unknown launch_mode {m:?} (want \"ray\" or \"mp\")"
                    )));
                }
            }
        }
        args.extend(p.args.iter().cloned());
        let server = Command {
            name: "vllm".into(),
            path: self.bin.clone().unwrap_or_else(|| "vllm".into()),
            args,
            env,
            wait_for_leader_port: false,
        };
        if !(multi && self.launch_mode == LaunchMode::Ray) {
            return Ok(vec![server]);
        }
        let gpus = s.gpu_indices.len().to_string();
        let ray_args = if s.leader() {
            strings(&[
                "start",
                "--block",
                "--head",
                "--port",
                &s.leader_port.to_string(),
                "--num-gpus",
                &gpus,
            ])
        } else {
            strings(&[
                "start",
                "--block",
                "--address",
                &s.dist_init(),
                "--num-gpus",
                &gpus,
            ])
        };
        let ray = Command {
            name: "ray".into(),
            path: self.ray_bin.clone().unwrap_or_else(|| "ray".into()),
            args: ray_args,
            env: base_env(s),
            wait_for_leader_port: true,
        };
        // A worker only joins: the cluster gives its GPUs to the leader.
        Ok(if s.leader() {
            vec![ray, server]
        } else {
            vec![ray]
        })
    }
}
