use std::io::Write;
use std::path::PathBuf;

use clap::Subcommand;
use llmgw_agent::discovery::{self, Options};

use crate::Outcome;
use crate::output::{Table, json_line};

#[derive(Debug, Subcommand)]
pub(crate) enum AgentCommand {
    /// What the scheduler would see of this machine, as `agent run` would
    /// discover it: its --config file's and LLMGW_AGENT_… variables'
    /// discovery settings apply, under these flags.
    Inventory(Box<InventoryArgs>),
    /// Run the agent: connect to the control plane and carry out its
    /// starts and stops. A stop signal ends the agent and leaves engines
    /// running.
    Run(Box<RunArgs>),
}

/// Discovery's settings, from the flags, the variables and the agent's
/// file as `agent run` reads them.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct InventoryArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// The agent's file (as `agent run --config`): its model_dirs,
    /// fabrics, nvidia_smi, skip_gpus, no_nvml and cache_dir apply.
    #[arg(long, env = "LLMGW_AGENT_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) discovery: Discovery,
    /// Where /etc, /proc and /sys are (for fixtures).
    #[arg(long, default_value = "/", hide = true)]
    pub(crate) root: PathBuf,
}

/// What discovery looks with: `agent run` and `agent inventory` alike.
#[derive(Debug, Default, clap::Args, serde::Serialize)]
pub(crate) struct Discovery {
    /// A directory of model weights; repeat for several.
    #[arg(
        long = "model-dir",
        env = "LLMGW_AGENT_MODEL_DIRS",
        value_delimiter = ','
    )]
    pub(crate) model_dirs: Vec<PathBuf>,
    /// A fabric and the adapters on it: `ib-a=mlx5_0,mlx5_1`; repeat (in
    /// the variable, separated by spaces).
    #[arg(long = "fabric", env = "LLMGW_AGENT_FABRICS", value_delimiter = ' ', value_parser = fabric)]
    #[serde(serialize_with = "as_map")]
    pub(crate) fabrics: Vec<(String, Vec<String>)>,
    /// The nvidia-smi to run (default: the one on PATH; none = CPU node).
    #[arg(long, env = "LLMGW_AGENT_NVIDIA_SMI")]
    pub(crate) nvidia_smi: Option<PathBuf>,
    /// Report no GPUs, whatever is installed (a CPU node).
    #[arg(long, env = "LLMGW_AGENT_SKIP_GPUS", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) skip_gpus: Option<bool>,
    /// Ask only nvidia-smi (NVML, when it loads, adds NVLink peers).
    #[arg(long, env = "LLMGW_AGENT_NO_NVML", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) no_nvml: Option<bool>,
    /// Where fetched weights are kept and looked for (default
    /// /var/lib/llmgw-weights).
    #[arg(long, env = "LLMGW_AGENT_CACHE_DIR")]
    pub(crate) cache_dir: Option<PathBuf>,
}

impl Discovery {
    /// Discovery's options, and the weights cache (which the caller
    /// scans: `run` makes it, `inventory` only reads it).
    pub(crate) fn options(self) -> (Options, PathBuf) {
        // Said once, not refused: a mount may come after the agent starts,
        // and its weights are found from then on.
        for d in self.model_dirs.iter().filter(|d| !d.is_dir()) {
            tracing::warn!(
                dir = %d.display(),
                "a model directory is not a directory here: no weights are found in it until it is"
            );
        }
        let options = Options {
            nvidia_smi: self.nvidia_smi,
            skip_gpus: self.skip_gpus.unwrap_or(false),
            prefer_nvml: !self.no_nvml.unwrap_or(false),
            model_dirs: self.model_dirs,
            fabrics: self.fabrics.into_iter().collect(),
            ..Options::default()
        };
        let cache = self
            .cache_dir
            .unwrap_or_else(|| "/var/lib/llmgw-weights".into());
        (options, cache)
    }
}

/// Every setting is a flag, an `LLMGW_AGENT_…` variable and a key of
/// `--config` alike (the key as the flag, `_` for `-`; lists plural): a
/// flag or variable wins over the file, the file over the default.
#[derive(Debug, Default, clap::Args, serde::Serialize)]
pub(crate) struct RunArgs {
    /// A YAML file (TOML if it ends in .toml) with any of the settings
    /// below as keys: `servers: [..]`, `labels: {k: v}`, `fabrics: {name:
    /// [hca, ..]}`, `model_dirs: [..]`, the rest as the flags. Unknown keys
    /// are refused.
    #[arg(long, env = "LLMGW_AGENT_CONFIG")]
    #[serde(skip)]
    pub(crate) config: Option<PathBuf>,
    /// Print the settings the agent would run with (the file, the
    /// variables and the flags resolved) as JSON and exit; nothing
    /// connects. Exit 2 with the reason when they are wrong.
    #[arg(long)]
    #[serde(skip)]
    pub(crate) check: bool,
    /// A control plane's agent endpoint, `http://host:7443`; repeat for
    /// several (a standby refuses and the next is tried).
    #[arg(long = "server", env = "LLMGW_AGENT_SERVERS", value_delimiter = ',')]
    pub(crate) servers: Vec<String>,
    /// This node's id (default: the hostname).
    #[arg(long, env = "LLMGW_AGENT_NODE_ID")]
    pub(crate) node_id: Option<String>,
    /// The address engines are reached on, never a fabric address
    /// (default: this host's address on the route to the first server).
    #[arg(long, env = "LLMGW_AGENT_MGMT_ADDR")]
    pub(crate) mgmt_addr: Option<String>,
    /// Seconds between heartbeats, fractions allowed (default 5).
    #[arg(long, env = "LLMGW_AGENT_HEARTBEAT_S")]
    pub(crate) heartbeat_s: Option<f64>,
    /// The longest wait between reconnection attempts, in seconds
    /// (default 30).
    #[arg(long, env = "LLMGW_AGENT_RECONNECT_MAX_S")]
    pub(crate) reconnect_max_s: Option<f64>,
    /// A label for node selectors, `key=value`; repeat.
    #[arg(long = "label", env = "LLMGW_AGENT_LABELS", value_delimiter = ',', value_parser = label)]
    #[serde(serialize_with = "as_map")]
    pub(crate) labels: Vec<(String, String)>,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) discovery: Discovery,
    /// Where shard state files and engine logs are kept, so that a
    /// restarted agent adopts the engines it left running (default
    /// /var/lib/llmgw-agent).
    #[arg(long, env = "LLMGW_AGENT_WORK_DIR")]
    pub(crate) work_dir: Option<PathBuf>,
    /// Join the cluster with a token from `llmgw ctl node token`: the
    /// agent makes its key, gets its certificate signed by the leader and
    /// keeps both in --work-dir (identity/), then dials with mutual TLS,
    /// on restarts too (the same token again is not sent; a new one joins
    /// again).
    #[arg(long, env = "LLMGW_AGENT_JOIN", hide_env_values = true)]
    #[serde(serialize_with = "secret")]
    pub(crate) join: Option<String>,
    /// Mutual TLS with the control plane: the authority's certificate.
    #[arg(long, env = "LLMGW_AGENT_TLS_CA")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// This node's certificate (`llmgw ctl cert issue-client NODE`).
    #[arg(long, env = "LLMGW_AGENT_TLS_CERT")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// This node's private key, which stays on the node.
    #[arg(long, env = "LLMGW_AGENT_TLS_KEY")]
    pub(crate) tls_key: Option<PathBuf>,
    /// The address engines listen on (default: --mgmt-addr, where the
    /// gateway reaches them, when this host holds it; else every
    /// interface).
    #[arg(long, env = "LLMGW_AGENT_ENGINE_BIND")]
    pub(crate) engine_bind: Option<String>,
    /// How long an engine gets to stop before SIGKILL, in seconds
    /// (default 30).
    #[arg(long, env = "LLMGW_AGENT_STOP_TIMEOUT_S")]
    pub(crate) stop_timeout_s: Option<f64>,
    /// Seconds between looks at installed engines and GPU health
    /// (default 60).
    #[arg(long, env = "LLMGW_AGENT_RECHECK_S")]
    pub(crate) recheck_s: Option<f64>,
    /// Hours the logs of stopped shards are kept in --work-dir (0: for
    /// ever; default 168); a live shard's log is never removed.
    #[arg(long, env = "LLMGW_AGENT_ENGINE_LOG_RETENTION_H")]
    pub(crate) engine_log_retention_h: Option<f64>,
    /// Serve the agent's own metrics at `/metrics` here (`HOST:PORT`, or
    /// `:PORT` for every interface): whether its stream is up, reconnects,
    /// shards by state. Off unless given.
    #[arg(long, env = "LLMGW_AGENT_METRICS_LISTEN", value_parser = crate::server::listen_addr)]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
    /// Where engines the control plane asks for (`engines:` in the
    /// server's file) are installed, as `<engine>/<version>-<variant>/`
    /// (default /opt/llmgw/engines).
    #[arg(long, env = "LLMGW_AGENT_ENGINES_DIR")]
    pub(crate) engines_dir: Option<PathBuf>,
    /// Install the OS packages a provisioned engine needs (libgomp) with
    /// the node's package manager, waiting for its lock at most 10
    /// minutes (default true); false leaves them to the operator, and a
    /// missing library then fails the engine with its name.
    #[arg(long, env = "LLMGW_AGENT_OS_PACKAGES", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) os_packages: Option<bool>,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) engines: EngineArgs,
}

/// Where each engine is on this node and how it is launched.
#[derive(Debug, Default, clap::Args, serde::Serialize)]
pub(crate) struct EngineArgs {
    /// The `vllm` executable (default: `vllm` on PATH).
    #[arg(long, env = "LLMGW_AGENT_VLLM_BIN")]
    pub(crate) vllm_bin: Option<PathBuf>,
    /// How a multi-node vLLM replica starts: a Ray cluster, or vLLM's own
    /// multiprocessing on every rank (default ray).
    #[arg(long, env = "LLMGW_AGENT_VLLM_LAUNCH_MODE", value_parser = ["ray", "mp"])]
    pub(crate) vllm_launch_mode: Option<String>,
    /// The `ray` executable for Ray launches (default: `ray` on PATH).
    #[arg(long, env = "LLMGW_AGENT_RAY_BIN")]
    pub(crate) ray_bin: Option<PathBuf>,
    /// The Python that has SGLang installed (default: `python3`).
    #[arg(long, env = "LLMGW_AGENT_SGLANG_PYTHON")]
    pub(crate) sglang_python: Option<PathBuf>,
    /// The `llama-server` executable (default: `llama-server` on PATH,
    /// else under /opt/llama.cpp).
    #[arg(long, env = "LLMGW_AGENT_LLAMACPP_BIN")]
    pub(crate) llamacpp_bin: Option<PathBuf>,
    /// llama-server's concurrent slots (0, the default: 4).
    #[arg(long, env = "LLMGW_AGENT_LLAMACPP_PARALLEL")]
    pub(crate) llamacpp_parallel: Option<u32>,
}

/// Pairs as the map they are in the file.
fn as_map<S: serde::Serializer, V: serde::Serialize>(
    pairs: &[(String, V)],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

fn secret<S: serde::Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(_) => s.serialize_str("(set)"),
        None => s.serialize_none(),
    }
}

fn label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?}: expected key=value")),
    }
}

fn seconds(name: &str, v: f64) -> anyhow::Result<std::time::Duration> {
    if !crate::agent_config::valid_seconds(v) {
        anyhow::bail!("--{name} must be a positive number of seconds");
    }
    Ok(std::time::Duration::from_secs_f64(v))
}

pub(crate) fn session_config(a: RunArgs) -> anyhow::Result<llmgw_agent::session::SessionConfig> {
    let node_id = match a.node_id {
        Some(n) => n,
        None => llmgw_agent::discovery::host::hostname(),
    };
    let work_dir = a.work_dir.unwrap_or_else(|| "/var/lib/llmgw-agent".into());
    if a.join.is_some() && a.tls_ca.is_some() {
        anyhow::bail!(
            "--join (or LLMGW_AGENT_JOIN) and --tls-ca/--tls-cert/--tls-key are two ways to the same certificate: give one"
        );
    }
    // A token, or certificates from an earlier join: mutual TLS, whose
    // files run_agent fills in once it has them.
    let joined =
        a.tls_ca.is_none() && (a.join.is_some() || llmgw_agent::join::stored(&work_dir)?.is_some());
    let servers = llmgw_agent::session::server_urls(&a.servers, a.tls_ca.is_some() || joined)?;
    let tls = match (&a.tls_ca, &a.tls_cert, &a.tls_key) {
        (Some(ca), Some(cert), Some(key)) => {
            let read = |p: &PathBuf| {
                std::fs::read_to_string(p)
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))
            };
            Some((read(ca)?, read(cert)?, read(key)?))
        }
        _ if joined => None,
        _ => {
            tracing::warn!(
                "the stream to the control plane is plaintext: for a trusted network only (see `llmgw ctl node token` and LLMGW_AGENT_JOIN)"
            );
            None
        }
    };
    let mut c = llmgw_agent::session::SessionConfig::new(servers, node_id);
    c.agent_log = AGENT_LOG.get().cloned();
    c.mgmt_addr = a.mgmt_addr.unwrap_or_else(|| "127.0.0.1".into());
    c.engine_bind = a.engine_bind;
    c.work_dir = Some(work_dir);
    c.tls = tls;
    c.labels = a.labels.into_iter().collect();
    c.heartbeat = seconds("heartbeat-s", a.heartbeat_s.unwrap_or(5.0))?;
    c.reconnect_max = seconds("reconnect-max-s", a.reconnect_max_s.unwrap_or(30.0))?;
    c.reconnect_base = c.reconnect_base.min(c.reconnect_max);
    c.stop_timeout = seconds("stop-timeout-s", a.stop_timeout_s.unwrap_or(30.0))?;
    c.recheck = seconds("recheck-s", a.recheck_s.unwrap_or(60.0))?;
    c.log_retention = match a.engine_log_retention_h.unwrap_or(168.0) {
        0.0 => None,
        h if h.is_finite() && h > 0.0 => Some(std::time::Duration::from_secs_f64(h * 3600.0)),
        _ => anyhow::bail!(
            "--engine-log-retention-h must be 0 (for ever) or a positive number of hours"
        ),
    };
    c.provision.root = a
        .engines_dir
        .unwrap_or_else(|| llmgw_agent::provision::DEFAULT_ROOT.into());
    c.provision.system.install_packages = a.os_packages.unwrap_or(true);
    let (discovery, cache_dir) = a.discovery.options();
    c.discovery = discovery;
    // The cache is where weights appear, so it is scanned like a model
    // directory; it is created now, or fetching is off (said loudly).
    match std::fs::create_dir_all(&cache_dir) {
        Ok(()) => {
            c.discovery.model_dirs.push(cache_dir.clone());
            c.cache_dir = Some(cache_dir);
        }
        Err(e) => {
            tracing::error!(dir = %cache_dir.display(), error = %e, "no weights cache: remote sources cannot be fetched")
        }
    }
    Ok(c)
}

/// The agent's own log lines, set up with logging before the agent runs.
pub(crate) static AGENT_LOG: std::sync::OnceLock<llmgw_agent::supervisor::LogTail> =
    std::sync::OnceLock::new();

pub(crate) fn engines(a: &EngineArgs) -> llmgw_agent::engines::Registry {
    use llmgw_agent::engines::{LlamaCpp, Registry, Sglang, Sim, Vllm};
    Registry::new(
        Vllm {
            bin: a.vllm_bin.clone(),
            launch_mode: a.vllm_launch_mode.as_deref().unwrap_or("ray").into(),
            ray_bin: a.ray_bin.clone(),
        },
        Sglang {
            python: a.sglang_python.clone(),
        },
        LlamaCpp::new(a.llamacpp_bin.clone(), a.llamacpp_parallel.unwrap_or(0)),
        Sim::default(),
    )
}

/// The certificates to dial with when the agent joins (or joined) with a
/// token: the stored ones when this token (or none) was used before, else
/// a new join. None when stopped while joining.
async fn identity(
    token: Option<&str>,
    config: &llmgw_agent::session::SessionConfig,
    work_dir: &std::path::Path,
    stopped: &mut (impl std::future::Future<Output = ()> + Unpin),
) -> anyhow::Result<Option<llmgw_agent::join::Identity>> {
    use llmgw_agent::join;
    let node = &config.node_id;
    let stored = join::stored(work_dir)?;
    let identity = match (token, stored) {
        (Some(t), Some(s)) if s.token_hash == join::token_hash(t) => {
            tracing::info!(dir = %join::identity_dir(work_dir).display(), "joined earlier with this token: using the stored certificate");
            s
        }
        (None, Some(s)) => s,
        (Some(t), _) => {
            tracing::info!(node = %node, "joining the cluster with a token");
            tokio::select! {
                r = join::join(&config.servers, node, t, work_dir, (config.reconnect_base, config.reconnect_max)) => r?,
                _ = stopped => return Ok(None),
            }
        }
        (None, None) => anyhow::bail!(
            "no certificates to dial with: join with a token in LLMGW_AGENT_JOIN (`llmgw ctl node token`)"
        ),
    };
    match join::node_of(&identity.cert) {
        Some(n) if &n == node => Ok(Some(identity)),
        other => anyhow::bail!(
            "the certificate in {} names node {}, not {node}: run with --node-id {}, or join again with a token for {node}",
            join::identity_dir(work_dir).display(),
            other.as_deref().unwrap_or("(none)"),
            other.as_deref().unwrap_or("ID"),
        ),
    }
}

async fn run_agent(a: RunArgs) -> anyhow::Result<Outcome> {
    let check = a.check;
    let mut a = crate::agent_config::resolve(a)?;
    // An empty LLMGW_AGENT_JOIN (an env file's blank line) is no token.
    a.join = a.join.take().filter(|t| !t.trim().is_empty());
    if check {
        let mut out = std::io::stdout().lock();
        json_line(&mut out, &a)?;
        return Ok(Outcome::Ok);
    }
    let metrics_listen = a.metrics_listen.take();
    let token = a.join.clone();
    let work_dir = a.work_dir.clone().unwrap_or_default();
    let own_tls = a.tls_ca.is_some();
    let registry = engines(&a.engines);
    let mut config = session_config(a)?;
    // Listening for a stop before saying ready: a stop that follows
    // READY=1 at once is still a clean one.
    let mut stopped = Box::pin(crate::sim::shutdown());
    // The metrics page is up before any join, whose wait can be long: a
    // port that is taken fails the start, and a scrape sees the agent
    // not connected meanwhile.
    let stats = std::sync::Arc::<llmgw_agent::metrics::AgentStats>::default();
    let _metrics = match metrics_listen {
        Some(addr) => Some(serve_metrics(addr, stats.clone()).await?),
        None => None,
    };
    let mut ready = false;
    if !own_tls && (token.is_some() || llmgw_agent::join::stored(&work_dir)?.is_some()) {
        // Ready before joining, as before connecting: a control plane
        // that is down must not fail the unit.
        crate::notify::notify(crate::notify::READY);
        ready = true;
        match identity(token.as_deref(), &config, &work_dir, &mut stopped).await? {
            Some(id) => config.tls = Some((id.ca, id.cert, id.key)),
            None => return Ok(Outcome::Ok),
        }
    }
    let (tx, rx) = tokio::sync::watch::channel(false);
    let agent = llmgw_agent::session::Agent::new(config, registry).reporting_to(stats);
    let task = tokio::spawn(agent.run(rx));
    // Ready on start, not on the first connection: the agent redials for
    // ever and its engines serve meanwhile, so a control plane that is
    // down must not fail (and restart) the unit.
    if !ready {
        crate::notify::notify(crate::notify::READY);
    }
    stopped.await;
    crate::notify::notify(crate::notify::STOPPING);
    let _ = tx.send(true);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), task).await;
    Ok(Outcome::Ok)
}

/// Serves the agent's metrics page until the returned guard is dropped;
/// says where on standard output.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    stats: std::sync::Arc<llmgw_agent::metrics::AgentStats>,
) -> anyhow::Result<AbortOnDrop> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for metrics: {e}"))?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let page = llmgw_agent::metrics::render(&stats);
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    page,
                )
            }
        }),
    );
    let mut out = std::io::stdout().lock();
    // In the log's form: a plain line among JSON ones stopped a shipper.
    let line = crate::logging::stdout_line(&format!("metrics listening on {bound}"));
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(AbortOnDrop(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the agent's metrics listener stopped");
        }
    })))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn fabric(s: &str) -> Result<(String, Vec<String>), String> {
    let (name, hcas) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected fabric=hca[,hca…]"))?;
    let hcas: Vec<String> = hcas
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    if name.is_empty() || hcas.is_empty() {
        return Err(format!("{s:?}: name the fabric and at least one adapter"));
    }
    Ok((name.to_owned(), hcas))
}

pub(crate) async fn run(cmd: AgentCommand) -> anyhow::Result<Outcome> {
    let a = match cmd {
        AgentCommand::Run(a) => return run_agent(*a).await,
        AgentCommand::Inventory(a) => *a,
    };
    let json = a.json;
    let options = crate::agent_config::inventory_options(a)?;
    let (inv, error) = tokio::task::spawn_blocking(move || discovery::discover(&options)).await?;
    if let Some(e) = error {
        return Err(e.into());
    }
    let mut out = std::io::stdout().lock();
    // The figure placement's min_disk_gb is checked against, by the
    // control plane's rule.
    let disk_free_gb = discovery::storage::weights_free_gb(&inv.storage);
    if json {
        let mut v = serde_json::to_value(&inv)?;
        if let (Some(gb), Some(o)) = (disk_free_gb, v.as_object_mut()) {
            o.insert("disk_free_gb".into(), gb.into());
        }
        json_line(&mut out, &v)?;
        return Ok(Outcome::Ok);
    }
    let h = &inv.host;
    writeln!(
        out,
        "host     {} {} ({}) {}, cpu {}",
        h.os_id,
        h.os_version,
        h.os_codename,
        h.arch,
        h.cpu_flags.join(" ")
    )?;
    let mem = if inv.memory_total_mb == 0 {
        "unknown".to_owned()
    } else {
        format!("{} MiB", inv.memory_total_mb)
    };
    writeln!(out, "memory   {mem}")?;
    let disk = match (inv.storage.first(), disk_free_gb) {
        (Some(s), Some(gb)) => format!("{gb} GB free where weights go ({})", s.path),
        (Some(s), None) => format!(
            "{} is on a shared filesystem: not this node's own space, so min_disk_gb is not checked",
            s.path
        ),
        (None, _) => "unknown: no weights cache or model directory could be measured".to_owned(),
    };
    writeln!(out, "disk     {disk}")?;
    writeln!(out, "gpus     {} (from {})", inv.gpus.len(), inv.source)?;
    if !inv.gpus.is_empty() {
        let mut t = Table::new(vec!["INDEX", "CLASS", "NAME", "MEMORY MIB", "HEALTH"]);
        for g in &inv.gpus {
            let health = if g.health.ok() {
                "ok".to_owned()
            } else {
                g.health.problems.join("; ")
            };
            t.row(vec![
                g.index.to_string(),
                g.class.clone(),
                g.name.clone(),
                g.memory_total_mb.to_string(),
                health,
            ]);
        }
        t.print(&mut out)?;
    }
    writeln!(out, "adapters {}", inv.hcas.len())?;
    for c in &inv.fabrics {
        writeln!(out, "fabric   {}: {}", c.fabric, c.describe())?;
    }
    for w in &inv.weights {
        writeln!(out, "weights  {} ({} bytes)", w.path, w.size_bytes)?;
    }
    Ok(Outcome::Ok)
}
