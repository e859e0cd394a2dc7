use std::io::Write;
use std::net::SocketAddr;

use anyhow::bail;
use clap::Args;
use llmgw_gateway::{EndpointSpec, Gateway, GatewayConfig, Listener};

use crate::Outcome;

#[derive(Debug, Args)]
pub(crate) struct ServerArgs {
    /// A static endpoint, `id=URL=model[,model…]`; repeat for several.
    #[arg(long = "endpoint", env = "LLMGW_ENDPOINTS", value_delimiter = ' ')]
    endpoints: Vec<EndpointSpec>,
    /// The client (OpenAI API) listener; `:8080` means every interface.
    #[arg(long, env = "LLMGW_LISTEN", default_value = ":8080", value_parser = listen_addr)]
    listen: SocketAddr,
    /// The admin listener: keep it on loopback.
    #[arg(long, env = "LLMGW_ADMIN_LISTEN", default_value = "127.0.0.1:9090", value_parser = listen_addr)]
    admin_listen: SocketAddr,
    /// Models to try when a model has no capacity: `model=fallback[,fallback…]`.
    #[arg(long = "fallback", env = "LLMGW_FALLBACKS", value_delimiter = ' ', value_parser = fallback)]
    fallbacks: Vec<(String, Vec<String>)>,
    /// Append a usage record per request to the event log at --store
    /// (batched, off the request path; a full queue drops and counts).
    #[arg(long, env = "LLMGW_RECORD_USAGE")]
    record_usage: bool,
    /// A metrics-only listener, off unless given.
    #[arg(long, env = "LLMGW_METRICS_LISTEN", value_parser = listen_addr)]
    metrics_listen: Option<SocketAddr>,
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
    if a.endpoints.is_empty() {
        bail!(
            "nothing to serve: give at least one --endpoint id=URL=model (the control plane arrives later)"
        );
    }
    if !a.admin_listen.ip().is_loopback() {
        tracing::warn!(addr = %a.admin_listen, "the admin listener is not on loopback");
    }
    let mut usage = None;
    let mut batcher = None;
    if a.record_usage {
        let address = llmgw_eventstore::StoreAddress::parse(store)?;
        let store =
            llmgw_eventstore::AnyStore::open(&address, llmgw_eventstore::OpenOptions::migrating())
                .await?;
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
    let gw = Gateway::new(
        GatewayConfig {
            endpoints: a.endpoints,
            fallbacks: a.fallbacks.into_iter().collect(),
            ..GatewayConfig::default()
        },
        usage,
    )?;
    let serve = llmgw_gateway::serve(gw, a.listen, a.admin_listen, a.metrics_listen, |l| {
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
    if let Some(b) = batcher {
        // The queue's sender went with the gateway: the batcher flushes and ends.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), b).await;
    }
    Ok(Outcome::Ok)
}
