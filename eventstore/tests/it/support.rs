//! Real stores for tests: a fresh PostgreSQL database per test (dropped
//! afterwards), or a fresh SQLite file in a temporary directory.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use llmgw_eventstore::{
    AnyStore, AppendHook, AppendPoint, EventStore, ExpectedVersion, NewEvent, OpenOptions,
    StoreAddress, StreamAppend,
};
use serde_json::json;
use sqlx::{Connection, Executor};
use tokio::sync::{Mutex, mpsc};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// The server to create test databases on: `DATABASE_URL`, else the local
/// default. Never skipped: without PostgreSQL these tests fail, loudly.
pub fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn with_database(url: &str, name: &str) -> String {
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
        // Drop runs inside the test's runtime; use a thread with its own.
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

/// A migrated store of either backend that cleans up after itself.
pub struct TestStore {
    pub store: AnyStore,
    pub address: StoreAddress,
    _scratch: Scratch,
}

/// An empty place for a store, removed when dropped.
#[expect(dead_code, reason = "the fields are held for their Drop")]
pub enum Scratch {
    Postgres(TestDb),
    Sqlite(tempfile::TempDir),
}

impl Scratch {
    pub async fn new(backend: Backend) -> (StoreAddress, Scratch) {
        match backend {
            Backend::Postgres => {
                let db = TestDb::create().await;
                (
                    StoreAddress::Postgres(db.url.clone()),
                    Scratch::Postgres(db),
                )
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let path = dir.path().join("llmgw.db");
                (StoreAddress::Sqlite(path), Scratch::Sqlite(dir))
            }
        }
    }
}

impl TestStore {
    pub async fn new(backend: Backend) -> TestStore {
        Self::with_options(backend, OpenOptions::migrating()).await
    }

    pub async fn with_options(backend: Backend, options: OpenOptions) -> TestStore {
        let (address, scratch) = Scratch::new(backend).await;
        let store = AnyStore::open(&address, options)
            .await
            .expect("open test store");
        TestStore {
            store,
            address,
            _scratch: scratch,
        }
    }

    /// A second, independent store on the same log: another "process".
    pub async fn another(&self, options: OpenOptions) -> AnyStore {
        AnyStore::open(&self.address, options)
            .await
            .expect("open second store")
    }

    /// Runs SQL straight against the database, behind the store's back.
    pub async fn raw(&self, sql: &str) -> Result<(), sqlx::Error> {
        match &self.store {
            AnyStore::Postgres(s) => s.pool().execute(sql).await.map(|_| ()),
            AnyStore::Sqlite(s) => s.pool().execute(sql).await.map(|_| ()),
        }
    }
}

pub fn event(kind: &str, n: u64) -> NewEvent {
    NewEvent::new(
        kind,
        1,
        json!({ "n": n, "note": "ünïcode ✓", "gib": 44.99 }),
    )
}

pub fn stream(id: &str, expected: ExpectedVersion, events: Vec<NewEvent>) -> StreamAppend {
    StreamAppend::new(id, expected, events)
}

/// Every event in the log, as stored.
pub async fn all_events<S: EventStore>(store: &S) -> Vec<llmgw_eventstore::RecordedEvent> {
    let mut out = Vec::new();
    loop {
        let page = store
            .read_all_raw(out.len() as u64, 1000)
            .await
            .expect("read");
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

/// Holds a writer at one point of its append until the test lets it go.
#[derive(Debug)]
pub struct Pause {
    point: AppendPoint,
    reached: mpsc::Sender<()>,
    resume: Mutex<mpsc::Receiver<()>>,
}

pub struct PauseControl {
    pub reached: mpsc::Receiver<()>,
    pub resume: mpsc::Sender<()>,
}

impl Pause {
    pub fn at(point: AppendPoint) -> (Arc<Pause>, PauseControl) {
        let (reached_tx, reached_rx) = mpsc::channel(1);
        let (resume_tx, resume_rx) = mpsc::channel(1);
        (
            Arc::new(Pause {
                point,
                reached: reached_tx,
                resume: Mutex::new(resume_rx),
            }),
            PauseControl {
                reached: reached_rx,
                resume: resume_tx,
            },
        )
    }
}

impl AppendHook for Pause {
    fn at(&self, point: AppendPoint) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if point == self.point {
                let _ = self.reached.send(()).await;
                let _ = self.resume.lock().await.recv().await;
            }
        })
    }
}

/// Generates one test per backend for each listed `async fn name(Backend)`.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::support::Backend::Postgres).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::support::Backend::Sqlite).await
                }
            )*
        }
    };
}
pub(crate) use both_backends;

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
