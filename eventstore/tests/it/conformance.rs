use std::time::Duration;

use chrono::{DateTime, Utc};
use llmgw_eventstore::{
    AnyStore, Checkpoint, EventStore, ExpectedVersion, NewEvent, OpenOptions, StoreError,
    Upcasters, Writer,
};
use serde_json::{Value, json};

use crate::support::{Backend, Scratch, TestStore, all_events, both_backends, event, stream};

both_backends!(
    appends_get_dense_positions_and_stream_versions,
    a_version_conflict_names_the_stream_and_writes_nothing,
    retries_with_the_same_ids_return_the_original_positions,
    malformed_batches_are_refused_before_anything_is_written,
    the_lease_hands_over_with_a_growing_epoch,
    a_lease_under_ones_name_is_taken_back_only_at_ones_own_epoch,
    an_expired_lease_refuses_appends,
    observers_append_whoever_holds_the_lease,
    stored_events_cannot_be_changed,
    time_range_reads_match_recorded_times,
    checkpoints_detect_a_projection_ahead_of_the_log,
    old_schema_versions_are_upcast_on_read,
    stats_count_events_per_type,
    migrations_are_idempotent_and_required,
    snapshots_are_saved_and_replaced,
    the_upgrade_to_compressed_snapshots_drops_the_old_ones_and_keeps_the_log,
    a_page_reader_reads_everything_in_order_with_read_ahead,
    a_decoding_reader_reads_every_payload_as_text_in_order,
    a_batch_larger_than_one_statement_is_written_whole,
);

const TTL: Duration = Duration::from_secs(30);

async fn leader(store: &AnyStore, holder: &str) -> Writer {
    Writer::Leader(store.acquire_lease(holder, TTL).await.expect("lease").token)
}

async fn appends_get_dense_positions_and_stream_versions(b: Backend) {
    let t = TestStore::new(b).await;
    let w = leader(&t.store, "ctl-1").await;
    let first = t
        .store
        .append(
            &w,
            &[
                stream(
                    "node-a",
                    ExpectedVersion::NoStream,
                    vec![event("NodeRegistered", 1)],
                ),
                stream(
                    "model-x",
                    ExpectedVersion::Any,
                    vec![event("ModelAdded", 2), event("ModelUpdated", 3)],
                ),
            ],
        )
        .await
        .unwrap();
    assert_eq!((first.first_position, first.last_position), (1, 3));
    assert_eq!(
        first.stream_versions,
        vec![("node-a".into(), 1), ("model-x".into(), 2)]
    );
    let second = t
        .store
        .append(
            &w,
            &[stream(
                "model-x",
                ExpectedVersion::Exact(2),
                vec![event("ModelRemoved", 4)],
            )],
        )
        .await
        .unwrap();
    assert_eq!((second.first_position, second.last_position), (4, 4));

    let all = all_events(&t.store).await;
    assert_eq!(
        all.iter().map(|e| e.position).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    assert_eq!(all[3].payload["n"], json!(4));
    assert_eq!(all[3].payload["note"], json!("ünïcode ✓"));
    let model = t.store.read_stream("model-x", 0, 100).await.unwrap();
    assert_eq!(
        model
            .iter()
            .map(|e| (e.stream_version, e.event_type.as_str()))
            .collect::<Vec<_>>(),
        vec![(1, "ModelAdded"), (2, "ModelUpdated"), (3, "ModelRemoved")]
    );
    assert_eq!(
        t.store.read_stream("model-x", 2, 100).await.unwrap().len(),
        1
    );
    assert_eq!(t.store.head().await.unwrap().0, 4);
    let e = t.store.event_at(2).await.unwrap().expect("event 2");
    assert_eq!(e.event_type, "ModelAdded");
    assert!(t.store.event_at(5).await.unwrap().is_none());
}

async fn a_version_conflict_names_the_stream_and_writes_nothing(b: Backend) {
    let t = TestStore::new(b).await;
    let w = leader(&t.store, "ctl-1").await;
    t.store
        .append(
            &w,
            &[stream(
                "node-a",
                ExpectedVersion::NoStream,
                vec![event("NodeRegistered", 1)],
            )],
        )
        .await
        .unwrap();
    for expected in [
        ExpectedVersion::NoStream,
        ExpectedVersion::Exact(0),
        ExpectedVersion::Exact(7),
    ] {
        let err = t
            .store
            .append(
                &w,
                &[
                    stream(
                        "node-b",
                        ExpectedVersion::Any,
                        vec![event("NodeRegistered", 2)],
                    ),
                    stream("node-a", expected, vec![event("NodeCordoned", 3)]),
                ],
            )
            .await
            .unwrap_err();
        match err {
            StoreError::VersionConflict {
                stream,
                expected: e,
                actual,
            } => {
                assert_eq!((stream.as_str(), e, actual), ("node-a", expected, 1));
            }
            other => panic!("expected a conflict, got {other}"),
        }
    }
    // The other stream of the refused batch was not written either.
    assert_eq!(t.store.head().await.unwrap().0, 1);
    assert!(
        t.store
            .read_stream("node-b", 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let msg = StoreError::VersionConflict {
        stream: "node-a".into(),
        expected: ExpectedVersion::Exact(7),
        actual: 1,
    }
    .to_string();
    assert_eq!(
        msg,
        "stream node-a: expected version 7, but its version is 1"
    );
}

async fn retries_with_the_same_ids_return_the_original_positions(b: Backend) {
    let t = TestStore::new(b).await;
    let w = leader(&t.store, "ctl-1").await;
    t.store
        .append(
            &w,
            &[stream("a", ExpectedVersion::Any, vec![event("E", 0)])],
        )
        .await
        .unwrap();
    let batch = [
        stream(
            "b",
            ExpectedVersion::NoStream,
            vec![event("E", 1), event("E", 2)],
        ),
        stream("c", ExpectedVersion::NoStream, vec![event("E", 3)]),
    ];
    let first = t.store.append(&w, &batch).await.unwrap();
    assert!(!first.deduplicated);
    // The same batch again, even though its expected versions no longer hold.
    let again = t.store.append(&w, &batch).await.unwrap();
    assert!(again.deduplicated);
    assert_eq!((again.first_position, again.last_position), (2, 4));
    assert_eq!(again.stream_versions, first.stream_versions);
    assert_eq!(t.store.head().await.unwrap().0, 4);

    // A batch that reuses only some ids is refused whole.
    let mixed = [stream(
        "d",
        ExpectedVersion::Any,
        vec![event("E", 9), batch[0].events[0].clone()],
    )];
    let err = t.store.append(&w, &mixed).await.unwrap_err();
    assert!(
        matches!(err, StoreError::DuplicateEventId { event_id } if event_id == batch[0].events[0].event_id),
        "{err}"
    );
    assert_eq!(t.store.head().await.unwrap().0, 4);

    // A retry still succeeds after the writer lost the lease: it committed.
    let LeaseHolder(token) = LeaseHolder::from(&w);
    t.store.release_lease(&token).await.unwrap();
    let after_release = t.store.append(&w, &batch).await.unwrap();
    assert_eq!(
        (after_release.first_position, after_release.last_position),
        (2, 4)
    );
}

struct LeaseHolder(llmgw_eventstore::LeaseToken);
impl From<&Writer> for LeaseHolder {
    fn from(w: &Writer) -> Self {
        match w {
            Writer::Leader(t) => LeaseHolder(t.clone()),
            Writer::Observer { .. } => panic!("not a leader"),
        }
    }
}

async fn malformed_batches_are_refused_before_anything_is_written(b: Backend) {
    let t = TestStore::new(b).await;
    let w = leader(&t.store, "ctl-1").await;
    let dup = event("E", 1);
    let cases = vec![
        vec![],
        vec![stream("", ExpectedVersion::Any, vec![event("E", 1)])],
        vec![stream("a", ExpectedVersion::Any, vec![])],
        vec![
            stream("a", ExpectedVersion::Any, vec![event("E", 1)]),
            stream("a", ExpectedVersion::Any, vec![event("E", 2)]),
        ],
        vec![stream("a", ExpectedVersion::Any, vec![dup.clone(), dup])],
        vec![stream(
            "a",
            ExpectedVersion::Any,
            vec![NewEvent::new("", 1, json!({}))],
        )],
        vec![stream(
            "a",
            ExpectedVersion::Any,
            vec![NewEvent::new("E", 0, json!({}))],
        )],
        vec![stream(
            "a",
            ExpectedVersion::Any,
            vec![NewEvent::new("E", 1, json!({"s": "nul\u{0}"}))],
        )],
        vec![stream(
            "a",
            ExpectedVersion::Any,
            vec![NewEvent::new("E", 1, json!({})).with_metadata(json!([1]))],
        )],
    ];
    for batch in cases {
        let err = t.store.append(&w, &batch).await.unwrap_err();
        assert!(matches!(err, StoreError::Invalid(_)), "{batch:?}: {err}");
    }
    assert_eq!(t.store.head().await.unwrap().0, 0);
}

async fn the_lease_hands_over_with_a_growing_epoch(b: Backend) {
    let t = TestStore::new(b).await;
    let info = t.store.lease_info().await.unwrap();
    assert_eq!(
        (info.holder, info.epoch, info.held, info.expires_at),
        (None, 0, false, None)
    );

    let a = t.store.acquire_lease("ctl-a", TTL).await.unwrap();
    assert_eq!(a.token.epoch, 1);
    match t.store.acquire_lease("ctl-b", TTL).await.unwrap_err() {
        StoreError::LeaseHeld { holder, epoch, .. } => {
            assert_eq!((holder.as_str(), epoch), ("ctl-a", 1))
        }
        other => panic!("expected LeaseHeld, got {other}"),
    }
    let renewed = t.store.renew_lease(&a.token, TTL).await.unwrap();
    assert_eq!(renewed.token, a.token);
    assert!(renewed.expires_at >= a.expires_at);
    t.store
        .append(
            &Writer::Leader(a.token.clone()),
            &[stream("s", ExpectedVersion::Any, vec![event("E", 1)])],
        )
        .await
        .unwrap();

    // Stepping down lets the successor in at once, under a new epoch.
    assert!(t.store.release_lease(&a.token).await.unwrap());
    assert!(!t.store.lease_info().await.unwrap().held);
    let b_lease = t.store.acquire_lease("ctl-b", TTL).await.unwrap();
    assert_eq!(b_lease.token.epoch, 2);
    assert_eq!(b_lease.head_at_grant, 1);
    let info = t.store.lease_info().await.unwrap();
    assert_eq!(
        (info.holder.as_deref(), info.epoch, info.held),
        (Some("ctl-b"), 2, true)
    );

    // The deposed holder can neither append, renew nor release.
    let err = t
        .store
        .append(
            &Writer::Leader(a.token.clone()),
            &[stream("s", ExpectedVersion::Any, vec![event("E", 2)])],
        )
        .await
        .unwrap_err();
    match err {
        StoreError::Fenced {
            current_holder,
            current_epoch,
        } => assert_eq!(
            (current_holder.as_deref(), current_epoch),
            (Some("ctl-b"), 2)
        ),
        other => panic!("expected Fenced, got {other}"),
    }
    assert!(matches!(
        t.store.renew_lease(&a.token, TTL).await,
        Err(StoreError::Fenced { .. })
    ));
    assert!(!t.store.release_lease(&a.token).await.unwrap());
    assert_eq!(t.store.head().await.unwrap().0, 1);

    // The same holder acquiring again (a restart) also moves the epoch on,
    // which fences its own previous incarnation.
    let b_again = t.store.acquire_lease("ctl-b", TTL).await.unwrap();
    assert_eq!(b_again.token.epoch, 3);
    let stale = Writer::Leader(b_lease.token);
    let err = t
        .store
        .append(
            &stale,
            &[stream("s", ExpectedVersion::Any, vec![event("E", 3)])],
        )
        .await;
    assert!(matches!(err, Err(StoreError::Fenced { .. })));
}

async fn an_expired_lease_refuses_appends(b: Backend) {
    let t = TestStore::new(b).await;
    let short = t
        .store
        .acquire_lease("ctl-a", Duration::from_millis(1))
        .await
        .unwrap();
    // Synchronise on the store's own view of the lease, not on a sleep.
    while t.store.lease_info().await.unwrap().held {
        tokio::task::yield_now().await;
    }
    let err = t
        .store
        .append(
            &Writer::Leader(short.token.clone()),
            &[stream("s", ExpectedVersion::Any, vec![event("E", 1)])],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    assert!(matches!(
        t.store.renew_lease(&short.token, TTL).await,
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(t.store.head().await.unwrap().0, 0);
    // Anyone may take an expired lease.
    let next = t.store.acquire_lease("ctl-b", TTL).await.unwrap();
    assert_eq!(next.token.epoch, 2);
}

async fn observers_append_whoever_holds_the_lease(b: Backend) {
    let t = TestStore::new(b).await;
    let observer = Writer::Observer {
        instance: "gw-2".into(),
    };
    t.store
        .append(
            &observer,
            &[stream(
                "usage-k1",
                ExpectedVersion::Any,
                vec![event("UsageRecorded", 1)],
            )],
        )
        .await
        .unwrap();
    let lease = t.store.acquire_lease("ctl-a", TTL).await.unwrap();
    t.store
        .append(
            &observer,
            &[stream(
                "usage-k1",
                ExpectedVersion::Any,
                vec![event("UsageRecorded", 2)],
            )],
        )
        .await
        .unwrap();
    let all = all_events(&t.store).await;
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].metadata["writer"], json!("gw-2"));
    assert_eq!((all[0].epoch, all[1].epoch), (0, lease.token.epoch));
    assert!(t.store.verify(1, None).await.unwrap().is_ok());
}

async fn stored_events_cannot_be_changed(b: Backend) {
    let t = TestStore::new(b).await;
    let w = leader(&t.store, "ctl-1").await;
    t.store
        .append(
            &w,
            &[stream("s", ExpectedVersion::Any, vec![event("E", 1)])],
        )
        .await
        .unwrap();
    let mut attempts = vec![
        "UPDATE es_events SET event_type = 'Forged'",
        "DELETE FROM es_events",
        "UPDATE es_control SET last_position = 0",
        "DELETE FROM es_control",
    ];
    if b == Backend::Postgres {
        attempts.push("TRUNCATE es_events");
        attempts.push("TRUNCATE es_control");
    }
    for sql in attempts {
        let err = t.raw(sql).await.expect_err(sql);
        let msg = err.to_string();
        assert!(
            msg.contains("append-only") || msg.contains("only moves forward"),
            "{sql}: {msg}"
        );
    }
    let all = all_events(&t.store).await;
    assert_eq!((all.len(), all[0].event_type.as_str()), (1, "E"));
}

async fn time_range_reads_match_recorded_times(b: Backend) {
    let t = TestStore::new(b).await;
    let w = leader(&t.store, "ctl-1").await;
    for i in 0..4 {
        t.store
            .append(
                &w,
                &[stream(
                    "s",
                    ExpectedVersion::Any,
                    vec![event("E", 2 * i), event("E", 2 * i + 1)],
                )],
            )
            .await
            .unwrap();
    }
    let all = all_events(&t.store).await;
    let times: Vec<DateTime<Utc>> = all.iter().map(|e| e.recorded_at).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "recorded times follow positions"
    );
    let far = Utc::now() + chrono::Duration::days(1);
    for (from, to) in [
        (times[0], far),
        (times[2], times[5]),
        (times[7], far),
        (far, far),
    ] {
        let got: Vec<u64> = t
            .store
            .read_time_range(from, to, 0, 100)
            .await
            .unwrap()
            .iter()
            .map(|e| e.position)
            .collect();
        let want: Vec<u64> = all
            .iter()
            .filter(|e| e.recorded_at >= from && e.recorded_at < to)
            .map(|e| e.position)
            .collect();
        assert_eq!(got, want, "range {from} .. {to}");
    }
    // Paging by position within a range.
    let page = t.store.read_time_range(times[0], far, 3, 2).await.unwrap();
    assert_eq!(
        page.iter().map(|e| e.position).collect::<Vec<_>>(),
        vec![4, 5]
    );
}

async fn checkpoints_detect_a_projection_ahead_of_the_log(b: Backend) {
    let t = TestStore::new(b).await;
    let w = leader(&t.store, "ctl-1").await;
    t.store
        .append(
            &w,
            &[stream(
                "s",
                ExpectedVersion::Any,
                vec![event("E", 1), event("E", 2)],
            )],
        )
        .await
        .unwrap();
    assert_eq!(
        t.store.resume_checkpoint("router").await.unwrap(),
        Checkpoint::START
    );
    let second = t.store.event_at(2).await.unwrap().unwrap();
    t.store
        .save_checkpoint("router", &Checkpoint::after(&second))
        .await
        .unwrap();
    assert_eq!(
        t.store.load_checkpoint("router").await.unwrap(),
        Some(Checkpoint::after(&second))
    );
    assert_eq!(
        t.store.resume_checkpoint("router").await.unwrap().position,
        2
    );

    // A checkpoint from a log that did not survive: past the head, or naming
    // a different event at its position.
    t.store
        .save_checkpoint(
            "cluster",
            &Checkpoint {
                position: 9,
                event_id: Some(uuid::Uuid::new_v4()),
            },
        )
        .await
        .unwrap();
    t.store
        .save_checkpoint(
            "usage",
            &Checkpoint {
                position: 2,
                event_id: Some(uuid::Uuid::new_v4()),
            },
        )
        .await
        .unwrap();
    for name in ["cluster", "usage"] {
        let err = t.store.resume_checkpoint(name).await.unwrap_err();
        assert!(
            matches!(err, StoreError::CheckpointAhead { .. }),
            "{name}: {err}"
        );
    }
}

fn add_labels(mut v: Value) -> Result<Value, String> {
    let obj = v.as_object_mut().ok_or("payload is not an object")?;
    obj.insert("labels".into(), json!({}));
    Ok(v)
}

async fn old_schema_versions_are_upcast_on_read(b: Backend) {
    let upcasters =
        Upcasters::new()
            .current("NodeRegistered", 2)
            .step("NodeRegistered", 1, add_labels);
    let t = TestStore::with_options(
        b,
        OpenOptions {
            upcasters,
            ..OpenOptions::migrating()
        },
    )
    .await;
    let w = leader(&t.store, "ctl-1").await;
    t.store
        .append(
            &w,
            &[stream(
                "node-a",
                ExpectedVersion::Any,
                vec![
                    NewEvent::new("NodeRegistered", 1, json!({"name": "a"})),
                    NewEvent::new(
                        "NodeRegistered",
                        2,
                        json!({"name": "a", "labels": {"zone": "z1"}}),
                    ),
                ],
            )],
        )
        .await
        .unwrap();
    let read = t.store.read_all(0, 10).await.unwrap();
    assert_eq!(read[0].schema_version, 2);
    assert_eq!(read[0].payload, json!({"name": "a", "labels": {}}));
    assert_eq!(read[1].payload["labels"]["zone"], json!("z1"));
    // Read as text, the same: upcast, and the current one as written.
    let text = t.store.read_all_text(0, 10).await.unwrap();
    assert_eq!(text[0].schema_version, 2);
    let payload =
        |e: &llmgw_eventstore::EventText| -> Value { serde_json::from_str(&e.payload).unwrap() };
    assert_eq!(payload(&text[0]), json!({"name": "a", "labels": {}}));
    assert_eq!(payload(&text[1]), read[1].payload);
    // What was written stays as written, and the chain still verifies.
    let raw = t.store.read_all_raw(0, 10).await.unwrap();
    assert_eq!(
        (raw[0].schema_version, &raw[0].payload),
        (1, &json!({"name": "a"}))
    );
    assert!(t.store.verify(1, None).await.unwrap().is_ok());
}

async fn stats_count_events_per_type(b: Backend) {
    let t = TestStore::new(b).await;
    let w = leader(&t.store, "ctl-1").await;
    t.store
        .append(
            &w,
            &[
                stream(
                    "a",
                    ExpectedVersion::Any,
                    vec![event("NodeRegistered", 1), event("NodeCordoned", 2)],
                ),
                stream("b", ExpectedVersion::Any, vec![event("NodeRegistered", 3)]),
            ],
        )
        .await
        .unwrap();
    let stats = t.store.stats().await.unwrap();
    assert_eq!((stats.count, stats.head, stats.streams), (3, 3, 2));
    assert_eq!(
        stats.by_type,
        vec![("NodeRegistered".into(), 2), ("NodeCordoned".into(), 1)]
    );
}

async fn migrations_are_idempotent_and_required(b: Backend) {
    let t = TestStore::new(b).await;
    assert_eq!(t.store.migrate().await.unwrap(), Vec::<i64>::new());
    // A database without the schema is refused, with a pointer to the fix.
    let (address, _guard) = Scratch::new(b).await;
    let address = llmgw_eventstore::StoreAddress::parse(&address).unwrap();
    let options = OpenOptions {
        create: true,
        ..OpenOptions::default()
    };
    let err = AnyStore::open(&address, options).await.unwrap_err();
    assert!(matches!(err, StoreError::NotMigrated { .. }), "{err}");
    assert!(err.to_string().contains("llmgw store migrate"), "{err}");
}

async fn snapshots_are_saved_and_replaced(b: Backend) {
    let t = TestStore::new(b).await;
    assert_eq!(t.store.load_snapshot("router").await.unwrap(), None);
    let id = uuid::Uuid::new_v4();
    let first = llmgw_eventstore::Snapshot {
        checkpoint: Checkpoint {
            position: 7,
            event_id: Some(id),
        },
        state_version: 1,
        state: json!({"models": {"llama": {"aliases": ["l"]}}, "n": 1.5}).to_string(),
    };
    // Stored compressed, given back as the very text saved.
    t.store
        .save_snapshot("router", first.clone())
        .await
        .unwrap();
    let loaded = t.store.load_snapshot("router").await.unwrap().unwrap();
    assert_eq!(loaded, first);
    let second = llmgw_eventstore::Snapshot {
        state_version: 2,
        ..first
    };
    t.store
        .save_snapshot("router", second.clone())
        .await
        .unwrap();
    let loaded = t.store.load_snapshot("router").await.unwrap().unwrap();
    assert_eq!(loaded, second);
}

/// A store from before migration 6 (snapshots as JSON text) upgrades: its
/// snapshot, a cache, is gone, and every event is still there. The old
/// store is made from a current one by undoing migration 6 by hand.
async fn the_upgrade_to_compressed_snapshots_drops_the_old_ones_and_keeps_the_log(b: Backend) {
    let (t, _) = with_events(b, 3).await;
    let (migrations, old_snapshot) = match b {
        Backend::Sqlite => (
            llmgw_migrations::SQLITE,
            "INSERT INTO es_snapshots VALUES ('views', 3, NULL, 1, '{\"plain\": 1}', 0)",
        ),
        Backend::Postgres => (
            llmgw_migrations::POSTGRES,
            "INSERT INTO es_snapshots VALUES ('views', 3, NULL, 1, '{\"plain\": 1}', now())",
        ),
    };
    let old_table = migrations.iter().find(|m| m.name == "snapshots").unwrap();
    let undo = [
        "DELETE FROM es_schema_migrations WHERE version = 6",
        "DROP TABLE es_snapshots",
        old_table.sql,
        old_snapshot,
    ];
    match &t.address {
        llmgw_eventstore::StoreAddress::Postgres(url) => {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            for sql in undo {
                sqlx::raw_sql(sql).execute(&pool).await.unwrap();
            }
            // An operator's grant on the table, which the upgrade keeps.
            sqlx::raw_sql("GRANT SELECT ON es_snapshots TO PUBLIC")
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
        }
        llmgw_eventstore::StoreAddress::Sqlite(path) => {
            let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            for sql in undo {
                sqlx::raw_sql(sql).execute(&pool).await.unwrap();
            }
            pool.close().await;
        }
    }
    let upgraded = t.another(OpenOptions::migrating()).await;
    assert_eq!(upgraded.migrate().await.unwrap(), Vec::<i64>::new());
    assert_eq!(upgraded.load_snapshot("views").await.unwrap(), None);
    // The new table takes a snapshot (SQLite's STRICT TEXT column would
    // refuse the compressed bytes).
    let snapshot = llmgw_eventstore::Snapshot {
        checkpoint: Checkpoint {
            position: 3,
            event_id: None,
        },
        state_version: 1,
        state: r#"{"after": "upgrade"}"#.to_owned(),
    };
    upgraded
        .save_snapshot("views", snapshot.clone())
        .await
        .unwrap();
    assert_eq!(
        upgraded.load_snapshot("views").await.unwrap(),
        Some(snapshot)
    );
    let kept: Vec<u64> = all_events(&upgraded)
        .await
        .iter()
        .map(|e| e.position)
        .collect();
    assert_eq!(kept, [1, 2, 3]);
    if let AnyStore::Postgres(pg) = &upgraded {
        let acl: String =
            sqlx::query_scalar("SELECT relacl::text FROM pg_class WHERE relname = 'es_snapshots'")
                .fetch_one(pg.pool())
                .await
                .unwrap();
        assert!(acl.contains("=r/"), "PUBLIC's SELECT is kept: {acl}");
    }
}

/// A store holding `n` events on stream "s", at positions 1 to `n`, and
/// the writer that appended them.
async fn with_events(b: Backend, n: u64) -> (TestStore, Writer) {
    let t = TestStore::new(b).await;
    let w = leader(&t.store, "ctl-1").await;
    let events: Vec<NewEvent> = (0..n).map(|i| event("E", i)).collect();
    t.store
        .append(&w, &[stream("s", ExpectedVersion::Any, events)])
        .await
        .unwrap();
    (t, w)
}

async fn a_page_reader_reads_everything_in_order_with_read_ahead(b: Backend) {
    let (t, w) = with_events(b, 25).await;
    let mut reader = llmgw_eventstore::PageReader::new(t.store.clone(), 3, 10);
    let mut positions = Vec::new();
    loop {
        let page = reader.next_page().await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 10);
        positions.extend(page.iter().map(|e| e.position));
    }
    assert_eq!(positions, (4..=25).collect::<Vec<_>>());
    // Appends after the head are found by the next call.
    t.store
        .append(
            &w,
            &[stream("s", ExpectedVersion::Any, vec![event("E", 99)])],
        )
        .await
        .unwrap();
    assert_eq!(
        reader
            .next_page()
            .await
            .unwrap()
            .iter()
            .map(|e| e.position)
            .collect::<Vec<_>>(),
        vec![26]
    );
}

async fn a_decoding_reader_reads_every_payload_as_text_in_order(b: Backend) {
    let t = TestStore::new(b).await;
    let w = leader(&t.store, "ctl-1").await;
    let events: Vec<NewEvent> = (0..25).map(|i| event("E", i)).collect();
    t.store
        .append(
            &w,
            &[
                stream("s", ExpectedVersion::Any, events),
                stream("r", ExpectedVersion::Any, vec![event("F", 25)]),
            ],
        )
        .await
        .unwrap();
    let stored = t.store.read_all(3, 100).await.unwrap();
    // Each event as the decoder sees it: its place and its parsed payload.
    type Seen = (u64, String, u64, uuid::Uuid, String, u32, i64, Value);
    fn decode(e: llmgw_eventstore::EventRef<'_>) -> Seen {
        let payload = serde_json::from_str(e.payload).unwrap();
        (
            e.position,
            e.stream_id.to_owned(),
            e.stream_version,
            e.event_id,
            e.event_type.to_owned(),
            e.schema_version,
            e.recorded_at.timestamp_micros(),
            payload,
        )
    }
    let mut reader = llmgw_eventstore::DecodingReader::new(t.store.clone(), 3, 10, decode);
    let mut read = Vec::new();
    loop {
        let page = reader.next_page().await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 10);
        read.extend(page);
    }
    let expected: Vec<_> = stored
        .into_iter()
        .map(|e| {
            (
                e.position,
                e.stream_id,
                e.stream_version,
                e.event_id,
                e.event_type,
                e.schema_version,
                e.recorded_at.timestamp_micros(),
                e.payload,
            )
        })
        .collect();
    assert_eq!(read, expected);
    assert_eq!(read.last().map(|e| (e.0, e.1.as_str())), Some((26, "r")));
    let text = t.store.read_all_text(25, 1).await.unwrap();
    assert_eq!(text[0].event_type, "F");
    assert_eq!(text[0].schema_version, 1);
}

/// SQLite writes a group in statements of at most 1,024 rows: a batch of
/// 2,500 events over 1,100 streams (more of either than one statement
/// takes) still lands whole, dense, in order and with a sound chain.
async fn a_batch_larger_than_one_statement_is_written_whole(b: Backend) {
    let t = TestStore::new(b).await;
    let w = leader(&t.store, "ctl-1").await;
    let batch: Vec<_> = (0..1100u64)
        .map(|s| {
            let events = (0..if s < 300 { 3 } else { 2 })
                .map(|i| event("Big", s * 10 + i))
                .collect();
            stream(&format!("s-{s:04}"), ExpectedVersion::NoStream, events)
        })
        .collect();
    let done = t.store.append(&w, &batch).await.unwrap();
    assert_eq!((done.first_position, done.last_position), (1, 2500));
    assert_eq!(done.stream_versions.len(), 1100);
    assert_eq!(done.stream_versions[299], ("s-0299".into(), 3));
    assert_eq!(done.stream_versions[1099], ("s-1099".into(), 2));

    let all = all_events(&t.store).await;
    assert_eq!(all.len(), 2500);
    assert!(all.iter().zip(1..).all(|(e, p)| e.position == p));
    assert_eq!(all[2499].stream_id, "s-1099");
    assert_eq!(all[2499].payload["n"], json!(10991));
    assert_eq!(all[2499].payload["note"], json!("ünïcode ✓"));
    let s = t.store.read_stream("s-1099", 0, 10).await.unwrap();
    assert_eq!(
        s.iter().map(|e| e.stream_version).collect::<Vec<_>>(),
        [1, 2]
    );
    // Versions were stored: the next append to a stream follows them.
    let next = t
        .store
        .append(
            &w,
            &[stream(
                "s-0299",
                ExpectedVersion::Exact(3),
                vec![event("A", 1)],
            )],
        )
        .await
        .unwrap();
    assert_eq!(next.last_position, 2501);
    assert!(t.store.verify(1, None).await.unwrap().is_ok());
}

/// `take_lease`: a process takes back only the lease it was granted; the
/// same name at another epoch is another process's, until it runs out.
async fn a_lease_under_ones_name_is_taken_back_only_at_ones_own_epoch(b: Backend) {
    let t = TestStore::new(b).await;
    let first = t.store.take_lease("cp-1", TTL, None).await.unwrap();
    assert_eq!(first.token.epoch, 1);
    // A second process under the same name, holding none: refused.
    match t.store.take_lease("cp-1", TTL, None).await.unwrap_err() {
        StoreError::LeaseHeld { holder, epoch, .. } => {
            assert_eq!((holder.as_str(), epoch), ("cp-1", 1))
        }
        other => panic!("expected LeaseHeld, got {other}"),
    }
    // The first, whose renewal lapsed on the way, takes its own back.
    let again = t.store.take_lease("cp-1", TTL, Some(1)).await.unwrap();
    assert_eq!(again.token.epoch, 2);
    // Its old epoch no longer is its.
    assert!(matches!(
        t.store.take_lease("cp-1", TTL, Some(1)).await,
        Err(StoreError::LeaseHeld { .. })
    ));
    // Once released, anyone takes it.
    assert!(t.store.release_lease(&again.token).await.unwrap());
    assert_eq!(
        t.store
            .take_lease("cp-2", TTL, None)
            .await
            .unwrap()
            .token
            .epoch,
        3
    );
}

/// Another process holding SQLite's write lock past the wait is named as
/// such, not as "database is locked", and counts as worth a retry.
#[tokio::test]
async fn a_sqlite_file_another_process_keeps_locked_is_said_to_be() {
    use llmgw_eventstore::{EventStore, StoreError};
    let t = TestStore::new(Backend::Sqlite).await;
    let llmgw_eventstore::StoreAddress::Sqlite(path) = &t.address else {
        unreachable!("a SQLite store")
    };
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
    let mut other = <sqlx::SqliteConnection as sqlx::Connection>::connect_with(&options)
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let refused = t
        .store
        .acquire_lease("w", std::time::Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(matches!(refused, StoreError::Busy { .. }), "{refused:?}");
    assert!(
        refused.to_string().contains("locked by another process"),
        "{refused}"
    );
    assert!(refused.is_transient());
    sqlx::raw_sql("ROLLBACK").execute(&mut other).await.unwrap();
}

/// A new SQLite store, and the files SQLite keeps beside it, are readable
/// by their owner alone: they hold people's emails and password hashes
/// and the conversations kept.
#[cfg(unix)]
#[tokio::test]
async fn a_new_sqlite_store_is_its_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let t = TestStore::new(Backend::Sqlite).await;
    let llmgw_eventstore::StoreAddress::Sqlite(path) = &t.address else {
        unreachable!("a SQLite store")
    };
    t.store
        .acquire_lease("w", std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let wal = std::path::PathBuf::from(format!("{}-wal", path.display()));
    for file in [path.clone(), wal] {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }
}
