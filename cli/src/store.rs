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

/// Opens an existing, migrated store for the operator's reading
/// commands: read only, so a backup or another user's copy is left as it
/// was, and a read-only one can be read.
pub(crate) async fn open_reading(address: &str) -> anyhow::Result<AnyStore> {
    let address = StoreAddress::parse(address)?;
    Ok(AnyStore::open(&address, OpenOptions::reading()).await?)
}

/// Opens a store for writing, creating or upgrading its schema first.
pub(crate) async fn open_migrating(address: &str) -> anyhow::Result<AnyStore> {
    let address = StoreAddress::parse(address)?;
    Ok(AnyStore::open(&address, OpenOptions::migrating()).await?)
}
