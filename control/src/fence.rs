//! The agents' fence, from the control plane's side. Every message to an
//! agent carries the lease epoch its stream was let in under; an agent
//! that has seen a higher epoch carries out nothing from a lower one,
//! says so (`CommandRefused`) and leaves the stream. An agent's word that
//! a higher epoch exists is checked with the store before this server
//! acts on it: a renewal that fails (or does not answer within the ttl)
//! means this server is deposed, and it stops acting at once; one that
//! succeeds means the store went back to an older copy (a restore), and
//! the agent is told to follow this epoch.

use llmgw_api::v1;
use llmgw_domain::ids::NodeId;
use llmgw_eventstore::{EventStore, LeaseToken};

use crate::{ControlError, ControlPlane};

impl ControlPlane {
    /// Whether `token` still leads, by the store's word, after `node` said
    /// it has seen epoch `seen`. Gives up leadership when it does not.
    pub(crate) async fn confirm_lease(
        &self,
        token: &LeaseToken,
        node: &NodeId,
        seen: u64,
    ) -> Result<(), ControlError> {
        let ttl = self.config.lease_ttl;
        let renewed = tokio::time::timeout(ttl, self.store.renew_lease(token, ttl)).await;
        match renewed {
            Ok(Ok(lease)) if lease.token == *token => {
                tracing::warn!(
                    %node,
                    seen,
                    epoch = token.epoch,
                    "node {node} has seen lease epoch {seen}, yet the store renews this leader's epoch {}: the store went back to an older copy (a restore), or the node served another store; it is told to follow this epoch",
                    token.epoch
                );
                Ok(())
            }
            outcome => {
                let why = match outcome {
                    Ok(Ok(lease)) => {
                        format!("the store renewed epoch {} instead", lease.token.epoch)
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("the store did not answer within {ttl:?}"),
                };
                tracing::error!(
                    %node,
                    seen,
                    epoch = token.epoch,
                    error = %why,
                    "deposed: node {node} has seen lease epoch {seen} and the store does not renew this leader's epoch {}; stepping down",
                    token.epoch
                );
                self.lose_leadership(token);
                Err(ControlError::Standby { leader: None })
            }
        }
    }

    /// An agent refused a command of ours: it has seen a higher epoch.
    pub(crate) async fn refused(&self, node: &NodeId, r: v1::CommandRefused) {
        tracing::warn!(
            %node,
            command = %r.command,
            shard = %r.shard_id,
            epoch = r.epoch,
            highest = r.highest,
            "node {node} refused a command ({}) from epoch {}: it has seen epoch {}",
            r.command,
            r.epoch,
            r.highest
        );
        let token = self.lease.borrow().clone();
        if let Some(token) = token
            && r.highest > token.epoch
        {
            let _ = self.confirm_lease(&token, node, r.highest).await;
        }
    }
}
