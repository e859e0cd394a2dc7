//! How far a server's views are behind the log, sampled from outside the
//! runner: a runner that is stuck (a slow apply, a store it cannot read)
//! cannot be trusted to report its own lag, so the head is read apart from
//! it and compared with the position the views have reached.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use llmgw_eventstore::{EventStore, StoreError};
use tokio::sync::watch;

/// The views' lag, as last sampled.
#[derive(Debug, Default)]
pub struct Lag {
    events: AtomicU64,
    /// The age in seconds, as f64 bits.
    seconds: AtomicU64,
    /// When the store last answered a sample, and the lag it showed then:
    /// while it cannot be read, the lag grows from there (the views may be
    /// missing anything written since, a revoked key included).
    answered: std::sync::Mutex<Option<(tokio::time::Instant, f64)>>,
}

/// Events not yet applied, and the age of the oldest of them (0 when
/// caught up; never negative, whatever the clocks say).
pub fn lag_of(
    head: u64,
    position: u64,
    oldest_unapplied: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> (u64, f64) {
    let events = head.saturating_sub(position);
    let seconds = match oldest_unapplied {
        Some(at) if events > 0 => ((now - at).num_milliseconds().max(0) as f64) / 1000.0,
        _ => 0.0,
    };
    (events, seconds)
}

impl Lag {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Log head minus the views' position.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// The age of the oldest event the views have not applied.
    pub fn seconds(&self) -> f64 {
        f64::from_bits(self.seconds.load(Ordering::Relaxed))
    }

    /// Samples once: the head against `position` (read before the head, so
    /// the lag is never understated).
    pub async fn sample<S: EventStore>(&self, store: &S, position: u64) -> Result<(), StoreError> {
        let (head, _) = store.head().await?;
        let oldest = if head > position {
            store.event_at(position + 1).await?.map(|e| e.recorded_at)
        } else {
            None
        };
        let (events, seconds) = lag_of(head, position, oldest, Utc::now());
        self.events.store(events, Ordering::Relaxed);
        self.seconds.store(seconds.to_bits(), Ordering::Relaxed);
        *self.answered.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((tokio::time::Instant::now(), seconds));
        Ok(())
    }

    /// A sample the store did not answer: the lag is at least what it was
    /// plus the time since (from now on if it never answered).
    fn unanswered(&self) {
        let now = tokio::time::Instant::now();
        let mut answered = self.answered.lock().unwrap_or_else(|p| p.into_inner());
        let (at, then) = *answered.get_or_insert((now, 0.0));
        let seconds = then + now.duration_since(at).as_secs_f64();
        self.seconds.store(seconds.to_bits(), Ordering::Relaxed);
    }

    /// Samples every `every` until dropped; `position` is the views'.
    pub async fn run<S: EventStore>(
        self: Arc<Self>,
        store: S,
        position: watch::Receiver<u64>,
        every: Duration,
    ) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let at = *position.borrow();
            // A store that does not answer at all (a partition on an open
            // connection) counts as one that fails.
            match tokio::time::timeout(every, self.sample(&store, at)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "cannot sample the views' lag");
                    self.unanswered();
                }
                Err(_) => {
                    tracing::debug!("the store did not answer the views' lag sample in time");
                    self.unanswered();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that stops answering makes the lag grow from its last
    /// answer, so a server cut off from the log shows as behind (it read 0
    /// for as long as the store was gone).
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_sample_grows_the_lag_from_the_last_answer() {
        let lag = Lag::new();
        lag.unanswered();
        assert_eq!(lag.seconds(), 0.0, "never answered: counted from now");
        tokio::time::advance(Duration::from_secs(3)).await;
        lag.unanswered();
        assert_eq!(lag.seconds(), 3.0);
        *lag.answered.lock().unwrap() = Some((tokio::time::Instant::now(), 1.5));
        tokio::time::advance(Duration::from_secs(10)).await;
        lag.unanswered();
        assert_eq!(lag.seconds(), 11.5);
    }

    #[test]
    fn caught_up_is_zero_and_behind_is_the_oldest_unapplied_events_age() {
        let now = Utc::now();
        assert_eq!(lag_of(10, 10, None, now), (0, 0.0));
        assert_eq!(
            lag_of(7, 10, None, now),
            (0, 0.0),
            "ahead reads as caught up"
        );
        let old = now - chrono::Duration::milliseconds(2500);
        assert_eq!(lag_of(12, 10, Some(old), now), (2, 2.5));
        let future = now + chrono::Duration::seconds(3);
        assert_eq!(lag_of(12, 10, Some(future), now), (2, 0.0), "clock skew");
    }
}
