//! A fresh store per test, a `People` over it, and a stand-in for the log's
//! view of who is active.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use llmgw_domain::tenancy::UserStatus;
use llmgw_eventstore::{AnyStore, OpenOptions, StoreAddress};
use llmgw_people::{Opened, People, PeopleConfig, PeopleError};
pub(crate) use llmgw_testkit::Backend;
use llmgw_testkit::Scratch;

pub(crate) const GOOD: &str = "correct horse battery staple";
pub(crate) const AYSE: &str = "ayse@example.com";

/// The instant every test starts at; later ones are offsets from it.
pub(crate) fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2025-03-01T09:00:00.123456Z")
        .unwrap()
        .with_timezone(&Utc)
}

pub(crate) fn at(secs: i64) -> DateTime<Utc> {
    t0() + TimeDelta::seconds(secs)
}

pub(crate) struct Fx {
    pub people: People,
    pub store: AnyStore,
    pub address: StoreAddress,
    states: Mutex<HashMap<String, UserStatus>>,
    _scratch: Scratch,
}

impl Fx {
    pub(crate) async fn new(backend: Backend) -> Fx {
        Fx::with(backend, PeopleConfig::default()).await
    }

    /// Attempts limited to three, as in the reference scenarios.
    pub(crate) async fn max3(backend: Backend) -> Fx {
        Fx::with(
            backend,
            PeopleConfig {
                max_attempts: 3,
                ..PeopleConfig::default()
            },
        )
        .await
    }

    pub(crate) async fn with(backend: Backend, config: PeopleConfig) -> Fx {
        let (address, scratch) = Scratch::new(backend).await;
        let address = StoreAddress::parse(&address).unwrap();
        let store = AnyStore::open(&address, OpenOptions::migrating())
            .await
            .unwrap();
        Fx {
            people: People::new(&store, config),
            store,
            address,
            states: Mutex::new(HashMap::new()),
            _scratch: scratch,
        }
    }

    /// What the log would say after a sign-up, an approval, a suspension.
    pub(crate) fn set(&self, user_id: &str, status: UserStatus) {
        self.states
            .lock()
            .unwrap()
            .insert(user_id.to_owned(), status);
    }

    pub(crate) async fn sign_in(
        &self,
        email: &str,
        password: &str,
        now: DateTime<Utc>,
    ) -> Result<Opened, PeopleError> {
        let states = &self.states;
        self.people
            .sign_in(
                email,
                password,
                move |id| states.lock().unwrap().get(id).copied(),
                now,
            )
            .await
    }

    /// Ayşe, signed up with `GOOD` and pending.
    pub(crate) async fn pending(&self) -> String {
        let id = self
            .people
            .sign_up("Ayse@Example.COM", "Ayşe", GOOD, t0())
            .await
            .unwrap()
            .expect("a new address gets an account");
        self.set(&id, UserStatus::Pending);
        id
    }

    /// Ayşe, signed up with `GOOD` and approved.
    pub(crate) async fn active(&self) -> String {
        let id = self.pending().await;
        self.set(&id, UserStatus::Active);
        id
    }

    /// A row count straight from the tables.
    pub(crate) async fn count(&self, sql: &str) -> i64 {
        match &self.store {
            AnyStore::Postgres(s) => sqlx::query_scalar(sql).fetch_one(s.pool()).await.unwrap(),
            AnyStore::Sqlite(s) => sqlx::query_scalar(sql).fetch_one(s.pool()).await.unwrap(),
        }
    }
}

pub(crate) fn hours(h: u64) -> Duration {
    Duration::from_secs(h * 3600)
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
