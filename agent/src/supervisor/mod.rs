//! Runs a shard's commands and watches them. Each command runs in its own
//! process group and is stopped as a group (SIGTERM, then SIGKILL after the
//! stop timeout), so an engine's own children go with it. Earlier commands
//! are sidecars kept alive for the shard's life; the last one is the
//! engine. A bounded tail of the output goes with every failure.

mod adopted;
mod groups;
mod health;
mod output;

pub use adopted::adopt;
pub(crate) use groups::kill_groups;
pub use health::{Health, NotReady};
pub use output::{LogTail, MAX_LINE, file_tail};

use std::fmt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::Child;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::engines::Command;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Pending,
    Starting,
    /// Started, not yet answering: loading weights can take minutes.
    Loading,
    Ready,
    /// Still running, taking no new work; its exit is expected.
    Draining,
    Stopped,
    Failed,
}

impl State {
    /// Nothing runs any more.
    pub fn terminal(self) -> bool {
        matches!(self, State::Stopped | State::Failed)
    }

    /// Processes run (Pending has started none yet).
    pub fn live(self) -> bool {
        matches!(
            self,
            State::Starting | State::Loading | State::Ready | State::Draining
        )
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Pending => "pending",
            State::Starting => "starting",
            State::Loading => "loading",
            State::Ready => "ready",
            State::Draining => "draining",
            State::Stopped => "stopped",
            State::Failed => "failed",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub state: State,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    /// The last lines of output, set when the shard fails.
    pub log_tail: String,
    /// The process group of each command started so far (the engine
    /// last): what a state file records and an adopter signals.
    pub pids: Vec<u32>,
}

impl Status {
    pub fn new(state: State) -> Status {
        Status {
            state,
            exit_code: None,
            error: None,
            log_tail: String::new(),
            pids: Vec::new(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SupervisorOptions {
    /// Rank 0 is ready when `/health` and `/v1/models` answer on this port;
    /// None for workers, ready once they outlive `alive_grace`.
    pub http_port: Option<u16>,
    /// Where the health checks go (the engine's bind address).
    pub health_host: String,
    /// The model `/v1/models` must list before the shard is ready; None
    /// accepts any.
    pub served_model: Option<String>,
    /// How often a loading engine is probed.
    pub probe_interval: Duration,
    /// A worker that lives this long after its start counts as ready: one
    /// that dies of a bad argument never looks ready.
    pub alive_grace: Duration,
    /// Not ready this long after the start: failed, with the log tail.
    pub startup_timeout: Option<Duration>,
    /// Once a serving engine is ready, how often its `/health` is asked
    /// whether it still answers (each ask waits at most this long, and
    /// 10 s: a busy engine may answer slowly)...
    pub liveness_interval: Duration,
    /// ...and how many failed asks in a row fail the shard: a hung engine
    /// (a stuck GPU, a stopped process) keeps its port and its process,
    /// and nothing else would ever restart it.
    pub liveness_failures: u32,
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
            probe_interval: Duration::from_millis(500),
            alive_grace: Duration::from_secs(5),
            startup_timeout: None,
            liveness_interval: Duration::from_secs(10),
            // A minute or two without an answer: a busy llama.cpp, its
            // HTTP threads all taken by requests, can be slow to answer.
            liveness_failures: 6,
            leader: None,
            rendezvous_timeout: Duration::from_secs(600),
            stop_timeout: Duration::from_secs(30),
            log_lines: 200,
            base_env: std::env::vars()
                .filter(|(k, _)| !crate::secrets::AGENT_SECRETS.contains(&k.as_str()))
                .collect(),
            log_file: None,
        }
    }
}

#[derive(Debug)]
enum Control {
    Drain,
    Stop,
}

/// A running shard: watch its status, drain it, stop it. Dropping the
/// handle leaves its processes running (an exiting agent's engines are
/// adopted by the next one).
#[derive(Debug)]
pub struct Shard {
    status: watch::Receiver<Status>,
    log: LogTail,
    control: mpsc::UnboundedSender<Control>,
    task: tokio::task::JoinHandle<()>,
}

impl Shard {
    fn spawn<F>(
        initial: Status,
        log: LogTail,
        run: impl FnOnce(watch::Sender<Status>, mpsc::UnboundedReceiver<Control>) -> F,
    ) -> Shard
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (tx, status) = watch::channel(initial);
        let (control, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(tx, rx));
        Shard {
            status,
            log,
            control,
            task,
        }
    }

    /// The shard's latest output lines, while it runs.
    pub fn log_tail(&self) -> String {
        self.log.text()
    }

    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// Takes no new work from here on; nothing is signalled, and the
    /// engine's exit is then expected (Stopped, not Failed).
    pub fn drain(&self) {
        let _ = self.control.send(Control::Drain);
    }

    /// Stops every process group of the shard and waits for them. A shard
    /// that has already ended is not signalled again (its pids may have
    /// been reused).
    pub async fn stop(mut self) -> Status {
        let _ = self.control.send(Control::Stop);
        let _ = (&mut self.task).await;
        self.status.borrow().clone()
    }
}

/// Starts `commands` in order and supervises them until stopped.
pub fn start(commands: Vec<Command>, options: SupervisorOptions) -> Shard {
    let log = log_for(&options);
    Shard::spawn(Status::new(State::Pending), log.clone(), |tx, rx| {
        supervise(commands, options, log, tx, rx)
    })
}

fn set(tx: &watch::Sender<Status>, state: State) {
    tx.send_modify(|s| s.state = state);
}

/// The line of the output most likely to say why a command died, as
/// `: LINE` (or nothing): of its last lines (an engine that ran for days
/// logged errors of requests long before), the last that mentions an
/// error (a Python exception, clap's `error:`), else the last that says
/// anything. The error is what `ctl models` and `ctl replicas` show; the
/// whole tail is in `ctl logs`.
fn last_word(log: &LogTail) -> String {
    const MAX: usize = 200;
    const LAST_LINES: usize = 20;
    let lines = log.tail(LAST_LINES);
    // `[name] ` as the pump tags lines kept in memory.
    let text = |l: &String| -> String {
        let t = match l.strip_prefix('[').and_then(|r| r.split_once("] ")) {
            Some((name, rest)) if !name.contains(' ') => rest,
            _ => l.as_str(),
        };
        t.trim().to_owned()
    };
    let said: Vec<String> = lines.iter().map(text).filter(|t| !t.is_empty()).collect();
    let Some(line) = said
        .iter()
        .rev()
        .find(|t| t.to_ascii_lowercase().contains("error"))
        .or_else(|| said.last())
    else {
        return String::new();
    };
    let mut end = line.len().min(MAX);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!(": {}", &line[..end])
}

/// Reports the shard failed; callers stop its groups first, so that
/// "failed", like "stopped", means nothing of it runs any more.
fn fail(tx: &watch::Sender<Status>, log: &LogTail, error: String, exit_code: Option<i32>) {
    tx.send_modify(|s| {
        s.state = State::Failed;
        s.error = Some(error);
        s.exit_code = exit_code;
        s.log_tail = log.text();
    });
}

/// When a shard counts as ready: one serving HTTP once its engine answers,
/// a worker once it has outlived the alive grace.
struct Readiness {
    health: Option<Health>,
    grace_over: Instant,
    last: Option<NotReady>,
}

impl Readiness {
    fn new(o: &SupervisorOptions) -> Readiness {
        Readiness {
            health: o.http_port.map(|port| {
                Health::new(&o.health_host, port, o.served_model.clone(), Duration::ZERO)
            }),
            grace_over: Instant::now() + o.alive_grace,
            last: None,
        }
    }

    async fn probe(&mut self) -> bool {
        let Some(h) = &self.health else {
            return Instant::now() >= self.grace_over;
        };
        match h.ready().await {
            Ok(()) => true,
            Err(e) => {
                self.last = Some(e);
                false
            }
        }
    }

    fn why(&self) -> String {
        self.last
            .as_ref()
            .map_or_else(|| "never probed".into(), ToString::to_string)
    }
}

/// One `/health` ask in flight.
type Ask = std::pin::Pin<Box<dyn Future<Output = Result<(), NotReady>> + Send>>;

/// Asks a ready engine's `/health` whether it still answers, one ask at a
/// time, beside whatever else the supervisor waits for (an ask that waits
/// does not hold up a stop or an exit).
struct Liveness {
    health: Health,
    every: tokio::time::Interval,
    asking: Option<Ask>,
    misses: u32,
    failures: u32,
}

impl Liveness {
    /// None for a shard that serves no HTTP (a worker).
    fn new(o: &SupervisorOptions) -> Option<Liveness> {
        let port = o.http_port?;
        let wait = o.liveness_interval.min(Duration::from_secs(10));
        let mut every = tokio::time::interval(o.liveness_interval);
        // Ticks missed while the engine loaded are not made up in a burst.
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Some(Liveness {
            health: Health::new(&o.health_host, port, None, wait),
            every,
            asking: None,
            misses: 0,
            failures: o.liveness_failures.max(1),
        })
    }

    /// Resolves, with the shard's error, once `failures` asks in a row have
    /// failed; cancelled and polled again at will (the ask in flight is
    /// kept).
    async fn failed(&mut self) -> String {
        loop {
            let Some(ask) = self.asking.as_mut() else {
                self.every.tick().await;
                let health = self.health.clone();
                self.asking = Some(Box::pin(async move { health.ready().await }));
                continue;
            };
            let answer = ask.await;
            self.asking = None;
            match answer {
                Ok(()) => self.misses = 0,
                Err(e) => {
                    self.misses += 1;
                    tracing::warn!(misses = self.misses, error = %e, "a ready engine did not answer its health check");
                    if self.misses >= self.failures {
                        return format!(
                            "stopped answering its health check ({} in a row; last: {e}); restarted as hung",
                            self.misses
                        );
                    }
                }
            }
        }
    }
}

fn log_for(o: &SupervisorOptions) -> LogTail {
    match &o.log_file {
        Some(f) => LogTail::of_file(f.clone(), o.log_lines),
        None => LogTail::new(o.log_lines),
    }
}

/// Carries out a control message; true when supervision ends. A dropped
/// handle (the agent exiting) ends it with the processes left running, to
/// be adopted; a drain signals nothing; a stop runs `stop`. The stop future
/// is lazy: nothing happens unless it is awaited.
async fn obey(
    msg: Option<Control>,
    tx: &watch::Sender<Status>,
    draining: &mut bool,
    stop: impl Future<Output = ()>,
) -> bool {
    match msg {
        None => true,
        Some(Control::Drain) => {
            *draining = true;
            set(tx, State::Draining);
            false
        }
        Some(Control::Stop) => {
            set(tx, State::Draining);
            stop.await;
            set(tx, State::Stopped);
            true
        }
    }
}

/// The first of `children` to exit (tokio's `wait` is cancel safe, so
/// this can race other events).
async fn first_exit(children: &mut [(String, Child)]) -> (usize, std::io::Result<ExitStatus>) {
    let waits = children.iter_mut().map(|(_, c)| Box::pin(c.wait()));
    let (status, i, _) = futures_util::future::select_all(waits).await;
    (i, status)
}

async fn supervise(
    commands: Vec<Command>,
    o: SupervisorOptions,
    log: LogTail,
    tx: watch::Sender<Status>,
    mut control: mpsc::UnboundedReceiver<Control>,
) {
    let mut children: Vec<(String, Child)> = Vec::new();
    // The output readers: a failure waits for them, so that its log tail
    // holds the last lines the process wrote before it died.
    let mut readers: Vec<Option<tokio::task::JoinHandle<()>>> = Vec::new();
    let pgids = |tx: &watch::Sender<Status>| tx.borrow().pids.clone();
    if commands.is_empty() {
        fail(&tx, &log, "no commands to run".into(), None);
        return;
    }
    let last = commands.len() - 1;
    for (i, c) in commands.iter().enumerate() {
        let what = if i == last {
            c.name.clone()
        } else {
            format!("sidecar {i} ({})", c.name)
        };
        if c.wait_for_leader_port {
            let Some((host, port)) = o.leader.clone() else {
                groups::stop_children(&mut children, &pgids(&tx), o.stop_timeout).await;
                fail(
                    &tx,
                    &log,
                    format!("{what} waits for a leader, but none is known"),
                    None,
                );
                return;
            };
            // A stop must not wait for a leader that may never come; nor
            // a drain: a shard not yet serving has nothing to finish.
            let wait = groups::wait_for_port(&host, port, o.rendezvous_timeout);
            tokio::pin!(wait);
            let up = tokio::select! {
                up = &mut wait => up,
                msg = control.recv() => {
                    let msg = msg.map(|_| Control::Stop);
                    let pg = pgids(&tx);
                    let stop = groups::stop_children(&mut children, &pg, o.stop_timeout);
                    obey(msg, &tx, &mut true, stop).await;
                    return;
                }
            };
            if !up {
                groups::stop_children(&mut children, &pgids(&tx), o.stop_timeout).await;
                fail(
                    &tx,
                    &log,
                    format!(
                        "waiting for {host}:{port} ({what}): not listening after {:?}",
                        o.rendezvous_timeout
                    ),
                    None,
                );
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
                let error = if i == last {
                    format!("starting {}: {e}", c.path.display())
                } else {
                    format!("{what}: starting {}: {e}", c.path.display())
                };
                groups::stop_children(&mut children, &pgids(&tx), o.stop_timeout).await;
                fail(&tx, &log, error, None);
                return;
            }
        }
    }
    set(&tx, State::Starting);
    set(&tx, State::Loading);
    let mut draining = false;
    let mut readiness = Readiness::new(&o);
    let mut ready = false;
    let ready_by = o.startup_timeout.map(|t| Instant::now() + t);
    let mut probe = tokio::time::interval(o.probe_interval);
    probe.tick().await;
    let mut liveness = Liveness::new(&o);
    let grace_over = readiness.grace_over;
    let exited = loop {
        let waiting = !ready && !draining;
        let watched = ready && !draining && liveness.is_some();
        tokio::select! {
            error = async { liveness.as_mut()?.failed().await.into() }, if watched => {
                let Some(error) = error else { continue };
                groups::stop_children(&mut children, &pgids(&tx), o.stop_timeout).await;
                fail(&tx, &log, error, None);
                return;
            }
            (i, status) = first_exit(&mut children) => break (i, status),
            msg = control.recv() => {
                let pg = pgids(&tx);
                let stop = groups::stop_children(&mut children, &pg, o.stop_timeout);
                if obey(msg, &tx, &mut draining, stop).await {
                    return;
                }
            }
            _ = tokio::time::sleep_until(grace_over), if waiting && readiness.health.is_none() => {
                ready = true;
                set(&tx, State::Ready);
            }
            _ = probe.tick(), if waiting && readiness.health.is_some() => {
                if readiness.probe().await {
                    ready = true;
                    set(&tx, State::Ready);
                }
            }
            _ = tokio::time::sleep_until(ready_by.unwrap_or_else(Instant::now)), if waiting && ready_by.is_some() => {
                // A load that never finishes: its output is the diagnosis.
                let waited = o.startup_timeout.unwrap_or_default();
                groups::stop_children(&mut children, &pgids(&tx), o.stop_timeout).await;
                fail(
                    &tx,
                    &log,
                    format!("not ready within the startup timeout ({waited:?}): {}", readiness.why()),
                    None,
                );
                return;
            }
        }
    };
    let (i, status) = exited;
    let code = status.as_ref().ok().and_then(ExitStatus::code);
    let how = match &status {
        Ok(s) => s.to_string(),
        Err(e) => e.to_string(),
    };
    let name = children[i].0.clone();
    // The rest of the shard goes, the exited command's own group too: an
    // engine's workers outlive it, holding its GPUs and its port.
    groups::stop_children(&mut children, &pgids(&tx), o.stop_timeout).await;
    // Its pipe closes with its group: read what it wrote last.
    if let Some(r) = readers[i].take() {
        let _ = tokio::time::timeout(Duration::from_secs(1), r).await;
    }
    if draining {
        tx.send_modify(|s| {
            s.state = State::Stopped;
            s.exit_code = code;
        });
    } else if i == last {
        fail(
            &tx,
            &log,
            format!("{name} exited unexpectedly ({how}){}", last_word(&log)),
            code,
        );
    } else {
        // A sidecar (a Ray head, say) is part of the shard: without it the
        // engine cannot work, so the shard fails now rather than later.
        fail(
            &tx,
            &log,
            format!("sidecar {name} exited ({how}){}", last_word(&log)),
            code,
        );
    }
}

fn spawn(
    c: &Command,
    o: &SupervisorOptions,
    log: &LogTail,
) -> std::io::Result<(Child, Option<tokio::task::JoinHandle<()>>)> {
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
    // stdout and stderr share one pipe or one file, so that lines keep the
    // order they were written in.
    let reader = match &o.log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
            cmd.stdout(Stdio::from(file.try_clone()?))
                .stderr(Stdio::from(file));
            None
        }
        None => {
            let (read, write) = std::io::pipe()?;
            cmd.stdout(Stdio::from(write.try_clone()?))
                .stderr(Stdio::from(write));
            Some(read)
        }
    };
    let child = cmd.spawn()?;
    // The parent's copies of the write end go, so the reader sees EOF when
    // the command (and everything it forked) closes its own.
    drop(cmd);
    let pump = match reader {
        Some(read) => match tokio::net::unix::pipe::Receiver::from_owned_fd(read.into()) {
            Ok(rx) => Some(tokio::spawn(output::pump(rx, log.clone(), c.name.clone()))),
            Err(e) => {
                // Nobody would read its output: it must not run untracked.
                if let Some(pid) = child
                    .id()
                    .and_then(|p| rustix::process::Pid::from_raw(p as i32))
                {
                    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                }
                return Err(e);
            }
        },
        None => None,
    };
    Ok((child, pump))
}
