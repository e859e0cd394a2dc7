//! `landing.contact`: an operator writes an email address, a web address
//! or a sentence. Only the first two become links, and only with schemes
//! we chose (`mailto:`, `http:`, `https:`), so a stored `javascript:` or
//! `data:` address stays text however it is spelled.

/// How the contact line is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Contact {
    /// A link: `href` and the text shown.
    Link {
        href: String,
        text: String,
    },
    Text(String),
}

impl Contact {
    pub(super) fn href(&self) -> Option<&str> {
        match self {
            Contact::Link { href, .. } => Some(href),
            Contact::Text(_) => None,
        }
    }

    pub(super) fn text(&self) -> &str {
        match self {
            Contact::Link { text, .. } => text,
            Contact::Text(t) => t,
        }
    }
}

pub(super) fn classify(raw: &str) -> Contact {
    let s = raw.trim();
    let address = strip_prefix_ci(s, "mailto:").unwrap_or(s);
    if is_email(address) {
        return Contact::Link {
            href: format!("mailto:{address}"),
            text: address.to_owned(),
        };
    }
    if is_web_address(s) {
        return Contact::Link {
            href: s.to_owned(),
            text: s.to_owned(),
        };
    }
    Contact::Text(s.to_owned())
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// One `@`, something either side, a dot in the domain, and nothing that
/// could end an attribute or start another part of a URL.
fn is_email(s: &str) -> bool {
    let Some((local, domain)) = s.split_once('@') else {
        return false;
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._%+-".contains(c);
    !local.is_empty()
        && !domain.is_empty()
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && local.chars().all(allowed)
        && domain
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-".contains(c))
}

/// `http://` or `https://`, a host, and no spaces or control characters.
fn is_web_address(s: &str) -> bool {
    let rest = strip_prefix_ci(s, "https://").or_else(|| strip_prefix_ci(s, "http://"));
    let Some(rest) = rest else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    !host.is_empty()
        && !host.contains('@')
        && s.chars()
            .all(|c| c.is_ascii_graphic() && !"\"'<>\\`".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(href: &str, text: &str) -> Contact {
        Contact::Link {
            href: href.into(),
            text: text.into(),
        }
    }

    #[test]
    fn an_email_becomes_a_mailto_link() {
        assert_eq!(
            classify("ops@example.org"),
            link("mailto:ops@example.org", "ops@example.org")
        );
        assert_eq!(
            classify("  MAILTO:ops@example.org "),
            link("mailto:ops@example.org", "ops@example.org")
        );
    }

    #[test]
    fn a_web_address_becomes_a_link() {
        assert_eq!(
            classify("https://wiki.example.org/llm?x=1#help"),
            link(
                "https://wiki.example.org/llm?x=1#help",
                "https://wiki.example.org/llm?x=1#help"
            )
        );
        assert_eq!(
            classify("http://intranet/help"),
            link("http://intranet/help", "http://intranet/help")
        );
    }

    #[test]
    fn anything_else_is_text() {
        for raw in [
            "javascript:alert(1)",
            "JavaScript:alert(document.cookie)",
            " javascript:alert(1)//@example.org",
            "data:text/html,<script>alert(1)</script>",
            "mailto:x@example.org?body=<b>",
            "vbscript:msgbox",
            "https://",
            "https://exa mple.org",
            "https://example.org/\"onmouseover=\"x",
            "https://user@evil.example/",
            "ask the platform team in #llm",
            "ops@localhost",
            "a@b@example.org",
        ] {
            assert_eq!(
                classify(raw),
                Contact::Text(raw.trim().to_owned()),
                "{raw:?}"
            );
        }
    }
}
