//! `llmgw ctl bench M`: streamed chat requests through the gateway at
//! concurrency 1, 2, 4, 8 … until a level's TTFT or inter-token p99
//! breaks the SLO (or a request fails). The last level that held is what
//! a replica of this profile can take, and so the profile's `weight`: the
//! router divides each replica's queue by its weight, so weights in the
//! ratio of measured capacities share traffic in that ratio.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use crate::Outcome;
use crate::output::{Table, json_line};

#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// The model to load (a name or alias the gateway serves).
    model: String,
    /// The gateway's client (OpenAI) API.
    #[arg(long, env = "LLMGW_URL", default_value = "http://127.0.0.1:8080", value_parser = gateway_url)]
    url: String,
    /// An API key, when the gateway requires one.
    #[arg(long, env = "LLMGW_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The SLO on the time to first token's 99th percentile, in ms.
    #[arg(long, default_value_t = 1000)]
    slo_ttft_p99: u64,
    /// The SLO on the inter-token latency's 99th percentile, in ms.
    #[arg(long, default_value_t = 100)]
    slo_itl_p99: u64,
    /// The highest concurrency tried (levels double from 1 up to it).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    max_concurrency: u32,
    /// How long each level runs (`500ms`, `10s`, `1m`).
    #[arg(long, default_value = "10s", conflicts_with = "requests")]
    duration: String,
    /// Requests per level instead of a duration (at least one per
    /// concurrent client).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    requests: Option<u64>,
    /// Tokens each request asks for.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    max_tokens: u32,
}

/// What one streamed request saw.
#[derive(Debug, Default)]
struct Sample {
    ttft: Option<Duration>,
    itl: Vec<Duration>,
    tokens: u64,
    error: Option<String>,
}

/// One concurrency level's figures and verdict.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Level {
    pub concurrency: u32,
    pub requests: u64,
    pub errors: u64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
    pub tokens_per_s: f64,
    /// Why the level broke the SLO; none when it held.
    pub broke: Option<String>,
}

/// The 99th (or any) percentile by nearest rank, in ms; 0 when empty.
fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

/// Whether a level held the SLO, and if not, the first reason.
pub(crate) fn verdict(
    l: &Level,
    first_error: Option<&str>,
    slo_ttft_ms: u64,
    slo_itl_ms: u64,
) -> Option<String> {
    if l.requests == 0 {
        return Some("no request finished in the level's time".into());
    }
    if l.errors > 0 {
        return Some(format!(
            "{} of {} requests failed{}",
            l.errors,
            l.requests,
            first_error.map(|e| format!(": {e}")).unwrap_or_default()
        ));
    }
    if l.ttft_p99_ms > slo_ttft_ms as f64 {
        return Some(format!(
            "TTFT p99 {:.0} ms > {slo_ttft_ms} ms",
            l.ttft_p99_ms
        ));
    }
    if l.itl_p99_ms > slo_itl_ms as f64 {
        return Some(format!("ITL p99 {:.1} ms > {slo_itl_ms} ms", l.itl_p99_ms));
    }
    None
}

/// 1, 2, 4 … and the maximum itself when it is not a power of two.
pub(crate) fn levels(max: u32) -> Vec<u32> {
    let mut out: Vec<u32> = std::iter::successors(Some(1u32), |c| c.checked_mul(2))
        .take_while(|c| *c <= max)
        .collect();
    if max > 0 && out.last() != Some(&max) {
        out.push(max);
    }
    out
}

fn request(model: &str, max_tokens: u32) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// Handles one `data:` line: a token's arrival, the usage, or an error.
fn line(s: &mut Sample, started: Instant, last: &mut Option<Instant>, chunks: &mut u64, l: &str) {
    let Some(data) = l.strip_prefix("data:").map(str::trim) else {
        return;
    };
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return;
    };
    if let Some(e) = v["error"]["message"].as_str() {
        s.error = Some(e.to_owned());
        return;
    }
    if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
        s.tokens = n;
    }
    let d = &v["choices"][0]["delta"];
    let text = [&d["content"], &d["reasoning_content"]]
        .iter()
        .any(|t| t.as_str().is_some_and(|t| !t.is_empty()));
    if text {
        let now = Instant::now();
        match *last {
            None => s.ttft = Some(now - started),
            Some(prev) => s.itl.push(now - prev),
        }
        *last = Some(now);
        *chunks += 1;
    }
}

async fn one(http: &reqwest::Client, args: &BenchArgs, body: &Value) -> Sample {
    let mut s = Sample::default();
    let url = format!("{}/v1/chat/completions", args.url.trim_end_matches('/'));
    let started = Instant::now();
    let mut r = http.post(&url).json(body);
    if let Some(k) = &args.api_key {
        r = r.bearer_auth(k);
    }
    let mut resp = match r.send().await {
        Ok(resp) => resp,
        Err(e) => {
            s.error = Some(format!("cannot reach the gateway at {}: {e}", args.url));
            return s;
        }
    };
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        let why = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or(text);
        s.error = Some(format!("the gateway answered {status}: {why}"));
        return s;
    }
    // Bytes, not text, until a whole line is in: a chunk may end inside a
    // character.
    let mut buf: Vec<u8> = Vec::new();
    let (mut last, mut chunks) = (None, 0u64);
    loop {
        match resp.chunk().await {
            Ok(Some(b)) => {
                buf.extend_from_slice(&b);
                while let Some(i) = buf.iter().position(|c| *c == b'\n') {
                    let l: Vec<u8> = buf.drain(..=i).collect();
                    line(
                        &mut s,
                        started,
                        &mut last,
                        &mut chunks,
                        String::from_utf8_lossy(&l).trim(),
                    );
                }
            }
            Ok(None) => break,
            Err(e) => {
                s.error = Some(format!("the stream broke: {e}"));
                break;
            }
        }
    }
    if s.error.is_none() && s.ttft.is_none() {
        s.error = Some("the stream ended without a token".into());
    }
    if s.tokens == 0 {
        s.tokens = chunks;
    }
    s
}

/// Runs one level: `c` clients, each sending its next request as soon as
/// its last one ended, until the duration or the request count is spent.
async fn level(
    http: &reqwest::Client,
    args: &Arc<BenchArgs>,
    c: u32,
    duration: Duration,
) -> (Level, Option<String>) {
    let body = Arc::new(request(&args.model, args.max_tokens));
    let left = Arc::new(AtomicU64::new(
        args.requests.map_or(u64::MAX, |n| n.max(u64::from(c))),
    ));
    let started = Instant::now();
    let deadline = args.requests.is_none().then_some(started + duration);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..c {
        let (http, args, body, left) = (http.clone(), args.clone(), body.clone(), left.clone());
        tasks.spawn(async move {
            let mut samples = Vec::new();
            while deadline.is_none_or(|d| Instant::now() < d)
                && left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
            {
                let sample = one(&http, &args, &body).await;
                // A failed request breaks the level whatever follows: a
                // client stops at its first, rather than send thousands
                // to an address that refuses them.
                let failed = sample.error.is_some();
                samples.push(sample);
                if failed {
                    break;
                }
            }
            samples
        });
    }
    let mut samples = Vec::new();
    while let Some(done) = tasks.join_next().await {
        samples.extend(done.unwrap_or_default());
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    let mut ttft: Vec<Duration> = samples.iter().filter_map(|s| s.ttft).collect();
    let mut itl: Vec<Duration> = samples.iter().flat_map(|s| s.itl.clone()).collect();
    ttft.sort();
    itl.sort();
    let first_error = samples.iter().find_map(|s| s.error.clone());
    let l = Level {
        concurrency: c,
        requests: samples.len() as u64,
        errors: samples.iter().filter(|s| s.error.is_some()).count() as u64,
        ttft_p50_ms: percentile_ms(&ttft, 50.0),
        ttft_p99_ms: percentile_ms(&ttft, 99.0),
        itl_p50_ms: percentile_ms(&itl, 50.0),
        itl_p99_ms: percentile_ms(&itl, 99.0),
        tokens_per_s: samples.iter().map(|s| s.tokens).sum::<u64>() as f64 / elapsed,
        broke: None,
    };
    (l, first_error)
}

/// The gateway's address as `--url` takes it: http(s)://HOST:PORT.
fn gateway_url(s: &str) -> Result<String, String> {
    crate::admin_client::http_address(s, "the gateway's", "http://127.0.0.1:8080")
}

pub(crate) async fn run(json_out: bool, args: BenchArgs) -> anyhow::Result<Outcome> {
    let duration = crate::config::duration("--duration", &args.duration)?;
    if duration.is_zero() {
        return Err(crate::config::ConfigError("--duration must be more than 0".into()).into());
    }
    let args = Arc::new(args);
    let http = reqwest::Client::builder()
        .build()
        .context("building the HTTP client")?;
    let mut done: Vec<Level> = Vec::new();
    let mut out = std::io::stdout().lock();
    for c in levels(args.max_concurrency) {
        let (mut l, first_error) = level(&http, &args, c, duration).await;
        l.broke = verdict(
            &l,
            first_error.as_deref(),
            args.slo_ttft_p99,
            args.slo_itl_p99,
        );
        if !json_out {
            // A level takes a while: say how it went as it ends.
            eprintln!(
                "concurrency {c}: {}",
                l.broke.as_deref().unwrap_or("within the SLO")
            );
        }
        let broke = l.broke.is_some();
        done.push(l);
        if broke {
            break;
        }
    }
    let passing = done.iter().rev().find(|l| l.broke.is_none()).cloned();
    let ceiling = done.last().is_some_and(|l| l.broke.is_none());
    let weight = passing.as_ref().map(|l| l.concurrency);
    if json_out {
        json_line(
            &mut out,
            &json!({
                "model": args.model,
                "slo": {"ttft_p99_ms": args.slo_ttft_p99, "itl_p99_ms": args.slo_itl_p99},
                "levels": done,
                "last_passing": passing,
                "slo_broke": !ceiling,
                "suggested_weight": weight,
            }),
        )?;
    } else {
        let mut t = Table::new(vec![
            "CONCURRENCY",
            "REQUESTS",
            "ERRORS",
            "TTFT P50",
            "TTFT P99",
            "ITL P50",
            "ITL P99",
            "TOKENS/S",
            "VERDICT",
        ]);
        for l in &done {
            t.row(vec![
                l.concurrency.to_string(),
                l.requests.to_string(),
                l.errors.to_string(),
                format!("{:.0} ms", l.ttft_p50_ms),
                format!("{:.0} ms", l.ttft_p99_ms),
                format!("{:.1} ms", l.itl_p50_ms),
                format!("{:.1} ms", l.itl_p99_ms),
                format!("{:.1}", l.tokens_per_s),
                l.broke.clone().unwrap_or_else(|| "ok".into()),
            ]);
        }
        t.print(&mut out)?;
        writeln!(
            out,
            "SLO: TTFT p99 <= {} ms, ITL p99 <= {} ms",
            args.slo_ttft_p99, args.slo_itl_p99
        )?;
        match &passing {
            None => writeln!(
                out,
                "{}: even concurrency 1 breaks the SLO; no weight to suggest",
                args.model
            )?,
            Some(l) => {
                writeln!(
                    out,
                    "{}: last passing level: concurrency {} ({:.1} tokens/s){}",
                    args.model,
                    l.concurrency,
                    l.tokens_per_s,
                    if ceiling {
                        " - the SLO never broke: --max-concurrency is the limit, not the replica"
                    } else {
                        ""
                    }
                )?;
                writeln!(
                    out,
                    "suggested for the profile this replica runs: weight: {} \
                     (the router divides each replica's queue by its weight; \
                     bench every profile of the model with the same SLO so their weights compare)",
                    l.concurrency
                )?;
            }
        }
    }
    Ok(if passing.is_some() {
        Outcome::Ok
    } else {
        Outcome::Failed
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lvl(errors: u64, ttft: f64, itl: f64) -> Level {
        Level {
            concurrency: 4,
            requests: 10,
            errors,
            ttft_p50_ms: 0.0,
            ttft_p99_ms: ttft,
            itl_p50_ms: 0.0,
            itl_p99_ms: itl,
            tokens_per_s: 0.0,
            broke: None,
        }
    }

    #[test]
    fn levels_double_and_end_at_the_maximum() {
        assert_eq!(levels(64), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(levels(12), vec![1, 2, 4, 8, 12]);
        assert_eq!(levels(1), vec![1]);
    }

    #[test]
    fn the_99th_percentile_is_by_nearest_rank() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&d, 99.0), 99.0);
        assert_eq!(percentile_ms(&d, 50.0), 50.0);
        assert_eq!(percentile_ms(&d[..3], 99.0), 3.0);
        assert_eq!(percentile_ms(&[], 99.0), 0.0);
    }

    #[test]
    fn a_level_breaks_on_an_error_then_ttft_then_itl() {
        assert_eq!(verdict(&lvl(0, 100.0, 10.0), None, 200, 50), None);
        assert!(
            verdict(&lvl(1, 100.0, 10.0), Some("503"), 200, 50)
                .unwrap()
                .contains("1 of 10 requests failed: 503")
        );
        let mut none = lvl(0, 0.0, 0.0);
        none.requests = 0;
        assert!(
            verdict(&none, None, 200, 50)
                .unwrap()
                .contains("no request")
        );
        assert!(
            verdict(&lvl(0, 300.0, 10.0), None, 200, 50)
                .unwrap()
                .starts_with("TTFT p99 300 ms")
        );
        assert!(
            verdict(&lvl(0, 100.0, 60.0), None, 200, 50)
                .unwrap()
                .starts_with("ITL p99 60.0 ms")
        );
    }
}
