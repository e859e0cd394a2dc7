use llmgw_convo::{ConvoError, Keep, Put, Retention, Search};

use crate::support::{BOTH, Backend, Fx, hours, owner, t0};

fn tags(t: &[&str]) -> Vec<String> {
    t.iter().map(|s| s.to_string()).collect()
}

fn words(q: &str) -> Search {
    Search::Words(llmgw_convo::limits::query_words(q).unwrap())
}

/// The same notes on both backends.
const NOTES: &[(&str, &str, &[&str])] = &[
    (
        "deploy-plan",
        "Roll the GPU nodes one rack at a time",
        &["ops"],
    ),
    (
        "runbook",
        "When a node is lost, drain it and file a ticket",
        &["ops", "oncall"],
    ),
    ("lunch", "The canteen serves curry on Thursdays", &[]),
    (
        "gpu-prices",
        "H100 nodes cost more than A100 nodes per hour",
        &["finance"],
    ),
    (
        "Mixed_Case",
        "Rolling restarts: NODES first, then the gateway",
        &["ops"],
    ),
    // What PostgreSQL's parser kept whole, or with its accents.
    (
        "contacts",
        "see example.com and v1.2.3, mail ops@acme.io, pi 3.14, /usr/local/bin, Café NAÏVE",
        &[],
    ),
];

/// Searches that find the `contacts` note only once its words are split
/// at punctuation and its accents folded, as SQLite's tokenizer does.
const SPLIT: [&str; 8] = [
    "example",
    "example.com",
    "acme",
    "v1",
    "14",
    "local bin",
    "cafe",
    "café naive",
];

async fn keys_found(fx: &Fx, s: &Search) -> Vec<String> {
    fx.convo
        .search(&owner("p", "a"), s, 50)
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.key)
        .collect()
}

#[tokio::test]
async fn full_text_search_finds_the_same_notes_on_both_backends() {
    let queries = [
        "node",
        "nodes",
        "NODES gpu",
        "roll",
        "rolling",
        "drain ticket",
        "curry",
        "deploy",
        "mixed case",
        "a100",
        "absent",
    ];
    let queries = queries.iter().chain(&SPLIT);
    let mut per_backend = Vec::new();
    for backend in BOTH {
        let fx = Fx::new(backend).await;
        for (i, (key, text, t)) in NOTES.iter().enumerate() {
            fx.convo
                .put_note(&owner("p", "a"), key, text, &tags(t), hours(i as i64))
                .await
                .unwrap();
        }
        // Another agent's and another project's notes are never found.
        fx.convo
            .put_note(&owner("p", "b"), "other", "nodes nodes", &[], hours(9))
            .await
            .unwrap();
        fx.convo
            .put_note(&owner("q", "a"), "other", "nodes nodes", &[], hours(9))
            .await
            .unwrap();
        let mut found = Vec::new();
        for q in queries.clone() {
            found.push((*q, keys_found(&fx, &words(q)).await));
        }
        found.push(("#ops", keys_found(&fx, &Search::Tag("ops".into())).await));
        per_backend.push(found);
    }
    let (lite, pg) = (&per_backend[0], &per_backend[1]);
    assert_eq!(lite, pg, "SQLite and PostgreSQL find the same notes");
    let get = |q: &str| &lite.iter().find(|(k, _)| *k == q).unwrap().1;
    // No stemming: "node" is not "nodes"; every word must match; newest first.
    assert_eq!(get("node"), &["runbook"]);
    assert_eq!(get("nodes"), &["Mixed_Case", "gpu-prices", "deploy-plan"]);
    assert_eq!(get("NODES gpu"), &["gpu-prices", "deploy-plan"]);
    assert_eq!(get("roll"), &["deploy-plan"]);
    assert_eq!(get("mixed case"), &["Mixed_Case"]);
    assert_eq!(get("absent"), &[] as &[String]);
    for q in SPLIT {
        assert_eq!(get(q), &["contacts"], "{q}");
    }
    assert_eq!(get("#ops"), &["Mixed_Case", "runbook", "deploy-plan"]);
}

#[tokio::test]
async fn a_replaced_note_is_searched_by_its_new_text_and_a_deleted_one_not_at_all() {
    for backend in BOTH {
        let fx = Fx::new(backend).await;
        let me = owner("p", "a");
        let put = |text: &'static str, h| {
            let (convo, me) = (fx.convo.clone(), me.clone());
            async move { convo.put_note(&me, "k", text, &[], hours(h)).await.unwrap() }
        };
        assert_eq!(put("alpha", 0).await, Put::Created);
        assert_eq!(put("beta", 1).await, Put::Replaced);
        assert_eq!(keys_found(&fx, &words("alpha")).await, [] as [String; 0]);
        assert_eq!(keys_found(&fx, &words("beta")).await, ["k"]);
        let note = fx.convo.note(&me, "k").await.unwrap().unwrap();
        assert_eq!(
            (note.text.as_str(), note.created_at),
            ("beta", t0().timestamp_micros())
        );
        assert!(fx.convo.delete_note(&me, "k").await.unwrap());
        assert!(!fx.convo.delete_note(&me, "k").await.unwrap());
        assert_eq!(keys_found(&fx, &words("beta")).await, [] as [String; 0]);
        // Another project's key reads exactly like a missing one.
        fx.convo
            .put_note(&me, "mine", "x", &[], t0())
            .await
            .unwrap();
        assert_eq!(fx.convo.note(&owner("q", "a"), "mine").await.unwrap(), None);
        assert!(
            !fx.convo
                .delete_note(&owner("q", "a"), "mine")
                .await
                .unwrap()
        );
        assert!(
            fx.convo.note(&me, "mine").await.unwrap().is_some(),
            "{backend:?}"
        );
    }
}

#[tokio::test]
async fn an_agent_keeps_at_most_a_thousand_notes() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let fx = Fx::new(backend).await;
        let me = owner("p", "a");
        for i in 0..1000 {
            fx.convo
                .put_note(&me, &format!("n{i}"), "x", &[], t0())
                .await
                .unwrap();
        }
        let full = fx.convo.put_note(&me, "one-more", "x", &[], t0()).await;
        match full {
            Err(e @ ConvoError::TooManyNotes { .. }) => {
                assert!(e.to_string().contains("1000 notes"), "{e}")
            }
            other => panic!("{backend:?}: {other:?}"),
        }
        // Replacing one is still fine, and so is another agent's first.
        fx.convo.put_note(&me, "n5", "y", &[], t0()).await.unwrap();
        fx.convo
            .put_note(&owner("p", "b"), "n0", "y", &[], t0())
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn the_sweep_deletes_notes_past_retention_and_those_of_projects_switched_off() {
    for backend in BOTH {
        let fx = Fx::new(backend).await;
        fx.convo
            .put_note(&owner("p", "a"), "old", "x", &[], hours(0))
            .await
            .unwrap();
        fx.convo
            .put_note(&owner("p", "a"), "new", "x", &[], hours(20))
            .await
            .unwrap();
        fx.convo
            .put_note(&owner("off", "a"), "k", "x", &[], hours(20))
            .await
            .unwrap();
        let keep = Retention {
            notes: [
                ("p".to_owned(), Keep::Hours(10)),
                ("off".to_owned(), Keep::Nothing),
            ]
            .into(),
            ..Retention::default()
        };
        let swept = fx.convo.sweep(&keep, hours(21)).await.unwrap();
        assert_eq!(swept.notes, 2, "{backend:?}");
        assert!(
            fx.convo
                .note(&owner("p", "a"), "old")
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            fx.convo
                .note(&owner("p", "a"), "new")
                .await
                .unwrap()
                .is_some()
        );
        assert!(
            fx.convo
                .note(&owner("off", "a"), "k")
                .await
                .unwrap()
                .is_none()
        );
        // The index forgot them too.
        assert_eq!(
            fx.convo
                .search(&owner("p", "a"), &words("x"), 10)
                .await
                .unwrap()
                .len(),
            1
        );
    }
}
