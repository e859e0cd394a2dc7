//! `llmgw events import`: the inverse of `events export`, verbatim.
//!
//! The store writes every event as it was (position, time, epoch, hash) in
//! one transaction, and refuses a file that does not continue its log
//! exactly (see `EventStore::import`). This side reads the file as a
//! stream and checks each line's place in the chain as it goes, so that a
//! refusal names the line, not only the position.

use std::path::{Path, PathBuf};
use std::time::Duration;

use llmgw_eventstore::signing::PublicKey;
use llmgw_eventstore::{
    AnyStore, EventStore, ImportOptions, Imported, RecordedEvent, StoreAddress, StoreError,
};

use super::file::{Anchor, ExportFile};

const TTL: Duration = Duration::from_secs(60);

/// The export's events for the store, each already checked here; a
/// refusal ends the import.
pub(super) struct Lines {
    file: ExportFile,
    pending: Option<RecordedEvent>,
    done: bool,
}

impl Iterator for Lines {
    type Item = Result<RecordedEvent, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if let Some(first) = self.pending.take() {
            return Some(Ok(first));
        }
        match self.file.next_event() {
            Ok(Some(e)) => Some(Ok(e)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(reason) => {
                self.done = true;
                Some(Err(StoreError::ImportRefused(reason)))
            }
        }
    }
}

/// A SQLite file the import is about to create: removed again if the
/// import is refused, so that a refusal leaves nothing behind.
pub(crate) fn new_sqlite_file(address: &str) -> Option<PathBuf> {
    match StoreAddress::parse(address).ok()? {
        StoreAddress::Sqlite(path) if !path.exists() => Some(path),
        _ => None,
    }
}

/// The file's first event, which says where it joins (its predecessor's
/// hash), read before the store is opened: a file that is no export, or
/// holds nothing, neither creates nor migrates a store. None: nothing to
/// import.
pub(super) fn open(
    input: &Path,
    anchors: &[Anchor],
    key: Option<PublicKey>,
) -> anyhow::Result<Option<Lines>> {
    let mut file = ExportFile::open(input, anchors, key)?;
    let first = file
        .next_event()
        .map_err(|r| anyhow::Error::new(StoreError::ImportRefused(r)))?;
    Ok(first.map(|first| Lines {
        file,
        pending: Some(first),
        done: false,
    }))
}

pub(super) async fn run(
    store: &AnyStore,
    lines: Lines,
    from_anchor: bool,
    anchors: &[Anchor],
) -> anyhow::Result<Imported> {
    let prev_hash = lines.file.prev_hash;

    let holder = format!("import-{}", std::process::id());
    let lease = store
        .acquire_lease(&holder, TTL)
        .await
        .map_err(|e| match e {
            StoreError::LeaseHeld { .. } => anyhow::Error::new(e)
                .context("an import appends under the append lease; stop the server that holds it"),
            other => other.into(),
        })?;
    let options = ImportOptions {
        prev_hash,
        from_anchor,
        anchors: anchors.iter().map(|a| (a.position, a.hash)).collect(),
    };
    let result = store.import(&lease.token, &options, lines).await;
    // The import ends the lease itself when the events carry a newer epoch.
    store.release_lease(&lease.token).await?;
    Ok(result?)
}

/// What `events import` says of an import: what was written where, and
/// the head to anchor the next one on.
pub(super) fn tell(done: &Imported) {
    let head = Anchor {
        position: done.head,
        hash: done.head_hash,
    };
    // Events before a store's first (one begun --from-anchor) are neither
    // in it nor written: said apart from those it holds.
    let before = match done.before {
        0 => String::new(),
        n => format!(
            "; {n} lie before this store's first event (its log begins after position {})",
            done.base
        ),
    };
    match done.positions {
        Some((f, l)) => println!(
            "imported {} events at positions {f}..={l}; {} were already present{before}; the chain head is {head}",
            done.written, done.present
        ),
        None if done.before == 0 => println!(
            "imported nothing; all {} events were already present; the chain head is {head}",
            done.present
        ),
        None => println!(
            "imported nothing; {} events were already present{before}; the chain head is {head}",
            done.present
        ),
    }
    if let Some(p) = done.from_anchor {
        println!(
            "the log begins after position {p}, whose hash the file named and nothing here could check (--from-anchor)"
        );
    }
}
