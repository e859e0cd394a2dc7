//! Why a stream to the control plane could not be had, in words an
//! operator can act on: which side refused, and what to check. Transport
//! errors arrive as a chain (tonic → hyper → io → rustls) whose outer
//! links say only "transport error".

use std::error::Error;

/// Every message of the chain, outermost first.
fn chain(e: &(dyn Error + 'static)) -> String {
    chain_from(e.to_string(), e.source())
}

fn chain_from(first: String, mut at: Option<&(dyn Error + 'static)>) -> String {
    let mut parts = vec![first];
    while let Some(s) = at {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        at = s.source();
    }
    parts.join(": ")
}

/// What the chain means, when a TLS or protocol failure explains it.
fn meaning(text: &str) -> Option<&'static str> {
    let has = |needle: &str| text.contains(needle);
    if has("UnknownIssuer") || has("BadSignature") {
        Some(
            "this agent does not trust the server's certificate: it is signed by another authority than --tls-ca",
        )
    } else if has("NotValidForName") || has("not valid for name") {
        Some(
            "the server's certificate does not name the address dialled: issue it with --host for that address",
        )
    } else if has("UnknownCA")
        || has("BadCertificate")
        || has("CertificateRequired")
        // What rustls answers to a certificate from another authority
        // of the same name: its signature does not verify.
        || has("alert: DecryptError")
    {
        Some(
            "the server refused this node's certificate: it must be signed by the server's authority (llmgw ctl cert issue-client)",
        )
    } else if has("Expired") || has("NotValidYet") {
        Some("a certificate is outside its validity period")
    } else if has("InvalidContentType") || has("corrupt message") || has("wrong version number") {
        Some(
            "the server does not speak TLS at this address: dial it with http://, or give the server a tls: section",
        )
    } else if has("frame with invalid size") || has("invalid HTTP version") {
        Some(
            "plaintext to a TLS listener: dial https://, and join with a token (`llmgw ctl node token`, then --join TOKEN) or give --tls-ca, --tls-cert and --tls-key",
        )
    } else {
        None
    }
}

/// A failed connect: the meaning first, then the chain.
pub(super) fn explain(e: &(dyn Error + 'static)) -> String {
    with_meaning(chain(e), false)
}

/// A stream refused without a standby's answer: over TLS 1.3 a server
/// that rejects this node's certificate closes the connection right after
/// the handshake, and the client sees only that.
pub(super) fn refused(s: &tonic::Status, tls: bool) -> String {
    with_meaning(chain_from(s.message().to_owned(), s.source()), tls)
}

/// Whether a plain HTTP server answers at `server` (the client listener
/// or the admin API, given as --server by mistake): it answers an HTTP/1
/// request, which the agent listener (gRPC over HTTP/2 only) closes on.
/// Its gRPC stream, meanwhile, only saw the connection close.
pub(super) async fn answers_http1(server: &str) -> bool {
    if !server.starts_with("http://") {
        return false;
    }
    let Ok(http) = reqwest::Client::builder()
        .http1_only()
        .timeout(std::time::Duration::from_secs(2))
        .build()
    else {
        return false;
    };
    http.get(server).send().await.is_ok()
}

/// What `answers_http1` means, said with the failure.
pub(super) fn not_the_agent_listener(server: &str, failure: &str) -> String {
    format!(
        "{server} answers plain HTTP: it is a server's client or admin listener, not its agent listener (agent_listen, 127.0.0.1:7443 without tls:, :7443 with it; the server prints \"agent listening on\") ({failure})"
    )
}

fn with_meaning(text: String, tls: bool) -> String {
    // The close shows as any of these, by which end noticed it first:
    // "connection was not ready" when the request was not yet written.
    let closed = [
        "connection closed",
        "broken pipe",
        "connection was not ready",
    ]
    .iter()
    .any(|c| text.contains(c));
    match meaning(&text) {
        Some(m) => format!("{m} ({text})"),
        None if closed && tls => format!(
            "the server closed the connection as the stream began: it may have refused this node's certificate (the server's log says why) ({text})"
        ),
        // A TLS listener closes on plaintext without a word the client
        // can read; its own log says "the peer spoke plaintext".
        None if closed => format!(
            "the server closed the connection as the stream began: if its agent listener has tls: (its log says the peer spoke plaintext), dial https:// and join with a token (`llmgw ctl node token`, then --join TOKEN) or give --tls-ca, --tls-cert and --tls-key ({text})"
        ),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tls_failures_say_which_side_refused() {
        let cases = [
            (
                "invalid peer certificate: UnknownIssuer",
                "does not trust the server's",
            ),
            (
                "received fatal alert: UnknownCA",
                "refused this node's certificate",
            ),
            (
                "received fatal alert: DecryptError",
                "refused this node's certificate",
            ),
            (
                "received corrupt message of type InvalidContentType",
                "does not speak TLS",
            ),
        ];
        for (text, says) in cases {
            let e = std::io::Error::other(text);
            let said = super::explain(&e);
            assert!(said.contains(says) && said.contains(text), "{said}");
        }
        let plain = std::io::Error::other("connection refused");
        assert_eq!(super::explain(&plain), "connection refused");
    }

    #[test]
    fn a_tls_stream_closed_as_it_began_may_be_a_refused_certificate() {
        // As the agent saw it when the server's close beat its request
        // (the alert unread), and when the request was half written.
        for text in [
            "operation was canceled: transport error: connection was not ready",
            "transport error: connection closed before message completed",
            "transport error: broken pipe",
        ] {
            let said = super::with_meaning(text.to_owned(), true);
            assert!(said.contains("refused this node's certificate"), "{said}");
            // Plaintext: perhaps to a TLS listener, which closes on it.
            let plain = super::with_meaning(text.to_owned(), false);
            assert!(
                plain.contains("dial https://") && plain.ends_with(&format!("({text})")),
                "{plain}"
            );
        }
    }
}
