//! Commands in, events out: the leader's one door to the log.
//!
//! The decision state follows the log: before each decision it reads what
//! was appended since the last one, so a command is always decided against
//! everything any writer appended, and decisions are serialised by one
//! lock. The append itself is fenced by the lease inside the store's
//! transaction: a deposed leader's decision never lands.
//!
//! Decisions evolve the state in place (no copy per command: a fleet's
//! registrations would make that quadratic). Only the leader appends
//! cluster events, and each area of the state has one writer, so when
//! another writer's events (usage, tenancy) land between a catch-up and our
//! append, applying ours first and theirs on the next catch-up gives the
//! same state; our own positions are then skipped when they are read back.

use std::collections::BTreeSet;

use llmgw_domain::{Command, Event, State};
use llmgw_eventstore::{
    AnyStore, EventStore, ExpectedVersion, NewEvent, StoreError, StreamAppend, Writer,
};
use tokio::sync::Mutex;

use crate::ControlError;

#[derive(Debug)]
pub(crate) struct Decider {
    store: AnyStore,
    inner: Mutex<Inner>,
    instance: String,
}

/// What a command appended, and the log position after it.
#[derive(Debug)]
pub(crate) struct Decided {
    pub(crate) events: Vec<Event>,
    pub(crate) position: u64,
}

#[derive(Debug, Default)]
struct Inner {
    state: State,
    position: u64,
    /// Positions of our own events, already applied, ahead of `position`.
    own: BTreeSet<u64>,
    /// The state holds a decision that did not land: rebuild before use.
    dirty: bool,
    /// On-demand models another server's gateway was asked for, recently.
    demanded: Vec<String>,
}

impl Decider {
    pub(crate) fn new(store: AnyStore, instance: String) -> Self {
        Decider {
            store,
            inner: Mutex::new(Inner::default()),
            instance,
        }
    }

    async fn catch_up(&self, inner: &mut Inner) -> Result<(), StoreError> {
        if inner.dirty {
            *inner = Inner::default();
        }
        loop {
            let page = self.store.read_all(inner.position, 1000).await?;
            let Some(last) = page.last() else {
                return Ok(());
            };
            inner.position = last.position;
            for r in &page {
                if inner.own.remove(&r.position) {
                    continue;
                }
                match Event::decode(&r.event_type, r.schema_version, &r.payload) {
                    Ok(Event::Demand(llmgw_domain::demand::DemandEvent::ModelDemanded {
                        model,
                    })) => {
                        // Old demand (read back when taking office) is no
                        // reason to start a model now.
                        let age = chrono::Utc::now() - r.recorded_at;
                        if age < chrono::Duration::minutes(2) {
                            inner.demanded.push(model);
                        }
                    }
                    Ok(e) => inner.state.evolve(&e),
                    Err(e) => {
                        tracing::warn!(position = r.position, error = %e, "skipping an event this build cannot read")
                    }
                }
            }
        }
    }

    /// On-demand models other servers recorded since the last call.
    pub(crate) async fn take_demanded(&self) -> Vec<String> {
        std::mem::take(&mut self.inner.lock().await.demanded)
    }

    /// Appends an observed fact (no lease needed).
    pub(crate) async fn observe(&self, event: Event) -> Result<(), StoreError> {
        let writer = Writer::Observer {
            instance: self.instance.clone(),
        };
        self.append_event(&writer, event).await
    }

    /// The decision state as of the log's head, copied.
    pub(crate) async fn state(&self) -> Result<State, StoreError> {
        self.read(State::clone).await
    }

    /// Reads the decision state as of the log's head without copying it.
    pub(crate) async fn read<R>(&self, f: impl FnOnce(&State) -> R) -> Result<R, StoreError> {
        let mut inner = self.inner.lock().await;
        self.catch_up(&mut inner).await?;
        Ok(f(&inner.state))
    }

    /// Appends an event that records a fact about this server rather than a
    /// decision over the state (leadership changes).
    pub(crate) async fn append_event(
        &self,
        writer: &Writer,
        event: Event,
    ) -> Result<(), StoreError> {
        let (t, v, payload) = event.encode();
        let new = NewEvent::new(t, v, payload)
            .with_metadata(serde_json::json!({ "writer": self.instance }));
        self.store
            .append(
                writer,
                &[StreamAppend::new(
                    event.stream_id(),
                    ExpectedVersion::Any,
                    vec![new],
                )],
            )
            .await?;
        Ok(())
    }

    /// Decides each command in turn against the state its predecessors left
    /// and appends all their events as one batch; a rejection appends
    /// nothing.
    pub(crate) async fn execute(
        &self,
        writer: &Writer,
        commands: Vec<Command>,
    ) -> Result<Decided, ControlError> {
        let mut inner = self.inner.lock().await;
        self.catch_up(&mut inner).await?;
        let mut events = Vec::new();
        for c in commands {
            match inner.state.decide(c) {
                Ok(new) => {
                    for e in &new {
                        inner.state.evolve(e);
                    }
                    events.extend(new);
                }
                Err(r) => {
                    // Earlier commands of this batch are in the state but
                    // will not be appended.
                    inner.dirty |= !events.is_empty();
                    return Err(r.into());
                }
            }
        }
        if events.is_empty() {
            return Ok(Decided {
                events,
                position: inner.position,
            });
        }
        // Consecutive events of one stream travel together; order is kept.
        let mut batch: Vec<StreamAppend> = Vec::new();
        for e in &events {
            let (t, v, payload) = e.encode();
            let event = NewEvent::new(t, v, payload)
                .with_metadata(serde_json::json!({ "writer": self.instance }));
            let stream = e.stream_id();
            match batch.last_mut() {
                Some(last) if last.stream_id == stream => last.events.push(event),
                _ => batch.push(StreamAppend::new(stream, ExpectedVersion::Any, vec![event])),
            }
        }
        let appended = match self.store.append(writer, &batch).await {
            Ok(a) => a,
            Err(e) => {
                inner.dirty = true;
                return Err(e.into());
            }
        };
        if appended.first_position == inner.position + 1 {
            inner.position = appended.last_position;
        } else {
            inner
                .own
                .extend(appended.first_position..=appended.last_position);
        }
        Ok(Decided {
            events,
            position: appended.last_position,
        })
    }
}
