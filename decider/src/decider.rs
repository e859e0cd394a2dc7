//! Commands in, events out.
//!
//! The decision state follows the log: before each decision it reads what
//! was appended since the last one, so a command is always decided against
//! everything any writer appended, and decisions are serialised by one
//! lock. While reading it notes every stream's version; the append then
//! expects exactly those versions for the streams it writes, so an event
//! that lands between the read and the append (another writer's) makes the
//! store refuse ours, and the command is decided again on the new state.
//! The append is also fenced by the lease inside the store's transaction
//! when the writer is a leader: a deposed leader's decision never lands.
//!
//! Decisions evolve the state in place (no copy per command: a fleet's
//! registrations would make that quadratic). A decision that does not land
//! marks the state dirty, and the next read rebuilds it from the log.
//! Observed facts (usage, demand, refusals) change no decision state, so
//! when they land between a catch-up and our append, applying ours first
//! and theirs on the next catch-up gives the same state; our own positions
//! are then skipped when they are read back.

use std::collections::{BTreeSet, HashMap};

use llmgw_domain::audit::AuditEvent;
use llmgw_domain::clocks::Clocks;
use llmgw_domain::{Command, Event, State};
use llmgw_eventstore::{
    AnyStore, Appended, EventStore, ExpectedVersion, NewEvent, StoreError, StreamAppend, Writer,
};
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::{Actor, DecideError, Origin};

/// How often a command is decided again after a concurrent append to a
/// stream it writes, before giving up.
pub const MAX_TRIES: u32 = 3;

/// The one code path that turns commands into events.
#[derive(Debug)]
pub struct Decider {
    store: AnyStore,
    inner: Mutex<Inner>,
    instance: String,
    #[cfg(feature = "test-hooks")]
    before_append: Option<crate::hooks::BeforeAppend>,
}

/// What a command appended, and the log position after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub events: Vec<Event>,
    pub position: u64,
}

#[derive(Debug, Default)]
struct Inner {
    state: State,
    position: u64,
    /// Every stream's version as of `position` (and our own appends).
    versions: HashMap<String, u64>,
    /// Positions of our own events, already applied, ahead of `position`.
    own: BTreeSet<u64>,
    /// The state holds a decision that did not land: rebuild before use.
    dirty: bool,
    /// The reconciler's clocks, as of `position`.
    clocks: Clocks,
    /// On-demand models another server's gateway was asked for, recently,
    /// with when the log recorded each ask.
    demanded: Vec<(String, llmgw_domain::UnixMillis)>,
}

impl Inner {
    fn expected(&self, stream: &str) -> ExpectedVersion {
        match self.versions.get(stream) {
            Some(&v) if v > 0 => ExpectedVersion::Exact(v),
            _ => ExpectedVersion::NoStream,
        }
    }
}

impl Decider {
    /// A decider over `store`; `instance` names this process in every
    /// event's metadata (`"writer"`) and as the observer of facts.
    pub fn new(store: AnyStore, instance: String) -> Self {
        Decider {
            store,
            inner: Mutex::new(Inner::default()),
            instance,
            #[cfg(feature = "test-hooks")]
            before_append: None,
        }
    }

    /// Runs `hook` after each decision, before its append (tests use it to
    /// race another writer deterministically). `hook` gets the try's number,
    /// from 1.
    #[cfg(feature = "test-hooks")]
    pub fn before_append(mut self, hook: crate::hooks::BeforeAppend) -> Self {
        self.before_append = Some(hook);
        self
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    async fn catch_up(&self, inner: &mut Inner) -> Result<(), StoreError> {
        if inner.dirty {
            *inner = Inner::default();
        }
        // Each page's memory is filled again by the next.
        let mut spare = llmgw_eventstore::TextPage::default();
        loop {
            // Payloads as text, decoded straight into events from the page:
            // a leader taking office reads the whole log here.
            let page = self
                .store
                .read_text_page(
                    inner.position,
                    llmgw_eventstore::DEFAULT_PAGE,
                    std::mem::take(&mut spare),
                )
                .await?;
            let Some(last) = page.last_position() else {
                return Ok(());
            };
            inner.position = last;
            for r in page.iter() {
                // In log order, so the last version read is the stream's;
                // the id is copied only for a stream not seen before.
                match inner.versions.get_mut(r.stream_id) {
                    Some(v) => *v = r.stream_version,
                    None => {
                        inner
                            .versions
                            .insert(r.stream_id.to_owned(), r.stream_version);
                    }
                }
                let clocked = Clocks::cares(r.event_type);
                let at = llmgw_domain::UnixMillis(r.recorded_at.timestamp_millis());
                if inner.own.remove(&r.position) {
                    // Applied when decided; its time is known only now.
                    if clocked
                        && let Ok(e) = Event::decode_json(r.event_type, r.schema_version, r.payload)
                    {
                        inner.clocks.observe(&inner.state, &e, at);
                    }
                    continue;
                }
                // The decisions' state has no use for usage, which is most
                // of a busy log (a batch is hundreds of requests): a leader
                // taking office, or catching up on other servers' batches,
                // does not decode it.
                if Event::is_usage(r.event_type) && !clocked {
                    continue;
                }
                match Event::decode_json(r.event_type, r.schema_version, r.payload) {
                    Ok(Event::Demand(llmgw_domain::demand::DemandEvent::ModelDemanded {
                        model,
                    })) => {
                        // Old demand (read back when taking office) is no
                        // reason to start a model now.
                        let age = chrono::Utc::now() - r.recorded_at;
                        if age < chrono::Duration::minutes(2) {
                            inner.demanded.push((model, at));
                        }
                    }
                    Ok(e) => {
                        inner.state.evolve(&e);
                        if clocked {
                            inner.clocks.observe(&inner.state, &e, at);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(position = r.position, error = %e, "skipping an event this build cannot read")
                    }
                }
            }
            spare = page;
        }
    }

    /// On-demand models other servers recorded up to the log's head, each
    /// with when it was asked for (the log's time: a demand read back by a
    /// new leader counts from then, not from its taking office).
    pub async fn take_demanded(
        &self,
    ) -> Result<Vec<(String, llmgw_domain::UnixMillis)>, StoreError> {
        let mut inner = self.inner.lock().await;
        self.catch_up(&mut inner).await?;
        Ok(std::mem::take(&mut inner.demanded))
    }

    /// The decision state as of the log's head, copied.
    pub async fn state(&self) -> Result<State, StoreError> {
        self.read(State::clone).await
    }

    /// Reads the decision state as of the log's head without copying it.
    pub async fn read<R>(&self, f: impl FnOnce(&State) -> R) -> Result<R, StoreError> {
        let mut inner = self.inner.lock().await;
        self.catch_up(&mut inner).await?;
        Ok(f(&inner.state))
    }

    /// Reads the decision state and the reconciler's clocks (when drains
    /// began, failures in a row: times the log recorded) as of the log's
    /// head.
    pub async fn read_with_clocks<R>(
        &self,
        f: impl FnOnce(&State, &Clocks) -> R,
    ) -> Result<R, StoreError> {
        let mut inner = self.inner.lock().await;
        self.catch_up(&mut inner).await?;
        Ok(f(&inner.state, &inner.clocks))
    }

    /// Appends observed facts (usage, demand, refusals): no decision, no
    /// lease, any server may record them. Events of one stream travel
    /// together, in one append. An empty list is refused by the store.
    pub async fn observe(
        &self,
        origin: &Origin,
        events: Vec<Event>,
    ) -> Result<Appended, StoreError> {
        let writer = Writer::Observer {
            instance: self.instance.clone(),
        };
        let batch = group(&events, origin, &self.instance, |_| ExpectedVersion::Any);
        self.append(&writer, &batch).await
    }

    /// Appends observed facts under ids the caller chose and keeps: a
    /// retry of an append whose outcome was unknown (the connection broke
    /// around its commit) lands nothing twice, since the store answers a
    /// batch it already holds with the first append's positions
    /// (`Appended::deduplicated`). Retry with the same ids, origin and
    /// order.
    pub async fn observe_once(
        &self,
        origin: &Origin,
        events: &[(Uuid, Event)],
    ) -> Result<Appended, StoreError> {
        let writer = Writer::Observer {
            instance: self.instance.clone(),
        };
        let batch = group_ids(
            events.iter().map(|(id, e)| (*id, e)),
            origin,
            &self.instance,
            |_| ExpectedVersion::Any,
        );
        self.append(&writer, &batch).await
    }

    /// Appends a fact about this server rather than a decision over the
    /// state (leadership acquired or released), under `writer`'s fence.
    pub async fn record(
        &self,
        writer: &Writer,
        origin: &Origin,
        event: Event,
    ) -> Result<Appended, StoreError> {
        let batch = group(std::slice::from_ref(&event), origin, &self.instance, |_| {
            ExpectedVersion::Any
        });
        self.append(writer, &batch).await
    }

    /// Every append of this crate: timed and counted for the metrics page
    /// ([`crate::appends::stats`]).
    async fn append(
        &self,
        writer: &Writer,
        batch: &[StreamAppend],
    ) -> Result<Appended, StoreError> {
        let began = std::time::Instant::now();
        let result = self.store.append(writer, batch).await;
        let types = batch
            .iter()
            .flat_map(|s| s.events.iter().map(|e| e.event_type.as_str()));
        crate::appends::stats().record(began.elapsed(), types, result.is_ok());
        result
    }

    /// Decides each command in turn against the state its predecessors
    /// left and appends all their events as one batch, expecting every
    /// written stream at the version the decision saw. A rejection appends
    /// nothing (an operator's is recorded as a refusal); a concurrent append
    /// to a written stream means deciding again, at most [`MAX_TRIES`]
    /// times.
    pub async fn execute(
        &self,
        writer: &Writer,
        origin: &Origin,
        commands: Vec<Command>,
    ) -> Result<Decided, DecideError> {
        let mut inner = self.inner.lock().await;
        let mut conflict = String::new();
        for attempt in 1..=MAX_TRIES {
            self.catch_up(&mut inner).await?;
            let events = match decide(&mut inner, &commands) {
                Ok(events) => events,
                Err((command, rejection)) => {
                    drop(inner);
                    self.record_refused(origin, command, &rejection).await;
                    return Err(DecideError::Rejected(rejection));
                }
            };
            if events.is_empty() {
                return Ok(Decided {
                    events,
                    position: inner.position,
                });
            }
            let batch = group(&events, origin, &self.instance, |s| inner.expected(s));
            #[cfg(feature = "test-hooks")]
            if let Some(hook) = &self.before_append {
                (hook.0)(attempt).await;
            }
            match self.append(writer, &batch).await {
                Ok(appended) => {
                    for (stream, version) in &appended.stream_versions {
                        inner.versions.insert(stream.clone(), *version);
                    }
                    if appended.first_position == inner.position + 1 {
                        inner.position = appended.last_position;
                        // Not read back: the clocks take them now (the log
                        // recorded them a moment ago; another server reads
                        // that time).
                        let at = llmgw_domain::UnixMillis::now();
                        let Inner { state, clocks, .. } = &mut *inner;
                        for e in &events {
                            clocks.observe(state, e, at);
                        }
                    } else {
                        inner
                            .own
                            .extend(appended.first_position..=appended.last_position);
                    }
                    return Ok(Decided {
                        events,
                        position: appended.last_position,
                    });
                }
                Err(StoreError::VersionConflict { stream, .. }) => {
                    tracing::info!(%stream, attempt, "another writer appended to a stream this command writes; deciding again");
                    inner.dirty = true;
                    conflict = stream;
                }
                Err(e) => {
                    inner.dirty = true;
                    return Err(e.into());
                }
            }
        }
        Err(DecideError::Conflict {
            stream: conflict,
            tries: MAX_TRIES,
        })
    }

    /// Records an operator's refused command, so that an auditor sees
    /// attempts and not only successes. Best effort: the refusal itself is
    /// what the caller needs. Public for refusals decided beside the log
    /// (a model the leader's configuration file defines).
    pub async fn record_refused(
        &self,
        origin: &Origin,
        command: &Command,
        rejection: &llmgw_domain::Rejection,
    ) {
        let Actor::Operator(actor) = &origin.actor else {
            return;
        };
        // An API key pasted where an id goes is not kept for good.
        let redact = llmgw_domain::audit::redact_secrets;
        let event = Event::Audit(AuditEvent::CommandRefused {
            actor: actor.clone(),
            command: redact(&command.describe()),
            target: redact(&command.target()),
            reason: redact(&rejection.reason),
        });
        if let Err(e) = self.observe(origin, vec![event]).await {
            tracing::warn!(error = %e, command = %redact(&command.describe()), "could not record a refused command");
        }
    }
}

/// Decides `commands` in turn, evolving the state; on a rejection returns
/// the refused command.
fn decide<'c>(
    inner: &mut Inner,
    commands: &'c [Command],
) -> Result<Vec<Event>, (&'c Command, llmgw_domain::Rejection)> {
    let mut events = Vec::new();
    for c in commands {
        match inner.state.decide(c.clone()) {
            Ok(new) => {
                for e in &new {
                    inner.state.evolve(e);
                }
                events.extend(new);
            }
            Err(r) => {
                // Earlier commands of this batch are in the state but will
                // not be appended.
                inner.dirty |= !events.is_empty();
                return Err((c, r));
            }
        }
    }
    Ok(events)
}

/// One append entry per stream, in the order streams first appear; a
/// stream's events keep their order. The store takes a stream once per
/// batch, so a stream that recurs after another joins its first entry.
fn group(
    events: &[Event],
    origin: &Origin,
    instance: &str,
    expected: impl Fn(&str) -> ExpectedVersion,
) -> Vec<StreamAppend> {
    group_ids(
        events.iter().map(|e| (Uuid::now_v7(), e)),
        origin,
        instance,
        expected,
    )
}

/// [`group`] with each event's id given.
fn group_ids<'e>(
    events: impl Iterator<Item = (Uuid, &'e Event)>,
    origin: &Origin,
    instance: &str,
    expected: impl Fn(&str) -> ExpectedVersion,
) -> Vec<StreamAppend> {
    let metadata = origin.metadata(instance);
    let mut batch: Vec<StreamAppend> = Vec::new();
    for (id, e) in events {
        let (t, v, payload) = e.encode();
        let event = NewEvent::new(t, v, payload)
            .with_id(id)
            .with_metadata(metadata.clone());
        let stream = e.stream_id();
        match batch.iter_mut().rev().find(|s| s.stream_id == stream) {
            Some(s) => s.events.push(event),
            None => {
                let exp = expected(&stream);
                batch.push(StreamAppend::new(stream, exp, vec![event]));
            }
        }
    }
    batch
}
