//! The hash chain's verification, on demand: recomputing a million hashes
//! takes seconds, so the page runs it when asked (`/admin/events/verify`)
//! and remembers the last result, which the log page shows with its time.
//!
//! Verifying changes nothing, so it is a plain GET and works on the admin
//! listener too (no forms there). One runs at a time: a second request
//! waits for the running one and shows its result.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::extract::State;
use axum::response::Response;
use chrono::{DateTime, Utc};
use llmgw_eventstore::{EventStore, VerifyReport};

use super::row::time_text;
use crate::{Chrome, Viewer, Web, WebError, render};

/// A finished verification, for showing.
#[derive(Debug, Clone)]
pub(crate) struct Verified {
    /// The store it was run on (one process may serve several in tests).
    store: String,
    pub report: VerifyReport,
    pub at: DateTime<Utc>,
    pub millis: u128,
}

impl Verified {
    pub(crate) fn ok(&self) -> bool {
        self.report.is_ok()
    }

    /// The result in a sentence.
    pub(crate) fn summary(&self) -> String {
        let r = &self.report;
        if let Some(p) = r.first_mismatch {
            let before = if p > r.from {
                format!(" Positions {} to {} verify.", r.from, p - 1)
            } else {
                String::new()
            };
            if r.missing {
                format!(
                    "The chain breaks at position {p}: there is no event there, so one was \
                     deleted after it was written.{before}"
                )
            } else {
                format!(
                    "The chain breaks at position {p}: the event there does not match its \
                     stored hash, so it or its hash was changed after it was written.{before}"
                )
            }
        } else if r.head_matches == Some(false) {
            format!(
                "Events {}..={} chain correctly, but the log's recorded chain head differs: \
                 events after {} were removed, or the head was rewritten.",
                r.from, r.to, r.to
            )
        } else if r.checked == 0 {
            "The log is empty: nothing to verify.".to_owned()
        } else {
            format!(
                "OK up to position {}: {} events chain from the first, and the log's \
                 recorded head matches.",
                r.to, r.checked
            )
        }
    }

    pub(crate) fn when(&self) -> String {
        time_text(&self.at)
    }
}

fn last() -> &'static Mutex<Option<Verified>> {
    static LAST: OnceLock<Mutex<Option<Verified>>> = OnceLock::new();
    LAST.get_or_init(|| Mutex::new(None))
}

/// The last verification of this store, if one has run.
pub(crate) fn last_result(store: &impl EventStore) -> Option<Verified> {
    let address = store.address().to_string();
    last()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .filter(|v| v.store == address)
}

/// Verifies the whole chain, or waits for a verification that is already
/// running and takes its result.
async fn run(store: &impl EventStore) -> Result<Verified, WebError> {
    static RUNNING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let asked = Utc::now();
    let _one = RUNNING.lock().await;
    if let Some(v) = last_result(store).filter(|v| v.at >= asked) {
        return Ok(v);
    }
    let started = Instant::now();
    let report = store
        .verify(1, None)
        .await
        .map_err(|e| WebError::Internal(format!("verifying the log: {e}")))?;
    let v = Verified {
        store: store.address().to_string(),
        report,
        at: Utc::now(),
        millis: started.elapsed().as_millis(),
    };
    *last().lock().unwrap_or_else(|p| p.into_inner()) = Some(v.clone());
    Ok(v)
}

#[derive(askama::Template)]
#[template(path = "events/verify.html")]
struct VerifyPage {
    chrome: Chrome,
    verified: Verified,
}

/// `GET /admin/events/verify`.
pub(crate) async fn page(
    State(web): State<Arc<Web>>,
    viewer: Viewer,
) -> Result<Response, WebError> {
    let chrome = Chrome::for_viewer(&web, &viewer);
    let Some(store) = &web.store else {
        return super::no_log(chrome);
    };
    let verified = run(store).await?;
    render(&VerifyPage { chrome, verified })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verified(first_mismatch: Option<u64>, head_matches: Option<bool>) -> Verified {
        Verified {
            store: String::new(),
            report: VerifyReport {
                from: 1,
                to: 10,
                checked: first_mismatch.map_or(10, |p| p - 1),
                first_mismatch,
                missing: false,
                head_matches,
            },
            at: Utc::now(),
            millis: 1,
        }
    }

    #[test]
    fn the_summary_says_where_the_chain_breaks_and_what_still_verifies() {
        let broken = verified(Some(4), None);
        assert!(!broken.ok());
        assert!(
            broken
                .summary()
                .starts_with("The chain breaks at position 4")
        );
        assert!(broken.summary().ends_with("Positions 1 to 3 verify."));
        let first = verified(Some(1), None).summary();
        assert!(!first.contains("Positions"), "{first}");
        let head = verified(None, Some(false));
        assert!(!head.ok());
        assert!(head.summary().contains("recorded chain head differs"));
        let ok = verified(None, Some(true));
        assert!(ok.ok());
        assert_eq!(
            ok.summary(),
            "OK up to position 10: 10 events chain from the first, and the log's recorded head matches."
        );
    }
}
