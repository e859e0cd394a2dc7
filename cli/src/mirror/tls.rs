//! Mutual TLS on the mirror's API: the server presents its certificate
//! and accepts only callers with a certificate from the fleet's CA (the
//! same rule as the agent stream). Handshakes run beside the accept loop,
//! each bounded in time, so a silent caller holds up no one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

pub(crate) fn server_config(
    ca: &std::path::Path,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let read =
        |p: &std::path::Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{} holds no PEM certificate", cert.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "{} holds no PEM certificate",
        cert.display()
    );
    let key = PrivateKeyDer::from_pem_slice(&read(key)?)
        .with_context(|| format!("{} holds no PEM private key", key.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&read(ca)?) {
        roots.add(c.with_context(|| format!("{} is not PEM", ca.display()))?)?;
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "{} holds no PEM certificate",
        ca.display()
    );
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .context("the certificate and the key do not fit together")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A listener whose connections arrive after a completed handshake.
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub(crate) fn new(
        tcp: TcpListener,
        config: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let (tx, ready) = mpsc::channel(64);
        let accepting = tokio::spawn(async move {
            loop {
                let Ok((stream, peer)) = tcp.accept().await else {
                    continue;
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(%peer, error = %e, "mirror API: a TLS handshake failed");
                        }
                        Err(_) => {
                            tracing::warn!(%peer, "mirror API: a TLS handshake took over 10 s")
                        }
                    }
                });
            }
        });
        Ok(TlsListener {
            ready,
            local,
            accepting,
        })
    }
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("local", &self.local)
            .finish()
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task holds a sender for as long as it runs.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
