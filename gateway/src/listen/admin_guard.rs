//! The admin listener answers its operator's tools (`llmgw ctl`, `keys`,
//! a standby forwarding a command), never a web page. A page on any site
//! could otherwise post to `127.0.0.1:9090` from the operator's browser
//! (a form needs no CORS) and promote, suspend or revoke; or reach it
//! through a name rebound to 127.0.0.1 and read it. Browsers mark both:
//! every write a page sends carries `Origin` (and `Sec-Fetch-Site`), and
//! a rebound name arrives as the `Host`. The tools send neither.

use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Refuses a browser's write, and on a loopback listener a request for a
/// host name other than `localhost` (an address is always taken).
pub(crate) async fn guard(loopback: bool, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let write = !matches!(*request.method(), Method::GET | Method::HEAD);
    if write && (headers.contains_key(header::ORIGIN) || headers.contains_key("sec-fetch-site")) {
        return refuse(
            StatusCode::FORBIDDEN,
            "the admin API takes no writes from a web page (it has no way to tell the operator's own from another site's): use llmgw ctl, keys or users",
        );
    }
    if loopback {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        if !is_loopback_host(host) {
            return refuse(
                StatusCode::MISDIRECTED_REQUEST,
                "this admin listener is on loopback and answers only to 127.0.0.1, [::1] or localhost",
            );
        }
    }
    next.run(request).await
}

/// An address, or `localhost`, with or without a port; an absent Host
/// (HTTP/1.0) too.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => {
            return v6
                .split(']')
                .next()
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok());
        }
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.is_empty()
        || name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok()
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": why }))).into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn addresses_and_localhost_are_loopback_hosts_and_names_are_not() {
        use super::is_loopback_host as ok;
        for h in [
            "127.0.0.1:9090",
            "127.0.0.1",
            "[::1]:9090",
            "localhost:9090",
            "LOCALHOST",
            "",
        ] {
            assert!(ok(h), "{h}");
        }
        for h in [
            "evil.example:9090",
            "evil.example",
            "127.0.0.1.nip.io:9090",
            "[evil]:1",
        ] {
            assert!(!ok(h), "{h}");
        }
    }
}
