use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use clap::Subcommand;
use llmgw_agent::engines::{LlamaCpp, Registry, Sglang, Sim, Vllm, check};

use crate::Outcome;
use crate::output::Table;

#[derive(Debug, clap::Args)]
pub(crate) struct CtlArgs {
    /// The server's admin API (keep it on loopback). A server with
    /// admin_token is sent LLMGW_ADMIN_TOKEN (the token, or @FILE).
    #[arg(
        long,
        global = true,
        env = "LLMGW_ADMIN",
        default_value = "http://127.0.0.1:9090",
        value_parser = crate::admin_client::admin_url
    )]
    admin: String,
    /// One JSON document instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// The operator the log names for a change (default: the OS user).
    #[arg(long = "as", global = true, value_name = "NAME")]
    as_name: Option<String>,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum CtlCommand {
    #[command(flatten)]
    Cluster(crate::cluster::ClusterCommand),
    /// Whether MODEL fits each GPU class of the fleet: its weights (from
    /// config.json and the safetensors index of a local copy), the
    /// smallest TP (then PP) split that leaves room for the KV cache, and
    /// the catalog profile that matches. Exits 1 when no class holds it.
    Plan(crate::plan::PlanArgs),
    /// Send MODEL a tool-calling request through the gateway, plain and
    /// streamed, and say whether `tool_calls` came back, or the call as
    /// `<tool_call>` text (the engine's tool parser is off or wrong), or an
    /// answer that ignored the tool. Exits 1 unless both called it.
    ToolCheck(crate::tool_check::ToolCheckArgs),
    /// Load MODEL through the gateway with streamed requests at
    /// concurrency 1, 2, 4 … until the TTFT or inter-token p99 breaks the
    /// SLO (or a request fails), and report the last level that held: the
    /// weight to give the profile. Exits 1 when even concurrency 1 breaks it.
    Bench(crate::bench::BenchArgs),
    /// A private certificate authority for the agent stream.
    #[command(subcommand)]
    Cert(crate::cert::CertCommand),
    /// Check every flag llmgw would pass to an engine against the engine's
    /// own full --help. Exits 1 when any is missing.
    EngineCheck {
        /// vllm, sglang, llamacpp or sim.
        engine: String,
        /// The engine binary to ask (for sglang, the Python that has it;
        /// default: the engine's usual name on PATH).
        #[arg(long, conflicts_with = "help_output")]
        bin: Option<PathBuf>,
        /// A file holding the engine's --help output (`-` for standard input).
        #[arg(long)]
        help_output: Option<PathBuf>,
    },
}

impl CtlArgs {
    /// Why `--admin` means nothing to this command, for those that never
    /// ask a server's admin API: given on the command line, it would be
    /// silently ignored, so it is refused.
    pub(crate) fn ignores_admin(&self) -> Option<&'static str> {
        match self.command {
            CtlCommand::Cert(_) => Some("cert writes files here and asks no server"),
            CtlCommand::ToolCheck(_) | CtlCommand::Bench(_) => {
                Some("it sends its requests to the gateway's OpenAI API: use --url")
            }
            CtlCommand::EngineCheck { .. } => Some("engine-check asks the engine, not a server"),
            CtlCommand::Cluster(_) | CtlCommand::Plan(_) => None,
        }
    }

    /// Why `--as` means nothing to this command, for those that change
    /// nothing the log records: given, it read as the action being
    /// recorded under that name, so it is refused.
    pub(crate) fn ignores_as(&self) -> Option<&'static str> {
        match (&self.command, &self.as_name) {
            (CtlCommand::Cluster(_), _) | (_, None) => None,
            (CtlCommand::Cert(_), Some(_)) => {
                Some("cert writes files here, and the log records nothing of it")
            }
            (_, Some(_)) => Some("this command changes nothing the log records"),
        }
    }
}

/// The binary asked when none is given: what the agent would run.
fn default_bin(engine: &str) -> anyhow::Result<PathBuf> {
    Ok(match engine {
        "vllm" => "vllm".into(),
        "sglang" => "python3".into(),
        "sim" => std::env::current_exe().context("locating this llmgw binary")?,
        _ => "llama-server".into(),
    })
}

/// How to ask each engine for the help of the command llmgw runs.
fn help_args(engine: &str) -> &'static [&'static str] {
    match engine {
        // Plain --help prints vLLM's section names only.
        "vllm" => &["serve", "--help=all"],
        "sglang" => &["-m", "sglang.launch_server", "--help"],
        "sim" => &["sim-engine", "--help"],
        _ => &["--help"],
    }
}

pub(crate) async fn run(args: CtlArgs) -> anyhow::Result<Outcome> {
    let (engine, bin, help_output) = match args.command {
        CtlCommand::Cluster(c) => {
            return crate::cluster::run(&args.admin, args.as_name, args.json, c).await;
        }
        CtlCommand::Cert(c) => return crate::cert::run(c, args.json),
        CtlCommand::Plan(p) => return crate::plan::run(&args.admin, args.json, p).await,
        CtlCommand::ToolCheck(t) => return crate::tool_check::run(args.json, t).await,
        CtlCommand::Bench(b) => return crate::bench::run(args.json, b).await,
        CtlCommand::EngineCheck {
            engine,
            bin,
            help_output,
        } => (engine, bin, help_output),
    };
    let registry = Registry::new(
        Vllm::default(),
        Sglang::default(),
        LlamaCpp::default(),
        Sim::default(),
    );
    let e = registry.get(&engine)?;
    let help = match (bin, help_output) {
        (_, Some(p)) if p.as_os_str() == "-" => {
            std::io::read_to_string(std::io::stdin()).context("reading standard input")?
        }
        (_, Some(p)) => {
            std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?
        }
        (bin, None) => {
            let b = match bin {
                Some(b) => b,
                None => default_bin(&engine)?,
            };
            let mut cmd = Command::new(&b);
            cmd.args(help_args(&engine));
            // vLLM refuses to print anything, its help included, on a
            // machine without an accelerator unless told what to assume.
            if engine == "vllm" && std::env::var_os("VLLM_TARGET_DEVICE").is_none() {
                cmd.env("VLLM_TARGET_DEVICE", "cpu");
            }
            let out = cmd
                .output()
                .with_context(|| format!("running {} for its help", b.display()))?;
            // Some engines print help on stderr, or exit non-zero after it.
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        }
    };
    if help.trim().is_empty() {
        bail!("the help text is empty");
    }
    if !help.contains("--help") {
        // The cheapest sign of a help text cut short: flags past the cut
        // would read as missing.
        eprintln!(
            "warning: this help text does not document --help itself; if it was cut short, flags past the cut read as missing"
        );
    }
    let used = check::flags_used(e);
    let missing = check::missing(&used, &help);
    let mut out = std::io::stdout().lock();
    if args.json {
        let flags: Vec<_> = used
            .iter()
            .map(|f| serde_json::json!({"flag": f, "in_help": !missing.contains(f)}))
            .collect();
        crate::output::json_line(
            &mut out,
            &serde_json::json!({
                "engine": engine,
                "flags": flags,
                "found": used.len() - missing.len(),
                "help_lines": help.lines().count(),
            }),
        )?;
    } else {
        let mut t = Table::new(vec!["FLAG", "IN HELP"]);
        for f in &used {
            t.row(vec![
                f.clone(),
                if missing.contains(f) {
                    "MISSING".into()
                } else {
                    "yes".into()
                },
            ]);
        }
        t.print(&mut out)?;
        writeln!(
            out,
            "{} of {} flags found ({} help lines read)",
            used.len() - missing.len(),
            used.len(),
            help.lines().count()
        )?;
    }
    Ok(if missing.is_empty() {
        Outcome::Ok
    } else {
        Outcome::Failed
    })
}
