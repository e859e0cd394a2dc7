use llmgw_convo::{Appended, Keep, Retention};
use serde_json::json;

use crate::support::{BOTH, Fx, hours};

#[tokio::test]
async fn a_thread_keeps_its_turns_in_order_per_project() {
    for backend in BOTH {
        let fx = Fx::new(backend).await;
        let c = &fx.convo;
        c.append(
            "p",
            "t1",
            &[json!({"role": "user", "content": "hi"})],
            hours(0),
        )
        .await
        .unwrap();
        c.append(
            "p",
            "t1",
            &[
                json!({"role": "assistant", "content": "hello"}),
                json!({"role": "user", "content": "again"}),
            ],
            hours(1),
        )
        .await
        .unwrap();
        let contents: Vec<_> = c
            .history("p", "t1")
            .await
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(contents, ["hi", "hello", "again"], "{backend:?}");
        // The same id in another project is another (here: no) thread.
        assert!(c.history("q", "t1").await.unwrap().is_empty());
        assert!(!c.delete_thread("q", "t1").await.unwrap());
        assert!(c.delete_thread("p", "t1").await.unwrap());
        assert!(c.history("p", "t1").await.unwrap().is_empty());
        // A deleted thread starts again from nothing.
        c.append(
            "p",
            "t1",
            &[json!({"role": "user", "content": "new"})],
            hours(2),
        )
        .await
        .unwrap();
        assert_eq!(c.history("p", "t1").await.unwrap().len(), 1);
    }
}

#[tokio::test]
async fn the_sweep_deletes_threads_unwritten_past_retention() {
    for backend in BOTH {
        let fx = Fx::new(backend).await;
        let c = &fx.convo;
        let turn = [json!({"role": "user", "content": "x"})];
        c.append("p", "old", &turn, hours(0)).await.unwrap();
        c.append("p", "busy", &turn, hours(0)).await.unwrap();
        c.append("p", "busy", &turn, hours(30)).await.unwrap();
        c.append("off", "t", &turn, hours(30)).await.unwrap();
        let keep = Retention {
            threads: [
                ("p".to_owned(), Keep::Hours(24)),
                ("off".to_owned(), Keep::Nothing),
            ]
            .into(),
            ..Retention::default()
        };
        let swept = c.sweep(&keep, hours(31)).await.unwrap();
        assert_eq!(swept.threads, 2, "{backend:?}");
        assert!(c.history("p", "old").await.unwrap().is_empty());
        assert_eq!(c.history("p", "busy").await.unwrap().len(), 2);
        assert!(c.history("off", "t").await.unwrap().is_empty());
    }
}

/// Two servers on one store, one with keys (projects pa, pb; pb
/// switched off) and one without (the ownerless pool ""): each sweep
/// deletes only what its own retention names. A project a retention
/// does not name was read as switched off, so the keyless server's first
/// sweep deleted every project's threads and notes, and the keyed one
/// the pool's.
#[tokio::test]
async fn a_sweep_leaves_what_its_retention_does_not_name() {
    let me = |p: &str| crate::support::owner(p, "agent");
    for backend in BOTH {
        let fx = Fx::new(backend).await;
        let c = &fx.convo;
        let turn = [json!({"role": "user", "content": "x"})];
        for project in ["pa", "pb", ""] {
            c.append(project, "t", &turn, hours(0)).await.unwrap();
            if !project.is_empty() {
                c.put_note(&me(project), "k", "x", &[], hours(0))
                    .await
                    .unwrap();
            }
        }
        let keyless = Retention {
            threads: [(String::new(), Keep::Hours(24))].into(),
            ..Retention::default()
        };
        let swept = c.sweep(&keyless, hours(30)).await.unwrap();
        assert_eq!((swept.threads, swept.notes), (1, 0), "{backend:?}");
        assert!(c.history("", "t").await.unwrap().is_empty());
        for project in ["pa", "pb"] {
            assert_eq!(c.history(project, "t").await.unwrap().len(), 1);
            assert!(c.note(&me(project), "k").await.unwrap().is_some());
        }

        c.append("", "t", &turn, hours(30)).await.unwrap();
        let keyed = Retention {
            threads: [
                ("pa".to_owned(), Keep::Hours(100)),
                ("pb".to_owned(), Keep::Nothing),
            ]
            .into(),
            notes: [
                ("pa".to_owned(), Keep::Hours(100)),
                ("pb".to_owned(), Keep::Nothing),
            ]
            .into(),
        };
        let swept = c.sweep(&keyed, hours(31)).await.unwrap();
        assert_eq!((swept.threads, swept.notes), (1, 1), "{backend:?}");
        assert_eq!(c.history("", "t").await.unwrap().len(), 1, "the pool's");
        assert_eq!(c.history("pa", "t").await.unwrap().len(), 1);
        assert!(c.note(&me("pa"), "k").await.unwrap().is_some());
        assert!(c.history("pb", "t").await.unwrap().is_empty());
        assert!(c.note(&me("pb"), "k").await.unwrap().is_none());
    }
}

/// A turn's closing write goes to the thread it read or nowhere: a
/// thread deleted while the turn was answered stays deleted (the write
/// made it again, holding the turn), and one deleted and started again
/// meanwhile does not get the old turn. A thread that did not exist when
/// the turn opened is made.
#[tokio::test]
async fn a_thread_deleted_during_a_turn_stays_deleted() {
    let say = |s: &str| [json!({"role": "user", "content": s})];
    for backend in BOTH {
        let fx = Fx::new(backend).await;
        let c = &fx.convo;
        let fresh = c.thread("p", "t").await.unwrap();
        assert!(fresh.messages.is_empty());
        let kept = c
            .append_seen("p", "t", fresh.seen, &say("first"), hours(0))
            .await
            .unwrap();
        assert_eq!(kept, Appended::Kept, "{backend:?}: a new thread is made");

        let opened = c.thread("p", "t").await.unwrap();
        assert_eq!(opened.messages, say("first"));
        assert!(c.delete_thread("p", "t").await.unwrap());
        let late = c
            .append_seen("p", "t", opened.seen, &say("in flight"), hours(1))
            .await
            .unwrap();
        assert_eq!(late, Appended::Deleted, "{backend:?}");
        assert!(c.history("p", "t").await.unwrap().is_empty(), "{backend:?}");

        // Deleted and started again by another turn: the new thread is
        // not given the old one's turn.
        c.append("p", "t", &say("old"), hours(2)).await.unwrap();
        let opened = c.thread("p", "t").await.unwrap();
        assert!(c.delete_thread("p", "t").await.unwrap());
        c.append("p", "t", &say("new"), hours(3)).await.unwrap();
        let late = c
            .append_seen("p", "t", opened.seen, &say("old reply"), hours(4))
            .await
            .unwrap();
        assert_eq!(late, Appended::Deleted, "{backend:?}");
        assert_eq!(c.history("p", "t").await.unwrap(), say("new"));

        // The thread as read: its turns follow in order.
        let now = c.thread("p", "t").await.unwrap();
        let kept = c
            .append_seen("p", "t", now.seen, &say("more"), hours(5))
            .await
            .unwrap();
        assert_eq!(kept, Appended::Kept);
        assert_eq!(c.history("p", "t").await.unwrap().len(), 2);
    }
}

/// A store's threads and notes copied into another (`llmgw store copy`),
/// either way between the backends: the same turns in order, a note
/// found by its words (the full-text index follows on both) and by its
/// tag; a second copy into the same store is refused.
#[tokio::test]
async fn threads_and_notes_copy_between_backends() {
    use llmgw_convo::Search;
    for (from, to) in [(BOTH[0], BOTH[1]), (BOTH[1], BOTH[0])] {
        let (a, b) = (Fx::new(from).await, Fx::new(to).await);
        a.convo
            .append(
                "p",
                "t1",
                &[
                    json!({"role": "user", "content": "hi"}),
                    json!({"role": "assistant", "content": "hello"}),
                ],
                hours(0),
            )
            .await
            .unwrap();
        let me = crate::support::owner("p", "agent-1");
        a.convo
            .put_note(
                &me,
                "plan",
                "migrate the cluster on friday",
                &["ops".into()],
                hours(1),
            )
            .await
            .unwrap();
        let rows = a.convo.dump().await.unwrap();
        assert_eq!(rows.counts(), (1, 1));
        b.convo.load(&rows).await.unwrap();
        let turns: Vec<_> = b.convo.history("p", "t1").await.unwrap();
        assert_eq!(turns.len(), 2, "{from:?} to {to:?}");
        assert_eq!(turns[1]["content"], "hello");
        let words = Search::Words(llmgw_convo::limits::query_words("friday").unwrap());
        let found = b.convo.search(&me, &words, 10).await.unwrap();
        assert_eq!(found.len(), 1, "{from:?} to {to:?}");
        assert_eq!(found[0].tags, ["ops"]);
        let tagged = b
            .convo
            .search(&me, &Search::Tag("ops".into()), 10)
            .await
            .unwrap();
        assert_eq!(tagged.len(), 1);
        assert!(
            b.convo.load(&rows).await.is_err(),
            "a store that holds threads"
        );
    }
}
