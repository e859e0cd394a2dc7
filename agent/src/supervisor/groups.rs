//! Process groups: each command runs in its own, and is stopped as one, so
//! an engine's own children go with it.

use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process_group};
use tokio::process::Child;
use tokio::time::Instant;

/// `(state, process group)` of a process, from `/proc/<pid>/stat` (the
/// command name may hold spaces and parentheses: fields follow the last
/// `)`).
fn stat(pid: &str) -> Option<(char, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(") ")?;
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let _ppid = f.next()?;
    Some((state, f.next()?.to_owned()))
}

/// Whether a process runs: it exists and is not a zombie.
pub(crate) fn leader_alive(pid: u32) -> bool {
    stat(&pid.to_string()).is_some_and(|(state, _)| state != 'Z')
}

/// Whether any process of the group still runs (zombies run nothing).
/// The leader may be gone while the rest of its group lives on: an
/// engine's workers after the engine died, say.
pub(crate) fn group_alive(pgid: u32) -> bool {
    let Some(p) = Pid::from_raw(pgid as i32) else {
        return false;
    };
    if rustix::process::test_kill_process_group(p).is_err() {
        return false;
    }
    if leader_alive(pgid) {
        return true;
    }
    let want = pgid.to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.bytes().all(|b| b.is_ascii_digit())
                && stat(&name).is_some_and(|(state, group)| state != 'Z' && group == want)
        })
}

fn pids(pgids: &[u32]) -> Vec<Pid> {
    pgids
        .iter()
        .rev()
        .filter_map(|p| Pid::from_raw(*p as i32))
        .collect()
}

/// SIGTERM to each group, SIGKILL to those left after `timeout`: for
/// processes that are not our children (adopted, or found orphaned).
/// A group already gone counts as stopped.
pub(crate) async fn kill_groups(pgids: &[u32], timeout: Duration) {
    let groups = pids(pgids);
    for g in &groups {
        let _ = kill_process_group(*g, Signal::TERM);
    }
    let deadline = Instant::now() + timeout;
    while pgids.iter().any(|p| group_alive(*p)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for g in groups.iter().filter(|g| group_alive(g.as_raw_pid() as u32)) {
        tracing::warn!(pgid = g.as_raw_pid(), "did not exit in time, killing");
        let _ = kill_process_group(*g, Signal::KILL);
    }
}

/// SIGTERM to every group, last started first; SIGKILL to what is left
/// after the stop timeout. Returns once every group is gone (or, for a
/// process stuck in the kernel, shortly after the SIGKILL). The groups
/// are the ones recorded at spawn: a child already reaped has no id any
/// more, but the rest of its group may still run.
pub(super) async fn stop_children(
    children: &mut [(String, Child)],
    pgids: &[u32],
    timeout: Duration,
) {
    let groups = pids(pgids);
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
    let settle = Instant::now() + Duration::from_secs(2);
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
