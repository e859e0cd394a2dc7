use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::Outcome;
use crate::config::{self, ConfigError, FileConfig};
use anyhow::bail;
use clap::Args;
use llmgw_gateway::{EndpointSpec, Gateway, GatewayConfig, Listener};

/// Every setting is a flag, an `LLMGW_…` variable and a key of the
/// configuration file alike; a flag or variable wins over the file.
#[derive(Debug, Args)]
pub(crate) struct ServerArgs {
    /// A YAML file (TOML if it ends in .toml) with any of the settings
    /// below (keys as the flags, with `_` for `-`), plus `store`,
    /// `control:` and the `models:` catalog; `LLMGW_A__B` sets `a.b`.
    #[arg(long, env = "LLMGW_CONFIG")]
    config: Option<PathBuf>,
    /// The agent listener (default :7443), with the control plane.
    #[arg(long, env = "LLMGW_AGENT_LISTEN", value_parser = listen_addr)]
    agent_listen: Option<SocketAddr>,
    /// A static endpoint, `id=URL=model[,model…][;engine=E][;weight=N][;priority=N][;pool=P]`;
    /// repeat for several.
    #[arg(long = "endpoint", env = "LLMGW_ENDPOINTS", value_delimiter = ' ')]
    endpoints: Vec<EndpointSpec>,
    /// The client (OpenAI API) listener; `:8080` (the default) means every interface.
    #[arg(long, env = "LLMGW_LISTEN", value_parser = listen_addr)]
    listen: Option<SocketAddr>,
    /// The admin listener (default 127.0.0.1:9090): keep it on loopback.
    #[arg(long, env = "LLMGW_ADMIN_LISTEN", value_parser = listen_addr)]
    admin_listen: Option<SocketAddr>,
    /// A metrics-only listener, off unless given.
    #[arg(long, env = "LLMGW_METRICS_LISTEN", value_parser = listen_addr)]
    metrics_listen: Option<SocketAddr>,
    /// Models to try when a model has no capacity: `model=fallback[,fallback…]`.
    #[arg(long = "fallback", env = "LLMGW_FALLBACKS", value_delimiter = ' ', value_parser = fallback)]
    fallbacks: Vec<(String, Vec<String>)>,
    /// Require API keys, looked up (by hash) in the tenancy view of the
    /// event log at --store; a key decides the band and the models.
    #[arg(long, env = "LLMGW_AUTH")]
    auth: bool,
    /// Append a usage record per request to the event log at --store
    /// (batched, off the request path; a full queue drops and counts).
    #[arg(long, env = "LLMGW_RECORD_USAGE")]
    record_usage: bool,
}

/// The settings once flags, variables and the file are merged.
#[derive(Debug)]
struct Settings {
    agent_listen: SocketAddr,
    agent_tls: Option<config::TlsPems>,
    store: Option<String>,
    control: Option<llmgw_control::ControlConfig>,
    listen: SocketAddr,
    admin_listen: SocketAddr,
    metrics_listen: Option<SocketAddr>,
    endpoints: Vec<EndpointSpec>,
    fallbacks: std::collections::HashMap<String, Vec<String>>,
    record_usage: bool,
    auth: bool,
}

fn settings(a: ServerArgs) -> Result<Settings, ConfigError> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let file = match &a.config {
        Some(path) => config::load(path, &env)?,
        None => FileConfig::default(),
    };
    let addr = |key: &str, v: Option<String>| -> Result<Option<SocketAddr>, ConfigError> {
        v.map(|s| listen_addr(&s).map_err(|e| ConfigError(format!("{key}: {e}"))))
            .transpose()
    };
    let control = control_config(&file)?;
    let agent_tls = file
        .tls
        .as_ref()
        .map(config::TlsSection::read)
        .transpose()?;
    let endpoints = if a.endpoints.is_empty() {
        file.endpoints
            .iter()
            .map(|e| {
                e.parse::<EndpointSpec>()
                    .map_err(|why| ConfigError(format!("endpoints: {why}")))
            })
            .collect::<Result<_, _>>()?
    } else {
        a.endpoints
    };
    let mut fallbacks = file.fallbacks;
    fallbacks.extend(a.fallbacks);
    Ok(Settings {
        agent_listen: a
            .agent_listen
            .or(addr("agent_listen", file.agent_listen)?)
            .unwrap_or_else(|| ([0, 0, 0, 0], 7443).into()),
        store: file.store,
        control,
        agent_tls,
        listen: a
            .listen
            .or(addr("listen", file.listen)?)
            .unwrap_or_else(|| ([0, 0, 0, 0], 8080).into()),
        admin_listen: a
            .admin_listen
            .or(addr("admin_listen", file.admin_listen)?)
            .unwrap_or_else(|| ([127, 0, 0, 1], 9090).into()),
        metrics_listen: a
            .metrics_listen
            .or(addr("metrics_listen", file.metrics_listen)?),
        endpoints,
        fallbacks,
        record_usage: a.record_usage || file.record_usage,
        auth: a.auth || file.auth,
    })
}

fn control_config(file: &FileConfig) -> Result<Option<llmgw_control::ControlConfig>, ConfigError> {
    let c = &file.control;
    if !c.enabled && file.models.is_empty() {
        return Ok(None);
    }
    let mut out = llmgw_control::ControlConfig::default();
    let set = |key: &str,
               v: &Option<String>,
               slot: &mut std::time::Duration|
     -> Result<(), ConfigError> {
        if let Some(v) = v {
            *slot = config::duration(&format!("control.{key}"), v)?;
        }
        Ok(())
    };
    set("interval", &c.interval, &mut out.interval)?;
    set("lease_ttl", &c.lease_ttl, &mut out.lease_ttl)?;
    set(
        "unreachable_after",
        &c.unreachable_after,
        &mut out.unreachable_after,
    )?;
    set("lost_after", &c.lost_after, &mut out.lost_after)?;
    set("base_backoff", &c.base_backoff, &mut out.base_backoff)?;
    set("max_backoff", &c.max_backoff, &mut out.max_backoff)?;
    set("drain_grace", &c.drain_grace, &mut out.drain_grace)?;
    if out.lost_after <= out.unreachable_after {
        return Err(ConfigError(format!(
            "control.lost_after ({:?}) must be longer than control.unreachable_after ({:?})",
            out.lost_after, out.unreachable_after
        )));
    }
    if out.lease_ttl < std::time::Duration::from_millis(300) {
        return Err(ConfigError(
            "control.lease_ttl must be at least 300ms".into(),
        ));
    }
    out.lease_poll = (out.lease_ttl / 10).clamp(
        std::time::Duration::from_millis(50),
        std::time::Duration::from_millis(500),
    );
    if let Some([lo, hi]) = c.port_range {
        if lo == 0 || lo > hi || hi > 64535 {
            return Err(ConfigError(format!(
                "control.port_range [{lo}, {hi}] must be low ≤ high, from 1 to 64535 (rendezvous ports are 1000 above)"
            )));
        }
        out.port_range = (lo, hi);
    }
    if let Some(i) = &c.mgmt_interface {
        out.mgmt_interface = i.clone();
    }
    if let Some(i) = &c.instance {
        out.instance = i.clone();
    } else if let Ok(host) = std::fs::read_to_string("/etc/hostname") {
        out.instance = format!("{}-{}", host.trim(), std::process::id());
    }
    out.models = file.models.clone();
    Ok(Some(out))
}

fn fallback(s: &str) -> Result<(String, Vec<String>), String> {
    let (model, list) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected model=fallback[,fallback…]"))?;
    let list: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    if model.is_empty() || list.is_empty() || list.iter().any(|f| f == model) {
        return Err(format!(
            "{s:?}: name a model and at least one other model to fall back to"
        ));
    }
    Ok((model.to_owned(), list))
}

/// `HOST:PORT`, or `:PORT` for every interface.
fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    full.parse()
        .map_err(|_| format!("{s:?} is not HOST:PORT or :PORT"))
}

pub(crate) async fn run(store: &str, a: ServerArgs) -> anyhow::Result<Outcome> {
    let s = settings(a)?;
    let store = s.store.clone().unwrap_or_else(|| store.to_owned());
    let store = store.as_str();
    if let Some(control) = s.control.clone() {
        let listen = crate::serve::Listen {
            client: s.listen,
            admin: s.admin_listen,
            metrics: s.metrics_listen,
            agent: s.agent_listen,
            agent_tls: s.agent_tls.clone(),
        };
        let (_stop_tx, stop) = tokio::sync::watch::channel(false);
        return crate::serve::run(store, listen, s.fallbacks, control, |_| {}, stop).await;
    }
    if s.endpoints.is_empty() {
        bail!(
            "nothing to serve: give at least one endpoint (--endpoint id=URL=model, or endpoints in --config)"
        );
    }
    if !s.admin_listen.ip().is_loopback() {
        tracing::warn!(addr = %s.admin_listen, "the admin listener is not on loopback");
    }
    let mut usage = None;
    let mut batcher = None;
    let mut keys = None;
    let mut follower = None;
    let log = if s.record_usage || s.auth {
        let address = llmgw_eventstore::StoreAddress::parse(store)?;
        Some(
            llmgw_eventstore::AnyStore::open(&address, llmgw_eventstore::OpenOptions::migrating())
                .await?,
        )
    } else {
        None
    };
    if let (true, Some(store)) = (s.auth, &log) {
        let mut runner = llmgw_projections::Runner::start(store.clone(), "gateway-views").await?;
        keys = Some(llmgw_gateway::auth::KeyDirectory(runner.views()));
        follower = Some(tokio::spawn(async move {
            if let Err(e) = runner.follow().await {
                tracing::error!(error = %e, "the views stopped following the event log");
            }
        }));
    }
    if let (true, Some(store)) = (s.record_usage, log) {
        let (queue, rx) = llmgw_gateway::usage::UsageQueue::new(8192);
        let instance = format!("gateway-{}", std::process::id());
        // Router-only mode has no catalog to price from.
        let price = |_: &str| llmgw_domain::catalog::Price::ZERO;
        batcher = Some(tokio::spawn(llmgw_gateway::usage::run_batcher(
            store,
            instance,
            rx,
            500,
            std::time::Duration::from_millis(200),
            price,
        )));
        usage = Some(queue);
    }
    let gw = Gateway::with_keys(
        GatewayConfig {
            endpoints: s.endpoints,
            fallbacks: s.fallbacks,
            ..GatewayConfig::default()
        },
        usage,
        keys,
    )?;
    let serve = llmgw_gateway::serve(gw, s.listen, s.admin_listen, s.metrics_listen, |l| {
        let mut out = std::io::stdout().lock();
        let _ = match l {
            Listener::Client(addr) => writeln!(out, "client listening on {addr}"),
            Listener::Admin(addr) => writeln!(out, "admin listening on {addr}"),
            Listener::Metrics(addr) => writeln!(out, "metrics listening on {addr}"),
        };
        let _ = out.flush();
    });
    tokio::select! {
        r = serve => r?,
        _ = crate::sim::shutdown() => {}
    }
    if let Some(f) = follower {
        f.abort();
    }
    if let Some(b) = batcher {
        // The queue's sender went with the gateway: the batcher flushes and ends.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), b).await;
    }
    Ok(Outcome::Ok)
}
