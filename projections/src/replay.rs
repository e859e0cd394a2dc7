//! The views as they stood at a point of the log: what `llmgw events
//! replay` prints and the event-log page shows. Views are the same whether
//! built live or replayed, so a replay may start from any set of views
//! whose checkpoint is not past the point.

use chrono::{DateTime, Utc};
use llmgw_eventstore::{AnyStore, DEFAULT_PAGE, EventStore, StoreError};

use crate::Projections;

/// The last position recorded at or before `t` (0 when nothing was):
/// "as it stood at `t`" includes everything recorded up to it.
pub async fn position_at(store: &AnyStore, t: DateTime<Utc>) -> Result<u64, StoreError> {
    let after = t + chrono::Duration::microseconds(1);
    let first_after = store
        .read_time_range_raw(after, DateTime::<Utc>::MAX_UTC, 0, 1)
        .await?;
    Ok(match first_after.first() {
        Some(e) => e.position - 1,
        None => store.head().await?.0,
    })
}

/// Applies the events after `views`' checkpoint up to position `stop`
/// (inclusive); returns when the last applied one was recorded.
pub async fn replay_to(
    store: &AnyStore,
    views: &mut Projections,
    stop: u64,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let mut recorded_at = None;
    while views.checkpoint.position < stop {
        let page = store
            .read_all(views.checkpoint.position, DEFAULT_PAGE)
            .await?;
        if page.is_empty() {
            break;
        }
        for e in page.iter().take_while(|e| e.position <= stop) {
            views.apply(e);
            recorded_at = Some(e.recorded_at);
        }
        if page.last().is_some_and(|e| e.position >= stop) {
            break;
        }
    }
    Ok(recorded_at)
}
