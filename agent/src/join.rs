//! Joining the cluster with a token from `llmgw ctl node token`.
//!
//! The agent makes its key here (it never leaves the node) and asks the
//! leader to sign a request for it. Before the token leaves the node, the
//! server is checked: its handshake must present the authority whose hash
//! the token pins, and its certificate must be signed by that authority
//! and name the address dialled. What comes back (the node's certificate
//! and the authority) is stored in the work directory with the key, and
//! from then on the agent dials with mutual TLS, on restarts too, without
//! the token.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llmgw_api::join_token;
use sha2::Digest;
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// The certificates of a node that joined, as stored under
/// `<work dir>/identity/`.
#[derive(Clone)]
pub struct Identity {
    /// The authority the node trusts the server by.
    pub ca: String,
    /// The node's certificate; its common name is the node id.
    pub cert: String,
    pub key: String,
    /// The SHA-256 of the token it joined with: the same token again means
    /// "already joined", another means "join again".
    pub token_hash: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Identity")
            .field("token_hash", &self.token_hash)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The token or the request was refused for good: asking again
    /// changes nothing.
    #[error("{0}")]
    Refused(String),
    /// No server could be asked (unreachable, a standby, no leader yet).
    #[error("{0}")]
    Unreachable(String),
    #[error("{0}")]
    Local(String),
}

/// Where a joined node's certificates live.
pub fn identity_dir(work_dir: &Path) -> PathBuf {
    work_dir.join("identity")
}

pub fn token_hash(token: &str) -> String {
    hex(&sha2::Sha256::digest(token.trim().as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The identity an earlier join stored, if there is one.
pub fn stored(work_dir: &Path) -> Result<Option<Identity>, JoinError> {
    let dir = identity_dir(work_dir);
    let read = |name: &str| std::fs::read_to_string(dir.join(name));
    match read("node.pem") {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(JoinError::Local(format!(
            "cannot read {}: {e}",
            dir.join("node.pem").display()
        ))),
        Ok(cert) => {
            let dir = &dir;
            let missing = |name: &'static str| {
                move |e: std::io::Error| {
                    JoinError::Local(format!(
                        "{} is incomplete ({name}: {e}): remove it and join again with a new token",
                        dir.display()
                    ))
                }
            };
            Ok(Some(Identity {
                ca: read("ca.pem").map_err(missing("ca.pem"))?,
                key: read("node-key.pem").map_err(missing("node-key.pem"))?,
                token_hash: read("token.sha256")
                    .map_err(missing("token.sha256"))?
                    .trim()
                    .to_owned(),
                cert,
            }))
        }
    }
}

/// The common name of a PEM certificate: the node id it names.
pub fn node_of(cert_pem: &str) -> Option<String> {
    let der = pem::parse(cert_pem).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.contents()).ok()?;
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned)
}

/// Writes the identity: the key readable by the owner only, each file
/// complete before it takes its name, the certificate last (its presence
/// means a complete identity).
fn store(work_dir: &Path, id: &Identity) -> Result<(), JoinError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = identity_dir(work_dir);
    let local =
        |e: std::io::Error| JoinError::Local(format!("cannot store in {}: {e}", dir.display()));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(local)?;
    // A rejoin replaces the old certificate: it goes first, so that a
    // crash in between leaves no mismatched pair.
    match std::fs::remove_file(dir.join("node.pem")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(local(e)),
        _ => {}
    }
    for (name, text, mode) in [
        ("node-key.pem", &id.key, 0o600),
        ("ca.pem", &id.ca, 0o644),
        ("token.sha256", &id.token_hash, 0o644),
        ("node.pem", &id.cert, 0o644),
    ] {
        let part = dir.join(format!(".{name}.part"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&part)
            .map_err(local)?;
        f.write_all(text.as_bytes()).map_err(local)?;
        f.sync_all().map_err(local)?;
        std::fs::rename(&part, dir.join(name)).map_err(local)?;
    }
    Ok(())
}

/// Accepts the server only if its handshake presents the authority the
/// token pins and its certificate is signed by that authority for the
/// name dialled; keeps the authority for the request that follows.
#[derive(Debug)]
struct Pinned {
    pin: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
    found: Mutex<Option<CertificateDer<'static>>>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| join_token::pin(c.as_ref()).eq_ignore_ascii_case(&self.pin))
            .ok_or_else(|| {
                rustls::Error::General(
                    "the server does not present the authority this token names (is it the cluster the token came from, and does its tls: section have a ca_key?)".into(),
                )
            })?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            self.provider.clone(),
        )
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
        verifier.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)?;
        *self.found.lock().unwrap_or_else(|p| p.into_inner()) = Some(ca.clone().into_owned());
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The authority `server` presents, checked against `pin` (and the
/// server's certificate against it), as PEM.
async fn authority(server: &str, pin: &str) -> Result<String, JoinError> {
    let unreachable = |e: String| JoinError::Unreachable(format!("{server}: {e}"));
    let uri: tonic::transport::Uri = server
        .parse()
        .map_err(|e| JoinError::Local(format!("{server} is not a URL: {e}")))?;
    let host = uri
        .host()
        .ok_or_else(|| JoinError::Local(format!("{server} names no host")))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let pinned = Arc::new(Pinned {
        pin: pin.to_owned(),
        provider: provider.clone(),
        found: Mutex::new(None),
    });
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| JoinError::Local(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(pinned.clone())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::try_from(host.clone())
        .map_err(|e| JoinError::Local(format!("{server}: {e}")))?;
    let tcp = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    .map_err(|_| unreachable("no connection within 5 s".into()))?
    .map_err(|e| unreachable(format!("cannot connect: {e}")))?;
    let handshake = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp);
    match tokio::time::timeout(Duration::from_secs(10), handshake).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            let text = e.to_string();
            // The server is not what the token names: asking again will
            // not change that.
            return Err(
                if text.contains("authority this token names") || text.contains("certificate") {
                    JoinError::Refused(format!("{server}: {text}"))
                } else {
                    unreachable(format!("TLS: {text}"))
                },
            );
        }
        Err(_) => return Err(unreachable("the TLS handshake took over 10 s".into())),
    }
    let der = pinned
        .found
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .ok_or_else(|| unreachable("the handshake presented no certificate".into()))?;
    Ok(pem::encode(&pem::Pem::new(
        "CERTIFICATE",
        der.as_ref().to_vec(),
    )))
}

/// One attempt at `server`: the authority checked, then the request.
async fn ask(
    server: &str,
    pin: &str,
    token: &str,
    node_id: &str,
    csr_pem: &str,
) -> Result<llmgw_api::v1::JoinReply, (JoinError, Option<String>)> {
    let ca = authority(server, pin).await.map_err(|e| (e, None))?;
    let endpoint = tonic::transport::Endpoint::from_shared(server.to_owned())
        .map_err(|e| {
            (
                JoinError::Local(format!("{server} is not a URL: {e}")),
                None,
            )
        })?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca)),
        )
        .map_err(|e| (JoinError::Local(e.to_string()), None))?;
    let channel = endpoint.connect().await.map_err(|e| {
        (
            JoinError::Unreachable(format!("{server}: cannot connect: {e}")),
            None,
        )
    })?;
    let reply = llmgw_api::JoinServiceClient::new(channel)
        .join(llmgw_api::v1::JoinRequest {
            token: token.trim().to_owned(),
            node_id: node_id.to_owned(),
            csr_pem: csr_pem.to_owned(),
        })
        .await;
    match reply {
        Ok(r) => Ok(r.into_inner()),
        Err(s) if s.code() == tonic::Code::Unavailable => {
            // A standby names the leader's agent address.
            let leader = s
                .metadata()
                .get(llmgw_api::refusal::LEADER_AGENT)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            Err((
                JoinError::Unreachable(format!("{server}: {}", s.message())),
                leader,
            ))
        }
        Err(s) if s.code() == tonic::Code::Unimplemented => Err((
            JoinError::Refused(format!(
                "{server} does not take joins (a server older than this agent?): {}",
                s.message()
            )),
            None,
        )),
        Err(s) => Err((
            JoinError::Refused(format!(
                "{server} refused to join this node: {}",
                s.message()
            )),
            None,
        )),
    }
}

/// Joins as `node_id` through the first of `servers` that leads, asking
/// again while none can be reached or none leads (after `retry.0`,
/// doubling up to `retry.1`: the same bounds as the agent's redials);
/// stores the result in `work_dir`. A refusal of the token ends it.
pub async fn join(
    servers: &[String],
    node_id: &str,
    token: &str,
    work_dir: &Path,
    retry: (Duration, Duration),
) -> Result<Identity, JoinError> {
    let Some((_, pin)) = join_token::split(token) else {
        return Err(JoinError::Refused(
            "--join: not a join token: tokens look like llmgw-join-….… as `llmgw ctl node token` prints them".into(),
        ));
    };
    if let Some(plain) = servers.iter().find(|s| !s.starts_with("https://")) {
        return Err(JoinError::Refused(format!(
            "--join needs https:// servers (the token and the certificate go over TLS), not {plain}"
        )));
    }
    let key = rcgen::KeyPair::generate()
        .map_err(|e| JoinError::Local(format!("cannot make a key: {e}")))?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, node_id);
    let csr = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(|e| JoinError::Local(format!("cannot make a signing request: {e}")))?;
    let (base, max) = retry;
    let mut wait = base.min(max);
    loop {
        let mut order: Vec<String> = servers.to_vec();
        let mut last = String::new();
        let mut i = 0;
        while i < order.len() {
            let server = order[i].clone();
            i += 1;
            match ask(&server, pin, token, node_id, &csr).await {
                Ok(reply) => {
                    let id = Identity {
                        ca: reply.ca_pem,
                        cert: reply.certificate_pem,
                        key: key.serialize_pem(),
                        token_hash: token_hash(token),
                    };
                    if node_of(&id.cert).as_deref() != Some(node_id) {
                        return Err(JoinError::Refused(format!(
                            "{server} answered a certificate that does not name node {node_id}"
                        )));
                    }
                    store(work_dir, &id)?;
                    tracing::info!(server = %server, node = %node_id, token = %reply.token_id, dir = %identity_dir(work_dir).display(), "joined the cluster: the certificate and the authority are stored");
                    return Ok(id);
                }
                Err((e @ (JoinError::Refused(_) | JoinError::Local(_)), _)) => return Err(e),
                Err((JoinError::Unreachable(why), leader)) => {
                    // The leader a standby names is asked next.
                    if let Some(l) =
                        leader.filter(|l| l.starts_with("https://") && !order[i..].contains(l))
                    {
                        order.insert(i, l);
                    }
                    last = why;
                }
            }
        }
        tracing::warn!(error = %last, retry_in_s = wait.as_secs_f64(), "could not join yet");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(max);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stored_identity_is_read_back_whole_and_its_key_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        assert!(super::stored(dir.path()).unwrap().is_none());
        let id = super::Identity {
            ca: "CA".into(),
            cert: "CERT".into(),
            key: "KEY".into(),
            token_hash: super::token_hash("llmgw-join-x"),
        };
        super::store(dir.path(), &id).unwrap();
        let back = super::stored(dir.path()).unwrap().unwrap();
        assert_eq!(
            (back.ca, back.cert, back.key, back.token_hash),
            (id.ca, id.cert, id.key, id.token_hash)
        );
        let mode = std::fs::metadata(super::identity_dir(dir.path()).join("node-key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
