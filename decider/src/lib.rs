//! The one door to the log: the only code that turns commands into events.
//!
//! What belongs here: deciding commands against the state as of the log's
//! head and appending their events with the real expected version of every
//! stream written, fenced by the lease ([`Decider::execute`]); the observer
//! path for facts that any server records ([`Decider::observe`]: usage,
//! demand, refused commands); facts about a server itself
//! ([`Decider::record`]: leadership); and writing with no server running
//! ([`offline::execute`], under the lease). Every event's metadata names
//! the writer, the actor and the command ([`Origin`]).
//!
//! What must not: the decisions themselves (`llmgw-domain`), storage
//! (`llmgw-eventstore`), or anything about transport. The control plane,
//! the CLI, the gateway's usage batcher and the incident recorder all write
//! through here.

pub mod appends;
mod decider;
#[cfg(feature = "test-hooks")]
pub mod hooks;
pub mod offline;
mod origin;

use llmgw_domain::Rejection;
use llmgw_eventstore::StoreError;

pub use decider::{Decided, Decider, MAX_TRIES};
pub use origin::{Actor, Origin, actor_of};

/// Why a command did not land.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The domain refused it; nothing was written (but an operator's refusal
    /// is recorded as an audit event).
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error("the event store: {0}")]
    Store(#[from] StoreError),
    #[error(
        "stream {stream} kept changing while this command was decided ({tries} tries); nothing was written: try again"
    )]
    Conflict { stream: String, tries: u32 },
    #[error("{}", lease_held(holder, *epoch))]
    LeaseHeld { holder: String, epoch: u64 },
}

fn lease_held(holder: &str, epoch: u64) -> String {
    if holder.starts_with(offline::CLI_HOLDER_PREFIX) {
        format!(
            "another llmgw command ({holder}, epoch {epoch}) is still writing; try again in a moment"
        )
    } else {
        format!(
            "the server {holder} leads (epoch {epoch}) and alone may write: send the command through its admin API"
        )
    }
}
