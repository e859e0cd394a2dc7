//! The original agent's supervisor tests, row by row
//! (`shared/reference/supervisor-weights.md` §3, rows 1–33), against this
//! supervisor's API: a shard handle per start instead of a map of shards,
//! with the rows that belong to the session (idempotent starts, state
//! files) tested where the session is.

use std::time::Duration;

use llmgw_agent::supervisor::{
    Health, LogTail, MAX_LINE, NotReady, State, SupervisorOptions, adopt, start,
};

use super::supervisor::{fake_engine, gone, group_alive, quick, sh, until};

/// Something that listens and answers every request with `body` (200).
async fn fixed_engine(body: &'static str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = sock.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    port
}

fn health(port: u16, model: Option<&str>) -> Health {
    Health::new(
        "127.0.0.1",
        port,
        model.map(str::to_owned),
        Duration::from_secs(2),
    )
}

// Rows 1–5: the health check.

#[tokio::test]
async fn ready_when_serving_the_model() {
    let engine = fake_engine(200, &["llama-3.3-70b"]).await;
    assert_eq!(
        health(engine.port, Some("llama-3.3-70b")).ready().await,
        Ok(())
    );
}

#[tokio::test]
async fn not_ready_while_loading() {
    let engine = fake_engine(503, &["llama-3.3-70b"]).await;
    let e = health(engine.port, Some("llama-3.3-70b"))
        .ready()
        .await
        .unwrap_err();
    assert!(matches!(e, NotReady::Health(_)), "{e:?}");
    assert!(e.to_string().starts_with("health: status 503"), "{e}");
}

#[tokio::test]
async fn not_ready_when_the_model_is_missing_or_only_mentioned() {
    let engine = fake_engine(200, &["some-other-model"]).await;
    let e = health(engine.port, Some("llama-3.3-70b"))
        .ready()
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"engine is up but does not serve "llama-3.3-70b" yet"#
    );
    // Only an exact id counts, not the name appearing elsewhere (an older
    // check matched any quoted string in the body); HTTP/1.0 is fine.
    let port = fixed_engine(r#"{"data":[{"id":"m-large","owned_by":"m"}]}"#).await;
    assert_eq!(
        health(port, Some("m")).ready().await,
        Err(NotReady::NotServing("m".into()))
    );
    assert_eq!(health(port, Some("m-large")).ready().await, Ok(()));
    let port = fixed_engine("not json").await;
    assert!(matches!(
        health(port, Some("m")).ready().await,
        Err(NotReady::Models(_))
    ));
}

#[tokio::test]
async fn the_model_check_can_be_skipped() {
    use std::sync::atomic::Ordering;
    let engine = fake_engine(200, &[]).await;
    assert_eq!(health(engine.port, None).ready().await, Ok(()));
    assert_eq!(health(engine.port, Some("")).ready().await, Ok(()));
    assert_eq!(engine.seen.load(Ordering::SeqCst), 0, "no /v1/models asked");
}

#[tokio::test]
async fn an_unreachable_engine_is_not_ready() {
    let h = Health::new("127.0.0.1", 1, None, Duration::from_millis(200));
    assert!(matches!(h.ready().await, Err(NotReady::Health(_))));
}

// Rows 6–10: starting and stopping.

#[tokio::test]
async fn start_and_stop() {
    let shard = start(vec![sh("engine", "sleep 30")], quick());
    let mut status = shard.status();
    let s = status
        .wait_for(|s| !s.pids.is_empty())
        .await
        .unwrap()
        .clone();
    assert!(s.state.live(), "{s:?}");
    assert_ne!(s.pids[0], 0);
    let s = shard.stop().await;
    assert_eq!(s.state, State::Stopped);
    assert!(!group_alive(s.pids[0]));
}

#[tokio::test]
async fn an_unexpected_exit_is_a_failure_even_with_status_zero() {
    let shard = start(vec![sh("engine", "exit 0")], quick());
    let s = until(&mut shard.status(), State::Failed).await;
    assert_eq!((s.state, s.exit_code), (State::Failed, Some(0)));
    let error = s.error.unwrap();
    assert!(error.contains("exited unexpectedly"), "{error}");
}

#[tokio::test]
async fn a_non_zero_exit_records_its_code() {
    let shard = start(vec![sh("engine", "exit 42")], quick());
    let s = until(&mut shard.status(), State::Failed).await;
    assert_eq!((s.state, s.exit_code), (State::Failed, Some(42)));
}

#[tokio::test]
async fn stop_kills_the_engines_children() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child");
    let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
    let shard = start(vec![sh("engine", &script)], quick());
    let child: u32 = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(pid) = std::fs::read_to_string(&pidfile)
                .unwrap_or_default()
                .trim()
                .parse()
            {
                return pid;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    assert!(std::path::Path::new(&format!("/proc/{child}")).exists());
    assert_eq!(shard.stop().await.state, State::Stopped);
    assert!(gone(child), "the forked child is gone");
}

// Rows 13–17: readiness, draining, output.

#[tokio::test]
async fn an_engine_that_dies_while_loading_fails_at_once() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let options = SupervisorOptions {
        http_port: Some(closed),
        // Far beyond the test's own patience: the exit must end it.
        startup_timeout: Some(Duration::from_secs(600)),
        ..quick()
    };
    let shard = start(vec![sh("engine", "echo dying; exit 1")], options);
    let s = until(&mut shard.status(), State::Failed).await;
    assert_eq!((s.state, s.exit_code), (State::Failed, Some(1)));
    assert!(s.log_tail.contains("[engine] dying"), "{}", s.log_tail);
}

#[tokio::test]
async fn a_drained_shard_keeps_running_and_its_exit_is_a_stop() {
    let shard = start(vec![sh("engine", "exec sleep 30")], quick());
    let mut status = shard.status();
    until(&mut status, State::Ready).await;
    shard.drain();
    let s = until(&mut status, State::Draining).await;
    assert_eq!(s.state, State::Draining);
    let pid = s.pids[0];
    assert!(group_alive(pid), "draining signals nothing");
    let _ = std::process::Command::new("kill")
        .arg(pid.to_string())
        .status();
    let s = status
        .wait_for(|s| s.state.terminal())
        .await
        .unwrap()
        .clone();
    assert_eq!(s.state, State::Stopped, "an expected exit: {s:?}");
    assert_eq!(s.error, None);
}

#[tokio::test]
async fn output_is_captured_in_the_order_it_was_written() {
    let shard = start(
        vec![sh(
            "engine",
            "echo line1; echo line2 >&2; printf 'line3\\r\\n'; exit 1",
        )],
        quick(),
    );
    let s = until(&mut shard.status(), State::Failed).await;
    assert_eq!(
        s.log_tail, "[engine] line1\n[engine] line2\n[engine] line3",
        "stdout and stderr interleaved as written, the \\r dropped"
    );
}

/// The output lines of an engine running `script` until it fails.
async fn failed_output(script: &str) -> Vec<String> {
    let shard = start(vec![sh("engine", script)], quick());
    let s = until(&mut shard.status(), State::Failed).await;
    s.log_tail.lines().map(str::to_owned).collect()
}

#[tokio::test]
async fn a_line_longer_than_the_limit_is_split_and_reading_goes_on() {
    let lines = |n: usize| format!("head -c {n} /dev/zero | tr '\\0' a; echo; echo after; exit 1");
    let over = failed_output(&lines(MAX_LINE + 10)).await;
    let lengths: Vec<usize> = over.iter().map(String::len).collect();
    assert_eq!(over.len(), 3, "{lengths:?}");
    assert_eq!(over[0].len(), "[engine] ".len() + MAX_LINE);
    assert_eq!(over[1], format!("[engine] {}", "a".repeat(10)));
    assert_eq!(over[2], "[engine] after");
    // A line of exactly the limit is one line, not one and an empty one.
    let exact = failed_output(&lines(MAX_LINE)).await;
    assert_eq!(exact.len(), 2);
    assert_eq!(exact[1], "[engine] after");
}

#[tokio::test]
async fn an_engine_that_dies_takes_its_own_children_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child");
    let script = format!("sleep 30 & echo $! > {}; exit 1", pidfile.display());
    let shard = start(vec![sh("engine", &script)], quick());
    let s = until(&mut shard.status(), State::Failed).await;
    assert_eq!(s.state, State::Failed);
    let child: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(gone(child), "the engine's child outlived it");
}

#[tokio::test]
async fn a_stop_while_waiting_for_the_leader_ends_the_wait() {
    let mut join = sh("join", "exec sleep 30");
    join.wait_for_leader_port = true;
    let shard = start(
        vec![join],
        SupervisorOptions {
            leader: Some(("127.0.0.1".into(), 1)),
            // Far beyond the test's patience: only the stop can end it.
            rendezvous_timeout: Duration::from_secs(600),
            ..quick()
        },
    );
    let s = tokio::time::timeout(Duration::from_secs(20), shard.stop())
        .await
        .expect("the stop did not wait for the leader");
    assert_eq!(s.state, State::Stopped);
    assert!(s.pids.is_empty(), "nothing was started");
}

// Rows 20–21: state names and the log tail.

#[test]
fn state_names_and_classes() {
    let all = [
        (State::Pending, "pending", false, false),
        (State::Starting, "starting", false, true),
        (State::Loading, "loading", false, true),
        (State::Ready, "ready", false, true),
        (State::Draining, "draining", false, true),
        (State::Stopped, "stopped", true, false),
        (State::Failed, "failed", true, false),
    ];
    for (state, name, terminal, live) in all {
        assert_eq!(state.to_string(), name);
        assert_eq!(state.terminal(), terminal, "{name}");
        assert_eq!(state.live(), live, "{name}");
    }
}

#[test]
fn the_log_tail_keeps_the_newest_lines_in_order() {
    let ring = LogTail::new(3);
    assert!(ring.tail(10).is_empty());
    ring.push("a".into());
    ring.push("b".into());
    assert_eq!(ring.tail(10), ["a", "b"]);
    ring.push("c".into());
    ring.push("d".into());
    assert_eq!(ring.tail(10), ["b", "c", "d"]);
    assert_eq!(ring.tail(0), ["b", "c", "d"]);
    assert_eq!(ring.tail(2), ["c", "d"]);
    assert_eq!(ring.text(), "b\nc\nd");
    let default = LogTail::new(0);
    for i in 0..300 {
        default.push(i.to_string());
    }
    assert_eq!(default.tail(0).len(), 256, "0 keeps the default");
}

// Rows 23–33: adoption, sidecars, rendezvous, workers.

#[tokio::test]
async fn adopting_a_process_that_is_gone_fails_at_once() {
    let shard = adopt(vec![999_999_999], quick());
    let s = until(&mut shard.status(), State::Failed).await;
    assert_eq!(s.state, State::Failed);
    assert_eq!(s.error.as_deref(), Some("adopted engine exited"));
}

#[tokio::test]
async fn a_sidecar_and_an_engine_both_run_under_one_shard() {
    let dir = tempfile::tempdir().unwrap();
    let names = dir.path().join("names");
    let run = |n: &str| {
        format!(
            "echo {n} >> {}; echo hello-from-{n}; exec sleep 30",
            names.display()
        )
    };
    let shard = start(
        vec![sh("sidecar", &run("sidecar")), sh("engine", &run("engine"))],
        quick(),
    );
    let mut status = shard.status();
    until(&mut status, State::Ready).await;
    let (seen, logs) = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let seen = std::fs::read_to_string(&names).unwrap_or_default();
            let logs = shard.log_tail();
            if seen.lines().count() == 2 && logs.lines().count() == 2 {
                return (seen, logs);
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("both ran");
    let mut seen: Vec<&str> = seen.lines().collect();
    seen.sort_unstable();
    assert_eq!(seen, ["engine", "sidecar"]);
    assert!(logs.contains("[sidecar] hello-from-sidecar"), "{logs}");
    assert!(logs.contains("[engine] hello-from-engine"), "{logs}");
    let s = shard.stop().await;
    assert_eq!(s.pids.len(), 2);
    assert!(
        s.pids.iter().all(|p| !group_alive(*p)),
        "the sidecar stops too"
    );
}

#[tokio::test]
async fn a_sidecar_that_dies_takes_the_shard_and_its_engine_down() {
    // A deviation from the original (which ignored a sidecar's exit): a
    // vLLM leader cannot work without its Ray head.
    let shard = start(
        vec![sh("ray-head", "exit 7"), sh("engine", "exec sleep 30")],
        quick(),
    );
    let s = until(&mut shard.status(), State::Failed).await;
    assert_eq!((s.state, s.exit_code), (State::Failed, Some(7)));
    let error = s.error.unwrap();
    assert!(error.starts_with("sidecar ray-head exited"), "{error}");
    assert!(
        s.pids.iter().all(|p| !group_alive(*p)),
        "the engine went too"
    );
}

#[tokio::test]
async fn a_sidecar_that_cannot_start_fails_the_shard() {
    let mut missing = sh("ray-head", "");
    missing.path = "/nonexistent/binary".into();
    let shard = start(vec![missing, sh("engine", "exec sleep 30")], quick());
    let s = until(&mut shard.status(), State::Failed).await;
    let error = s.error.unwrap();
    assert!(
        error.starts_with("sidecar 0 (ray-head): starting /nonexistent/binary:"),
        "{error}"
    );
    assert!(s.pids.is_empty(), "the engine never started");
}

#[tokio::test]
async fn a_command_waiting_for_its_leader_starts_once_the_leader_listens() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut join = sh("join", "exec sleep 30");
    join.wait_for_leader_port = true;
    let shard = start(
        vec![join, sh("engine", "exec sleep 30")],
        SupervisorOptions {
            leader: Some(("127.0.0.1".into(), port)),
            rendezvous_timeout: Duration::from_secs(20),
            ..quick()
        },
    );
    let mut status = shard.status();
    // Nothing starts while the leader is not there (a bounded look).
    let early = tokio::time::timeout(
        Duration::from_millis(600),
        status.wait_for(|s| !s.pids.is_empty()),
    )
    .await
    .is_err();
    assert!(early, "started before its leader listened");
    assert_eq!(status.borrow().state, State::Pending);
    let _leader = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    assert_eq!(until(&mut status, State::Ready).await.pids.len(), 2);
    shard.stop().await;
}

#[tokio::test]
async fn a_leader_that_never_listens_fails_the_shard_in_time() {
    let mut join = sh("join", "exec sleep 30");
    join.wait_for_leader_port = true;
    let shard = start(
        vec![join, sh("engine", "exec sleep 30")],
        SupervisorOptions {
            leader: Some(("127.0.0.1".into(), 1)),
            rendezvous_timeout: Duration::from_millis(300),
            ..quick()
        },
    );
    let s = until(&mut shard.status(), State::Failed).await;
    let error = s.error.unwrap();
    assert!(
        error.starts_with("waiting for 127.0.0.1:1 (sidecar 0 (join)): not listening after"),
        "{error}"
    );
}

#[tokio::test]
async fn a_worker_is_ready_once_it_outlives_the_alive_grace() {
    let began = std::time::Instant::now();
    let shard = start(
        vec![sh("worker", "exec sleep 30")],
        SupervisorOptions {
            alive_grace: Duration::from_millis(150),
            ..quick()
        },
    );
    let mut status = shard.status();
    assert_eq!(until(&mut status, State::Ready).await.state, State::Ready);
    assert!(
        began.elapsed() >= Duration::from_millis(150),
        "ready before the grace was over"
    );
    shard.stop().await;
}

#[tokio::test]
async fn a_worker_that_dies_early_never_looks_ready() {
    let shard = start(
        vec![sh("worker", "exit 1")],
        SupervisorOptions {
            // Longer than `until` waits: only the exit can end this.
            alive_grace: Duration::from_secs(600),
            ..quick()
        },
    );
    let s = until(&mut shard.status(), State::Ready).await;
    assert_eq!((s.state, s.exit_code), (State::Failed, Some(1)));
}

#[tokio::test]
async fn an_engine_inherits_the_agents_environment_under_its_own_variables() {
    let mut cmd = sh(
        "engine",
        "echo \"home=$HOME mine=$LLMGW_TEST_MARKER\"; exit 1",
    );
    cmd.env.insert("LLMGW_TEST_MARKER".into(), "present".into());
    let shard = start(vec![cmd], quick());
    let s = until(&mut shard.status(), State::Failed).await;
    let home = std::env::var("HOME").unwrap_or_default();
    assert_eq!(s.log_tail, format!("[engine] home={home} mine=present"));
}

#[tokio::test]
async fn an_adopted_engine_whose_process_died_fails_though_its_children_linger() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child");
    let script = format!("sleep 30 & echo $! > {}; exec sleep 31", pidfile.display());
    let first = start(vec![sh("engine", &script)], quick());
    let mut status = first.status();
    until(&mut status, State::Ready).await;
    let pid = status.borrow().pids[0];
    // The first agent goes (its engine stays), as in an agent restart.
    drop(first);
    let adopted = adopt(vec![pid], quick());
    let mut s = adopted.status();
    until(&mut s, State::Ready).await;
    let child: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(group_alive(pid));
    // Only the engine's own process dies; its child lives on.
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    let s = until(&mut s, State::Failed).await;
    assert_eq!(s.error.as_deref(), Some("adopted engine exited"));
    assert!(!group_alive(pid), "what was left of its group is killed");
    assert!(gone(child), "its child is gone");
}

#[tokio::test]
async fn a_drain_while_waiting_for_the_leader_ends_the_shard() {
    let mut join = sh("join", "exec sleep 30");
    join.wait_for_leader_port = true;
    let shard = start(
        vec![join],
        SupervisorOptions {
            leader: Some(("127.0.0.1".into(), 1)),
            rendezvous_timeout: Duration::from_secs(600),
            ..quick()
        },
    );
    shard.drain();
    let s = until(&mut shard.status(), State::Stopped).await;
    assert_eq!(s.state, State::Stopped, "nothing to finish: {s:?}");
    assert!(s.pids.is_empty(), "nothing was started");
}
