//! A restarted server starts from its views' last snapshot instead of
//! replaying the whole log, whatever the mode and the backend: the
//! snapshot is the log's, so a server of another mode or instance on the
//! same store takes it too, and a restart leaves no row behind.

use llmgw_domain::Event;
use llmgw_domain::event::LeadershipEvent;
use llmgw_eventstore::{AnyStore, ExpectedVersion, NewEvent, StreamAppend};
use llmgw_projections::VIEWS_SNAPSHOT;
use llmgw_testkit::{Backend, Scratch};

use super::tenancy::{Mode, config, start};
use super::{Child, store_with};

/// The events a store holds before the first start: one snapshot floor's
/// worth (`SnapshotFloor::default().events`), so that the first start's
/// catch-up writes a snapshot before it serves.
const LOGGED: u64 = 10_000;

/// Keys need the views, so the server follows the log in every mode.
const AUTH: &str = "auth:\n  enabled: true\n";

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Postgres).await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Sqlite).await } )* }
    };
}

both_backends!(a_restart_replays_only_what_came_after_the_snapshot);

/// A migrated store holding `LOGGED` anchors, appended a thousand at a
/// time (real events the views read and skip past).
async fn logged(backend: Backend) -> (String, Scratch, AnyStore) {
    store_with(
        backend,
        (0..LOGGED / 1000).map(|page| {
            let events = (0..1000)
                .map(|i| {
                    let (kind, version, payload) =
                        Event::Leadership(LeadershipEvent::AnchorRecorded {
                            position: page * 1000 + i,
                            hash: "0".repeat(64),
                        })
                        .encode();
                    NewEvent::new(kind, version, payload)
                })
                .collect();
            vec![StreamAppend::new("anchors", ExpectedVersion::Any, events)]
        }),
    )
    .await
}

/// The server's "views started" line: from which snapshot position it
/// started and how many events it replayed.
fn views_started(server: &Child) -> (u64, u64) {
    let line = Child::expect(&server.stderr, "views started");
    let field = |name: &str| -> u64 {
        let at = line
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("{name} in {line}"));
        line[at + name.len() + 1..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("from_snapshot"), field("replayed"))
}

async fn snapshot_names(store: &AnyStore) -> Vec<String> {
    let sql = "SELECT name FROM es_snapshots ORDER BY name";
    match store {
        AnyStore::Postgres(s) => sqlx::query_scalar(sql).fetch_all(s.pool()).await,
        AnyStore::Sqlite(s) => sqlx::query_scalar(sql).fetch_all(s.pool()).await,
    }
    .unwrap()
}

async fn a_restart_replays_only_what_came_after_the_snapshot(b: Backend) {
    let (address, _scratch, store) = logged(b).await;
    let dir = tempfile::tempdir().unwrap();
    // No engine is asked anything: the endpoint only has to be named.
    let engine = "127.0.0.1:9";

    // The first start replays the whole log and snapshots it before it
    // serves.
    let first = start(&config(
        dir.path(),
        "a",
        &address,
        engine,
        Mode::RouterOnly,
        AUTH,
    ));
    assert_eq!(views_started(&first.child), (0, LOGGED));
    drop(first);
    assert_eq!(snapshot_names(&store).await, [VIEWS_SNAPSHOT]);

    // Restarted, as a control plane this time: it reads only what the
    // snapshot lacks (nothing, the log has not moved), and its own
    // events do not make another snapshot row.
    let second = start(&config(
        dir.path(),
        "b",
        &address,
        engine,
        Mode::Control,
        AUTH,
    ));
    assert_eq!(views_started(&second.child), (LOGGED, 0));
    drop(second);
    let third = start(&config(
        dir.path(),
        "c",
        &address,
        engine,
        Mode::RouterOnly,
        AUTH,
    ));
    let (from, _) = views_started(&third.child);
    assert_eq!(from, LOGGED, "the third start took the same snapshot");
    assert_eq!(snapshot_names(&store).await, [VIEWS_SNAPSHOT]);
}
