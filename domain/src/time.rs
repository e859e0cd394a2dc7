//! The one clock type for points in time: milliseconds since the Unix
//! epoch, as the log records its events. Spans stay [`Millis`]. Decisions
//! never read the clock: the executor reads it once ([`UnixMillis::now`])
//! and passes it in, and the clocks derived from the log use the times the
//! log recorded, so every server computes the same.

use std::ops::{Add, AddAssign, Sub};

use serde::{Deserialize, Serialize};

use crate::Millis;

/// A point in time, in milliseconds since 1970-01-01T00:00:00Z. Serialized
/// as the bare number, as the events before it were.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct UnixMillis(pub i64);

impl UnixMillis {
    /// The wall clock, for executors (never for decisions).
    pub fn now() -> Self {
        UnixMillis(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
        )
    }

    /// The span from `earlier` to this point (negative when it is later).
    pub fn since(self, earlier: UnixMillis) -> Millis {
        self.0 - earlier.0
    }
}

impl Sub for UnixMillis {
    type Output = Millis;

    fn sub(self, earlier: UnixMillis) -> Millis {
        self.since(earlier)
    }
}

impl Add<Millis> for UnixMillis {
    type Output = UnixMillis;

    fn add(self, span: Millis) -> UnixMillis {
        UnixMillis(self.0.saturating_add(span))
    }
}

impl AddAssign<Millis> for UnixMillis {
    fn add_assign(&mut self, span: Millis) {
        *self = *self + span;
    }
}

impl std::fmt::Display for UnixMillis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_between_points_and_points_after_spans() {
        let t = UnixMillis(1_000);
        assert_eq!(t + 500 - t, 500);
        assert_eq!(UnixMillis(0) - t, -1_000);
        assert_eq!(UnixMillis(i64::MAX) + 1, UnixMillis(i64::MAX), "saturates");
        assert_eq!(serde_json::to_string(&t).unwrap(), "1000");
        assert!(UnixMillis::now() > UnixMillis(1_700_000_000_000));
    }
}
