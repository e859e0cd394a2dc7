//! The gateway end to end: real sim engines and a real gateway on loopback
//! ports, driven by a real HTTP client.

#![allow(clippy::unwrap_used, reason = "in tests an unwrap is an assertion")]

mod bands;
mod connections;
mod fallbacks;
mod hostile;
mod kv_events;
mod migration;
mod refusals;
mod support;
mod tenancy;
mod tiers;
mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use llmgw_gateway::{EndpointSpec, GatewayConfig};
use serde_json::{Value, json};
use support::{dead_url, gateway, metric, sim, spec};

fn chat(model: &str, stream: bool, max_tokens: u32) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": "tell me a story"}]})
}

#[tokio::test]
async fn chunks_stream_through_as_the_engine_produces_them() {
    let engine = sim(llmgw_sim::SimConfig {
        tokens_per_s: 5,
        ttft: Duration::from_millis(10),
        ..support::sim_config()
    })
    .await;
    let gw = gateway(vec![spec("a", &engine, &["m"])]).await;
    let start = Instant::now();
    let resp = gw.chat(&chat("m", true, 6)).await;
    assert_eq!(
        resp.headers()["x-llmgw-served-model"],
        "m",
        "set before the body starts"
    );
    let mut body = resp.bytes_stream();
    let mut first_token = None;
    let mut text = String::new();
    while let Some(chunk) = body.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        // A token's event, not the role's (whose content is empty).
        let tokens = text.matches("\"content\":\"").count();
        if first_token.is_none() && tokens > text.matches("\"content\":\"\"").count() {
            first_token = Some(start.elapsed());
        }
    }
    let total = start.elapsed();
    let first = first_token.expect("a token chunk");
    // Six tokens at 200 ms each: buffering would deliver the first at the end.
    assert!(total >= Duration::from_millis(1200), "{total:?}");
    assert!(
        first < total - Duration::from_millis(600),
        "first token at {first:?} of {total:?}"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"));
}

#[tokio::test]
async fn concurrent_requests_spread_over_the_endpoints_of_a_model() {
    let config = llmgw_sim::SimConfig {
        tokens_per_s: 100,
        ..support::sim_config()
    };
    let (a, b) = (sim(config.clone()).await, sim(config).await);
    let gw = gateway(vec![spec("a", &a, &["m"]), spec("b", &b, &["m"])]).await;
    let client = reqwest::Client::new();
    let requests = (0..8).map(|_| {
        client
            .post(format!("{}/v1/chat/completions", gw.base))
            .json(&chat("m", false, 20))
            .send()
    });
    for r in futures_util::future::join_all(requests).await {
        let r = r.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-llmgw-served-model"], "m");
    }
    let (on_a, on_b) = (
        metric(&a, "vllm:prefix_cache_queries_total").await,
        metric(&b, "vllm:prefix_cache_queries_total").await,
    );
    assert!(on_a > 0.0 && on_b > 0.0, "a {on_a}, b {on_b}");
}

/// One request at a time never loads either endpoint: they take turns,
/// rather than the first id getting everything (a second machine added
/// for a model got no traffic until the first was busy).
#[tokio::test]
async fn light_traffic_takes_turns_over_equal_endpoints() {
    let (a, b) = (
        sim(support::sim_config()).await,
        sim(support::sim_config()).await,
    );
    let gw = gateway(vec![spec("a", &a, &["m"]), spec("b", &b, &["m"])]).await;
    for _ in 0..6 {
        let r = gw.chat(&chat("m", false, 2)).await;
        assert_eq!(r.status(), 200);
    }
    let (on_a, on_b) = (
        metric(&a, "vllm:generation_tokens_total").await,
        metric(&b, "vllm:generation_tokens_total").await,
    );
    // Three each when nothing else weighs; a scrape that catches one
    // engine mid-answer may shift one request.
    assert!(
        on_a >= 4.0 && on_b >= 4.0,
        "two tokens a request, at least two requests each: a {on_a}, b {on_b}"
    );
}

#[tokio::test]
async fn a_failing_endpoint_is_retried_around_then_its_breaker_opens() {
    let live = sim(support::sim_config()).await;
    let failing = support::failing_engine().await;
    // "a-dead" sorts first, so ties go to it until its breaker opens.
    let gw = gateway(vec![
        EndpointSpec {
            id: "a-dead".into(),
            ..spec("x", &failing, &["m"])
        },
        spec("b", &live, &["m"]),
    ])
    .await;
    for _ in 0..5 {
        let r = gw.chat(&chat("m", false, 1)).await;
        assert_eq!(r.status(), 200, "retried before the first byte");
    }
    let page = gw.admin_page().await;
    assert!(
        page.contains("llmgw_endpoint_breaker_open{endpoint=\"a-dead\"} 1"),
        "{page}"
    );
    assert!(
        page.contains("llmgw_endpoint_breaker_open{endpoint=\"b\"} 0"),
        "{page}"
    );
    assert!(
        page.contains("llmgw_requests_total{model=\"m\",status=\"200\"} 5"),
        "{page}"
    );
}

#[tokio::test]
async fn every_error_path_answers_with_its_status_and_the_openai_envelope() {
    let live = sim(support::sim_config()).await;
    let gw = support::gateway_with(GatewayConfig {
        endpoints: vec![
            spec("a", &live, &["m"]),
            spec("dead", &dead_url(), &["lonely"]),
        ],
        body_limit: 1024,
        ..GatewayConfig::default()
    })
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.base);
    let big = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(2000)}]});
    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (client.post(&url).body("{not json"), 400, "invalid_request"),
        (
            client.post(&url).json(&json!({"messages": []})),
            400,
            "invalid_request",
        ),
        (
            client.post(&url).json(&chat("nope", false, 1)),
            404,
            "model_not_found",
        ),
        (client.post(&url).json(&big), 413, "request_too_large"),
        // Its only endpoint refuses connections: every try failed.
        (
            client.post(&url).json(&chat("lonely", false, 1)),
            502,
            "upstream_error",
        ),
        (
            client.post(&url).json(&chat("lonely", false, 1)),
            502,
            "upstream_error",
        ),
        (
            client.post(&url).json(&chat("lonely", false, 1)),
            502,
            "upstream_error",
        ),
        // Now its breaker is open: no capacity, without trying.
        (
            client.post(&url).json(&chat("lonely", false, 1)),
            503,
            "no_capacity",
        ),
        // A path or a method the API does not have: the envelope too, so
        // that an SDK says why.
        (
            client
                .post(format!("{}/v1/audio/speech", gw.base))
                .json(&json!({})),
            404,
            "unknown_url",
        ),
        // The Responses API refuses a body without its fields by name.
        (
            client
                .post(format!("{}/v1/responses", gw.base))
                .json(&json!({"input": "hi"})),
            400,
            "invalid_request",
        ),
        (client.get(&url), 405, "method_not_supported"),
        // A base URL without /v1: said in the envelope, naming the fix.
        (
            client.get(format!("{}/models", gw.base)),
            404,
            "unknown_url",
        ),
        (
            client
                .post(format!("{}/embeddings", gw.base))
                .json(&json!({})),
            404,
            "unknown_url",
        ),
        // A model named with a slash, as some clients send it.
        (
            client.get(format!("{}/v1/models/org/nope", gw.base)),
            404,
            "model_not_found",
        ),
    ];
    for (req, status, code) in cases {
        let r = req
            .header("content-type", "application/json")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status);
        let retry_after = r.headers().get("retry-after").cloned();
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], code, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            !message.is_empty()
                && body["error"]["type"].is_string()
                && body["error"].get("param").is_some(),
            "{body}"
        );
        match code {
            // The endpoint's id (an internal) is not the client's to know.
            "upstream_error" => assert!(!message.contains("dead"), "{body}"),
            // Capacity may come back once the breaker cools down.
            "no_capacity" => assert_eq!(retry_after.unwrap(), "5", "{body}"),
            "model_not_found" => assert_eq!(body["error"]["param"], "model", "{body}"),
            "unknown_url" if !message.contains("/v1/") => {
                assert!(message.contains("base URL that ends in /v1"), "{body}")
            }
            _ => {}
        }
    }
    // A metric's model is a model the gateway knows, never a client's string.
    let page = gw.admin_page().await;
    assert!(
        page.contains("llmgw_requests_total{model=\"unknown\",status=\"404\"} 1")
            && !page.contains("nope"),
        "{page}"
    );
    // Every configured model is listed, the one whose breaker is open
    // too (serving is routing's to say), and the gateway is ready.
    let models: Value = client
        .get(format!("{}/v1/models", gw.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(support::model_ids(&models), vec!["lonely", "m"]);
    // A configured endpoint's model is as old as the gateway, not 0.
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let created = models["data"][0]["created"].as_i64().unwrap();
    assert!(created > now_s - 600 && created <= now_s, "{models}");
    assert_eq!(
        client
            .get(format!("{}/ready", gw.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        client
            .get(format!("{}/health", gw.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

/// With no traffic to open a breaker, an engine gone silent (nothing
/// listens at its address, scrape after scrape) still makes the server
/// not ready: a balancer takes it out of rotation. An engine that answers
/// without a metrics page (a hosted API) is not silent.
#[tokio::test]
async fn an_engine_nothing_answers_for_makes_the_server_not_ready() {
    let answering = picky_engine().await;
    let with = |addr: std::net::SocketAddr| {
        support::gateway_with(GatewayConfig {
            endpoints: vec![spec("e", &addr, &["m"])],
            scrape_interval: Duration::from_millis(10),
            ..GatewayConfig::default()
        })
    };
    let ready = |gw: &support::Running| {
        let url = format!("{}/ready", gw.base);
        async move { reqwest::get(url).await.unwrap().status().as_u16() }
    };
    let dead = with(dead_url()).await;
    let alive = with(answering).await;
    let started = Instant::now();
    // Scrapes over more than three intervals (30 ms), for both.
    while started.elapsed() < Duration::from_millis(100) {
        llmgw_gateway::scrape::scrape_once(&dead.gateway).await;
        llmgw_gateway::scrape::scrape_once(&alive.gateway).await;
        tokio::task::yield_now().await;
    }
    assert_eq!(ready(&dead).await, 503);
    assert_eq!(ready(&alive).await, 200);
}

/// A model none of whose endpoints can be reached (refused: its engine
/// died, its breaker not yet open) is as good as out of capacity: the
/// plan's fallback serves, from the first request (they got 502 until
/// the breaker opened, and one every cool-down after).
#[tokio::test]
async fn a_model_whose_engines_refuse_connections_falls_back() {
    let engine = sim(llmgw_sim::SimConfig {
        models: vec!["backup".into()],
        ..support::sim_config()
    })
    .await;
    let gw = support::gateway_with(GatewayConfig {
        endpoints: vec![
            spec("dead", &dead_url(), &["steady"]),
            spec("live", &engine, &["backup"]),
        ],
        fallbacks: [("steady".to_string(), vec!["backup".to_string()])].into(),
        ..GatewayConfig::default()
    })
    .await;
    for stream in [false, true, false] {
        let r = gw.chat(&chat("steady", stream, 2)).await;
        assert_eq!(r.status(), 200, "stream {stream}");
        assert_eq!(r.headers()["x-llmgw-served-model"], "backup");
        r.text().await.unwrap();
    }
    // Nothing else to go to: said as before.
    let alone = gateway(vec![spec("dead", &dead_url(), &["m"])]).await;
    let r = alone.chat(&chat("m", false, 1)).await;
    assert_eq!(r.status(), 502);
}

#[tokio::test]
async fn nothing_routable_means_not_ready() {
    let gw = gateway(vec![spec("dead", &dead_url(), &["m"])]).await;
    let client = reqwest::Client::new();
    assert_eq!(
        client
            .get(format!("{}/ready", gw.base))
            .send()
            .await
            .unwrap()
            .status(),
        200,
        "untried is not known dead"
    );
    for _ in 0..3 {
        gw.chat(&chat("m", false, 1)).await;
    }
    assert_eq!(
        client
            .get(format!("{}/ready", gw.base))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
    // The model the operator configured stays listed and retrievable
    // while its engine is down (a client lists models once, at its
    // start): serving is routing's to say, with a 503 and when to return.
    let models: Value = client
        .get(format!("{}/v1/models", gw.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(support::model_ids(&models), vec!["m"], "{models}");
    let one = client
        .get(format!("{}/v1/models/m", gw.base))
        .send()
        .await
        .unwrap();
    assert_eq!(one.status(), 200);
    assert_eq!(one.json::<Value>().await.unwrap()["id"], "m");
    let r = gw.chat(&chat("m", false, 1)).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "no_capacity"
    );
}

/// With the control plane, a catalog model is listed and retrievable
/// whether its replica's engine is down (breaker open) or it has no
/// replica yet; each once, by its canonical name: an alias is not listed,
/// and retrieved by it the model answers with its canonical id.
#[tokio::test]
async fn catalog_models_stay_listed_while_nothing_serves_them_and_aliases_are_not_listed() {
    let mut m = llmgw_domain::catalog::Model::named("m");
    m.aliases = vec!["m-latest".into()];
    let mut gone = llmgw_domain::catalog::Model::named("gone");
    // Kept up, not started on demand (a request would wait for them).
    for model in [&mut m, &mut gone] {
        model.scaling.min = 1;
    }
    let view = support::router_view(vec![m, gone], &[("m", dead_url())]);
    let gw = gateway(vec![]).await;
    gw.gateway.apply_router_view(&view);
    for _ in 0..3 {
        gw.chat(&chat("m", false, 1)).await;
    }
    let r = gw.chat(&chat("m-latest", false, 1)).await;
    assert_eq!(r.status(), 503, "the breaker is open");
    let get = |path: &str| reqwest::get(format!("{}{path}", gw.base));
    let models: Value = get("/v1/models").await.unwrap().json().await.unwrap();
    assert_eq!(support::model_ids(&models), vec!["gone", "m"], "{models}");
    for (asked, id) in [("m", "m"), ("m-latest", "m"), ("gone", "gone")] {
        let r = get(&format!("/v1/models/{asked}")).await.unwrap();
        assert_eq!(r.status(), 200, "{asked}");
        assert_eq!(r.json::<Value>().await.unwrap()["id"], id);
    }
    assert_eq!(get("/v1/models/nope").await.unwrap().status(), 404);
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_upstream_request() {
    let engine = sim(llmgw_sim::SimConfig {
        tokens_per_s: 5,
        ..support::sim_config()
    })
    .await;
    let gw = gateway(vec![spec("a", &engine, &["m"])]).await;
    let resp = gw.chat(&chat("m", true, 100)).await;
    let mut body = resp.bytes_stream();
    body.next().await.unwrap().unwrap();
    assert_eq!(metric(&engine, "vllm:num_requests_running").await, 1.0);
    drop(body);
    // A 20-second stream: the engine sees it end long before that.
    tokio::time::timeout(Duration::from_secs(10), async {
        while metric(&engine, "vllm:num_requests_running").await > 0.0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the engine stopped generating for a client that left");
    let page = gw.admin_page().await;
    assert!(
        page.contains("llmgw_endpoint_in_flight{endpoint=\"a\"} 0"),
        "{page}"
    );
}

#[tokio::test]
async fn usage_is_counted_even_when_the_client_did_not_ask_and_then_stripped() {
    let engine = sim(support::sim_config()).await;
    let gw = gateway(vec![spec("a", &engine, &["m"])]).await;
    let text = gw.chat(&chat("m", true, 4)).await.text().await.unwrap();
    assert!(
        !text.contains("\"usage\""),
        "the extra chunk was stripped: {text}"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"));
    let mut asked = chat("m", true, 4);
    asked["stream_options"] = json!({"include_usage": true});
    let text = gw.chat(&asked).await.text().await.unwrap();
    assert!(
        text.contains("\"completion_tokens\":4"),
        "a client that asked keeps it: {text}"
    );
    gw.chat(&chat("m", false, 2)).await.text().await.unwrap();
    let page = gw.admin_page().await;
    assert!(
        page.contains("llmgw_tokens_total{direction=\"completion\"} 10"),
        "4 + 4 + 2:\n{page}"
    );
    assert!(
        page.contains("llmgw_ttft_seconds_count{model=\"m\"} 2"),
        "the model that served: {page}"
    );
}

/// A client that leaves mid-stream pays for the prompt and what it was
/// sent, not nothing: the engine's own count never arrives.
#[tokio::test]
async fn a_stream_the_client_leaves_is_counted_as_far_as_it_went() {
    let engine = sim(llmgw_sim::SimConfig {
        tokens_per_s: 200,
        ..support::sim_config()
    })
    .await;
    let (gw, mut rx) = support::recording_one(&engine).await;
    let mut response = gw.chat(&chat("m", true, 1000)).await;
    let mut seen = 0;
    while seen < 5 {
        let chunk = response.chunk().await.unwrap().expect("more of the answer");
        seen += String::from_utf8_lossy(&chunk)
            .matches("\"content\"")
            .count();
    }
    drop(response);
    let record = rx.recv().await.expect("a usage record");
    assert!(record.prompt_tokens > 0, "{record:?}");
    assert!(
        record.completion_tokens >= 4 && record.completion_tokens < 1000,
        "{record:?}"
    );
    // Recorded as given up, as a plain request the client leaves is: the
    // usage tells a cut stream from a whole one.
    assert_eq!(record.status, 499, "{record:?}");
    // A client that hangs up as soon as it reads `[DONE]` took it all.
    let mut response = gw.chat(&chat("m", true, 3)).await;
    loop {
        let chunk = response.chunk().await.unwrap().expect("more of the answer");
        if String::from_utf8_lossy(&chunk).contains("[DONE]") {
            break;
        }
    }
    drop(response);
    let record = rx.recv().await.expect("a usage record");
    assert_eq!(record.status, 200, "{record:?}");
}

/// A request the engine refuses (400: a malformed message) did no work
/// there and pays nothing, streamed or not: a streamed one used to pay
/// its prompt's estimate, as if it had been answered and cut off.
#[tokio::test]
async fn a_request_the_engine_refuses_pays_nothing_streamed_or_not() {
    let engine = sim(support::sim_config()).await;
    let (gw, mut rx) = support::recording_one(&engine).await;
    let long = "a long system prompt ".repeat(500);
    for stream in [false, true] {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", gw.base))
            .json(&json!({"model": "m", "stream": stream, "max_tokens": 4,
                "messages": [{"role": "system", "content": long}, {"role": "user"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "stream {stream}");
        let _ = r.text().await;
        let record = rx.recv().await.expect("a usage record");
        assert_eq!(record.status, 400, "{record:?}");
        assert_eq!(
            (record.prompt_tokens, record.completion_tokens),
            (0, 0),
            "stream {stream}: {record:?}"
        );
    }
}

/// An engine that refuses the gateway's credentials is an endpoint the
/// operator must fix, not the client's bad key: another endpoint serves,
/// and with none the client gets 502, not the engine's 401.
#[tokio::test]
async fn an_engine_refusing_the_gateways_key_is_not_the_clients_401() {
    let locked = sim(llmgw_sim::SimConfig {
        api_key: Some("engine-secret".into()),
        ..support::sim_config()
    })
    .await;
    let open = sim(support::sim_config()).await;
    let gw = gateway(vec![
        spec("locked", &locked, &["m"]),
        spec("open", &open, &["m"]),
    ])
    .await;
    for _ in 0..4 {
        let r = gw.chat(&chat("m", false, 2)).await;
        assert_eq!(r.status(), 200, "served by the open endpoint");
    }
    let alone = gateway(vec![spec("locked", &locked, &["m"])]).await;
    let r = alone.chat(&chat("m", false, 2)).await;
    assert_eq!(r.status(), 502);
    let body = r.text().await.unwrap();
    assert!(!body.contains("invalid_api_key"), "{body}");
}

/// An on-demand model that does not come up within `router.on_demand_wait`
/// is answered as such (503 `model_not_ready`, with when to ask again),
/// not as a model without capacity; the control plane was told it is
/// wanted.
#[tokio::test]
async fn an_on_demand_model_that_does_not_come_up_is_answered_not_ready() {
    let later = llmgw_domain::catalog::Model::named("later");
    assert_eq!(later.scaling.min, 0, "started on demand");
    let gw = llmgw_gateway::Gateway::new(
        GatewayConfig {
            on_demand_wait: Duration::from_millis(300),
            ..GatewayConfig::default()
        },
        None,
    )
    .unwrap();
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let told = asked.clone();
    gw.on_demand(llmgw_gateway::DemandHook(Box::new(move |m| {
        told.lock().unwrap().push(m.to_owned())
    })));
    gw.apply_router_view(&support::router_view(vec![later], &[]));
    let gw = support::serve(gw).await;
    let r = gw.chat(&chat("later", false, 1)).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "10");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_ready", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("router.on_demand_wait"),
        "{body}"
    );
    assert_eq!(*asked.lock().unwrap(), vec!["later".to_string()]);
}

/// A plain request whose client leaves while the engine works pays for
/// its prompt, as a stream's does (the engine did that work), and is
/// counted as given up (499).
#[tokio::test]
async fn a_plain_request_the_client_leaves_pays_for_its_prompt() {
    let engine = sim(llmgw_sim::SimConfig {
        tokens_per_s: 5,
        ..support::sim_config()
    })
    .await;
    let (gw, mut rx) = support::recording_one(&engine).await;
    let asked = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.base))
        .json(&chat("m", false, 1000))
        .send();
    let asked = tokio::spawn(asked);
    tokio::time::timeout(Duration::from_secs(10), async {
        while metric(&engine, "vllm:num_requests_running").await < 1.0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the engine took the request");
    asked.abort();
    let record = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a usage record in time")
        .expect("a usage record");
    assert!(
        record.prompt_tokens > 0 && record.completion_tokens == 0 && record.status == 499,
        "{record:?}"
    );
    let page = gw.admin_page().await;
    assert!(
        page.contains("llmgw_requests_total{model=\"m\",status=\"499\"} 1"),
        "{page}"
    );
    // And the engine was told: its request was cancelled.
    tokio::time::timeout(Duration::from_secs(10), async {
        while metric(&engine, "vllm:num_requests_running").await > 0.0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the engine stopped generating");
}

#[tokio::test]
async fn usage_records_reach_the_event_log_through_the_batcher() {
    use llmgw_eventstore::EventStore;
    let (store, _scratch) = support::sqlite_log().await;
    let (queue, rx) = llmgw_gateway::usage::UsageQueue::new(64);
    tokio::spawn(llmgw_gateway::usage::run_batcher(
        store.clone(),
        "gw-test".into(),
        rx,
        500,
        Duration::from_millis(50),
    ));
    let engine = sim(support::sim_config()).await;
    let gw = support::gateway_recording(
        GatewayConfig {
            endpoints: vec![spec("a", &engine, &["m"])],
            default_price: llmgw_domain::catalog::Price {
                prompt_per_1k: 1000,
                completion_per_1k: 1000,
            },
            ..GatewayConfig::default()
        },
        Some(queue),
    )
    .await;
    for stream in [true, false, true] {
        gw.chat(&chat("m", stream, 3)).await.text().await.unwrap();
    }
    let mut sub = store.subscribe(0);
    let mut usage = Vec::new();
    while usage.len() < 3 {
        let e = tokio::time::timeout(Duration::from_secs(20), sub.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(e.event_type, "UsageBatchRecorded");
        assert_eq!(e.stream_id, "usage-batches-gw-test");
        assert_eq!(e.metadata["writer"], "gw-test", "appended as an observer");
        usage.extend(support::usage_rows(&e));
    }
    for u in &usage {
        assert_eq!(
            (
                u["model_served"].as_str(),
                u["completion_tokens"].as_u64(),
                u["status"].as_u64()
            ),
            (Some("m"), Some(3), Some(200))
        );
        assert!(
            u["prompt_tokens"].as_u64().unwrap() > 0 && u["cost_micros"].as_u64().unwrap() > 0,
            "{u}"
        );
    }
}

/// The connection breaks around a usage append's commit: the append took
/// effect but the batcher never heard. It tries again with the same event
/// id (one per flush's batch), the store recognises the batch, and every
/// record is in the log once.
#[tokio::test]
async fn a_usage_batch_whose_commit_went_unanswered_is_in_the_log_once() {
    use llmgw_eventstore::{AnyStore, EventStore, OpenOptions, StoreAddress};
    let db = llmgw_testkit::TestDb::create().await;
    let direct = AnyStore::open(
        &StoreAddress::parse(&db.url).unwrap(),
        OpenOptions::migrating(),
    )
    .await
    .unwrap();
    let relay = llmgw_testkit::Relay::to_postgres(&db.url).await;
    let store = AnyStore::open(
        &StoreAddress::parse(&relay.url(&db.url)).unwrap(),
        OpenOptions::default(),
    )
    .await
    .unwrap();
    relay.lose_reply(b"UsageBatchRecorded", b"COMMIT");
    let (queue, rx) = llmgw_gateway::usage::UsageQueue::new(64);
    tokio::spawn(llmgw_gateway::usage::run_batcher(
        store,
        "gw-test".into(),
        rx,
        500,
        Duration::from_millis(50),
    ));
    let records = 10;
    let budget = llmgw_domain::tenancy::BudgetLevel {
        scope: llmgw_domain::tenancy::Scope::Key,
        scope_id: "k".into(),
        micros: 1_000_000,
        period: llmgw_domain::tenancy::Period::Day,
    };
    let key: llmgw_projections::KeyEntry = serde_json::from_value(serde_json::json!({
        "key_id": "k", "prefix": "llmgw-ab", "project_id": "p", "team_id": null,
        "org_id": null, "band": "gold", "routing_profile": null,
        "limits": {"rpm": null, "tpm": null, "budgets": [budget], "models": {"kind": "all"}},
    }))
    .unwrap();
    let key = std::sync::Arc::new(key);
    // 8 tokens at one micro-unit a token each.
    let spending = || llmgw_gateway::usage::Spending::of(&key, 8, 0);
    for i in 0..records {
        queue.record_spending(
            llmgw_domain::usage::FinishedRequest {
                prompt_tokens: 3,
                completion_tokens: 5,
                ttft_ms: Some(2),
                at: llmgw_domain::UnixMillis(0),
                price: llmgw_domain::catalog::Price {
                    prompt_per_1k: 1000,
                    completion_per_1k: 1000,
                },
                ..finished(format!("r{i}"), "k".into(), 10)
            },
            spending(),
        );
    }
    // Until the views hold them, the records count in this gateway's
    // budget checks.
    let total = 8 * records as u64;
    assert_eq!(queue.unflushed().pending(None, &budget, 0), total);
    // Batches go one after another: once every record is in, the retry
    // of the first has been answered.
    let mut sub = direct.subscribe(0);
    let mut ids = Vec::new();
    let mut unique = std::collections::HashSet::new();
    while unique.len() < records {
        let e = tokio::time::timeout(Duration::from_secs(20), sub.next())
            .await
            .expect("every record reaches the log")
            .unwrap();
        for u in &support::usage_rows(&e) {
            let id = u["request_id"].as_str().unwrap().to_owned();
            unique.insert(id.clone());
            ids.push(id);
        }
    }
    assert_eq!(relay.replies_lost(), 1, "a commit's answer was lost");
    assert_eq!(ids.len(), records, "a record was appended twice: {ids:?}");
    assert_eq!(queue.dropped(), 0);
    // Once the views hold the log, the spend counts there and only there.
    let mut views = llmgw_projections::Projections::default();
    for e in direct.read_all(0, 1000).await.unwrap() {
        views.apply(&e);
    }
    let held = views
        .usage
        .spend_of(budget.scope, "k")
        .in_period(budget.period, 0);
    let mark = views.usage.flushed("gw-test");
    let own = queue.unflushed().pending(mark, &budget, 0);
    assert_eq!((held, own), (total, 0));
}

/// The batcher is woken by a full batch, not by every record: a batch
/// that fills while it waits for an hour-long tick lands at once, and
/// the rest when the queue closes.
#[tokio::test]
async fn a_full_batch_lands_without_waiting_for_the_tick() {
    use llmgw_eventstore::EventStore;
    let (store, _scratch) = support::sqlite_log().await;
    let (queue, rx) = llmgw_gateway::usage::UsageQueue::new(1000);
    let batcher = tokio::spawn(llmgw_gateway::usage::run_batcher(
        store.clone(),
        "gw-test".into(),
        rx,
        100,
        Duration::from_secs(3600),
    ));
    let record = |i: u64| queue.record(finished(format!("r{i}"), "k".into(), 1));
    let mut sub = store.subscribe(0);
    let rows = |e: &llmgw_eventstore::RecordedEvent| support::usage_rows(e).len();
    // On this one-thread runtime, one yield runs the batcher until it
    // waits: its first turn found nothing queued, and its first tick is
    // an hour away.
    tokio::task::yield_now().await;
    for i in 0..100 {
        record(i);
    }
    let first = tokio::time::timeout(Duration::from_secs(30), sub.next())
        .await
        .expect("a full batch lands before the hour-long tick")
        .unwrap();
    assert_eq!(rows(&first), 100);
    for i in 100..130 {
        record(i);
    }
    drop(queue);
    batcher.await.unwrap();
    let rest = sub.next().await.unwrap();
    assert_eq!(rows(&rest), 30, "what was left went when the queue closed");
    assert_eq!(store.head().await.unwrap().0, 2);
}

/// A queue no bigger than a batch wakes the batcher at half full, so
/// that records arriving meanwhile are not dropped as a full queue.
#[tokio::test]
async fn a_queue_smaller_than_a_batch_flushes_at_half_full() {
    use llmgw_eventstore::EventStore;
    let (store, _scratch) = support::sqlite_log().await;
    let (queue, rx) = llmgw_gateway::usage::UsageQueue::new(10);
    tokio::spawn(llmgw_gateway::usage::run_batcher(
        store.clone(),
        "gw-test".into(),
        rx,
        500,
        Duration::from_secs(3600),
    ));
    let mut sub = store.subscribe(0);
    tokio::task::yield_now().await;
    for i in 0..5 {
        queue.record(finished(format!("r{i}"), "k".into(), 1));
    }
    let first = tokio::time::timeout(Duration::from_secs(30), sub.next())
        .await
        .expect("half a queue lands before the hour-long tick")
        .unwrap();
    assert_eq!(support::usage_rows(&first).len(), 5);
    assert_eq!(queue.dropped(), 0);
}

/// A thousand and two hundred requests in a batcher of 500 are three
/// events, one per flush, and the views read from them hold the same
/// totals as the requests.
#[tokio::test]
async fn usage_is_one_event_per_flush_carrying_its_rows() {
    use llmgw_eventstore::EventStore;
    let (store, _scratch) = support::sqlite_log().await;
    let requests = 1200u64;
    let (queue, rx) = llmgw_gateway::usage::UsageQueue::new(requests as usize);
    for i in 0..requests {
        queue.record(llmgw_domain::usage::FinishedRequest {
            prompt_tokens: i,
            completion_tokens: 2,
            price: llmgw_domain::catalog::Price {
                prompt_per_1k: 1000,
                completion_per_1k: 1000,
            },
            ..finished(format!("r{i}"), format!("k{}", i % 3), 10)
        });
    }
    // Everything is queued before the batcher starts and the interval is
    // an hour: only full batches go, and the rest when the queue closes.
    let batcher = tokio::spawn(llmgw_gateway::usage::run_batcher(
        store.clone(),
        "gw-test".into(),
        rx,
        500,
        Duration::from_secs(3600),
    ));
    drop(queue);
    batcher.await.unwrap();
    let events = store.read_all(0, 100).await.unwrap();
    let sizes: Vec<usize> = events
        .iter()
        .map(|e| {
            assert_eq!(e.event_type, "UsageBatchRecorded");
            support::usage_rows(e).len()
        })
        .collect();
    assert_eq!(sizes, [500, 500, 200]);
    let mut views = llmgw_projections::Projections::default();
    for e in &events {
        views.apply(e);
    }
    let usage = views
        .usage
        .spend_of(llmgw_domain::tenancy::Scope::Project, "p");
    let tokens: u64 = (0..requests).map(|i| i + 2).sum();
    assert_eq!(
        (usage.requests, usage.total_tokens, usage.total_micros),
        (requests, tokens, tokens),
        "one micro-unit a token at 1000 per 1k"
    );
}

#[tokio::test]
async fn scraped_engine_load_steers_requests_and_stale_figures_are_routed_around() {
    // Engine a is busy with work the gateway did not send (another gateway's).
    let busy = llmgw_sim::SimConfig {
        slots: 1,
        tokens_per_s: 2,
        ..support::sim_config()
    };
    let (a, b) = (sim(busy).await, sim(support::sim_config()).await);
    let backlog = support::backlog(&a, 3, 2.0).await;
    let gw = gateway(vec![spec("a", &a, &["m"]), spec("b", &b, &["m"])]).await;
    llmgw_gateway::scrape::scrape_once(&gw.gateway).await;
    let before = metric(&b, "vllm:prefix_cache_queries_total").await;
    for _ in 0..3 {
        let r = gw.chat(&chat("m", false, 1)).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(
        metric(&b, "vllm:prefix_cache_queries_total").await - before,
        3.0,
        "all went to the idle engine"
    );
    let page = gw.admin_page().await;
    assert!(
        page.lines()
            .any(|l| l.starts_with("llmgw_endpoint_waiting{endpoint=\"a\"} 2")),
        "{page}"
    );
    for t in backlog {
        t.abort();
    }

    // An endpoint whose figures break its vocabulary has none to route by:
    // after its first scrape it is stale and routed around.
    let c = sim(support::sim_config()).await;
    let d = sim(support::sim_config()).await;
    let wrong = EndpointSpec {
        engine: "sglang".parse().unwrap(),
        ..spec("c", &c, &["m"])
    };
    let gw = support::gateway_with(GatewayConfig {
        endpoints: vec![wrong, spec("d", &d, &["m"])],
        ..GatewayConfig::default()
    })
    .await;
    llmgw_gateway::scrape::scrape_once(&gw.gateway).await;
    let before = metric(&c, "vllm:prefix_cache_queries_total").await;
    for _ in 0..3 {
        gw.chat(&chat("m", false, 1)).await;
    }
    assert_eq!(
        metric(&c, "vllm:prefix_cache_queries_total").await,
        before,
        "the stale endpoint got nothing"
    );
    let page = gw.admin_page().await;
    assert!(
        page.contains("llmgw_endpoint_metrics_stale{endpoint=\"c\"} 1"),
        "{page}"
    );
    assert!(
        page.contains("llmgw_endpoint_metrics_stale{endpoint=\"d\"} 0"),
        "{page}"
    );
}

#[tokio::test]
async fn a_shared_prefix_reaches_each_replica_and_a_conversation_keeps_to_its_own_until_the_guard_trips()
 {
    let slow = llmgw_sim::SimConfig {
        tokens_per_s: 2,
        slots: 32,
        ..support::sim_config()
    };
    let (a, b) = (sim(slow.clone()).await, sim(slow).await);
    let gw = gateway(vec![spec("a", &a, &["m"]), spec("b", &b, &["m"])]).await;
    let system = "You are a careful assistant. ".repeat(24);
    let first = format!(
        "{} my printer jams on the second page",
        "I have a question. ".repeat(8)
    );
    let turn = |messages: Value| json!({"model": "m", "stream": true, "max_tokens": 50, "messages": messages});
    let conversation = turn(json!([{"role": "system", "content": system},
        {"role": "user", "content": first}]));
    let other_user = turn(json!([{"role": "system", "content": system},
        {"role": "user", "content": "how do I reset it?"}]));
    let next_turn = turn(json!([{"role": "system", "content": system},
        {"role": "user", "content": first},
        {"role": "assistant", "content": "Clean the rollers."},
        {"role": "user", "content": "it still jams"}]));
    let mut open = Vec::new();
    let mut send = async |body: &Value| {
        // Headers back means the gateway has chosen and counted it.
        open.push(gw.chat(body).await);
    };
    // The conversation's first turn: a miss, to a. Another user's
    // question shares the system prompt with it, but b was sent nothing
    // yet: b gets it, and holds the system prompt too from then on.
    send(&conversation).await;
    send(&other_user).await;
    // The conversation's next turns go to a, which holds more of it than
    // b does, until a is over both thresholds: at 10 against 2 (10 - 1 >
    // 8 and 10 > 1.5 x 1) the tenth goes to b.
    for _ in 0..10 {
        send(&next_turn).await;
    }
    let page = gw.admin_page().await;
    let has = |line: &str| page.lines().any(|l| l == line);
    assert!(has("llmgw_endpoint_in_flight{endpoint=\"a\"} 10"), "{page}");
    assert!(has("llmgw_endpoint_in_flight{endpoint=\"b\"} 2"), "{page}");
    for (decision, n) in [
        ("cache_miss_min_load", 1),
        ("prefix_cold", 1),
        ("prefix_hit", 9),
        ("load_balance_override", 1),
    ] {
        assert!(
            has(&format!(
                "llmgw_prefix_decisions_total{{decision=\"{decision}\"}} {n}"
            )),
            "{decision}: {page}"
        );
    }
    // b now holds the conversation too, and is the less loaded.
    send(&next_turn).await;
    let page = gw.admin_page().await;
    assert!(
        page.lines()
            .any(|l| l == "llmgw_endpoint_in_flight{endpoint=\"b\"} 3"),
        "{page}"
    );
    drop(open);
}

#[tokio::test]
async fn a_session_id_keeps_a_conversation_on_one_replica() {
    let slow = llmgw_sim::SimConfig {
        tokens_per_s: 2,
        ..support::sim_config()
    };
    let (a, b) = (sim(slow.clone()).await, sim(slow).await);
    // The header is configurable.
    let gw = support::gateway_with(GatewayConfig {
        endpoints: vec![spec("a", &a, &["m"]), spec("b", &b, &["m"])],
        session_header: "x-conversation".into(),
        ..GatewayConfig::default()
    })
    .await;
    let client = reqwest::Client::new();
    let send = |session: &'static str| {
        client
            .post(format!("{}/v1/chat/completions", gw.base))
            .header("x-conversation", session)
            .json(&chat("m", true, 50))
            .send()
    };
    let mut open = vec![send("s1").await.unwrap()];
    // a has one in flight, b none: without the session this would go to b.
    open.push(send("s1").await.unwrap());
    open.push(send("s2").await.unwrap());
    let page = gw.admin_page().await;
    assert!(
        page.lines()
            .any(|l| l == "llmgw_endpoint_in_flight{endpoint=\"a\"} 2"),
        "{page}"
    );
    assert!(
        page.lines()
            .any(|l| l == "llmgw_prefix_decisions_total{decision=\"session\"} 1"),
        "{page}"
    );
    drop(open);
}

#[tokio::test]
async fn admission_holds_the_lowest_band_first_and_refuses_with_retry_after() {
    // One slot: the backlog below keeps three requests waiting in the engine.
    let busy = llmgw_sim::SimConfig {
        slots: 1,
        tokens_per_s: 2,
        ..support::sim_config()
    };
    let engine = sim(busy).await;
    let backlog = support::backlog(&engine, 4, 3.0).await;
    let gw = support::gateway_with(GatewayConfig {
        endpoints: vec![spec("a", &engine, &["m"])],
        // Three waiting against a ceiling of four: saturation 0.75.
        admission: llmgw_gateway::admission::AdmissionConfig {
            waiting_ceiling: 4.0,
            max_wait: Duration::from_millis(200),
            ..Default::default()
        },
        ..GatewayConfig::default()
    })
    .await;
    llmgw_gateway::scrape::scrape_once(&gw.gateway).await;
    let client = reqwest::Client::new();
    let send = |band: &'static str| {
        client
            .post(format!("{}/v1/chat/completions", gw.base))
            .header("x-llmgw-band", band)
            .json(&chat("m", true, 1))
            .send()
    };
    let page = gw.admin_page().await;
    assert!(
        page.lines()
            .any(|l| l.starts_with("llmgw_pool_saturation{model=\"m\"} 0.75")),
        "{page}"
    );
    let bronze = send("bronze").await.unwrap();
    assert_eq!(
        bronze.status(),
        429,
        "bronze waits at 0.75, then is refused"
    );
    assert_eq!(bronze.headers()["retry-after"], "1");
    let body: Value = bronze.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
    assert_eq!(send("diamond").await.unwrap().status(), 400);
    // Silver (0.85) and gold (1.0) are admitted at 0.75: the gateway sends
    // them on (they then queue in the engine, behind the backlog).
    let admitted: Vec<_> = ["silver", "gold"]
        .into_iter()
        .map(|b| tokio::spawn(send(b)))
        .collect();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let page = gw.admin_page().await;
            if page
                .lines()
                .any(|l| l == "llmgw_endpoint_in_flight{endpoint=\"a\"} 2")
            {
                assert!(
                    page.lines()
                        .any(|l| l == "llmgw_admission_rejected_total{band=\"bronze\"} 1"),
                    "{page}"
                );
                assert!(
                    !page.contains("band=\"silver\"") && !page.contains("band=\"gold\""),
                    "{page}"
                );
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("silver and gold were sent on");
    for t in admitted {
        t.abort();
    }
    for t in backlog {
        t.abort();
    }
}

#[tokio::test]
async fn a_model_without_capacity_falls_back_and_says_so() {
    let small = sim(llmgw_sim::SimConfig {
        models: vec!["small".into()],
        ..support::sim_config()
    })
    .await;
    let failing = support::failing_engine().await;
    let gw = support::gateway_with(GatewayConfig {
        endpoints: vec![
            spec("big-1", &failing, &["big"]),
            spec("small-1", &small, &["small"]),
        ],
        fallbacks: [(
            "big".to_string(),
            vec!["missing".to_string(), "small".to_string()],
        )]
        .into(),
        ..GatewayConfig::default()
    })
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.base);
    // A failing endpoint is a failure, not a lack of capacity: no
    // fallback; the client is told what the engine said.
    for n in 1..=3 {
        let r = client
            .post(&url)
            .json(&chat("big", false, n))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 500);
        let said: Value = r.json().await.unwrap();
        assert_eq!(said["error"]["code"], "engine_error", "{said}");
        assert!(
            said["error"]["message"]
                .as_str()
                .unwrap()
                .contains("engine crashed"),
            "{said}"
        );
    }
    // Its breaker is open now: no capacity, so the fallback serves.
    let r = client
        .post(&url)
        .json(&chat("big", false, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-llmgw-served-model"], "small");
    let reply: Value = r.json().await.unwrap();
    assert_eq!(
        reply["model"], "small",
        "the engine was asked for the fallback by name"
    );
}

/// An engine that fails one kind of request (500 for a prompt saying
/// POISON), says it is full (503, Retry-After 7) for one saying BUSY, and
/// that it does not do what one saying UNSUPPORTED asks (501, as
/// llama.cpp answers embeddings it was not started for).
async fn picky_engine() -> std::net::SocketAddr {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            axum::routing::post(|body: String| async move {
                if body.contains("POISON") {
                    (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        axum::Json(json!({"error": {"message": "cannot tokenize this"}})),
                    )
                        .into_response()
                } else if body.contains("UNSUPPORTED") {
                    (
                        StatusCode::NOT_IMPLEMENTED,
                        axum::Json(json!({"error": {"message": "This server does not support embeddings"}})),
                    )
                        .into_response()
                } else if body.contains("BUSY") {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [("retry-after", "7")],
                        axum::Json(json!({"error": {"message": "queue_full"}})),
                    )
                        .into_response()
                } else {
                    axum::Json(json!({"id": "c", "object": "chat.completion", "model": "m",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}))
                    .into_response()
                }
            }),
        )
        .route("/metrics", axum::routing::get(|| async { "" }));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

#[tokio::test]
async fn one_clients_bad_request_retried_does_not_take_the_model_from_everyone() {
    let engine = picky_engine().await;
    let gw = support::gateway_with(GatewayConfig {
        endpoints: vec![spec("a", &engine, &["m"]), spec("b", &engine, &["m"])],
        ..GatewayConfig::default()
    })
    .await;
    let client = reqwest::Client::new();
    let ask = |say: &str| {
        client
            .post(format!("{}/v1/chat/completions", gw.base))
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": say}]}))
            .send()
    };
    // The same bad request, as a client's SDK retries it: the engine's
    // own error each time, and its breakers stay closed.
    for _ in 0..5 {
        let r = ask("POISON").await.unwrap();
        assert_eq!(r.status(), 500);
        let said: Value = r.json().await.unwrap();
        assert!(
            said["error"]["message"]
                .as_str()
                .unwrap()
                .ends_with("cannot tokenize this"),
            "{said}"
        );
    }
    assert_eq!(ask("hello").await.unwrap().status(), 200);
    // What the engine does not do, asked by any number of different
    // requests: a final 400, and no breaker opens (three took the model
    // from everyone for the cool-down).
    for n in 0..6 {
        let r = ask(&format!("UNSUPPORTED {n}")).await.unwrap();
        assert_eq!(r.status(), 400);
        assert_eq!(r.headers()["x-should-retry"], "false");
        let said: Value = r.json().await.unwrap();
        assert!(
            said["error"]["message"]
                .as_str()
                .unwrap()
                .contains("does not support embeddings"),
            "{said}"
        );
    }
    assert_eq!(ask("hello").await.unwrap().status(), 200);
    // A full engine is said so, with its own time to come back.
    for _ in 0..4 {
        let r = ask("BUSY").await.unwrap();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "7");
        let said: Value = r.json().await.unwrap();
        assert_eq!(said["error"]["code"], "engine_busy", "{said}");
    }
    assert_eq!(ask("hello").await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_listed_origins_page_may_call_the_api_from_a_browser() {
    let engine = picky_engine().await;
    let with = |origins: &[&str]| {
        support::gateway_with(GatewayConfig {
            endpoints: vec![spec("a", &engine, &["m"])],
            cors_origins: origins.iter().map(|o| (*o).to_owned()).collect(),
            ..GatewayConfig::default()
        })
    };
    let client = reqwest::Client::new();
    let app = "https://app.example.com";
    let preflight = |base: &str, origin: &str| {
        client
            .request(
                reqwest::Method::OPTIONS,
                format!("{base}/v1/chat/completions"),
            )
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .send()
    };
    let post = |base: &str, origin: &str| {
        client
            .post(format!("{base}/v1/chat/completions"))
            .header("origin", origin)
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };

    let listed = with(&[app]).await;
    let r = preflight(&listed.base, app).await.unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(r.headers()["access-control-allow-origin"], app);
    assert_eq!(
        r.headers()["access-control-allow-headers"],
        "authorization, content-type"
    );
    assert!(
        r.headers()
            .get("access-control-allow-credentials")
            .is_none()
    );
    let r = post(&listed.base, app).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], app);
    assert_eq!(r.headers()["vary"], "origin");
    // Its script may read what a client decides on: when to come back
    // and whether to at all (a spent budget's x-should-retry: false).
    let exposed = r.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap();
    for h in [
        "retry-after",
        "x-should-retry",
        "x-ratelimit-remaining-tokens",
    ] {
        assert!(exposed.split(", ").any(|e| e == h), "{h}: {exposed}");
    }
    // Another origin is not told it may read: the browser keeps the answer
    // from its page.
    let r = preflight(&listed.base, "https://evil.example")
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert!(r.headers().get("access-control-allow-origin").is_none());

    let any = with(&["*"]).await;
    let r = post(&any.base, "https://anywhere.example").await.unwrap();
    assert_eq!(r.headers()["access-control-allow-origin"], "*");

    // Off (the default): no header, and a preflight is a method the API
    // does not take.
    let off = with(&[]).await;
    let r = preflight(&off.base, app).await.unwrap();
    assert_eq!(r.status(), 405);
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

/// With keys off, a page on any site the person opens could make their
/// browser run generations here: a `text/plain` or form post needs no
/// preflight. A request whose `Origin` `router.cors_origins` does not name
/// is refused on every API path, in the API's envelope, before the engine
/// sees it; a rebound name (the page's origin is this server's host) too.
/// Clients that send no `Origin` (SDKs, curl) and listed origins are
/// served.
#[tokio::test]
async fn a_page_on_a_foreign_origin_is_refused_on_the_api() {
    let engine = sim(support::sim_config()).await;
    let app = "https://app.example.com";
    let gw = support::gateway_with(GatewayConfig {
        endpoints: vec![spec("a", &engine, &["m"])],
        cors_origins: vec![app.to_owned()],
        ..GatewayConfig::default()
    })
    .await;
    let own = gw.base.clone();
    let client = reqwest::Client::new();
    let post = |path: &str, origin: Option<&str>| {
        let body = json!({"model": "m", "max_tokens": 1, "input": "hi",
            "messages": [{"role": "user", "content": "hi"}]});
        let r = client
            .post(format!("{}{path}", gw.base))
            .header("content-type", "text/plain")
            .body(body.to_string());
        match origin {
            Some(o) => r.header("origin", o),
            None => r,
        }
        .send()
    };
    let served = || metric(&engine, "vllm:prompt_tokens_total");
    for origin in ["https://evil.example", own.as_str(), "null"] {
        for path in ["/v1/chat/completions", "/v1/responses", "/v1/embeddings"] {
            let r = post(path, Some(origin)).await.unwrap();
            assert_eq!(r.status(), 403, "{origin} {path}");
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "origin_refused", "{body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("{origin:?}")),
                "{body}"
            );
        }
        let r = client
            .get(format!("{}/v1/models", gw.base))
            .header("origin", origin)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{origin}");
    }
    assert_eq!(served().await, 0.0, "no refused request reached the engine");
    assert_eq!(
        post("/v1/chat/completions", None).await.unwrap().status(),
        200
    );
    let r = post("/v1/chat/completions", Some(app)).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], app);
    assert!(served().await > 0.0);
}

#[tokio::test]
async fn the_router_view_supplies_endpoints_and_aliases_and_an_update_keeps_live_state() {
    use llmgw_domain::Event;
    use llmgw_domain::catalog::{CatalogEvent, Engine, Model, Profile};
    use llmgw_domain::nodes::{Inventory, NodeEvent};
    use llmgw_domain::replicas::{Placement, ReplicaEvent, ShardPlacement};
    use llmgw_projections::{RouterView, Stamp, View};

    let slow = llmgw_sim::SimConfig {
        models: vec!["llama".into()],
        vocabulary: llmgw_sim::Vocabulary::Sim,
        tokens_per_s: 5,
        ..support::sim_config()
    };
    let (first, second) = (sim(slow.clone()).await, sim(slow).await);
    let mut view = RouterView::default();
    fn apply(view: &mut RouterView, e: Event) {
        view.apply_event(
            Stamp {
                position: 0,
                recorded_at_ms: 0,
            },
            &e,
        );
    }
    let mut model = Model::named("llama");
    model.aliases = vec!["llama-latest".into()];
    model.profiles.push(Profile::cpu("sim", Engine::Sim));
    apply(
        &mut view,
        Event::Catalog(CatalogEvent::ModelAdded {
            model: model.clone(),
        }),
    );
    apply(
        &mut view,
        Event::Node(NodeEvent::NodeRegistered {
            node_id: "n1".into(),
            inventory: Inventory {
                hostname: "n1".into(),
                mgmt_addr: "127.0.0.1".into(),
                ..Inventory::default()
            },
        }),
    );
    let place = |id: &str, port: u16| Placement {
        replica_id: id.into(),
        model: "llama".into(),
        profile: "sim".into(),
        profile_fp: model.profiles[0].fingerprint(),
        pool: "cpu".into(),
        fabric: None,
        shards: vec![ShardPlacement {
            shard_id: format!("{id}-0").into(),
            rank: 0,
            node_id: "n1".into(),
            gpu_indices: vec![],
            hcas: vec![],
            port,
            memory_mb: 0,
        }],
        why: "test".into(),
    };
    apply(
        &mut view,
        Event::Replica(ReplicaEvent::ReplicaPlaced(place("r1", first.port()))),
    );
    apply(
        &mut view,
        Event::Replica(ReplicaEvent::ReplicaReady {
            replica_id: "r1".into(),
        }),
    );

    let gw = gateway(vec![]).await;
    gw.gateway.apply_router_view(&view);
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.base);
    // Asked by alias: routed, and answered, as the canonical model.
    let held = client
        .post(&url)
        .json(&chat("llama-latest", true, 50))
        .send()
        .await
        .unwrap();
    assert_eq!(held.headers()["x-llmgw-served-model"], "llama");

    // A second replica becomes ready; the view's update keeps r1's count.
    apply(
        &mut view,
        Event::Replica(ReplicaEvent::ReplicaPlaced(place("r2", second.port()))),
    );
    apply(
        &mut view,
        Event::Replica(ReplicaEvent::ReplicaReady {
            replica_id: "r2".into(),
        }),
    );
    gw.gateway.apply_router_view(&view);
    let live = gw.gateway.endpoints.snapshot();
    let r1 = live.iter().find(|e| e.spec.id == "r1").unwrap();
    assert_eq!((live.len(), r1.in_flight()), (2, 1));
    assert_eq!(r1.spec.engine, llmgw_gateway::scrape::EngineKind::Sim);
    // So the next request goes to the new replica.
    let before = metric(&second, "llmgw_sim_prefix_queries_total").await;
    let r = client
        .post(&url)
        .json(&chat("llama", false, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(metric(&second, "llmgw_sim_prefix_queries_total").await > before);
    drop(held);
}

/// A response repeats the settings it was made with, as OpenAI's does:
/// `top_logprobs` (was always 0), `prompt_cache_key` and
/// `safety_identifier` (were left out), whole and streamed.
#[tokio::test]
async fn a_response_repeats_its_top_logprobs_and_cache_key() {
    let engine = sim(support::sim_config()).await;
    let gw = gateway(vec![spec("a", &engine, &["m"])]).await;
    let ask = |stream: bool| {
        reqwest::Client::new()
            .post(format!("{}/v1/responses", gw.base))
            .json(
                &json!({"model": "m", "input": "tell me a story", "max_output_tokens": 3,
                "top_logprobs": 2, "include": ["message.output_text.logprobs"],
                "prompt_cache_key": "session-7", "safety_identifier": "user-9",
                "stream": stream}),
            )
            .send()
    };
    let answer: Value = ask(false).await.unwrap().json().await.unwrap();
    let said = |r: &Value| {
        (
            r["top_logprobs"].clone(),
            r["prompt_cache_key"].clone(),
            r["safety_identifier"].clone(),
        )
    };
    let want = (json!(2), json!("session-7"), json!("user-9"));
    assert_eq!(said(&answer), want, "{answer}");
    let text = ask(true).await.unwrap().text().await.unwrap();
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    let data: Value = serde_json::from_str(last.split_once("data: ").unwrap().1).unwrap();
    assert_eq!(said(&data["response"]), want, "{last}");
}

/// A finished request of one prompt and one completion token for
/// project p, served by m.
fn finished(
    request_id: String,
    key_id: String,
    latency_ms: u32,
) -> llmgw_domain::usage::FinishedRequest {
    llmgw_domain::usage::FinishedRequest {
        request_id,
        key_id: key_id.into(),
        project_id: "p".into(),
        model_asked: "m".into(),
        model_served: "m".into(),
        prompt_tokens: 1,
        completion_tokens: 1,
        status: 200,
        latency_ms,
        ttft_ms: None,
        band: llmgw_domain::tenancy::Band::Gold,
        at: llmgw_domain::UnixMillis(1_780_000_000_000),
        price: llmgw_domain::catalog::Price::ZERO,
    }
}

/// A Responses API request is the chat completion it turns into: counted
/// with the engine's tokens, whole or streamed, and refused in the API's
/// one envelope.
#[tokio::test]
async fn a_response_is_counted_as_its_chat_completion() {
    let engine = sim(support::sim_config()).await;
    let (gw, mut rx) = support::recording_one(&engine).await;
    let ask = |body: Value| {
        reqwest::Client::new()
            .post(format!("{}/v1/responses", gw.base))
            .json(&body)
            .send()
    };
    let r = ask(json!({"model": "m", "input": "tell me a story", "max_output_tokens": 5}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["object"], "response");
    assert_eq!(answer["usage"]["output_tokens"], 5, "{answer}");
    let record = rx.recv().await.expect("a usage record");
    assert_eq!((record.completion_tokens, record.status), (5, 200));
    assert_eq!(
        answer["usage"]["input_tokens"].as_u64(),
        Some(record.prompt_tokens)
    );

    let r = ask(
        json!({"model": "m", "input": "tell me a story", "max_output_tokens": 3, "stream": true}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.starts_with("event: response.created\n"), "{text}");
    assert!(!text.contains("[DONE]"), "no chat frame leaks: {text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    assert!(last.starts_with("event: response.incomplete\n"), "{last}");
    let record = rx.recv().await.expect("a usage record");
    assert_eq!((record.completion_tokens, record.status), (3, 200));

    let r = ask(json!({"model": "nope", "input": "x"})).await.unwrap();
    assert_eq!(r.status(), 404);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "model_not_found");
    let r = ask(json!({"model": "m", "input": "x", "store": true}))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "store");
}

/// An endpoint that names the gateway's own address: the request that
/// comes back is refused with why (it was forwarded to itself until the
/// connections ran out), and the client hears it.
#[tokio::test]
async fn an_endpoint_that_is_the_gateway_itself_is_a_loop_said_not_followed() {
    let gw = support::gateway(vec![]).await;
    let own: std::net::SocketAddr = gw.base.trim_start_matches("http://").parse().unwrap();
    gw.gateway.endpoints.update(vec![spec("me", &own, &["m"])]);
    let r = gw.chat(&chat("m", false, 1)).await;
    assert_eq!(r.status(), 508);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "loop_detected", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("points back at the gateway itself"),
        "{e}"
    );
}
