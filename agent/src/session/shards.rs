//! The shards the control plane asks for: starts (after any weights
//! fetch), stops, drains, and their status back to it.

use std::time::Duration;

use llmgw_api::v1::{self, control_message};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Agent, Running, wire_state};
use crate::engines::{GpuInfo, Profile, ShardSpec};
use crate::state_files;
use crate::supervisor::{self, State, SupervisorOptions};

/// The most lines one LogsReply carries.
const MAX_LOG_LINES: usize = 2000;
/// The log source naming the agent's own log.
const AGENT_SOURCE: &str = "agent";

/// The longest output line a status carries: a failure's tail must fit
/// one message, whatever an engine printed.
const MAX_STATUS_LINE: usize = 4096;

fn clip(line: &str) -> String {
    if line.len() <= MAX_STATUS_LINE {
        return line.to_owned();
    }
    let mut end = MAX_STATUS_LINE;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// The discovered GPUs a shard was given, in its order.
fn selected_gpus(known: &[GpuInfo], indices: &[u32]) -> Result<Vec<GpuInfo>, String> {
    indices
        .iter()
        .map(|i| {
            known
                .iter()
                .find(|g| g.index == *i)
                .cloned()
                .ok_or_else(|| {
                    format!(
                        "GPU {i} is not on this node (discovery found {})",
                        known.len()
                    )
                })
        })
        .collect()
}

impl Agent {
    /// The tail of one engine's log (by shard id), and every log this node
    /// can show, the agent's own log (source `agent`) among them.
    pub(super) fn logs(&self, req: &v1::LogsRequest) -> v1::LogsReply {
        let mut reply = v1::LogsReply {
            request_id: req.request_id.clone(),
            ..v1::LogsReply::default()
        };
        let lines = match usize::try_from(req.lines) {
            Ok(0) | Err(_) => 200,
            Ok(n) => n.min(MAX_LOG_LINES),
        };
        let dir = self.config.work_dir.as_deref();
        let mut sources: Vec<String> = dir
            .and_then(|d| std::fs::read_dir(d).ok())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix("shard-")
                    .and_then(|n| n.strip_suffix(".log"))
                    .map(str::to_owned)
            })
            .collect();
        sources.sort();
        if self.config.agent_log.is_some() {
            sources.insert(0, AGENT_SOURCE.into());
        }
        reply.sources = sources;
        if req.source.is_empty() {
            return reply;
        }
        if req.source == AGENT_SOURCE
            && let Some(log) = &self.config.agent_log
        {
            reply.lines = log.tail(lines);
            return reply;
        }
        if !reply.sources.contains(&req.source) {
            reply.error = format!(
                "no log named {}; this node has: {}",
                req.source,
                if reply.sources.is_empty() {
                    "none".into()
                } else {
                    reply.sources.join(", ")
                }
            );
            return reply;
        }
        if let Some(path) = dir.and_then(|d| state_files::log_path(d, &req.source).ok()) {
            reply.lines = supervisor::file_tail(&path, lines)
                .lines()
                .map(str::to_owned)
                .collect();
        }
        reply
    }
    pub(super) fn shard_status(&mut self, shard_id: &str) -> Option<v1::ShardStatus> {
        let r = self.shards.get(shard_id)?;
        let st = r.status.borrow().clone();
        let state = st.state;
        let out = v1::ShardStatus {
            node_id: self.config.node_id.clone(),
            replica_id: r.start.replica_id.clone(),
            shard_id: shard_id.to_owned(),
            state: wire_state(state),
            error: st.error.clone().unwrap_or_default(),
            exit_code: st.exit_code.unwrap_or(0),
            last_output: if st.state == State::Failed {
                st.log_tail.lines().map(clip).collect()
            } else {
                vec![]
            },
            fetch: self
                .progress
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(shard_id)
                .map(|p| v1::FetchProgress {
                    source: p.source.clone(),
                    bytes_done: p.bytes_done as i64,
                    bytes_total: p.bytes_total as i64,
                }),
            port_taken: 0,
        };
        if matches!(st.state, State::Stopped | State::Failed) {
            self.take_shard(shard_id);
            self.forget(shard_id);
        }
        Some(out)
    }

    pub(super) async fn handle(
        &mut self,
        msg: Option<control_message::Msg>,
    ) -> Vec<v1::ShardStatus> {
        match msg {
            Some(control_message::Msg::Start(start)) => self.start(start).into_iter().collect(),
            Some(control_message::Msg::Stop(stop)) => {
                let Some(mut r) = self.take_shard(&stop.shard_id) else {
                    // A start still waiting for another stop is simply dropped.
                    let Some(i) = self
                        .deferred
                        .iter()
                        .position(|d| d.shard_id == stop.shard_id)
                    else {
                        return vec![];
                    };
                    let waiting = self.deferred.remove(i);
                    return vec![v1::ShardStatus {
                        node_id: self.config.node_id.clone(),
                        replica_id: waiting.replica_id,
                        shard_id: stop.shard_id.clone(),
                        state: wire_state(State::Stopped),
                        ..v1::ShardStatus::default()
                    }];
                };
                tracing::info!(shard = %stop.shard_id, "stopping");
                if let Some(f) = r.fetch.take() {
                    f.abort();
                }
                let stopped = |exit_code| v1::ShardStatus {
                    node_id: self.config.node_id.clone(),
                    replica_id: r.start.replica_id.clone(),
                    shard_id: stop.shard_id.clone(),
                    state: wire_state(State::Stopped),
                    exit_code,
                    ..v1::ShardStatus::default()
                };
                let Some(shard) = r.shard.take() else {
                    self.forget(&stop.shard_id);
                    return vec![stopped(0)];
                };
                // Stopping takes up to the stop timeout: off the stream's
                // loop, which must keep heartbeating meanwhile.
                let report = stopped(0);
                let dir = self.config.work_dir.clone();
                let done = self.stopped_tx.clone();
                self.stopping.insert(
                    stop.shard_id.clone(),
                    (
                        u16::try_from(r.start.http_port).unwrap_or(0),
                        r.start
                            .gpu_indices
                            .iter()
                            .map(|g| (*g).max(0) as u32)
                            .collect(),
                    ),
                );
                self.stop_tasks.spawn(async move {
                    let status = shard.stop().await;
                    if let Some(d) = dir {
                        state_files::remove(&d, &report.shard_id);
                    }
                    let _ = done.send(v1::ShardStatus {
                        exit_code: status.exit_code.unwrap_or(0),
                        ..report
                    });
                });
                vec![]
            }
            Some(control_message::Msg::Drain(d)) => {
                if let Some(r) = self.shards.get_mut(&d.shard_id) {
                    // A shard still fetching its weights is drained once it
                    // runs.
                    r.drained = true;
                    if let Some(shard) = &r.shard {
                        shard.drain();
                    }
                }
                self.shard_status(&d.shard_id).into_iter().collect()
            }
            Some(control_message::Msg::RemoveWeights(rw)) => {
                let refused =
                    crate::fetch::remove_weights(self.config.cache_dir.as_deref(), &rw.paths);
                for (path, why) in refused {
                    tracing::warn!(%path, %why, "refused to remove weights");
                }
                vec![]
            }
            Some(control_message::Msg::Ack(a)) => {
                if !a.ok {
                    tracing::warn!(error = %a.error, "the control plane refused a message");
                }
                vec![]
            }
            Some(_) | None => vec![],
        }
    }

    /// A stop done off the loop: its report, then the starts that waited
    /// for what it held.
    pub(super) fn stop_finished(&mut self, st: v1::ShardStatus) -> Vec<v1::ShardStatus> {
        self.stopping.remove(&st.shard_id);
        while self.stop_tasks.try_join_next().is_some() {}
        let mut out = vec![st];
        for start in std::mem::take(&mut self.deferred) {
            out.extend(self.start(start));
        }
        out
    }

    /// Idempotent by shard id: a repeat reports the running shard's state.
    /// Remote weights are fetched first, off the session's loop; the shard
    /// is Pending meanwhile, with the download's progress in its status.
    pub(super) fn start(&mut self, start: v1::StartShard) -> Option<v1::ShardStatus> {
        let shard_id = start.shard_id.clone();
        if self.shards.contains_key(&shard_id) {
            return self.shard_status(&shard_id);
        }
        // A shard of ours still stopping may hold this one's port or GPUs
        // (or be this very shard): the start waits for that stop, rather
        // than failing on a port it would call another program's.
        let gpus: Vec<u32> = start
            .gpu_indices
            .iter()
            .map(|g| (*g).max(0) as u32)
            .collect();
        let port = u16::try_from(start.http_port).unwrap_or(0);
        if self.stopping.iter().any(|(id, (p, g))| {
            *id == shard_id || (port != 0 && *p == port) || g.iter().any(|x| gpus.contains(x))
        }) {
            tracing::info!(shard = %shard_id, "waiting for a stopping shard to let go of its port or GPUs");
            let pending = v1::ShardStatus {
                node_id: self.config.node_id.clone(),
                replica_id: start.replica_id.clone(),
                shard_id: shard_id.clone(),
                state: wire_state(State::Pending),
                ..v1::ShardStatus::default()
            };
            self.deferred.retain(|d| d.shard_id != shard_id);
            self.deferred.push(start);
            return Some(pending);
        }
        let remote = matches!(
            crate::fetch::classify(&start.source),
            Ok(crate::fetch::Source::Remote(_) | crate::fetch::Source::Mirror(_))
        );
        if !remote {
            return self.launch(start, None);
        }
        let pending = supervisor::Status::new(State::Pending);
        let (status_tx, status) = watch::channel(pending);
        let fetcher = self.fetcher.clone();
        let source = start.source.clone();
        let checksum = (!start.checksum.is_empty()).then(|| start.checksum.clone());
        let mirror = (!start.mirror_url.is_empty()).then(|| start.mirror_url.clone());
        let done = self.fetched_tx.clone();
        let id = shard_id.clone();
        let progress = self.progress.clone();
        let changes = self.changes_tx.clone();
        let task = tokio::spawn(async move {
            let id2 = id.clone();
            let fetcher = fetcher.on_progress(move |p| {
                progress
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id2.clone(), p);
                let _ = changes.send(id2.clone());
            });
            let result = fetcher
                .ensure_from(&source, checksum.as_deref(), mirror.as_deref())
                .await;
            let _ = done.send((id, result));
            drop(status_tx);
        });
        tracing::info!(shard = %shard_id, source = %crate::fetch::shown(&start.source), "fetching weights before starting");
        self.shards.insert(
            shard_id.clone(),
            Running {
                start,
                status,
                shard: None,
                started: Instant::now(),
                fetch: Some(task),
                drained: false,
            },
        );
        self.shard_status(&shard_id)
    }

    /// The weights of a fetching shard arrived (or did not).
    pub(super) fn fetched(
        &mut self,
        shard_id: &str,
        result: Result<String, crate::fetch::FetchError>,
    ) -> Option<v1::ShardStatus> {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(shard_id);
        let r = self.shards.remove(shard_id)?;
        match result {
            Ok(path) => {
                let status = self.launch(r.start, Some(path));
                if r.drained
                    && let Some(now) = self.shards.get_mut(shard_id)
                {
                    now.drained = true;
                    if let Some(shard) = &now.shard {
                        shard.drain();
                    }
                }
                status
            }
            Err(e) => {
                tracing::warn!(shard = %shard_id, error = %e, "cannot fetch the weights");
                Some(v1::ShardStatus {
                    node_id: self.config.node_id.clone(),
                    replica_id: r.start.replica_id.clone(),
                    shard_id: shard_id.to_owned(),
                    state: wire_state(State::Failed),
                    error: e.to_string(),
                    ..v1::ShardStatus::default()
                })
            }
        }
    }

    pub(super) fn launch(
        &mut self,
        start: v1::StartShard,
        weights: Option<String>,
    ) -> Option<v1::ShardStatus> {
        let shard_id = start.shard_id.clone();
        let fail = |error: String| {
            tracing::warn!(shard = %shard_id, error, "failed before launch");
            v1::ShardStatus {
                node_id: self.config.node_id.clone(),
                replica_id: start.replica_id.clone(),
                shard_id: shard_id.clone(),
                state: wire_state(State::Failed),
                error,
                ..v1::ShardStatus::default()
            }
        };
        let Some(p) = start.profile.clone() else {
            return Some(fail("StartShard carries no profile".into()));
        };
        let spec = ShardSpec {
            replica_id: start.replica_id.clone(),
            shard_id: shard_id.clone(),
            rank: start.rank.max(0) as u32,
            nnodes: start.nnodes.max(1) as u32,
            leader_addr: start.leader_addr.clone(),
            leader_port: u16::try_from(start.leader_port).unwrap_or(0),
            gpu_indices: start
                .gpu_indices
                .iter()
                .map(|g| (*g).max(0) as u32)
                .collect(),
            hcas: start.hcas.clone(),
            mgmt_interface: start.mgmt_interface.clone(),
            http_port: u16::try_from(start.http_port).unwrap_or(0),
            profile: Profile {
                name: p.name.clone(),
                engine: p.engine.clone(),
                tp: p.tp.max(1) as u32,
                pp: p.pp.max(1) as u32,
                nodes: p.nodes.max(1) as u32,
                gpus_per_node: p.gpus_per_node.max(0) as u32,
                args: p.args.clone(),
                env: p.env.clone().into_iter().collect(),
                model_path: weights.clone().unwrap_or_else(|| p.model_path.clone()),
                served_model_name: p.served_model_name.clone(),
                context_length: p.context_length,
            },
            bind_addr: self.config.engine_bind.clone().unwrap_or_default(),
        };
        let engine = match self.engines.get(&p.engine) {
            Ok(e) => e,
            Err(e) => return Some(fail(e.0)),
        };
        // Validated against the cards it will run on, as discovery saw
        // them: a mixed group or FP8 on an old card fails here, with a
        // reason, not minutes into a load.
        let gpus = match selected_gpus(&self.gpus, &spec.gpu_indices) {
            Ok(g) => g,
            Err(e) => return Some(fail(e)),
        };
        if let Err(e) = engine.validate(&spec.profile, &gpus) {
            return Some(fail(e.0));
        }
        let commands = match engine.commands(&spec) {
            Ok(c) => c,
            Err(e) => return Some(fail(e.0)),
        };
        // Another program on the port would answer the health checks, or
        // the engine would die on bind with the reason buried in its log.
        if engine.serves_http(&spec)
            && let Err(e) = std::net::TcpListener::bind((spec.host(), spec.http_port))
        {
            if e.kind() != std::io::ErrorKind::AddrInUse {
                return Some(fail(format!(
                    "cannot listen on {}:{}: {e}",
                    spec.host(),
                    spec.http_port
                )));
            }
            return Some(v1::ShardStatus {
                port_taken: i32::from(spec.http_port),
                ..fail(format!(
                    "port {} is not free on this node; something else listens there",
                    spec.http_port
                ))
            });
        }
        let options = SupervisorOptions {
            http_port: engine.serves_http(&spec).then_some(spec.http_port),
            served_model: (!p.served_model_name.is_empty()).then(|| p.served_model_name.clone()),
            startup_timeout: (start.startup_timeout_ms > 0)
                .then(|| Duration::from_millis(start.startup_timeout_ms as u64)),
            health_host: self
                .config
                .engine_bind
                .clone()
                .unwrap_or_else(|| "127.0.0.1".into()),
            leader: (spec.nnodes > 1).then(|| (spec.leader_addr.clone(), spec.leader_port)),
            rendezvous_timeout: Duration::from_millis(start.startup_timeout_ms.max(1000) as u64),
            stop_timeout: self.config.stop_timeout,
            alive_grace: self.config.alive_grace,
            log_lines: self.config.log_lines,
            ..SupervisorOptions::default()
        };
        tracing::info!(shard = %shard_id, engine = %p.engine, port = spec.http_port, "starting");
        let options = SupervisorOptions {
            log_file: self
                .config
                .work_dir
                .as_deref()
                .and_then(|d| state_files::log_path(d, &shard_id).ok()),
            ..options
        };
        let main = commands.last().map(|c| {
            let mut argv = vec![c.path.display().to_string()];
            argv.extend(c.args.iter().cloned());
            argv
        });
        let count = commands.len();
        let shard = supervisor::start(commands, options);
        // Once every command runs, the state file records them, so that a
        // restarted agent adopts them.
        let record = self
            .config
            .work_dir
            .clone()
            .zip(main)
            .map(|(dir, cmdline)| {
                (
                    dir,
                    state_files::Record {
                        spec: state_files::Spec::of(&start),
                        pids: Vec::new(),
                        cmdline,
                        started_at: std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs()),
                    },
                )
            });
        self.watch(shard_id.clone(), shard.status(), record, count);
        self.shards.insert(
            shard_id.clone(),
            Running {
                start,
                status: shard.status(),
                shard: Some(shard),
                started: Instant::now(),
                fetch: None,
                drained: false,
            },
        );
        self.shard_status(&shard_id)
    }

    /// Forwards a shard's status changes to the session, writing its state
    /// file once all its commands run.
    pub(super) fn watch(
        &self,
        id: String,
        mut status: watch::Receiver<supervisor::Status>,
        mut record: Option<(std::path::PathBuf, state_files::Record)>,
        commands: usize,
    ) {
        let changes = self.changes_tx.clone();
        tokio::spawn(async move {
            let mut rewritten = false;
            let mut was = status.borrow().state;
            while status.changed().await.is_ok() {
                let (pids, state) = {
                    let s = status.borrow();
                    if s.state != was {
                        said(&id, &s);
                    }
                    (s.pids.clone(), s.state)
                };
                was = state;
                // Written once every command runs, and again once ready
                // with the command line as the kernel shows it then (a
                // script's interpreter, or a wrapper that exec'd).
                if pids.len() == commands
                    && let Some((dir, r)) = record.as_mut()
                    && (r.pids.is_empty() || (state == State::Ready && !rewritten))
                {
                    if state == State::Ready {
                        rewritten = true;
                        if let Some(c) = pids.last().and_then(|p| state_files::cmdline_of(*p)) {
                            r.cmdline = c;
                        }
                    }
                    r.pids = pids;
                    if let Err(e) = state_files::write(dir, r) {
                        tracing::warn!(error = %e, "no state file: a restarted agent will not adopt this shard");
                    }
                }
                if changes.send(id.clone()).is_err() {
                    return;
                }
            }
        });
    }

    pub(super) fn forget(&self, shard_id: &str) {
        if let Some(dir) = &self.config.work_dir {
            state_files::remove(dir, shard_id);
        }
        self.prune_logs();
    }

    /// Old logs of shards long stopped leave the work directory (at start
    /// and whenever a shard is forgotten: the times the set of logs grows
    /// or ages without a process behind it).
    pub(super) fn prune_logs(&self) {
        let (Some(dir), Some(keep)) = (&self.config.work_dir, self.config.log_retention) else {
            return;
        };
        let Some(before) = std::time::SystemTime::now().checked_sub(keep) else {
            return;
        };
        let gone = state_files::prune_logs(dir, before);
        if !gone.is_empty() {
            tracing::info!(shards = ?gone, "removed the logs of shards stopped longer than the retention");
        }
    }
}

/// A shard's turn, in the agent's own journal: the control plane records
/// it, but an operator reading the node's log saw nothing when an engine
/// died or finished stopping.
fn said(shard: &str, s: &supervisor::Status) {
    match s.state {
        State::Ready => tracing::info!(shard, "ready"),
        State::Stopped => tracing::info!(shard, exit_code = s.exit_code, "stopped"),
        State::Failed => tracing::warn!(
            shard,
            exit_code = s.exit_code,
            error = s.error.as_deref().unwrap_or("-"),
            "failed"
        ),
        _ => {}
    }
}
