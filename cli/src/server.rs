use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use llmgw_gateway::{EndpointSpec, Gateway, GatewayConfig, Listener};
use serde::Deserialize;

use crate::Outcome;

/// Every setting is a flag, an `LLMGW_…` variable and a key of the
/// configuration file alike; a flag or variable wins over the file.
#[derive(Debug, Args)]
pub(crate) struct ServerArgs {
    /// A TOML file with any of the settings below (keys as the flags, with
    /// `_` for `-`: `listen`, `admin_listen`, `endpoints = [...]`,
    /// `[fallbacks]`).
    #[arg(long, env = "LLMGW_CONFIG")]
    config: Option<PathBuf>,
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

/// The configuration file's shape. Unknown keys are refused, so that a
/// typo is an error rather than a silently ignored setting.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    admin_listen: Option<String>,
    metrics_listen: Option<String>,
    #[serde(default)]
    endpoints: Vec<String>,
    #[serde(default)]
    fallbacks: HashMap<String, Vec<String>>,
    #[serde(default)]
    record_usage: bool,
    #[serde(default)]
    auth: bool,
}

/// The settings once flags, variables and the file are merged.
#[derive(Debug)]
struct Settings {
    listen: SocketAddr,
    admin_listen: SocketAddr,
    metrics_listen: Option<SocketAddr>,
    endpoints: Vec<EndpointSpec>,
    fallbacks: HashMap<String, Vec<String>>,
    record_usage: bool,
    auth: bool,
}

fn settings(a: ServerArgs) -> anyhow::Result<Settings> {
    let file = match &a.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            toml::from_str::<FileConfig>(&text)
                .with_context(|| format!("{} is not a valid configuration", path.display()))?
        }
        None => FileConfig::default(),
    };
    let addr = |key: &str, v: Option<String>| -> anyhow::Result<Option<SocketAddr>> {
        v.map(|s| listen_addr(&s).map_err(|e| anyhow::anyhow!("{key}: {e}")))
            .transpose()
    };
    let endpoints = if a.endpoints.is_empty() {
        file.endpoints
            .iter()
            .map(|e| {
                e.parse::<EndpointSpec>()
                    .map_err(|why| anyhow::anyhow!("endpoints: {why}"))
            })
            .collect::<anyhow::Result<_>>()?
    } else {
        a.endpoints
    };
    let mut fallbacks = file.fallbacks;
    fallbacks.extend(a.fallbacks);
    Ok(Settings {
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
