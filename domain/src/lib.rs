//! The pure core of llmgw: the events every cluster change is recorded as,
//! the commands that ask for a change, and the decisions between them.
//!
//! What belongs here: value types, `decide(&State, Command) -> Result<Vec<Event>,
//! Rejection>` and `evolve(&mut State, &Event)` per area (catalog, nodes,
//! replicas, tenancy, usage), catalog validation, limit composition and
//! pricing.
//!
//! What must not: any I/O. No tokio, no sqlx, no clock and no random ids:
//! time and ids are passed in, so that every decision can be replayed and
//! tested deterministically.
//!
//! Each area's events are one enum whose variants are the stable type names
//! stored in the log (see [`event`]); the payload is the variant's fields.
//! Keys appear only as hash and display prefix. Personal data (emails,
//! names of people) is kept out of events altogether, so that erasing a
//! person never means rewriting the log.

pub mod audit;
pub mod catalog;
pub mod clocks;
pub mod conversations;
pub mod demand;
pub mod engine_load;
pub mod event;
pub mod heartbeat;
pub mod ids;
pub mod join;
pub mod nodes;
pub mod placement;
pub mod reconcile;
pub mod registration;
pub mod replicas;
pub mod sizing;
pub mod tenancy;
pub mod time;
pub mod usage;

pub use event::{DecodeError, Event};

/// A command refused, with a reason a person can act on. A rejected command
/// produces no events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("{reason}")]
pub struct Rejection {
    pub code: RejectionCode,
    pub reason: String,
}

/// What kind of refusal, for callers that map it to a status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionCode {
    /// The command itself is malformed or breaks a rule (HTTP 422).
    Invalid,
    /// The thing it names does not exist (HTTP 404).
    NotFound,
    /// It conflicts with the current state (HTTP 409).
    Conflict,
}

impl Rejection {
    pub fn invalid(reason: impl Into<String>) -> Self {
        Rejection {
            code: RejectionCode::Invalid,
            reason: reason.into(),
        }
    }

    pub fn not_found(reason: impl Into<String>) -> Self {
        Rejection {
            code: RejectionCode::NotFound,
            reason: reason.into(),
        }
    }

    pub fn conflict(reason: impl Into<String>) -> Self {
        Rejection {
            code: RejectionCode::Conflict,
            reason: reason.into(),
        }
    }
}

/// A span of milliseconds. Points in time are [`time::UnixMillis`].
pub type Millis = i64;

pub use time::UnixMillis;

/// The decision state of every area, as the log built it. Projections keep
/// their own read models; this is what `decide` reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub catalog: catalog::Catalog,
    pub nodes: nodes::Nodes,
    pub replicas: replicas::Replicas,
    pub tenancy: tenancy::Tenancy,
    pub joining: join::Joining,
}

impl State {
    pub fn evolve(&mut self, event: &Event) {
        match event {
            Event::Catalog(e) => self.catalog.evolve(e),
            Event::Node(e) => {
                self.nodes.evolve(e);
                self.joining.evolve_node(e);
            }
            Event::Join(e) => self.joining.evolve(e),
            Event::Replica(e) => self.replicas.evolve(e),
            Event::Tenancy(e) => self.tenancy.evolve(e),
            Event::Usage(_) | Event::Leadership(_) | Event::Demand(_) | Event::Audit(_) => {}
        }
    }
}

/// Any command, routed to its area's decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Catalog(catalog::CatalogCommand),
    Node(nodes::NodeCommand),
    Replica(replicas::ReplicaCommand),
    Tenancy(tenancy::TenancyCommand),
    Join(join::JoinCommand),
}

impl State {
    pub fn decide(&self, command: Command) -> Result<Vec<Event>, Rejection> {
        if let Command::Tenancy(c) = &command
            && audit::names_a_key(c)
        {
            return Err(Rejection::invalid(
                "that is an API key itself, not an id or a name (a key's id is key-…; `llmgw keys list` shows them)",
            ));
        }
        Ok(match command {
            Command::Catalog(c) => self
                .catalog
                .decide(c)?
                .into_iter()
                .map(Event::Catalog)
                .collect(),
            Command::Node(c) => self.nodes.decide(c)?.into_iter().map(Event::Node).collect(),
            Command::Replica(c) => self
                .replicas
                .decide(c)?
                .into_iter()
                .map(Event::Replica)
                .collect(),
            Command::Tenancy(c) => self
                .tenancy
                .decide(c)?
                .into_iter()
                .map(Event::Tenancy)
                .collect(),
            Command::Join(c) => self.joining.decide(&self.nodes, c)?,
        })
    }
}
