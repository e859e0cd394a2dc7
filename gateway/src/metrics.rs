//! The process's one metrics registry, with prometheus-client. The
//! gateway's counters are registered once; its live figures (endpoints,
//! pool saturation, dropped usage) are a collector read at scrape time, so
//! they cannot go stale; the rest of the process (the control plane, the
//! log) adds its own collectors through [`Metrics::register`], and every
//! series appears once on `/metrics`, whichever listener serves it.
//!
//! No label takes a client's text: `model` is a model the routing table
//! knows (or `unknown`), endpoints and nodes are configured or placed.

use std::sync::{Arc, Mutex, Weak};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::Gateway;

/// A model's name as a label value, shared with the request that names
/// it: a label set is built for every request to look its series up, and
/// a copy of the name cost an allocation each time.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct Model(Arc<str>);

impl EncodeLabelValue for Model {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&&*self.0, encoder)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    model: Model,
    /// A number, not its text: a label set is built for every request to
    /// look its counter up, and the text cost an allocation each time.
    status: u16,
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
    model: Model,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MigrationLabels {
    model: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

/// `endpoint`, and `node` for a placed replica's (so that an alert on a
/// node can silence its endpoints'); a configured endpoint has no node.
type EndpointLabels = Vec<(&'static str, String)>;

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// 5 ms to 328 s: a first token may wait for an on-demand model's start
/// (`router.on_demand_wait`, 120 s by default) or a CPU engine's prefill,
/// which all fell in `+Inf` past 41 s.
fn ttft_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 17))
}

/// The gateway's counters and the process's registry.
#[derive(Debug)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    rejected: Family<BandLabels, Counter>,
    decisions: Family<DecisionLabels, Counter>,
    tokens: Family<DirectionLabels, Counter>,
    ttft: Family<ModelLabels, Histogram, fn() -> Histogram>,
    migrations: Family<MigrationLabels, Counter>,
    registry: Mutex<Registry>,
}

impl Metrics {
    /// The registry with the gateway's series; `gw` is read at scrape time
    /// for the live ones.
    pub(crate) fn new(gw: Weak<Gateway>) -> Self {
        let m = Metrics {
            requests: Family::default(),
            rejected: Family::default(),
            decisions: Family::default(),
            tokens: Family::default(),
            ttft: Family::new_with_constructor(ttft_histogram),
            migrations: Family::default(),
            registry: Mutex::new(Registry::with_prefix("llmgw")),
        };
        {
            let mut r = m.lock();
            let build = Family::<VersionLabels, Gauge>::default();
            build
                .get_or_create(&VersionLabels {
                    version: env!("CARGO_PKG_VERSION"),
                })
                .set(1);
            r.register(
                "build_info",
                "Always 1; the version label is this binary's",
                build,
            );
            r.register(
                "requests",
                "Requests answered, by model (a known model, or unknown) and status",
                m.requests.clone(),
            );
            r.register(
                "admission_rejected",
                "Requests refused by admission, by band",
                m.rejected.clone(),
            );
            r.register(
                "prefix_decisions",
                "Endpoint choices, by why they were made",
                m.decisions.clone(),
            );
            r.register(
                "tokens",
                "Tokens counted from engine usage, by direction",
                m.tokens.clone(),
            );
            r.register(
                "ttft_seconds",
                "Time to the first content chunk of streamed answers, by the model that served",
                m.ttft.clone(),
            );
            r.register(
                "migrations",
                "Answers whose engine broke mid-answer, by the model that served and what became of them: resumed (another replica continued the stream), failed (a continuation attempt was refused or unreachable), exhausted (the limit was reached or no replica was left: the client got an error event), unresumable (the answer could not be continued), retried (a plain answer sent again from the start)",
                m.migrations.clone(),
            );
            r.register_collector(Box::new(Live(gw)));
        }
        m
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds the series of another part of this process (the control plane,
    /// the log) to the page. Register each once: the registry does not
    /// merge, so a name registered twice would be written twice.
    pub fn register(&self, collector: Box<dyn Collector>) {
        self.lock().register_collector(collector);
    }

    /// The whole page, in the text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.lock()).is_err() {
            out.clear();
        }
        out
    }

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

    /// `model` is the model that served (one the routing table knows).
    pub(crate) fn ttft(&self, model: &Arc<str>, seconds: f64) {
        self.ttft
            .get_or_create(&ModelLabels {
                model: Model(model.clone()),
            })
            .observe(seconds);
    }

    /// `model` is the model that served; `outcome` one of the documented.
    pub(crate) fn migration(&self, model: &str, outcome: &'static str) {
        self.migrations
            .get_or_create(&MigrationLabels {
                model: model.to_owned(),
                outcome,
            })
            .inc();
    }

    /// `model` is the model that served, or the refusal's label.
    pub(crate) fn request(&self, model: Arc<str>, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                model: Model(model),
                status,
            })
            .inc();
    }
}

/// Writes one metric (or family) under `name` with its HELP.
fn put<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &M,
) -> Result<(), std::fmt::Error> {
    // Ended with a period, as the registry ends the HELP of what is
    // registered with it.
    let help = format!("{help}.");
    let m = enc.encode_descriptor(name, &help, None, metric.metric_type())?;
    metric.encode(m)
}

/// The gateway's figures that are read, not counted: the endpoint set,
/// the pools' saturation and the usage queue's drops.
#[derive(Debug)]
struct Live(Weak<Gateway>);

impl Collector for Live {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(gw) = self.0.upgrade() else {
            return Ok(());
        };
        let saturation = Family::<ModelLabels, FloatGauge>::default();
        let cfg = &gw.admission.config;
        for model in gw.endpoints.routable_models() {
            let s = gw
                .endpoints
                .saturation(&model, cfg.waiting_ceiling, cfg.kv_ceiling);
            saturation
                .get_or_create(&ModelLabels {
                    model: Model(model.into()),
                })
                .set(s);
        }
        put(
            &mut enc,
            "pool_saturation",
            "Saturation of the pool serving a model (1 is full)",
            &saturation,
        )?;
        if let Some(q) = &gw.usage {
            put(
                &mut enc,
                "usage_dropped",
                "Usage records dropped because the queue was full or the log refused them",
                &ConstCounter::new(q.dropped()),
            )?;
            put(
                &mut enc,
                "usage_pending",
                "Usage records not yet in the log: queued, or held while the log cannot be reached",
                &ConstGauge::new(q.pending() as i64),
            )?;
        }
        let open = Family::<ListenerLabels, Gauge>::default();
        let max = Family::<ListenerLabels, Gauge>::default();
        let full = Family::<ListenerLabels, Counter>::default();
        for which in crate::Which::ALL {
            let l = gw.connections.of(which);
            // Only the listeners this process bound.
            if l.max() == 0 {
                continue;
            }
            let labels = ListenerLabels {
                listener: which.name(),
            };
            open.get_or_create(&labels).set(l.open() as i64);
            max.get_or_create(&labels).set(l.max() as i64);
            full.get_or_create(&labels).inc_by(l.full());
        }
        put(
            &mut enc,
            "connections",
            "Connections open on each listener",
            &open,
        )?;
        put(
            &mut enc,
            "connections_max",
            "The cap on each listener's open connections (connections.max.*)",
            &max,
        )?;
        put(
            &mut enc,
            "connections_full",
            "Times a listener was at its cap, so that a new connection waited",
            &full,
        )?;
        if let Some((open, max)) = files() {
            put(
                &mut enc,
                "process_open_fds",
                "Files this process holds open, every connection one",
                &ConstGauge::new(open as i64),
            )?;
            put(
                &mut enc,
                "process_max_fds",
                "Files this process may hold open (its soft limit): past it no connection is accepted",
                &ConstGauge::new(max.min(i64::MAX as u64) as i64),
            )?;
        }
        let breaker_open = Family::<EndpointLabels, Gauge>::default();
        let in_flight = Family::<EndpointLabels, Gauge>::default();
        let stale = Family::<EndpointLabels, Gauge>::default();
        let waiting = Family::<EndpointLabels, FloatGauge>::default();
        let kv = Family::<EndpointLabels, FloatGauge>::default();
        for e in gw.endpoints.snapshot() {
            let mut labels = vec![("endpoint", e.spec.id.clone())];
            if let Some(node) = &e.spec.node {
                labels.push(("node", node.clone()));
            }
            breaker_open
                .get_or_create(&labels)
                .set(i64::from(e.breaker_tripped(gw.endpoints.max_age())));
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
        put(
            &mut enc,
            "endpoint_breaker_open",
            "1 while the endpoint's circuit breaker is open",
            &breaker_open,
        )?;
        put(
            &mut enc,
            "endpoint_in_flight",
            "Requests the gateway has in flight to the endpoint",
            &in_flight,
        )?;
        put(
            &mut enc,
            "endpoint_metrics_stale",
            "1 while the engine's scraped figures are too old to route by",
            &stale,
        )?;
        put(
            &mut enc,
            "endpoint_waiting",
            "Requests waiting in the engine, as last scraped",
            &waiting,
        )?;
        put(
            &mut enc,
            "endpoint_kv_cache_usage",
            "The engine's KV-cache usage (0-1), as last scraped",
            &kv,
        )?;
        let live = Family::<EndpointLabels, Gauge>::default();
        let blocks = Family::<EndpointLabels, Gauge>::default();
        let applied = Family::<EndpointLabels, Gauge>::default();
        let resets = Family::<EndpointLabels, Counter>::default();
        let unchained = Family::<EndpointLabels, Counter>::default();
        for (id, st) in gw.kv_events.states() {
            let labels = vec![("endpoint", id)];
            live.get_or_create(&labels).set(i64::from(st.live));
            blocks.get_or_create(&labels).set(st.blocks as i64);
            applied
                .get_or_create(&labels)
                .set(st.applied.map_or(-1, |s| s as i64));
            resets.get_or_create(&labels).inc_by(st.resets);
            unchained.get_or_create(&labels).inc_by(st.unchained);
        }
        put(
            &mut enc,
            "kv_events_live",
            "1 while the endpoint's KV-cache events are subscribed to and caught up (else the approximate index routes for it)",
            &live,
        )?;
        put(
            &mut enc,
            "kv_events_blocks",
            "Blocks the endpoint's KV-cache events say its engine holds",
            &blocks,
        )?;
        put(
            &mut enc,
            "kv_events_last_seq",
            "The sequence number of the last KV-cache event batch applied (-1: none since the subscription began)",
            &applied,
        )?;
        put(
            &mut enc,
            "kv_events_resets",
            "Times the endpoint's exact index was dropped: the subscription lost, a gap replay could not fill, or the engine restarted",
            &resets,
        )?;
        put(
            &mut enc,
            "kv_events_unchained_blocks",
            "Stored blocks whose parent the exact index did not know, so could not key: events lost (or stored before the gateway listened)",
            &unchained,
        )
    }
}

pub(crate) async fn page(State(gw): State<Arc<Gateway>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        gw.metrics.render(),
    )
}

/// The files this process holds open and the most it may (its soft
/// limit), as the page is read; None where /proc is not there.
fn files() -> Option<(u64, u64)> {
    // Less the one this reading opens.
    let open = std::fs::read_dir("/proc/self/fd")
        .ok()?
        .count()
        .saturating_sub(1) as u64;
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    Some((open, limit.current.unwrap_or(u64::MAX)))
}
