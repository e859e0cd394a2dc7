use clap::Subcommand;
use llmgw_eventstore::{AnyStore, EventStore, OpenOptions, Schema, StoreAddress};

use crate::Outcome;

#[derive(Debug, Subcommand)]
pub(crate) enum StoreCommand {
    /// Create the schema, or bring it up to date (safe to run again).
    Migrate,
}

pub(crate) async fn run(address: &str, cmd: StoreCommand) -> anyhow::Result<Outcome> {
    match cmd {
        StoreCommand::Migrate => {
            let address = StoreAddress::parse(address)?;
            let options = OpenOptions {
                create: true,
                schema: Schema::Unchecked,
                ..OpenOptions::default()
            };
            let store = AnyStore::open(&address, options).await?;
            let applied = store.migrate().await?;
            if applied.is_empty() {
                println!("{address}: schema is up to date");
            } else {
                let list: Vec<String> = applied.iter().map(i64::to_string).collect();
                println!("{address}: applied migration {}", list.join(", "));
            }
            Ok(Outcome::Ok)
        }
    }
}

/// Opens an existing, migrated store for the operator's commands.
pub(crate) async fn open(address: &str) -> anyhow::Result<AnyStore> {
    let address = StoreAddress::parse(address)?;
    Ok(AnyStore::open(&address, OpenOptions::default()).await?)
}

/// Opens a store for writing, creating or upgrading its schema first.
pub(crate) async fn open_migrating(address: &str) -> anyhow::Result<AnyStore> {
    let address = StoreAddress::parse(address)?;
    Ok(AnyStore::open(&address, OpenOptions::migrating()).await?)
}
