//! HTTPS on the client listener (rustls, the ring provider as everywhere
//! else in llmgw), so that API keys and session cookies need not cross the
//! network in clear text.
//!
//! Handshakes run beside the accept loop, each bounded in time, so a
//! client that connects and says nothing holds up no one else.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::listen::conn::{Acceptor, Conn};
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

/// How long a client gets to finish its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// A certificate and its key, checked to fit together.
#[derive(Debug, Clone)]
pub struct ServerTls(Arc<rustls::ServerConfig>);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the certificate file holds no PEM certificate")]
    NoCertificate,
    #[error("the key file holds no PEM private key")]
    NoKey,
    #[error("the authority file holds no PEM certificate")]
    NoAuthority,
    #[error("the certificate and the key do not fit together: {0}")]
    Mismatch(rustls::Error),
}

impl ServerTls {
    /// From PEM text: the certificate (its chain may follow it) and the
    /// private key (PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem(cert: &[u8], key: &[u8]) -> Result<Self, TlsError> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<_, _>>()
            .map_err(|_| TlsError::NoCertificate)?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate);
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| TlsError::NoKey)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Mismatch)?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(TlsError::Mismatch)?;
        // The gateway speaks HTTP/1.1 (SSE streams included).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(ServerTls(Arc::new(config)))
    }
}

impl ServerTls {
    /// Mutual TLS for the agent listener: clients must present a
    /// certificate from `ca`; HTTP/2 (gRPC) only.
    pub fn with_client_ca(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<Self, TlsError> {
        Self::mutual(cert, key, ca, false, b"h2")
    }

    /// Mutual TLS for an HTTP/1.1 API (the mirror's): clients must present
    /// a certificate from `ca`.
    pub fn with_client_ca_http1(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<Self, TlsError> {
        Self::mutual(cert, key, ca, false, b"http/1.1")
    }

    /// Mutual TLS for an agent listener that nodes may also join through:
    /// a connection without a client certificate is let in (a joining node
    /// has none yet; the agent service refuses it a stream), one with a
    /// certificate not from `ca` is still refused here; and the
    /// authority (the first certificate of `ca`) follows the server's own
    /// in the chain it presents, so that a joining node can check it
    /// against the pin its token carries.
    pub fn joinable(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<Self, TlsError> {
        Self::mutual(cert, key, ca, true, b"h2")
    }

    fn mutual(
        cert: &[u8],
        key: &[u8],
        ca: &[u8],
        joinable: bool,
        alpn: &[u8],
    ) -> Result<Self, TlsError> {
        let mut chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<_, _>>()
            .map_err(|_| TlsError::NoCertificate)?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate);
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| TlsError::NoKey)?;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca) {
            let c = c.map_err(|_| TlsError::NoAuthority)?;
            roots.add(c).map_err(TlsError::Mismatch)?;
        }
        if roots.is_empty() {
            return Err(TlsError::NoAuthority);
        }
        if joinable {
            let authority = CertificateDer::pem_slice_iter(ca)
                .next()
                .and_then(Result::ok)
                .ok_or(TlsError::NoAuthority)?;
            if !chain.contains(&authority) {
                chain.push(authority);
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        );
        let builder = if joinable {
            builder.allow_unauthenticated()
        } else {
            builder
        };
        let verifier = builder
            .build()
            .map_err(|e| TlsError::Mismatch(rustls::Error::General(e.to_string())))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Mismatch)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(TlsError::Mismatch)?;
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(ServerTls(Arc::new(config)))
    }
}

/// What a failed handshake means, for the person reading the log.
fn why(e: &std::io::Error) -> String {
    let text = e.to_string();
    let hint = if text.contains("InvalidContentType") || text.contains("corrupt message") {
        "the peer spoke plaintext to a TLS listener (an http:// server address?)"
    } else if text.contains("UnknownIssuer") || text.contains("BadSignature") {
        "its certificate is signed by an authority this server does not trust (tls.ca)"
    } else if text.contains("no certificates") || text.contains("NoCertificatesPresented") {
        "it presented no client certificate (--tls-cert and --tls-key)"
    } else if text.contains("Expired") || text.contains("NotValidYet") {
        "its certificate is outside its validity period"
    } else if text.contains("alert") {
        "the peer refused this server's certificate"
    } else {
        ""
    };
    if hint.is_empty() {
        text
    } else {
        format!("{hint}: {text}")
    }
}

/// Connections whose handshake has finished, with their peers.
pub type Handshaken<I> = mpsc::Receiver<(TlsStream<<I as Incoming>::Io>, SocketAddr)>;

/// Where connections come from before their handshake: the gateway's
/// listeners with their caps ([`Acceptor`]), or a plain TCP listener.
pub trait Incoming: Send + Sync + 'static {
    type Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    fn next(&self) -> impl std::future::Future<Output = (Self::Io, SocketAddr)> + Send;
    fn local_addr(&self) -> std::io::Result<SocketAddr>;
    /// The peer's first bytes, left to be read.
    fn peek<'a>(
        io: &'a Self::Io,
        buf: &'a mut [u8],
    ) -> impl std::future::Future<Output = std::io::Result<usize>> + Send + 'a;
}

impl Incoming for Acceptor {
    type Io = Conn;
    fn next(&self) -> impl std::future::Future<Output = (Conn, SocketAddr)> + Send {
        self.accept()
    }
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Acceptor::local_addr(self)
    }
    fn peek<'a>(
        io: &'a Conn,
        buf: &'a mut [u8],
    ) -> impl std::future::Future<Output = std::io::Result<usize>> + Send + 'a {
        io.peek(buf)
    }
}

impl Incoming for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn next(&self) -> (tokio::net::TcpStream, SocketAddr) {
        loop {
            // A peer that gave up before it was accepted.
            if let Ok(c) = self.accept().await {
                return c;
            }
        }
    }
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        tokio::net::TcpListener::local_addr(self)
    }
    fn peek<'a>(
        io: &'a tokio::net::TcpStream,
        buf: &'a mut [u8],
    ) -> impl std::future::Future<Output = std::io::Result<usize>> + Send + 'a {
        io.peek(buf)
    }
}

/// Whether a connection's first byte starts a plaintext HTTP request (a
/// method's capital letter) rather than a TLS record (0x16, a handshake).
fn plaintext_http(first: u8) -> bool {
    first.is_ascii_uppercase()
}

/// Answers a plaintext HTTP request made to an HTTPS listener in HTTP, in
/// the API's error shape, and closes: the peer is told what to change,
/// where a TLS alert read as "Received HTTP/0.9" to curl and "Connection
/// error." to the OpenAI SDK.
async fn refuse_plaintext<Io>(mut io: Io, local: Option<SocketAddr>)
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let at = local.map_or_else(|| "this address".to_owned(), |a| format!("https://{a}"));
    let body = serde_json::json!({"error": {
        "message": format!("this listener speaks HTTPS only: send the request to {at} (https://, not http://)"),
        "type": "invalid_request_error",
        "param": null,
        "code": "https_required",
    }})
    .to_string();
    let head = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    if io.write_all(head.as_bytes()).await.is_err() || io.write_all(body.as_bytes()).await.is_err()
    {
        return;
    }
    let _ = io.shutdown().await;
    // The request is read to its end before closing: data left unread
    // makes the kernel reset the connection, and the peer may lose the
    // answer to the reset.
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut left: usize = 64 * 1024;
        while left > 0 {
            match io.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Accepts connections from `tcp` (within its cap) and completes their
/// handshakes beside the accept loop; finished ones arrive on the
/// receiver. Failures are logged with the peer's address and the reason at
/// warn when `loud` (agents, whose failures an operator must see), else at
/// debug (any client on the internet may send garbage). Aborting the
/// handle closes the listener.
pub fn handshakes<I: Incoming>(
    tcp: I,
    tls: &ServerTls,
    loud: bool,
) -> (Handshaken<I>, tokio::task::JoinHandle<()>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.0.clone());
    let (tx, ready) = mpsc::channel(64);
    let local = tcp.local_addr().ok();
    let accepting = tokio::spawn(async move {
        loop {
            let (stream, peer) = tcp.next().await;
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                // A client's plain HTTP is answered in HTTP. Agents are
                // not: theirs is gRPC, and they say themselves what a
                // closed connection means.
                let deadline = tokio::time::Instant::now() + HANDSHAKE;
                if !loud {
                    let mut first = [0u8; 1];
                    let peeked =
                        tokio::time::timeout_at(deadline, I::peek(&stream, &mut first)).await;
                    if let Ok(Ok(1)) = peeked
                        && plaintext_http(first[0])
                    {
                        tracing::debug!(%peer, "plain HTTP to the TLS listener: answered 400");
                        refuse_plaintext(stream, local).await;
                        return;
                    }
                }
                match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send((tls, peer)).await;
                    }
                    Ok(Err(e)) if loud => {
                        tracing::warn!(%peer, reason = %why(&e), "a TLS handshake failed");
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, reason = %why(&e), "a TLS handshake failed")
                    }
                    Err(_) if loud => tracing::warn!(%peer, "a TLS handshake took over 10 s"),
                    Err(_) => tracing::debug!(%peer, "a TLS handshake took too long"),
                }
            });
        }
    });
    (ready, accepting)
}

/// A TCP listener whose connections arrive after their TLS handshake.
/// Dropping it (as a graceful stop does) stops accepting at once.
pub struct TlsListener<I: Incoming = Acceptor> {
    ready: Handshaken<I>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl<I: Incoming> TlsListener<I> {
    /// `loud` as for [`handshakes`].
    pub fn new(tcp: I, tls: &ServerTls, loud: bool) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (ready, accepting) = handshakes(tcp, tls, loud);
        Ok(TlsListener {
            ready,
            local,
            accepting,
        })
    }
}

impl<I: Incoming> std::fmt::Debug for TlsListener<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("local", &self.local)
            .finish()
    }
}

impl<I: Incoming> Drop for TlsListener<I> {
    fn drop(&mut self) {
        // Closes the TCP listener: new connections are refused.
        self.accepting.abort();
    }
}

impl<I: Incoming> axum::serve::Listener for TlsListener<I> {
    type Io = TlsStream<I::Io>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task holds a sender for as long as it runs,
            // and it runs until this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
