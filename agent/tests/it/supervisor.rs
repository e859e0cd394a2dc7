//! The supervisor and the state files with real child processes (small
//! shell scripts): stop timeouts, output kept in files, adoption of a
//! previous agent's engines, and what is done with files nobody can trust.

use std::collections::BTreeMap;
use std::time::Duration;

use llmgw_agent::engines::Command as EngineCommand;
use llmgw_agent::state_files::{self, Found, Record, Spec};
use llmgw_agent::supervisor::{State, Status, SupervisorOptions, adopt, start};

pub(crate) fn sh(name: &str, script: &str) -> EngineCommand {
    EngineCommand {
        name: name.into(),
        path: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        env: BTreeMap::new(),
        wait_for_leader_port: false,
    }
}

pub(crate) async fn until(rx: &mut tokio::sync::watch::Receiver<Status>, want: State) -> Status {
    tokio::time::timeout(
        Duration::from_secs(20),
        rx.wait_for(|s| s.state == want || s.state == State::Failed),
    )
    .await
    .expect("state reached in time")
    .unwrap()
    .clone()
}

/// Whether a process has ended: gone, or a zombie awaiting its parent.
pub(crate) fn gone(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.is_empty()
        || stat
            .rsplit_once(") ")
            .is_some_and(|(_, r)| r.starts_with('Z'))
}

/// A live (not zombie) process in the group.
pub(crate) fn group_alive(pgid: u32) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                return false;
            };
            let Some((_, rest)) = stat.rsplit_once(") ") else {
                return false;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.len() > 2 && f[0] != "Z" && f[2] == pgid.to_string()
        })
}

pub(crate) fn quick() -> SupervisorOptions {
    SupervisorOptions {
        stop_timeout: Duration::from_millis(300),
        alive_grace: Duration::from_millis(50),
        probe_interval: Duration::from_millis(20),
        ..SupervisorOptions::default()
    }
}

#[tokio::test]
async fn an_engine_that_ignores_sigterm_is_killed_after_the_stop_timeout() {
    let shard = start(vec![sh("engine", "trap '' TERM; sleep 30 & wait")], quick());
    let mut status = shard.status();
    until(&mut status, State::Ready).await;
    let pgid = status.borrow().pids[0];
    let began = std::time::Instant::now();
    assert_eq!(shard.stop().await.state, State::Stopped);
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    assert!(!group_alive(pgid), "SIGKILL took the group");
}

#[tokio::test]
async fn output_goes_to_the_shards_log_file_and_its_tail_explains_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("shard-a.log");
    let options = SupervisorOptions {
        log_file: Some(log.clone()),
        ..quick()
    };
    let shard = start(
        vec![sh(
            "engine",
            "echo loading; echo 'CUDA out of memory' >&2; exit 3",
        )],
        options,
    );
    let mut status = shard.status();
    let s = until(&mut status, State::Failed).await;
    let s = if s.state == State::Failed {
        s
    } else {
        until(&mut status, State::Failed).await
    };
    assert_eq!(s.exit_code, Some(3));
    assert!(s.log_tail.contains("CUDA out of memory"), "{}", s.log_tail);
    // The error itself says why, as ctl models and replicas show it.
    assert_eq!(
        s.error.as_deref(),
        Some("engine exited unexpectedly (exit status: 3): CUDA out of memory")
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("loading") && text.contains("CUDA out of memory"),
        "{text}"
    );
}

fn spec(shard: &str) -> Spec {
    Spec {
        replica_id: "rep-1".into(),
        shard_id: shard.into(),
        rank: 1,
        nnodes: 2,
        gpu_indices: vec![],
        hcas: vec![],
        http_port: 20100,
        model: "m".into(),
        profile: "p".into(),
        engine: "sim".into(),
        served_model_name: "m".into(),
        pool: "cpu".into(),
        fabric: String::new(),
        leader_addr: "10.0.0.1".into(),
        leader_port: 21100,
        profile_fp: "fp".into(),
    }
}

#[tokio::test]
async fn a_second_supervisor_finds_adopts_and_stops_what_the_first_started() {
    let dir = tempfile::tempdir().unwrap();
    let first = start(vec![sh("engine", "exec sleep 30")], quick());
    let mut status = first.status();
    until(&mut status, State::Ready).await;
    let pid = status.borrow().pids[0];
    let cmdline = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match state_files::cmdline_of(pid) {
                Some(c) if c == ["sleep", "30"] => return c,
                _ => tokio::task::yield_now().await,
            }
        }
    })
    .await
    .expect("exec replaced the shell");
    state_files::write(
        dir.path(),
        &Record {
            spec: spec("a"),
            pids: vec![pid],
            cmdline,
            started_at: 1,
        },
    )
    .unwrap();
    // The first agent dies; its engine does not.
    drop(first);
    let found = state_files::scan(dir.path());
    let [Found::Adopt(r)] = found.as_slice() else {
        panic!("{found:?}")
    };
    assert_eq!(r.pids, vec![pid]);
    assert_eq!(r.spec.replica_id, "rep-1");
    assert_eq!(r.spec.start().http_port, 20100, "the spec is whole");
    let adopted = adopt(r.pids.clone(), quick());
    let mut s = adopted.status();
    assert_eq!(
        until(&mut s, State::Ready).await.state,
        State::Ready,
        "a worker: alive is ready"
    );
    assert_eq!(adopted.stop().await.state, State::Stopped);
    assert!(!group_alive(pid));
}

#[tokio::test]
async fn an_adopted_engine_that_dies_fails_its_shard() {
    let first = start(vec![sh("engine", "exec sleep 30")], quick());
    let mut status = first.status();
    until(&mut status, State::Ready).await;
    let pid = status.borrow().pids[0];
    let adopted = adopt(vec![pid], quick());
    let mut s = adopted.status();
    until(&mut s, State::Ready).await;
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status();
    let s = until(&mut s, State::Failed).await;
    assert_eq!(s.state, State::Failed);
    assert_eq!(s.error.as_deref(), Some("adopted engine exited"));
    drop(first);
}

#[test]
fn state_files_that_cannot_be_trusted_are_judged_and_never_adopted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("shard-broken.json"), "{not json").unwrap();
    std::fs::write(dir.path().join("shard-a.json.tmp"), "{}").unwrap();
    // A pid that is alive but runs something else than recorded: reused.
    let me = std::process::id();
    state_files::write(
        dir.path(),
        &Record {
            spec: spec("reused"),
            pids: vec![me],
            cmdline: vec!["llmgw".into(), "sim-engine".into()],
            started_at: 1,
        },
    )
    .unwrap();
    // A process that is gone.
    state_files::write(
        dir.path(),
        &Record {
            spec: spec("gone"),
            pids: vec![999_999_999],
            cmdline: vec!["x".into()],
            started_at: 1,
        },
    )
    .unwrap();
    let mut found = state_files::scan(dir.path());
    found.sort_by_key(|f| format!("{f:?}"));
    assert_eq!(
        found,
        vec![
            Found::Gone("gone".into()),
            Found::Stale("broken".into()),
            Found::Stale("reused".into()),
        ]
    );
    assert!(state_files::path(dir.path(), "../escape").is_err());
    assert!(state_files::path(dir.path(), "").is_err());
}

/// An engine's HTTP surface, scripted: `/health`'s status and the models
/// `/v1/models` lists can change while it runs; requests are counted.
pub(crate) struct FakeEngine {
    pub(crate) port: u16,
    pub(crate) health: std::sync::Arc<std::sync::Mutex<(u16, Vec<String>)>>,
    pub(crate) seen: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) probes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

pub(crate) async fn fake_engine(status: u16, models: &[&str]) -> FakeEngine {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let health = std::sync::Arc::new(std::sync::Mutex::new((
        status,
        models.iter().map(|m| (*m).to_owned()).collect::<Vec<_>>(),
    )));
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let probes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (h, n, p) = (health.clone(), seen.clone(), probes.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let (h, n, p) = (h.clone(), n.clone(), p.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let Ok(len) = sock.read(&mut buf).await else {
                    return;
                };
                let req = String::from_utf8_lossy(&buf[..len]).into_owned();
                let (status, models) = h.lock().unwrap().clone();
                let (code, body) = if req.starts_with("GET /health") {
                    p.fetch_add(1, Ordering::SeqCst);
                    (status, "{}".to_owned())
                } else {
                    n.fetch_add(1, Ordering::SeqCst);
                    let data: Vec<String> = models
                        .iter()
                        .map(|m| format!("{{\"id\":\"{m}\"}}"))
                        .collect();
                    (200, format!("{{\"data\":[{}]}}", data.join(",")))
                };
                let resp = format!(
                    "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    FakeEngine {
        port,
        health,
        seen,
        probes,
    }
}

#[tokio::test]
async fn ready_means_healthy_and_serving_this_shards_model() {
    use std::sync::atomic::Ordering;
    let engine = fake_engine(200, &["some-other-model"]).await;
    let options = SupervisorOptions {
        http_port: Some(engine.port),
        served_model: Some("llama-3.3-70b".into()),
        ..quick()
    };
    let shard = start(vec![sh("engine", "exec sleep 30")], options);
    let status = shard.status();
    // Healthy but serving another model: probed, never ready.
    tokio::time::timeout(Duration::from_secs(10), async {
        while engine.seen.load(Ordering::SeqCst) < 3 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    assert_eq!(
        status.borrow().state,
        State::Loading,
        "does not serve the model"
    );
    // Still loading (503), then the model appears and it is healthy.
    *engine.health.lock().unwrap() = (503, vec!["llama-3.3-70b".into()]);
    let before = engine.seen.load(Ordering::SeqCst);
    let probed = engine.probes.load(Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), async {
        while engine.probes.load(Ordering::SeqCst) < probed + 3 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    // At most the probe in flight when the health turned 503 went on.
    assert!(
        engine.seen.load(Ordering::SeqCst) <= before + 1,
        "a 503 health stops there"
    );
    assert_eq!(status.borrow().state, State::Loading);
    *engine.health.lock().unwrap() = (200, vec!["llama-3.3-70b".into()]);
    let mut status = status;
    assert_eq!(until(&mut status, State::Ready).await.state, State::Ready);
    shard.stop().await;
}

/// A ready engine that stops answering its health check (hung: its
/// process and port are still there) fails its shard after
/// `liveness_failures` asks in a row, so that it is restarted.
#[tokio::test]
async fn a_ready_engine_that_stops_answering_its_health_check_fails_its_shard() {
    let engine = fake_engine(200, &["m"]).await;
    let options = SupervisorOptions {
        http_port: Some(engine.port),
        served_model: Some("m".into()),
        liveness_interval: Duration::from_millis(50),
        liveness_failures: 3,
        ..quick()
    };
    let shard = start(vec![sh("engine", "exec sleep 30")], options);
    let mut status = shard.status();
    assert_eq!(until(&mut status, State::Ready).await.state, State::Ready);
    let pgid = status.borrow().pids[0];
    // Healthy for a while: asked, and still ready.
    let asked = engine.probes.load(std::sync::atomic::Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), async {
        while engine.probes.load(std::sync::atomic::Ordering::SeqCst) < asked + 3 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("asked while ready");
    assert_eq!(status.borrow().state, State::Ready);
    *engine.health.lock().unwrap() = (500, vec!["m".into()]);
    let failed = until(&mut status, State::Failed).await;
    assert_eq!(failed.state, State::Failed);
    let error = failed.error.unwrap_or_default();
    assert!(
        error.contains("stopped answering its health check (3 in a row"),
        "{error}"
    );
    assert!(!group_alive(pgid), "the hung engine was stopped");
}

#[tokio::test]
async fn a_shard_not_ready_within_its_startup_timeout_fails_with_its_output() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let options = SupervisorOptions {
        http_port: Some(closed),
        startup_timeout: Some(Duration::from_millis(300)),
        ..quick()
    };
    let shard = start(
        vec![sh("engine", "echo 'CUDA out of memory'; exec sleep 30")],
        options,
    );
    let mut status = shard.status();
    let s = until(&mut status, State::Failed).await;
    assert_eq!(s.state, State::Failed);
    // The error says how far the engine got: its last probe's answer.
    let error = s.error.clone().unwrap_or_default();
    assert!(
        error.contains("startup timeout") && error.contains("health: "),
        "{s:?}"
    );
    assert!(s.log_tail.contains("CUDA out of memory"), "{}", s.log_tail);
    let pgid = s.pids[0];
    assert!(!group_alive(pgid), "the engine was stopped");
}

#[tokio::test]
async fn an_adopted_serving_shard_becomes_ready_when_its_engine_answers() {
    let engine = fake_engine(503, &["m"]).await;
    let first = start(vec![sh("engine", "exec sleep 30")], quick());
    let mut status = first.status();
    until(&mut status, State::Ready).await;
    let pid = status.borrow().pids[0];
    let options = SupervisorOptions {
        http_port: Some(engine.port),
        served_model: Some("m".into()),
        ..quick()
    };
    let adopted = adopt(vec![pid], options);
    let mut s = adopted.status();
    assert_eq!(
        s.borrow().state,
        State::Starting,
        "not ready until it answers"
    );
    engine.health.lock().unwrap().0 = 200;
    assert_eq!(until(&mut s, State::Ready).await.state, State::Ready);
    adopted.stop().await;
    drop(first);
}
