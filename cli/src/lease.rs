use std::io::Write;

use clap::Subcommand;
use llmgw_eventstore::EventStore;

use crate::Outcome;
use crate::output::{Table, json_line};

#[derive(Debug, Subcommand)]
pub(crate) enum LeaseCommand {
    /// Who holds the append lease, under which epoch, until when.
    Show {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn run(address: &str, cmd: LeaseCommand) -> anyhow::Result<Outcome> {
    let store = crate::store::open_reading(address).await?;
    let mut out = std::io::stdout().lock();
    match cmd {
        LeaseCommand::Show { json } => {
            let info = store.lease_info().await?;
            if json {
                json_line(&mut out, &info)?;
            } else {
                let state = match (&info.holder, info.held) {
                    (None, _) => "never held",
                    (Some(_), true) => "held",
                    (Some(_), false) => "free (released or expired)",
                };
                let mut t = Table::new(vec!["HOLDER", "EPOCH", "EXPIRES", "STATE"]);
                t.row(vec![
                    info.holder.clone().unwrap_or_else(|| "-".into()),
                    info.epoch.to_string(),
                    info.expires_at
                        .map_or_else(|| "-".into(), crate::events::filter::when),
                    state.into(),
                ]);
                t.print(&mut out)?;
            }
            out.flush()?;
            Ok(Outcome::Ok)
        }
    }
}
