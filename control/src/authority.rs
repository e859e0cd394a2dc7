//! The cluster's certificate authority, as the leader holds it to sign
//! joining nodes' certificates: the authority's certificate (the first of
//! the agent listener's `tls.ca`) and its key (`tls.ca_key`), checked to
//! belong together when the server starts.

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose,
};
use sha2::Digest;

/// How long a joined node's certificate is valid: as `llmgw ctl cert
/// issue-client`'s.
const VALID_DAYS: i64 = 825;

#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    #[error("tls.ca holds no PEM certificate")]
    NoCertificate,
    #[error("tls.ca's first certificate cannot be read: {0}")]
    Unreadable(String),
    #[error(
        "tls.ca's first certificate is not an authority (no CA basic constraint), so it cannot sign nodes' certificates"
    )]
    NotAnAuthority,
    #[error("tls.ca_key holds no private key: {0}")]
    NoKey(String),
    #[error("tls.ca_key is not the key of tls.ca's first certificate")]
    KeyMismatch,
    #[error(
        "tls.cert is not signed by tls.ca's first certificate: nodes that join trust only that authority, so they could not check this server"
    )]
    ServerNotSigned,
}

/// Why a request for a certificate was not signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("the certificate signing request cannot be read or its signature does not verify")]
    BadRequest,
    #[error("signing failed: {0}")]
    Signing(String),
}

/// What the leader signs with.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    pin: String,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Authority").field("pin", &self.pin).finish()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The hex SHA-256 of a certificate's DER: how the log names it.
pub fn fingerprint(der: &[u8]) -> String {
    hex(&sha2::Sha256::digest(der))
}

/// The first PEM certificate of a file: its text (as nodes will store
/// it) and its DER.
fn first_certificate(pem: &str) -> Result<(String, Vec<u8>), AuthorityError> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let start = pem.find(BEGIN).ok_or(AuthorityError::NoCertificate)?;
    let len = pem[start..]
        .find(END)
        .ok_or(AuthorityError::NoCertificate)?
        + END.len();
    let text = format!("{}\n", &pem[start..start + len]);
    let (_, parsed) = x509_parser::pem::parse_x509_pem(text.as_bytes())
        .map_err(|e| AuthorityError::Unreadable(e.to_string()))?;
    Ok((text, parsed.contents))
}

impl Authority {
    /// From the agent listener's `tls.ca` (its first certificate is the
    /// authority) and `tls.ca_key`; `server_cert` is the listener's own
    /// certificate, which joined nodes will check against the authority.
    pub fn from_pem(ca: &str, key: &str, server_cert: &str) -> Result<Self, AuthorityError> {
        let (ca_pem, der) = first_certificate(ca)?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der)
            .map_err(|e| AuthorityError::Unreadable(e.to_string()))?;
        if !cert.is_ca() {
            return Err(AuthorityError::NotAnAuthority);
        }
        let key = KeyPair::from_pem(key).map_err(|e| AuthorityError::NoKey(e.to_string()))?;
        if key.public_key_raw() != cert.public_key().subject_public_key.data.as_ref() {
            return Err(AuthorityError::KeyMismatch);
        }
        let (_, server) = first_certificate(server_cert)?;
        let (_, server) = x509_parser::parse_x509_certificate(&server)
            .map_err(|e| AuthorityError::Unreadable(e.to_string()))?;
        if server.issuer() != cert.subject()
            || server.verify_signature(Some(cert.public_key())).is_err()
        {
            return Err(AuthorityError::ServerNotSigned);
        }
        let issuer = Issuer::from_ca_cert_der(&der.clone().into(), key)
            .map_err(|e| AuthorityError::Unreadable(e.to_string()))?;
        Ok(Authority {
            issuer,
            pin: llmgw_api::join_token::pin(&der),
            ca_pem,
        })
    }

    /// The start of the authority certificate's SHA-256, as join tokens
    /// carry it.
    pub fn pin(&self) -> &str {
        &self.pin
    }

    /// The authority's certificate, PEM: what joined nodes trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A client certificate for `node_id` over the key of `csr_pem`: the
    /// request's signature must verify (the node holds the key); all it
    /// asks for besides is ignored, so the certificate names the node and
    /// serves for client authentication only. Returns the PEM and its
    /// fingerprint.
    pub fn sign(&self, csr_pem: &str, node_id: &str) -> Result<(String, String), SignError> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|_| SignError::BadRequest)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, node_id);
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let at = |secs: i64| {
            rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(secs.max(0) as u64)
        };
        // A little slack for nodes whose clocks are behind ours.
        params.not_before = at(now - 3600);
        params.not_after = at(now + VALID_DAYS * 86_400);
        let signed = CertificateSigningRequestParams {
            params,
            public_key: csr.public_key,
        }
        .signed_by(&self.issuer)
        .map_err(|e| SignError::Signing(e.to_string()))?;
        Ok((signed.pem(), fingerprint(signed.der())))
    }
}
