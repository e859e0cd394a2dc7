//! Where the binary's logs and traces go: stderr as text or JSON lines,
//! the agent's ring for `ctl logs`, and OpenTelemetry (OTLP over
//! HTTP/protobuf) when the standard `OTEL_EXPORTER_OTLP_*ENDPOINT`
//! variables name a collector.

use std::io::IsTerminal;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

use llmgw_gateway::log_lines::Format;

use crate::config::ConfigError;

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// For a person or the journal: one line of text an event.
    #[default]
    Text,
    /// For a log pipeline: one JSON object a line (timestamp, level,
    /// target, fields with the message, the current span and the spans
    /// around it with their fields).
    Json,
}

/// What a process needs of its logging.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) format: LogFormat,
    /// The level when RUST_LOG is unset.
    pub(crate) default_level: LevelFilter,
    /// The OpenTelemetry service name when OTEL_SERVICE_NAME is unset;
    /// None: this process never exports traces.
    pub(crate) service: Option<&'static str>,
    /// The agent's own last lines, kept at info for `ctl logs`.
    pub(crate) ring: Option<llmgw_agent::supervisor::LogTail>,
}

/// Holds the trace exporter and the log writer's thread; dropping it
/// sends what is still batched and writes the lines still queued (waiting
/// up to a second for a reader of stderr that has stopped reading). Drop it
/// before the runtime (the exporter's requests run on it) and before a
/// last word to stderr, so that it comes after the log.
#[derive(Debug)]
pub(crate) struct Guard {
    traces: Option<SdkTracerProvider>,
    /// Dropped after the exporter's shutdown, so that its warning is
    /// written too.
    _lines: llmgw_gateway::log_lines::WorkerGuard,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.traces.take()
            && let Err(e) = provider.shutdown_with_timeout(Duration::from_secs(5))
        {
            tracing::warn!(error = %e, "could not send the last traces");
        }
    }
}

type Boxed = Box<dyn Layer<Registry> + Send + Sync>;

/// Installs the process's subscriber. A trace export that is asked for
/// but cannot be honoured (another protocol, a bad endpoint) is refused.
pub(crate) fn init(setup: Setup, runtime: &tokio::runtime::Handle) -> Result<Guard, ConfigError> {
    if let Some(directives) = var("RUST_LOG") {
        check_rust_log(&directives)?;
    }
    JSON.set(setup.format == LogFormat::Json).ok();
    let provider = match setup.service {
        Some(service) => exporter(service, runtime)?,
        None => None,
    };
    let filter = || {
        EnvFilter::builder()
            .with_default_directive(setup.default_level.into())
            .from_env_lossy()
    };
    let (stderr, lines) = llmgw_gateway::log_lines::stderr();
    let mut layers: Vec<Boxed> = Vec::new();
    let format = match setup.format {
        // Colours only for a person at a terminal: a journal or a log file
        // gets plain text.
        LogFormat::Text => Format::Text {
            ansi: std::io::stderr().is_terminal(),
        },
        LogFormat::Json => Format::Json,
    };
    layers.push(
        llmgw_gateway::log_lines::layer(format, stderr)
            .with_filter(filter())
            .boxed(),
    );
    if let Some(ring) = setup.ring {
        layers.push(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(crate::agent_log::Ring(ring))
                .with_filter(LevelFilter::INFO)
                .boxed(),
        );
    }
    if let Some(p) = &provider {
        // Our own spans, whatever RUST_LOG says of stderr; the HTTP and
        // database libraries' spans would swamp a trace.
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(p.tracer("llmgw"))
                .with_filter(Targets::new().with_target("llmgw", LevelFilter::INFO))
                .boxed(),
        );
    }
    tracing_subscriber::registry().with(layers).init();
    Ok(Guard {
        traces: provider,
        _lines: lines,
    })
}

/// Whether log lines are JSON: the lines a command says on stdout
/// (where it listens, that it stops) follow, for a pipeline reading both.
static JSON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// A line for stdout: itself, or with `--log-format json` a JSON object
/// shaped as the log's (`timestamp`, `level`, `fields.message`, `target`).
pub(crate) fn stdout_line(line: &str) -> String {
    if JSON.get() != Some(&true) {
        return line.to_owned();
    }
    serde_json::json!({
        "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "level": "INFO",
        "fields": {"message": line},
        "target": "llmgw",
    })
    .to_string()
}

/// RUST_LOG as the filter would read it, refused where a typo would go
/// unnoticed: a directive the filter cannot parse (it drops them), or a
/// bare word a letter or two from a level (`inof` names a target, and
/// every other line, errors too, goes unwritten).
fn check_rust_log(directives: &str) -> Result<(), ConfigError> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    EnvFilter::builder()
        .parse(directives)
        .map_err(|e| ConfigError(format!("RUST_LOG={directives:?}: {e}")))?;
    for word in directives.split(',').map(str::trim) {
        let bare = !word.is_empty() && !word.contains(['=', ':', '[', '{']);
        if !bare || LEVELS.iter().any(|l| l.eq_ignore_ascii_case(word)) {
            continue;
        }
        let lower = word.to_ascii_lowercase();
        let letters = |w: &str| {
            let mut v: Vec<char> = w.chars().collect();
            v.sort_unstable();
            v
        };
        // A letter off, or the letters swapped: the typos people make.
        if let Some(level) = LEVELS
            .iter()
            .find(|l| crate::config::edits(&lower, l) <= 1 || letters(&lower) == letters(l))
        {
            return Err(ConfigError(format!(
                "RUST_LOG={directives:?}: {word:?} is not a level; did you mean {level}? (a bare name is read as a target, and nothing else would be logged)"
            )));
        }
    }
    Ok(())
}

/// A variable's value, when set to something.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The OTLP exporter the standard variables ask for, if they ask.
fn exporter(
    service: &str,
    runtime: &tokio::runtime::Handle,
) -> Result<Option<SdkTracerProvider>, ConfigError> {
    if var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        && var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
    {
        return Ok(None);
    }
    let off = |name: &str, value: &str| var(name).is_some_and(|v| v.eq_ignore_ascii_case(value));
    if off("OTEL_SDK_DISABLED", "true") || off("OTEL_TRACES_EXPORTER", "none") {
        return Ok(None);
    }
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(p) = var(name)
            && p != "http/protobuf"
        {
            return Err(ConfigError(format!(
                "{name}={p}: llmgw exports traces as http/protobuf only (a collector's port 4318); unset it or set http/protobuf"
            )));
        }
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| ConfigError(format!("OpenTelemetry export: {e}")))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(OnRuntime {
            client,
            runtime: runtime.clone(),
        })
        .build()
        .map_err(|e| ConfigError(format!("OTEL_EXPORTER_OTLP_ENDPOINT: {e}")))?;
    let name = var("OTEL_SERVICE_NAME").unwrap_or_else(|| service.to_owned());
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(name)
        .build();
    Ok(Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build(),
    ))
}

/// The exporter's HTTP client: the SDK's batch processor exports from a
/// thread of its own, outside the runtime, so each request is run on the
/// runtime and that thread waits for the answer. The workspace's reqwest
/// serves, and no worker thread ever blocks.
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let to = request.url().clone();
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let answer = client.execute(request).await?;
            let mut response = Response::builder().status(answer.status());
            if let Some(headers) = response.headers_mut() {
                headers.extend(answer.headers().clone());
            }
            let body = answer.bytes().await?;
            Ok::<_, HttpError>(response.body(body)?)
        });
        let answer = sent.await?;
        // The SDK drops a batch it could not send without a word: an
        // operator whose collector is down or misnamed lost every trace
        // unaware. Said at most once a minute.
        let failed = match &answer {
            Ok(r) if r.status().is_success() => None,
            Ok(r) => Some(format!("the collector answered {}", r.status())),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = failed
            && warn_due()
        {
            tracing::warn!(collector = %to, error = %why, "traces could not be exported (OTEL_EXPORTER_OTLP_ENDPOINT): this batch is lost");
        }
        answer
    }
}

/// Whether a failed export is to be said now: once a minute at most.
fn warn_due() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    (last == 0 || now >= last + 60)
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}
