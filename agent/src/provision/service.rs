//! The provisioning loop: what the control plane wants, converged now and
//! again every [`RECHECK`] (an installed build is re-checked, not fetched
//! again), and [`RETRY`] after a pass where something failed. Statuses,
//! progress included, are published for the heartbeat; a build that turns
//! ready (or stops being wanted) is handed to the engines.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Installer, State, Status, Want};

/// A ready engine is checked again this often.
pub const RECHECK: Duration = Duration::from_secs(600);
/// A pass where something failed is tried again this soon.
pub const RETRY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub recheck: Duration,
    pub retry: Duration,
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            recheck: RECHECK,
            retry: RETRY,
        }
    }
}

impl Schedule {
    /// How long until the next pass after one that ended in `statuses`:
    /// soon when something failed, else the re-check.
    pub fn next(&self, statuses: &[Status]) -> Duration {
        if statuses.iter().any(|s| s.state == State::Failed) {
            self.retry
        } else {
            self.recheck
        }
    }
}

/// Called with an engine's ready build (`(binary, version)`), or None
/// when it is no longer ready or wanted.
pub type OnReady = Arc<dyn Fn(&str, Option<(PathBuf, String)>) + Send + Sync>;

/// The loop's handle: tell it what is wanted, read where things stand.
#[derive(Debug, Clone)]
pub struct Provisioner {
    wants: watch::Sender<Option<Vec<Want>>>,
    statuses: watch::Receiver<Vec<Status>>,
}

impl Provisioner {
    /// Starts the loop; it ends when the handle (every clone) is dropped.
    pub fn spawn(mut installer: Installer, schedule: Schedule, on_ready: OnReady) -> Self {
        let (wants_tx, mut wants_rx) = watch::channel::<Option<Vec<Want>>>(None);
        let (status_tx, status_rx) = watch::channel(Vec::<Status>::new());
        let status_tx = Arc::new(status_tx);
        let progress = status_tx.clone();
        let hand_over = on_ready.clone();
        installer.on_status = Some(Arc::new(move |st: &Status| {
            // A ready build is handed to the engines before its status is
            // published: whoever sees "ready" (a restarted agent about to
            // register) finds the engine able to run it.
            if let (State::Ready, Some(bin)) = (st.state, &st.binary) {
                hand_over(&st.engine, Some((bin.clone(), st.version.clone())));
            }
            progress.send_modify(|all| match all.iter_mut().find(|s| s.engine == st.engine) {
                Some(s) => *s = st.clone(),
                None => all.push(st.clone()),
            });
        }));
        tokio::spawn(async move {
            let mut wants: Vec<Want> = Vec::new();
            let mut ready: Vec<String> = Vec::new();
            let mut next: Option<Duration> = None;
            loop {
                let wait = async move {
                    match next {
                        Some(d) => tokio::time::sleep(d).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    changed = wants_rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let Some(w) = wants_rx.borrow_and_update().clone() else { continue };
                        if w == wants && next.is_some() {
                            // The same again (every new stream says it):
                            // the schedule stands.
                            continue;
                        }
                        wants = w;
                    }
                    _ = wait => {}
                }
                // Only the wanted engines are reported.
                status_tx.send_modify(|all| {
                    all.retain(|s| {
                        wants
                            .iter()
                            .any(|w| w.engine == s.engine && w.version == s.version)
                    })
                });
                let statuses = installer.converge(&wants).await;
                let now_ready: Vec<String> = statuses
                    .iter()
                    .filter(|s| s.state == State::Ready)
                    .map(|s| s.engine.clone())
                    .collect();
                for gone in ready.iter().filter(|e| !now_ready.contains(e)) {
                    on_ready(gone, None);
                }
                ready = now_ready;
                status_tx.send_replace(statuses.clone());
                next = Some(schedule.next(&statuses));
            }
        });
        Provisioner {
            wants: wants_tx,
            statuses: status_rx,
        }
    }

    /// What the control plane wants now (the whole list).
    pub fn want(&self, wants: Vec<Want>) {
        self.wants.send_replace(Some(wants));
    }

    /// Every wanted engine's latest status.
    pub fn statuses(&self) -> Vec<Status> {
        self.statuses.borrow().clone()
    }

    /// A receiver that sees each change.
    pub fn watch(&self) -> watch::Receiver<Vec<Status>> {
        self.statuses.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(state: State) -> Status {
        Status {
            engine: "llamacpp".into(),
            version: "b1".into(),
            variant: "cpu".into(),
            state,
            detail: String::new(),
            binary: None,
        }
    }

    #[test]
    fn a_failure_is_retried_soon_and_a_ready_engine_rechecked_later() {
        let s = Schedule::default();
        assert_eq!(s.recheck, Duration::from_secs(600));
        assert_eq!(s.retry, Duration::from_secs(60));
        assert_eq!(s.next(&[st(State::Ready), st(State::Failed)]), s.retry);
        assert_eq!(
            s.next(&[st(State::Ready), st(State::Unsupported)]),
            s.recheck
        );
        assert_eq!(s.next(&[]), s.recheck);
    }
}
