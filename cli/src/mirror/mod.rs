//! `llmgw mirror`: one machine that holds model files for the fleet, so
//! nodes fetch over the local network instead of the internet. `serve`
//! runs the byte path (read-only, with Range) and the management API;
//! `add`, `unused` and `remove` work on the directory from the mirror's
//! own host. Catalog entries name a held file as `mirror:<m>/<v>/<file>`;
//! the control plane's `mirror.url` tells agents where that is.

mod api;
mod bytes;
mod fetch;
mod store;
mod tls;
mod tools;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Subcommand;

use crate::Outcome;

#[derive(Debug, Subcommand)]
pub(crate) enum MirrorCommand {
    /// Serve the directory: the byte path (read-only, Range) on --listen
    /// and the management API on --api-listen.
    Serve(ServeArgs),
    /// Fetch a version into the directory from this host: to a temporary
    /// name, then renamed; prints each file's sha256; never overwrites.
    #[command(disable_version_flag = true)]
    Add(tools::AddArgs),
    /// What the directory holds, version by version: present (its files,
    /// sizes and checksums), fetching (bytes so far) or failed (why).
    List(tools::ListArgs),
    /// The held files no catalog entry uses (asks the control plane;
    /// refuses to answer when it cannot reach it).
    Unused(tools::UnusedArgs),
    /// Delete one held file; refused while a catalog entry uses it unless
    /// --force.
    #[command(disable_version_flag = true)]
    Remove(tools::RemoveArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// The directory: <model>/<version>/<file>.
    #[arg(long)]
    dir: PathBuf,
    /// The byte path's address as nodes reach it (not localhost): the URLs
    /// the API hands out are built on it.
    #[arg(long)]
    base: String,
    /// The byte path's listen address (read-only, unauthenticated).
    #[arg(long, default_value = ":8081")]
    listen: String,
    /// The management API's listen address. It starts downloads and
    /// deletes versions: on loopback unless --tls-ca makes it require the
    /// fleet's client certificates (another address without is refused).
    #[arg(long, default_value = "127.0.0.1:8082")]
    api_listen: String,
    /// The fleet's CA: the API then requires a client certificate from it.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// The API's server certificate (with --tls-ca).
    #[arg(long, requires_all = ["tls_ca", "tls_key"])]
    tls_cert: Option<PathBuf>,
    /// The API's private key (with --tls-ca).
    #[arg(long, requires_all = ["tls_ca", "tls_cert"])]
    tls_key: Option<PathBuf>,
}

/// `:8081` as Go wrote it means every interface.
fn listen_addr(a: &str) -> String {
    if a.starts_with(':') {
        format!("0.0.0.0{a}")
    } else {
        a.to_owned()
    }
}

pub(crate) async fn run(cmd: MirrorCommand) -> anyhow::Result<Outcome> {
    match cmd {
        MirrorCommand::Serve(a) => serve(a).await,
        MirrorCommand::Add(a) => tools::add(a).await,
        MirrorCommand::List(a) => tools::list(a),
        MirrorCommand::Unused(a) => tools::unused(a).await,
        MirrorCommand::Remove(a) => tools::remove(a).await,
    }
}

async fn serve(a: ServeArgs) -> anyhow::Result<Outcome> {
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let base = reqwest::Url::parse(&a.base)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .with_context(|| format!("--base {} is not an http(s) URL", a.base))?;
    let store = Arc::new(store::Store::new(a.dir.clone()));
    let mirror = Arc::new(api::Mirror::new(
        store.clone(),
        base.as_str().trim_end_matches('/').to_owned(),
    ));
    let tls = match (&a.tls_ca, &a.tls_cert, &a.tls_key) {
        (Some(ca), Some(cert), Some(key)) => Some(tls::server_tls(ca, cert, key)?),
        _ => None,
    };
    let bytes_l = tokio::net::TcpListener::bind(listen_addr(&a.listen))
        .await
        .with_context(|| format!("binding --listen {}", a.listen))?;
    let api_l = tokio::net::TcpListener::bind(listen_addr(&a.api_listen))
        .await
        .with_context(|| format!("binding --api-listen {}", a.api_listen))?;
    if tls.is_none() && !api_l.local_addr()?.ip().is_loopback() {
        anyhow::bail!(
            "--api-listen {}: the management API starts downloads and deletes versions, and without --tls-ca anyone who reaches it may: give --tls-ca, --tls-cert and --tls-key (the fleet's client certificates), or keep it on 127.0.0.1 and run mirror commands on this host",
            a.api_listen
        );
    }
    println!("mirror listening on {}", bytes_l.local_addr()?);
    println!("mirror api listening on {}", api_l.local_addr()?);
    tracing::info!(dir = %a.dir.display(), base = %mirror.base, "mirror serving");
    let bytes_router = bytes::router(store);
    let bytes_srv = tokio::spawn(async move { axum::serve(bytes_l, bytes_router).await });
    let api_router = api::router(mirror);
    let api_srv = match tls {
        Some(tls) => {
            // Handshake failures at warn: the callers are the fleet's own.
            let listener = llmgw_gateway::TlsListener::new(api_l, &tls, true)?;
            tokio::spawn(async move { axum::serve(listener, api_router).await })
        }
        // On loopback: this host's own users only.
        None => tokio::spawn(async move { axum::serve(api_l, api_router).await }),
    };
    tokio::select! {
        r = bytes_srv => r.context("the byte path stopped")?.context("the byte path stopped")?,
        r = api_srv => r.context("the API stopped")?.context("the API stopped")?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(Outcome::Ok)
}
