//! Logs and traces as an operator meets them: a server left at its default
//! level writes JSON lines when asked, one access line per request with
//! the request's id, the id travels to the engine and back to the client,
//! and traces reach an OTLP collector when one is configured.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use serde_json::{Value, json};

use super::{Child, tiny_engine, until};

/// Variables of the developer's shell that would change what is tested.
const UNSET: [&str; 7] = [
    "RUST_LOG",
    "LLMGW_LOG_FORMAT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_SDK_DISABLED",
];

fn command(args: &[&str], env: &[(&str, String)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_llmgw"));
    for v in UNSET {
        c.env_remove(v);
    }
    c.args(args).envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    c
}

/// A process at its default log level (no RUST_LOG), lines on channels.
fn spawn(args: &[&str], env: &[(&str, String)]) -> Child {
    let mut process = command(args, env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = |r: Box<dyn std::io::Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(r).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        rx
    };
    let stdout = lines(Box::new(process.stdout.take().unwrap()));
    let stderr = lines(Box::new(process.stderr.take().unwrap()));
    Child {
        process,
        stdout,
        stderr,
    }
}

/// A router-only server in front of `engine`, at its default level.
fn server(engine: &Child, more: &[&str], env: &[(&str, String)]) -> (Child, String) {
    let endpoint = format!("e1=http://{}=tiny", engine.addr_after("listening on "));
    let mut args = vec![
        "server",
        "--endpoint",
        &endpoint,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(more);
    let server = spawn(&args, env);
    let base = format!("http://{}", server.addr_after("client listening on "));
    (server, base)
}

/// The next stderr line that mentions `needle`, parsed: every line of a
/// JSON-format server is one JSON object.
fn json_line(server: &Child, needle: &str) -> Value {
    let line = Child::expect(&server.stderr, needle);
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"))
}

/// The access line of request `id`.
fn access_line(server: &Child, id: &str) -> Value {
    let line = json_line(server, &format!("\"request_id\":\"{id}\""));
    if line["target"] == "llmgw::access" {
        return line;
    }
    access_line(server, id)
}

fn chat(stream: bool) -> Value {
    json!({"model": "tiny", "max_tokens": 4, "stream": stream,
           "messages": [{"role": "user", "content": "hello there"}]})
}

async fn send(base: &str, id: Option<&str>, body: &Value) -> (String, u16, String) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(body);
    if let Some(id) = id {
        request = request.header("x-request-id", id);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    let id = answer
        .headers()
        .get("x-request-id")
        .expect("every answer has a request id")
        .to_str()
        .unwrap()
        .to_owned();
    (id, status, answer.text().await.unwrap())
}

fn is_uuid(id: &str) -> bool {
    id.len() == 36 && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// An agent logging JSON says where its metrics listen as JSON too: one
/// plain line among JSON ones stopped a log shipper reading the journal.
#[test]
fn a_json_agent_says_where_its_metrics_listen_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let agent = Child::spawn(&[
        "--log-format",
        "json",
        "agent",
        "run",
        "--server",
        &server,
        "--node-id",
        "j1",
        "--skip-gpus",
        "--work-dir",
        dir.path().to_str().unwrap(),
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let said = Child::expect(&agent.stdout, "metrics listening on");
    let said: Value = serde_json::from_str(&said).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert!(
        said["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("metrics listening on 127.0.0.1:")),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_server_logs_one_access_line_per_request_under_its_id() {
    let engine = tiny_engine();
    let (server, base) = server(&engine, &["--log-format", "json"], &[]);
    // Daemons log at info by default: the start is in the journal.
    let start = json_line(&server, "serving");
    assert_eq!(start["level"], "INFO", "{start}");
    assert_eq!(start["fields"]["message"], "serving", "{start}");
    // A plain router keeps no log, and says so.
    assert_eq!(start["fields"]["store"], "none", "{start}");
    assert_eq!(
        start["fields"]["client"].as_str(),
        base.strip_prefix("http://"),
        "{start}"
    );
    assert!(start["timestamp"].is_string() && start["target"].is_string());
    // What it says on stdout (where it listens) is JSON too, for a
    // pipeline reading the journal's two streams.
    let said = Child::expect(&server.stdout, "admin listening on");
    let said: Value = serde_json::from_str(&said).unwrap_or_else(|e| panic!("{e}: {said}"));
    let admin = said["fields"]["message"]
        .as_str()
        .and_then(|m| m.strip_prefix("admin listening on "))
        .unwrap_or_else(|| panic!("{said}"))
        .to_owned();
    // The admin listener's root leads to its pages; a path it has not
    // (an SDK pointed at it) is told where things are, not an empty 404.
    let no_follow = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let root = no_follow
        .get(format!("http://{admin}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(root.headers()["location"], "/admin");
    let lost = reqwest::get(format!("http://{admin}/v1/models"))
        .await
        .unwrap();
    assert_eq!(lost.status(), 404);
    let said = lost.text().await.unwrap();
    assert!(
        said.contains("the OpenAI API is on the client listener"),
        "{said}"
    );
    // But `ctl` still reads a router without a store as router-only.
    let ctl = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["ctl", "status", "--admin", &format!("http://{admin}")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&ctl.stderr);
    assert!(
        !ctl.status.success() && err.contains("router-only"),
        "{err}"
    );

    // The client's id: returned, logged, and passed to the engine.
    let (id, status, _) = send(&base, Some("abc-123"), &chat(false)).await;
    assert_eq!((id.as_str(), status), ("abc-123", 200));
    let line = access_line(&server, "abc-123");
    let f = &line["fields"];
    assert_eq!(line["level"], "INFO");
    assert_eq!(
        (
            &f["model_asked"],
            &f["model_served"],
            &f["status"],
            &f["completion_tokens"],
            &f["stream"]
        ),
        (
            &json!("tiny"),
            &json!("tiny"),
            &json!(200),
            &json!(4),
            &json!(false)
        ),
        "{line}"
    );
    assert!(f["prompt_tokens"].as_u64().unwrap() > 0, "{line}");
    assert!(f["duration_ms"].as_f64().is_some(), "{line}");
    assert!(f.get("key_id").is_none(), "no key without auth: {line}");
    assert_eq!(line["span"]["name"], "request", "{line}");
    assert_eq!(line["span"]["request_id"], "abc-123", "{line}");
    // Who sent it: the connection's peer, in the line and its span.
    assert_eq!(f["client"], json!("127.0.0.1"), "{line}");
    assert_eq!(line["span"]["client"], json!("127.0.0.1"), "{line}");
    let received = Child::expect(&engine.stderr, "abc-123");
    assert!(received.contains("request received"), "{received}");

    // No id: one is made, and it is the one logged and sent on. A stream's
    // line comes when it ends, with its time to first token.
    let (made, status, body) = send(&base, None, &chat(true)).await;
    assert_eq!(status, 200);
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert!(is_uuid(&made), "{made}");
    let line = access_line(&server, &made);
    let f = &line["fields"];
    assert_eq!(
        (
            &f["status"],
            &f["stream"],
            &f["stream_end"],
            &f["completion_tokens"]
        ),
        (&json!(200), &json!(true), &json!("complete"), &json!(4)),
        "{line}"
    );
    assert!(f["ttft_ms"].as_f64().is_some(), "{line}");
    Child::expect(&engine.stderr, &made);

    // An id that could break a log line or is too long is replaced.
    for insane in ["tab\there".to_owned(), "a".repeat(129)] {
        let (id, status, _) = send(&base, Some(&insane), &chat(false)).await;
        assert_eq!(status, 200);
        assert!(is_uuid(&id), "{insane:?} replaced by {id}");
        assert_eq!(access_line(&server, &id)["fields"]["status"], 200);
        Child::expect(&engine.stderr, &id);
    }

    // A refusal has its id and its line too.
    // A stream refused was answered, not left by its client: no stream
    // end (it said client_gone).
    let nope = json!({"model": "nope", "stream": true});
    let (id, status, _) = send(&base, Some("lost-1"), &nope).await;
    assert_eq!((id.as_str(), status), ("lost-1", 404));
    let line = access_line(&server, "lost-1");
    assert_eq!(
        (
            &line["fields"]["status"],
            &line["fields"]["model_asked"],
            &line["fields"]["stream"]
        ),
        (&json!(404), &json!("nope"), &json!(true)),
        "{line}"
    );
    assert!(line["fields"].get("stream_end").is_none(), "{line}");
    // And /health, every few seconds from a balancer, writes nothing.
    let health = reqwest::get(format!("{base}/health")).await.unwrap();
    assert!(health.headers().contains_key("x-request-id"));
    // The pages and an unknown path answer with an id too, and leave a
    // plain line: method, path, status (a refused sign-in, a key refused
    // at /me or /mcp left nothing before).
    for (path, status) in [("/", 200), ("/no-such-page", 404)] {
        let r = reqwest::get(format!("{base}{path}")).await.unwrap();
        let id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
        let line = access_line(&server, &id);
        assert_eq!(
            (
                &line["fields"]["path"],
                &line["fields"]["status"],
                &line["fields"]["method"],
                &line["fields"]["client"]
            ),
            (
                &json!(path),
                &json!(status),
                &json!("GET"),
                &json!("127.0.0.1")
            ),
            "{line}"
        );
    }
    // The chat page's turn is named by the id its answer carries (the
    // page shows it to the person), in the inference line.
    let page = reqwest::Client::new()
        .post(format!("{base}/chat/completions"))
        .header("x-request-id", "page-1")
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["x-request-id"], "page-1");
    let line = access_line(&server, "page-1");
    assert_eq!(line["fields"]["model_asked"], json!("tiny"), "{line}");
    assert_eq!(line["fields"]["client"], json!("127.0.0.1"), "{line}");
    let (id, _, _) = send(&base, Some("last-1"), &chat(false)).await;
    let next = json_line(&server, "\"request_id\"");
    assert_eq!(next["fields"]["request_id"], json!(id), "{next}");
}

#[test]
fn one_shot_commands_stay_quiet_and_a_trace_protocol_it_cannot_speak_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("q.db").display());
    let out = command(&["--store", &store, "store", "migrate"], &[])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "warn by default");

    let out = command(
        &["server", "--endpoint", "e=http://127.0.0.1:1=m"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1".into()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".into()),
        ],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc") && err.contains("http/protobuf"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// What an OTLP collector was sent: (service name, span name, attributes).
type Spans = Arc<Mutex<Vec<(String, String, Vec<(String, String)>)>>>;

/// A collector's OTLP/HTTP trace endpoint on a free port.
async fn collector() -> (String, Spans) {
    use axum::body::Bytes;
    use prost::Message;
    let spans: Spans = Arc::default();
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| async move {
            let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
            let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
                .as_ref()
                .and_then(|v| v.value.as_ref())
            {
                Some(Any::StringValue(s)) => s.clone(),
                Some(Any::IntValue(i)) => i.to_string(),
                other => format!("{other:?}"),
            };
            let mut kept = kept.lock().unwrap();
            for rs in request.resource_spans {
                let service = rs
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|a| a.key == "service.name")
                    .map(|a| text(&a.value))
                    .unwrap_or_default();
                for span in rs.scope_spans.iter().flat_map(|s| &s.spans) {
                    let attributes = span
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), text(&a.value)))
                        .collect();
                    kept.push((service.clone(), span.name.clone(), attributes));
                }
            }
            // An empty ExportTraceServiceResponse.
            ([("content-type", "application/x-protobuf")], Bytes::new())
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_an_otlp_endpoint_exports_the_request_span() {
    let (endpoint, spans) = collector().await;
    let engine = tiny_engine();
    let (_server, base) = server(
        &engine,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            // Batches leave every 100 ms instead of every 5 s.
            ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ],
    );
    let (id, status, _) = send(&base, Some("traced-1"), &chat(false)).await;
    assert_eq!((id.as_str(), status), ("traced-1", 200));
    let (service, _, attributes) = until("the request's span at the collector", || {
        let found = spans
            .lock()
            .unwrap()
            .iter()
            .find(|(_, name, attributes)| {
                name == "request"
                    && attributes
                        .iter()
                        .any(|(k, v)| k == "request_id" && v == "traced-1")
            })
            .cloned();
        async move { found }
    })
    .await;
    assert_eq!(service, "llmgw-server");
    assert!(
        attributes
            .iter()
            .any(|(k, v)| k == "path" && v == "/v1/chat/completions"),
        "{attributes:?}"
    );
}

/// A collector that cannot be reached is said once, not left to lose
/// every trace unaware (the SDK dropped each batch without a word).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_that_cannot_be_exported_are_said() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let engine = tiny_engine();
    let (server, base) = server(
        &engine,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ],
    );
    let (_, status, _) = send(&base, Some("lost-1"), &chat(false)).await;
    assert_eq!(status, 200);
    let said = Child::expect(&server.stderr, "traces could not be exported");
    assert!(said.contains("WARN"), "{said}");
}

/// An auditor joins a client's request id to what was billed: the access
/// line names the request's usage row, and the row is in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_line_names_the_requests_usage_row() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("log.db");
    let store = store.to_str().unwrap().to_owned();
    let engine = tiny_engine();
    let (mut server, base) = server(
        &engine,
        &["--log-format", "json", "--record-usage", "--store", &store],
        &[],
    );
    let (id, status, _) = send(&base, Some("audit-1"), &chat(false)).await;
    assert_eq!((id.as_str(), status), ("audit-1", 200));
    let line = access_line(&server, "audit-1");
    let usage_id = line["fields"]["usage_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{line}"));
    server.terminate();
    assert!(server.process.wait().unwrap().success());
    let out = command(&["--store", &store, "events", "show", "1"], &[])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.lines().any(|l| l.starts_with(usage_id)),
        "{usage_id} in {shown}"
    );
}
