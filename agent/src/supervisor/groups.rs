//! Process groups: each command runs in its own, and is stopped as one, so
//! an engine's own children go with it.

use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process_group};
use tokio::process::Child;
use tokio::time::Instant;

/// Whether a group still has a live leader (a zombie awaiting its parent
/// counts as gone: it runs nothing).
pub(crate) fn group_alive(pgid: u32) -> bool {
    let Some(p) = Pid::from_raw(pgid as i32) else {
        return false;
    };
    if rustix::process::test_kill_process_group(p).is_err() {
        return false;
    }
    // comm may hold spaces and parentheses: the state follows the last ')'.
    let stat = std::fs::read_to_string(format!("/proc/{pgid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ")
        .is_none_or(|(_, rest)| !rest.starts_with('Z'))
}

/// SIGTERM to each group, SIGKILL to those left after `timeout`: for
/// processes that are not our children (adopted, or found orphaned).
/// A group already gone counts as stopped.
pub(crate) async fn kill_groups(pids: &[u32], timeout: Duration) {
    let groups: Vec<Pid> = pids
        .iter()
        .rev()
        .filter_map(|p| Pid::from_raw(*p as i32))
        .collect();
    for g in &groups {
        let _ = kill_process_group(*g, Signal::TERM);
    }
    let deadline = Instant::now() + timeout;
    while pids.iter().any(|p| group_alive(*p)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for g in groups.iter().filter(|g| group_alive(g.as_raw_pid() as u32)) {
        tracing::warn!(pgid = g.as_raw_pid(), "did not exit in time, killing");
        let _ = kill_process_group(*g, Signal::KILL);
    }
}

/// SIGTERM to every group, last started first; SIGKILL to what is left
/// after the stop timeout. Returns once every group is gone (or, for a
/// process stuck in the kernel, shortly after the SIGKILL).
pub(super) async fn stop_children(children: &mut [(String, Child)], timeout: Duration) {
    // The group ids are taken first: once a leader is reaped its id is
    // gone, but the rest of its group (an engine's own children, or a
    // process that ignores SIGTERM) may still be running.
    let groups: Vec<Pid> = children
        .iter()
        .rev()
        .filter_map(|(_, ch)| ch.id().and_then(|id| Pid::from_raw(id as i32)))
        .collect();
    let alive = |g: &Pid| group_alive(g.as_raw_pid() as u32);
    for g in &groups {
        let _ = kill_process_group(*g, Signal::TERM);
    }
    let deadline = Instant::now() + timeout;
    for (_, ch) in children.iter_mut() {
        if tokio::time::timeout_at(deadline, ch.wait()).await.is_err() {
            break;
        }
    }
    while groups.iter().any(alive) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for g in groups.iter().filter(|g| alive(g)) {
        tracing::warn!(pgid = g.as_raw_pid(), "did not exit in time, killing");
        let _ = kill_process_group(*g, Signal::KILL);
    }
    for (_, ch) in children.iter_mut() {
        let _ = ch.wait().await;
    }
    // SIGKILL is delivered asynchronously; orphans are reaped by init.
    let settle = Instant::now() + Duration::from_secs(5);
    while groups.iter().any(alive) && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Dials `host:port` every 200 ms until something listens there.
pub(super) async fn wait_for_port(host: &str, port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        // A host that drops SYNs would hold one dial for minutes.
        let dial = tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect((host, port)));
        if matches!(dial.await, Ok(Ok(_))) {
            return true;
        }
        if Instant::now() + Duration::from_millis(200) > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
