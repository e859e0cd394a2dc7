//! How this process's appends went: their latency, their size and the
//! event types they carried, for the server's metrics page.
//!
//! Every append of domain events goes through a [`crate::Decider`], and a
//! process holds several (the control plane's, the usage batcher's, the
//! pages'), so the figures are kept once per process, in plain atomics:
//! the metrics library stays out of the write path, and reading them never
//! takes a lock an append waits on (the type counts take a short one).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the append latency buckets, in seconds: 1 ms to ~4 s.
pub const SECONDS_BUCKETS: [f64; 13] = [
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
];

/// Upper bounds of the batch size buckets, in events: 1 to 1024.
pub const BATCH_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// A histogram over fixed bounds, lock-free to observe.
#[derive(Debug)]
pub struct Buckets<const N: usize> {
    bounds: [f64; N],
    /// One more than the bounds: the last is everything above them.
    counts: [AtomicU64; N],
    over: AtomicU64,
    /// The sum's f64 bits.
    sum: AtomicU64,
    count: AtomicU64,
}

/// A histogram as read: per-bucket (not cumulative) counts, the last one's
/// bound `f64::MAX` for `+Inf`, as prometheus-client's encoder takes them.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramFigures {
    pub sum: f64,
    pub count: u64,
    pub buckets: Vec<(f64, u64)>,
}

impl<const N: usize> Buckets<N> {
    pub const fn new(bounds: [f64; N]) -> Self {
        Buckets {
            bounds,
            counts: [const { AtomicU64::new(0) }; N],
            over: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, v: f64) {
        match self.bounds.iter().position(|b| v <= *b) {
            Some(i) => self.counts[i].fetch_add(1, Ordering::Relaxed),
            None => self.over.fetch_add(1, Ordering::Relaxed),
        };
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn figures(&self) -> HistogramFigures {
        let mut buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(b, c)| (*b, c.load(Ordering::Relaxed)))
            .collect();
        buckets.push((f64::MAX, self.over.load(Ordering::Relaxed)));
        HistogramFigures {
            sum: f64::from_bits(self.sum.load(Ordering::Relaxed)),
            count: self.count.load(Ordering::Relaxed),
            buckets,
        }
    }
}

/// This process's appends.
#[derive(Debug)]
pub struct AppendStats {
    /// Seconds per append call, refused ones included.
    pub seconds: Buckets<13>,
    /// Events per append call.
    pub batch: Buckets<11>,
    /// Events appended, by type (the domain's vocabulary, so bounded).
    by_type: Mutex<BTreeMap<String, u64>>,
}

impl AppendStats {
    pub const fn new() -> Self {
        AppendStats {
            seconds: Buckets::new(SECONDS_BUCKETS),
            batch: Buckets::new(BATCH_BUCKETS),
            by_type: Mutex::new(BTreeMap::new()),
        }
    }

    /// One append call of `events` that took `took`; `landed` says whether
    /// they are in the log (only those count by type).
    pub fn record<'a>(
        &self,
        took: Duration,
        events: impl IntoIterator<Item = &'a str>,
        landed: bool,
    ) {
        self.seconds.observe(took.as_secs_f64());
        let mut n = 0u64;
        let mut by_type = self.by_type.lock().unwrap_or_else(|p| p.into_inner());
        for t in events {
            n += 1;
            if landed {
                match by_type.get_mut(t) {
                    Some(c) => *c += 1,
                    None => {
                        by_type.insert(t.to_owned(), 1);
                    }
                }
            }
        }
        drop(by_type);
        self.batch.observe(n as f64);
    }

    /// Events appended so far, by type, in name order.
    pub fn by_type(&self) -> Vec<(String, u64)> {
        let by_type = self.by_type.lock().unwrap_or_else(|p| p.into_inner());
        by_type.iter().map(|(t, n)| (t.clone(), *n)).collect()
    }
}

impl Default for AppendStats {
    fn default() -> Self {
        Self::new()
    }
}

static STATS: AppendStats = AppendStats::new();

/// The appends every decider in this process made.
pub fn stats() -> &'static AppendStats {
    &STATS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_count_each_value_once_and_keep_the_sum() {
        let b = Buckets::new([1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 3.0] {
            b.observe(v);
        }
        let f = b.figures();
        assert_eq!(f.count, 4);
        assert_eq!(f.sum, 6.0);
        assert_eq!(f.buckets, vec![(1.0, 2), (2.0, 1), (f64::MAX, 1)]);
    }

    #[test]
    fn only_landed_events_count_by_type_but_every_call_is_timed() {
        let s = AppendStats::new();
        s.record(
            Duration::from_millis(3),
            ["NodeRegistered", "ModelAdded", "ModelAdded"],
            true,
        );
        s.record(Duration::from_millis(5), ["ModelAdded"], false);
        assert_eq!(
            s.by_type(),
            vec![("ModelAdded".into(), 2), ("NodeRegistered".into(), 1)]
        );
        assert_eq!(s.seconds.figures().count, 2);
        let batch = s.batch.figures();
        assert_eq!(batch.sum, 4.0);
        assert_eq!(batch.buckets[0], (1.0, 1), "the one-event call");
        assert_eq!(batch.buckets[2], (4.0, 1), "the three-event call");
    }
}
