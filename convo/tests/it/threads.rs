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
