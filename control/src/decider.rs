//! Commands in, events out: the leader's one door to the log.
//!
//! The decision state is rebuilt from the log before each decision (reading
//! only what was appended since the last one), so a command is always
//! decided against everything any writer appended, and decisions are
//! serialised by one lock. The append itself is fenced by the lease inside
//! the store's transaction: a deposed leader's decision never lands.

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
        loop {
            let page = self.store.read_all(inner.position, 1000).await?;
            let Some(last) = page.last() else {
                return Ok(());
            };
            inner.position = last.position;
            for r in &page {
                match Event::decode(&r.event_type, r.schema_version, &r.payload) {
                    Ok(e) => inner.state.evolve(&e),
                    Err(e) => {
                        tracing::warn!(position = r.position, error = %e, "skipping an event this build cannot read")
                    }
                }
            }
        }
    }

    /// The decision state as of the log's head.
    pub(crate) async fn state(&self) -> Result<State, StoreError> {
        let mut inner = self.inner.lock().await;
        self.catch_up(&mut inner).await?;
        Ok(inner.state.clone())
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
        let mut next = inner.state.clone();
        let mut events = Vec::new();
        for c in commands {
            for e in next.decide(c)? {
                next.evolve(&e);
                events.push(e);
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
        let appended = self.store.append(writer, &batch).await?;
        // Our own events are applied now; anything another writer slipped in
        // before them is read on the next catch-up, which replays from the
        // old position, so apply ours only when nothing came between.
        if appended.first_position == inner.position + 1 {
            inner.state = next;
            inner.position = appended.last_position;
        }
        Ok(Decided {
            events,
            position: appended.last_position,
        })
    }
}
