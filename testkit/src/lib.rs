//! Real databases for tests, never mocks: a fresh PostgreSQL database per
//! test (dropped afterwards) or a fresh SQLite file in a temporary directory.
//!
//! What belongs here: helpers that tests of several crates share. What must
//! not: anything a production binary links.
//!
//! PostgreSQL comes from `DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/postgres`.
//! When it is unreachable the test fails with a message saying how to get
//! one; it is never skipped.
//!
//! `PrivatePostgres` is a PostgreSQL server of a test's own (for restarting
//! it under load), started with the installed server binaries.
//!
//! `relay` is a TCP relay between a program and its database that a test
//! can pause, cut and restore, or make lose one answer.
//!
//! `served` runs a shipped `llmgw server` for the benchmarks that measure
//! the binary itself.
//!
//! `webdriver` drives a real headless Chromium (`Browser::start`) for tests
//! of the pages; without Chromium and ChromeDriver installed it fails with a
//! message saying how to install them.

pub mod private_pg;
pub mod relay;
pub mod served;
pub mod webdriver;

pub use private_pg::PrivatePostgres;
pub use relay::{Link, Relay};
pub use served::Served;
pub use webdriver::{Browser, Element, WebDriverError};

use sqlx::{Connection, Executor};

/// The server to create test databases on.
/// Waits until `check` says yes, for up to 30 s. Another process's state
/// (a server's API, an agent's files) offers nothing to await, so it is
/// read again every 50 ms; this is the one place tests poll.
pub async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut every = tokio::time::interval(std::time::Duration::from_millis(50));
    loop {
        every.tick().await;
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
    }
}

pub fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// `url` with its database name replaced by `name`.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{}", &base[..host_end], name);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// A database of its own for one test, dropped with the value.
#[derive(Debug)]
pub struct TestDb {
    pub url: String,
    name: String,
}

impl TestDb {
    pub async fn create() -> TestDb {
        let admin = admin_url();
        let name = format!("llmgw_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL is not reachable at {admin} ({e}). Set DATABASE_URL, \
                 or run the tests through scripts/test, which starts one."
                )
            });
        conn.execute(format!("CREATE DATABASE {name}").as_str())
            .await
            .expect("create test database");
        TestDb {
            url: with_database(&admin, &name),
            name,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin = admin_url();
        let name = self.name.clone();
        // Drop may run inside a test's runtime: use a thread with its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&admin).await?;
                conn.execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
                    .await
                    .map(|_| ())
            })
            .map_err(std::io::Error::other)
        })
        .join();
    }
}

/// The two places a store can live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// An empty place for a store, removed when dropped.
#[derive(Debug)]
pub enum Scratch {
    Postgres(TestDb),
    Sqlite(tempfile::TempDir),
}

impl Scratch {
    /// A fresh, empty store address (`postgres://…` or a SQLite file path).
    pub async fn new(backend: Backend) -> (String, Scratch) {
        match backend {
            Backend::Postgres => {
                let db = TestDb::create().await;
                (db.url.clone(), Scratch::Postgres(db))
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let path = dir.path().join("llmgw.db");
                (path.display().to_string(), Scratch::Sqlite(dir))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_replace_the_path_only() {
        assert_eq!(
            with_database(
                "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
                "t1"
            ),
            "postgres://postgres@127.0.0.1:5432/t1?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h", "t2"), "postgres://u@h/t2");
    }
}
