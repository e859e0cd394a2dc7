//! `llmgw up`: the one-command trial. A server on the embedded store, a
//! local agent in the same process, and a simulated model; it waits until
//! the model serves and prints a `curl` that works.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use llmgw_domain::catalog::{Engine, Model, Profile, Scaling};

use crate::Outcome;

#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// The OpenAI-compatible endpoint.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The admin API (llmgw ctl talks to it).
    #[arg(long, default_value = "127.0.0.1:9090")]
    admin_listen: SocketAddr,
    /// Where the event log (SQLite) is kept.
    #[arg(long, default_value = "llmgw-data")]
    data_dir: PathBuf,
    /// How long to wait for the model to serve, in seconds.
    #[arg(long, default_value_t = 60)]
    wait_s: u64,
}

const MODEL: &str = "demo";

fn demo_model() -> Model {
    let mut m = Model::named(MODEL);
    m.description = "a simulated model: llmgw's sim engine".into();
    m.scaling = Scaling {
        min: 1,
        max: 1,
        idle_timeout_s: None,
    };
    m.profiles = vec![Profile {
        startup_timeout_s: Some(60),
        ..Profile::cpu("sim", Engine::Sim)
    }];
    m
}

/// What `up` reads of the environment besides its flags: the admin token
/// (as `server` does) and how to write its log lines.
const HONOURED: [&str; 2] = ["LLMGW_ADMIN_TOKEN", "LLMGW_LOG_FORMAT"];

/// Refuses a variable that sets a server, an agent or the store: `up`
/// builds its own from its flags, and passed over such a setting (auth,
/// a listener, the store) with nothing said.
fn refuse_settings(env: &[(String, String)]) -> anyhow::Result<()> {
    let cli = <crate::Cli as clap::CommandFactory>::command();
    let mut settings = std::collections::HashSet::new();
    let mut every = crate::server::variables();
    for name in ["server", "agent"] {
        let Some(c) = cli.find_subcommand(name) else {
            continue;
        };
        let mut stack = vec![c];
        while let Some(c) = stack.pop() {
            settings.extend(
                (c.get_arguments())
                    .filter_map(|a| a.get_env())
                    .map(|e| e.to_string_lossy().into_owned()),
            );
            stack.extend(c.get_subcommands());
        }
    }
    settings.insert("LLMGW_STORE".to_owned());
    // The agent's older names, which it still reads.
    settings.extend(crate::agent_config::OLDER_NAMES.map(String::from));
    every.extend(settings.iter().cloned());
    for (name, _) in env {
        let Some(rest) = name.strip_prefix("LLMGW_") else {
            continue;
        };
        if HONOURED.contains(&name.as_str()) {
            continue;
        }
        if rest.contains("__") || settings.contains(name) {
            anyhow::bail!(
                "{name} is a setting of `llmgw server` or `llmgw agent`, which `llmgw up` does not read: it takes only its flags (--listen, --admin-listen, --data-dir, --wait-s) and LLMGW_ADMIN_TOKEN; unset it, or run `llmgw server` for a server configured your way"
            );
        }
    }
    crate::config::misspelt_variables(env, &every).map_err(|e| anyhow::anyhow!(e.0))
}

pub(crate) async fn run(a: UpArgs) -> anyhow::Result<Outcome> {
    // Only names and values that are text: a variable that is not (of
    // another program) is none of llmgw's, and `vars()` would panic on it.
    let env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    refuse_settings(&env)?;
    // The admin API has no authentication; `server` takes it off
    // loopback only with admin_open, which a try-out has no need of.
    if !a.admin_listen.ip().is_loopback() {
        anyhow::bail!(
            "--admin-listen {} is off loopback: the admin API has no authentication; `up` keeps it on loopback (`llmgw server` with admin_open can open it)",
            a.admin_listen
        );
    }
    // Listening from the start: a Ctrl-C while the model comes up stops
    // everything too (an agent left behind would keep its engine running).
    let mut signal = std::pin::pin!(crate::sim::shutdown());
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("cannot create {}", a.data_dir.display()))?;
    let data = a.data_dir.canonicalize()?;
    // Two `up`s on one directory share its log and its agent's engines:
    // the second would stand by, adopt the first one's engine and stop it
    // on its way out.
    let _one = lock(&data)?;
    let store = format!("sqlite://{}", data.join("llmgw.db").display());
    let control = llmgw_control::ControlConfig {
        instance: "up".into(),
        interval: Duration::from_secs(2),
        lease_ttl: Duration::from_secs(5),
        lease_poll: Duration::from_millis(200),
        models: vec![demo_model()],
        ..llmgw_control::ControlConfig::default()
    };
    let listen = crate::serve::Listen {
        client: a.listen,
        client_tls: None,
        admin: a.admin_listen,
        // Honoured as by `llmgw server` (ignored, it left the admin API
        // open while ctl sent a token it was never asked for).
        admin_token: crate::admin_client::admin_token()?.map(llmgw_control::AdminSecret),
        metrics: None,
        agent: ([127, 0, 0, 1], 0).into(),
        agent_tls: None,
        connections: llmgw_gateway::ConnectionLimits::default(),
        caps_set: Vec::new(),
    };
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = {
        let store = store.clone();
        tokio::spawn(async move {
            crate::serve::run(
                crate::serve::up_plan(store, listen, control),
                move |b| {
                    let _ = bound_tx.send(b);
                },
                stop_rx,
            )
            .await
        })
    };
    let bound = tokio::select! {
        bound = bound_rx => bound,
        // Before the server listens, only it has started: stopping it is
        // stopping everything.
        _ = &mut signal => {
            let _ = stop_tx.send(true);
            let _ = server.await;
            return Ok(Outcome::Ok);
        }
    };
    let bound = match bound {
        Ok(b) => b,
        Err(_) => {
            return match server.await? {
                Err(e) => Err(e),
                Ok(_) => anyhow::bail!("the server stopped before it listened"),
            };
        }
    };
    let mut agent_config = llmgw_agent::session::SessionConfig::new(
        vec![format!(
            "http://{}",
            bound
                .agent
                .ok_or_else(|| anyhow::anyhow!("the server has no agent listener"))?
        )],
        "local".into(),
    );
    agent_config.heartbeat = Duration::from_secs(2);
    agent_config.discovery.skip_gpus = true;
    agent_config.stop_engines_on_exit = true;
    // Everything of `up` stays on this machine: the engine too.
    agent_config.engine_bind = Some("127.0.0.1".into());
    agent_config.work_dir = Some(data.join("agent"));
    agent_config.cache_dir = Some(data.join("weights"));
    let (agent_stop_tx, agent_stop_rx) = tokio::sync::watch::channel(false);
    let agent = tokio::spawn(
        llmgw_agent::session::Agent::new(
            agent_config,
            crate::agent::engines(&crate::agent::EngineArgs::default()),
        )
        .run(agent_stop_rx),
    );

    let base = format!("http://{}", bound.client);
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(a.wait_s);
    // Answered, not only routed: after a restart the log still routes to
    // the engine the last run stopped until this run's agent says so.
    let ready = async {
        let ask = serde_json::json!({
            "model": MODEL,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "ready?"}],
        });
        loop {
            let asked = http
                .post(format!("{base}/v1/chat/completions"))
                .json(&ask)
                .send()
                .await;
            if asked.is_ok_and(|r| r.status().is_success()) {
                return true;
            }
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let ready = tokio::select! {
        ready = ready => ready,
        _ = &mut signal => {
            stop(stop_tx, server, agent_stop_tx, agent).await;
            return Ok(Outcome::Ok);
        }
    };
    // A closed stdout (`llmgw up | head`) must not end `up` here, past the
    // agent's start: it would leave the engine running.
    let _ = (|| -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        if ready {
            writeln!(out, "llmgw is up: model {MODEL} is serving.")?;
        } else {
            writeln!(
                out,
                "llmgw is running, but {MODEL} is not serving yet; see `llmgw ctl replicas --admin http://{}`",
                bound.admin
            )?;
        }
        writeln!(out, "  endpoint  {base}/v1")?;
        writeln!(
            out,
            "  admin     http://{}   (llmgw ctl status --admin http://{})",
            bound.admin, bound.admin
        )?;
        writeln!(out, "  data      {}", data.display())?;
        // The log is in the data directory, not where `llmgw events`
        // looks by default (./llmgw.db), which said there was none.
        writeln!(out, "  log       llmgw events stats --store {store}")?;
        writeln!(out, "try:")?;
        writeln!(
            out,
            "  curl {base}/v1/chat/completions -H 'content-type: application/json' -d '{{\"model\":\"{MODEL}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}]}}'"
        )?;
        writeln!(out, "Ctrl-C stops everything.")?;
        out.flush()
    })();
    let mut server = server;
    tokio::select! {
        _ = &mut signal => {}
        r = &mut server => {
            let _ = agent_stop_tx.send(true);
            let _ = agent.await;
            r??;
            return Ok(Outcome::Ok);
        }
    }
    stop(stop_tx, server, agent_stop_tx, agent).await;
    Ok(Outcome::Ok)
}

/// After a signal. The server has seen it too: it refuses new connections
/// and lets requests in flight finish (up to its grace period); only then
/// does the agent stop the engine that serves them.
async fn stop<S, A>(
    stop_tx: tokio::sync::watch::Sender<bool>,
    server: tokio::task::JoinHandle<S>,
    agent_stop_tx: tokio::sync::watch::Sender<bool>,
    agent: tokio::task::JoinHandle<A>,
) {
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(
        crate::serve::DEFAULT_SHUTDOWN_GRACE + Duration::from_secs(10),
        server,
    )
    .await;
    let _ = agent_stop_tx.send(true);
    // Longer than the agent gives its engine to stop (30 s) before it kills it.
    let _ = tokio::time::timeout(Duration::from_secs(40), agent).await;
}

/// Held while `up` runs: refused when another `up` holds `data`.
fn lock(data: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::os::fd::AsFd;
    let path = data.join("up.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    rustix::fs::flock(
        file.as_fd(),
        rustix::fs::FlockOperation::NonBlockingLockExclusive,
    )
    .map_err(|_| {
        anyhow::anyhow!(
            "another llmgw up is running on {}: stop it first, or give this one another --data-dir",
            data.display()
        )
    })?;
    Ok(file)
}
