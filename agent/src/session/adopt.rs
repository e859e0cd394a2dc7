//! After an agent restart: adopt what the state files describe, kill what
//! they cannot, forget the rest.

use std::time::Duration;

use tokio::time::Instant;

use super::{Agent, Running};
use crate::state_files;
use crate::supervisor::{self, SupervisorOptions};

impl Agent {
    /// Adopts what a previous agent left running, and cleans up after what
    /// it did not.
    pub(super) async fn adopt_orphans(&mut self) {
        let Some(dir) = self.config.work_dir.clone() else {
            return;
        };
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::error!(dir = %dir.display(), error = %e, "cannot create the work directory: engines will log nowhere and a restarted agent cannot adopt them");
            self.config.work_dir = None;
            return;
        }
        self.prune_logs();
        self.stopped_on_exit = state_files::read_stopped_on_exit(&dir);
        for found in state_files::scan(&dir) {
            match found {
                state_files::Found::Adopt(r) => {
                    let start = r.spec.start();
                    let serves = r.spec.rank == 0;
                    let options = SupervisorOptions {
                        http_port: serves.then(|| u16::try_from(r.spec.http_port).unwrap_or(0)),
                        served_model: (!r.spec.served_model_name.is_empty())
                            .then(|| r.spec.served_model_name.clone()),
                        health_host: self
                            .config
                            .engine_bind
                            .clone()
                            .unwrap_or_else(|| "127.0.0.1".into()),
                        stop_timeout: self.config.stop_timeout,
                        alive_grace: self.config.alive_grace,
                        log_lines: self.config.log_lines,
                        log_file: state_files::log_path(&dir, &r.spec.shard_id).ok(),
                        ..SupervisorOptions::default()
                    };
                    tracing::info!(shard = %r.spec.shard_id, pids = ?r.pids, "adopted an engine a previous agent started");
                    let shard = supervisor::adopt(r.pids.clone(), options);
                    self.watch(r.spec.shard_id.clone(), shard.status(), None, 0);
                    let age = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs())
                        .saturating_sub(r.started_at);
                    self.shards.insert(
                        r.spec.shard_id.clone(),
                        Running {
                            start,
                            status: shard.status(),
                            shard: Some(shard),
                            started: Instant::now()
                                .checked_sub(Duration::from_secs(age))
                                .unwrap_or_else(Instant::now),
                            fetch: None,
                            drained: false,
                        },
                    );
                }
                state_files::Found::Unidentifiable { shard_id, pids } => {
                    tracing::warn!(shard = %shard_id, ?pids, "killing an engine its state file cannot describe");
                    supervisor::kill_groups(&pids, self.config.stop_timeout).await;
                    state_files::remove(&dir, &shard_id);
                }
                state_files::Found::Gone(id) | state_files::Found::Stale(id) => {
                    state_files::remove(&dir, &id);
                }
            }
        }
    }
}
