//! The server's own series, beside the gateway's on one metrics page:
//! [`ControlMetrics`] (leadership, nodes, replicas, the figures agents
//! report) and [`LogMetrics`] (appends, the views' lag, the hash chain).
//!
//! Both are prometheus-client collectors, read at scrape time from live
//! state, so nothing they show can go stale between scrapes; the
//! composition root registers them with the gateway's registry once.
//! Labels are node ids, model names from the log, GPU indices, states and
//! event type names: never a client's text.
//!
//! Telemetry (disk, GPU figures) is what the leader hears in heartbeats,
//! kept in memory and never in the log; a standby has none and shows none.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use llmgw_api::v1;
use llmgw_domain::ids::NodeId;
use llmgw_domain::nodes::{Node, Reachability};
use llmgw_domain::replicas::ReplicaStatus;
use llmgw_eventstore::ChainWatch;
use llmgw_projections::{ClusterView, Lag};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::ControlPlane;

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// A node's figures from its latest registration or heartbeat.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct NodeFigures {
    /// Free and total bytes of the node's own filesystems (shared filers
    /// left out); None when it reported none.
    pub disk: Option<(u64, u64)>,
    pub gpus: Vec<v1::GpuFigures>,
}

/// What agents report that is telemetry, not state: by node.
#[derive(Debug, Default)]
pub(crate) struct Telemetry(Mutex<BTreeMap<NodeId, NodeFigures>>);

fn disk(storage: &[v1::Storage]) -> Option<(u64, u64)> {
    let own: Vec<&v1::Storage> = storage.iter().filter(|s| !s.shared).collect();
    (!own.is_empty()).then(|| {
        own.iter().fold((0, 0), |(free, total), s| {
            (
                free + s.free_bytes.max(0) as u64,
                total + s.total_bytes.max(0) as u64,
            )
        })
    })
}

fn registered_figures(reg: &v1::Register) -> Vec<v1::GpuFigures> {
    reg.gpus
        .iter()
        .map(|g| v1::GpuFigures {
            index: g.index,
            memory_used_mb: i64::from(g.memory_used_mb),
            memory_total_mb: i64::from(g.memory_total_mb),
            temperature_c: g.temperature_c,
            utilization_percent: g.utilization_percent,
            ecc_errors: i64::from(g.ecc_errors),
        })
        .collect()
}

impl Telemetry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, NodeFigures>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A registration's figures replace whatever the node said before.
    pub(crate) fn registered(&self, reg: &v1::Register) {
        self.lock().insert(
            NodeId::from(reg.node_id.as_str()),
            NodeFigures {
                disk: disk(&reg.storage),
                gpus: registered_figures(reg),
            },
        );
    }

    /// A heartbeat's figures (storage is in every heartbeat); an empty GPU
    /// list keeps the last known (an agent of an older build sends none).
    pub(crate) fn heartbeat(&self, node: &NodeId, hb: &v1::Heartbeat) {
        let mut all = self.lock();
        let figures = all.entry(node.clone()).or_default();
        figures.disk = disk(&hb.storage);
        if !hb.gpu_figures.is_empty() {
            figures.gpus = hb.gpu_figures.clone();
        }
    }

    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    fn snapshot(&self) -> BTreeMap<NodeId, NodeFigures> {
        self.lock().clone()
    }
}

/// A node's state as one lowercase word: its reachability when not ready,
/// else draining or cordoned when the operator said so, else ready.
pub fn node_state(n: &Node) -> &'static str {
    match n.reachability {
        Reachability::Unreachable => "unreachable",
        Reachability::Lost => "lost",
        Reachability::Ready if n.draining => "draining",
        Reachability::Ready if n.cordoned => "cordoned",
        Reachability::Ready => "ready",
    }
}

fn replica_state(s: ReplicaStatus) -> &'static str {
    match s {
        ReplicaStatus::Starting => "starting",
        ReplicaStatus::Ready => "ready",
        ReplicaStatus::Draining => "draining",
        ReplicaStatus::Failed => "failed",
        ReplicaStatus::Stopped => "stopped",
    }
}

/// What the cluster view says, counted for the metrics page.
#[derive(Debug, Default, PartialEq)]
pub struct ClusterFigures {
    /// Node → (state, up).
    pub nodes: BTreeMap<NodeId, (&'static str, bool)>,
    /// Ready replicas of every model kept up (scaling.min, with a
    /// profile) and of any with a replica placed (not stopped).
    pub replicas_ready: BTreeMap<String, u64>,
    /// Replicas by state.
    pub replicas: BTreeMap<&'static str, u64>,
}

pub fn cluster_figures(view: &ClusterView) -> ClusterFigures {
    let mut out = ClusterFigures::default();
    for n in view.nodes.nodes.values() {
        let state = node_state(n);
        out.nodes.insert(n.id.clone(), (state, state == "ready"));
    }
    // A model kept up (scaling.min above 0) has its series whatever its
    // replicas do: between a failed replica and its rebuild, on a lost
    // node or with no node to fit, it reads 0 rather than vanishing (an
    // absent series never fires `== 0`, and each gap restarted the
    // alert's `for`).
    // (Not one without profiles: it is catalogued, never started.)
    for m in (view.catalog.models.values()).filter(|m| m.scaling.min > 0 && !m.profiles.is_empty())
    {
        out.replicas_ready.insert(m.name.clone(), 0);
    }
    // Stopped replicas are history the log keeps for ever: counted, they
    // would only grow.
    for r in view.replicas.replicas.values() {
        if r.status != ReplicaStatus::Stopped {
            *out.replicas.entry(replica_state(r.status)).or_insert(0) += 1;
        }
        if r.is_live() {
            let ready = out
                .replicas_ready
                .entry(r.placement.model.clone())
                .or_insert(0);
            *ready += u64::from(r.status == ReplicaStatus::Ready);
        }
    }
    out
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeStateLabels {
    node: String,
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    node: String,
    gpu: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
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

/// The control plane's series, read from its views and memory at scrape
/// time.
#[derive(Debug)]
pub struct ControlMetrics(Arc<ControlPlane>);

impl ControlPlane {
    /// The collector for this control plane's series.
    pub fn metrics(self: &Arc<Self>) -> ControlMetrics {
        ControlMetrics(self.clone())
    }

    /// The lease epoch this server holds or last saw another hold.
    pub fn lease_epoch(&self) -> u64 {
        self.epoch_seen.load(Ordering::Relaxed)
    }
}

impl Collector for ControlMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let cp = &self.0;
        let leader = cp.is_leader();
        put(
            &mut enc,
            "leader",
            "1 while this server holds the append lease (leads), else 0",
            &ConstGauge::new(i64::from(leader)),
        )?;
        put(
            &mut enc,
            "lease_epoch",
            "The epoch of the append lease this server holds or last saw",
            &ConstGauge::new(cp.lease_epoch() as i64),
        )?;
        put(
            &mut enc,
            "anchors_recorded",
            "Anchors of the chain head this server recorded while leading",
            &ConstCounter::new(cp.anchor_stats.recorded.load(Ordering::Relaxed)),
        )?;
        put(
            &mut enc,
            "anchor_sink_failures",
            "Anchors the configured sink (file or command) did not take",
            &ConstCounter::new(cp.anchor_stats.sink_failures.load(Ordering::Relaxed)),
        )?;
        let figures = {
            let views = cp.views.read().unwrap_or_else(|p| p.into_inner());
            cluster_figures(&views.cluster)
        };
        let up = Family::<NodeStateLabels, Gauge>::default();
        for (node, (state, ready)) in &figures.nodes {
            up.get_or_create(&NodeStateLabels {
                node: node.to_string(),
                state,
            })
            .set(i64::from(*ready));
        }
        put(
            &mut enc,
            "node_up",
            "1 when the node is ready (reachable and schedulable), else 0; state is ready, unreachable, lost, cordoned or draining",
            &up,
        )?;
        let ready = Family::<ModelLabels, Gauge>::default();
        for (model, n) in figures.replicas_ready {
            ready.get_or_create(&ModelLabels { model }).set(n as i64);
        }
        put(
            &mut enc,
            "model_replicas_ready",
            "Ready replicas of each model that has a replica placed",
            &ready,
        )?;
        let replicas = Family::<StateLabels, Gauge>::default();
        for (state, n) in figures.replicas {
            replicas.get_or_create(&StateLabels { state }).set(n as i64);
        }
        put(&mut enc, "replicas", "Replicas by state", &replicas)?;
        if leader {
            // Figures only of nodes that answer: a node gone quiet or lost
            // kept its last ones (a GPU at 100% for ever), and a removed
            // one its series until the leader restarted (ghost cards on
            // the dashboard, a disk alert for a node no longer there).
            let answering: Vec<&NodeId> = (figures.nodes.iter())
                .filter(|(_, (state, _))| !matches!(*state, "unreachable" | "lost"))
                .map(|(node, _)| node)
                .collect();
            self.encode_telemetry(&mut enc, figures.nodes.keys(), &answering)?;
        }
        Ok(())
    }
}

impl ControlMetrics {
    /// What only the leader hears: heartbeats' clocks and figures.
    fn encode_telemetry<'a>(
        &self,
        enc: &mut DescriptorEncoder,
        nodes: impl Iterator<Item = &'a NodeId>,
        answering: &[&NodeId],
    ) -> Result<(), std::fmt::Error> {
        let cp = &self.0;
        let seen = Family::<NodeLabels, FloatGauge>::default();
        for node in nodes {
            if let Some(at) = cp.observed.last_seen(node) {
                seen.get_or_create(&NodeLabels {
                    node: node.to_string(),
                })
                .set(at.elapsed().as_secs_f64());
            }
        }
        put(
            enc,
            "node_last_seen_seconds",
            "Seconds since the node's last heartbeat (the leader's clock; absent on a standby)",
            &seen,
        )?;
        let telemetry = cp.telemetry.snapshot();
        let free = Family::<NodeLabels, Gauge>::default();
        let total = Family::<NodeLabels, Gauge>::default();
        let used = Family::<GpuLabels, Gauge>::default();
        let gpu_total = Family::<GpuLabels, Gauge>::default();
        let temperature = Family::<GpuLabels, Gauge>::default();
        let utilization = Family::<GpuLabels, FloatGauge>::default();
        let ecc = Family::<GpuLabels, Gauge>::default();
        const MIB: i64 = 1024 * 1024;
        for (node, f) in telemetry {
            if !answering.contains(&&node) {
                continue;
            }
            if let Some((f, t)) = f.disk {
                let n = NodeLabels {
                    node: node.to_string(),
                };
                free.get_or_create(&n).set(f as i64);
                total.get_or_create(&n).set(t as i64);
            }
            for g in f.gpus {
                let l = GpuLabels {
                    node: node.to_string(),
                    gpu: g.index.to_string(),
                };
                used.get_or_create(&l)
                    .set(g.memory_used_mb.saturating_mul(MIB));
                gpu_total
                    .get_or_create(&l)
                    .set(g.memory_total_mb.saturating_mul(MIB));
                temperature
                    .get_or_create(&l)
                    .set(i64::from(g.temperature_c));
                utilization
                    .get_or_create(&l)
                    .set(f64::from(g.utilization_percent.clamp(0, 100)) / 100.0);
                ecc.get_or_create(&l).set(g.ecc_errors);
            }
        }
        put(
            enc,
            "node_disk_free_bytes",
            "Free bytes on the node's own filesystems holding weights (shared filers left out)",
            &free,
        )?;
        put(
            enc,
            "node_disk_total_bytes",
            "Size in bytes of the node's own filesystems holding weights",
            &total,
        )?;
        put(
            enc,
            "gpu_memory_used_bytes",
            "GPU memory in use, as the node's latest look saw it",
            &used,
        )?;
        put(
            enc,
            "gpu_memory_total_bytes",
            "GPU memory in all, as the driver reports it",
            &gpu_total,
        )?;
        put(
            enc,
            "gpu_temperature_celsius",
            "GPU temperature, as the node's latest look saw it",
            &temperature,
        )?;
        put(
            enc,
            "gpu_utilization_ratio",
            "GPU utilisation (0-1; 0 also on drivers too old to say)",
            &utilization,
        )?;
        put(
            enc,
            "gpu_ecc_errors",
            "Uncorrected ECC errors the driver counts for the GPU",
            &ecc,
        )
    }
}

/// A histogram read from plain figures (the decider's).
struct Histogram(llmgw_decider::appends::HistogramFigures);

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let h = &self.0;
        encoder.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The log as this server sees it: its appends, its views' lag and the
/// background verification of the hash chain.
#[derive(Debug, Clone)]
pub struct LogMetrics {
    pub lag: Arc<Lag>,
    pub chain: Arc<ChainWatch>,
    /// This server's views, for the events they could not read.
    pub views: Arc<std::sync::RwLock<llmgw_projections::Projections>>,
}

impl Collector for LogMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (skipped, unknown) = {
            let v = self.views.read().unwrap_or_else(|p| p.into_inner());
            (v.skipped, v.unknown.clone())
        };
        put(
            &mut enc,
            "projection_skipped_events",
            "Events this server's views could not read and left out (a newer build's, or undecodable)",
            &ConstCounter::new(skipped),
        )?;
        let kinds = Family::<Vec<(&'static str, String)>, Gauge>::default();
        for (kind, schema) in &unknown {
            kinds
                .get_or_create(&vec![
                    ("type", kind.clone()),
                    ("schema", schema.to_string()),
                ])
                .set(1);
        }
        put(
            &mut enc,
            "projection_unknown_event_kinds",
            "Always 1, for each event type and schema version the views met and this build does not know",
            &kinds,
        )?;
        put(
            &mut enc,
            "projection_lag_events",
            "Events in the log that this server's views have not applied (head minus position)",
            &ConstGauge::new(self.lag.events() as i64),
        )?;
        put(
            &mut enc,
            "projection_lag_seconds",
            "Age of the oldest event this server's views have not applied (0 when caught up)",
            &ConstGauge::new(self.lag.seconds()),
        )?;
        let appends = llmgw_decider::appends::stats();
        put(
            &mut enc,
            "append_seconds",
            "Seconds per append this process made (refused ones included)",
            &Histogram(appends.seconds.figures()),
        )?;
        put(
            &mut enc,
            "append_batch_events",
            "Events per append this process made",
            &Histogram(appends.batch.figures()),
        )?;
        let by_type = Family::<[(&'static str, String); 1], Counter>::default();
        for (t, n) in appends.by_type() {
            by_type.get_or_create(&[("type", t)]).inc_by(n);
        }
        put(
            &mut enc,
            "events_appended",
            "Events this process appended to the log, by event type",
            &by_type,
        )?;
        put(
            &mut enc,
            "chain_verify_failures",
            "Background verifications that found the log's hash chain broken",
            &ConstCounter::new(self.chain.failures()),
        )?;
        put(
            &mut enc,
            "chain_verified_position",
            "The last log position whose hash chain the background verification checked",
            &ConstGauge::new(self.chain.verified() as i64),
        )
    }
}

#[cfg(test)]
mod tests {
    use llmgw_domain::nodes::Inventory;
    use llmgw_domain::replicas::{Placement, Replica};

    use super::*;

    fn node(id: &str, reachability: Reachability, cordoned: bool, draining: bool) -> Node {
        Node {
            id: id.into(),
            inventory: Inventory::default(),
            reachability,
            cordoned,
            draining,
        }
    }

    fn replica(id: &str, model: &str, status: ReplicaStatus) -> Replica {
        Replica {
            placement: Placement {
                replica_id: id.into(),
                model: model.into(),
                profile: "p".into(),
                profile_fp: String::new(),
                pool: "default".into(),
                fabric: None,
                shards: Vec::new(),
                why: String::new(),
            },
            status,
            shards: BTreeMap::new(),
            adopted: false,
            ended: None,
        }
    }

    #[test]
    fn nodes_are_up_only_when_ready_and_models_count_ready_replicas() {
        let mut view = ClusterView::default();
        for n in [
            node("a", Reachability::Ready, false, false),
            node("b", Reachability::Ready, true, false),
            node("c", Reachability::Ready, true, true),
            node("d", Reachability::Unreachable, true, false),
            node("e", Reachability::Lost, false, false),
        ] {
            view.nodes.nodes.insert(n.id.clone(), n);
        }
        for r in [
            replica("r1", "chat", ReplicaStatus::Ready),
            replica("r2", "chat", ReplicaStatus::Starting),
            replica("r3", "code", ReplicaStatus::Failed),
            replica("r4", "gone", ReplicaStatus::Stopped),
        ] {
            view.replicas
                .replicas
                .insert(r.placement.replica_id.clone(), r);
        }
        let f = cluster_figures(&view);
        assert_eq!(
            f.nodes.into_iter().collect::<Vec<_>>(),
            vec![
                ("a".into(), ("ready", true)),
                ("b".into(), ("cordoned", false)),
                ("c".into(), ("draining", false)),
                ("d".into(), ("unreachable", false)),
                ("e".into(), ("lost", false)),
            ]
        );
        assert_eq!(
            f.replicas_ready.into_iter().collect::<Vec<_>>(),
            vec![("chat".into(), 1), ("code".into(), 0)],
            "a model whose replicas all stopped has none placed"
        );
        // A model kept up reads 0 with nothing placed: its failed replica
        // stopped, waiting to be rebuilt.
        let mut kept = llmgw_domain::catalog::Model::named("gone");
        kept.scaling.min = 1;
        // Without profiles it is never started: no series to alert on.
        view.catalog.models.insert("gone".into(), kept.clone());
        assert_eq!(cluster_figures(&view).replicas_ready.get("gone"), None);
        kept.profiles = vec![llmgw_domain::catalog::Profile::cpu(
            "p",
            llmgw_domain::catalog::Engine::Sim,
        )];
        view.catalog.models.insert("gone".into(), kept);
        let f = cluster_figures(&view);
        assert_eq!(f.replicas_ready.get("gone"), Some(&0));
        assert_eq!(
            f.replicas.into_iter().collect::<Vec<_>>(),
            vec![("failed", 1), ("ready", 1), ("starting", 1)],
            "stopped replicas are not counted"
        );
    }

    #[test]
    fn disk_leaves_shared_filers_out_and_an_empty_heartbeat_keeps_the_gpus() {
        let t = Telemetry::default();
        let storage = |free, total, shared| v1::Storage {
            path: "/w".into(),
            free_bytes: free,
            total_bytes: total,
            shared,
        };
        t.registered(&v1::Register {
            node_id: "a".into(),
            storage: vec![storage(10, 100, false), storage(1000, 10000, true)],
            gpus: vec![v1::Gpu {
                index: 0,
                memory_total_mb: 80,
                memory_used_mb: 5,
                temperature_c: 40,
                ..v1::Gpu::default()
            }],
            ..v1::Register::default()
        });
        let a = t.snapshot()["a"].clone();
        assert_eq!(a.disk, Some((10, 100)));
        assert_eq!(a.gpus[0].memory_used_mb, 5);
        t.heartbeat(
            &"a".into(),
            &v1::Heartbeat {
                storage: vec![storage(7, 100, false)],
                ..v1::Heartbeat::default()
            },
        );
        let a = t.snapshot()["a"].clone();
        assert_eq!(a.disk, Some((7, 100)));
        assert_eq!(a.gpus[0].temperature_c, 40, "kept");
        t.heartbeat(
            &"a".into(),
            &v1::Heartbeat {
                gpu_figures: vec![v1::GpuFigures {
                    index: 0,
                    temperature_c: 71,
                    ..v1::GpuFigures::default()
                }],
                ..v1::Heartbeat::default()
            },
        );
        assert_eq!(t.snapshot()["a"].gpus[0].temperature_c, 71);
        assert_eq!(
            t.snapshot()["a"].disk,
            None,
            "no storage reported: unknown, not 0"
        );
    }
}
