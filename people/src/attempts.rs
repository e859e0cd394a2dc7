//! Bounded guessing: a fixed window per key (an email, or `pw:<user id>`),
//! in memory, per process.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::time;

/// At this many windows, expired ones are swept out.
const SWEEP_AT: usize = 10_000;
/// At this many live windows, the oldest half is dropped: a flood of
/// distinct keys may loosen the oldest limits but cannot exhaust memory.
const HARD_CAP: usize = 200_000;

pub(crate) struct Attempts {
    max: u32,
    window: Duration,
    soft: usize,
    hard: usize,
    inner: Mutex<Inner>,
}

struct Inner {
    windows: HashMap<String, Window>,
    sweep_at: usize,
}

#[derive(Clone, Copy)]
struct Window {
    count: u32,
    since: DateTime<Utc>,
}

// The keys are email addresses: a debug print shows how many, not whose.
impl std::fmt::Debug for Attempts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let windows = self.lock().windows.len();
        f.debug_struct("Attempts")
            .field("max", &self.max)
            .field("window", &self.window)
            .field("windows", &windows)
            .finish()
    }
}

impl Attempts {
    pub(crate) fn new(max: u32, window: Duration) -> Self {
        Self::with_caps(max, window, SWEEP_AT, HARD_CAP)
    }

    fn with_caps(max: u32, window: Duration, soft: usize, hard: usize) -> Self {
        Attempts {
            max,
            window,
            soft,
            hard,
            inner: Mutex::new(Inner {
                windows: HashMap::new(),
                sweep_at: soft,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The map holds no invariant a panic could break halfway.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts an attempt; whether it may go ahead. The window starts at the
    /// first attempt and never moves: refusals count too, so a lockout
    /// lasts until that first attempt's window has passed.
    pub(crate) fn allow(&self, key: &str, now: DateTime<Utc>) -> bool {
        let mut inner = self.lock();
        if let Some(w) = inner.windows.get_mut(key)
            && !time::more_than(w.since, now, self.window)
        {
            w.count = w.count.saturating_add(1);
            if w.count == self.max + 1 {
                // Once, as the lock begins: someone is guessing. The
                // address is not named (a log is read by more people
                // than the people table, and kept longer).
                tracing::warn!(
                    tries = self.max,
                    window_s = self.window.as_secs(),
                    "sign-in locked for an address after its tries in the window (passwords guessed?)"
                );
            }
            return w.count <= self.max;
        }
        inner.windows.insert(
            key.to_owned(),
            Window {
                count: 1,
                since: now,
            },
        );
        if inner.windows.len() >= inner.sweep_at {
            self.sweep(&mut inner, now);
        }
        1 <= self.max
    }

    /// How many seconds (at least one) until `key`'s window ends, for a
    /// refusal to say when to come back (a page's `Retry-After`).
    pub(crate) fn seconds_left(&self, key: &str, now: DateTime<Utc>) -> u64 {
        let since = self.lock().windows.get(key).map(|w| w.since);
        let passed = since.map_or(0, |s| now.signed_duration_since(s).num_seconds().max(0));
        ((self.window.as_secs() as i64 - passed).max(0) as u64).max(1)
    }

    /// The refusal for a locked `key`: when it ends, in seconds and in
    /// whole minutes (at least one) for the sentence.
    pub(crate) fn locked(&self, key: &str, now: DateTime<Utc>) -> crate::PeopleError {
        let seconds = self.seconds_left(key, now);
        crate::PeopleError::TooManyTries {
            minutes: seconds.div_ceil(60),
            seconds,
        }
    }

    /// A right password forgets the key's window.
    pub(crate) fn clear(&self, key: &str) {
        self.lock().windows.remove(key);
    }

    /// An attempt that never got to check a password (the server was too
    /// busy to hash) is not counted against the key.
    pub(crate) fn refund(&self, key: &str) {
        if let Some(w) = self.lock().windows.get_mut(key) {
            w.count = w.count.saturating_sub(1);
        }
    }

    fn sweep(&self, inner: &mut Inner, now: DateTime<Utc>) {
        let window = self.window;
        inner
            .windows
            .retain(|_, w| !time::more_than(w.since, now, window));
        let keep = self.hard / 2;
        if inner.windows.len() > keep {
            let mut since: Vec<DateTime<Utc>> = inner.windows.values().map(|w| w.since).collect();
            let cut = since.len() - keep;
            since.select_nth_unstable(cut);
            let cutoff = since[cut];
            inner.windows.retain(|_, w| w.since >= cutoff);
        }
        // Sweep again only once the map has doubled: amortised O(1).
        inner.sweep_at = (inner.windows.len() * 2).clamp(self.soft, self.hard);
        tracing::debug!(
            windows = inner.windows.len(),
            "swept sign-in attempt windows"
        );
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().windows.len()
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 0).unwrap()
    }

    #[test]
    fn the_window_is_fixed_from_the_first_attempt() {
        let a = Attempts::new(3, Duration::from_secs(60));
        for i in 0..3 {
            assert!(a.allow("e", t0() + TimeDelta::seconds(i)));
        }
        // Refusals count and do not move the window's start.
        assert!(!a.allow("e", t0() + TimeDelta::seconds(10)));
        assert!(!a.allow("e", t0() + TimeDelta::seconds(60)));
        // Strictly more than the window after the first attempt: fresh.
        assert!(a.allow("e", t0() + TimeDelta::seconds(61)));
        assert!(a.allow("other", t0()));
    }

    /// A lockout says when it ends: in seconds for `Retry-After`, in
    /// whole minutes for the sentence.
    #[test]
    fn a_lockout_says_when_it_ends() {
        let a = Attempts::new(1, Duration::from_secs(900));
        assert!(a.allow("e", t0()));
        assert!(!a.allow("e", t0() + TimeDelta::seconds(100)));
        let e = a.locked("e", t0() + TimeDelta::seconds(100));
        assert!(
            matches!(
                e,
                crate::PeopleError::TooManyTries {
                    minutes: 14,
                    seconds: 800
                }
            ),
            "{e:?}"
        );
        let e = a.locked("e", t0() + TimeDelta::seconds(900));
        assert!(
            matches!(
                e,
                crate::PeopleError::TooManyTries {
                    minutes: 1,
                    seconds: 1
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn clearing_forgets_the_count() {
        let a = Attempts::new(1, Duration::from_secs(60));
        assert!(a.allow("e", t0()));
        assert!(!a.allow("e", t0()));
        a.clear("e");
        assert!(a.allow("e", t0()));
    }

    /// An attempt given back (the server was too busy to check it) leaves
    /// room for one more; nothing is given back below zero.
    #[test]
    fn a_refunded_attempt_is_not_counted() {
        let a = Attempts::new(1, Duration::from_secs(60));
        assert!(a.allow("e", t0()));
        a.refund("e");
        assert!(a.allow("e", t0()), "the refunded one left room");
        assert!(!a.allow("e", t0()));
        a.refund("none");
        assert!(a.allow("none", t0()));
    }

    #[test]
    fn expired_windows_are_swept_when_the_map_grows() {
        let a = Attempts::with_caps(3, Duration::from_secs(60), 10, 1000);
        for i in 0..9 {
            a.allow(&format!("old{i}"), t0());
        }
        assert_eq!(a.len(), 9);
        let later = t0() + TimeDelta::seconds(120);
        a.allow("new", later);
        assert_eq!(a.len(), 1, "expired windows outlived the sweep");
    }

    #[test]
    fn a_flood_of_live_windows_stays_bounded() {
        let a = Attempts::with_caps(3, Duration::from_secs(60), 10, 100);
        for i in 0..1000 {
            a.allow(&format!("k{i}"), t0() + TimeDelta::milliseconds(i));
            assert!(a.len() <= 100, "{} windows", a.len());
        }
        // The newest windows survive, so the newest limits still hold.
        for _ in 0..3 {
            a.allow("k999", t0());
        }
        assert!(!a.allow("k999", t0()));
    }
}
