//! Runs a shard's commands and watches them. Each command runs in its own
//! process group and is stopped as a group (SIGTERM, then SIGKILL after the
//! stop timeout), so an engine's own children go with it. Earlier commands
//! are sidecars kept alive for the shard's life; the last one's exit is the
//! shard's. A bounded tail of the output goes with every failure.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process_group};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Child;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::engines::Command;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Pending,
    Starting,
    /// Started, not yet answering: loading weights can take minutes.
    Loading,
    Ready,
    Draining,
    Stopped,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub state: State,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    /// The last lines of output, set when the shard fails.
    pub log_tail: String,
    /// The process group of each command started so far (the main one
    /// last): what a state file records and an adopter signals.
    pub pids: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct SupervisorOptions {
    /// Rank 0 is ready when `/health` and `/v1/models` answer on this port;
    /// None for workers, which are ready once started.
    pub http_port: Option<u16>,
    /// Where the health checks go (the engine's bind address).
    pub health_host: String,
    /// The model `/v1/models` must list before the shard is ready; None
    /// accepts any.
    pub served_model: Option<String>,
    /// Not ready this long after the start: failed, with the log tail.
    pub startup_timeout: Option<Duration>,
    /// Where the leader's rendezvous is, for commands that wait for it.
    pub leader: Option<(String, u16)>,
    pub rendezvous_timeout: Duration,
    pub stop_timeout: Duration,
    pub log_lines: usize,
    /// The environment the commands' variables are laid over.
    pub base_env: Vec<(String, String)>,
    /// Where the commands' output goes. A file outlives the agent (an
    /// engine writing into a pipe whose reader died would die of SIGPIPE),
    /// and a restarted agent reads its tail; None pipes it into memory.
    pub log_file: Option<std::path::PathBuf>,
}

impl Default for SupervisorOptions {
    fn default() -> Self {
        SupervisorOptions {
            http_port: None,
            health_host: "127.0.0.1".into(),
            served_model: None,
            startup_timeout: None,
            leader: None,
            rendezvous_timeout: Duration::from_secs(600),
            stop_timeout: Duration::from_secs(30),
            log_lines: 200,
            base_env: std::env::vars().collect(),
            log_file: None,
        }
    }
}

/// The last `max` lines of a shard's output: kept in memory, or read
/// from the shard's log file.
#[derive(Debug, Clone, Default)]
pub struct LogTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    max: usize,
    file: Option<std::path::PathBuf>,
}

/// The last `max` lines of a file (reading at most its last 256 KiB).
pub fn file_tail(path: &std::path::Path, max: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let from = len.saturating_sub(256 * 1024);
    let _ = f.seek(SeekFrom::Start(from));
    let mut text = String::new();
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    text.push_str(&String::from_utf8_lossy(&bytes));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(max)..].join("\n")
}

impl LogTail {
    pub fn new(max: usize) -> Self {
        LogTail {
            lines: Arc::default(),
            max: max.max(1),
            file: None,
        }
    }

    pub fn of_file(path: std::path::PathBuf, max: usize) -> Self {
        LogTail {
            file: Some(path),
            ..LogTail::new(max)
        }
    }

    pub fn push(&self, line: String) {
        let mut l = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if l.len() == self.max {
            l.pop_front();
        }
        l.push_back(line);
    }

    pub fn text(&self) -> String {
        if let Some(f) = &self.file {
            return file_tail(f, self.max);
        }
        let l = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        l.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

/// A running shard: watch its status, stop it.
#[derive(Debug)]
pub struct Shard {
    status: watch::Receiver<Status>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Shard {
    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// Stops every process group of the shard and waits for them.
    pub async fn stop(mut self) -> Status {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
        self.status.borrow().clone()
    }
}

/// Starts `commands` in order and supervises them until stopped.
pub fn start(commands: Vec<Command>, options: SupervisorOptions) -> Shard {
    let initial = Status {
        state: State::Pending,
        exit_code: None,
        error: None,
        log_tail: String::new(),
        pids: Vec::new(),
    };
    let (tx, rx) = watch::channel(initial);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(supervise(commands, options, tx, stop_rx));
    Shard {
        status: rx,
        stop: Some(stop_tx),
        task,
    }
}

fn set(tx: &watch::Sender<Status>, state: State) {
    tx.send_modify(|s| s.state = state);
}

fn fail(tx: &watch::Sender<Status>, log: &LogTail, error: String, exit_code: Option<i32>) {
    tx.send_modify(|s| {
        s.state = State::Failed;
        s.error = Some(error);
        s.exit_code = exit_code;
        s.log_tail = log.text();
    });
}

async fn supervise(
    commands: Vec<Command>,
    o: SupervisorOptions,
    tx: watch::Sender<Status>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let log = match &o.log_file {
        Some(f) => LogTail::of_file(f.clone(), o.log_lines),
        None => LogTail::new(o.log_lines),
    };
    let mut children: Vec<(String, Child)> = Vec::new();
    // The output readers: a failure waits for them, so that its log tail
    // holds the last lines the process wrote before it died.
    let mut readers: Vec<Vec<tokio::task::JoinHandle<()>>> = Vec::new();
    set(&tx, State::Starting);
    for c in &commands {
        if c.wait_for_leader_port {
            let Some((host, port)) = o.leader.clone() else {
                fail(
                    &tx,
                    &log,
                    format!("{} waits for a leader, but none is known", c.name),
                    None,
                );
                return;
            };
            if !wait_for_port(&host, port, o.rendezvous_timeout).await {
                fail(
                    &tx,
                    &log,
                    format!(
                        "leader {host}:{port} did not open within {:?}",
                        o.rendezvous_timeout
                    ),
                    None,
                );
                stop_all(&mut children, o.stop_timeout).await;
                return;
            }
        }
        match spawn(c, &o, &log) {
            Ok((child, r)) => {
                if let Some(pid) = child.id() {
                    tx.send_modify(|s| s.pids.push(pid));
                }
                children.push((c.name.clone(), child));
                readers.push(r);
            }
            Err(e) => {
                fail(&tx, &log, format!("starting {}: {e}", c.name), None);
                stop_all(&mut children, o.stop_timeout).await;
                return;
            }
        }
    }
    set(&tx, State::Loading);
    let mut ready = o.http_port.is_none();
    if ready {
        set(&tx, State::Ready);
    }
    let ready_by = o.startup_timeout.map(|t| Instant::now() + t);
    let mut probe = tokio::time::interval(Duration::from_millis(200));
    loop {
        if !ready && ready_by.is_some_and(|t| Instant::now() >= t) {
            // A load that never finishes: its output is the diagnosis.
            let waited = o.startup_timeout.unwrap_or_default();
            fail(
                &tx,
                &log,
                format!("not ready within the startup timeout ({waited:?})"),
                None,
            );
            stop_all(&mut children, o.stop_timeout).await;
            return;
        }
        // Any process exiting ends the shard: a sidecar is part of it.
        let exited = children
            .iter_mut()
            .enumerate()
            .find_map(|(i, (name, ch))| ch.try_wait().ok().flatten().map(|s| (i, name.clone(), s)));
        if let Some((i, name, status)) = exited {
            // Its pipes close with it: read what it wrote last.
            for r in std::mem::take(&mut readers[i]) {
                let _ = tokio::time::timeout(Duration::from_secs(1), r).await;
            }
            fail(&tx, &log, format!("{name} exited: {status}"), status.code());
            stop_all(&mut children, o.stop_timeout).await;
            return;
        }
        tokio::select! {
            asked = &mut stop => {
                if asked.is_err() {
                    // The Shard was dropped without a stop (the agent is
                    // exiting): the engine outlives it, to be adopted.
                    return;
                }
                set(&tx, State::Draining);
                stop_all(&mut children, o.stop_timeout).await;
                set(&tx, State::Stopped);
                return;
            }
            _ = probe.tick() => {
                if !ready && let Some(port) = o.http_port
                    && engine_ready(&o, port).await
                {
                    ready = true;
                    set(&tx, State::Ready);
                }
            }
        }
    }
}

fn spawn(
    c: &Command,
    o: &SupervisorOptions,
    log: &LogTail,
) -> std::io::Result<(Child, Vec<tokio::task::JoinHandle<()>>)> {
    let mut cmd = tokio::process::Command::new(&c.path);
    cmd.args(&c.args)
        .env_clear()
        .envs(
            c.materialize_env(o.base_env.clone())
                .into_iter()
                .filter_map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                }),
        )
        // Its own group, so the whole tree can be signalled at once.
        .process_group(0)
        .stdin(Stdio::null())
        .kill_on_drop(false);
    match &o.log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
            cmd.stdout(Stdio::from(file.try_clone()?))
                .stderr(Stdio::from(file));
        }
        None => {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
    }
    let mut child = cmd.spawn()?;
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(tokio::spawn(collect(out, log.clone(), c.name.clone())));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(tokio::spawn(collect(err, log.clone(), c.name.clone())));
    }
    Ok((child, readers))
}

async fn collect(stream: impl AsyncRead + Unpin, log: LogTail, name: String) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        log.push(format!("[{name}] {line}"));
    }
}

/// SIGTERM to every group, last started first; SIGKILL to what is left
/// after the stop timeout. Returns once every group is gone (or, for a
/// process stuck in the kernel, shortly after the SIGKILL).
async fn stop_all(children: &mut [(String, Child)], timeout: Duration) {
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
        let _ = kill_process_group(*g, Signal::KILL);
    }
    for (_, ch) in children.iter_mut() {
        let _ = ch.wait().await;
    }
    // SIGKILL is delivered asynchronously; orphans are reaped by init.
    let settle = Instant::now() + Duration::from_secs(1);
    while groups.iter().any(alive) && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn wait_for_port(host: &str, port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect((host, port)).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// Ready: `/health` answers 200 (a loading engine answers 503) and
/// `/v1/models` lists the model this shard serves (an engine answering for
/// another model is not this shard's).
async fn engine_ready(o: &SupervisorOptions, port: u16) -> bool {
    if http_get(&o.health_host, port, "/health").await.is_none() {
        return false;
    }
    match http_get(&o.health_host, port, "/v1/models").await {
        None => false,
        Some(body) => o
            .served_model
            .as_ref()
            .is_none_or(|m| body.contains(&format!("\"{m}\""))),
    }
}

/// The body of `GET path` when it answers 200 (at most 64 KiB, 2 s).
async fn http_get(host: &str, port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        let _ = (&mut s).take(64 * 1024).read_to_end(&mut buf).await;
        let text = String::from_utf8_lossy(&buf).into_owned();
        text.starts_with("HTTP/1.1 200").then_some(text)
    };
    tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .ok()
        .flatten()
}

/// Takes over a shard a previous agent started: the processes are not our
/// children, so they are watched by polling their process groups, checked
/// for readiness as a started shard would be, and stopped as groups.
pub fn adopt(pids: Vec<u32>, options: SupervisorOptions) -> Shard {
    let initial = Status {
        state: State::Starting,
        exit_code: None,
        error: None,
        log_tail: String::new(),
        pids: pids.clone(),
    };
    let (tx, rx) = watch::channel(initial);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(watch_adopted(pids, options, tx, stop_rx));
    Shard {
        status: rx,
        stop: Some(stop_tx),
        task,
    }
}

/// Whether a group still has a live leader (a zombie awaiting its parent
/// counts as gone: it runs nothing).
pub(crate) fn group_alive(pgid: u32) -> bool {
    let Some(p) = Pid::from_raw(pgid as i32) else {
        return false;
    };
    if rustix::process::test_kill_process_group(p).is_err() {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pgid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ")
        .is_none_or(|(_, rest)| !rest.starts_with('Z'))
}

/// SIGTERM to each group, SIGKILL to those left after `timeout`: for
/// processes that are not our children (adopted, or found orphaned).
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
        let _ = kill_process_group(*g, Signal::KILL);
    }
}

async fn watch_adopted(
    pids: Vec<u32>,
    o: SupervisorOptions,
    tx: watch::Sender<Status>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let log = match &o.log_file {
        Some(f) => LogTail::of_file(f.clone(), o.log_lines),
        None => LogTail::new(o.log_lines),
    };
    let mut ready = o.http_port.is_none();
    if ready {
        set(&tx, State::Ready);
    }
    let mut probe = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            asked = &mut stop => {
                if asked.is_err() {
                    return;
                }
                set(&tx, State::Draining);
                kill_groups(&pids, o.stop_timeout).await;
                set(&tx, State::Stopped);
                return;
            }
            _ = probe.tick() => {
                if pids.iter().any(|p| !group_alive(*p)) {
                    fail(&tx, &log, "adopted engine exited".into(), None);
                    return;
                }
                if !ready && let Some(port) = o.http_port
                    && engine_ready(&o, port).await
                {
                    ready = true;
                    set(&tx, State::Ready);
                }
            }
        }
    }
}
