//! The one door for writes, against real PostgreSQL and SQLite stores.

#![allow(clippy::unwrap_used, reason = "in tests an unwrap is an assertion")]

mod audit;
mod offline;
mod versions;

use std::time::Duration;

use llmgw_decider::{Actor, Decider, Origin};
use llmgw_domain::Command;
use llmgw_domain::tenancy::{Band, Key, TenancyCommand as T};
use llmgw_eventstore::{
    AnyStore, EventStore, LeaseToken, OpenOptions, RecordedEvent, StoreAddress, Writer,
};
use llmgw_testkit::{Backend, Scratch};

pub(crate) const BACKENDS: [Backend; 2] = [Backend::Postgres, Backend::Sqlite];

/// A fresh, migrated store; the scratch keeps it alive.
pub(crate) async fn store(backend: Backend) -> (AnyStore, Scratch) {
    let (address, scratch) = Scratch::new(backend).await;
    let store = AnyStore::open(
        &StoreAddress::parse(&address).unwrap(),
        OpenOptions::migrating(),
    )
    .await
    .unwrap();
    (store, scratch)
}

pub(crate) fn key(id: &str, name: &str) -> Key {
    Key {
        key_id: id.into(),
        project_id: "p".into(),
        name: name.into(),
        hash: "ab".repeat(32),
        prefix: "llmgw-sk-ab".into(),
        band: Band::Gold,
        routing_profile: None,
        revoked: false,
        owner: None,
        claim_by: None,
        expires_at: None,
        previous: None,
    }
}

/// Org o, team t, project p.
pub(crate) fn tree() -> Vec<Command> {
    vec![
        Command::Tenancy(T::CreateOrg {
            org_id: "o".into(),
            name: "Acme".into(),
        }),
        Command::Tenancy(T::CreateTeam {
            team_id: "t".into(),
            org_id: "o".into(),
            name: "ML".into(),
        }),
        Command::Tenancy(T::CreateProject {
            project_id: "p".into(),
            team_id: "t".into(),
            name: "chat".into(),
        }),
    ]
}

/// A leader's lease and its writer.
pub(crate) async fn lead(store: &AnyStore, holder: &str) -> (LeaseToken, Writer) {
    let lease = store
        .acquire_lease(holder, Duration::from_secs(60))
        .await
        .unwrap();
    (lease.token.clone(), Writer::Leader(lease.token))
}

/// A decider over `store` leading as `ctl`, with the tree and key `k`.
pub(crate) async fn with_key(store: &AnyStore) -> (Decider, Writer) {
    let (_, writer) = lead(store, "ctl").await;
    let d = Decider::new(store.clone(), "ctl".into());
    let mut commands = tree();
    commands.push(Command::Tenancy(T::IssueKey(key("k", "ci"))));
    d.execute(&writer, &leader(), commands).await.unwrap();
    (d, writer)
}

pub(crate) fn leader() -> Origin {
    Origin::new(Actor::Leader("ctl".into()))
}

pub(crate) fn operator(name: &str) -> Origin {
    Origin::new(Actor::Operator(name.into()))
}

pub(crate) async fn log(store: &AnyStore) -> Vec<RecordedEvent> {
    store.read_all(0, 100_000).await.unwrap()
}

pub(crate) async fn of_type(store: &AnyStore, event_type: &str) -> Vec<RecordedEvent> {
    log(store)
        .await
        .into_iter()
        .filter(|e| e.event_type == event_type)
        .collect()
}
