//! Writing with no server running: the CLI takes the append lease for the
//! length of one decision, so offline decisions are serialised with each
//! other and with servers (two `keys create` for one name cannot both pass
//! their checks).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use llmgw_domain::Command;
use llmgw_eventstore::{AnyStore, EventStore, Lease, StoreError, Writer};

use crate::{DecideError, Decided, Decider, Origin};

/// How long a CLI holds the lease at most if it dies mid-command.
pub const LEASE_TTL: Duration = Duration::from_secs(30);
/// How long to wait for another CLI's short hold before giving up.
pub const WAIT_FOR_CLI: Duration = Duration::from_secs(10);
/// Holders named so are short-lived CLI commands, worth waiting for.
pub const CLI_HOLDER_PREFIX: &str = "cli-";

const RETRY_EVERY: Duration = Duration::from_millis(50);

/// Decides and appends `commands` under the append lease, then releases
/// it (also on error). Refuses with [`DecideError::LeaseHeld`] when a
/// server holds the lease: the command belongs to that server's admin API.
pub async fn execute(
    store: &AnyStore,
    origin: &Origin,
    commands: Vec<Command>,
) -> Result<Decided, DecideError> {
    let holder = holder();
    let lease = acquire(store, &holder).await?;
    let decider = Decider::new(store.clone(), holder);
    let result = decider
        .execute(&Writer::Leader(lease.token.clone()), origin, commands)
        .await;
    if let Err(e) = store.release_lease(&lease.token).await {
        tracing::warn!(error = %e, "could not release the append lease; it expires on its own");
    }
    result
}

/// Records a refusal decided before the decider was asked (an observer's
/// record, no lease needed), named as a decision here would name its
/// writer.
pub async fn record_refused(
    store: &AnyStore,
    origin: &Origin,
    command: &Command,
    rejection: &llmgw_domain::Rejection,
) {
    Decider::new(store.clone(), holder())
        .record_refused(origin, command, rejection)
        .await;
}

/// `cli-<pid>-<n>`: unique per call, so that two calls in one process do
/// not take the lease from each other (a holder may re-acquire its own).
fn holder() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{CLI_HOLDER_PREFIX}{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn acquire(store: &AnyStore, holder: &str) -> Result<Lease, DecideError> {
    let deadline = tokio::time::Instant::now() + WAIT_FOR_CLI;
    loop {
        match store.acquire_lease(holder, LEASE_TTL).await {
            Ok(lease) => return Ok(lease),
            Err(StoreError::LeaseHeld { holder: h, .. })
                if h.starts_with(CLI_HOLDER_PREFIX) && tokio::time::Instant::now() < deadline =>
            {
                // Another CLI's one decision: it releases within moments.
                tokio::time::sleep(RETRY_EVERY).await;
            }
            Err(StoreError::LeaseHeld { holder, epoch, .. }) => {
                return Err(DecideError::LeaseHeld { holder, epoch });
            }
            Err(e) => return Err(e.into()),
        }
    }
}
