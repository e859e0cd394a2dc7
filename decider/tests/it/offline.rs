//! Writing with no server: decisions serialised under the append lease.

use std::time::Duration;

use llmgw_decider::{DecideError, offline};
use llmgw_domain::Command;
use llmgw_domain::tenancy::TenancyCommand as T;
use llmgw_eventstore::EventStore;

use crate::{BACKENDS, key, of_type, operator, store, tree};

async fn with_tree(
    backend: llmgw_testkit::Backend,
) -> (llmgw_eventstore::AnyStore, llmgw_testkit::Scratch) {
    let (store, scratch) = store(backend).await;
    offline::execute(&store, &operator("ops"), tree())
        .await
        .unwrap();
    (store, scratch)
}

#[tokio::test]
async fn two_concurrent_creates_of_one_name_let_exactly_one_through() {
    for backend in BACKENDS {
        let (store, _scratch) = with_tree(backend).await;
        let create = |id: &str| {
            let store = store.clone();
            let c = vec![Command::Tenancy(T::IssueKey(key(id, "ci")))];
            async move { offline::execute(&store, &operator("ops"), c).await }
        };
        let (a, b) = tokio::join!(create("k1"), create("k2"));
        let (won, lost) = match (a, b) {
            (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w, l),
            other => panic!("{backend:?}: exactly one must win: {other:?}"),
        };
        assert_eq!(won.events.len(), 1);
        assert!(
            matches!(&lost, DecideError::Rejected(r) if r.reason.starts_with("project p already has a key named ci")),
            "{backend:?}: {lost:?}"
        );
        assert_eq!(of_type(&store, "KeyIssued").await.len(), 1, "{backend:?}");
        assert_eq!(of_type(&store, "CommandRefused").await.len(), 1);
        assert!(
            !store.lease_info().await.unwrap().held,
            "{backend:?}: the lease is released after each command"
        );
    }
}

#[tokio::test]
async fn a_server_holding_the_lease_is_named_not_waited_for() {
    for backend in BACKENDS {
        let (store, _scratch) = with_tree(backend).await;
        store
            .acquire_lease("server-a", Duration::from_secs(60))
            .await
            .unwrap();
        let err = offline::execute(
            &store,
            &operator("ops"),
            vec![Command::Tenancy(T::IssueKey(key("k1", "ci")))],
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, DecideError::LeaseHeld { holder, .. } if holder == "server-a"),
            "{backend:?}: {err:?}"
        );
        assert!(err.to_string().contains("admin API"), "{err}");
        assert!(of_type(&store, "KeyIssued").await.is_empty());
    }
}

#[tokio::test]
async fn another_cli_holding_the_lease_is_waited_for() {
    for backend in BACKENDS {
        let (store, _scratch) = with_tree(backend).await;
        let held = store
            .acquire_lease("cli-1-0", Duration::from_secs(60))
            .await
            .unwrap();
        let create = tokio::spawn({
            let store = store.clone();
            async move {
                offline::execute(
                    &store,
                    &operator("ops"),
                    vec![Command::Tenancy(T::IssueKey(key("k1", "ci")))],
                )
                .await
            }
        });
        // Whether the command tried before this release or after, it
        // succeeds: a CLI's hold is short and worth waiting for.
        store.release_lease(&held.token).await.unwrap();
        create.await.unwrap().unwrap();
        assert_eq!(of_type(&store, "KeyIssued").await.len(), 1, "{backend:?}");
    }
}
