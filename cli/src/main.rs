//! The `llmgw` binary: every subcommand wires the library crates together.
//! Parsing and printing live here; behaviour lives in the crates.

mod admin_client;
mod agent;
mod agent_log;
mod cert;
mod cluster;
mod config;
mod ctl;
mod events;
mod gateway_settings;
mod keys;
mod lease;
mod output;
mod serve;
mod server;
mod sim;
mod store;
mod up;
mod users;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// llmgw: LLMs on your own machines behind one OpenAI-compatible endpoint.
#[derive(Debug, Parser)]
#[command(name = "llmgw", version, about, propagate_version = true)]
struct Cli {
    /// Where the event log lives: postgres://…, sqlite://PATH, a file path,
    /// or @FILE to read the address from FILE (keeps passwords off the
    /// command line).
    #[arg(long, global = true, env = "LLMGW_STORE", default_value = "llmgw.db")]
    store: String,

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
}

/// What a command reports besides success: a check that ran and found a
/// problem exits 1 without being an error of the command itself.
pub(crate) enum Outcome {
    Ok,
    Failed,
}

/// Logs go to stderr (filtered by RUST_LOG, warnings by default); a node
/// agent also keeps its last lines at info level for `ctl logs`.
fn init_logging(cli: &Cli) {
    use std::io::IsTerminal;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // Colours only for a person at a terminal: a journal or a log file
    // gets plain text.
    let stderr = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        );
    let ring = match &cli.command {
        Command::Agent(agent::AgentCommand::Run(_)) => {
            let ring = llmgw_agent::supervisor::LogTail::new(agent_log::LINES);
            let _ = agent::AGENT_LOG.set(ring.clone());
            Some(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(agent_log::Ring(ring))
                    .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
            )
        }
        _ => None,
    };
    tracing_subscriber::registry()
        .with(stderr)
        .with(ring)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Events(cmd) => events::run(&cli.store, cmd).await,
            Command::Store(cmd) => store::run(&cli.store, cmd).await,
            Command::Lease(cmd) => lease::run(&cli.store, cmd).await,
            Command::SimEngine(args) => sim::run(args).await,
            Command::Server(args) => server::run(&cli.store, args).await,
            Command::Agent(cmd) => agent::run(cmd).await,
            Command::Ctl(cmd) => ctl::run(cmd).await,
            Command::Keys(cmd) => keys::run(&cli.store, cmd).await,
            Command::Users(cmd) => users::run(&cli.store, cmd).await,
            Command::Up(args) => up::run(args).await,
        }
    });
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
