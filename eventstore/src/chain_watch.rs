//! The hash chain verified in the background, a little at a time: each
//! pass checks from the last verified position to the head with
//! [`EventStore::verify`], so an altered event is found within one period
//! of being written, not when somebody thinks of `llmgw events verify`.
//!
//! A broken chain is logged once (per place it breaks) and counted on
//! every pass that finds it, for an alert; the verified position then
//! stays before the damage.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::{EventStore, Result, VerifyReport};

/// What the background verification has established.
#[derive(Debug, Default)]
pub struct ChainWatch {
    /// Every event up to here chains correctly.
    verified: AtomicU64,
    /// Passes that found the chain broken.
    failures: AtomicU64,
}

impl ChainWatch {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The last position known to chain correctly (0: none yet).
    pub fn verified(&self) -> u64 {
        self.verified.load(Ordering::Relaxed)
    }

    /// How many passes found the chain broken.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// One pass from the last verified position to the head. The link into
    /// the first unverified event trusts the last verified one's hash,
    /// which an earlier pass checked.
    pub async fn check<S: EventStore>(&self, store: &S) -> Result<VerifyReport> {
        let report = store.verify(self.verified() + 1, None).await?;
        let reached = match (report.first_mismatch, report.head_matches) {
            (Some(p), _) => p.saturating_sub(1),
            // Every event chains, but the control row's head disagrees:
            // nothing new is established, so the next pass looks again.
            (None, Some(false)) => self.verified(),
            (None, _) => report.to,
        };
        self.verified.fetch_max(reached, Ordering::Relaxed);
        if !report.is_ok() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        Ok(report)
    }

    /// Verifies whenever the log has grown past the verified position, at
    /// most once per `every` (the first pass at once). `reached` is a
    /// position the log has reached as this process follows it (a
    /// server's views'), so nothing is polled. Runs until dropped, or until
    /// `reached` has no sender left.
    pub async fn run<S: EventStore>(
        self: Arc<Self>,
        store: S,
        every: Duration,
        mut reached: tokio::sync::watch::Receiver<u64>,
    ) {
        let mut last_pass: Option<tokio::time::Instant> = None;
        // The failure last logged, so a lasting one is logged once.
        let mut logged: Option<(Option<u64>, Option<bool>)> = None;
        loop {
            let verified = self.verified();
            if reached.wait_for(|p| *p > verified).await.is_err() {
                return;
            }
            if let Some(at) = last_pass {
                tokio::time::sleep_until(at + every).await;
            }
            last_pass = Some(tokio::time::Instant::now());
            match self.check(&store).await {
                Ok(r) if r.is_ok() => logged = None,
                Ok(r) => {
                    let key = (r.first_mismatch, r.head_matches);
                    if logged != Some(key) {
                        match r.first_mismatch {
                            Some(p) if r.missing => tracing::error!(
                                position = p,
                                "the event log's hash chain is broken: there is no event at this position (a row was deleted; see `llmgw events verify`)"
                            ),
                            Some(p) => tracing::error!(
                                position = p,
                                "the event log's hash chain is broken: the event at this position does not match its hash (see `llmgw events verify`)"
                            ),
                            None => tracing::error!(
                                to = r.to,
                                "the event log's hash chain is broken: the events chain, but the recorded chain head differs (see `llmgw events verify`)"
                            ),
                        }
                        logged = Some(key);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not verify the event log's hash chain"),
            }
        }
    }
}
