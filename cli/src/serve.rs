//! The server with its control plane: the gateway routes by the router
//! view, the control plane leads or stands by on the shared log, agents
//! connect on the agent listener, operators on the admin listener.

use std::io::Write;
use std::net::SocketAddr;

use llmgw_control::{AgentSvc, ControlConfig, ControlPlane};
use llmgw_gateway::{Gateway, GatewayConfig, Listener};
use tokio::sync::watch;

use crate::Outcome;

/// Where a started server listens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bound {
    pub client: SocketAddr,
    pub admin: SocketAddr,
    pub agent: SocketAddr,
}

#[derive(Debug, Clone)]
pub(crate) struct Listen {
    pub client: SocketAddr,
    pub admin: SocketAddr,
    pub metrics: Option<SocketAddr>,
    pub agent: SocketAddr,
    /// Mutual TLS on the agent listener; None is plaintext.
    pub agent_tls: Option<crate::config::TlsPems>,
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Serves until SIGINT/SIGTERM or `stop`, then steps down as leader.
pub(crate) async fn run(
    store: &str,
    listen: Listen,
    fallbacks: std::collections::HashMap<String, Vec<String>>,
    control: ControlConfig,
    on_bound: impl FnOnce(Bound) + Send,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<Outcome> {
    if !listen.admin.ip().is_loopback() {
        tracing::warn!(addr = %listen.admin, "the admin listener is not on loopback");
    }
    let address = llmgw_eventstore::StoreAddress::parse(store)?;
    let log =
        llmgw_eventstore::AnyStore::open(&address, llmgw_eventstore::OpenOptions::migrating())
            .await?;
    let mut runner =
        llmgw_projections::Runner::start(log.clone(), &format!("views-{}", control.instance))
            .await?;
    let views = runner.views();
    let position = runner.watch_position();
    let follower = tokio::spawn(async move {
        if let Err(e) = runner.follow().await {
            tracing::error!(error = %e, "the views stopped following the event log");
        }
    });
    let gw = Gateway::with_keys(
        GatewayConfig {
            fallbacks,
            ..GatewayConfig::default()
        },
        None,
        None,
    )?;
    // The gateway routes by the router view, refreshed as the log moves.
    let routes = {
        let (gw, views, mut position) = (gw.clone(), views.clone(), position.clone());
        tokio::spawn(async move {
            loop {
                {
                    let v = views.read().unwrap_or_else(|p| p.into_inner());
                    gw.apply_router_view(&v.router);
                }
                if position.changed().await.is_err() {
                    return;
                }
            }
        })
    };
    let cp = ControlPlane::new(log, views, position, control);
    {
        let cp = cp.clone();
        gw.on_demand(llmgw_gateway::DemandHook(Box::new(move |m| cp.demand(m))));
    }
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let leading = tokio::spawn(cp.clone().run(shutdown_rx.clone()));

    let agent_l = tokio::net::TcpListener::bind(listen.agent)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {} for agents: {e}", listen.agent))?;
    let agent_addr = agent_l.local_addr()?;
    let mut grpc_stop = shutdown_rx.clone();
    let mut builder = tonic::transport::Server::builder();
    match &listen.agent_tls {
        Some(t) => {
            use tonic::transport::{Certificate, Identity, ServerTlsConfig};
            let tls = ServerTlsConfig::new()
                .identity(Identity::from_pem(&t.cert, &t.key))
                .client_ca_root(Certificate::from_pem(&t.ca));
            builder = builder.tls_config(tls).map_err(|e| {
                anyhow::anyhow!("the agent listener's TLS files do not fit together: {e}")
            })?;
            tracing::info!("agent streams require client certificates (mutual TLS)");
        }
        None => tracing::warn!(
            "agent streams are plaintext: for a trusted network only (see `llmgw ctl cert` and the tls: section)"
        ),
    }
    let grpc = builder
        .add_service(llmgw_api::AgentServiceServer::new(AgentSvc(cp.clone())))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(agent_l),
            async move {
                let _ = grpc_stop.wait_for(|s| *s).await;
            },
        );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let serve = llmgw_gateway::serve_with(
        gw,
        listen.client,
        listen.admin,
        listen.metrics,
        llmgw_control::admin::router(cp.clone()),
        move |l| {
            let _ = tx.send(l);
        },
    );
    tokio::pin!(serve);
    tokio::pin!(grpc);
    let mut client = None;
    let mut admin = None;
    let mut on_bound = Some(on_bound);
    say(format!("agent listening on {agent_addr}"));
    loop {
        tokio::select! {
            r = &mut serve => { r?; break; }
            r = &mut grpc => { r?; break; }
            Some(l) = rx.recv() => {
                match l {
                    Listener::Client(a) => { client = Some(a); say(format!("client listening on {a}")); }
                    Listener::Admin(a) => { admin = Some(a); say(format!("admin listening on {a}")); }
                    Listener::Metrics(a) => say(format!("metrics listening on {a}")),
                }
                if let (Some(c), Some(a)) = (client, admin)
                    && let Some(f) = on_bound.take()
                {
                    f(Bound { client: c, admin: a, agent: agent_addr });
                }
            }
            _ = crate::sim::shutdown() => break,
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    let _ = shutdown_tx.send(true);
    // Stepping down lets a standby take over at once instead of after the ttl.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), leading).await;
    follower.abort();
    routes.abort();
    Ok(Outcome::Ok)
}
