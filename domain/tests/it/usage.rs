use llmgw_domain::catalog::Price;
use llmgw_domain::tenancy::{Band, Period};
use llmgw_domain::usage::{FinishedRequest, UsageEvent, period_start, record_batch, row};

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
fn a_request_is_priced_by_the_model_that_served_it() {
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
    };
    let u = row(r.clone(), served).unwrap();
    assert_eq!(u.cost_micros, 15 + 3);
    let bad = row(
        FinishedRequest {
            status: 42,
            ..r.clone()
        },
        served,
    )
    .unwrap_err();
    assert!(bad.reason.contains("42 is not an HTTP status"));

    // A flush is one batch of its rows, each priced by its own model; a
    // request that cannot be recorded is left out, with its reason.
    let price_of = |m: &str| if m == "llama-8b" { served } else { Price::ZERO };
    let requests = [
        r.clone(),
        FinishedRequest {
            request_id: "req-2".into(),
            model_served: "free".into(),
            ..r.clone()
        },
        FinishedRequest {
            status: 42,
            ..r.clone()
        },
    ];
    let (batch, refused) = record_batch("gateway-a", requests, price_of);
    let batch = batch.expect("two rows");
    let UsageEvent::UsageBatchRecorded(b) = &batch else {
        panic!("a batch: {batch:?}")
    };
    assert_eq!(b.gateway, "gateway-a");
    let costs: Vec<u64> = batch.rows().iter().map(|u| u.cost_micros).collect();
    assert_eq!(costs, [18, 0]);
    assert_eq!(refused.len(), 1);
    let (none, _) = record_batch("gateway-a", [], price_of);
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
