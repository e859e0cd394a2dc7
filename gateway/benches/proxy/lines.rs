//! `--lines`: what formatting and queueing one access line costs, as the
//! binary writes text and JSON lines (`log_lines::layer`) and as
//! `tracing_subscriber`'s own text and JSON formats do, the same line
//! under the same request span, written to a discarding writer through
//! the same non-blocking queue. Three interleaved rounds.

use std::time::Instant;

use llmgw_gateway::log_lines::{Format, layer};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;

const LINES: u32 = 300_000;

/// One request's span and its access line, `LINES` times; ns a line.
fn time(subscriber: impl tracing::Subscriber + Send + Sync) -> f64 {
    let started = Instant::now();
    tracing::subscriber::with_default(subscriber, || {
        for _ in 0..LINES {
            let span = tracing::info_span!(
                "request",
                request_id = "e98c13f8-b1f0-48b0-9016-2d001955df43",
                method = %"POST",
                path = "/v1/chat/completions"
            );
            let _in = span.enter();
            tracing::info!(
                target: "llmgw::access",
                request_id = "e98c13f8-b1f0-48b0-9016-2d001955df43",
                key_id = Some("key-4f1c2a9e0b7d"),
                model_asked = Some("llama-3.1-8b"),
                model_served = Some("llama-3.1-8b"),
                status = 200u16,
                prompt_tokens = Some(812u64),
                completion_tokens = Some(96u64),
                ttft_ms = Some(41.207f64),
                duration_ms = 388.912f64,
                stream = true,
                stream_end = Some("complete"),
                "request"
            );
        }
    });
    started.elapsed().as_nanos() as f64 / f64::from(LINES)
}

pub fn run() {
    println!(
        "an access line and its request span, formatted and queued (ns a line, {LINES} lines a round):"
    );
    for round in 1..=3 {
        let (queue, _guard) = tracing_appender::non_blocking(std::io::sink());
        let text = time(
            tracing_subscriber::registry().with(layer(Format::Text { ansi: false }, queue).boxed()),
        );
        let (queue, _guard) = tracing_appender::non_blocking(std::io::sink());
        let default_text = time(
            tracing_subscriber::registry().with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(queue),
            ),
        );
        let (queue, _guard) = tracing_appender::non_blocking(std::io::sink());
        let json = time(tracing_subscriber::registry().with(layer(Format::Json, queue).boxed()));
        let (queue, _guard) = tracing_appender::non_blocking(std::io::sink());
        let default_json = time(
            tracing_subscriber::registry().with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(true)
                    .with_writer(queue),
            ),
        );
        println!(
            "round {round}: text as shipped {text:.0} ns, tracing-subscriber's {default_text:.0} ns ({:.2}x); JSON as shipped {json:.0} ns, tracing-subscriber's {default_json:.0} ns ({:.2}x)",
            text / default_text,
            json / default_json
        );
    }
}
