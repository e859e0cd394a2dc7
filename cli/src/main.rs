//! The `llmgw` binary: every subcommand wires the library crates together.
//! Parsing and printing live here; behaviour lives in the crates.

mod admin_client;
mod agent;
mod agent_config;
mod agent_log;
mod bench;
mod cert;
mod cluster;
mod config;
mod convo_settings;
mod ctl;
mod engines_config;
mod events;
mod gateway_settings;
mod init;
mod keys;
mod lease;
mod logging;
mod mirror;
mod notify;
mod open_files;
mod output;
mod plan;
mod serve;
mod server;
mod server_metrics;
mod shell;
mod sim;
mod store;
mod tool_check;
mod up;
mod users;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// llmgw: LLMs on your own machines behind one OpenAI-compatible endpoint.
/// mimalloc rather than the C library's malloc: a server of many small,
/// short-lived allocations across threads (requests, events, heartbeats)
/// spends less time allocating and keeps less memory with it. Why, and the
/// figures: the workspace manifest and docs/benchmarks.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "llmgw", version, about, propagate_version = true)]
struct Cli {
    /// Where the event log lives: postgres://…, sqlite://PATH, a file path,
    /// or @FILE to read the address from FILE (keeps passwords off the
    /// command line). For events, store, lease, keys, users and server
    /// (default: llmgw.db here; `server init`: the store its server.env
    /// names, else SQLite in --state-dir); refused by the commands that do
    /// not read the log.
    // The variable's value may hold a password: `--help` names it only.
    // The default is said in words: shown by clap on every command, it
    // read as one on those that refuse the flag, and as `server init`'s.
    #[arg(
        long,
        global = true,
        env = "LLMGW_STORE",
        hide_env_values = true,
        default_value = "llmgw.db",
        hide_default_value = true
    )]
    store: String,

    /// How log lines are written to stderr: text, or json (one object a
    /// line, for a log pipeline). RUST_LOG sets the levels.
    #[arg(
        long,
        global = true,
        env = "LLMGW_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    log_format: logging::LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Read, verify and export the event log.
    #[command(subcommand)]
    Events(events::EventsCommand),
    /// Manage the store itself.
    #[command(subcommand)]
    Store(store::StoreCommand),
    /// Inspect the append lease.
    #[command(subcommand)]
    Lease(lease::LeaseCommand),
    /// API keys, their limits and the tenancy tree they belong to.
    Keys(keys::KeysArgs),
    /// People who sign in to the pages: approve, suspend, promote, reset a
    /// password, erase.
    Users(users::UsersArgs),
    /// Operator tools.
    Ctl(ctl::CtlArgs),
    /// The node agent.
    #[command(subcommand)]
    Agent(agent::AgentCommand),
    /// The gateway; with --endpoint, alone against static endpoints.
    Server(server::ServerArgs),
    /// Try llmgw on this machine in one command: server, local agent and a
    /// simulated model, with a curl that works.
    Up(up::UpArgs),
    /// An OpenAI-compatible simulated engine, for tests and demos.
    SimEngine(sim::SimArgs),
    /// Print a shell completion script.
    Completions(shell::CompletionsArgs),
    /// Write man pages for every command.
    Man(shell::ManArgs),
    /// A model mirror: serve a directory of model files to the fleet, and
    /// fill, audit and prune it.
    #[command(subcommand)]
    Mirror(mirror::MirrorCommand),
}

/// The commands that never read the log at `--store`: given on their
/// command line, it would be silently ignored, so it is refused.
fn ignores_store(c: &Command) -> Option<&'static str> {
    match c {
        Command::Ctl(_) => Some("ctl talks to a server's admin API: use --admin"),
        Command::Agent(_) => {
            Some("the agent never reads the log: it talks to the server (--server)")
        }
        Command::Up(_) => Some("up keeps its own log in --data-dir"),
        Command::SimEngine(_) => Some("the simulated engine keeps no log"),
        Command::Mirror(_) => Some("the mirror keeps no log: it serves --dir"),
        Command::Completions(_) | Command::Man(_) => Some("it reads no log"),
        Command::Events(events::EventsCommand::Verify { file: Some(_), .. }) => {
            Some("verify --file checks the export; name its store with --against")
        }
        _ => None,
    }
}

/// What a command reports besides success: a check that ran and found a
/// problem exits 1 without being an error of the command itself.
pub(crate) enum Outcome {
    Ok,
    Failed,
}

/// How this process logs. Daemons log at info, so that "leading", "agent
/// connected" and every request's access line reach the journal; a
/// one-shot command (keys, events, ctl, users…) stays at warn, because a
/// person or a script reads its output and its stderr carries its one-line
/// error. RUST_LOG overrides either. A daemon that serves or steers
/// exports traces when OTLP is configured; the simulated engine does not.
fn logging_setup(cli: &Cli) -> logging::Setup {
    use tracing_subscriber::filter::LevelFilter;
    let (default_level, service, ring) = match &cli.command {
        Command::Server(a) if a.serves() => (LevelFilter::INFO, Some("llmgw-server"), None),
        Command::Up(_) => (LevelFilter::INFO, Some("llmgw-server"), None),
        Command::Agent(agent::AgentCommand::Run(_)) => {
            let ring = llmgw_agent::supervisor::LogTail::new(agent_log::LINES);
            let _ = agent::AGENT_LOG.set(ring.clone());
            (LevelFilter::INFO, Some("llmgw-agent"), Some(ring))
        }
        Command::SimEngine(_) => (LevelFilter::INFO, None, None),
        Command::Mirror(mirror::MirrorCommand::Serve(_)) => (LevelFilter::INFO, None, None),
        _ => (LevelFilter::WARN, None, None),
    };
    logging::Setup {
        format: cli.log_format,
        default_level,
        service,
        ring,
    }
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if matches.value_source("store") == Some(clap::parser::ValueSource::CommandLine)
        && let Some(why) = ignores_store(&cli.command)
    {
        eprintln!("error: --store does not apply here: {why}");
        return ExitCode::from(2);
    }
    if let Command::Ctl(c) = &cli.command
        && let Some(why) = c.ignores_admin()
        && matches
            .subcommand_matches("ctl")
            .and_then(|m| m.value_source("admin"))
            == Some(clap::parser::ValueSource::CommandLine)
    {
        eprintln!("error: --admin does not apply here: {why}");
        return ExitCode::from(2);
    }
    if let Command::Ctl(c) = &cli.command
        && let Some(why) = c.ignores_as()
    {
        eprintln!("error: --as does not apply here: {why}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The trace exporter sends on the runtime: it goes before the runtime.
    let logs = match logging::init(logging_setup(&cli), runtime.handle()) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // The server's own file may name a store too: the flag and the
    // variable win over it, and it over the default.
    let server_store = server::StoreArg {
        address: cli.store.clone(),
        named: matches
            .value_source("store")
            .is_some_and(|s| s != clap::parser::ValueSource::DefaultValue),
    };
    // Where keys and users send a command depends on which of --store and
    // --admin the command line itself gave.
    let named = |command: &str| admin_client::Named {
        store: matches.value_source("store") == Some(clap::parser::ValueSource::CommandLine),
        store_from: match matches.value_source("store") {
            Some(clap::parser::ValueSource::CommandLine) => "--store",
            Some(clap::parser::ValueSource::EnvVariable) => "LLMGW_STORE",
            _ => "the default; --store or LLMGW_STORE names another",
        },
        admin: matches
            .subcommand_matches(command)
            .and_then(|m| m.value_source("admin"))
            == Some(clap::parser::ValueSource::CommandLine),
        admin_chosen: matches
            .subcommand_matches(command)
            .and_then(|m| m.value_source("admin"))
            .is_some_and(|s| s != clap::parser::ValueSource::DefaultValue),
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Events(cmd) => events::run(&cli.store, cmd).await,
            Command::Store(cmd) => store::run(&cli.store, cmd).await,
            Command::Lease(cmd) => lease::run(&cli.store, cmd).await,
            Command::SimEngine(args) => sim::run(args).await,
            Command::Server(args) => server::run(&server_store, args).await,
            Command::Agent(cmd) => agent::run(cmd).await,
            Command::Ctl(cmd) => ctl::run(cmd).await,
            Command::Keys(cmd) => keys::run(&cli.store, named("keys"), cmd).await,
            Command::Users(cmd) => users::run(&cli.store, named("users"), cmd).await,
            Command::Up(args) => up::run(args).await,
            Command::Mirror(cmd) => mirror::run(cmd).await,
            Command::Completions(a) => shell::completions(Cli::command(), a),
            Command::Man(a) => shell::man(Cli::command(), a),
        }
    });
    drop(logs);
    match result {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Failed) => ExitCode::from(1),
        Err(e) if output::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<config::ConfigError>().is_some() => {
            eprintln!("error: {}", output::one_line(&e));
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {}", output::one_line(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod docs_commands;

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every command and every option of every command says what it is
    /// for in `--help`.
    #[test]
    fn every_command_and_option_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", cmd.get_name());
            if cmd.get_about().is_none() && path.contains(' ') && path != " llmgw" {
                missing.push(format!("{path}: the command"));
            }
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" || arg.is_hide_set() {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path}: --{id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() != "help" {
                    walk(sub, &path, missing);
                }
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "", &mut missing);
        assert!(missing.is_empty(), "no help text:\n{}", missing.join("\n"));
    }
}
