//! `llmgw ctl nodes|models|replicas|…`: the admin API, as tables a person
//! reads at a glance or as JSON for scripts.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Subcommand;
use llmgw_api::admin as api;
use serde::de::DeserializeOwned;

use crate::Outcome;
use crate::output::{Table, json_line};

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// Every node: state, GPUs, replicas, heartbeat.
    Nodes,
    /// The catalog and how much of each model is serving.
    Models,
    /// Replicas and their shards.
    Replicas {
        /// Only this model's (a name or alias).
        #[arg(long)]
        model: Option<String>,
        /// Stopped replicas too.
        #[arg(long)]
        all: bool,
        /// Keep watching: print the table again (after a time line; with
        /// --json, one line) each time it changes, until interrupted.
        #[arg(long)]
        watch: bool,
        /// Seconds between looks with --watch.
        #[arg(long, default_value_t = 1.0, requires = "watch")]
        interval_s: f64,
    },
    /// Where a replica of MODEL would go now, and why every node would or
    /// would not take it.
    ExplainPlacement {
        /// A model's name or alias.
        model: String,
    },
    /// No new placement on NODE; nothing running is touched.
    Cordon {
        /// The node's id.
        node: String,
    },
    /// Let NODE take new placements again; on a draining node, this ends
    /// the drain (the replicas still there stay).
    Uncordon {
        /// The node's id.
        node: String,
    },
    /// Move everything off NODE, one replica at a time, each replacement
    /// serving before its original stops.
    Drain {
        /// The node's id.
        node: String,
    },
    /// Models serving, nodes ready, replicas (ready, starting, waiting for
    /// a place), the leader and the log.
    Status,
    /// Who holds the append lease.
    Leader,
    /// Cached weights no model names any more, per node; --collect asks
    /// the nodes to remove them (each agent deletes only its own cache's
    /// files).
    Weights {
        /// Ask the nodes to remove those files.
        #[arg(long)]
        collect: bool,
    },
    /// The tail of an engine's log on NODE (its shard id as --source);
    /// without --source, the logs NODE has.
    Logs {
        /// The node's id.
        node: String,
        /// A shard id, or `agent` for the agent's own log.
        #[arg(long)]
        source: Option<String>,
        /// How many of the last lines (at least 1; at most what the agent
        /// keeps).
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
        lines: u32,
        /// Keep printing new lines as they are written, until interrupted
        /// (needs --source).
        #[arg(long, short = 'f', requires = "source")]
        follow: bool,
        /// Seconds between looks with --follow.
        #[arg(long, default_value_t = 1.0, requires = "follow")]
        interval_s: f64,
    },
    /// Add or update a model from a YAML or JSON file.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Join a node with a token, or remove one.
    #[command(subcommand)]
    Node(NodeCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum NodeCommand {
    /// Print a single-use join token (on standard output alone; what to
    /// do with it goes to standard error). Needs the leader's tls.ca_key.
    Token {
        /// How long it may be used: `30m`, `1h`, `2d` (at most 7 days).
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// The node id it may join as (default: any id the node gives).
        #[arg(long)]
        node: Option<String>,
    },
    /// Remove NODE: its replicas are rebuilt elsewhere and its
    /// certificates are refused until it joins again with a new token (an
    /// agent without a certificate registers again while it runs: stop it
    /// first).
    Remove {
        /// The node's id.
        node: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ModelCommand {
    /// Add the model in FILE, or update it when it exists.
    Add {
        /// A model in YAML (or JSON, for a .json file), as in the catalog.
        file: PathBuf,
    },
    /// Remove a model; its replicas drain (answers in flight finish),
    /// then stop.
    Remove {
        /// The model's name.
        name: String,
    },
}

/// Talks to one admin listener.
pub(crate) struct Admin {
    base: String,
    http: reqwest::Client,
    /// Which server answered is said once, not at every look of a watch.
    told: std::sync::atomic::AtomicBool,
}

impl Admin {
    pub(crate) fn new(base: &str) -> anyhow::Result<Admin> {
        Ok(Admin {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .default_headers(crate::admin_client::token_headers()?)
                .build()?,
            told: Default::default(),
        })
    }

    /// Sends every request as `operator`'s one command, so that what it
    /// changes is recorded as theirs (as keys and users record theirs),
    /// not as the admin API's.
    fn by(base: &str, operator: &llmgw_decider::Origin) -> anyhow::Result<Admin> {
        let mut headers = crate::admin_client::token_headers()?;
        let actor = api::actor_to_header(operator.actor.name());
        headers.insert(api::ACTOR_HEADER, actor.parse()?);
        headers.insert(api::COMMAND_HEADER, operator.command_id.parse()?);
        Ok(Admin {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .default_headers(headers)
                .build()?,
            told: Default::default(),
        })
    }

    async fn answer<T: DeserializeOwned>(&self, r: reqwest::RequestBuilder) -> anyhow::Result<T> {
        let resp = r.send().await.with_context(|| {
            format!(
                "cannot reach the admin API at {}; is the server running (llmgw server --config …)? --admin sets the address",
                self.base
            )
        })?;
        let status = resp.status();
        if !self.told.load(std::sync::atomic::Ordering::Relaxed)
            && crate::admin_client::say_forwarded(resp.headers(), "answered by")
        {
            self.told.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let body = resp.bytes().await?;
        if !status.is_success() {
            let why = serde_json::from_slice::<api::ErrorBody>(&body)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
            if status == reqwest::StatusCode::NOT_FOUND && why.is_empty() {
                if !crate::admin_client::is_llmgw_admin(&self.http, &self.base).await {
                    bail!("{}", crate::admin_client::not_llmgw(&self.base));
                }
                bail!("{} has no control plane (router-only mode)", self.base);
            }
            if why.trim_start().starts_with('<') {
                bail!("{}", crate::admin_client::not_admin(&self.base, status));
            }
            bail!("{why}");
        }
        serde_json::from_slice(&body)
            .with_context(|| format!("{} answered something unexpected", self.base))
    }

    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.answer(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    async fn post<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.answer(self.http.post(format!("{}{path}", self.base)))
            .await
    }
}

pub(crate) fn q(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn yes(b: bool, word: &str) -> String {
    if b { word.to_owned() } else { String::new() }
}

pub(crate) async fn run(
    admin: &str,
    operator: Option<String>,
    json: bool,
    cmd: ClusterCommand,
) -> anyhow::Result<Outcome> {
    let a = Admin::by(admin, &llmgw_decider::Origin::operator_from_env(operator))?;
    let mut out = std::io::stdout().lock();
    match cmd {
        ClusterCommand::Nodes => {
            let rows: Vec<api::NodeRow> = a.get("/api/v1/nodes").await?;
            if json {
                json_line(&mut out, &rows)?;
            } else {
                let mut t = Table::new(vec![
                    "NODE",
                    "STATE",
                    "GPUS",
                    "FREE",
                    "CLASS",
                    "FABRICS",
                    "REPLICAS",
                    "HEARTBEAT",
                    "PROVISIONED",
                    "FLAGS",
                ]);
                // Why an engine is not ready, under the table: a reason
                // is a sentence, too long for a column.
                let mut notes = Vec::new();
                for n in rows {
                    // A card kept out says so here: FREE alone read as a
                    // node with fewer cards, and the agent logs nothing.
                    for p in &n.gpu_problems {
                        notes.push(format!("{}: {p} (kept out of placement)", n.id));
                    }
                    for p in n.provision.iter().filter(|p| p.state != "ready") {
                        notes.push(format!(
                            "{}: {} {} {}: {}",
                            n.id, p.engine, p.version, p.state, p.detail
                        ));
                    }
                    let provisioned = n
                        .provision
                        .iter()
                        .map(|p| format!("{} {} {}", p.engine, p.version, p.state))
                        .collect::<Vec<_>>()
                        .join(",");
                    let flags = [yes(n.cordoned, "cordoned"), yes(n.draining, "draining")]
                        .into_iter()
                        .filter(|f| !f.is_empty())
                        .collect::<Vec<_>>()
                        .join(",");
                    t.row(vec![
                        n.id,
                        n.state,
                        n.gpus.to_string(),
                        n.gpus_free.to_string(),
                        if n.classes.is_empty() {
                            "cpu".into()
                        } else {
                            n.classes
                        },
                        n.fabrics.join(","),
                        n.replicas.to_string(),
                        n.last_heartbeat_s
                            .map_or("-".into(), |s| format!("{s:.1}s ago")),
                        provisioned,
                        flags,
                    ]);
                }
                t.print(&mut out)?;
                for note in notes {
                    writeln!(out, "{note}")?;
                }
            }
        }
        ClusterCommand::Models => {
            let rows: Vec<api::ModelRow> = a.get("/api/v1/models").await?;
            if json {
                json_line(&mut out, &rows)?;
            } else {
                let mut t = Table::new(vec![
                    "MODEL", "READY", "REPLICAS", "MIN", "MAX", "PROFILES", "ALIASES",
                ]);
                let failures: Vec<String> = rows
                    .iter()
                    .flat_map(|m| {
                        let failure = (m.last_failure.as_ref())
                            .map(|f| format!("{}: last failure {f}", m.name));
                        let unplaced = m.unplaced.as_ref().map(|u| {
                            if u.contains(" fits nowhere (") {
                                format!(
                                    "{u}; `llmgw ctl explain-placement {}` shows each node's verdict",
                                    m.name
                                )
                            } else {
                                u.clone()
                            }
                        });
                        failure.into_iter().chain(unplaced)
                    })
                    .collect();
                for m in rows {
                    t.row(vec![
                        m.name,
                        m.ready.to_string(),
                        m.replicas.to_string(),
                        m.min.to_string(),
                        m.max.to_string(),
                        if m.profiles.is_empty() {
                            "(none: never started)".into()
                        } else {
                            m.profiles.join(",")
                        },
                        m.aliases.join(","),
                    ]);
                }
                t.print(&mut out)?;
                for f in failures {
                    writeln!(out, "{f}")?;
                }
            }
        }
        ClusterCommand::Replicas {
            model,
            all,
            watch,
            interval_s,
        } => {
            let mut path = format!("/api/v1/replicas?all={all}");
            if let Some(m) = model {
                path.push_str(&format!("&model={}", q(&m)));
            }
            if watch {
                drop(out);
                return watch_replicas(&a, &path, json, interval(interval_s)?).await;
            }
            let rows: Vec<api::ReplicaRow> = a.get(&path).await?;
            if json {
                json_line(&mut out, &rows)?;
            } else {
                replicas_table(rows).print(&mut out)?;
            }
        }
        ClusterCommand::ExplainPlacement { model } => {
            let e: api::Explanation = a
                .get(&format!("/api/v1/explain?model={}", q(&model)))
                .await?;
            if json {
                json_line(&mut out, &e)?;
            } else {
                writeln!(out, "{}", e.summary)?;
                for p in &e.profiles {
                    writeln!(
                        out,
                        "\nprofile {} (priority {}): {}",
                        p.profile, p.priority, p.outcome
                    )?;
                    let mut t = Table::new(vec!["  NODE", "FITS", "WHY"]);
                    for c in &p.candidates {
                        t.row(vec![
                            format!("  {}", c.node),
                            if c.fits { "yes".into() } else { "no".into() },
                            c.reason.clone(),
                        ]);
                    }
                    t.print(&mut out)?;
                }
            }
        }
        ClusterCommand::Cordon { node } => changed(
            &mut out,
            json,
            a.post(&format!("/api/v1/nodes/{}/cordon", q(&node)))
                .await?,
        )?,
        ClusterCommand::Uncordon { node } => changed(
            &mut out,
            json,
            a.post(&format!("/api/v1/nodes/{}/uncordon", q(&node)))
                .await?,
        )?,
        ClusterCommand::Drain { node } => changed(
            &mut out,
            json,
            a.post(&format!("/api/v1/nodes/{}/drain", q(&node))).await?,
        )?,
        ClusterCommand::Status => {
            let s: api::Status = a.get("/api/v1/status").await?;
            if json {
                json_line(&mut out, &s)?;
            } else {
                writeln!(
                    out,
                    "{} of {} models serving{}, on {}/{} nodes ready{}",
                    s.models_ready,
                    s.models,
                    quiet_models(&s),
                    s.nodes_ready,
                    s.nodes,
                    closed_nodes(&s)
                )?;
                writeln!(out, "replicas  {}", replica_summary(&s))?;
                let role = if s.leader.is_leader {
                    "leader"
                } else {
                    "standby"
                };
                if let Some(why) = &s.store_error {
                    // Answered from this server's memory: what it knows
                    // of the lease is its own.
                    writeln!(out, "this      {} ({role})", s.leader.instance)?;
                    writeln!(
                        out,
                        "store     cannot be read ({why}): the figures above are this server's views, at {}",
                        s.views_at
                    )?;
                } else {
                    writeln!(
                        out,
                        "this      {} ({role}); lease {} at epoch {}",
                        s.leader.instance,
                        s.leader
                            .holder
                            .as_deref()
                            .filter(|_| s.leader.held)
                            .unwrap_or("free"),
                        s.leader.epoch
                    )?;
                    writeln!(
                        out,
                        "log       head {}, views at {}",
                        s.log_head.map_or("unknown".into(), |h| h.to_string()),
                        s.views_at
                    )?;
                }
            }
            // Said, and failed: a script checking the status sees it.
            if s.store_error.is_some() {
                out.flush()?;
                return Ok(Outcome::Failed);
            }
        }
        ClusterCommand::Leader => {
            let l: api::Leader = a.get("/api/v1/leader").await?;
            if json {
                json_line(&mut out, &l)?;
            } else {
                let holder = l
                    .holder
                    .clone()
                    .filter(|_| l.held)
                    .unwrap_or_else(|| "nobody (the lease is free)".into());
                writeln!(out, "leader    {holder}")?;
                writeln!(out, "epoch     {}", l.epoch)?;
                if let Some(t) = &l.expires_at {
                    writeln!(out, "expires   {t}")?;
                }
                writeln!(
                    out,
                    "this      {} ({})",
                    l.instance,
                    if l.is_leader { "leader" } else { "standby" }
                )?;
            }
        }
        ClusterCommand::Weights { collect } => {
            type PerNode = std::collections::BTreeMap<String, Vec<String>>;
            let unwanted: PerNode = a.get("/api/v1/weights").await?;
            let listed: PerNode = if collect {
                a.post("/api/v1/weights/collect").await?
            } else {
                unwanted.clone()
            };
            // Only a connected node can be asked: the others keep theirs,
            // which is said, not passed over as nothing to collect.
            for (node, paths) in unwanted.iter().filter(|(n, _)| !listed.contains_key(*n)) {
                eprintln!(
                    "{node} is not connected: its {} unwanted file(s) stay until it is and this is run again",
                    paths.len()
                );
            }
            if json {
                json_line(&mut out, &listed)?;
            } else if listed.is_empty() {
                writeln!(
                    out,
                    "no unwanted cached weights{}",
                    if collect && !unwanted.is_empty() {
                        " on a connected node"
                    } else {
                        ""
                    }
                )?;
            } else {
                let mut t = Table::new(vec!["NODE", if collect { "REMOVING" } else { "UNWANTED" }]);
                for (node, paths) in listed {
                    for p in paths {
                        t.row(vec![node.clone(), p]);
                    }
                }
                t.print(&mut out)?;
            }
        }
        ClusterCommand::Logs {
            node,
            source,
            lines,
            follow,
            interval_s,
        } => {
            let source_q = source
                .as_ref()
                .map_or(String::new(), |s| format!("&source={}", q(s)));
            if follow {
                drop(out);
                // Every look asks for as much as an agent keeps, so that
                // what was written between looks is all there to print,
                // not only the last --lines of it; the first prints its
                // last --lines.
                let path = format!(
                    "/api/v1/logs?node={}&lines={FOLLOW_WINDOW}{source_q}",
                    q(&node)
                );
                let shown = usize::try_from(lines).unwrap_or(usize::MAX);
                return follow_logs(&a, &path, shown, json, interval(interval_s)?).await;
            }
            let path = format!("/api/v1/logs?node={}&lines={lines}{source_q}", q(&node));
            let l: api::Logs = a.get(&path).await?;
            if json {
                json_line(&mut out, &l)?;
            } else if source.is_none() {
                writeln!(
                    out,
                    "logs on {node}: {}",
                    if l.sources.is_empty() {
                        "none".into()
                    } else {
                        l.sources.join(", ")
                    }
                )?;
            } else {
                for line in &l.lines {
                    writeln!(out, "{line}")?;
                }
            }
        }
        ClusterCommand::Model(ModelCommand::Add { file }) => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let json_file = file.extension().is_some_and(|e| e == "json");
            let model: serde_json::Value = if json_file {
                serde_json::from_str(&text)
                    .with_context(|| format!("{} is not JSON", file.display()))?
            } else {
                serde_norway::from_str(&text)
                    .with_context(|| format!("{} is not YAML", file.display()))?
            };
            // Read as a model here first, so that a wrong value is placed
            // in the file (its line and column), not in the JSON this sends.
            if let Err(e) = read_model(&text, json_file) {
                bail!("{} is not a model: {e}", file.display());
            }
            let c: api::Changed = a
                .answer(
                    a.http
                        .post(format!("{}/api/v1/models", a.base))
                        .json(&model),
                )
                .await?;
            changed(&mut out, json, c)?;
        }
        ClusterCommand::Node(NodeCommand::Token { ttl, node }) => {
            let ttl = crate::config::duration("--ttl", &ttl)?;
            let most = std::time::Duration::from_millis(
                u64::try_from(llmgw_domain::join::MAX_TTL_MS).unwrap_or(u64::MAX),
            );
            if ttl.is_zero() || ttl > most {
                return Err(crate::config::ConfigError(
                    "--ttl must be above 0 and at most 7d: a token is for a node about to join"
                        .into(),
                )
                .into());
            }
            let t: api::JoinToken = a
                .answer(a.http.post(format!("{}/api/v1/join-tokens", a.base)).json(
                    &api::JoinTokenRequest {
                        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
                        node,
                    },
                ))
                .await?;
            if json {
                json_line(&mut out, &t)?;
            } else {
                writeln!(out, "{}", t.token)?;
                let server = t.agent_url.as_deref().unwrap_or("https://SERVER:7443");
                let node = t
                    .node
                    .as_ref()
                    .map_or(String::new(), |n| format!(" --node-id {n}"));
                eprintln!(
                    "join token {} for {}, single use, until {}; on the node (in the environment, not the arguments, which every local user can read):\n  LLMGW_AGENT_JOIN=TOKEN llmgw agent run --server {server}{node}\nwith a standby, give --server once for each server (this is the leader's): the agent follows whichever leads",
                    t.id,
                    t.node
                        .as_deref()
                        .map_or("any node id".to_owned(), |n| format!("node {n}")),
                    t.expires_at
                );
            }
        }
        ClusterCommand::Node(NodeCommand::Remove { node }) => changed(
            &mut out,
            json,
            a.post(&format!("/api/v1/nodes/{}/remove", q(&node)))
                .await?,
        )?,
        ClusterCommand::Model(ModelCommand::Remove { name }) => {
            let c: api::Changed = a
                .answer(
                    a.http
                        .delete(format!("{}/api/v1/models?name={}", a.base, q(&name))),
                )
                .await?;
            changed(&mut out, json, c)?;
        }
    }
    Ok(Outcome::Ok)
}

/// Ready, starting and waiting for a place, against what the catalog wants.
/// The replicas as a table.
fn replicas_table(rows: Vec<api::ReplicaRow>) -> Table {
    let mut t = Table::new(vec![
        "REPLICA", "MODEL", "PROFILE", "STATUS", "SHARDS", "NOTE",
    ]);
    for r in rows {
        let shards = r
            .shards
            .iter()
            .map(|s| {
                let gpus = if s.gpus.is_empty() {
                    String::new()
                } else {
                    format!(" gpu{:?}", s.gpus)
                };
                let fetch = s.fetch.map_or(String::new(), |f| {
                    let mb = |b: u64| b as f64 / 1e6;
                    if f.bytes_total > 0 {
                        format!(
                            " fetching {:.1}/{:.1} MB ({}%)",
                            mb(f.bytes_done),
                            mb(f.bytes_total),
                            f.bytes_done * 100 / f.bytes_total
                        )
                    } else {
                        format!(" fetching {:.1} MB", mb(f.bytes_done))
                    }
                });
                format!("{}@{}:{}{gpus} {}{fetch}", s.rank, s.node, s.port, s.state)
            })
            .collect::<Vec<_>>()
            .join("; ");
        let note = [
            yes(r.adopted, "adopted"),
            yes(
                r.outdated,
                "profile or context length edited: being replaced",
            ),
            // A shard's own error says most; else why the replica ended
            // (a lost node's replica was stopped with no word).
            r.shards
                .iter()
                .find_map(|s| s.error.clone())
                .or(r.ended.clone())
                .unwrap_or_default(),
        ]
        .into_iter()
        .filter(|f| !f.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
        t.row(vec![r.id, r.model, r.profile, r.status, shards, note]);
    }
    t
}

fn interval(s: f64) -> anyhow::Result<std::time::Duration> {
    if !(s.is_finite() && (0.05..=3600.0).contains(&s)) {
        return Err(crate::config::ConfigError(
            "--interval-s must be between 0.05 and 3600".into(),
        )
        .into());
    }
    Ok(std::time::Duration::from_secs_f64(s))
}

/// Prints the replicas each time they change, each table after a line
/// with the time; a failed look is said on stderr and the watch goes on
/// (a server restarting is something to watch, not the end of it), but
/// the first look's failure (no server there, no control plane) is the
/// answer.
async fn watch_replicas(
    a: &Admin,
    path: &str,
    json: bool,
    every: std::time::Duration,
) -> anyhow::Result<Outcome> {
    let mut last = String::new();
    let mut first = true;
    loop {
        let look = a.get::<Vec<api::ReplicaRow>>(path).await;
        if first && let Err(e) = look {
            return Err(e);
        }
        first = false;
        match look {
            Ok(rows) => {
                let text = if json {
                    let mut b = Vec::new();
                    json_line(&mut b, &rows)?;
                    String::from_utf8(b)?
                } else {
                    let mut b = Vec::new();
                    replicas_table(rows).print(&mut b)?;
                    format!(
                        "-- {}\n{}",
                        chrono::Utc::now().format("%H:%M:%S"),
                        String::from_utf8(b)?
                    )
                };
                // The time line changes every look; the table decides.
                let table = text.split_once('\n').map_or(text.as_str(), |(_, t)| t);
                let seen = last.split_once('\n').map_or(last.as_str(), |(_, t)| t);
                if json && text != last || !json && table != seen {
                    let mut out = std::io::stdout().lock();
                    out.write_all(text.as_bytes())?;
                    out.flush()?;
                    last = text;
                }
            }
            Err(e) => eprintln!("warning: {e:#}"),
        }
        tokio::time::sleep(every).await;
    }
}

/// The lines of `now` (a log's last lines) that `prev` (its last lines
/// a moment ago) did not have: after the longest end of `prev` that
/// `now` starts with. All of `now` when they share nothing (more was
/// written between looks than a look returns).
pub(crate) fn new_lines<'a>(prev: &[String], now: &'a [String]) -> &'a [String] {
    let most = prev.len().min(now.len());
    let shared = (0..=most)
        .rev()
        .find(|&k| prev[prev.len() - k..] == now[..k])
        .unwrap_or(0);
    &now[shared..]
}

/// What each look asks for: as many lines as an agent keeps of a log.
const FOLLOW_WINDOW: usize = 2000;

/// Prints a log's last `shown` lines, then the lines written since,
/// every look; with `json`, each as `{"line": …}` on a line of its own.
/// Each look is as much as the agent keeps (`path` asks for it), so two
/// looks overlap wherever fewer lines than that came between them; when a
/// full look shares no line with the one before, more was written than it
/// holds, and that is said where lines are missing.
async fn follow_logs(
    a: &Admin,
    path: &str,
    shown: usize,
    json: bool,
    every: std::time::Duration,
) -> anyhow::Result<Outcome> {
    let mut prev: Vec<String> = Vec::new();
    let mut first = true;
    loop {
        match a.get::<api::Logs>(path).await {
            Ok(l) => {
                let fresh = if first {
                    &l.lines[l.lines.len().saturating_sub(shown)..]
                } else {
                    new_lines(&prev, &l.lines)
                };
                let mut out = std::io::stdout().lock();
                if !prev.is_empty() && fresh.len() == l.lines.len() && fresh.len() >= FOLLOW_WINDOW
                {
                    eprintln!(
                        "warning: more than {FOLLOW_WINDOW} lines were written since the last look; the lines before these are not shown (a shorter --interval-s keeps up)"
                    );
                }
                for line in fresh {
                    if json {
                        json_line(&mut out, &serde_json::json!({ "line": line }))?;
                    } else {
                        writeln!(out, "{line}")?;
                    }
                }
                out.flush()?;
                prev = l.lines;
                first = false;
            }
            // The first look's failure (no such node or log) is the
            // answer; later ones may pass (a node reconnecting).
            Err(e) if first => return Err(e),
            Err(e) => eprintln!("warning: {e:#}"),
        }
        tokio::time::sleep(every).await;
    }
}

/// Models served only from nodes gone quiet, said beside the serving
/// count: the gateway still routes to them, and an operator who read
/// "0 of 1 models serving" alone took a model that answered for down.
fn quiet_models(s: &api::Status) -> String {
    match s.models_unreachable {
        0 => String::new(),
        n => format!(" ({n} more only on unreachable nodes, routed while their engines answer)"),
    }
}

/// The nodes that take no new work, said beside the ready count (a node
/// cordoned or draining is ready, yet nothing new goes there).
fn closed_nodes(s: &api::Status) -> String {
    let parts: Vec<String> = [
        (s.nodes_cordoned, "cordoned"),
        (s.nodes_draining, "draining"),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    match parts.is_empty() {
        true => String::new(),
        false => format!(" ({}: `llmgw ctl nodes`)", parts.join(", ")),
    }
}

fn replica_summary(s: &api::Status) -> String {
    let starting = s
        .replicas
        .saturating_sub(s.replicas_ready + s.replicas_unreachable);
    let waiting = s
        .replicas_waiting
        .unwrap_or_else(|| s.replicas_wanted.saturating_sub(s.replicas));
    let mut text = format!("{} ready", s.replicas_ready);
    // Not counted as serving (their nodes are silent), but the gateway
    // still routes to them while their engines answer: said so, or an
    // operator reads the model as down while it serves.
    if s.replicas_unreachable > 0 {
        text.push_str(&format!(
            ", {} on unreachable nodes (still routed while their engines answer)",
            s.replicas_unreachable
        ));
    }
    if starting > 0 {
        text.push_str(&format!(", {starting} starting"));
    }
    if waiting > 0 {
        text.push_str(&format!(", {waiting} waiting for a place"));
    }
    if s.replicas_backing_off > 0 {
        text.push_str(&format!(
            ", {} backing off after failures (`llmgw ctl models` says why)",
            s.replicas_backing_off
        ));
    }
    text.push_str(&format!(" ({} wanted)", s.replicas_wanted));
    text
}

fn changed(out: &mut impl Write, json: bool, c: api::Changed) -> anyhow::Result<()> {
    if json {
        json_line(out, &c)
    } else {
        writeln!(out, "{}", c.message)?;
        Ok(())
    }
}

/// Reads `text` as a model, for its error: with the first key met that a
/// model does not have, as the likelier mistake (`engin: sim` fails as
/// `engine` missing).
fn read_model(text: &str, json: bool) -> Result<(), String> {
    use llmgw_domain::catalog::Model;
    let mut unknown = Vec::new();
    let read = if json {
        let mut de = serde_json::Deserializer::from_str(text);
        serde_ignored::deserialize::<_, _, Model>(&mut de, |p| unknown.push(p.to_string()))
            .map(drop)
            .map_err(|e| e.to_string())
    } else {
        let de = serde_norway::Deserializer::from_str(text);
        serde_ignored::deserialize::<_, _, Model>(de, |p| unknown.push(p.to_string()))
            .map(drop)
            .map_err(|e| e.to_string())
    };
    read.map_err(|e| match unknown.first() {
        Some(k) => format!(
            "{e} (`{}` is a key llmgw does not know: misspelt?)",
            k.replace(".?", "")
        ),
        None => e,
    })
}

#[cfg(test)]
mod tests {
    use super::new_lines;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|l| (*l).to_owned()).collect()
    }

    #[test]
    fn a_followed_log_prints_each_line_once() {
        // Two lines written between looks of three.
        assert_eq!(
            new_lines(&v(&["a", "b", "c"]), &v(&["c", "d", "e"])),
            v(&["d", "e"])
        );
        // Nothing written: nothing printed.
        assert!(new_lines(&v(&["a", "b", "c"]), &v(&["a", "b", "c"])).is_empty());
        // A short log growing.
        assert_eq!(new_lines(&v(&["a"]), &v(&["a", "b"])), v(&["b"]));
        // Repeated lines are new when there are more of them.
        assert_eq!(new_lines(&v(&["x", "x"]), &v(&["x", "x", "x"])), v(&["x"]));
        // More written than a look returns: all of it.
        assert_eq!(new_lines(&v(&["a", "b"]), &v(&["y", "z"])), v(&["y", "z"]));
        assert_eq!(new_lines(&[], &v(&["a"])), v(&["a"]));
    }
}
