//! Shell completions and man pages, generated from the command tree that
//! `--help` reads, so all three say the same thing.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use crate::Outcome;

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell. For bash:
    /// `llmgw completions bash > /etc/bash_completion.d/llmgw`.
    shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// Write one page per command (`llmgw.1`, `llmgw-server.1`,
    /// `llmgw-ctl-status.1`…) into this directory; without it, the
    /// top-level page goes to standard output.
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub(crate) fn completions(cmd: clap::Command, a: CompletionsArgs) -> anyhow::Result<Outcome> {
    let mut cmd = cmd;
    // Made whole first: clap_complete panics when its writer fails, and a
    // closed pipe (`llmgw completions bash | head`) is an ordinary end.
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "llmgw", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)?;
    out.flush()?;
    Ok(Outcome::Ok)
}

pub(crate) fn man(cmd: clap::Command, a: ManArgs) -> anyhow::Result<Outcome> {
    let Some(dir) = a.dir else {
        let mut out = std::io::stdout().lock();
        clap_mangen::Man::new(cmd).render(&mut out)?;
        out.flush()?;
        return Ok(Outcome::Ok);
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut cmd = cmd;
    // Subcommands know their full names (`llmgw-ctl-status`) only once
    // the tree is built.
    cmd.build();
    let mut written = 0;
    write_pages(&cmd, &dir, &mut written)?;
    println!("{written} pages in {}", dir.display());
    Ok(Outcome::Ok)
}

fn write_pages(cmd: &clap::Command, dir: &Path, written: &mut usize) -> anyhow::Result<()> {
    let name = cmd
        .get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_owned();
    let path = dir.join(format!("{name}.1"));
    let mut file =
        std::fs::File::create(&path).with_context(|| format!("cannot write {}", path.display()))?;
    clap_mangen::Man::new(cmd.clone())
        .title(name.to_uppercase())
        .render(&mut file)?;
    *written += 1;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        write_pages(sub, dir, written)?;
    }
    Ok(())
}
