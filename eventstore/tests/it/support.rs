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
use sqlx::Executor;
use tokio::sync::{Mutex, mpsc};

pub use llmgw_testkit::{Backend, Scratch};

/// A migrated store of either backend that cleans up after itself.
pub struct TestStore {
    pub store: AnyStore,
    pub address: StoreAddress,
    _scratch: Scratch,
}

impl TestStore {
    pub async fn new(backend: Backend) -> TestStore {
        Self::with_options(backend, OpenOptions::migrating()).await
    }

    pub async fn with_options(backend: Backend, options: OpenOptions) -> TestStore {
        let (address, scratch) = Scratch::new(backend).await;
        let address = StoreAddress::parse(&address).expect("test address");
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
    let mut out: Vec<llmgw_eventstore::RecordedEvent> = Vec::new();
    loop {
        // After the last one read: a log imported from an anchor does not
        // begin at position 1.
        let after = out.last().map_or(0, |e| e.position);
        let page = store.read_all_raw(after, 1000).await.expect("read");
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
