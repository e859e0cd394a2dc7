//! Endpoint priorities (`;priority=N`): the highest tier of a model takes
//! its requests while it has room, the next takes the overflow once it is
//! full, and admission holds requests back only when no tier has room.

use std::time::Duration;

use llmgw_gateway::admission::AdmissionConfig;
use llmgw_gateway::{EndpointSpec, GatewayConfig};
use serde_json::{Value, json};

use crate::support::{self, backlog, metric, sim};

/// A sim with one slot, slow enough that a backlog stays queued.
async fn one_slot() -> std::net::SocketAddr {
    sim(llmgw_sim::SimConfig {
        slots: 1,
        tokens_per_s: 2,
        ..support::sim_config()
    })
    .await
}

/// Prompt tokens `engine` has been asked to read: above 0 once it served.
async fn asked(engine: &std::net::SocketAddr) -> f64 {
    metric(engine, "vllm:prompt_tokens_total").await
}

#[tokio::test]
async fn a_full_priority_tier_overflows_to_the_next_and_only_all_full_is_overloaded() {
    let (high, low) = (one_slot().await, one_slot().await);
    let endpoint = |id: &str, addr, priority| -> EndpointSpec {
        format!("{id}=http://{addr}=m;priority={priority}")
            .parse()
            .unwrap()
    };
    let gw = support::gateway_with(GatewayConfig {
        endpoints: vec![endpoint("s11", high, 1), endpoint("s22", low, 0)],
        admission: AdmissionConfig {
            waiting_ceiling: 2.0,
            max_wait: Duration::from_millis(300),
            ..AdmissionConfig::default()
        },
        ..GatewayConfig::default()
    })
    .await;
    let ask = json!({"model": "m", "max_tokens": 1,
                     "messages": [{"role": "user", "content": "hello"}]});
    // Room on the higher tier: it takes the request, the lower none.
    let r = gw.chat(&ask).await;
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    assert!(asked(&high).await > 0.0);
    assert_eq!(asked(&low).await, 0.0, "the lower tier is not asked");
    // The higher tier full (three waiting against a ceiling of two): the
    // lower takes the request at once (it queued behind the higher's
    // backlog, held back by admission, then 429 while s22 sat idle).
    let high_backlog = backlog(&high, 4, 3.0).await;
    llmgw_gateway::scrape::scrape_once(&gw.gateway).await;
    let r = gw.chat(&ask).await;
    let status = r.status();
    assert_eq!(status, 200, "{}", r.text().await.unwrap());
    assert!(asked(&low).await > 0.0, "served by the lower tier");
    // Every tier full: now the model is saturated.
    let low_backlog = backlog(&low, 4, 3.0).await;
    llmgw_gateway::scrape::scrape_once(&gw.gateway).await;
    let r = gw.chat(&ask).await;
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    for t in high_backlog.into_iter().chain(low_backlog) {
        t.abort();
    }
}
