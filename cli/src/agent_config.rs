//! `llmgw agent run --config agent.yaml`: every flag of `agent run` as a
//! key (`_` for `-`; repeatable flags plural, as lists or maps), checked
//! whole before the agent dials. Precedence: a flag or its `LLMGW_AGENT_…`
//! variable, then the file, then the default; a list given as a flag
//! replaces the file's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::agent::{Discovery, InventoryArgs, RunArgs};
use crate::config::ConfigError;

/// The file's shape. Unknown keys are refused, so that a typo is an error
/// rather than a setting silently not applied.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentFile {
    /// One address, or a list tried in order.
    pub servers: Option<OneOrMany>,
    pub node_id: Option<String>,
    pub mgmt_addr: Option<String>,
    pub heartbeat_s: Option<f64>,
    pub reconnect_max_s: Option<f64>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub model_dirs: Vec<PathBuf>,
    /// A fabric's name and its adapters.
    #[serde(default)]
    pub fabrics: BTreeMap<String, Vec<String>>,
    pub nvidia_smi: Option<PathBuf>,
    pub skip_gpus: Option<bool>,
    pub no_nvml: Option<bool>,
    pub work_dir: Option<PathBuf>,
    pub join: Option<String>,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub cache_dir: Option<PathBuf>,
    pub engine_bind: Option<String>,
    pub stop_timeout_s: Option<f64>,
    pub recheck_s: Option<f64>,
    pub engine_log_retention_h: Option<f64>,
    pub metrics_listen: Option<String>,
    pub engines_dir: Option<PathBuf>,
    pub os_packages: Option<bool>,
    pub vllm_bin: Option<PathBuf>,
    pub vllm_launch_mode: Option<String>,
    pub ray_bin: Option<PathBuf>,
    pub sglang_python: Option<PathBuf>,
    pub llamacpp_bin: Option<PathBuf>,
    pub llamacpp_parallel: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// Reads and checks the file: YAML, or TOML for a `.toml` name.
pub(crate) fn load(path: &Path) -> Result<AgentFile, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
    let invalid = |e: &dyn std::fmt::Display| {
        ConfigError(format!(
            "{} is not a valid agent configuration: {e}",
            path.display()
        ))
    };
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("toml"))
    {
        toml::from_str(&text).map_err(|e| invalid(&e))
    } else if text.trim().is_empty() {
        Ok(AgentFile::default())
    } else {
        serde_norway::from_str(&text).map_err(|e| invalid(&e))
    }
}

/// The variables agents were configured with before every variable was
/// `LLMGW_AGENT_…`; still read when the new one is not set.
pub(crate) const OLDER_NAMES: [&str; 4] = [
    "LLMGW_NODE_ID",
    "LLMGW_MGMT_ADDR",
    "LLMGW_JOIN_TOKEN",
    // Every other flag's variable is its name; this one lacked ENGINE_.
    "LLMGW_AGENT_LOG_RETENTION_H",
];

/// Lays the older variables, the file and the defaults under what the
/// flags and variables gave, and checks the result; `mgmt_addr` defaults
/// to this host's address on the route to the first server.
pub(crate) fn resolve(mut a: RunArgs) -> Result<RunArgs, ConfigError> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let mut known = crate::server::variables();
    known.extend(OLDER_NAMES.map(String::from));
    crate::config::misspelt_variables(&env, &known)?;
    let older = |i: usize| std::env::var(OLDER_NAMES[i]).ok().filter(|v| !v.is_empty());
    a.node_id = a.node_id.or_else(|| older(0));
    a.mgmt_addr = a.mgmt_addr.or_else(|| older(1));
    a.join = a.join.or_else(|| older(2));
    if a.engine_log_retention_h.is_none()
        && let Some(h) = older(3)
    {
        a.engine_log_retention_h = Some(h.trim().parse().map_err(|_| {
            ConfigError(format!("{}={h:?} is not a number of hours", OLDER_NAMES[3]))
        })?);
    }
    if let Some(path) = a.config.clone() {
        merge(&mut a, load(&path)?)?;
    }
    if a.servers.is_empty() {
        return Err(ConfigError(
            "no control plane to dial: give --server (LLMGW_AGENT_SERVERS) or servers: in --config"
                .into(),
        ));
    }
    let tls = [
        a.tls_ca.is_some(),
        a.tls_cert.is_some(),
        a.tls_key.is_some(),
    ];
    if tls.contains(&true) && tls.contains(&false) {
        return Err(ConfigError(
            "tls_ca, tls_cert and tls_key go together: give all three or none".into(),
        ));
    }
    a.heartbeat_s.get_or_insert(5.0);
    a.reconnect_max_s.get_or_insert(30.0);
    a.discovery.skip_gpus.get_or_insert(false);
    a.discovery.no_nvml.get_or_insert(false);
    a.work_dir
        .get_or_insert_with(|| "/var/lib/llmgw-agent".into());
    // A cache named outright must be usable: without one nothing remote
    // is fetched. The default may not be (an agent run by a person); then
    // fetching is off, and the start says so.
    if let Some(dir) = &a.discovery.cache_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            ConfigError(format!(
                "--cache-dir {}: cannot create it: {e}",
                dir.display()
            ))
        })?;
    }
    a.discovery
        .cache_dir
        .get_or_insert_with(|| "/var/lib/llmgw-weights".into());
    a.stop_timeout_s.get_or_insert(30.0);
    a.recheck_s.get_or_insert(60.0);
    a.engine_log_retention_h.get_or_insert(168.0);
    a.engines_dir
        .get_or_insert_with(|| llmgw_agent::provision::DEFAULT_ROOT.into());
    a.os_packages.get_or_insert(true);
    a.engines
        .vllm_launch_mode
        .get_or_insert_with(|| "ray".into());
    a.engines.llamacpp_parallel.get_or_insert(0);
    check(&a)?;
    // With its own certificate a node is the node it names (the server
    // refuses a stream whose id is another): that is the default id.
    if a.node_id.is_none()
        && let Some(cert) = &a.tls_cert
        && let Ok(pem) = std::fs::read_to_string(cert)
    {
        a.node_id = llmgw_agent::join::node_of(&pem);
    }
    // So does a certificate an earlier join stored; failing that, the
    // machine's hostname. Resolved here so that `--check` shows it.
    if a.node_id.is_none()
        && a.tls_ca.is_none()
        && let Some(work_dir) = &a.work_dir
        && let Ok(Some(joined)) = llmgw_agent::join::stored(work_dir)
    {
        a.node_id = llmgw_agent::join::node_of(&joined.cert);
    }
    a.node_id
        .get_or_insert_with(llmgw_agent::discovery::host::hostname);
    // https:// with nothing to show the server: every dial fails, for
    // ever, with a transport error that does not say why.
    let token = a.join.as_deref().is_some_and(|t| !t.trim().is_empty());
    let stored = a
        .work_dir
        .as_deref()
        .is_some_and(|w| matches!(llmgw_agent::join::stored(w), Ok(Some(_))));
    if a.tls_ca.is_none()
        && !token
        && !stored
        && let Some(url) = a.servers.iter().find(|s| s.trim().starts_with("https://"))
    {
        return Err(ConfigError(format!(
            "--server {url}: a TLS listener asks this node for a certificate, and it has none: join with a token (`llmgw ctl node token` on the server, then --join TOKEN), or give --tls-ca, --tls-cert and --tls-key; a plaintext listener is dialled with http://"
        )));
    }
    if a.mgmt_addr.is_none() {
        // Engines and other nodes reach this node where the control plane
        // does; loopback only when the control plane is on this host.
        let first = &a.servers[0];
        a.mgmt_addr = Some(match llmgw_agent::discovery::host::route_addr(first) {
            Some(ip) => ip.to_string(),
            None => {
                tracing::warn!(server = %first, "no route to the control plane to take this node's address from; engines are reached at 127.0.0.1 (set --mgmt-addr)");
                "127.0.0.1".into()
            }
        });
    }
    let mgmt = a.mgmt_addr.as_deref().unwrap_or_default();
    let ip = |s: &str| {
        s.trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .ok()
    };
    // An address or a name: the gateway makes http://ADDR:PORT of it.
    if mgmt.contains('/') || (mgmt.contains(':') && ip(mgmt).is_none()) {
        return Err(ConfigError(format!(
            "--mgmt-addr {mgmt:?} is not an address or a host name (no scheme, no port: the control plane picks engines' ports)"
        )));
    }
    // A bind address must be one this host holds: else every start on the
    // node fails, found only once the control plane places work there.
    if let Some(bind) = a.engine_bind.as_deref() {
        let Some(at) = ip(bind) else {
            return Err(ConfigError(format!(
                "--engine-bind {bind:?} is not an IP address (engines listen on it; 0.0.0.0 is every interface)"
            )));
        };
        if let Err(e) = std::net::TcpListener::bind((at, 0)) {
            return Err(ConfigError(format!(
                "--engine-bind {bind}: engines cannot listen there ({e}): give an address this host holds"
            )));
        }
    }
    if let (Some(bind), Some(reached)) = (a.engine_bind.as_deref().and_then(ip), ip(mgmt))
        && bind.is_loopback()
        && !reached.is_loopback()
    {
        return Err(ConfigError(format!(
            "--engine-bind {bind} is loopback, but engines are reached at --mgmt-addr {reached}: the gateway could never reach them; leave --engine-bind out (engines then listen on the management address)"
        )));
    }
    // Behind NAT the two differ on purpose; elsewhere the gateway dials an
    // address nothing listens on, and every request for the node's
    // replicas fails while they read ready.
    if let (Some(bind), Some(reached)) = (a.engine_bind.as_deref().and_then(ip), ip(mgmt))
        && !bind.is_unspecified()
        && bind != reached
    {
        tracing::warn!(engine_bind = %bind, mgmt_addr = %reached, "engines listen on --engine-bind but the gateway reaches them at --mgmt-addr: unless a NAT forwards one to the other, requests for this node's replicas fail");
    }
    // Not refused: a network mount may come up after the agent; but a typo
    // would otherwise leave the node reporting no weights without a word.
    for dir in a.discovery.model_dirs.iter().filter(|d| !d.is_dir()) {
        tracing::warn!(dir = %dir.display(), "a model directory that is not there (yet): no weights are found in it until it is");
    }
    if a.engine_bind.is_none() {
        // Nothing in front of an engine checks keys or counts usage: it
        // listens where the gateway reaches it, not on every interface.
        // An address this host does not hold (behind NAT, a name) cannot
        // be bound, so then every interface, said once.
        let mgmt = a.mgmt_addr.as_deref().unwrap_or_default();
        let bare = mgmt.trim_start_matches('[').trim_end_matches(']');
        match bare.parse::<std::net::IpAddr>() {
            Ok(ip) if std::net::TcpListener::bind((ip, 0)).is_ok() => {
                a.engine_bind = Some(ip.to_string());
            }
            _ => tracing::warn!(
                mgmt_addr = %mgmt,
                "engines listen on every interface: --mgmt-addr is not an address this host holds (a name, or an address behind NAT); set --engine-bind to narrow it"
            ),
        }
    }
    Ok(a)
}

/// What `agent inventory` discovers with: its flags and variables, over
/// the agent's file, over the defaults, as `agent run` would (the cache
/// is scanned like a model directory, when it exists, and its disk is
/// measured, where it would be made when it does not: `agent run` makes
/// it, and a fresh node showed no disk).
pub(crate) fn inventory_options(
    a: InventoryArgs,
) -> Result<llmgw_agent::discovery::Options, ConfigError> {
    let mut d = a.discovery;
    if let Some(path) = &a.config {
        merge_discovery(&mut d, &mut load(path)?)?;
    }
    gpus_asked_once(&d)?;
    let (mut options, cache) = d.options();
    options.root = a.root;
    if cache.is_dir() {
        options.model_dirs.push(cache.clone());
    }
    options.cache_dir = Some(cache);
    Ok(options)
}

/// A period the agent takes: positive and under a day.
pub(crate) fn valid_seconds(v: f64) -> bool {
    v.is_finite() && v > 0.0 && v < 86_400.0
}

/// What the agent would refuse once it starts, refused here, so that
/// `--check` says so too (and the start exits 2).
fn check(a: &RunArgs) -> Result<(), ConfigError> {
    if a.join.as_deref().is_some_and(|t| !t.trim().is_empty()) && a.tls_ca.is_some() {
        return Err(ConfigError(
            "--join (or LLMGW_AGENT_JOIN) and --tls-ca/--tls-cert/--tls-key are two ways to the same certificate: give one".into(),
        ));
    }
    let seconds = [
        ("heartbeat-s", a.heartbeat_s),
        ("reconnect-max-s", a.reconnect_max_s),
        ("stop-timeout-s", a.stop_timeout_s),
        ("recheck-s", a.recheck_s),
    ];
    for (name, v) in seconds {
        if v.is_some_and(|v| !valid_seconds(v)) {
            return Err(ConfigError(format!(
                "--{name} must be a positive number of seconds, under a day"
            )));
        }
    }
    if a.engine_log_retention_h.is_some_and(|h| {
        !(h.is_finite() && h >= 0.0) || std::time::Duration::try_from_secs_f64(h * 3600.0).is_err()
    }) {
        return Err(ConfigError(
            "--engine-log-retention-h must be 0 (for ever) or a positive number of hours".into(),
        ));
    }
    // What the start reads before it dials: a token's shape, the
    // certificate files, and the servers' scheme for the TLS that follows.
    let join = a.join.as_deref().filter(|t| !t.trim().is_empty());
    if join.is_some_and(|t| llmgw_api::join_token::split(t).is_none()) {
        return Err(ConfigError(
            "--join: not a join token: tokens look like llmgw-join-….… as `llmgw ctl node token` prints them".into(),
        ));
    }
    for (name, file) in [
        ("tls-ca", &a.tls_ca),
        ("tls-cert", &a.tls_cert),
        ("tls-key", &a.tls_key),
    ] {
        if let Some(p) = file
            && let Err(e) = std::fs::read(p)
        {
            return Err(ConfigError(format!(
                "--{name}: cannot read {}: {e}",
                p.display()
            )));
        }
    }
    let joined = match (&a.work_dir, join) {
        (_, Some(_)) => true,
        (Some(dir), None) => llmgw_agent::join::stored(dir)
            .map_err(|e| ConfigError(e.to_string()))?
            .is_some(),
        (None, None) => false,
    };
    llmgw_agent::session::server_urls(&a.servers, a.tls_ca.is_some() || joined)
        .map_err(|e| ConfigError(e.to_string()))?;
    gpus_asked_once(&a.discovery)
}

/// A CPU node asks no one about GPUs: naming how to ask would do nothing.
fn gpus_asked_once(d: &Discovery) -> Result<(), ConfigError> {
    if d.skip_gpus == Some(true) {
        let set = [
            (d.nvidia_smi.is_some(), "--nvidia-smi"),
            (d.no_nvml == Some(true), "--no-nvml"),
        ];
        if let Some((_, what)) = set.iter().find(|(s, _)| *s) {
            return Err(ConfigError(format!(
                "{what} says how to find GPUs, and --skip-gpus reports none: give one"
            )));
        }
    }
    Ok(())
}

/// The file's discovery settings under what the flags and variables gave
/// (a list given there replaces the file's).
fn merge_discovery(d: &mut Discovery, f: &mut AgentFile) -> Result<(), ConfigError> {
    if d.model_dirs.is_empty() {
        d.model_dirs = std::mem::take(&mut f.model_dirs);
    }
    if d.fabrics.is_empty() {
        d.fabrics = std::mem::take(&mut f.fabrics).into_iter().collect();
    }
    if let Some((name, _)) = d.fabrics.iter().find(|(n, h)| n.is_empty() || h.is_empty()) {
        return Err(ConfigError(format!(
            "fabrics: {name:?} needs a name and at least one adapter"
        )));
    }
    d.nvidia_smi = d.nvidia_smi.take().or(f.nvidia_smi.take());
    d.skip_gpus = d.skip_gpus.or(f.skip_gpus);
    d.no_nvml = d.no_nvml.or(f.no_nvml);
    d.cache_dir = d.cache_dir.take().or(f.cache_dir.take());
    Ok(())
}

fn merge(a: &mut RunArgs, mut f: AgentFile) -> Result<(), ConfigError> {
    merge_discovery(&mut a.discovery, &mut f)?;
    fn or<T>(flag: &mut Option<T>, file: Option<T>) {
        if flag.is_none() {
            *flag = file;
        }
    }
    if a.servers.is_empty() {
        a.servers = match f.servers {
            Some(OneOrMany::One(s)) => vec![s],
            Some(OneOrMany::Many(v)) => v,
            None => Vec::new(),
        };
    }
    if a.labels.is_empty() {
        a.labels = f.labels.into_iter().collect();
    }
    if let Some(mode) = &f.vllm_launch_mode
        && !["ray", "mp"].contains(&mode.as_str())
    {
        return Err(ConfigError(format!(
            "vllm_launch_mode: {mode:?} is neither ray nor mp"
        )));
    }
    let metrics = f
        .metrics_listen
        .as_deref()
        .map(crate::server::listen_addr)
        .transpose()
        .map_err(|e| ConfigError(format!("metrics_listen: {e}")))?;
    or(&mut a.node_id, f.node_id);
    or(&mut a.mgmt_addr, f.mgmt_addr);
    or(&mut a.heartbeat_s, f.heartbeat_s);
    or(&mut a.reconnect_max_s, f.reconnect_max_s);
    or(&mut a.work_dir, f.work_dir);
    or(&mut a.join, f.join);
    or(&mut a.tls_ca, f.tls_ca);
    or(&mut a.tls_cert, f.tls_cert);
    or(&mut a.tls_key, f.tls_key);
    or(&mut a.engine_bind, f.engine_bind);
    or(&mut a.stop_timeout_s, f.stop_timeout_s);
    or(&mut a.recheck_s, f.recheck_s);
    or(&mut a.engine_log_retention_h, f.engine_log_retention_h);
    or(&mut a.metrics_listen, metrics);
    or(&mut a.engines_dir, f.engines_dir);
    or(&mut a.os_packages, f.os_packages);
    let e = &mut a.engines;
    or(&mut e.vllm_bin, f.vllm_bin);
    or(&mut e.vllm_launch_mode, f.vllm_launch_mode);
    or(&mut e.ray_bin, f.ray_bin);
    or(&mut e.sglang_python, f.sglang_python);
    or(&mut e.llamacpp_bin, f.llamacpp_bin);
    or(&mut e.llamacpp_parallel, f.llamacpp_parallel);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag of `agent run` is a key of the file and has an
    /// `LLMGW_AGENT_…` variable: a flag added without either fails here.
    #[test]
    fn every_flag_is_a_key_and_a_variable() {
        let cli = crate::Cli::command();
        let run = cli
            .find_subcommand("agent")
            .and_then(|a| a.find_subcommand("run"))
            .expect("agent run");
        let mut missing = Vec::new();
        for arg in run.get_arguments() {
            let id = arg.get_id().as_str();
            if ["help", "config", "check"].contains(&id) {
                continue;
            }
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            if !env
                .as_deref()
                .is_some_and(|e| e.starts_with("LLMGW_AGENT_"))
            {
                missing.push(format!("--{id}: no LLMGW_AGENT_ variable ({env:?})"));
            }
            // A null value is refused by a list, never as an unknown key.
            if let Err(e) = serde_norway::from_str::<super::AgentFile>(&format!("{id}: ~"))
                && e.to_string().contains("unknown field")
            {
                missing.push(format!("--{id}: not a key of the file ({e})"));
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}
