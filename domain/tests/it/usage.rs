use llmgw_domain::catalog::Price;
use llmgw_domain::event::DecodeError;
use llmgw_domain::tenancy::{Band, Period};
use llmgw_domain::usage::{
    FinishedRequest, UsageBatchRecorded, UsageEvent, UsageRecorded, period_start, record_batch, row,
};
use llmgw_domain::{Event, UnixMillis};

#[test]
fn prices_round_each_side_up() {
    let p = Price {
        prompt_per_1k: 1000,
        completion_per_1k: 3000,
    };
    for ((prompt, completion), want) in [
        ((1, 0), 1),
        ((1000, 1000), 4000),
        ((0, 0), 0),
        ((200, 200), 800),
    ] {
        assert_eq!(p.cost(prompt, completion), want, "{prompt}/{completion}");
    }
    assert!(Price::ZERO.is_zero() && !p.is_zero());
    assert_eq!(
        Price {
            prompt_per_1k: u64::MAX,
            completion_per_1k: 1
        }
        .cost(u64::MAX, 1),
        u64::MAX
    );
    // No overflow in the product before the division.
    assert_eq!(
        Price {
            prompt_per_1k: u64::MAX / 2,
            completion_per_1k: 0
        }
        .cost(1000, 0),
        u64::MAX / 2
    );
}

#[test]
fn a_request_is_priced_at_the_price_it_was_served_at() {
    let served = Price {
        prompt_per_1k: 10,
        completion_per_1k: 30,
    };
    let r = FinishedRequest {
        request_id: "req-1".into(),
        key_id: "k".into(),
        project_id: "p".into(),
        model_asked: "llama-70b".into(),
        model_served: "llama-8b".into(),
        prompt_tokens: 1500,
        completion_tokens: 100,
        status: 200,
        latency_ms: 900,
        ttft_ms: Some(120),
        band: Band::Gold,
        at: llmgw_domain::UnixMillis(1_700_000_000_000),
        price: served,
    };
    let u = row(r.clone()).unwrap();
    assert_eq!(u.cost_micros, 15 + 3);
    let bad = row(FinishedRequest {
        status: 42,
        ..r.clone()
    })
    .unwrap_err();
    assert!(bad.reason.contains("42 is not an HTTP status"));

    // A flush is one batch of its rows, each at its own price (the same
    // model served at two prices: the price changed between them); a
    // request that cannot be recorded is left out, with its reason.
    let requests = [
        r.clone(),
        FinishedRequest {
            request_id: "req-2".into(),
            price: Price {
                prompt_per_1k: 1000,
                completion_per_1k: 0,
            },
            ..r.clone()
        },
        FinishedRequest {
            request_id: "req-3".into(),
            model_served: "free".into(),
            price: Price::ZERO,
            ..r.clone()
        },
        FinishedRequest {
            status: 42,
            ..r.clone()
        },
    ];
    let (batch, refused) = record_batch("gateway-a", requests);
    let batch = batch.expect("three rows");
    let UsageEvent::UsageBatchRecorded(b) = &batch else {
        panic!("a batch: {batch:?}")
    };
    assert_eq!(b.gateway, "gateway-a");
    let costs: Vec<u64> = batch.rows().iter().map(|u| u.cost_micros).collect();
    assert_eq!(costs, [18, 1500, 0]);
    assert_eq!(refused.len(), 1);
    let (none, _) = record_batch("gateway-a", []);
    assert_eq!(none, None);
    // An older single-row event reads as a batch of one.
    assert_eq!(UsageEvent::UsageRecorded(u.clone()).rows(), [u]);
}

#[test]
fn budget_periods_start_at_utc_midnight_and_the_first_of_the_month() {
    // 2026-03-15T13:45:00Z
    let at = 1_773_582_300_000;
    assert_eq!(period_start(Period::Day, at), 1_773_532_800_000); // 2026-03-15T00:00Z
    assert_eq!(period_start(Period::Month, at), 1_772_323_200_000); // 2026-03-01T00:00Z
    // Leap day and year end.
    assert_eq!(
        period_start(Period::Month, 1_709_208_000_000),
        1_706_745_600_000
    ); // 2024-02-29 → 02-01
    assert_eq!(
        period_start(Period::Month, 1_767_225_599_000),
        1_764_547_200_000
    ); // 2025-12-31 → 12-01
}

/// A flush's worth of rows as a gateway writes them: a few keys, projects
/// and models, some requests without a first token.
fn flush(n: u64) -> UsageBatchRecorded {
    let rows = (0..n)
        .map(|i| UsageRecorded {
            request_id: format!("req-4242-{}", 100_000 + i),
            key_id: format!("key-{:02}", i % 7).into(),
            project_id: format!("proj-{}", i % 3).into(),
            model_asked: ["llama-8b", "chat"][(i % 2) as usize].into(),
            model_served: "llama-8b".into(),
            prompt_tokens: 100 + i,
            completion_tokens: 20 + i % 50,
            cost_micros: 3 * i,
            status: if i % 10 == 0 { 429 } else { 200 },
            latency_ms: 40 + (i % 90) as u32,
            ttft_ms: (i % 4 != 0).then_some(12),
            band: [Band::Gold, Band::Bronze][(i % 2) as usize],
            at: UnixMillis(1_780_000_000_000 + i as i64),
        })
        .collect();
    UsageBatchRecorded {
        gateway: "gateway-a".into(),
        rows,
    }
}

#[test]
fn a_batch_is_stored_in_columns_and_reads_back_as_its_rows() {
    let batch = Event::Usage(UsageEvent::UsageBatchRecorded(flush(40)));
    let (kind, version, payload) = batch.encode();
    assert_eq!((kind.as_str(), version), ("UsageBatchRecorded", 2));
    // Each name once, each request its entries in the columns.
    let names = payload["names"].as_array().unwrap();
    assert_eq!(names.len(), 7 + 3 + 2, "{payload}");
    assert_eq!(payload["request_id"].as_array().unwrap().len(), 40);
    assert_eq!(payload["key"][8], 1, "key-01 is the second name");
    assert!(payload.get("rows").is_none());
    assert_eq!(Event::decode(&kind, version, &payload), Ok(batch.clone()));
    let text = payload.to_string();
    let read = Event::decode_json(&kind, version, &text);
    assert_eq!(read, Ok(batch));
    // The rows read back share each name, as they were stored: key-01
    // once for rows 1, 8, 15, …, not a copy for each.
    let Ok(Event::Usage(UsageEvent::UsageBatchRecorded(read))) = read else {
        unreachable!("compared equal above")
    };
    assert!(std::sync::Arc::ptr_eq(
        &read.rows[1].key_id,
        &read.rows[8].key_id
    ));
    let empty = Event::Usage(UsageEvent::UsageBatchRecorded(flush(0)));
    let (kind, version, payload) = empty.encode();
    assert_eq!(Event::decode(&kind, version, &payload), Ok(empty));
}

#[test]
fn a_batch_in_columns_is_under_a_third_of_its_rows() {
    // What a request costs the log: the batch's text a row, in either shape.
    let batch = flush(500);
    let rows = serde_json::json!({"gateway": batch.gateway, "rows": batch.rows});
    let per_row = |text: String| text.len() / batch.rows.len();
    let (as_rows, as_columns) = (
        per_row(rows.to_string()),
        per_row(serde_json::to_string(&batch).unwrap()),
    );
    assert!(
        as_columns * 3 <= as_rows,
        "{as_columns} B a request in columns, {as_rows} B in rows"
    );
}

#[test]
fn a_batch_written_as_rows_still_reads() {
    // Schema version 1, as logs written before columns hold it.
    let batch = flush(3);
    let v1 = serde_json::json!({"gateway": batch.gateway, "rows": batch.rows});
    let want = Event::Usage(UsageEvent::UsageBatchRecorded(batch));
    assert_eq!(
        Event::decode("UsageBatchRecorded", 1, &v1),
        Ok(want.clone())
    );
    assert_eq!(
        Event::decode_json("UsageBatchRecorded", 1, &v1.to_string()),
        Ok(want)
    );
    // Each shape only at its own version.
    let (_, _, v2) = Event::Usage(UsageEvent::UsageBatchRecorded(flush(3))).encode();
    assert!(Event::decode("UsageBatchRecorded", 1, &v2).is_err());
    assert!(Event::decode("UsageBatchRecorded", 2, &v1).is_err());
    assert!(matches!(
        Event::decode("UsageBatchRecorded", 3, &v2),
        Err(DecodeError::Version { current: 2, .. })
    ));
}

#[test]
fn columns_that_do_not_line_up_are_refused() {
    let (kind, version, payload) = Event::Usage(UsageEvent::UsageBatchRecorded(flush(3))).encode();
    let mut short = payload.clone();
    short["status"].as_array_mut().unwrap().pop();
    let e = Event::decode(&kind, version, &short)
        .unwrap_err()
        .to_string();
    assert!(e.contains("request_id has 3 entries, status 2"), "{e}");
    let mut past = payload.clone();
    past["served"][1] = 99.into();
    let e = Event::decode_json(&kind, version, &past.to_string())
        .unwrap_err()
        .to_string();
    assert!(e.contains("name 99 is not among the batch's"), "{e}");
}

#[test]
fn a_version_one_batch_as_the_log_holds_it_reads() {
    // The text a gateway appended before columns, as stored (canonical:
    // keys sorted, no spaces), not rebuilt from today's types.
    let stored = r#"{"gateway":"gateway-cp-1","rows":[{"at":1780000000000,"band":"gold","completion_tokens":50,"cost_micros":60,"key_id":"key-00000000","latency_ms":300,"model_asked":"llama-3.1-8b-instruct","model_served":"llama-3.1-8b-instruct","project_id":"project-0","prompt_tokens":200,"request_id":"req-4000000-0","status":200,"ttft_ms":40},{"at":1780000000850,"band":"bronze","completion_tokens":51,"cost_micros":61,"key_id":"key-9e3779b1","latency_ms":301,"model_asked":"chat","model_served":"llama-3.1-9b-instruct","project_id":"project-1","prompt_tokens":201,"request_id":"req-4000001-1","status":502}]}"#;
    let Ok(Event::Usage(UsageEvent::UsageBatchRecorded(b))) =
        Event::decode_json("UsageBatchRecorded", 1, stored)
    else {
        panic!("a batch of version 1")
    };
    assert_eq!(b.gateway, "gateway-cp-1");
    assert_eq!(b.rows.len(), 2);
    let second = &b.rows[1];
    assert_eq!(
        (&*second.model_asked, &*second.model_served, &*second.key_id),
        ("chat", "llama-3.1-9b-instruct", "key-9e3779b1")
    );
    assert_eq!(
        (second.status, second.ttft_ms, second.band, second.at),
        (502, None, Band::Bronze, UnixMillis(1_780_000_000_850))
    );
    assert_eq!(b.rows[0].ttft_ms, Some(40));
    assert_eq!(b.rows[0].cost_micros, 60);
}

#[test]
fn a_batch_whose_rows_name_too_much_is_refused() {
    // One long name, named by many rows: a small payload that would take
    // gigabytes once its rows are written out one by one.
    let rows = 200_000;
    let zeros = vec![0u32; rows];
    let payload = serde_json::json!({
        "gateway": "g", "names": ["x".repeat(4096)],
        "key": zeros, "project": zeros, "asked": zeros, "served": zeros,
        "request_id": vec![""; rows], "prompt_tokens": zeros, "completion_tokens": zeros,
        "cost_micros": zeros, "status": vec![200; rows], "latency_ms": zeros,
        "ttft_ms": zeros, "band": vec!["gold"; rows], "at": zeros,
    });
    let e = Event::decode("UsageBatchRecorded", 2, &payload)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bytes of names in all, over"), "{e}");
}
