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
    /// Probes let through so far: names the one out, so that only its own
    /// abandonment frees the half-open slot.
    probes: u64,
}

/// What [`Breaker::try_acquire`] let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    Refused,
    Request,
    /// The half-open probe, by number: its outcome closes or reopens the
    /// breaker; given up without one, it frees the slot (`abandon`).
    Probe(u64),
}

impl Breaker {
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        Breaker {
            state: BreakerState::Closed { failures: 0 },
            threshold: threshold.max(1),
            cool_down,
            probes: 0,
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
    pub fn try_acquire(&mut self) -> Pass {
        match self.state() {
            BreakerState::Closed { .. } => Pass::Request,
            BreakerState::Open { .. } => Pass::Refused,
            BreakerState::HalfOpen { probing: true } => Pass::Refused,
            BreakerState::HalfOpen { probing: false } => {
                self.state = BreakerState::HalfOpen { probing: true };
                self.probes += 1;
                Pass::Probe(self.probes)
            }
        }
    }

    /// Probe `n` ended with no outcome (its client left mid-request): the
    /// next request may probe. Without this the breaker stayed half-open
    /// with a probe out for ever, and the endpoint got no traffic again.
    pub fn abandon(&mut self, n: u64) {
        if self.state == (BreakerState::HalfOpen { probing: true }) && self.probes == n {
            self.state = BreakerState::HalfOpen { probing: false };
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
        assert_eq!(
            b.try_acquire(),
            Pass::Request,
            "two failures keep it closed"
        );
        b.success();
        b.failure();
        b.failure();
        assert_eq!(b.try_acquire(), Pass::Request, "a success resets the count");
        b.failure();
        assert!(b.is_open() && b.try_acquire() == Pass::Refused);
        tokio::time::advance(Duration::from_millis(4999)).await;
        assert_eq!(b.try_acquire(), Pass::Refused);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(b.try_acquire(), Pass::Probe(1), "the probe");
        assert_eq!(b.try_acquire(), Pass::Refused, "only one probe at a time");
        b.failure();
        assert!(
            matches!(b.state(), BreakerState::Open { .. }),
            "a failed probe opens it again"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(b.try_acquire(), Pass::Probe(2));
        b.success();
        assert_eq!(b.state(), BreakerState::Closed { failures: 0 });
    }

    /// A probe given up without an outcome frees the slot; an older probe's
    /// abandonment does not free a newer one's.
    #[tokio::test(start_paused = true)]
    async fn an_abandoned_probe_lets_the_next_request_probe() {
        let mut b = Breaker::new(1, Duration::from_secs(5));
        b.failure();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(b.try_acquire(), Pass::Probe(1));
        assert!(b.is_open(), "no traffic while the probe is out");
        b.abandon(1);
        assert!(!b.is_open());
        assert_eq!(b.try_acquire(), Pass::Probe(2));
        b.abandon(1);
        assert_eq!(b.try_acquire(), Pass::Refused, "probe 2 is still out");
        b.success();
        b.abandon(2);
        assert_eq!(
            b.state(),
            BreakerState::Closed { failures: 0 },
            "an outcome stands"
        );
    }
}
