//! The gateway's metrics, with prometheus-client. Endpoint gauges are read
//! from the live endpoint set at scrape time, so they cannot go stale.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::Gateway;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    model: String,
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    decision: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BandLabels {
    band: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

#[derive(Debug)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    rejected: Family<BandLabels, Counter>,
    decisions: Family<DecisionLabels, Counter>,
    tokens: Family<DirectionLabels, Counter>,
    ttft: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Family::default(),
            rejected: Family::default(),
            decisions: Family::default(),
            tokens: Family::default(),
            ttft: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
        }
    }
}

impl Metrics {
    pub(crate) fn rejected(&self, band: &'static str) {
        self.rejected.get_or_create(&BandLabels { band }).inc();
    }

    pub(crate) fn decision(&self, d: crate::affinity::Decision) {
        self.decisions
            .get_or_create(&DecisionLabels { decision: d.name() })
            .inc();
    }

    pub(crate) fn tokens(&self, prompt: u64, completion: u64) {
        self.tokens
            .get_or_create(&DirectionLabels {
                direction: "prompt",
            })
            .inc_by(prompt);
        self.tokens
            .get_or_create(&DirectionLabels {
                direction: "completion",
            })
            .inc_by(completion);
    }

    pub(crate) fn ttft(&self, seconds: f64) {
        self.ttft.observe(seconds);
    }

    pub(crate) fn request(&self, model: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                model: model.to_owned(),
                status: status.to_string(),
            })
            .inc();
    }
}

pub(crate) async fn page(State(gw): State<Arc<Gateway>>) -> impl IntoResponse {
    let mut registry = Registry::with_prefix("llmgw");
    registry.register(
        "requests",
        "Requests answered, by model and status",
        gw.metrics.requests.clone(),
    );
    registry.register(
        "admission_rejected",
        "Requests refused by admission, by band",
        gw.metrics.rejected.clone(),
    );
    let saturation = Family::<ModelLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let cfg = &gw.admission.config;
    for model in gw.endpoints.routable_models() {
        let s = gw
            .endpoints
            .saturation(&model, cfg.waiting_ceiling, cfg.kv_ceiling);
        saturation.get_or_create(&ModelLabels { model }).set(s);
    }
    registry.register(
        "pool_saturation",
        "Saturation of the pool serving a model (1 is full)",
        saturation,
    );
    registry.register(
        "prefix_decisions",
        "Endpoint choices, by why they were made",
        gw.metrics.decisions.clone(),
    );
    registry.register(
        "tokens",
        "Tokens counted from engine usage, by direction",
        gw.metrics.tokens.clone(),
    );
    registry.register(
        "ttft_seconds",
        "Time to the first content chunk of streamed answers",
        gw.metrics.ttft.clone(),
    );
    if let Some(q) = &gw.usage {
        let dropped: Counter = Counter::default();
        dropped.inc_by(q.dropped());
        registry.register(
            "usage_dropped",
            "Usage records dropped because the queue was full",
            dropped,
        );
    }
    type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;
    let breaker_open = Family::<EndpointLabels, Gauge>::default();
    let in_flight = Family::<EndpointLabels, Gauge>::default();
    let stale = Family::<EndpointLabels, Gauge>::default();
    let waiting = Family::<EndpointLabels, FloatGauge>::default();
    let kv = Family::<EndpointLabels, FloatGauge>::default();
    for e in gw.endpoints.snapshot() {
        let labels = EndpointLabels {
            endpoint: e.spec.id.clone(),
        };
        breaker_open
            .get_or_create(&labels)
            .set(i64::from(e.breaker_open()));
        in_flight
            .get_or_create(&labels)
            .set(i64::from(e.in_flight()));
        stale
            .get_or_create(&labels)
            .set(i64::from(e.stale(gw.endpoints.max_age())));
        if let Some(l) = e.load() {
            waiting.get_or_create(&labels).set(l.waiting);
            if let Some(k) = l.kv_usage {
                kv.get_or_create(&labels).set(k);
            }
        }
    }
    registry.register(
        "endpoint_breaker_open",
        "1 while the endpoint's circuit breaker is open",
        breaker_open,
    );
    registry.register(
        "endpoint_in_flight",
        "Requests the gateway has in flight to the endpoint",
        in_flight,
    );
    registry.register(
        "endpoint_metrics_stale",
        "1 while the engine's scraped figures are too old to route by",
        stale,
    );
    registry.register(
        "endpoint_waiting",
        "Requests waiting in the engine, as last scraped",
        waiting,
    );
    registry.register(
        "endpoint_kv_cache_usage",
        "The engine's KV-cache usage (0-1), as last scraped",
        kv,
    );
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        out,
    )
}
