use std::io::Write;

use clap::Subcommand;
use llmgw_eventstore::{AnyStore, EventStore, OpenOptions, Schema, StoreAddress};

use crate::Outcome;

#[derive(Debug, Subcommand)]
pub(crate) enum StoreCommand {
    /// Create the schema, or bring it up to date (safe to run again).
    Migrate,
    /// Copy this store (--store) into a new one: the log, checked event
    /// for event as an import checks a file, then the people (their
    /// passwords' hashes too), claim links, threads and memory notes;
    /// sessions stay behind, so people sign in again. For moving from
    /// SQLite to PostgreSQL: stop every server on the store first.
    Copy {
        /// The new store: a SQLite file or `postgres://…`. Made or
        /// migrated; it must hold no event and no person.
        #[arg(long)]
        to: String,
    },
}

pub(crate) async fn run(address: &str, cmd: StoreCommand) -> anyhow::Result<Outcome> {
    match cmd {
        StoreCommand::Copy { to } => copy(address, &to).await,
        StoreCommand::Migrate => {
            let address = StoreAddress::parse(address)?;
            let options = OpenOptions {
                create: true,
                schema: Schema::Unchecked,
                ..OpenOptions::default()
            };
            let store = AnyStore::open(&address, options).await?;
            let applied = store.migrate().await?;
            // The file alone holds the schema (a copy of it is a log),
            // whatever becomes of what is said (a closed pipe).
            store.fold_wal().await;
            let mut out = std::io::stdout().lock();
            if applied.is_empty() {
                writeln!(out, "{address}: schema is up to date")?;
            } else {
                let list: Vec<String> = applied.iter().map(i64::to_string).collect();
                writeln!(out, "{address}: applied migration {}", list.join(", "))?;
            }
            Ok(Outcome::Ok)
        }
    }
}

/// `store copy`, stopped cleanly by SIGINT (Ctrl-C) or SIGTERM: the
/// copy is dropped, which removes the export file it goes through (the
/// whole log in plain text, left in the temporary directory), and a
/// SQLite file it made is removed while it holds nothing committed. Exits
/// 130 or 143, as a shell says of a command such a signal ended.
async fn copy(from: &str, to: &str) -> anyhow::Result<Outcome> {
    let dest = StoreAddress::parse(to)?;
    // A SQLite file made here and left empty by a copy that failed (a
    // source whose chain breaks, say) is removed: it looked like a store.
    let made_here = match &dest {
        StoreAddress::Sqlite(path) => (!path.exists()).then(|| path.clone()),
        StoreAddress::Postgres(_) => None,
    };
    let log_in = std::sync::atomic::AtomicBool::new(false);
    let stop = stop_signal()?;
    let (signal, code) = tokio::select! {
        done = copy_whole(from, to, made_here.as_deref(), &log_in) => return done,
        stopped = stop => stopped,
    };
    // The copy was dropped with the select, its export file with it.
    let said = if log_in.load(std::sync::atomic::Ordering::SeqCst) {
        format!(
            "store copy stopped ({signal}) after the log was copied: {} holds the log, perhaps without all the people, threads and notes; drop it and copy again",
            dest.redacted()
        )
    } else if let Some(path) = &made_here {
        remove_sqlite(path);
        format!(
            "store copy stopped ({signal}): nothing was written ({}, which it had made, is removed)",
            dest.redacted()
        )
    } else {
        format!(
            "store copy stopped ({signal}): nothing was written to {}",
            dest.redacted()
        )
    };
    eprintln!("{said}");
    std::process::exit(code)
}

/// SIGINT or SIGTERM, whichever comes first, listened for from now on:
/// its name and the status a shell gives a command it ends.
fn stop_signal() -> anyhow::Result<impl Future<Output = (&'static str, i32)>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => ("SIGINT", 130),
            _ = term.recv() => ("SIGTERM", 143),
        }
    })
}

/// A SQLite file and what SQLite keeps beside it.
fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// The copy: refused before anything is written where it could not be
/// whole (a server writes the source, the source is a range, the
/// destination holds something). `log_in` is set once the log is
/// committed in the destination.
async fn copy_whole(
    from: &str,
    to: &str,
    made_here: Option<&std::path::Path>,
    log_in: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<Outcome> {
    let (source, dest) = (StoreAddress::parse(from)?, StoreAddress::parse(to)?);
    if source.redacted() == dest.redacted() {
        anyhow::bail!("--to names the store being copied");
    }
    let store = open_reading(from).await?;
    let lease = store.lease_info().await?;
    if lease.held {
        anyhow::bail!(
            "{} holds the append lease of {}{}: stop every server on it first (a copy taken while they write misses what they write after); a holder that crashed (a server, or an import that was killed) holds it until then, and it frees itself: copy after that",
            lease.holder.as_deref().unwrap_or("a server"),
            source.redacted(),
            lease_runs_out(lease.expires_at),
        );
    }
    let (base, _) = store.base().await?;
    if base > 0 {
        anyhow::bail!(
            "this log begins after position {base} (an imported range): copy the store it came from"
        );
    }
    let remove_made = || made_here.map(remove_sqlite);
    {
        let target = open_migrating(to).await?;
        let (head, _) = target.head().await?;
        let (people, _) = llmgw_people::People::new(&target, Default::default())
            .dump()
            .await?
            .counts();
        let (threads, notes) = llmgw_convo::Convo::new(&target).dump().await?.counts();
        if head > 0 || people > 0 || threads + notes > 0 {
            anyhow::bail!(
                "{} already holds {head} events, {people} people and {} threads or notes: copy into a new, empty store",
                dest.redacted(),
                threads + notes
            );
        }
    }
    // A router-only server holds no lease, and writes usage, sign-ups,
    // threads and notes all the same: what it adds meanwhile is caught by
    // reading it all again after.
    let (before, _) = store.head().await?;
    let rows = llmgw_people::People::new(&store, Default::default())
        .dump()
        .await?;
    let convo = llmgw_convo::Convo::new(&store).dump().await?;
    let log = match crate::events::copy_log(&store, to).await {
        Ok(log) => log,
        Err(e) => {
            remove_made();
            return Err(e);
        }
    };
    log_in.store(true, std::sync::atomic::Ordering::SeqCst);
    let (after, _) = store.head().await?;
    let people_after = llmgw_people::People::new(&store, Default::default())
        .dump()
        .await?
        .counts();
    let convo_after = llmgw_convo::Convo::new(&store).dump().await?.counts();
    if after != before || people_after != rows.counts() || convo_after != convo.counts() {
        anyhow::bail!(
            "the source changed during the copy: a server still writes it (a router-only one holds no lease). Stop every server on it, drop {} and copy again",
            dest.redacted()
        );
    }
    let target = open_migrating(to).await?;
    let half = |what: &str, e: String| {
        anyhow::anyhow!(
            "the log was copied, {what} not: {e}; drop {} and copy again",
            dest.redacted()
        )
    };
    llmgw_people::People::new(&target, Default::default())
        .load(&rows)
        .await
        .map_err(|e| half("the people were", e.to_string()))?;
    llmgw_convo::Convo::new(&target)
        .load(&convo)
        .await
        .map_err(|e| half("the people were, the threads and notes were", e.to_string()))?;
    let ((people, claims), (threads, notes)) = (rows.counts(), convo.counts());
    // A SQLite target's file alone holds the copy.
    target.fold_wal().await;
    // Said once whole: the export file it went through is gone. Written,
    // not printed: a reader that has gone (`| head -1`) is an error the
    // caller takes quietly, where `println!` panicked.
    let mut out = std::io::stdout().lock();
    match log {
        Some(log) => writeln!(
            out,
            "copied {} events from {} to {} (the chain head is {})",
            log.written,
            source.redacted(),
            dest.redacted(),
            crate::events::head_of(&log)
        )?,
        None => writeln!(
            out,
            "the log of {} is empty: no event to copy",
            source.redacted()
        )?,
    }
    writeln!(
        out,
        "copied {people} people, {claims} claim links, {threads} threads and {notes} notes into {} (sessions stay behind: people sign in again)",
        dest.redacted()
    )?;
    Ok(Outcome::Ok)
}

/// When a held append lease runs out, as a refusal says it: " until
/// TIME (in N s)". A holder that crashed (a killed server or import)
/// holds it until then, and nothing need be done but wait; said, an
/// operator waits rather than hunts for a server that is not there.
pub(crate) fn lease_runs_out(expires_at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    let Some(at) = expires_at else {
        return String::new();
    };
    let left = (at - chrono::Utc::now()).num_seconds().max(0);
    format!(" until {} (in {left} s)", crate::events::filter::when(at))
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
