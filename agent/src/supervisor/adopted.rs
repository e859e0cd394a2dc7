//! Shards a previous agent started: the processes are not our children, so
//! they are watched by polling their process groups, judged ready as a
//! started shard would be, and stopped as groups.

use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::{
    Control, Liveness, LogTail, Readiness, Shard, State, Status, SupervisorOptions, fail, groups,
    log_for, obey, set,
};

/// How often an adopted shard's processes are checked for.
const POLL: Duration = Duration::from_millis(200);

/// Takes over the process groups `pids` (the engine last). A group already
/// gone fails the shard at once.
pub fn adopt(pids: Vec<u32>, options: SupervisorOptions) -> Shard {
    let initial = Status {
        pids: pids.clone(),
        ..Status::new(State::Starting)
    };
    let log = log_for(&options);
    Shard::spawn(initial, log.clone(), |tx, rx| {
        watch_adopted(pids, options, log, tx, rx)
    })
}

async fn watch_adopted(
    pids: Vec<u32>,
    o: SupervisorOptions,
    log: LogTail,
    tx: watch::Sender<Status>,
    mut control: mpsc::UnboundedReceiver<Control>,
) {
    let mut readiness = Readiness::new(&o);
    let mut ready = false;
    let mut draining = false;
    let mut poll = tokio::time::interval(POLL);
    let mut probe = tokio::time::interval(o.probe_interval);
    let mut liveness = Liveness::new(&o);
    loop {
        let waiting = !ready && !draining;
        let watched = ready && !draining && liveness.is_some();
        tokio::select! {
            error = async { liveness.as_mut()?.failed().await.into() }, if watched => {
                let Some(error) = error else { continue };
                groups::kill_groups(&pids, o.stop_timeout).await;
                fail(&tx, &log, error, None);
                return;
            }
            msg = control.recv() => {
                if obey(msg, &tx, &mut draining, groups::kill_groups(&pids, o.stop_timeout)).await {
                    return;
                }
            }
            _ = poll.tick() => {
                // A command whose own process is gone has ended, whatever
                // of its group lingers (that is killed below).
                if pids.iter().any(|p| !groups::leader_alive(*p)) {
                    if draining {
                        groups::kill_groups(&pids, o.stop_timeout).await;
                        set(&tx, State::Stopped);
                    } else {
                        groups::kill_groups(&pids, o.stop_timeout).await;
                        fail(&tx, &log, "adopted engine exited".into(), None);
                    }
                    return;
                }
                if waiting && readiness.health.is_none() && readiness.probe().await {
                    ready = true;
                    set(&tx, State::Ready);
                }
            }
            _ = probe.tick(), if waiting && readiness.health.is_some() => {
                if readiness.probe().await {
                    ready = true;
                    set(&tx, State::Ready);
                }
            }
        }
    }
}
