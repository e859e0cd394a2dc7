//! Importing an export verbatim: every event keeps its position,
//! `recorded_at`, epoch and hash, so the copy's chain head is the source's
//! and time travel works on it.
//!
//! This is the one way into the event table besides the append, and it is
//! no back door: the importer must hold the append lease (checked under the
//! control row's lock, like an append's fence), every event's hash is
//! recomputed, and the file must continue the store exactly: an empty store
//! takes a file from position 1 (or, with `from_anchor`, from a stated
//! predecessor hash it cannot check), a store with events takes only a file
//! whose chain links to its head. The whole import is one transaction:
//! refused whole or applied whole.
//!
//! [`ChainCheck`] is the part that needs no store: it checks a file on its
//! own (contiguous positions, each hash over the one before, stream
//! versions without holes, anchors the caller knows).

use std::collections::{BTreeMap, HashMap, HashSet};

use uuid::Uuid;

use crate::{RecordedEvent, Result, StoreError, append, hash};

/// Events written per statement inside the import's transaction.
pub(crate) const CHUNK: usize = 1000;

/// A chunk is written early once its events' text reaches this: a
/// thousand events of a few MiB each (usage batches at their size) were
/// held at once before their statement.
pub(crate) const CHUNK_BYTES: usize = 16 << 20;

/// Whether `chunk` is to be written now: `CHUNK` events, or
/// `CHUNK_BYTES` of their text.
pub(crate) fn chunk_full(chunk: &[Pending], bytes: usize) -> bool {
    chunk.len() >= CHUNK || bytes >= CHUNK_BYTES
}

/// How an import may begin and what it must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// The hash of the event before the file's first one, as the export
    /// carries it (`prev_hash` on its first line) when it starts after
    /// position 1.
    pub prev_hash: Option<[u8; 32]>,
    /// Accept a file that starts after position 1 into an empty store: its
    /// link to the source's earlier events is taken on trust (the store then
    /// begins there, see [`crate::EventStore::base`]).
    pub from_anchor: bool,
    /// Hashes the file must have at these positions: anchors the operator
    /// holds from the source (`HASH@POSITION`), which an edit whose later
    /// hashes were recomputed cannot match.
    pub anchors: Vec<(u64, [u8; 32])>,
}

/// What an import did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// Events written.
    pub written: u64,
    /// Events of the file that the store already held (checked by hash).
    pub present: u64,
    /// Events of the file at or before `base`, where a store begun on
    /// trust (`--from-anchor`) starts: neither held nor written.
    pub before: u64,
    /// The position the store's log begins after (0 for a whole log).
    pub base: u64,
    /// The positions written, if any.
    pub positions: Option<(u64, u64)>,
    /// The store's head and chain head afterwards.
    pub head: u64,
    pub head_hash: [u8; 32],
    /// Set when the import began the log after position 1 on trust: the
    /// position before its first event.
    pub from_anchor: Option<u64>,
}

/// Checks an exported log line by line, on its own: what can be known
/// without the store it came from.
#[derive(Debug, Default)]
pub struct ChainCheck {
    /// The hash the file says precedes its first event.
    start: Option<[u8; 32]>,
    first: Option<u64>,
    last: Option<(u64, [u8; 32])>,
    versions: HashMap<String, u64>,
    ids: HashSet<Uuid>,
    anchors: BTreeMap<u64, [u8; 32]>,
    /// Whether the first event's own hash was checked (against genesis or
    /// the stated predecessor).
    first_linked: bool,
    /// The hash of the file's header line, if it has one.
    header: Option<[u8; 32]>,
    /// An anchor at the position before the first event matched the hash
    /// the file names there.
    anchored_start: bool,
}

impl ChainCheck {
    /// `prev_hash`: the predecessor hash the file states, if it does.
    pub fn new(prev_hash: Option<[u8; 32]>, anchors: &[(u64, [u8; 32])]) -> Self {
        ChainCheck {
            start: prev_hash,
            anchors: anchors.iter().copied().collect(),
            ..Self::default()
        }
    }

    /// The hash before the first event, as the first line names it: only
    /// before any event is checked.
    pub fn set_predecessor(&mut self, prev_hash: Option<[u8; 32]>) {
        if self.first.is_none() {
            self.start = prev_hash;
        }
    }

    /// A capture's header line: before the first event, at most once.
    pub fn header(&mut self, value: &serde_json::Value) -> std::result::Result<(), String> {
        if self.first.is_some() {
            return Err("a header after the first event: a header is the file's first line".into());
        }
        if self.header.is_some() {
            return Err("a second header".into());
        }
        self.header = Some(crate::header_hash(value));
        Ok(())
    }

    /// Checks the next event of the file; the reason when it does not fit.
    pub fn push(&mut self, e: &RecordedEvent) -> std::result::Result<(), String> {
        self.push_canonical(e).map(|_| ())
    }

    /// As [`push`](Self::push), handing back the canonical payload and
    /// metadata it hashed, for a writer to store.
    pub(crate) fn push_canonical(
        &mut self,
        e: &RecordedEvent,
    ) -> std::result::Result<(String, String), String> {
        append::check_stream_id(&e.stream_id)?;
        append::check_event(&e.event_type, e.schema_version, &e.payload, &e.metadata)?;
        let link = match self.last {
            Some((p, _)) if e.position != p + 1 => {
                return Err(format!(
                    "position {} follows {p}; an export is one unbroken range",
                    e.position
                ));
            }
            Some((_, h)) => Some(h),
            None if e.position == 0 => return Err("positions start at 1".into()),
            None if e.position == 1 => match self.start {
                Some(h) if h != hash::GENESIS => {
                    return Err(
                        "position 1 has no predecessor, but the file names a hash before it".into(),
                    );
                }
                _ => Some(hash::GENESIS),
            },
            None => {
                // An anchor at the position just before the file's first
                // is checked against the hash the file says precedes it
                // (an auditor's "everything since my last anchor"), and
                // so vouches for the whole file.
                if let Some(want) = self.anchors.get(&(e.position - 1)) {
                    match self.start {
                        Some(h) if h == *want => self.anchored_start = true,
                        Some(h) => {
                            let (h, want) = shorts(&h, want);
                            return Err(format!(
                                "the file says {h} precedes position {}, not the anchor's {want}: it comes from another log, or was altered",
                                e.position,
                            ));
                        }
                        None => {
                            return Err(format!(
                                "the anchor is at {}, just before the file's first event, but the file names no hash before it",
                                e.position - 1
                            ));
                        }
                    }
                }
                self.start
            }
        };
        let payload = hash::canonical_string(&e.payload);
        let metadata = hash::canonical_string(&e.metadata);
        if let Some(prev) = link {
            let computed = hash::chain_canonical(&prev, &canonical(e, &payload, &metadata));
            if computed != e.hash {
                return Err(if self.last.is_some() || e.position == 1 {
                    "its hash does not match its content and the hash before it; the export was altered".into()
                } else {
                    format!(
                        "its hash does not follow the hash the file names for position {} ({}); the export was altered",
                        e.position - 1,
                        short(&prev)
                    )
                });
            }
        }
        match self.versions.get_mut(e.stream_id.as_str()) {
            Some(v) if e.stream_version != *v + 1 => {
                return Err(format!(
                    "stream {} jumps from version {} to {}",
                    e.stream_id, v, e.stream_version
                ));
            }
            Some(v) => *v = e.stream_version,
            None => {
                if e.stream_version == 0 {
                    return Err(format!("stream {}: versions start at 1", e.stream_id));
                }
                self.versions.insert(e.stream_id.clone(), e.stream_version);
            }
        }
        if !self.ids.insert(e.event_id) {
            return Err(format!("event id {} appears twice in the file", e.event_id));
        }
        if let Some(want) = self.anchors.get(&e.position)
            && *want != e.hash
        {
            let (its, want) = shorts(&e.hash, want);
            return Err(format!(
                "its hash is {its}, not the anchor's {want}: the file was altered at or before position {} (and its later hashes recomputed), or it comes from another log",
                e.position
            ));
        }
        if self.first.is_none() {
            self.first = Some(e.position);
            self.first_linked = link.is_some();
        }
        self.last = Some((e.position, e.hash));
        Ok((payload, metadata))
    }

    /// The file's end: anchors it never reached are refused (a file cut
    /// short, or the wrong file).
    pub fn finish(&self) -> std::result::Result<(), String> {
        let end = self.last.map_or(0, |(p, _)| p);
        if let Some((&at, _)) = self.anchors.range(end + 1..).next() {
            return Err(match self.last {
                Some(_) => format!(
                    "the file ends at position {end}, before the anchor at {at}: it was cut short, or is not the log the anchor names"
                ),
                None => format!("the file holds no events, and the anchor is at {at}"),
            });
        }
        let first = self.first.unwrap_or(1);
        let checked = if self.anchored_start {
            first - 1
        } else {
            first
        };
        if let Some((&at, _)) = self.anchors.range(..checked).next_back() {
            return Err(format!(
                "the anchor at {at} is before the file's first position {}",
                self.first.unwrap_or(1)
            ));
        }
        Ok(())
    }

    /// Checks the export's trailer against the events before it: a file
    /// cut short, or altered at its end, no longer matches its trailer.
    pub fn check_trailer(&self, t: &crate::Trailer) -> std::result::Result<(), String> {
        let (from, to, count) = match (self.first, self.last) {
            (Some(f), Some((l, _))) => (f, l, l - f + 1),
            _ => (0, 0, 0),
        };
        if (t.from, t.to, t.events) != (from, to, count) && !(t.events == 0 && count == 0) {
            return Err(format!(
                "the trailer says the export holds {} events, {}..={}, but the file holds {count} before it ({from}..={to}): lines were cut or added",
                t.events, t.from, t.to
            ));
        }
        if t.last_hash != self.last.map(|(_, h)| h) {
            return Err(
                "the trailer names another hash for the last event: the file's end was altered"
                    .into(),
            );
        }
        match (t.header_hash, self.header) {
            (None, Some(_)) => Err(
                "the file has a header that its trailer does not name: it was added after the export".into(),
            ),
            (Some(_), None) => Err("the trailer names a header the file lacks: it was removed".into()),
            (Some(a), Some(b)) if a != b => Err(
                "the header is not the one the trailer names: it was altered after the export".into(),
            ),
            _ => Ok(()),
        }
    }

    /// The first and last position checked.
    pub fn range(&self) -> Option<(u64, u64)> {
        Some((self.first?, self.last?.0))
    }

    /// The last event's position and hash: the file's chain head.
    pub fn head(&self) -> Option<(u64, [u8; 32])> {
        self.last
    }

    /// True when the first event's link was checked (it is position 1, or
    /// the file stated its predecessor's hash).
    pub fn first_linked(&self) -> bool {
        self.first_linked
    }
}

fn canonical<'a>(e: &'a RecordedEvent, payload: &'a str, metadata: &'a str) -> hash::Canonical<'a> {
    hash::Canonical {
        position: e.position,
        stream_id: &e.stream_id,
        stream_version: e.stream_version,
        event_id: e.event_id,
        event_type: &e.event_type,
        schema_version: e.schema_version,
        payload,
        metadata,
        epoch: e.epoch,
        recorded_at_micros: e.recorded_at.timestamp_micros(),
    }
}

/// The first 12 hex digits of a hash, for messages.
pub(crate) fn short(h: &[u8; 32]) -> String {
    hash::to_hex(&h[..6])
}

/// Two hashes a message says differ, as `short` unless their short forms
/// are equal (a change past the 12th digit): then in full, so the reader
/// sees the difference.
pub(crate) fn shorts(a: &[u8; 32], b: &[u8; 32]) -> (String, String) {
    if a[..6] == b[..6] {
        (hash::to_hex(a), hash::to_hex(b))
    } else {
        (short(a), short(b))
    }
}

/// The store's control row as the import found it, under its lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreHead {
    pub(crate) position: u64,
    pub(crate) hash: [u8; 32],
    pub(crate) base: u64,
    pub(crate) base_hash: [u8; 32],
}

/// An event to write, with the canonical text it was hashed over.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) event: RecordedEvent,
    pub(crate) payload: String,
    pub(crate) metadata: String,
}

impl Pending {
    /// The bytes of its text a chunk holds (the parsed event besides).
    pub(crate) fn bytes(&self) -> usize {
        self.payload.len() + self.metadata.len()
    }
}

/// The control row after the import.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ControlUpdate {
    pub(crate) head: u64,
    pub(crate) head_hash: [u8; 32],
    /// The highest epoch among the written events: the control row's epoch
    /// moves up to it, so that the next lease is newer than every event.
    pub(crate) epoch: u64,
    /// Where the log begins, when this import begins it on trust.
    pub(crate) base: Option<(u64, [u8; 32])>,
}

/// One import's progress, between the backend's reads and writes.
#[derive(Debug)]
pub(crate) struct Run {
    check: ChainCheck,
    store: StoreHead,
    from_anchor: bool,
    prev_hash: Option<[u8; 32]>,
    anchored: Option<(u64, [u8; 32])>,
    present: u64,
    before: u64,
    last_present: Option<(u64, [u8; 32])>,
    written: Option<(u64, u64, [u8; 32])>,
    max_epoch: u64,
    /// Stream versions in the store, as the import moves them.
    versions: HashMap<String, u64>,
    touched: HashSet<String>,
}

fn refused(position: u64, reason: impl std::fmt::Display) -> StoreError {
    StoreError::ImportRefused(format!("position {position}: {reason}"))
}

impl Run {
    pub(crate) fn new(store: StoreHead, options: &ImportOptions) -> Self {
        Run {
            check: ChainCheck::new(options.prev_hash, &options.anchors),
            store,
            from_anchor: options.from_anchor,
            prev_hash: options.prev_hash,
            anchored: None,
            present: 0,
            before: 0,
            last_present: None,
            written: None,
            max_epoch: 0,
            versions: HashMap::new(),
            touched: HashSet::new(),
        }
    }

    /// Checks the next event: `Some` when it is to be written, `None` when
    /// the store already holds it.
    pub(crate) fn accept(&mut self, event: RecordedEvent) -> Result<Option<Pending>> {
        let p = event.position;
        let first = self.check.range().is_none();
        let (payload, metadata) = self
            .check
            .push_canonical(&event)
            .map_err(|r| refused(p, r))?;
        let head = self.store.position;
        if first {
            self.check_start(&event)?;
        }
        if p <= head {
            // Already in the store: the chain proves the file and the store
            // agree up to a position where their hashes are equal.
            if p == head && event.hash != self.store.hash {
                let (here, there) = shorts(&self.store.hash, &event.hash);
                return Err(refused(
                    p,
                    format!(
                        "the file's event differs from this store's (hash {here} here, {there} in the file): they are different logs, or one was altered"
                    ),
                ));
            }
            // A store begun on trust holds nothing up to its base.
            if p <= self.store.base {
                self.before += 1;
            } else {
                self.present += 1;
            }
            self.last_present = Some((p, event.hash));
            return Ok(None);
        }
        self.max_epoch = self.max_epoch.max(event.epoch);
        self.written = Some(match self.written {
            Some((f, _, _)) => (f, p, event.hash),
            None => (p, p, event.hash),
        });
        Ok(Some(Pending {
            event,
            payload,
            metadata,
        }))
    }

    /// Whether the file's first event may begin here.
    fn check_start(&mut self, e: &RecordedEvent) -> Result<()> {
        let p = e.position;
        let StoreHead {
            position: head,
            hash: head_hash,
            ..
        } = self.store;
        if head == 0 {
            if p == 1 {
                return Ok(());
            }
            if !self.from_anchor {
                return Err(StoreError::ImportRefused(format!(
                    "this store is empty and the file starts at position {p}, so its link to position {} cannot be checked; import it into a store that holds the same log up to {}, or pass --from-anchor to accept an unverified start",
                    p - 1,
                    p - 1
                )));
            }
            let Some(h) = self.prev_hash else {
                return Err(StoreError::ImportRefused(format!(
                    "the file starts at position {p} but does not name the hash of position {} (was it cut from the front?), which even --from-anchor needs",
                    p - 1
                )));
            };
            self.anchored = Some((p - 1, h));
            return Ok(());
        }
        if p > head + 1 {
            return Err(StoreError::ImportRefused(format!(
                "this store's head is {head} and the file starts at position {p}: positions {}..={} are missing",
                head + 1,
                p - 1
            )));
        }
        if p == head + 1 {
            let named = self.prev_hash.filter(|h| *h != head_hash);
            if named.is_some() || hash::chain(&head_hash, e) != e.hash {
                let (ours, said) = match named {
                    Some(h) => {
                        let (ours, theirs) = shorts(&head_hash, &h);
                        (ours, format!(" (the file names {theirs} before it)"))
                    }
                    None => (short(&head_hash), String::new()),
                };
                return Err(refused(
                    p,
                    format!(
                        "does not follow this store's head at {head} (hash {ours}){said}: the file continues another log (a foreign start)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Streams of the chunk whose version in the store is not yet known.
    pub(crate) fn unknown_streams(&self, chunk: &[Pending]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for p in chunk {
            let s = &p.event.stream_id;
            if !self.versions.contains_key(s) && !out.contains(s) {
                out.push(s.clone());
            }
        }
        out
    }

    /// Records the store's versions of `asked` (absent from `found`: none).
    pub(crate) fn learn_versions(&mut self, asked: Vec<String>, found: HashMap<String, u64>) {
        for s in asked {
            let v = found.get(&s).copied().unwrap_or(0);
            self.versions.insert(s, v);
        }
    }

    /// Each written event continues its stream in the store.
    pub(crate) fn check_versions(&mut self, chunk: &[Pending]) -> Result<()> {
        for p in chunk {
            let e = &p.event;
            // A log that begins at an anchor lacks every stream's events
            // before it: a stream it has not seen may start at any version.
            let before_base = self.store.base > 0 || self.anchored.is_some();
            let v = self.versions.entry(e.stream_id.clone()).or_insert(0);
            if e.stream_version != *v + 1 && !(*v == 0 && before_base) {
                return Err(refused(
                    e.position,
                    format!(
                        "stream {} is at version {} in this store, but the file continues it with version {}",
                        e.stream_id, v, e.stream_version
                    ),
                ));
            }
            *v = e.stream_version;
            if !self.touched.contains(&e.stream_id) {
                self.touched.insert(e.stream_id.clone());
            }
        }
        Ok(())
    }

    /// Whether event ids must be looked up in the store (it held events
    /// before the import).
    pub(crate) fn store_had_events(&self) -> bool {
        self.store.position > 0
    }

    /// `existing`: ids of the chunk already in the store, with their positions.
    pub(crate) fn check_ids(chunk: &[Pending], existing: &[(Uuid, u64)]) -> Result<()> {
        if let Some((id, at)) = existing.first() {
            let p = chunk
                .iter()
                .find(|p| p.event.event_id == *id)
                .map_or(0, |p| p.event.position);
            return Err(refused(
                p,
                format!("event id {id} is already in this store, at position {at}"),
            ));
        }
        Ok(())
    }

    /// The stream versions to store: every stream the import wrote to.
    pub(crate) fn stream_versions(&self) -> Vec<(String, u64)> {
        self.touched
            .iter()
            .map(|s| (s.clone(), self.versions[s]))
            .collect()
    }

    /// After the last event: the position whose hash in the store must be
    /// compared with the file's, when the file ends inside the store.
    pub(crate) fn finish(&self) -> Result<Option<(u64, [u8; 32])>> {
        self.check.finish().map_err(StoreError::ImportRefused)?;
        Ok(match (self.written, self.last_present) {
            (None, Some((p, h))) if p < self.store.position => Some((p, h)),
            _ => None,
        })
    }

    /// `stored`: the store's hash at the position [`finish`](Self::finish)
    /// named, if it has an event there.
    pub(crate) fn check_stored(&self, at: (u64, [u8; 32]), stored: Option<[u8; 32]>) -> Result<()> {
        let (p, want) = at;
        let stored = stored.or((p == self.store.base).then_some(self.store.base_hash));
        match stored {
            Some(h) if h == want => Ok(()),
            Some(h) => {
                let (here, there) = shorts(&h, &want);
                Err(refused(
                    p,
                    format!(
                        "the file's event differs from this store's (hash {here} here, {there} in the file): they are different logs, or one was altered"
                    ),
                ))
            }
            None => Err(refused(
                p,
                format!(
                    "the file ends before this store's first event ({})",
                    self.store.base + 1
                ),
            )),
        }
    }

    /// The control row's new values, if anything was written.
    pub(crate) fn control(&self) -> Option<ControlUpdate> {
        let (_, last, hash) = self.written?;
        Some(ControlUpdate {
            head: last,
            head_hash: hash,
            epoch: self.max_epoch,
            base: self.anchored,
        })
    }

    pub(crate) fn imported(&self) -> Imported {
        let (head, head_hash) = match self.written {
            Some((_, last, h)) => (last, h),
            None => (self.store.position, self.store.hash),
        };
        Imported {
            written: self.written.map_or(0, |(f, l, _)| l - f + 1),
            present: self.present,
            before: self.before,
            base: self.anchored.map_or(self.store.base, |(p, _)| p),
            positions: self.written.map(|(f, l, _)| (f, l)),
            head,
            head_hash,
            from_anchor: self.anchored.map(|(p, _)| p),
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;
    use serde_json::json;

    use super::*;

    fn log(n: u64) -> Vec<RecordedEvent> {
        let mut prev = hash::GENESIS;
        (1..=n)
            .map(|p| {
                let mut e = RecordedEvent {
                    position: p,
                    stream_id: if p % 2 == 0 { "a" } else { "b" }.into(),
                    stream_version: p.div_ceil(2),
                    event_id: Uuid::from_u128(p as u128),
                    event_type: "E".into(),
                    schema_version: 1,
                    payload: json!({"p": p}),
                    metadata: json!({}),
                    epoch: 1,
                    recorded_at: DateTime::from_timestamp_micros(p as i64 * 1000).unwrap(),
                    hash: [0; 32],
                };
                e.hash = hash::chain(&prev, &e);
                prev = e.hash;
                e
            })
            .collect()
    }

    fn check(events: &[RecordedEvent], prev: Option<[u8; 32]>) -> Result<(), String> {
        let mut c = ChainCheck::new(prev, &[]);
        for e in events {
            c.push(e).map_err(|r| format!("{}: {r}", e.position))?;
        }
        c.finish()
    }

    #[test]
    fn a_whole_log_checks_and_a_range_checks_from_its_stated_predecessor() {
        let events = log(6);
        assert_eq!(check(&events, None), Ok(()));
        assert_eq!(check(&events[2..], Some(events[1].hash)), Ok(()));
        let wrong = check(&events[2..], Some(events[0].hash)).unwrap_err();
        assert!(wrong.starts_with("3: its hash does not follow"), "{wrong}");
        // Without a stated predecessor the first link is unchecked, the rest is.
        let mut c = ChainCheck::new(None, &[]);
        for e in &events[2..] {
            c.push(e).unwrap();
        }
        assert!(!c.first_linked());
    }

    #[test]
    fn an_edit_a_gap_a_stream_hole_and_a_rechained_edit_past_an_anchor_are_named() {
        let events = log(6);
        let mut edited = events.clone();
        edited[3].payload = json!({"p": 99});
        assert!(
            check(&edited, None)
                .unwrap_err()
                .starts_with("4: its hash does not match")
        );

        let gap = [events[0].clone(), events[2].clone()];
        assert!(
            check(&gap, None)
                .unwrap_err()
                .contains("position 3 follows 1")
        );

        // Rehash everything after the edit: the file is consistent in
        // itself, and only an anchor at or after the edit exposes it.
        let mut prev = edited[2].hash;
        for e in &mut edited[3..] {
            e.hash = hash::chain(&prev, e);
            prev = e.hash;
        }
        assert_eq!(check(&edited, None), Ok(()));
        let mut c = ChainCheck::new(None, &[(5, events[4].hash)]);
        let err = edited.iter().try_for_each(|e| c.push(e)).unwrap_err();
        assert!(err.contains("not the anchor's"), "{err}");
        // An anchor past the end: the file was cut short.
        let mut c = ChainCheck::new(None, &[(6, events[5].hash)]);
        events[..4].iter().for_each(|e| c.push(e).unwrap());
        assert!(
            c.finish()
                .unwrap_err()
                .contains("ends at position 4, before the anchor at 6")
        );
    }

    /// Hashes said to differ are shown differing: in full when their first
    /// 12 digits agree.
    #[test]
    fn hashes_that_differ_past_their_short_form_are_shown_whole() {
        let events = log(3);
        let mut anchor = events[2].hash;
        anchor[31] ^= 1;
        let mut c = ChainCheck::new(None, &[(3, anchor)]);
        let err = events.iter().try_for_each(|e| c.push(e)).unwrap_err();
        let (its, want) = (hash::to_hex(&events[2].hash), hash::to_hex(&anchor));
        assert!(
            err.starts_with(&format!("its hash is {its}, not the anchor's {want}:")),
            "{err}"
        );
        let mut other = events[2].hash;
        other[0] ^= 1;
        assert_eq!(
            shorts(&events[2].hash, &other),
            (short(&events[2].hash), short(&other))
        );
    }

    /// An anchor at the position just before a range is checked against
    /// the hash the range names there: "everything since my anchor".
    #[test]
    fn an_anchor_just_before_a_range_vouches_for_it() {
        let events = log(6);
        let run = |prev: Option<[u8; 32]>, anchor: [u8; 32]| {
            let mut c = ChainCheck::new(prev, &[(2, anchor)]);
            events[2..].iter().try_for_each(|e| c.push(e))?;
            c.finish()
        };
        assert_eq!(run(Some(events[1].hash), events[1].hash), Ok(()));
        let other = run(Some(events[1].hash), events[0].hash).unwrap_err();
        assert!(other.contains("not the anchor's"), "{other}");
        let unnamed = run(None, events[1].hash).unwrap_err();
        assert!(unnamed.contains("names no hash before it"), "{unnamed}");
        // Earlier than that, it is still no proof of this range.
        let mut c = ChainCheck::new(Some(events[1].hash), &[(1, events[0].hash)]);
        events[2..].iter().for_each(|e| c.push(e).unwrap());
        assert!(c.finish().unwrap_err().contains("before the file's first"));
    }

    #[test]
    fn the_trailer_must_match_the_events_before_it() {
        let events = log(6);
        let trailer = |to: u64, last: &RecordedEvent| crate::Trailer {
            format: 1,
            host: "h".into(),
            log_start: None,
            from: 1,
            to,
            events: to,
            last_hash: Some(last.hash),
            head: 6,
            head_hash: Some(events[5].hash),
            exported_at: DateTime::UNIX_EPOCH,
            header_hash: None,
            signature: None,
        };
        let mut c = ChainCheck::new(None, &[]);
        events.iter().for_each(|e| c.push(e).unwrap());
        assert_eq!(c.check_trailer(&trailer(6, &events[5])), Ok(()));
        let mut cut = ChainCheck::new(None, &[]);
        events[..4].iter().for_each(|e| cut.push(e).unwrap());
        let err = cut.check_trailer(&trailer(6, &events[5])).unwrap_err();
        assert!(
            err.contains("holds 6 events, 1..=6, but the file holds 4"),
            "{err}"
        );
        let mut other = trailer(6, &events[5]);
        other.last_hash = Some(events[4].hash);
        assert!(
            c.check_trailer(&other)
                .unwrap_err()
                .contains("end was altered")
        );
        // Written and read back as the export's last line.
        let mut line = Vec::new();
        crate::write_trailer(&mut line, &trailer(6, &events[5])).unwrap();
        let text = String::from_utf8(line).unwrap();
        assert_eq!(
            crate::parse_line(&text).unwrap(),
            crate::ExportLine::Trailer(Box::new(trailer(6, &events[5])))
        );
    }

    #[test]
    fn a_signed_trailer_checks_and_any_change_to_it_or_its_header_is_named() {
        use crate::signing::{Checked, SigningKey, generate};
        let events = log(3);
        let header = json!({"capture": "x"});
        let key = SigningKey::parse(&generate().unwrap()).unwrap();
        let mut t = crate::Trailer {
            format: 1,
            host: "h".into(),
            log_start: None,
            from: 1,
            to: 3,
            events: 3,
            last_hash: Some(events[2].hash),
            head: 3,
            head_hash: Some(events[2].hash),
            exported_at: DateTime::UNIX_EPOCH,
            header_hash: Some(crate::header_hash(&header)),
            signature: None,
        };
        assert_eq!(t.check_signature(None), Ok(None));
        t.sign(&key);
        let public = key.public();
        assert_eq!(
            t.check_signature(Some(&public)),
            Ok(Some(Checked::Proven(public)))
        );
        let mut moved = t.clone();
        moved.head = 2;
        assert!(
            moved
                .check_signature(None)
                .unwrap_err()
                .starts_with("bad signature")
        );
        // The header must be there, and be the one the trailer names.
        let mut c = ChainCheck::new(None, &[]);
        c.header(&header).unwrap();
        events.iter().for_each(|e| c.push(e).unwrap());
        assert_eq!(c.check_trailer(&t), Ok(()));
        assert!(c.header(&header).is_err(), "a header after the events");
        let mut bare = ChainCheck::new(None, &[]);
        events.iter().for_each(|e| bare.push(e).unwrap());
        assert!(bare.check_trailer(&t).unwrap_err().contains("removed"));
        let mut other = ChainCheck::new(None, &[]);
        other.header(&json!({"capture": "y"})).unwrap();
        events.iter().for_each(|e| other.push(e).unwrap());
        assert!(other.check_trailer(&t).unwrap_err().contains("altered"));
    }
}
