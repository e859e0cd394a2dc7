use std::io::Write;
use std::path::PathBuf;

use clap::Subcommand;
use llmgw_agent::discovery::{self, Options};

use crate::Outcome;
use crate::output::{Table, json_line};

#[derive(Debug, Subcommand)]
pub(crate) enum AgentCommand {
    /// What the scheduler would see of this machine.
    Inventory {
        #[arg(long)]
        json: bool,
        /// The nvidia-smi to run (default: the one on PATH; none = CPU node).
        #[arg(long)]
        nvidia_smi: Option<PathBuf>,
        #[arg(long)]
        skip_gpus: bool,
        /// A directory of model weights; repeat for several.
        #[arg(long = "model-dir")]
        model_dirs: Vec<PathBuf>,
        /// A fabric and the adapters on it: `ib-a=mlx5_0,mlx5_1`; repeat.
        #[arg(long = "fabric", value_parser = fabric)]
        fabrics: Vec<(String, Vec<String>)>,
        /// Where /etc, /proc and /sys are (for fixtures).
        #[arg(long, default_value = "/", hide = true)]
        root: PathBuf,
    },
}

fn fabric(s: &str) -> Result<(String, Vec<String>), String> {
    let (name, hcas) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected fabric=hca[,hca…]"))?;
    let hcas: Vec<String> = hcas
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    if name.is_empty() || hcas.is_empty() {
        return Err(format!("{s:?}: name the fabric and at least one adapter"));
    }
    Ok((name.to_owned(), hcas))
}

pub(crate) async fn run(cmd: AgentCommand) -> anyhow::Result<Outcome> {
    let AgentCommand::Inventory {
        json,
        nvidia_smi,
        skip_gpus,
        model_dirs,
        fabrics,
        root,
    } = cmd;
    let options = Options {
        root,
        nvidia_smi,
        skip_gpus,
        model_dirs,
        fabrics: fabrics.into_iter().collect(),
    };
    let inv = tokio::task::spawn_blocking(move || discovery::discover(&options)).await??;
    let mut out = std::io::stdout().lock();
    if json {
        json_line(&mut out, &inv)?;
        return Ok(Outcome::Ok);
    }
    let h = &inv.host;
    writeln!(
        out,
        "host     {} {} ({}) {}, cpu {}",
        h.os_id,
        h.os_version,
        h.os_codename,
        h.arch,
        h.cpu_flags.join(" ")
    )?;
    let mem = if inv.memory_total_mb == 0 {
        "unknown".to_owned()
    } else {
        format!("{} MiB", inv.memory_total_mb)
    };
    writeln!(out, "memory   {mem}")?;
    writeln!(out, "gpus     {} (from {})", inv.gpus.len(), inv.source)?;
    if !inv.gpus.is_empty() {
        let mut t = Table::new(vec!["INDEX", "CLASS", "NAME", "MEMORY MIB", "HEALTH"]);
        for g in &inv.gpus {
            let health = if g.health.ok() {
                "ok".to_owned()
            } else {
                g.health.problems.join("; ")
            };
            t.row(vec![
                g.index.to_string(),
                g.class.clone(),
                g.name.clone(),
                g.memory_total_mb.to_string(),
                health,
            ]);
        }
        t.print(&mut out)?;
    }
    writeln!(out, "adapters {}", inv.hcas.len())?;
    for c in &inv.fabrics {
        let state = if c.ok() {
            format!("ok at {} Gb/s", c.rate_gbps)
        } else {
            "NOT USABLE".to_owned()
        };
        writeln!(
            out,
            "fabric   {}: {state}; {}",
            c.fabric,
            c.problems.join("; ")
        )?;
    }
    for w in &inv.weights {
        writeln!(out, "weights  {} ({} bytes)", w.path, w.size_bytes)?;
    }
    Ok(Outcome::Ok)
}
