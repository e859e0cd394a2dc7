//! A circuit breaker per endpoint: after `threshold` consecutive failures
//! it opens and the endpoint gets no traffic for `cool_down`; then one
//! probe request is let through (half-open), whose outcome closes it or
//! opens it again. Time is tokio's, so tests run it on paused time.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// Cool-down over: one probe is out, or may go.
    HalfOpen {
        probing: bool,
    },
}

#[derive(Debug)]
pub struct Breaker {
    state: BreakerState,
    threshold: u32,
    cool_down: Duration,
}

impl Breaker {
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        Breaker {
            state: BreakerState::Closed { failures: 0 },
            threshold: threshold.max(1),
            cool_down,
        }
    }

    pub fn state(&mut self) -> BreakerState {
        if let BreakerState::Open { until } = self.state
            && Instant::now() >= until
        {
            self.state = BreakerState::HalfOpen { probing: false };
        }
        self.state
    }

    pub fn is_open(&mut self) -> bool {
        matches!(
            self.state(),
            BreakerState::Open { .. } | BreakerState::HalfOpen { probing: true }
        )
    }

    /// Whether a request may go now; in half-open, this takes the one probe.
    pub fn try_acquire(&mut self) -> bool {
        match self.state() {
            BreakerState::Closed { .. } => true,
            BreakerState::Open { .. } => false,
            BreakerState::HalfOpen { probing: true } => false,
            BreakerState::HalfOpen { probing: false } => {
                self.state = BreakerState::HalfOpen { probing: true };
                true
            }
        }
    }

    pub fn success(&mut self) {
        self.state = BreakerState::Closed { failures: 0 };
    }

    pub fn failure(&mut self) {
        self.state = match self.state() {
            BreakerState::Closed { failures } if failures + 1 < self.threshold => {
                BreakerState::Closed {
                    failures: failures + 1,
                }
            }
            _ => BreakerState::Open {
                until: Instant::now() + self.cool_down,
            },
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_after_three_failures_and_probes_once_after_the_cool_down() {
        let mut b = Breaker::new(3, Duration::from_secs(5));
        b.failure();
        b.failure();
        assert!(b.try_acquire(), "two failures keep it closed");
        b.success();
        b.failure();
        b.failure();
        assert!(b.try_acquire(), "a success resets the count");
        b.failure();
        assert!(b.is_open() && !b.try_acquire());
        tokio::time::advance(Duration::from_millis(4999)).await;
        assert!(!b.try_acquire());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(b.try_acquire(), "the probe");
        assert!(!b.try_acquire(), "only one probe at a time");
        b.failure();
        assert!(
            matches!(b.state(), BreakerState::Open { .. }),
            "a failed probe opens it again"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(b.try_acquire());
        b.success();
        assert_eq!(b.state(), BreakerState::Closed { failures: 0 });
    }
}
