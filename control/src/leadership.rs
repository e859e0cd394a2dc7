//! Leadership: this server's office under the append lease.
//!
//! A server leads while it holds the lease: it acquires it (or waits for
//! it, sooner when an agent at the door finds it run out), takes office
//! (catches up the whole log, resets the node clocks, records
//! `LeadershipAcquired` and applies the configuration's catalog), renews
//! at a third of the ttl, and stops acting the moment a renewal or an
//! append is refused, or when no renewal has been granted by the time the
//! lease would run out by its own clock. On a clean stop it steps down, so
//! that a standby need not wait out the ttl.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use llmgw_domain::Command;
use llmgw_eventstore::{EventStore, LeaseToken, StoreError, Writer};

use crate::{ControlError, ControlPlane};

/// The least time between two attempts at the lease, however often agents
/// nudge.
const NUDGE_GAP: Duration = Duration::from_millis(50);

/// The wait before asking again for a renewal that failed on the way.
const RENEW_RETRY: Duration = Duration::from_millis(200);

impl ControlPlane {
    pub(crate) fn lose_leadership(&self, token: &LeaseToken) {
        let was = self.lease.send_if_modified(|t| {
            if t.as_ref() == Some(token) {
                *t = None;
                true
            } else {
                false
            }
        });
        if was {
            // Commands ride the agents' streams: dropping them sends the
            // agents on to the new leader.
            self.agents.drop_all();
            self.observed.forget_adoptions();
        }
    }

    pub(crate) async fn step_down(&self) {
        let Some(token) = self.lease.borrow().clone() else {
            return;
        };
        self.lease.send_replace(None);
        let released = llmgw_domain::event::LeadershipEvent::LeadershipReleased {
            holder: token.holder.clone(),
            epoch: token.epoch,
        };
        if let Err(e) = self
            .decider
            .record(
                &Writer::Leader(token.clone()),
                &self.own(),
                llmgw_domain::Event::Leadership(released),
            )
            .await
        {
            tracing::warn!(error = %e, "could not record stepping down");
        }
        match self.store.release_lease(&token).await {
            Ok(_) => tracing::info!(epoch = token.epoch, "stepped down; the lease is free"),
            Err(e) => {
                tracing::warn!(error = %e, "could not release the lease; it expires on its own")
            }
        }
        // Only now are the agents' streams closed: an agent that dials a
        // standby next finds the lease free, and that standby takes it at
        // once instead of telling it to wait for the ttl.
        self.agents.drop_all();
        self.observed.forget_adoptions();
    }

    pub(crate) async fn lead(self: Arc<Self>) {
        let ttl = self.config.lease_ttl;
        // The epoch this process was last granted: only that lease, its
        // own, is its to take back before it runs out; under its name at
        // another epoch, the lease is another process's (taken in one
        // statement by the store, so two cannot both be granted it).
        let mut granted = None;
        let mut told = None;
        let mut compared = false;
        // The leader whose settings were last compared with this server's.
        let mut weighed = None;
        loop {
            let asked = tokio::time::Instant::now();
            let taken = self
                .store
                .take_lease(&self.config.instance, ttl, granted)
                .await;
            let lease = match taken {
                Ok(l) => l,
                Err(StoreError::LeaseHeld { holder, epoch, .. }) => {
                    let newer = self.epoch_seen.fetch_max(epoch, Ordering::Relaxed) < epoch;
                    if holder == self.config.instance {
                        if told != Some(epoch) {
                            told = Some(epoch);
                            tracing::error!(
                                instance = %self.config.instance,
                                epoch,
                                "another process holds the lease under this server's name: two servers share control.instance (give each its own), or this server's previous run has not yet let go; standing by until the lease runs out"
                            );
                        }
                    } else if newer {
                        tracing::info!(leader = %holder, epoch, "standing by: another server leads");
                    }
                    if !std::mem::replace(&mut compared, true) {
                        self.compare_file_with_catalog();
                    }
                    // Once per leader, once its settings are in the log (a
                    // leader taking office this moment records them next).
                    if holder != self.config.instance
                        && weighed != Some(epoch)
                        && self.compare_settings_with_leader(&holder, epoch).await
                    {
                        weighed = Some(epoch);
                    }
                    self.wait_for_lease().await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot reach the store for the lease");
                    tokio::time::sleep(self.config.lease_poll).await;
                    continue;
                }
            };
            let token = lease.token.clone();
            granted = Some(token.epoch);
            self.epoch_seen.fetch_max(token.epoch, Ordering::Relaxed);
            if let Err(e) = self.take_office(&token).await {
                tracing::error!(error = %e, "could not take office; releasing the lease");
                let _ = self.store.release_lease(&token).await;
                tokio::time::sleep(self.config.lease_poll).await;
                continue;
            }
            tracing::info!(instance = %self.config.instance, epoch = token.epoch, "leading (epoch {})", token.epoch);
            // Renew well inside the ttl. A renewal the store refuses ends
            // the office at once; one that fails on the way (a lost
            // connection) is tried again, but only until the lease would
            // run out by this server's clock, counted from when the last
            // granted renewal was asked: a store that does not answer (a
            // partition, a hung server) cannot keep a leader acting on a
            // lease the database has already let go.
            let mut runs_out = asked + ttl;
            'office: loop {
                tokio::time::sleep(ttl / 3).await;
                let mut failed = false;
                loop {
                    if self.lease.borrow().as_ref() != Some(&token) {
                        break 'office;
                    }
                    let at = tokio::time::Instant::now();
                    let renewed =
                        tokio::time::timeout_at(runs_out, self.store.renew_lease(&token, ttl))
                            .await;
                    match renewed {
                        Ok(Ok(_)) => {
                            runs_out = at + ttl;
                            break;
                        }
                        Ok(Err(e)) if e.is_transient() && at + RENEW_RETRY < runs_out => {
                            if !failed {
                                tracing::warn!(error = %e, "renewing the lease failed; trying again while it lasts");
                                failed = true;
                            }
                            tokio::time::sleep(RENEW_RETRY).await;
                        }
                        Ok(Err(e)) => {
                            tracing::error!(error = %e, "lost the lease; no longer leading");
                            self.lose_leadership(&token);
                            break 'office;
                        }
                        Err(_) => {
                            tracing::error!(
                                epoch = token.epoch,
                                "the store did not renew the lease before it ran out; no longer leading"
                            );
                            self.lose_leadership(&token);
                            break 'office;
                        }
                    }
                }
            }
        }
    }

    /// A standby applies its own file's models when it takes office: a
    /// model it defines otherwise than the catalog the leader keeps (or
    /// that the catalog lacks) changes then, so it says so as it stands
    /// by, naming them.
    fn compare_file_with_catalog(&self) {
        // From the views this server keeps following the log anyway: the
        // decider's own state is only caught up when taking office.
        let differ: Vec<&str> = {
            let views = self.views.read().unwrap_or_else(|p| p.into_inner());
            let catalog = &views.cluster.catalog.models;
            self.config
                .models
                .iter()
                .filter(|m| catalog.get(&m.name) != Some(*m))
                .map(|m| m.name.as_str())
                .collect()
        };
        if !differ.is_empty() {
            tracing::warn!(
                models = %differ.join(", "),
                "this server's configuration file defines models otherwise than the catalog the leader keeps: they will change when this server takes office; keep every server's models alike"
            );
        }
    }

    /// The leader's settings are the cluster's while it leads (timings,
    /// engines, the mirror); this server's own take over when it takes
    /// office. A difference changes how the fleet is run at a failover,
    /// so a standby says so as it stands by, naming each setting, as it
    /// does for models. From the leader's `LeadershipAcquired`; older logs
    /// recorded none, and then nothing is said.
    /// Whether the leader's settings were found (and so compared).
    async fn compare_settings_with_leader(&self, leader: &str, epoch: u64) -> bool {
        let theirs = match self.recorded_settings(epoch).await {
            Ok(Some(s)) => s,
            Ok(None) => return false,
            Err(e) => {
                tracing::debug!(error = %e, "could not read the leader's settings to compare");
                return false;
            }
        };
        // A loopback admin address reaches the leader only from its own
        // machine: commands sent to this standby from elsewhere cannot go
        // on to it. Said as the standby stands by, not when the first
        // command fails. This server's own address is most often this
        // server's run before a restart, whose lease it waits out: said
        // as that first.
        let own = self
            .admin_url
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Ok(Some((_, url))) = self.leader_admin().await
            && loopback(&url)
        {
            if own.as_deref() == Some(url.as_str()) {
                tracing::warn!(
                    leader,
                    admin = %url,
                    "the leader recorded this server's own admin address: if it was this server before a restart, this server takes office once its lease runs out; if another server runs, set control.advertise_admin on every server to an address the others reach"
                );
            } else {
                tracing::warn!(
                    leader,
                    admin = %url,
                    "the leader recorded a loopback admin address: a command sent to this standby reaches it only if both run on one machine; set control.advertise_admin on every server to an address the others reach"
                );
            }
        }
        let differ = settings_differ(&self.config.settings(), &theirs);
        if !differ.is_empty() {
            tracing::warn!(
                leader,
                settings = %differ.join("; "),
                "this server's control settings differ from the leader's: they will change when this server takes office; keep every server's settings alike"
            );
        }
        true
    }

    async fn recorded_settings(
        &self,
        epoch: u64,
    ) -> Result<Option<llmgw_domain::event::ControlSettings>, StoreError> {
        use llmgw_domain::Event;
        use llmgw_domain::event::LeadershipEvent;
        let mut after = 0;
        loop {
            let page = self.store.read_stream("leadership", after, 500).await?;
            let Some(last) = page.last() else { break };
            after = last.stream_version;
            for r in &page {
                if let Ok(Event::Leadership(LeadershipEvent::LeadershipAcquired {
                    epoch: e,
                    settings,
                    ..
                })) = Event::decode(&r.event_type, r.schema_version, &r.payload)
                    && e == epoch
                {
                    // One per epoch: nothing after it is asked for.
                    return Ok(settings);
                }
            }
        }
        Ok(None)
    }

    /// Until the next attempt at the lease: its poll, or sooner when an
    /// agent at the door finds the lease run out (never more often than
    /// every [`NUDGE_GAP`], however many agents knock).
    async fn wait_for_lease(&self) {
        let poll = self.config.lease_poll;
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            _ = async {
                tokio::time::sleep(NUDGE_GAP.min(poll)).await;
                self.nudge.notified().await;
            } => {}
        }
    }

    /// A new leader catches up the whole log before its first decision,
    /// gives every known node a fresh heartbeat clock, and applies the
    /// configuration's models (the file wins over the store).
    async fn take_office(&self, token: &LeaseToken) -> Result<(), ControlError> {
        let state = self.decider.state().await?;
        self.observed.reset_clocks(state.nodes.nodes.keys());
        {
            // What load grew is taken over afresh, not from a term ago.
            let now = self.now();
            let mut m = self.memory();
            m.rt.busy.clear();
            m.rt.grown.clear();
            m.adopt_load = true;
            // When an on-demand model was last asked for is memory, not
            // log: a new leader (or this one restarted) knew none, and
            // stopped every running on-demand model at once. One that
            // runs counts as asked for now: it stays its idle time.
            // Starting or ready only: one draining or failed was being
            // let go (an idle drain, an eviction), and is not wanted.
            let running = |r: &&llmgw_domain::replicas::Replica| {
                matches!(
                    r.status,
                    llmgw_domain::replicas::ReplicaStatus::Starting
                        | llmgw_domain::replicas::ReplicaStatus::Ready
                )
            };
            for r in state.replicas.replicas.values().filter(running) {
                let model = &r.placement.model;
                if state
                    .catalog
                    .models
                    .get(model)
                    .is_some_and(|c| c.on_demand())
                {
                    m.rt.demand.entry(model.clone()).or_insert(now);
                }
            }
        }
        self.telemetry.clear();
        let writer = Writer::Leader(token.clone());
        let acquired = llmgw_domain::event::LeadershipEvent::LeadershipAcquired {
            holder: token.holder.clone(),
            epoch: token.epoch,
            admin: self
                .admin_url
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            agent: self
                .agent_url
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            settings: Some(self.config.settings()),
        };
        let origin = self.own();
        self.decider
            .record(&writer, &origin, llmgw_domain::Event::Leadership(acquired))
            .await?;
        let apply = llmgw_domain::catalog::CatalogCommand::ApplyModels(self.config.models.clone());
        self.decider
            .execute(&writer, &origin, vec![Command::Catalog(apply)])
            .await?;
        // The file adds and updates; it never removes (a standby whose file
        // is older must not take models down as it takes office). Models
        // it does not name are said, so that one deleted from the file
        // and still serving is not a surprise.
        if !self.config.models.is_empty() {
            let elsewhere: Vec<String> = self
                .decider
                .read(|state| {
                    state
                        .catalog
                        .models
                        .keys()
                        .filter(|name| !self.config.models.iter().any(|m| &m.name == *name))
                        .cloned()
                        .collect()
                })
                .await?;
            if !elsewhere.is_empty() {
                tracing::info!(
                    models = %elsewhere.join(", "),
                    "the catalog holds models this server's file does not name (added with ctl, or by an earlier file); they stay until `llmgw ctl model remove`"
                );
            }
        }
        self.lease.send_replace(Some(token.clone()));
        self.wake.notify_one();
        Ok(())
    }
}

/// Whether `url`'s host is a loopback address (or `localhost`).
fn loopback(url: &str) -> bool {
    let host = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?'])
        .next()
        .unwrap_or_default();
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Each setting that differs, as `name: OURS here, THEIRS at the leader`,
/// by the names the log records them under.
fn settings_differ(
    ours: &llmgw_domain::event::ControlSettings,
    theirs: &llmgw_domain::event::ControlSettings,
) -> Vec<String> {
    let as_map = |s| match serde_json::to_value(s) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let (ours, theirs) = (as_map(ours), as_map(theirs));
    let mut names: Vec<&String> = ours.keys().chain(theirs.keys()).collect();
    names.sort();
    names.dedup();
    let none = serde_json::Value::Null;
    names
        .into_iter()
        .filter_map(|n| {
            let (a, b) = (ours.get(n).unwrap_or(&none), theirs.get(n).unwrap_or(&none));
            (a != b).then(|| format!("{n}: {a} here, {b} at the leader"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use llmgw_domain::event::ControlSettings;

    #[test]
    fn each_setting_that_differs_is_named_with_both_values() {
        let ours = ControlSettings {
            lost_after_ms: 30_000,
            engines: vec!["vllm@0.11.0 (github)".into()],
            ..ControlSettings::default()
        };
        let theirs = ControlSettings {
            lost_after_ms: 60_000,
            mirror_url: Some("http://mirror:8090".into()),
            ..ControlSettings::default()
        };
        assert_eq!(
            super::settings_differ(&ours, &theirs),
            vec![
                "engines: [\"vllm@0.11.0 (github)\"] here, null at the leader".to_owned(),
                "lost_after_ms: 30000 here, 60000 at the leader".to_owned(),
                "mirror_url: null here, \"http://mirror:8090\" at the leader".to_owned(),
            ]
        );
        assert!(super::settings_differ(&ours, &ours).is_empty());
    }

    #[test]
    fn a_loopback_admin_address_is_told_apart() {
        for url in [
            "http://127.0.0.1:9090",
            "http://localhost:9090",
            "http://[::1]:9090",
        ] {
            assert!(super::loopback(url), "{url}");
        }
        for url in ["http://10.0.0.11:9090", "https://cp-1.internal:9090"] {
            assert!(!super::loopback(url), "{url}");
        }
    }
}
