//! Priority bands in a full waiting room: a higher band's request takes
//! the place of the lowest band's newest, never the other way round.

use std::time::Duration;

use llmgw_gateway::GatewayConfig;
use llmgw_gateway::admission::AdmissionConfig;
use serde_json::{Value, json};

use crate::support::{self, metric, sim, spec};

/// With one place to wait in, bronze then silver then gold each take it
/// from the one before, who is refused at once with 429 overloaded; a
/// lower band finds no room; gold is served once the engine has room.
/// (Bronze kept the place, and silver, gold and the default band were
/// refused at once while it waited.)
#[tokio::test]
async fn a_higher_band_takes_the_waiting_place_of_a_lower_one() {
    let engine = sim(llmgw_sim::SimConfig {
        slots: 1,
        tokens_per_s: 2,
        ..support::sim_config()
    })
    .await;
    let backlog = support::backlog(&engine, 4, 3.0).await;
    let gw = support::gateway_with(GatewayConfig {
        endpoints: vec![spec("a", &engine, &["m"])],
        admission: AdmissionConfig {
            waiting_ceiling: 2.0,
            // Longer than the test: a request refused before it was
            // refused for its place, not for its wait.
            max_wait: Duration::from_secs(120),
            max_waiting: 1,
            ..AdmissionConfig::default()
        },
        ..GatewayConfig::default()
    })
    .await;
    llmgw_gateway::scrape::scrape_once(&gw.gateway).await;
    let client = reqwest::Client::new();
    let send = |band: &'static str| {
        let ask = client
            .post(format!("{}/v1/chat/completions", gw.base))
            .header("x-llmgw-band", band)
            .json(&json!({"model": "m", "max_tokens": 1,
                          "messages": [{"role": "user", "content": "hi"}]}))
            .send();
        tokio::spawn(ask)
    };
    let refused = |r: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>| async {
        let r = tokio::time::timeout(Duration::from_secs(10), r)
            .await
            .expect("refused at once, not after its wait")
            .unwrap()
            .unwrap();
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()["retry-after"], "1");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "overloaded", "{body}");
        body["error"]["message"].as_str().unwrap().to_owned()
    };
    let bronze = send("bronze");
    tokio::time::timeout(Duration::from_secs(10), async {
        while gw.gateway.admission.held() < 1 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("bronze is held");
    let silver = send("silver");
    assert!(refused(bronze).await.contains("bronze"));
    assert!(refused(send("bronze")).await.contains("bronze"), "no room");
    let gold = send("gold");
    assert!(refused(silver).await.contains("silver"));
    assert!(refused(send("silver")).await.contains("silver"), "no room");
    assert_eq!(gw.gateway.admission.held(), 1, "gold waits");
    let page = gw.admin_page().await;
    for (band, n) in [("bronze", 2), ("silver", 2)] {
        let line = format!("llmgw_admission_rejected_total{{band=\"{band}\"}} {n}");
        assert!(page.lines().any(|l| l == line), "{page}");
    }
    // The engine's backlog goes: gold is let through.
    for t in backlog {
        t.abort();
    }
    tokio::time::timeout(Duration::from_secs(10), async {
        while metric(&engine, "vllm:num_requests_waiting").await > 0.0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the backlog left the engine");
    llmgw_gateway::scrape::scrape_once(&gw.gateway).await;
    let gold = tokio::time::timeout(Duration::from_secs(30), gold)
        .await
        .expect("gold let through")
        .unwrap()
        .unwrap();
    assert_eq!(gold.status(), 200);
}
