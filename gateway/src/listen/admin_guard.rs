//! The admin listener answers its operator's tools (`llmgw ctl`, `keys`,
//! a standby forwarding a command), never a web page. A page on any site
//! could otherwise post to `127.0.0.1:9090` from the operator's browser
//! (a form needs no CORS) and promote, suspend or revoke; or reach it
//! through a name rebound to 127.0.0.1 and read it. Browsers mark both:
//! every write a page sends carries `Origin` (and `Sec-Fetch-Site`), and
//! a rebound name arrives as the `Host`. The tools send neither.
//!
//! With `admin_token` set, every request but `/health` must carry the
//! token: as a bearer token (the tools, a standby forwarding, Prometheus)
//! or as a browser's Basic password, which the 401 asks for.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The admin API's token, kept as its SHA-256 (the token itself is not
/// held), compared in constant time.
#[derive(Clone)]
pub struct AdminToken(Arc<[u8; 32]>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(…)")
    }
}

impl AdminToken {
    pub fn new(token: &str) -> Self {
        AdminToken(Arc::new(Sha256::digest(token.as_bytes()).into()))
    }

    /// What the request's credentials say: none given, this token, or
    /// another.
    fn judge(&self, headers: &HeaderMap) -> Presented {
        let Some(given) = presented(headers) else {
            return Presented::None;
        };
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        match bool::from(digest.ct_eq(&*self.0)) {
            true => Presented::This,
            false => Presented::Other,
        }
    }
}

enum Presented {
    None,
    This,
    Other,
}

/// The token a request carries: `Bearer TOKEN`, or a Basic password (any
/// user name), as a browser sends what its prompt was given.
fn presented(headers: &HeaderMap) -> Option<String> {
    use base64::Engine;
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = value.split_once(' ')?;
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.trim().to_owned());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest.trim())
            .ok()?;
        let pair = String::from_utf8(decoded).ok()?;
        return pair
            .split_once(':')
            .map(|(_, password)| password.to_owned());
    }
    None
}

/// Refuses a browser's write, on a loopback listener a request for a host
/// name other than `localhost` (an address is always taken), and, with a
/// token, a request without it.
pub(crate) async fn guard(
    loopback: bool,
    token: Option<AdminToken>,
    request: Request,
    next: Next,
) -> Response {
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
    // A balancer's or the tools' look at whether it is up needs nothing.
    if let Some(token) = &token
        && request.uri().path() != "/health"
    {
        let why = match token.judge(headers) {
            Presented::This => None,
            Presented::None => Some(
                "this admin API wants its token (admin_token): llmgw ctl, keys and users send LLMGW_ADMIN_TOKEN (the token, or @FILE holding it); a browser asks for it as the password",
            ),
            Presented::Other => Some(
                "the token sent is not this admin API's (admin_token): check LLMGW_ADMIN_TOKEN",
            ),
        };
        if let Some(why) = why {
            let mut answer = refuse(StatusCode::UNAUTHORIZED, why);
            answer.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"llmgw admin\", charset=\"UTF-8\""),
            );
            return answer;
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
    /// The token is taken as a bearer token or a browser's Basic password
    /// (any user name); it is judged by its hash, another one told apart
    /// from none.
    #[test]
    fn the_token_is_read_from_bearer_or_basic_and_judged() {
        use axum::http::{HeaderMap, HeaderValue, header};
        use base64::Engine;
        let token = super::AdminToken::new("0123456789abcdef");
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            h
        };
        let basic = |pair: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        };
        let this = |h: &HeaderMap| matches!(token.judge(h), super::Presented::This);
        assert!(this(&with("Bearer 0123456789abcdef")));
        assert!(this(&with("bearer 0123456789abcdef")));
        assert!(this(&with(&basic("anyone:0123456789abcdef"))));
        assert!(matches!(
            token.judge(&HeaderMap::new()),
            super::Presented::None
        ));
        assert!(matches!(
            token.judge(&with("Bearer 0123456789abcdeF")),
            super::Presented::Other
        ));
        assert!(matches!(
            token.judge(&with(&basic("0123456789abcdef"))),
            super::Presented::None
        ));
        assert_eq!(format!("{token:?}"), "AdminToken(…)");
    }

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
