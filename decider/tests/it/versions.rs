//! Expected versions are real: a concurrent append to a stream a command
//! writes makes the command be decided again, a bounded number of times.

use std::sync::Arc;

use llmgw_decider::hooks::BeforeAppend;
use llmgw_decider::{DecideError, Decider, MAX_TRIES};
use llmgw_domain::Command;
use llmgw_domain::tenancy::{Limits, Scope, TenancyCommand as T};
use serde_json::json;

use crate::{BACKENDS, leader, of_type, operator, store, with_key};

fn revoke(key: &str) -> Command {
    Command::Tenancy(T::RevokeKey {
        key_id: key.into(),
        by: "ops".into(),
    })
}

fn rpm(key: &str, rpm: u32) -> Command {
    limits(Scope::Key, key, rpm)
}

fn limits(scope: Scope, id: &str, rpm: u32) -> Command {
    Command::Tenancy(T::SetLimits {
        scope,
        scope_id: id.into(),
        limits: Limits {
            rpm: Some(rpm),
            ..Limits::default()
        },
    })
}

#[tokio::test]
async fn an_append_racing_another_writer_is_decided_again() {
    for backend in BACKENDS {
        let (store, _scratch) = store(backend).await;
        let (_, writer) = with_key(&store).await;
        // Another writer revokes the key between our decision and our
        // append, once.
        let other = Arc::new(Decider::new(store.clone(), "ctl-other".into()));
        let (w, o) = (writer.clone(), other.clone());
        let hook = BeforeAppend(Arc::new(move |attempt| {
            let (w, o) = (w.clone(), o.clone());
            Box::pin(async move {
                if attempt == 1 {
                    o.execute(&w, &leader(), vec![revoke("k")]).await.unwrap();
                }
            })
        }));
        let ours = Decider::new(store.clone(), "ctl".into()).before_append(hook);
        let decided = ours
            .execute(&writer, &operator("alice"), vec![revoke("k")])
            .await
            .unwrap();
        assert_eq!(
            decided.events,
            vec![],
            "{backend:?}: decided again, the key was already revoked"
        );
        let revoked = of_type(&store, "KeyRevoked").await;
        assert_eq!(revoked.len(), 1, "{backend:?}: one revocation, not two");
        assert_eq!(revoked[0].metadata["writer"], json!("ctl-other"));
    }
}

#[tokio::test]
async fn a_stream_that_keeps_changing_fails_clearly_after_the_last_try() {
    for backend in BACKENDS {
        let (store, _scratch) = store(backend).await;
        let (_, writer) = with_key(&store).await;
        let other = Arc::new(Decider::new(store.clone(), "ctl-other".into()));
        let (w, o) = (writer.clone(), other.clone());
        let hook = BeforeAppend(Arc::new(move |attempt| {
            let (w, o) = (w.clone(), o.clone());
            Box::pin(async move {
                o.execute(&w, &leader(), vec![rpm("k", 100 + attempt)])
                    .await
                    .unwrap();
            })
        }));
        let ours = Decider::new(store.clone(), "ctl".into()).before_append(hook);
        let err = ours
            .execute(&writer, &operator("alice"), vec![rpm("k", 5)])
            .await
            .unwrap_err();
        assert!(
            matches!(&err, DecideError::Conflict { stream, tries } if stream == "key-k" && *tries == MAX_TRIES),
            "{backend:?}: {err:?}"
        );
        assert_eq!(
            err.to_string(),
            "stream key-k kept changing while this command was decided (3 tries); nothing was written: try again"
        );
        let set = of_type(&store, "LimitsSet").await;
        assert_eq!(set.len(), 3, "{backend:?}: only the other writer's");
        assert!(
            set.iter()
                .all(|e| e.metadata["writer"] == json!("ctl-other"))
        );
        // Nothing of ours is left half-applied: the next command decides on
        // the log as it is.
        let again = Decider::new(store.clone(), "ctl".into());
        let state = again.state().await.unwrap();
        assert_eq!(state.tenancy.limits[&Scope::Key]["k"].rpm, Some(103));
    }
}

#[tokio::test]
async fn a_decider_that_fell_behind_catches_up_before_it_appends() {
    for backend in BACKENDS {
        let (store, _scratch) = store(backend).await;
        let (d, writer) = with_key(&store).await;
        // Another writer moves the project's stream on; `d` has not read it.
        let other = Decider::new(store.clone(), "ctl-other".into());
        other
            .execute(&writer, &leader(), vec![limits(Scope::Project, "p", 9)])
            .await
            .unwrap();
        d.execute(&writer, &leader(), vec![limits(Scope::Project, "p", 10)])
            .await
            .unwrap();
        let set = of_type(&store, "LimitsSet").await;
        assert_eq!(
            set.iter().map(|e| e.stream_version).collect::<Vec<_>>(),
            vec![2, 3],
            "{backend:?}: both land, in turn, after ProjectCreated"
        );
    }
}
