use std::path::{Path, PathBuf};
use std::sync::RwLock;

use super::{
    Command, Engine, EngineError, GpuInfo, Probe, Profile, ShardSpec, base_env, has_flag, strings,
    validate_common,
};

/// llama.cpp's `llama-server`: a CPU (or single-node GPU) model behind the
/// same API, one shard per replica.
#[derive(Debug, Default)]
pub struct LlamaCpp {
    pub bin: Option<PathBuf>,
    /// Concurrent slots; 0 means 4 (llama.cpp's own default of 1 serialises).
    pub parallel: u32,
    /// A provisioned build and its version.
    installed: RwLock<Option<(PathBuf, String)>>,
}

impl LlamaCpp {
    pub fn new(bin: Option<PathBuf>, parallel: u32) -> Self {
        LlamaCpp {
            bin,
            parallel,
            installed: RwLock::new(None),
        }
    }

    fn installed(&self) -> Option<(PathBuf, String)> {
        self.installed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The configured binary, else the provisioned build, else one found
    /// on PATH or under /opt/llama.cpp.
    fn binary(&self) -> PathBuf {
        self.bin
            .clone()
            .or_else(|| self.installed().map(|(bin, _)| bin))
            .unwrap_or_else(|| default_binary(Path::new(OPT_DIR)))
    }
}

/// Where llama.cpp's own release archives and `cmake --install` builds
/// are commonly put by hand, outside PATH.
pub const OPT_DIR: &str = "/opt/llama.cpp";

/// `llama-server` on PATH, else under `opt` (at its top, in `bin/` or in
/// `build/bin/`, the three layouts llama.cpp's archives and builds leave),
/// else the bare name (which the probe then reports as absent).
pub fn default_binary(opt: &Path) -> PathBuf {
    let bare = Path::new("llama-server");
    super::probe::find_executable(bare)
        .or_else(|| binary_under(opt))
        .unwrap_or_else(|| bare.to_path_buf())
}

/// An executable `llama-server` in one of the layouts under `opt`.
pub fn binary_under(opt: &Path) -> Option<PathBuf> {
    ["llama-server", "bin/llama-server", "build/bin/llama-server"]
        .iter()
        .map(|rel| opt.join(rel))
        .find(|c| super::probe::find_executable(c).is_some())
}

/// The model file for a path: the path itself unless it is a directory, in
/// which case its first `.gguf` file by name (split models' first part
/// sorts first; llama.cpp finds the rest).
pub fn gguf_in(path: &Path) -> Result<PathBuf, EngineError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {}
        // A missing file is the engine's to report.
        _ => return Ok(path.to_path_buf()),
    }
    let entries = std::fs::read_dir(path)
        .map_err(|e| EngineError(format!("reading {}: {e}", path.display())))?;
    let mut ggufs: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.to_lowercase().ends_with(".gguf"))
        .collect();
    ggufs.sort();
    ggufs
        .first()
        .map(|f| path.join(f))
        .ok_or_else(|| EngineError(format!("{} holds no .gguf file", path.display())))
}

impl Engine for LlamaCpp {
    fn name(&self) -> &'static str {
        "llamacpp"
    }

    fn validate(&self, p: &Profile, gpus: &[GpuInfo]) -> Result<(), EngineError> {
        validate_common(p, gpus)?;
        if p.nodes > 1 {
            return Err(EngineError(format!(
                "profile {:?}: llamacpp does not span nodes; use vllm or sglang for a {}-node replica",
                p.name, p.nodes
            )));
        }
        if p.tp > 1 {
            return Err(EngineError(format!(
                "profile {:?}: llamacpp does not do tensor parallelism; it splits a model across local GPUs with --tensor-split, which this adapter does not drive",
                p.name
            )));
        }
        Ok(())
    }

    fn serves_http(&self, _s: &ShardSpec) -> bool {
        true
    }

    fn probe(&self) -> Option<Probe> {
        Some(match (&self.bin, self.installed()) {
            // Named by the operator: looked up, never run.
            (Some(bin), _) => Probe::Binary(bin.clone()),
            (None, Some((_, version))) => Probe::Seen(version),
            // Merely found: it counts once it runs.
            (None, None) => Probe::Run {
                program: default_binary(Path::new(OPT_DIR)),
                args: strings(&["--version"]),
            },
        })
    }

    fn use_installed(&self, installed: Option<(PathBuf, String)>) -> bool {
        *self.installed.write().unwrap_or_else(|p| p.into_inner()) = installed;
        true
    }

    fn commands(&self, s: &ShardSpec) -> Result<Vec<Command>, EngineError> {
        let p = &s.profile;
        let model = gguf_in(Path::new(&p.model_path))?;
        // --metrics always, or there is no /metrics to route by.
        let mut args = strings(&["--model", &model.display().to_string(), "--host", s.host()]);
        args.extend(strings(&["--port", &s.http_port.to_string(), "--metrics"]));
        if !has_flag(&p.args, &["--jinja", "--no-jinja"]) {
            // Pins the model's own chat template across engine upgrades.
            args.push("--jinja".into());
        }
        if !p.served_model_name.is_empty() {
            args.extend(strings(&["--alias", &p.served_model_name]));
        }
        let parallel = ["--parallel", "-np"];
        let slots = if has_flag(&p.args, &parallel) {
            flag_value(&p.args, &parallel).unwrap_or(1)
        } else {
            let n = if self.parallel > 0 { self.parallel } else { 4 };
            args.extend(strings(&["--parallel", &n.to_string()]));
            n
        };
        // llama-server splits --ctx-size among its slots (unless their
        // cache is unified): each request gets the catalog's context only
        // when the whole is that times the slots. A quarter of it, as
        // /v1/models advertised it all, refused requests that fit.
        let unified = has_flag(&p.args, &["--kv-unified", "-kvu"]);
        let mut per_request = super::context_args(p, &["--ctx-size", "-c"]);
        if let [_, size] = per_request.as_mut_slice()
            && !unified
        {
            *size = (u64::from(p.context_length) * u64::from(slots.max(1))).to_string();
        }
        args.extend(per_request);
        if !s.gpu_indices.is_empty() && !has_flag(&p.args, &["--n-gpu-layers", "-ngl"]) {
            // Never 0: CPU builds may reject the flag.
            args.extend(strings(&["--n-gpu-layers", "999"]));
        }
        args.extend(p.args.iter().cloned());
        Ok(vec![Command {
            name: "llama-server".into(),
            path: self.binary(),
            args,
            env: base_env(s),
            wait_for_leader_port: false,
        }])
    }
}

/// The number after one of `names` (`--parallel 8` or `--parallel=8`), if
/// the arguments give one that reads.
fn flag_value(args: &[String], names: &[&str]) -> Option<u32> {
    args.iter().enumerate().find_map(|(i, a)| {
        names.iter().find_map(|n| {
            if a == n {
                args.get(i + 1)?.parse().ok()
            } else {
                a.strip_prefix(&format!("{n}="))?.parse().ok()
            }
        })
    })
}
