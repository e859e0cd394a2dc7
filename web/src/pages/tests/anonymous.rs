//! A server without accounts: the pages anyone may see.

use axum::body::Body;
use axum::http::{Request, StatusCode, header};

use super::harness::{endpoint, engine, get, send, web};
use crate::{WebSettings, client_routes};

#[tokio::test]
async fn the_landing_page_says_how_to_connect_without_a_key() {
    let settings = WebSettings {
        notice: Some("Maintenance <b>Friday</b>".into()),
        contact: Some("platform@example.org".into()),
        ..WebSettings::default()
    };
    let app = client_routes(web(
        settings,
        vec![endpoint("http://127.0.0.1:9", "llama-8b")],
    ));
    let (status, html, headers) = get(&app, "/", "gw.example:8080").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("http://gw.example:8080/v1"), "{html}");
    assert!(html.contains("curl http://gw.example:8080/v1/chat/completions"));
    assert!(
        html.contains("&#34;model&#34;:&#34;llama-8b&#34;"),
        "{html}"
    );
    assert!(!html.contains("Authorization"), "no key needed: {html}");
    assert!(html.contains(r#"href="/v1/models""#) && html.contains(r#"href="/me""#));
    assert!(
        html.contains("Maintenance &#60;b&#62;Friday&#60;/b&#62;"),
        "{html}"
    );
    assert!(html.contains(r#"<a href="mailto:platform@example.org">platform@example.org</a>"#));
    let csp = headers
        .get(header::CONTENT_SECURITY_POLICY)
        .expect("csp")
        .to_str()
        .expect("ascii");
    assert!(csp.contains("script-src 'self'"));
}

#[tokio::test]
async fn a_stored_javascript_contact_is_only_text() {
    let settings = WebSettings {
        contact: Some("javascript:alert(1)".into()),
        base_url: Some("https://llm.example.org/".into()),
        ..WebSettings::default()
    };
    let app = client_routes(web(settings, Vec::new()));
    let (_, html, _) = get(&app, "/", "ignored").await;
    assert!(
        html.contains("Questions: javascript:alert(1)</p>"),
        "{html}"
    );
    assert!(!html.contains(r#"href="javascript"#));
    // The configured base URL wins over Host.
    assert!(html.contains("https://llm.example.org/v1"));
    assert!(!html.contains("ignored"));
}

#[tokio::test]
async fn with_accounts_on_the_curl_sends_a_key() {
    let settings = WebSettings {
        accounts: true,
        signup_open: true,
        ..WebSettings::default()
    };
    let app = client_routes(web(settings, Vec::new()));
    let (_, html, _) = get(&app, "/", "h").await;
    assert!(html.contains("Authorization: Bearer $LLMGW_KEY"), "{html}");
    assert!(html.contains(r#"href="/signup""#));
}

#[tokio::test]
async fn account_pages_do_not_exist_without_accounts() {
    let app = client_routes(web(WebSettings::default(), Vec::new()));
    for uri in ["/login", "/signup", "/profile", "/claim/abc"] {
        let (status, _, _) = get(&app, uri, "h").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{uri}");
    }
}

#[tokio::test]
async fn the_chat_script_is_served_as_a_file() {
    let app = client_routes(web(WebSettings::default(), Vec::new()));
    let (status, js, headers) = get(&app, "/static/chat.js", "h").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers.get(header::CONTENT_TYPE).expect("type"),
        "text/javascript; charset=utf-8"
    );
    assert!(js.contains("/chat/completions") && js.contains("textContent"));
    assert!(!js.contains("innerHTML"));
}

#[tokio::test]
async fn the_chat_page_lists_each_model_once_and_loads_its_script() {
    let endpoints = vec![
        endpoint("http://127.0.0.1:9", "llama-8b"),
        "e2=http://127.0.0.1:10=llama-8b,qwen-7b"
            .parse()
            .expect("endpoint"),
    ];
    let app = client_routes(web(WebSettings::default(), endpoints));
    let (status, html, _) = get(&app, "/chat", "h").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        html.matches(r#"<option value="llama-8b""#).count(),
        1,
        "{html}"
    );
    assert_eq!(
        html.matches(r#"<option value="qwen-7b""#).count(),
        1,
        "{html}"
    );
    assert!(html.contains(r#"<script src="/static/chat.js" defer></script>"#));
    assert!(html.contains(r#"data-max-tokens="512""#));
}

#[tokio::test]
async fn a_chat_turn_reaches_the_model_capped_at_512_tokens() {
    let (url, seen) = engine().await;
    let sent = seen.clone();
    let app = client_routes(web(
        WebSettings::default(),
        vec![endpoint(&url, "llama-8b")],
    ));
    let body = serde_json::json!({
        "model": "llama-8b",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4096,
    });
    let request = Request::post("/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    let (status, answer, _) = send(&app, request).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(answer.contains("\"hi\""), "{answer}");
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["max_tokens"], 512);
    assert_eq!(seen[0]["messages"][0]["content"], "hello");

    // An API client whose base URL lacks `/v1` (it sends a key, which the
    // page never does) is told where the API is, not answered capped.
    let request = Request::post("/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, "Bearer sk-anything")
        .body(Body::from(body.to_string()))
        .expect("request");
    let (status, answer, _) = send(&app, request).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    let v: serde_json::Value = serde_json::from_str(&answer).expect("json");
    assert_eq!(v["error"]["code"], "unknown_url", "{answer}");
    assert!(answer.contains("under /v1"), "{answer}");
    assert_eq!(sent.lock().expect("lock").len(), 1, "not sent to the model");
    // A proxy's Basic credentials, which the browser sends along, are not
    // a client's key.
    let request = Request::post("/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, "Basic dXNlcjpwYXNz")
        .body(Body::from(body.to_string()))
        .expect("request");
    let (status, answer, _) = send(&app, request).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// A turn is held to `router.body_limit`, as the API's requests are, and
/// one above it refused in the API's envelope, which the script shows
/// (the page took up to 2 MiB whatever the limit, and answered one above
/// in plain text).
#[tokio::test]
async fn a_chat_turn_is_held_to_the_body_limit() {
    let (url, seen) = engine().await;
    let gateway = llmgw_gateway::Gateway::new(
        llmgw_gateway::GatewayConfig {
            endpoints: vec![endpoint(&url, "llama-8b")],
            body_limit: 2_000,
            ..llmgw_gateway::GatewayConfig::default()
        },
        None,
    )
    .expect("gateway");
    let site = web(WebSettings::default(), Vec::new());
    let site = std::sync::Arc::new(crate::Web {
        gateway,
        settings: site.settings.clone(),
        views: site.views.clone(),
        store: None,
        people: None,
        admin: site.admin.clone(),
        decider: None,
        instance: site.instance.clone(),
    });
    let app = client_routes(site);
    let turn = |words: usize| {
        let body = serde_json::json!({
            "model": "llama-8b",
            "messages": [{"role": "user", "content": "word ".repeat(words)}],
        });
        Request::post("/chat/completions")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .expect("request")
    };
    let (status, answer, _) = send(&app, turn(200)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(seen.lock().expect("lock").len(), 1);
    let (status, answer, _) = send(&app, turn(600)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    let v: serde_json::Value = serde_json::from_str(&answer).expect("the API's envelope");
    assert!(v["error"]["message"].is_string(), "{answer}");
    assert_eq!(seen.lock().expect("lock").len(), 1, "not sent on");
}

#[tokio::test]
async fn a_chat_turn_that_is_not_json_is_refused_in_the_apis_envelope() {
    let app = client_routes(web(WebSettings::default(), Vec::new()));
    let request = Request::post("/chat/completions")
        .body(Body::from("nope"))
        .expect("request");
    let (status, answer, _) = send(&app, request).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let v: serde_json::Value = serde_json::from_str(&answer).expect("json");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("JSON")
    );
}

#[test]
fn curl_quotes_what_the_shell_would_split() {
    let curl = crate::pages::curl_example("http://h:1", Some("sk-abc"), "it's");
    assert_eq!(
        curl,
        "curl http://h:1/v1/chat/completions \\\n  -H \"Authorization: Bearer sk-abc\" \\\n  \
         -H 'content-type: application/json' \\\n  \
         -d '{\"messages\":[{\"content\":\"Hello!\",\"role\":\"user\"}],\"model\":\"it'\\''s\"}'"
    );
}

/// The curl example names a model that serves now: the first
/// alphabetically (here one that only starts on demand) made a first try
/// wait for a model to load, or fail.
#[tokio::test]
async fn the_example_names_a_model_that_serves() {
    use llmgw_domain::Event;
    use llmgw_domain::catalog::{CatalogEvent, Model};
    use llmgw_projections::{RouterView, Stamp, View};

    let web = web(
        WebSettings::default(),
        vec![endpoint("http://127.0.0.1:9", "zeta-8b")],
    );
    let mut model = Model::named("alpha-70b");
    model.profiles = vec![
        serde_json::from_value(serde_json::json!({"name": "p", "engine": "sim"})).expect("profile"),
    ];
    let mut view = RouterView::default();
    let stamp = Stamp {
        position: 1,
        recorded_at_ms: 0,
    };
    view.apply_event(stamp, &Event::Catalog(CatalogEvent::ModelAdded { model }));
    web.gateway.apply_router_view(&view);
    let app = client_routes(web);
    let (status, html, _) = get(&app, "/", "gw.example").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("alpha-70b"), "both are listed: {html}");
    assert!(html.contains("&#34;model&#34;:&#34;zeta-8b&#34;"), "{html}");
}
