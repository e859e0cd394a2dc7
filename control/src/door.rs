//! Where an operator command goes. With a control plane, the leader
//! decides it (a standby's admin API forwards the request to the leader,
//! see `forward.rs`). Without one (router-only, or the CLI with no
//! server), each command is decided under the append lease, held for that
//! one decision; while a control plane holds the lease, the refusal is
//! sent on to it (`to_leader.rs`).

use std::sync::{Arc, RwLock};

use llmgw_decider::{Decided, Origin};
use llmgw_domain::Command;
use llmgw_eventstore::AnyStore;
use llmgw_projections::Projections;
use tokio::sync::watch;

use crate::{ControlError, ControlPlane};

#[derive(Debug, Clone)]
pub enum Door {
    Control(Arc<ControlPlane>),
    Lease {
        store: AnyStore,
        views: Arc<RwLock<Projections>>,
        views_at: watch::Receiver<u64>,
    },
}

impl Door {
    pub async fn execute(
        &self,
        origin: &Origin,
        commands: Vec<Command>,
    ) -> Result<Decided, ControlError> {
        match self {
            Door::Control(cp) => cp.execute(origin, commands).await,
            Door::Lease { store, .. } => {
                Ok(llmgw_decider::offline::execute(store, origin, commands).await?)
            }
        }
    }

    /// Records a command refused before it could be decided (a check the
    /// decision cannot make), as the decider records its own refusals.
    pub async fn record_refused(
        &self,
        origin: &Origin,
        command: &Command,
        rejection: &llmgw_domain::Rejection,
    ) {
        match self {
            Door::Control(cp) => cp.record_refused(origin, command, rejection).await,
            Door::Lease { store, .. } => {
                llmgw_decider::offline::record_refused(store, origin, command, rejection).await
            }
        }
    }

    pub fn views(&self) -> Arc<RwLock<Projections>> {
        match self {
            Door::Control(cp) => cp.views(),
            Door::Lease { views, .. } => views.clone(),
        }
    }

    /// Waits (bounded) until this server's views have read `position`, so
    /// that a read after a write sees the write.
    pub async fn views_reach(&self, position: u64) {
        match self {
            Door::Control(cp) => cp.views_reach(position).await,
            Door::Lease { views_at, .. } => crate::reach(views_at.clone(), position).await,
        }
    }
}
