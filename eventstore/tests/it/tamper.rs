//! Altering a stored event behind the store's back (a superuser disabling
//! the immutability trigger) is found by `verify`, which names the position.

use llmgw_eventstore::{EventStore, ExpectedVersion, Writer};

use crate::support::{Backend, TestStore, both_backends, event, stream};

both_backends!(
    verify_names_the_first_altered_position,
    the_background_watch_verifies_new_events_and_counts_a_break,
);

async fn verify_names_the_first_altered_position(b: Backend) {
    let t = TestStore::new(b).await;
    let w = Writer::Leader(
        t.store
            .acquire_lease("ctl", std::time::Duration::from_secs(30))
            .await
            .unwrap()
            .token,
    );
    for batch in [0..3u64, 3..4, 4..10] {
        let events = batch.map(|n| event("E", n)).collect();
        t.store
            .append(&w, &[stream("s", ExpectedVersion::Any, events)])
            .await
            .unwrap();
    }
    let clean = t.store.verify(1, None).await.unwrap();
    assert!(clean.is_ok(), "{clean:?}");
    assert_eq!((clean.checked, clean.head_matches), (10, Some(true)));

    let (payload, epoch) = match b {
        Backend::Postgres => (
            "ALTER TABLE es_events DISABLE TRIGGER es_events_immutable;
             UPDATE es_events SET payload = jsonb_set(payload, '{n}', '666') WHERE position = 4;
             ALTER TABLE es_events ENABLE TRIGGER es_events_immutable;",
            "ALTER TABLE es_events DISABLE TRIGGER es_events_immutable;
             UPDATE es_events SET epoch = 0 WHERE position = 8;
             ALTER TABLE es_events ENABLE TRIGGER es_events_immutable;",
        ),
        Backend::Sqlite => (
            "DROP TRIGGER es_events_no_update;
             UPDATE es_events SET payload = json_set(payload, '$.n', 666) WHERE position = 4;",
            "UPDATE es_events SET epoch = 0 WHERE position = 8;",
        ),
    };
    t.raw(payload).await.expect("tamper with the payload");
    let report = t.store.verify(1, None).await.unwrap();
    assert_eq!(report.first_mismatch, Some(4), "{report:?}");
    assert!(!report.is_ok());
    assert_eq!(
        t.store.event_at(4).await.unwrap().unwrap().payload["n"],
        666
    );

    // Ranges that stop before, or start after, the damage are clean.
    assert!(t.store.verify(1, Some(3)).await.unwrap().is_ok());
    assert!(t.store.verify(5, None).await.unwrap().is_ok());

    t.raw(epoch).await.expect("tamper with the epoch");
    let edited = t.store.verify(5, None).await.unwrap();
    assert_eq!(
        (edited.first_mismatch, edited.missing, edited.checked),
        (Some(8), false, 3),
        "positions 5 to 7 verify before it"
    );

    // A row deleted: named as missing, not as an event that does not
    // match its hash, with what verified before it.
    let delete = match b {
        Backend::Postgres => {
            "ALTER TABLE es_events DISABLE TRIGGER es_events_immutable;
             DELETE FROM es_events WHERE position = 6;
             ALTER TABLE es_events ENABLE TRIGGER es_events_immutable;"
        }
        Backend::Sqlite => {
            "DROP TRIGGER es_events_no_delete;
             DELETE FROM es_events WHERE position = 6;"
        }
    };
    t.raw(delete).await.expect("delete a row");
    let gap = t.store.verify(5, None).await.unwrap();
    assert_eq!(
        (gap.first_mismatch, gap.missing, gap.checked),
        (Some(6), true, 1),
        "{gap:?}"
    );
    // A range that starts just after it names it too, not its own first.
    let after = t.store.verify(7, Some(7)).await.unwrap();
    assert_eq!(
        (after.first_mismatch, after.missing),
        (Some(6), true),
        "{after:?}"
    );
}

/// The watch checks only what is new on each pass, and a break found is
/// counted on every pass while the verified position stays before it.
async fn the_background_watch_verifies_new_events_and_counts_a_break(b: Backend) {
    let t = TestStore::new(b).await;
    let w = Writer::Leader(
        t.store
            .acquire_lease("ctl", std::time::Duration::from_secs(30))
            .await
            .unwrap()
            .token,
    );
    let append = |from: u64, to: u64| {
        let events = (from..to).map(|n| event("E", n)).collect();
        let (store, w) = (t.store.clone(), w.clone());
        async move {
            store
                .append(&w, &[stream("s", ExpectedVersion::Any, events)])
                .await
                .unwrap();
        }
    };
    let watch = llmgw_eventstore::ChainWatch::new();
    assert_eq!(watch.check(&t.store).await.unwrap().checked, 0);
    append(0, 4).await;
    let first = watch.check(&t.store).await.unwrap();
    assert_eq!((first.from, first.checked, watch.verified()), (1, 4, 4));
    append(4, 7).await;
    let second = watch.check(&t.store).await.unwrap();
    assert_eq!((second.from, second.checked, watch.verified()), (5, 3, 7));
    assert_eq!(watch.failures(), 0);

    append(7, 10).await;
    let tamper = match b {
        Backend::Postgres => {
            "ALTER TABLE es_events DISABLE TRIGGER es_events_immutable;
             UPDATE es_events SET payload = jsonb_set(payload, '{n}', '666') WHERE position = 9;
             ALTER TABLE es_events ENABLE TRIGGER es_events_immutable;"
        }
        Backend::Sqlite => {
            "DROP TRIGGER es_events_no_update;
             UPDATE es_events SET payload = json_set(payload, '$.n', 666) WHERE position = 9;"
        }
    };
    t.raw(tamper).await.expect("tamper with the payload");
    for pass in 1..=2 {
        let r = watch.check(&t.store).await.unwrap();
        assert_eq!(r.first_mismatch, Some(9), "{r:?}");
        assert_eq!((watch.verified(), watch.failures()), (8, pass));
    }
}
