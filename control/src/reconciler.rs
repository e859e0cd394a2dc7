//! The reconciler's loop and the node clocks: the leader's side effects of
//! the pure plan in `llmgw_domain::reconcile`.

use std::collections::BTreeMap;
use std::sync::Arc;

use llmgw_api::v1::{self, control_message};
use llmgw_domain::Command;
use llmgw_domain::clocks::Clocks;
use llmgw_domain::ids::ReplicaId;
use llmgw_domain::nodes::{NodeCommand, Reachability};
use llmgw_domain::reconcile::{self, Action, Settings, ShardOnNode};
use llmgw_domain::replicas::{ReplicaCommand, ReplicaStatus};

use crate::{ControlPlane, drain_watch};

/// Passes every `interval`, and sooner when an append wakes it.
pub(crate) async fn run(cp: Arc<ControlPlane>) {
    let mut views_at = cp.views_at.clone();
    let mut demands = cp.demands_read();
    // Kept across the views' other changes (usage batches, every flush),
    // which would otherwise put the interval's pass off for ever.
    let mut next: Option<tokio::time::Instant> = None;
    loop {
        let due = *next.get_or_insert_with(|| tokio::time::Instant::now() + cp.next_pass_in());
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            _ = cp.wake.notified() => {
                // A burst of appends (a fleet registering) makes one pass.
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            // Another server recorded an ask for an on-demand model: the
            // client waits for it, so the leader does not wait for its
            // interval (a cold start through a standby took 8 s more).
            Ok(()) = views_at.changed() => {
                let now = cp.demands_read();
                if now == demands {
                    continue;
                }
                demands = now;
            }
        }
        next = None;
        if !cp.is_leader() {
            continue;
        }
        // A span per pass: its appends and the agents told are its children.
        let span = tracing::info_span!("reconcile", actions = tracing::field::Empty);
        if let Err(e) = tracing::Instrument::instrument(cp.pass(), span).await {
            tracing::warn!(error = %e, "reconciler pass failed; retrying on the next one");
        }
        cp.passes.send_modify(|n| *n += 1);
    }
}

use crate::Fullness;

impl ControlPlane {
    /// The reconciler's interval, shortened while a replica drains.
    fn next_pass_in(&self) -> std::time::Duration {
        let draining = self.draining.load(std::sync::atomic::Ordering::Relaxed);
        if draining {
            self.config.interval.min(DRAINING_PASS)
        } else {
            self.config.interval
        }
    }
}

/// The asks other servers recorded, each kept as asked when the log
/// recorded it (never later than `now`, whatever the clocks say), and a
/// newer stamp already held kept.
fn note_asks(
    demand: &mut BTreeMap<String, llmgw_domain::UnixMillis>,
    asks: Vec<(String, llmgw_domain::UnixMillis)>,
    now: llmgw_domain::UnixMillis,
) {
    for (model, at) in asks {
        let at = at.min(now);
        let stamp = demand.entry(model).or_insert(at);
        *stamp = (*stamp).max(at);
    }
}

/// How often passes come while a replica drains.
const DRAINING_PASS: std::time::Duration = std::time::Duration::from_millis(250);

/// Marks nodes unreachable, then lost, when their heartbeats stop.
pub(crate) async fn liveness(cp: Arc<ControlPlane>) {
    let tick = (cp.config.unreachable_after / 5).clamp(
        std::time::Duration::from_millis(50),
        std::time::Duration::from_secs(1),
    );
    loop {
        tokio::time::sleep(tick).await;
        if !cp.is_leader() {
            continue;
        }
        let commands = due_marks(&cp);
        if !commands.is_empty()
            && let Err(e) = cp.execute(&cp.own(), commands).await
        {
            tracing::warn!(error = %e, "liveness: could not record a node's state");
        }
    }
}

/// Nodes whose heartbeat clocks ran out. Read from the views, not the
/// decider: no clone of the state and no read of the log per tick. A mark
/// the views have not caught up with yet is decided again and appends
/// nothing.
fn due_marks(cp: &ControlPlane) -> Vec<Command> {
    let mut commands = Vec::new();
    let views = cp.views.read().unwrap_or_else(|p| p.into_inner());
    for node in views.cluster.nodes.nodes.values() {
        let Some(seen) = cp.observed.last_seen(&node.id) else {
            cp.observed.start_clock(&node.id);
            continue;
        };
        let age = seen.elapsed();
        if age >= cp.config.lost_after && node.reachability != Reachability::Lost {
            tracing::warn!(node = %node.id, ?age, "node lost; its work is rebuilt elsewhere");
            commands.push(Command::Node(NodeCommand::MarkLost {
                node_id: node.id.clone(),
            }));
        } else if age >= cp.config.unreachable_after && node.reachability == Reachability::Ready {
            tracing::warn!(node = %node.id, ?age, "node unreachable; no new placement there");
            commands.push(Command::Node(NodeCommand::MarkUnreachable {
                node_id: node.id.clone(),
            }));
        }
    }
    commands
}

fn replica_id() -> ReplicaId {
    // Time-ordered, so that "newest" is the largest id. Whole: within one
    // millisecond a v7 id differs only in its later digits, and one pass
    // places replicas of several models in less.
    ReplicaId::from(format!("r-{}", uuid::Uuid::now_v7().simple()))
}

impl ControlPlane {
    pub(crate) fn settings(&self) -> Settings {
        Settings {
            place: llmgw_domain::placement::PlaceOptions {
                port_range: self.config.port_range,
            },
            drain_grace_ms: self.config.drain_grace.as_millis() as i64,
            min_lifetime_ms: self.config.min_lifetime.as_millis() as i64,
            evict_idle_ms: self.config.evict_idle.as_millis() as i64,
            ..Settings::default()
        }
    }

    pub(crate) async fn pass(&self) -> Result<(), crate::ControlError> {
        let now = self.now();
        // Read to the log's head first: a demand recorded since the last
        // pass is acted on in this one. Stamped when it was asked for: an
        // idle model a new leader read a demand for, recorded before its
        // replica idled out and stopped, was started again on taking
        // office and kept for another idle time.
        let demanded = self.decider.take_demanded().await?;
        note_asks(&mut self.memory().rt.demand, demanded, now);
        self.watch_drains(now).await?;
        // Planned under a read of the state; the plan carries everything
        // its messages need, so nothing of the state is copied out.
        let plan = self
            .decider
            .read_with_clocks(|state, clocks| {
                let mut rt = self.runtime(state, clocks, now);
                self.grow(state, &mut rt);
                reconcile::plan(state, &rt, &self.settings(), |_| replica_id())
            })
            .await?;
        {
            let mut m = self.memory();
            for e in &plan.unplaced {
                let summary = e.summary();
                if m.unplaced.get(&e.model) != Some(&summary) {
                    tracing::info!(model = %e.model, "{summary}");
                    m.unplaced.insert(e.model.clone(), summary);
                }
            }
            // The plan's backoffs, logged when one begins or moves on.
            let backing_off: BTreeMap<String, Option<llmgw_domain::UnixMillis>> = plan
                .backing_off
                .iter()
                .map(|b| (b.model.clone(), b.until))
                .collect();
            for (model, until) in &backing_off {
                if m.backing_off.get(model) != Some(until)
                    && let Some(t) = until
                {
                    tracing::info!(%model, delay_ms = (*t - now).max(0), "backing off before rebuilding");
                }
            }
            m.backing_off = backing_off;
        }
        tracing::Span::current().record("actions", plan.actions.len());
        for action in plan.actions {
            if let Err(e) = self.carry_out(action).await {
                tracing::warn!(error = %e, "a reconciler action failed");
            }
        }
        Ok(())
    }

    /// Asks the engines of replicas draining for longer than the settle
    /// time whether anything is left on them; those that say no stop in
    /// this pass. While anything drains, passes come often, so that an
    /// idle engine is stopped within a fraction of a second.
    async fn watch_drains(&self, now: llmgw_domain::UnixMillis) -> Result<(), crate::ControlError> {
        let settle = drain_watch::SETTLE_MS.min(self.config.drain_grace.as_millis() as i64);
        let (targets, draining) = self
            .decider
            .read_with_clocks(|state, clocks| {
                let draining = state
                    .replicas
                    .replicas
                    .values()
                    .any(|r| r.status == ReplicaStatus::Draining);
                let targets =
                    drain_watch::targets(state, &clocks.drain_since.replicas, now, settle);
                (targets, draining)
            })
            .await?;
        self.draining
            .store(draining, std::sync::atomic::Ordering::Relaxed);
        let idle = drain_watch::idle(&self.http, targets).await;
        for id in &idle {
            tracing::info!(replica = %id, "draining replica is idle; stopping it before its grace runs out");
        }
        self.memory().rt.idle = idle;
        Ok(())
    }

    /// Notes which models' engines are full now and works out what load
    /// asks of each; remembered for the next pass (and the status page).
    fn grow(&self, state: &llmgw_domain::State, rt: &mut reconcile::Runtime) {
        rt.full.clear();
        if let Some(Fullness(of)) = self.fullness.get() {
            // An on-demand model serving a request is asked for: a stream
            // longer than its idle time was cut when only the request's
            // arrival counted.
            for m in state.catalog.models.values().filter(|m| m.on_demand()) {
                if of(&m.name).in_use {
                    rt.demand.insert(m.name.clone(), rt.now);
                    self.memory().rt.demand.insert(m.name.clone(), rt.now);
                }
            }
            let growable =
                (state.catalog.models.values()).filter(|m| m.scaling.max > m.scaling.min.max(1));
            for m in growable {
                let load = of(&m.name);
                if load.saturation >= 1.0 {
                    rt.full.insert(m.name.clone());
                }
                if load.in_use || load.saturation >= 1.0 {
                    rt.busy.insert(m.name.clone(), rt.now);
                }
            }
        }
        if std::mem::take(&mut self.memory().adopt_load) {
            for (model, n) in reconcile::adopted(state, rt, &self.settings()) {
                tracing::info!(%model, replicas = n, "taking over the replicas load grew");
                rt.busy.insert(model.clone(), rt.now);
                rt.grown.insert(model, n);
            }
        }
        let grown = reconcile::grown(state, rt, &self.settings());
        for (model, n) in &grown {
            if rt.grown.get(model) != Some(n) {
                tracing::info!(%model, replicas = n, full = rt.full.contains(model), "load asks for a different number of replicas");
            }
        }
        for model in rt.grown.keys().filter(|m| !grown.contains_key(*m)) {
            tracing::info!(%model, "quiet for its idle time: back to its floor");
        }
        rt.grown = grown;
        let mut m = self.memory();
        m.rt.busy = rt.busy.clone();
        m.rt.grown = rt.grown.clone();
    }

    /// This pass's facts: the clocks read from the log (drains begun,
    /// backoffs after failures) and, from memory, on-demand requests and
    /// the processes agents hold.
    fn runtime(
        &self,
        state: &llmgw_domain::State,
        clocks: &Clocks,
        now: llmgw_domain::UnixMillis,
    ) -> reconcile::Runtime {
        let mut m = self.memory();
        m.rt.now = now;
        let m = &mut *m;
        reconcile::asked_at_change(
            state,
            &clocks.made_on_demand,
            &mut m.made_on_demand_taken,
            &mut m.rt.demand,
        );
        m.rt.drain_since = clocks.drain_since.clone();
        m.rt.placed_at = clocks.placed_at.clone();
        m.rt.not_before = clocks.backoffs(
            self.config.base_backoff.as_millis() as i64,
            self.config.max_backoff.as_millis() as i64,
        );
        m.rt.held = self.observed.held();
        // Ready ones only: the others take no placement anyway, and a node
        // long gone would otherwise be counted on every pass.
        m.rt.unheard = self.observed.unheard(
            (state.nodes.nodes.values())
                .filter(|n| n.reachability == Reachability::Ready)
                .map(|n| &n.id),
        );
        m.rt.clone()
    }

    /// Appends what `action` decides, then sends the messages it names:
    /// nothing here reads the state.
    async fn carry_out(&self, action: Action) -> Result<(), crate::ControlError> {
        match action {
            Action::Place {
                placement: p,
                starts,
            } => {
                tracing::info!(replica = %p.replica_id, model = %p.model, profile = %p.profile, why = %p.why, "placing");
                self.memory().unplaced.remove(&p.model);
                self.execute(
                    &self.own(),
                    vec![Command::Replica(ReplicaCommand::Place(p))],
                )
                .await?;
                for start in &starts {
                    if !self.send_start(start) {
                        tracing::info!(node = %start.shard.node_id, shard = %start.shard.shard_id, "node not connected; it gets the start when it registers");
                    }
                }
            }
            Action::Fail { replica_id, reason } => {
                tracing::warn!(replica = %replica_id, %reason, "replica failed");
                self.execute(
                    &self.own(),
                    vec![Command::Replica(ReplicaCommand::Fail {
                        replica_id,
                        reason,
                    })],
                )
                .await?;
            }
            Action::Stop {
                replica_id,
                reason,
                shards,
                ..
            } => {
                // Decided (and fenced by the store) before any agent is
                // told: a deposed leader's stop goes no further than its
                // refused append.
                tracing::info!(replica = %replica_id, %reason, "stopping");
                self.execute(
                    &self.own(),
                    vec![Command::Replica(ReplicaCommand::Stop {
                        replica_id,
                        reason,
                    })],
                )
                .await?;
                for s in shards {
                    self.agents.send(
                        &s.node_id,
                        control_message::Msg::Stop(v1::StopShard {
                            shard_id: s.shard_id.into_string(),
                        }),
                    );
                }
            }
            Action::Evict {
                replica_id,
                model,
                for_model,
                shards,
            } => {
                tracing::info!(replica = %replica_id, model = %for_model, "evicting an idle replica to make room");
                // Its model is wanted again only when asked again: else the
                // room would go back to it, or it would evict in its turn.
                self.memory().rt.demand.remove(&model);
                let why = format!("evicted, idle, to make room for {for_model}");
                self.drain(replica_id, shards, why).await?;
            }
            Action::Drain {
                replica_id,
                shards,
                why,
            } => {
                tracing::info!(replica = %replica_id, %why, "draining");
                self.drain(replica_id, shards, why).await?;
            }
            Action::FinishNodeDrain { node_id } => {
                tracing::info!(node = %node_id, "drain finished; the node stays cordoned");
                self.execute(
                    &self.own(),
                    vec![Command::Node(NodeCommand::FinishDrain { node_id })],
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Takes a replica out of routing and tells its agents to let in-flight
    /// work finish.
    async fn drain(
        &self,
        replica_id: ReplicaId,
        shards: Vec<ShardOnNode>,
        why: String,
    ) -> Result<(), crate::ControlError> {
        self.execute(
            &self.own(),
            vec![Command::Replica(ReplicaCommand::Drain {
                replica_id,
                why: Some(why),
            })],
        )
        .await?;
        for s in shards {
            self.agents.send(
                &s.node_id,
                control_message::Msg::Drain(v1::DrainShard {
                    shard_id: s.shard_id.into_string(),
                }),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use llmgw_domain::UnixMillis;

    use super::*;

    /// An ask read back by a server taking office counts from when it was
    /// made: older than the model's idle time, it starts nothing (it was
    /// stamped with the moment of reading, and an idled-out model started
    /// again on every failover). A newer stamp held here is kept, and an
    /// ask from a clock ahead of this one counts as now.
    #[test]
    fn an_ask_counts_from_when_the_log_recorded_it() {
        let now = UnixMillis(100_000);
        let mut demand = BTreeMap::from([("held".to_owned(), UnixMillis(99_000))]);
        note_asks(
            &mut demand,
            vec![
                ("old".into(), UnixMillis(10_000)),
                ("held".into(), UnixMillis(50_000)),
                ("ahead".into(), UnixMillis(200_000)),
            ],
            now,
        );
        assert_eq!(demand["old"], UnixMillis(10_000));
        assert_eq!(demand["held"], UnixMillis(99_000));
        assert_eq!(demand["ahead"], now);
        // The plan's floor reads it so: a model idle 60 s asked for 90 s
        // ago wants no replica.
        let mut lazy = llmgw_domain::catalog::Model::named("old");
        lazy.scaling.idle_timeout_s = Some(60);
        lazy.profiles.push(llmgw_domain::catalog::Profile::cpu(
            "sim",
            llmgw_domain::catalog::Engine::Sim,
        ));
        let rt = reconcile::Runtime {
            now,
            demand,
            ..reconcile::Runtime::default()
        };
        assert_eq!(reconcile::desired(&lazy, &rt, &Settings::default()), 0);
    }
}
