//! Fallbacks for a model with no capacity: held back by admission (its
//! pool saturated) or refused by its engines as full, the request goes to
//! the model's fallbacks before the client is told to come back.

use std::net::SocketAddr;
use std::time::Duration;

use llmgw_gateway::GatewayConfig;
use llmgw_gateway::admission::AdmissionConfig;
use llmgw_sim::{SimConfig, Vocabulary};
use serde_json::{Value, json};

use crate::support::{self, sim, spec};

/// An answer's status, served model (empty when none) and body.
async fn answered(r: reqwest::Response) -> (u16, String, String) {
    let served = r
        .headers()
        .get("x-llmgw-served-model")
        .map_or(String::new(), |v| v.to_str().unwrap().to_owned());
    (r.status().as_u16(), served, r.text().await.unwrap())
}

fn ask(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": 2,
           "messages": [{"role": "user", "content": "hello"}]})
}

/// Held back once two requests wait in an engine; refused soon after.
fn held_at_two() -> AdmissionConfig {
    AdmissionConfig {
        waiting_ceiling: 2.0,
        max_wait: Duration::from_millis(300),
        ..AdmissionConfig::default()
    }
}

/// An engine serving `model` with one slot, slow enough that what is sent
/// to it stays.
async fn one_slot(model: &str, vocabulary: Vocabulary) -> SocketAddr {
    sim(SimConfig {
        models: vec![model.into()],
        vocabulary,
        slots: 1,
        tokens_per_s: 2,
        ..support::sim_config()
    })
    .await
}

/// Requests for `model` sent straight to `engine` until `waiting` of them
/// queue in it (its figure `metric`). Abort the handles to let them go.
async fn queued(
    engine: &SocketAddr,
    model: &str,
    metric: &str,
    waiting: f64,
) -> Vec<tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>> {
    let client = reqwest::Client::new();
    let url = format!("http://{engine}/v1/chat/completions");
    let body = json!({"model": model, "max_tokens": 100,
                      "messages": [{"role": "user", "content": "backlog"}]});
    let handles = (0..=waiting as usize)
        .map(|_| tokio::spawn(client.post(&url).json(&body).send()))
        .collect();
    tokio::time::timeout(Duration::from_secs(10), async {
        while support::metric(engine, metric).await < waiting {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the backlog queued in the engine");
    handles
}

/// An engine that says it is full to every request: the sim with no room
/// to queue (503 `queue_full`, no Retry-After, as it answers when full).
async fn full_engine(model: &str, vocabulary: Vocabulary) -> SocketAddr {
    sim(SimConfig {
        models: vec![model.into()],
        vocabulary,
        queue: 0,
        ..support::sim_config()
    })
    .await
}

/// A saturated model whose fallback has room: the fallback serves at once
/// (the client got 429 overloaded while the fallback sat idle). With room
/// again on the model, the model serves.
#[tokio::test]
async fn a_model_admission_holds_back_goes_to_its_fallback() {
    let busy = one_slot("m", Vocabulary::Vllm).await;
    let tiny = sim(SimConfig {
        models: vec!["tiny".into()],
        ..support::sim_config()
    })
    .await;
    let gw = support::gateway_with(GatewayConfig {
        endpoints: vec![spec("a", &busy, &["m"]), spec("t", &tiny, &["tiny"])],
        fallbacks: [("m".to_string(), vec!["tiny".to_string()])].into(),
        admission: held_at_two(),
        ..GatewayConfig::default()
    })
    .await;
    let r = gw.chat(&ask("m", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-llmgw-served-model"], "m", "room: the model");
    r.text().await.unwrap();
    let backlog = queued(&busy, "m", "vllm:num_requests_waiting", 3.0).await;
    llmgw_gateway::scrape::scrape_once(&gw.gateway).await;
    let client = reqwest::Client::new();
    for (band, stream) in [("gold", false), ("bronze", true), ("platinum", false)] {
        let r = client
            .post(format!("{}/v1/chat/completions", gw.base))
            .header("x-llmgw-band", band)
            .json(&ask("m", stream))
            .send()
            .await
            .unwrap();
        let (status, served, body) = answered(r).await;
        assert_eq!((status, served.as_str()), (200, "tiny"), "{band}: {body}");
    }
    let page = gw.admin_page().await;
    assert!(!page.contains("llmgw_admission_rejected_total{"), "{page}");
    for t in backlog {
        t.abort();
    }
}

/// A model whose engines all say they are full (503) passes the request
/// to its fallback, streamed or not; with no fallback the client is told
/// the engine is busy, as before. A plain answer past the response
/// timeout is not sent to the fallback: the engine may still be working.
#[tokio::test]
async fn a_model_whose_engines_say_they_are_full_goes_to_its_fallback() {
    let full = full_engine("m", Vocabulary::Vllm).await;
    let hung = support::hung_engine().await;
    let tiny = sim(SimConfig {
        models: vec!["tiny".into()],
        ..support::sim_config()
    })
    .await;
    let gw = support::gateway_with(GatewayConfig {
        endpoints: vec![
            spec("full-1", &full, &["m"]),
            spec("full-2", &full, &["m"]),
            spec("hung", &hung, &["slow"]),
            spec("t", &tiny, &["tiny"]),
        ],
        fallbacks: [
            ("m".to_string(), vec!["tiny".to_string()]),
            ("slow".to_string(), vec!["tiny".to_string()]),
        ]
        .into(),
        response_timeout: Duration::from_millis(300),
        ..GatewayConfig::default()
    })
    .await;
    for stream in [false, true, false, true] {
        let (status, served, body) = answered(gw.chat(&ask("m", stream)).await).await;
        assert_eq!((status, served.as_str()), (200, "tiny"), "{stream}: {body}");
    }
    let r = gw.chat(&ask("slow", false)).await;
    assert_eq!(r.status(), 504, "a slow plain answer is not sent again");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_timeout", "{body}");

    let alone = support::gateway(vec![spec("full-1", &full, &["m"])]).await;
    let r = alone.chat(&ask("m", false)).await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "engine_busy", "{body}");
}

/// A catalog model `cp` whose fallback `od` starts on demand; `cp`'s one
/// replica on `engine`. The control plane's part is played by the test:
/// told that `od` is wanted, it places `od` on `tiny`.
async fn with_an_on_demand_fallback(engine: SocketAddr) -> (support::Running, SocketAddr) {
    use llmgw_domain::catalog::Model;
    let tiny = sim(SimConfig {
        models: vec!["od".into()],
        vocabulary: Vocabulary::Sim,
        ..support::sim_config()
    })
    .await;
    let mut cp = Model::named("cp");
    cp.scaling.min = 1;
    cp.fallbacks = vec!["od".into()];
    let od = Model::named("od");
    let catalog = vec![cp, od];
    let gw = llmgw_gateway::Gateway::new(
        GatewayConfig {
            admission: held_at_two(),
            on_demand_wait: Duration::from_secs(20),
            ..GatewayConfig::default()
        },
        None,
    )
    .unwrap();
    let (wanted, mut told) = tokio::sync::mpsc::unbounded_channel::<String>();
    gw.on_demand(llmgw_gateway::DemandHook(Box::new(move |m| {
        let _ = wanted.send(m.to_owned());
    })));
    gw.apply_router_view(&support::router_view(catalog.clone(), &[("cp", engine)]));
    let placer = std::sync::Arc::downgrade(&gw);
    tokio::spawn(async move {
        while let Some(model) = told.recv().await {
            let Some(gw) = placer.upgrade() else { return };
            if model == "od" {
                let view = support::router_view(catalog.clone(), &[("cp", engine), ("od", tiny)]);
                gw.apply_router_view(&view);
            }
        }
    });
    (support::serve(gw).await, tiny)
}

/// A saturated catalog model whose fallback starts on demand: the
/// fallback is started and serves (it was never started, and the client
/// got 429 overloaded).
#[tokio::test]
async fn a_saturated_model_starts_its_on_demand_fallback() {
    let busy = one_slot("cp", Vocabulary::Sim).await;
    let (gw, _) = with_an_on_demand_fallback(busy).await;
    let backlog = queued(&busy, "cp", "llmgw_sim_waiting", 3.0).await;
    llmgw_gateway::scrape::scrape_once(&gw.gateway).await;
    let (status, served, body) = answered(gw.chat(&ask("cp", false)).await).await;
    assert_eq!((status, served.as_str()), (200, "od"), "{body}");
    for t in backlog {
        t.abort();
    }
}

/// A catalog model whose engine says it is full: its on-demand fallback
/// is started and serves (the client got 503 engine_busy).
#[tokio::test]
async fn a_model_whose_engine_is_full_starts_its_on_demand_fallback() {
    let full = full_engine("cp", Vocabulary::Sim).await;
    let (gw, _) = with_an_on_demand_fallback(full).await;
    let (status, served, body) = answered(gw.chat(&ask("cp", true)).await).await;
    assert_eq!((status, served.as_str()), (200, "od"), "{body}");
    assert!(body.contains("[DONE]"), "{body}");
}
