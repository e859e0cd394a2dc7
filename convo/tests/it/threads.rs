use llmgw_convo::Retention;
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
            threads: [("p".to_owned(), 24)].into(),
            ..Retention::default()
        };
        let swept = c.sweep(&keep, hours(31)).await.unwrap();
        assert_eq!(swept.threads, 2, "{backend:?}");
        assert!(c.history("p", "old").await.unwrap().is_empty());
        assert_eq!(c.history("p", "busy").await.unwrap().len(), 2);
        assert!(c.history("off", "t").await.unwrap().is_empty());
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
