//! Mutual TLS on the mirror's API: the server presents its certificate
//! and accepts only callers with a certificate from the fleet's CA (the
//! same rule as the agent stream). The listener is the gateway's
//! ([`llmgw_gateway::TlsListener`]): handshakes beside the accept loop,
//! each bounded in time, so a silent caller holds up no one.

use anyhow::Context;
use llmgw_gateway::ServerTls;

pub(crate) fn server_tls(
    ca: &std::path::Path,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<ServerTls> {
    let read =
        |p: &std::path::Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    ServerTls::with_client_ca_http1(&read(cert)?, &read(key)?, &read(ca)?).with_context(|| {
        format!(
            "the mirror API's TLS files (--tls-cert {}, --tls-key {}, --tls-ca {})",
            cert.display(),
            key.display(),
            ca.display()
        )
    })
}
