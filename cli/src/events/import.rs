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
    /// The people the file's `UserErased` events erased, as they pass
    /// (those already present too): the store takes the lines by value.
    erased: Erased,
}

/// User ids of the `UserErased` events read, shared with the import.
type Erased = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

impl Lines {
    /// The people whose erasure the file holds, read so far (all of them
    /// once the import is done).
    pub(super) fn erased(&self) -> Erased {
        self.erased.clone()
    }

    fn note(&self, e: &RecordedEvent) {
        if e.event_type != "UserErased" {
            return;
        }
        if let Some(id) = e.payload.get("user_id").and_then(|v| v.as_str()) {
            let mut erased = self.erased.lock().unwrap_or_else(|p| p.into_inner());
            erased.push(id.to_owned());
        }
    }
}

impl Iterator for Lines {
    type Item = Result<RecordedEvent, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if let Some(first) = self.pending.take() {
            self.note(&first);
            return Some(Ok(first));
        }
        match self.file.next_event() {
            Ok(Some(e)) => {
                self.note(&e);
                Some(Ok(e))
            }
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
        erased: Erased::default(),
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
            StoreError::LeaseHeld {
                holder, expires_at, ..
            } => {
                let until = crate::store::lease_runs_out(Some(expires_at));
                // A killed import's lease, or a crashed server's, has no
                // one to stop: it is waited out.
                if holder.starts_with("import-") {
                    anyhow::anyhow!(
                        "an import appends under the append lease, and another import, {holder}, holds it{until}: one that was killed holds it until then, and it frees itself: import after that"
                    )
                } else {
                    anyhow::anyhow!(
                        "an import appends under the append lease, and {holder} holds it{until}: stop the server that holds it (a stop releases it at once); a server that crashed holds it until then, and it frees itself: import after that"
                    )
                }
            }
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

/// The people table follows the log's erasures: an erasure imported into
/// a copy (a standby's store, a restored backup) left the person's email
/// and name there, listed by `users list`, while the log said they were
/// erased. Each person a `UserErased` of the file names (written now, or
/// present from an earlier import) loses what the table still holds of
/// them. Who lost it, for the caller to say.
pub(super) async fn apply_erasures(
    store: &AnyStore,
    erased: &Erased,
) -> anyhow::Result<Vec<String>> {
    let ids: std::collections::BTreeSet<String> = erased
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let people = llmgw_people::People::new(store, Default::default());
    let mut deleted = Vec::new();
    for id in ids {
        let gone = people.erase(&id).await.map_err(|e| {
            anyhow::anyhow!(
                "the events are imported, but {id}'s personal data could not be deleted from the people table ({e}); run `llmgw users erase {id}`"
            )
        })?;
        if gone {
            deleted.push(id);
        }
    }
    Ok(deleted)
}

/// What an import did to the people table, said after what it wrote.
pub(super) fn tell_erased(deleted: &[String]) {
    if deleted.is_empty() {
        return;
    }
    println!(
        "deleted the personal data of {} the imported log erased ({}) from this store's people table",
        match deleted.len() {
            1 => "1 person".to_owned(),
            n => format!("{n} people"),
        },
        deleted.join(", ")
    );
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
