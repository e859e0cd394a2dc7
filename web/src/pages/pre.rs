//! CSRF before there is a session (sign-in, sign-up, claim links): a
//! random token in an HttpOnly, SameSite=Lax cookie and the same token
//! in the form. Another site can make a browser post our form but can
//! neither read the cookie nor make the browser send it with a
//! cross-site post, so a post whose field matches the cookie came from one
//! of our pages.

use axum::http::HeaderMap;

use crate::session::{cookie, set_cookie};
use crate::{Web, WebError};

pub(super) const PRE_COOKIE: &str = "llmgw_pre";

/// 32 random bytes, hex.
const TOKEN_LEN: usize = 64;

/// The token this browser's forms carry: its cookie's when it has a
/// well-formed one (several open tabs keep working), else a fresh one.
pub(super) fn token(web: &Web, headers: &HeaderMap) -> Result<String, WebError> {
    match cookie(web, headers, PRE_COOKIE).filter(|t| well_formed(t)) {
        Some(t) => Ok(t.to_owned()),
        None => random_token(),
    }
}

/// The `Set-Cookie` that (re)sets `token`.
pub(super) fn set(web: &Web, token: &str) -> String {
    set_cookie(web, PRE_COOKIE, Some(token))
}

/// The `Set-Cookie` that drops it (a session has its own token now).
pub(super) fn clear(web: &Web) -> String {
    set_cookie(web, PRE_COOKIE, None)
}

/// Whether a posted form's token is this browser's cookie.
pub(super) fn check(web: &Web, headers: &HeaderMap, submitted: &str) -> Result<(), WebError> {
    match cookie(web, headers, PRE_COOKIE) {
        Some(c) if well_formed(c) && ct_eq(c.as_bytes(), submitted.as_bytes()) => Ok(()),
        _ => Err(WebError::Csrf),
    }
}

fn well_formed(t: &str) -> bool {
    t.len() == TOKEN_LEN && t.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Equal, in time that depends only on the lengths.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 32 bytes from the operating system's CSPRNG, hex-encoded.
fn random_token() -> Result<String, WebError> {
    llmgw_people::random_hex_token().map_err(|e| WebError::Internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use axum::http::header;

    use super::*;
    use crate::WebSettings;

    fn plain() -> std::sync::Arc<Web> {
        super::super::tests::harness::web(WebSettings::default(), vec![])
    }

    fn with_cookie(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            format!("other=1; {name}={value}").parse().expect("header"),
        );
        h
    }

    fn ours(value: &str) -> HeaderMap {
        with_cookie(PRE_COOKIE, value)
    }

    #[test]
    fn fresh_tokens_differ_and_are_well_formed() {
        let web = plain();
        let a = token(&web, &HeaderMap::new()).expect("token");
        let b = token(&web, &HeaderMap::new()).expect("token");
        assert_ne!(a, b);
        assert!(well_formed(&a) && well_formed(&b));
    }

    #[test]
    fn a_browser_keeps_its_token() {
        let web = plain();
        let t = random_token().expect("token");
        assert_eq!(token(&web, &ours(&t)).expect("token"), t);
        // A cookie we did not make is replaced, never echoed.
        assert_ne!(token(&web, &ours("abc")).expect("token"), "abc");
    }

    #[test]
    fn only_the_cookies_token_passes() {
        let web = plain();
        let t = random_token().expect("token");
        assert!(check(&web, &ours(&t), &t).is_ok());
        let other = random_token().expect("token");
        assert!(matches!(
            check(&web, &ours(&t), &other),
            Err(WebError::Csrf)
        ));
        assert!(matches!(check(&web, &ours(&t), ""), Err(WebError::Csrf)));
        assert!(matches!(
            check(&web, &HeaderMap::new(), &t),
            Err(WebError::Csrf)
        ));
        assert!(matches!(
            check(&web, &HeaderMap::new(), ""),
            Err(WebError::Csrf)
        ));
    }

    /// Behind TLS the cookie is `__Host-` prefixed, and one without the
    /// prefix (which a sibling subdomain or a plain-HTTP page could have
    /// planted) does not pass.
    #[test]
    fn behind_tls_only_a_host_prefixed_cookie_counts() {
        let web = super::super::tests::harness::web(
            WebSettings {
                secure_cookies: true,
                ..WebSettings::default()
            },
            vec![],
        );
        let t = random_token().expect("token");
        assert!(set(&web, &t).starts_with(&format!("__Host-{PRE_COOKIE}={t}; Path=/;")));
        assert!(set(&web, &t).ends_with("; Secure"));
        assert!(check(&web, &with_cookie(&format!("__Host-{PRE_COOKIE}"), &t), &t).is_ok());
        assert!(matches!(check(&web, &ours(&t), &t), Err(WebError::Csrf)));
        assert_ne!(token(&web, &ours(&t)).expect("token"), t);
    }
}
