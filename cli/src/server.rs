use std::net::SocketAddr;
use std::path::PathBuf;

use crate::Outcome;
use crate::config::{self, ConfigError, FileConfig};
use clap::Args;
use llmgw_gateway::EndpointSpec;

/// Every setting is a flag, an `LLMGW_…` variable and a key of the
/// configuration file alike; a flag or variable wins over the file.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct ServerArgs {
    #[command(subcommand)]
    command: Option<ServerCommand>,
    /// Check the configuration (the file, the variables, the flags and
    /// every file they name) and exit: 0 when a start would get as far as
    /// binding, 2 with the reason otherwise. Nothing binds, nothing is
    /// written.
    #[arg(long)]
    check: bool,
    /// A YAML file (TOML if it ends in .toml) with any of the settings
    /// below (keys as the flags, with `_` for `-`), plus `store`,
    /// `control:` and the `models:` catalog; `LLMGW_A__B` sets `a.b`.
    #[arg(long, env = "LLMGW_CONFIG")]
    config: Option<PathBuf>,
    /// The agent listener, with the control plane (default :7443 with
    /// `tls:`, 127.0.0.1:7443 without).
    #[arg(long, env = "LLMGW_AGENT_LISTEN", value_parser = listen_addr)]
    agent_listen: Option<SocketAddr>,
    /// Let agents on other machines dial a plaintext agent listener (no
    /// `tls:`): for a network you trust, since anything that reaches it can
    /// register as a node. Without it, a listener without `tls:` stays on
    /// loopback.
    #[arg(long, env = "LLMGW_AGENT_PLAINTEXT", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    agent_plaintext: Option<bool>,
    /// A static endpoint, `id=URL=model[,model…][;engine=E][;weight=N][;priority=N]`;
    /// repeat for several. A hosted service's API key: `;key_env=VAR` or
    /// `;key_file=PATH` (never the key itself).
    #[arg(long = "endpoint", env = "LLMGW_ENDPOINTS", value_delimiter = ' ')]
    endpoints: Vec<EndpointSpec>,
    /// The client (OpenAI API) listener; `:8080` (the default) means every interface.
    #[arg(long, env = "LLMGW_LISTEN", value_parser = listen_addr)]
    listen: Option<SocketAddr>,
    /// The admin listener (default 127.0.0.1:9090): keep it on loopback.
    #[arg(long, env = "LLMGW_ADMIN_LISTEN", value_parser = listen_addr)]
    admin_listen: Option<SocketAddr>,
    /// Let the admin listener be off loopback, where a firewall keeps it
    /// to the servers and the operators: it has no authentication, so
    /// whoever reaches it is an operator. Without it, an admin address
    /// off loopback is refused.
    #[arg(long, env = "LLMGW_ADMIN_OPEN", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    admin_open: Option<bool>,
    /// The token every admin request but /health must carry (Bearer, or a
    /// browser's Basic password): `@FILE` holding it keeps it off the
    /// command line. With it the admin listener may be off loopback.
    #[arg(
        long,
        env = "LLMGW_ADMIN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN|@FILE"
    )]
    admin_token: Option<String>,
    /// A metrics-only listener, off unless given.
    #[arg(long, env = "LLMGW_METRICS_LISTEN", value_parser = listen_addr)]
    metrics_listen: Option<SocketAddr>,
    /// Models to try when a model has no capacity: `model=fallback[,fallback…]`.
    #[arg(long = "fallback", env = "LLMGW_FALLBACKS", value_delimiter = ' ', value_parser = fallback)]
    fallbacks: Vec<(String, Vec<String>)>,
    /// Require API keys, looked up (by hash) in the tenancy view of the
    /// event log at --store; a key decides the band and the models.
    /// `--auth false` (or LLMGW_AUTH=false) turns off what the file turns on.
    #[arg(long, env = "LLMGW_AUTH", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    auth: Option<bool>,
    /// Append a usage record per request to the event log at --store
    /// (batched, off the request path; a full queue drops and counts).
    /// `false` turns off what the file turns on; refused with keys on
    /// (they always record).
    #[arg(long, env = "LLMGW_RECORD_USAGE", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    record_usage: Option<bool>,
    /// On SIGTERM or SIGINT, how long requests and streams in flight get
    /// to finish before they are cut (default 30s); new connections are
    /// refused at once.
    #[arg(long, env = "LLMGW_SHUTDOWN_GRACE", value_name = "DURATION")]
    shutdown_grace: Option<String>,
}

impl ServerArgs {
    /// Whether this runs the server (rather than `init` or `--check`, which
    /// are one-shot and log like the other commands).
    pub(crate) fn serves(&self) -> bool {
        self.command.is_none() && !self.check
    }
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum ServerCommand {
    /// Make this machine ready for llmgw-server.service: directories, a
    /// certificate authority, a server certificate, server.yaml,
    /// server.env, the default project and an admin (whose password is
    /// printed once). Each step is skipped when already done.
    Init(crate::init::InitArgs),
}

/// `--store` as given: its address (the default when not given) and
/// whether the command line or LLMGW_STORE named it.
#[derive(Debug, Clone)]
pub(crate) struct StoreArg {
    pub address: String,
    pub named: bool,
}

/// Every variable some llmgw command reads (its flags' `env`).
pub(crate) fn variables() -> std::collections::HashSet<String> {
    fn walk(c: &clap::Command, out: &mut std::collections::HashSet<String>) {
        for a in c.get_arguments() {
            if let Some(e) = a.get_env() {
                out.insert(e.to_string_lossy().into_owned());
            }
        }
        for s in c.get_subcommands() {
            walk(s, out);
        }
    }
    let mut out = std::collections::HashSet::new();
    walk(&<crate::Cli as clap::CommandFactory>::command(), &mut out);
    out
}

fn settings(a: ServerArgs, store: &StoreArg) -> Result<crate::serve::Plan, ConfigError> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    config::stray_variables(&env, &variables())?;
    let file = config::load(a.config.as_deref(), &env)?;
    let addr = |key: &str, v: Option<String>| -> Result<Option<SocketAddr>, ConfigError> {
        v.map(|s| listen_addr(&s).map_err(|e| ConfigError(format!("{key}: {e}"))))
            .transpose()
    };
    let control = control_config(&file)?;
    let agent_tls = file
        .tls
        .as_ref()
        .map(config::TlsSection::read)
        .transpose()?;
    let client_tls = file.client_tls.as_ref().map(client_tls).transpose()?;
    // The file's list is read even when the flag's replaces it, so that a
    // bad entry is refused whichever source wins today.
    let from_file: Vec<EndpointSpec> = file
        .endpoints
        .iter()
        .map(|e| {
            e.parse::<EndpointSpec>()
                .map_err(|why| ConfigError(format!("endpoints: {why}")))
        })
        .collect::<Result<_, _>>()?;
    let endpoints = if a.endpoints.is_empty() {
        from_file
    } else {
        a.endpoints
    };
    // An id names one endpoint in metrics, logs and breakers: two of one
    // name would be told apart nowhere.
    let mut ids = std::collections::BTreeSet::new();
    if let Some(twice) = endpoints.iter().find(|e| !ids.insert(e.id.as_str())) {
        return Err(ConfigError(format!(
            "endpoints: the id {} is given twice; give each endpoint its own",
            twice.id
        )));
    }
    let agent_listen = a
        .agent_listen
        .or(addr("agent_listen", file.agent_listen.clone())?);
    let agent_plaintext = a.agent_plaintext.or(file.agent_plaintext);
    // A setting this mode cannot honour stops the start: it is never
    // silently dropped.
    if control.is_none() {
        if endpoints.is_empty() {
            return Err(ConfigError(
                "nothing to serve: give at least one endpoint (--endpoint id=URL=model, or endpoints in --config), or a models: catalog for the control plane".into(),
            ));
        }
        let control_set = file.control.first_set();
        let needs_control = [
            (agent_listen.is_some(), "agent_listen"),
            // `false`, the default, asks nothing (a shared env file may say it).
            (agent_plaintext == Some(true), "agent_plaintext"),
            (agent_tls.is_some(), "tls"),
            (control_set.is_some(), control_set.unwrap_or("control")),
            // Only agents fetch from it, and only the control plane has agents.
            (file.mirror.is_some(), "mirror"),
            // Only the leader tells agents what to install.
            (file.engines.is_set(), "engines"),
            // Only the control plane starts models on demand.
            (
                file.router.on_demand_wait.is_some(),
                "router.on_demand_wait",
            ),
            (
                file.connections
                    .max
                    .as_ref()
                    .is_some_and(|m| m.agent.is_some()),
                "connections.max.agent",
            ),
        ];
        if let Some((_, what)) = needs_control.iter().find(|(set, _)| *set) {
            return Err(ConfigError(format!(
                "{what} needs the control plane, which is off: add a models: catalog or control.enabled: true, or remove {what}"
            )));
        }
    }
    // A flag or its variable wins over the file, both ways.
    let auth = a.auth.unwrap_or(file.auth.enabled);
    // Budgets are spent by usage records: with keys on, usage is recorded,
    // and a flag or variable that says not to is refused.
    // Whichever says so (the flag or its variable win over the file).
    let asked = match (a.record_usage, file.record_usage) {
        (Some(v), _) => Some((v, "--record-usage false (or LLMGW_RECORD_USAGE=false)")),
        (None, Some(v)) => Some((v, "record_usage: false")),
        (None, None) => None,
    };
    if let (true, Some((false, said))) = (auth, asked) {
        return Err(ConfigError(format!(
            "{said} with keys on: usage is always recorded then, since budgets are spent from it; leave it out"
        )));
    }
    let record_usage = auth || asked.is_some_and(|(v, _)| v);
    let usage = crate::serve::UsageSettings {
        flush: match &file.auth.flush_interval {
            Some(v) => config::duration("auth.flush_interval", v)?,
            None => std::time::Duration::from_secs(60),
        },
        batch: file.auth.batch_size.unwrap_or(500),
        buffer: file.auth.buffer_size.unwrap_or(8192),
    };
    if !record_usage {
        let set = [
            (file.auth.flush_interval.is_some(), "auth.flush_interval"),
            (file.auth.batch_size.is_some(), "auth.batch_size"),
            (file.auth.buffer_size.is_some(), "auth.buffer_size"),
            (file.auth.default_price.is_some(), "auth.default_price"),
        ];
        if let Some((_, what)) = set.iter().find(|(s, _)| *s) {
            // The flag turned off what the file turned on: the file's
            // usage settings would be ignored, so it says both ways out.
            let how = if a.auth == Some(false) && file.auth.enabled {
                "--auth false (or LLMGW_AUTH=false) turned keys off, and usage with them: add --record-usage true to keep recording it, or leave the setting out of the file"
            } else {
                "set auth.enabled or record_usage"
            };
            return Err(ConfigError(format!(
                "{what} applies only when usage is recorded: {how}"
            )));
        }
    }
    for (n, key) in [
        (usage.batch, "auth.batch_size"),
        (usage.buffer, "auth.buffer_size"),
    ] {
        if n == 0 {
            return Err(ConfigError(format!("{key} must be at least 1")));
        }
    }
    if usage.batch > llmgw_domain::usage::MAX_BATCH_ROWS {
        return Err(ConfigError(format!(
            "auth.batch_size is at most {}: a batch is one event in the log",
            llmgw_domain::usage::MAX_BATCH_ROWS
        )));
    }
    if usage.flush.is_zero() {
        return Err(ConfigError("auth.flush_interval must be above 0".into()));
    }
    if auth && file.admission.default_band.is_some() {
        return Err(ConfigError(
            "admission.default_band applies only with auth off: with keys, the key decides the band".into(),
        ));
    }
    let mut web = web_plan(&file, auth)?;
    web.settings.router_only = control.is_none();
    web.settings.usage_flush = record_usage.then_some(usage.flush);
    if let Some(c) = &control {
        web.settings.place.port_range = c.port_range;
    }
    let mut gateway = crate::gateway_settings::gateway_config(&file.router, &file.admission)?;
    let connections = crate::gateway_settings::connection_limits(&file.connections)?;
    // Only prefix routing reads what an engine's KV-cache events say.
    if !gateway.affinity.enabled
        && let Some(e) = endpoints.iter().find(|e| e.kv_events.is_some())
    {
        return Err(ConfigError(format!(
            "endpoint {}: kv_events applies only with prefix routing on (router.prefix.enabled)",
            e.id
        )));
    }
    gateway.endpoints = endpoints;
    // The file's lists obey the flag's rule: a model, and others to try.
    for (model, list) in &file.fallbacks {
        if model.trim().is_empty()
            || list.is_empty()
            || list.iter().any(|f| f.trim().is_empty() || f == model)
        {
            return Err(ConfigError(format!(
                "fallbacks: {model:?}: name a model and at least one other model to fall back to"
            )));
        }
    }
    gateway.fallbacks = file.fallbacks.clone();
    gateway.fallbacks.extend(a.fallbacks);
    // Router-only, the endpoints are every model there is: a fallback to
    // another name (a typo) would be passed over at every request. With a
    // control plane the catalog can grow at run time (ctl model add).
    if control.is_none() {
        let served: std::collections::BTreeSet<&str> = (gateway.endpoints.iter())
            .flat_map(|e| e.models.iter().map(String::as_str))
            .collect();
        for (model, list) in &gateway.fallbacks {
            // A model no endpoint serves is never asked for here: its
            // list would never be read (a typo in the name, say).
            if !served.contains(model.as_str()) {
                return Err(ConfigError(format!(
                    "fallbacks: {model:?} is served by no endpoint, so its fallbacks would never be tried: name a model an endpoint serves"
                )));
            }
            if let Some(f) = list.iter().find(|f| !served.contains(f.as_str())) {
                return Err(ConfigError(format!(
                    "fallbacks: {model:?} falls back to {f:?}, which no endpoint serves"
                )));
            }
        }
    }
    // With a control plane the catalog can grow at run time, so a fallback
    // to a name nothing knows yet is taken, but said: it is most often a
    // typo, passed over at every request.
    if control.is_some() {
        let known = |name: &str| {
            file.models
                .iter()
                .any(|m| m.name == name || m.aliases.iter().any(|a| a == name))
                || gateway
                    .endpoints
                    .iter()
                    .any(|e| e.models.iter().any(|m| m == name))
        };
        for (model, list) in &gateway.fallbacks {
            for name in std::iter::once(model).chain(list).filter(|n| !known(n)) {
                tracing::warn!(
                    fallbacks = %model,
                    "fallbacks name {name:?}, which is no model of the file's catalog and no endpoint's: skipped until a model of that name is added (`llmgw ctl model add`)"
                );
            }
        }
    }
    // An alias is a name for a catalog model; one that is also the name an
    // endpoint here serves means two things (the endpoint wins, so the
    // alias would be dead): refused while both are in one file.
    for m in &file.models {
        if let Some((alias, e)) = m.aliases.iter().find_map(|a| {
            (gateway.endpoints.iter())
                .find(|e| e.models.contains(a))
                .map(|e| (a, e))
        }) {
            return Err(ConfigError(format!(
                "models: {}'s alias {alias:?} is the model endpoint {} serves: requests for it would go to the endpoint; give the alias another name",
                m.name, e.id
            )));
        }
    }
    // A catalog model without profiles is started on no node (`ctl plan`
    // sizes one from its source, to suggest profiles): said, as every
    // request for it is told "no capacity right now" until it has one.
    if control.is_some() {
        for m in file.models.iter().filter(|m| {
            m.profiles.is_empty() && !gateway.endpoints.iter().any(|e| e.models.contains(&m.name))
        }) {
            tracing::warn!(model = %m.name, "a model with no profiles and no endpoint: nothing serves it until it has one (`llmgw ctl plan {}` suggests profiles)", m.name);
        }
    }
    gateway.default_price = file.auth.default_price.unwrap_or_default();
    // The flag or the variable wins over the file, the file over the
    // default. A named store is opened in every mode; the default only by
    // a mode that needs a log, so a plain router leaves no file behind.
    let (store_named, store) = match (&file.store, store.named) {
        (Some(from_file), false) => (true, from_file.clone()),
        (_, named) => (named, store.address.clone()),
    };
    // `server init` keeps a database's address (it may hold a password)
    // in server.env beside server.yaml, which the unit reads: a start by
    // hand without it would make a new, empty ./llmgw.db and lead that.
    // (Not under --check, which writes nothing and which the deploy
    // guides run by hand, and not for a plain router, which opens none.)
    if !store_named
        && !a.check
        && (control.is_some() || auth)
        && let Some(env) = store_in_server_env(a.config.as_deref())
    {
        return Err(ConfigError(format!(
            "no store is named, but {} names one (LLMGW_STORE), which the service reads: run as the unit does, `sudo sh -c 'set -a; . {}; llmgw server --config …'`, or give --store",
            env.display(),
            env.display()
        )));
    }
    // Read now, so that --check and the start refuse a bad address alike
    // (exit 2), not the first open at run.
    let address = llmgw_eventstore::StoreAddress::parse(&store)
        .map_err(|e| ConfigError(format!("store: {e}")))?;
    // SQLite makes the file, not its directory: said now, not as "unable
    // to open database file" once everything else has started.
    if let llmgw_eventstore::StoreAddress::Sqlite(path) = &address
        && let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        return Err(ConfigError(format!(
            "store: {} is not a directory (SQLite makes the file, not its directory)",
            dir.display()
        )));
    }
    // What lies at the path must be a SQLite file if anything is: said
    // now (and by --check), not as "file is not a database" at the start.
    if let llmgw_eventstore::StoreAddress::Sqlite(path) = &address {
        not_sqlite(path).map_err(|why| ConfigError(format!("store: {why}")))?;
    }
    let shutdown_grace = match a.shutdown_grace.as_ref().or(file.shutdown_grace.as_ref()) {
        Some(v) => config::duration("shutdown_grace", v)?,
        None => crate::serve::DEFAULT_SHUTDOWN_GRACE,
    };
    // A stop waits this long for streams; beyond an hour it is a typo (a
    // unit or a pod is killed long before, losing the usage it holds).
    if shutdown_grace > std::time::Duration::from_secs(3600) {
        return Err(ConfigError(format!(
            "shutdown_grace: {} s is more than an hour: a stop would wait that long for streams, and a service manager kills it first (the shipped unit's TimeoutStopSec is 60 s)",
            shutdown_grace.as_secs()
        )));
    }
    // Without the control plane nothing listens for agents (and a setting
    // for it was refused above).
    let agent = match control {
        Some(_) => agent_addr(agent_listen, agent_tls.is_some(), agent_plaintext)?,
        None => ([127, 0, 0, 1], 7443).into(),
    };
    let metrics = a
        .metrics_listen
        .or(addr("metrics_listen", file.metrics_listen)?);
    if metrics.is_none()
        && file
            .connections
            .max
            .as_ref()
            .is_some_and(|m| m.metrics.is_some())
    {
        return Err(ConfigError(
            "connections.max.metrics applies only with a metrics listener: set metrics_listen or remove it".into(),
        ));
    }
    let client = a
        .listen
        .or(addr("listen", file.listen)?)
        .unwrap_or_else(|| ([0, 0, 0, 0], 8080).into());
    let admin = a
        .admin_listen
        .or(addr("admin_listen", file.admin_listen)?)
        .unwrap_or_else(|| ([127, 0, 0, 1], 9090).into());
    let admin_token = match a.admin_token.as_ref().or(file.admin_token.as_ref()) {
        Some(t) => Some(llmgw_control::AdminSecret(crate::config::secret_value(
            "admin_token",
            t,
        )?)),
        None => None,
    };
    admin_reach(
        admin,
        a.admin_open.or(file.admin_open),
        admin_token.is_some(),
    )?;
    distinct_listeners(&[
        ("listen", Some(client)),
        ("admin_listen", Some(admin)),
        ("metrics_listen", metrics),
        ("agent_listen", control.is_some().then_some(agent)),
    ])?;
    Ok(crate::serve::Plan {
        store,
        store_named,
        listen: crate::serve::Listen {
            client,
            client_tls,
            admin,
            admin_token,
            metrics,
            agent,
            agent_tls,
            connections,
            caps_set: crate::gateway_settings::caps_set(&file.connections),
        },
        gateway,
        control,
        auth,
        usage: record_usage.then_some(usage),
        web,
        shutdown_grace,
        convo: crate::convo_settings::convo_plan(&file.conversations, file.threads.as_ref(), auth)?,
    })
}

/// Two listeners on one port (the same address, or one of them on every
/// interface) cannot both bind: said by name now, where the start said
/// only "Address already in use". Port 0 (any free port) never clashes.
fn distinct_listeners(all: &[(&str, Option<SocketAddr>)]) -> Result<(), ConfigError> {
    let given: Vec<(&str, SocketAddr)> = all
        .iter()
        .filter_map(|(name, a)| a.map(|a| (*name, a)))
        .filter(|(_, a)| a.port() != 0)
        .collect();
    for (i, (first, a)) in given.iter().enumerate() {
        for (second, b) in &given[i + 1..] {
            let overlap = a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified();
            if a.port() == b.port() && overlap {
                return Err(ConfigError(format!(
                    "{first} {a} and {second} {b} take the same port; give each listener its own"
                )));
            }
        }
    }
    Ok(())
}

/// Why `path` cannot be the log's SQLite file, if it cannot: a directory,
/// or a file that is neither empty nor a SQLite database. Nothing there
/// is fine (the server makes it).
fn not_sqlite(path: &std::path::Path) -> Result<(), String> {
    use std::io::Read;
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    if meta.is_dir() {
        return Err(format!(
            "{} is a directory, not a SQLite file",
            path.display()
        ));
    }
    let mut head = [0u8; 16];
    let read = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if read == 0 || head == *b"SQLite format 3\0" {
        return Ok(());
    }
    Err(format!(
        "{} is not a SQLite database (another program's file?)",
        path.display()
    ))
}

/// Without `admin_token` the admin API has no authentication: whoever
/// reaches it issues keys, adds people and changes the catalog. Off
/// loopback (`:9090` included, every interface) it is refused unless
/// `admin_open` says a firewall keeps it to the servers and the operators,
/// or a token guards it; a warning only was logged, and a copied
/// `admin_listen: ":9090"` opened it to the network.
fn admin_reach(admin: SocketAddr, open: Option<bool>, token: bool) -> Result<(), ConfigError> {
    match (admin.ip().is_loopback(), open == Some(true), token) {
        (false, false, false) => Err(ConfigError(format!(
            "admin_listen {admin} is off loopback: without admin_token the admin API has no authentication, so anything that reaches it could issue keys, add people and change the catalog. Listen on loopback, set admin_token (every request then carries it), or set admin_open: true (--admin-open) where a firewall keeps it to the servers and your operators (a second server's standby needs to reach it: docs/install.md)"
        ))),
        (true, true, _) => Err(ConfigError(format!(
            "admin_open applies only with admin_listen off loopback ({admin} is on it): remove it"
        ))),
        (false, _, true) => {
            tracing::warn!(addr = %admin, "admin listener off loopback, guarded by admin_token: it is plain HTTP, so the token crosses the network in clear; keep the listener on a network you trust");
            Ok(())
        }
        (false, true, false) => {
            tracing::warn!(addr = %admin, "admin listener off loopback (admin_open): it has no authentication; keep it firewalled to the servers and operators");
            Ok(())
        }
        (true, false, _) => Ok(()),
    }
}

/// Where agents dial in. Without `tls:` nothing identifies an agent: any
/// host that reaches the listener can register as a node (or as one that
/// exists) and be sent placements and prompts. So without it the listener
/// stays on loopback, its default included, unless `agent_plaintext` says
/// the network is trusted; an address off loopback is refused rather than
/// narrowed, so that what the operator wrote is never quietly changed.
fn agent_addr(
    given: Option<SocketAddr>,
    tls: bool,
    plaintext: Option<bool>,
) -> Result<SocketAddr, ConfigError> {
    let every_interface = || SocketAddr::from(([0, 0, 0, 0], 7443));
    match (tls, plaintext) {
        (true, Some(true)) => Err(ConfigError(
            "agent_plaintext with tls: the agent listener is mutual TLS; remove one".into(),
        )),
        (true, _) | (false, Some(true)) => Ok(given.unwrap_or_else(every_interface)),
        (false, _) => match given {
            None => {
                // The default was every interface before: said, so that a
                // fleet whose agents dial in from elsewhere learns why.
                tracing::warn!(
                    "agent listener: 127.0.0.1:7443, this host's agents only, since there is no tls: section; agents on other machines need tls: (`llmgw server init` writes one), or agent_plaintext: true on a network you trust"
                );
                Ok(([127, 0, 0, 1], 7443).into())
            }
            Some(a) if a.ip().is_loopback() => Ok(a),
            Some(a) => Err(ConfigError(format!(
                "agent_listen {a} is off loopback without tls: anything that reaches it could register as a node and be sent placements and prompts. Give a tls: section (`llmgw server init` writes one; nodes then join with `llmgw ctl node token`), listen on loopback, or set agent_plaintext: true (--agent-plaintext) for a network you trust"
            ))),
        },
    }
}

/// The client listener's certificate and key, read and checked to fit
/// together before anything binds.
fn client_tls(s: &config::ClientTlsSection) -> Result<llmgw_gateway::ServerTls, ConfigError> {
    let read = |what: &str, p: &std::path::Path| {
        std::fs::read(p).map_err(|e| {
            ConfigError(format!(
                "client_tls.{what}: cannot read {}: {e}",
                p.display()
            ))
        })
    };
    let (cert, key) = (read("cert", &s.cert)?, read("key", &s.key)?);
    llmgw_gateway::ServerTls::from_pem(&cert, &key).map_err(|e| {
        ConfigError(format!(
            "client_tls ({} and {}): {e}",
            s.cert.display(),
            s.key.display()
        ))
    })
}

/// The pages' settings: `landing:` in every mode; accounts (`auth.signup_open`
/// and the session lifetimes) only with keys on.
fn web_plan(file: &FileConfig, auth: bool) -> Result<crate::serve::WebPlan, ConfigError> {
    let a = &file.auth;
    if !auth {
        let set = [
            (a.signup_open.is_some(), "auth.signup_open"),
            (a.signup_pending_max.is_some(), "auth.signup_pending_max"),
            (a.session_idle.is_some(), "auth.session_idle"),
            (a.session_max.is_some(), "auth.session_max"),
            (a.sign_in_attempts.is_some(), "auth.sign_in_attempts"),
            (a.sign_in_window.is_some(), "auth.sign_in_window"),
        ];
        if let Some((_, what)) = set.iter().find(|(s, _)| *s) {
            return Err(ConfigError(format!(
                "{what} applies only with auth.enabled: people sign in only where keys are required"
            )));
        }
    }
    let mut people = llmgw_people::PeopleConfig::default();
    if let Some(v) = &a.session_idle {
        people.session_idle = config::duration("auth.session_idle", v)?;
    }
    if let Some(v) = &a.session_max {
        people.session_max = config::duration("auth.session_max", v)?;
    }
    if people.session_idle.is_zero() || people.session_max < people.session_idle {
        return Err(ConfigError(
            "auth.session_idle must be above 0 and at most auth.session_max".into(),
        ));
    }
    // Zero would lock everyone out (or, to the people crate, mean the
    // default): refused, so that what is written is what runs.
    if let Some(n) = a.sign_in_attempts {
        if n == 0 {
            return Err(ConfigError(
                "auth.sign_in_attempts must be at least 1: it is how many wrong passwords an email may try".into(),
            ));
        }
        people.max_attempts = n;
    }
    if let Some(v) = &a.sign_in_window {
        people.attempt_window = config::duration("auth.sign_in_window", v)?;
        if people.attempt_window < std::time::Duration::from_secs(1) {
            return Err(ConfigError(
                "auth.sign_in_window must be at least 1s".into(),
            ));
        }
    }
    if a.signup_pending_max == Some(0) {
        return Err(ConfigError(
            "auth.signup_pending_max must be at least 1 (to stop sign-up, auth.signup_open: false)"
                .into(),
        ));
    }
    let l = &file.landing;
    let base_url = match &l.base_url {
        Some(u) => {
            let u = u.trim().trim_end_matches('/');
            if !(u.starts_with("http://") || u.starts_with("https://")) || u.contains(' ') {
                return Err(ConfigError(format!(
                    "landing.base_url {u:?} must be an http:// or https:// address"
                )));
            }
            // The pages and the API are served from the root: a path here
            // was shown doubled (…/v1/v1/chat/completions), and the pages'
            // own links ignored it.
            let host = u.split_once("://").map_or(u, |(_, rest)| rest);
            if host.is_empty() || host.contains(['/', '?', '#']) {
                return Err(ConfigError(format!(
                    "landing.base_url {u:?} must be the address alone (https://llm.example.com), without /v1 or another path: the pages and the API are served from its root"
                )));
            }
            Some(u.to_owned())
        }
        None => None,
    };
    let text = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    Ok(crate::serve::WebPlan {
        settings: llmgw_web::WebSettings {
            accounts: auth,
            signup_open: auth && a.signup_open.unwrap_or(true),
            signup_pending_max: Some(a.signup_pending_max.unwrap_or(1_000)),
            contact: text(&l.contact),
            notice: text(&l.notice),
            // Served over HTTPS here or behind a proxy that terminates it.
            secure_cookies: file.client_tls.is_some()
                || base_url
                    .as_deref()
                    .is_some_and(|u| u.starts_with("https://")),
            base_url,
            place: Default::default(),
            router_only: false,
            usage_flush: None,
        },
        people,
    })
}

fn control_config(file: &FileConfig) -> Result<Option<llmgw_control::ControlConfig>, ConfigError> {
    let c = &file.control;
    match (c.enabled, file.models.is_empty()) {
        (Some(false), false) => {
            return Err(ConfigError(
                "control.enabled: false with a models: catalog, which only the control plane serves: remove models: to route to endpoints alone, or control.enabled".into(),
            ));
        }
        (Some(true), _) | (None, false) => {}
        (_, true) => return Ok(None),
    }
    let mut out = llmgw_control::ControlConfig::default();
    let set = |key: &str,
               v: &Option<String>,
               slot: &mut std::time::Duration|
     -> Result<(), ConfigError> {
        if let Some(v) = v {
            *slot = config::duration(&format!("control.{key}"), v)?;
        }
        Ok(())
    };
    set("interval", &c.interval, &mut out.interval)?;
    set("lease_ttl", &c.lease_ttl, &mut out.lease_ttl)?;
    set(
        "unreachable_after",
        &c.unreachable_after,
        &mut out.unreachable_after,
    )?;
    set("lost_after", &c.lost_after, &mut out.lost_after)?;
    set("base_backoff", &c.base_backoff, &mut out.base_backoff)?;
    set("max_backoff", &c.max_backoff, &mut out.max_backoff)?;
    set("drain_grace", &c.drain_grace, &mut out.drain_grace)?;
    set("min_lifetime", &c.min_lifetime, &mut out.min_lifetime)?;
    set("evict_idle", &c.evict_idle, &mut out.evict_idle)?;
    // Zero would spin the reconciler, call every agent unreachable at
    // once, or retry a failing model without pause.
    for (key, v) in [
        ("interval", out.interval),
        ("unreachable_after", out.unreachable_after),
        ("base_backoff", out.base_backoff),
    ] {
        if v.is_zero() {
            return Err(ConfigError(format!("control.{key} must be longer than 0")));
        }
    }
    if out.base_backoff > out.max_backoff {
        return Err(ConfigError(format!(
            "control.base_backoff ({:?}) must not be longer than control.max_backoff ({:?}), which caps every wait",
            out.base_backoff, out.max_backoff
        )));
    }
    if out.lost_after <= out.unreachable_after {
        return Err(ConfigError(format!(
            "control.lost_after ({:?}) must be longer than control.unreachable_after ({:?})",
            out.lost_after, out.unreachable_after
        )));
    }
    if out.lease_ttl < std::time::Duration::from_millis(300) {
        return Err(ConfigError(
            "control.lease_ttl must be at least 300ms".into(),
        ));
    }
    out.lease_poll = (out.lease_ttl / 10).clamp(
        std::time::Duration::from_millis(50),
        std::time::Duration::from_millis(500),
    );
    if let Some([lo, hi]) = c.port_range {
        if lo == 0 || lo > hi || hi > 64535 {
            return Err(ConfigError(format!(
                "control.port_range [{lo}, {hi}] must be low ≤ high, from 1 to 64535 (rendezvous ports are 1000 above)"
            )));
        }
        out.port_range = (lo, hi);
    }
    if let Some(i) = &c.mgmt_interface {
        out.mgmt_interface = i.clone();
    }
    if let Some(url) = &c.advertise_admin {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ConfigError(format!(
                "control.advertise_admin: {url:?} is not an http:// or https:// URL"
            )));
        }
        out.advertise_admin = Some(url.trim_end_matches('/').to_owned());
    }
    if let Some(url) = &c.advertise_agent {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ConfigError(format!(
                "control.advertise_agent: {url:?} is not an http:// or https:// URL"
            )));
        }
        out.advertise_agent = Some(url.trim_end_matches('/').to_owned());
    }
    out.instance = match &c.instance {
        // Refused by the store at every try to lead, so the server stood
        // by for ever, saying the store could not be reached.
        Some(i) if i.trim().is_empty() => {
            return Err(ConfigError(
                "control.instance is empty: name this server in the lease (or leave it out: the host name)".into(),
            ));
        }
        Some(i) => i.clone(),
        None => crate::serve::default_instance(),
    };
    out.models = file.models.clone();
    out.anchors = anchor_config(c)?;
    out.mirror_url = crate::config::mirror_url(file.mirror.as_ref())?;
    if out.mirror_url.is_none()
        && let Some(m) = out.models.iter().find(|m| m.source.starts_with("mirror:"))
    {
        return Err(ConfigError(format!(
            "model {} has a mirror source ({}), but no mirror.url says where the mirror is: its nodes could not fetch it",
            m.name, m.source
        )));
    }
    out.engines = crate::engines_config::wants(&file.engines, out.mirror_url.as_deref())?;
    Ok(Some(out))
}

/// `control.anchors` and `control.signing_key`, checked whole: a sink with
/// no cadence, or a key with nothing to sign, would be ignored, so each is
/// refused.
fn anchor_config(
    c: &config::ControlSection,
) -> Result<llmgw_control::anchor::AnchorConfig, ConfigError> {
    let mut out = llmgw_control::anchor::AnchorConfig::default();
    if let Some(path) = &c.signing_key {
        let key = llmgw_eventstore::signing::SigningKey::read(path)
            .map_err(|e| ConfigError(format!("control.signing_key: {e}")))?;
        out.key = Some(std::sync::Arc::new(key));
    }
    let Some(a) = &c.anchors else {
        if out.key.is_some() {
            return Err(ConfigError(
                "control.signing_key signs the anchors, and control.anchors is not set: add control.anchors (every_events or every, and a file or command), or remove the key".into(),
            ));
        }
        return Ok(out);
    };
    if let Some(n) = a.every_events {
        if n == 0 {
            return Err(ConfigError(
                "control.anchors.every_events must be at least 1".into(),
            ));
        }
        out.every_events = Some(n);
    }
    if let Some(t) = &a.every {
        let t = config::duration("control.anchors.every", t)?;
        if t < std::time::Duration::from_secs(1) {
            return Err(ConfigError(
                "control.anchors.every must be at least 1s".into(),
            ));
        }
        out.every = Some(t);
    }
    if !out.enabled() {
        return Err(ConfigError(
            "control.anchors needs every_events or every (or both): when to record an anchor"
                .into(),
        ));
    }
    if let Some(path) = &a.file {
        // Checked without writing (--check writes nothing): an existing
        // file must be a file, a new one needs its directory.
        let ok = if path.exists() {
            path.is_file()
        } else {
            path.parent()
                .is_some_and(|d| d.as_os_str().is_empty() || d.is_dir())
        };
        if !ok {
            return Err(ConfigError(format!(
                "control.anchors.file: {} is not a file in an existing directory",
                path.display()
            )));
        }
        out.file = Some(path.clone());
    }
    if let Some(cmd) = &a.command {
        if cmd.trim().is_empty() {
            return Err(ConfigError("control.anchors.command is empty".into()));
        }
        out.command = Some(cmd.clone());
    }
    if out.key.is_some() && out.file.is_none() && out.command.is_none() {
        return Err(ConfigError(
            "control.signing_key signs what the anchor sinks get, and there is none: add control.anchors.file or .command".into(),
        ));
    }
    Ok(out)
}

fn fallback(s: &str) -> Result<(String, Vec<String>), String> {
    let (model, list) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected model=fallback[,fallback…]"))?;
    let list: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    if model.is_empty() || list.is_empty() || list.iter().any(|f| f == model) {
        return Err(format!(
            "{s:?}: name a model and at least one other model to fall back to"
        ));
    }
    Ok((model.to_owned(), list))
}

/// `HOST:PORT`, or `:PORT` for every interface.
pub(crate) fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    full.parse().map_err(|_| {
        format!("{s:?} is not IP:PORT or :PORT (an IP address: names are not looked up)")
    })
}

/// The `server.env` beside `config` when it names a store (LLMGW_STORE),
/// as `server init` writes it for the unit to read.
fn store_in_server_env(config: Option<&std::path::Path>) -> Option<std::path::PathBuf> {
    config
        .and_then(std::path::Path::parent)
        .map(|d| d.join("server.env"))
        .filter(|f| {
            std::fs::read_to_string(f)
                .map(|t| {
                    t.lines()
                        .any(|l| l.trim_start().starts_with("LLMGW_STORE="))
                })
                .unwrap_or(f.exists())
        })
}

/// `--check` of a store a start opens: the start fails before it binds
/// when a PostgreSQL server or database cannot be reached, or when the
/// store's schema is newer than this binary's or an applied migration was
/// edited (a binary rolled back), so the check does too, in the start's
/// words. Read only: nothing is created or migrated, and a SQLite file
/// that is not there yet is not made. Returns what a start will do about
/// the schema, for the operator to read.
async fn reach(store: &str) -> Result<String, ConfigError> {
    use llmgw_eventstore::{SchemaState, StoreAddress};
    let address = StoreAddress::parse(store).map_err(|e| ConfigError(format!("store: {e}")))?;
    let shown = address.redacted();
    if let StoreAddress::Sqlite(path) = &address
        && !path.exists()
    {
        return Ok(format!(
            "schema: none yet ({shown} is not there); a start makes it"
        ));
    }
    let read = llmgw_eventstore::AnyStore::schema_state(&address);
    match tokio::time::timeout(std::time::Duration::from_secs(10), read).await {
        Ok(Ok(SchemaState::Empty { known })) => Ok(format!(
            "schema: none yet in {shown}; a start creates it (version {known})"
        )),
        Ok(Ok(SchemaState::Behind { found, known })) => Ok(format!(
            "schema: version {found} in {shown}; a start migrates it to version {known}"
        )),
        Ok(Ok(SchemaState::Current { version })) => Ok(format!(
            "schema: version {version} in {shown}, this binary's"
        )),
        Ok(Err(e)) => {
            // The store's error names the address; its causes say why.
            let mut said = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                // Some causes repeat their own cause in their text.
                let text = c.to_string();
                if !said.contains(&text) {
                    said.push_str(&format!(": {text}"));
                }
                cause = c.source();
            }
            Err(ConfigError(format!("store: {said}")))
        }
        Err(_) => Err(ConfigError(format!(
            "store: {shown} did not answer within 10 s"
        ))),
    }
}

pub(crate) async fn run(store: &StoreArg, mut a: ServerArgs) -> anyhow::Result<Outcome> {
    if let Some(ServerCommand::Init(init)) = a.command.take() {
        return crate::init::run(&store.address, init).await;
    }
    let check = a.check;
    let config = a.config.clone();
    let mut plan = settings(a, store)?;
    if check {
        // Run where the server runs (a unit's ExecStartPre, say), this
        // sees the limit the server will.
        crate::serve::fit_open_files(&mut plan)?;
        // The log a unit reads from server.env is not the one named here:
        // reaching ./llmgw.db instead would judge the wrong store.
        let env_store = !plan.store_named && store_in_server_env(config.as_deref()).is_some();
        let mut schemas = Vec::new();
        for store in plan.stores() {
            if env_store && store == plan.store.as_str() {
                continue;
            }
            schemas.push(reach(store).await?);
        }
        let mode = match (&plan.control, plan.auth) {
            (Some(_), true) => "control plane, keys required",
            (Some(_), false) => "control plane, no keys",
            (None, true) => "router only, keys required",
            (None, false) => "router only, no keys",
        };
        println!("configuration ok: {mode}");
        // Which log a start would open: a check by hand that passed while
        // the start then refused (or opened ./llmgw.db) said nothing of it.
        if !plan.needs_log() {
            println!("store: none (a plain router keeps no log)");
        } else if !plan.store_named
            && let Some(env) = store_in_server_env(config.as_deref())
        {
            println!(
                "store: the one {} names (LLMGW_STORE), which the unit reads; a start by hand needs it too: `sudo sh -c 'set -a; . {}; llmgw server --config …'`",
                env.display(),
                env.display()
            );
        } else {
            let address = llmgw_eventstore::StoreAddress::parse(&plan.store)?;
            println!("store: {}", address.redacted());
        }
        for said in schemas {
            println!("{said}");
        }
        return Ok(Outcome::Ok);
    }
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    crate::serve::run(plan, |_| {}, stop).await
}
