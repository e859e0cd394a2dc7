use std::path::PathBuf;

use crate::StoreError;

/// Where the log lives, parsed from an operator's `--store` value.
///
/// - `postgres://…` or `postgresql://…`: PostgreSQL;
/// - `sqlite://PATH`, `sqlite:PATH` or a plain path: SQLite, the embedded default;
/// - `@FILE`: the address is read from FILE, so that a DSN with a password
///   stays out of command lines and configuration files.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreAddress {
    Postgres(String),
    Sqlite(PathBuf),
}

impl StoreAddress {
    pub fn parse(raw: &str) -> Result<Self, StoreError> {
        // An error names the address, never its password.
        let bad = |reason: &str| StoreError::BadAddress {
            address: redact_raw(raw),
            reason: reason.to_owned(),
        };
        let raw_trim = raw.trim();
        if let Some(file) = raw_trim.strip_prefix('@') {
            if file.is_empty() {
                return Err(bad("`@` must be followed by the path of a file"));
            }
            let text = std::fs::read_to_string(file).map_err(|e| StoreError::BadAddress {
                address: raw.to_owned(),
                reason: format!("cannot read {file}: {e}"),
            })?;
            let inner = text.trim();
            if inner.starts_with('@') {
                return Err(bad("the file must hold an address, not another `@file`"));
            }
            return Self::parse(inner);
        }
        if raw_trim.is_empty() {
            return Err(bad("empty address"));
        }
        if raw_trim.starts_with("postgres://") || raw_trim.starts_with("postgresql://") {
            // Validate now, so a typo is reported before any connection attempt.
            if let Err(e) = raw_trim.parse::<sqlx::postgres::PgConnectOptions>() {
                return Err(unreadable_url(raw_trim, &e.to_string()));
            }
            return Ok(StoreAddress::Postgres(raw_trim.to_owned()));
        }
        if is_keyword_form(raw_trim) {
            // libpq's `host=… dbname=…` would otherwise open a SQLite file
            // of that name: a server meant for PostgreSQL alone on a disk.
            return Err(bad(
                "a PostgreSQL key=value string is not taken: write it as postgres://user:password@host:port/dbname",
            ));
        }
        let path = if let Some(rest) = raw_trim.strip_prefix("sqlite://") {
            rest
        } else if let Some(rest) = raw_trim.strip_prefix("sqlite:") {
            rest
        } else if raw_trim.contains("://") {
            return Err(bad(
                "unknown scheme: use postgres://, sqlite:// or a file path",
            ));
        } else {
            raw_trim
        };
        // Options (`?mode=ro`) would be dropped, and the store opened
        // read-write all the same: refused rather than ignored.
        if let Some((_, options)) = path.split_once('?') {
            return Err(bad(&format!(
                "a SQLite address takes no options (`?{options}`): the store is opened read-write, as the server needs it; remove them"
            )));
        }
        if path.is_empty() {
            return Err(bad("sqlite address without a path"));
        }
        if path == ":memory:" {
            return Err(bad(
                "an in-memory SQLite store would be lost on exit; give a file path",
            ));
        }
        Ok(StoreAddress::Sqlite(PathBuf::from(path)))
    }

    /// The address with any password replaced, fit for logs and errors.
    pub fn redacted(&self) -> String {
        match self {
            StoreAddress::Sqlite(p) => format!("sqlite://{}", p.display()),
            StoreAddress::Postgres(url) => redact_password(url),
        }
    }
}

impl std::fmt::Debug for StoreAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl std::fmt::Display for StoreAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// libpq's keywords a connection string of the `key=value` form starts
/// with; a file name rarely does.
const LIBPQ_KEYWORDS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "sslmode",
    "passfile",
    "service",
    "options",
    "connect_timeout",
    "application_name",
];

fn is_keyword_form(raw: &str) -> bool {
    raw.split_whitespace().any(|word| {
        word.split_once('=')
            .is_some_and(|(key, _)| LIBPQ_KEYWORDS.contains(&key))
    })
}

/// Any address as given, its password hidden (a URL's, or a `password=`
/// word's).
fn redact_raw(raw: &str) -> String {
    if raw.contains("://") {
        return redact_password(raw);
    }
    let mut out: Vec<&str> = Vec::new();
    // Inside a quoted password value (`password='a b'`): its words go too.
    let mut quoted = false;
    for word in raw.split_whitespace() {
        if quoted {
            quoted = !word.ends_with('\'');
            continue;
        }
        match word.split_once('=') {
            Some(("password", value)) => {
                quoted = value.starts_with('\'') && (value.len() == 1 || !value.ends_with('\''));
                out.push("password=***");
            }
            _ => out.push(word),
        }
    }
    out.join(" ")
}

/// A PostgreSQL URL the parser refused. Its authority cannot be trusted
/// to end where a URL's does: a password's raw `/` or `?` ended it early,
/// and the password was shown whole. Everything before the last `@` is
/// taken for the user part here, and hidden but for the user's name.
fn unreadable_url(raw: &str, reason: &str) -> StoreError {
    let (scheme, rest) = raw.split_once("://").unwrap_or(("postgres", raw));
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return StoreError::BadAddress {
            address: redact_raw(raw),
            reason: reason.to_owned(),
        };
    };
    let user = userinfo.split(':').next().unwrap_or_default();
    let hidden = if userinfo.contains(':') {
        format!("{user}:***")
    } else {
        user.to_owned()
    };
    let hint = if userinfo.contains(['/', '?', '#', '@']) {
        " (a password's `/`, `?`, `#` or `@` is written percent-encoded: %2F, %3F, %23, %40)"
    } else {
        ""
    };
    StoreError::BadAddress {
        address: format!("{scheme}://{hidden}@{}", redact_query_password(host)),
        reason: format!("{reason}{hint}"),
    }
}

fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        // No user part, but the query may carry `password=`.
        return format!("{scheme}://{authority}{}", redact_query_password(tail));
    };
    let user = userinfo.split(':').next().unwrap_or_default();
    let userinfo = if userinfo.contains(':') {
        format!("{user}:***")
    } else {
        user.to_owned()
    };
    let tail = redact_query_password(tail);
    format!("{scheme}://{userinfo}@{host}{tail}")
}

fn redact_query_password(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some(("password", _)) => "password=***".to_owned(),
            _ => kv.to_owned(),
        })
        .collect();
    format!("{path}?{}", query.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A password with a raw `/` or `?` makes the URL unreadable; the
    /// error hides it all the same, and says how to write it.
    #[test]
    fn an_unreadable_urls_password_is_hidden_and_the_fix_named() {
        for raw in [
            "postgres://llmgw:k8J/x2+Qz9@db.internal:5432/llmgw",
            "postgresql://llmgw:a?b/c@db.internal/llmgw",
        ] {
            let e = StoreAddress::parse(raw).unwrap_err().to_string();
            assert!(!e.contains("x2+Qz9") && !e.contains("b/c"), "{e}");
            assert!(e.contains("llmgw:***@db.internal"), "{e}");
            assert!(e.contains("percent-encoded: %2F, %3F"), "{e}");
        }
    }

    /// A password given in the query alone, with no user part, is hidden.
    #[test]
    fn a_password_in_the_query_alone_is_redacted() {
        let a = StoreAddress::parse("postgres://db.internal/llmgw?user=u&password=s3cret").unwrap();
        let shown = a.redacted();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("user=u"), "{shown}");
    }

    /// libpq's key=value form is refused (it was a SQLite file of that
    /// name), and no refusal shows a password.
    #[test]
    fn a_keyword_string_is_refused_and_no_error_shows_a_password() {
        let e = StoreAddress::parse("host=127.0.0.1 user=postgres password=KvSecret3 dbname=x")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("postgres://user:password@host") && !e.contains("KvSecret3"),
            "{e}"
        );
        assert!(e.contains("password=***"), "{e}");
        let e = StoreAddress::parse("host=db password='two words' dbname=x")
            .unwrap_err()
            .to_string();
        assert!(
            !e.contains("two") && !e.contains("words") && e.contains("password=*** dbname=x"),
            "{e}"
        );
        let e = StoreAddress::parse("postgres://u:UrlSecret@db:notaport/x")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("UrlSecret") && e.contains("u:***@db"), "{e}");
        // A path that merely holds an `=` is still a path.
        assert!(matches!(
            StoreAddress::parse("/data/run=1/llmgw.db"),
            Ok(StoreAddress::Sqlite(_))
        ));
    }

    #[test]
    fn schemes_pick_the_backend() {
        assert!(matches!(
            StoreAddress::parse("postgres://u@localhost/db").unwrap(),
            StoreAddress::Postgres(_)
        ));
        assert_eq!(
            StoreAddress::parse("sqlite:///var/lib/llmgw/log.db").unwrap(),
            StoreAddress::Sqlite("/var/lib/llmgw/log.db".into())
        );
        assert_eq!(
            StoreAddress::parse("sqlite:log.db").unwrap(),
            StoreAddress::Sqlite("log.db".into())
        );
        assert_eq!(
            StoreAddress::parse("./data/llmgw.db").unwrap(),
            StoreAddress::Sqlite("./data/llmgw.db".into())
        );
    }

    #[test]
    fn bad_addresses_say_why() {
        for raw in [
            "",
            "mysql://x",
            "sqlite://",
            "sqlite::memory:",
            "sqlite://log.db?mode=ro",
            "@",
            "postgres://u@h:notaport/db",
        ] {
            let err = StoreAddress::parse(raw).unwrap_err();
            assert!(matches!(err, StoreError::BadAddress { .. }), "{raw}: {err}");
        }
    }

    #[test]
    fn at_file_reads_the_address_and_hides_the_password() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("dsn");
        std::fs::write(&file, "postgres://llmgw:s3cret@db.internal:5432/llmgw\n").unwrap();
        let addr = StoreAddress::parse(&format!("@{}", file.display())).unwrap();
        assert_eq!(
            addr,
            StoreAddress::Postgres("postgres://llmgw:s3cret@db.internal:5432/llmgw".into())
        );
        assert_eq!(
            addr.redacted(),
            "postgres://llmgw:***@db.internal:5432/llmgw"
        );
        assert!(!format!("{addr:?}").contains("s3cret"));

        let missing = StoreAddress::parse("@/nonexistent/dsn").unwrap_err();
        assert!(missing.to_string().contains("cannot read /nonexistent/dsn"));
    }

    #[test]
    fn query_passwords_are_redacted() {
        let addr =
            StoreAddress::parse("postgres://u@h/db?password=hunter2&sslmode=require").unwrap();
        assert_eq!(
            addr.redacted(),
            "postgres://u@h/db?password=***&sslmode=require"
        );
    }
}
