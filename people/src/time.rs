//! Instants as the tables keep them.

use std::time::Duration;

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};

/// `now` at the tables' precision (microseconds), so that what is written
/// reads back equal on both backends.
pub(crate) fn exact(now: DateTime<Utc>) -> DateTime<Utc> {
    now.trunc_subsecs(6)
}

fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

/// `at + d`, saturating: an absurd configured duration means "never".
pub(crate) fn plus(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    at.checked_add_signed(delta(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
        .min(far_future())
}

/// `at - d`, saturating.
pub(crate) fn minus(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    at.checked_sub_signed(delta(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
        .max(far_past())
}

/// Whether more than `d` has passed from `since` to `now`.
pub(crate) fn more_than(since: DateTime<Utc>, now: DateTime<Utc>, d: Duration) -> bool {
    now.signed_duration_since(since) > delta(d)
}

// Both backends store these: PostgreSQL's timestamptz ends in year 294276
// and SQLite's i64 microseconds in 294247.
fn far_future() -> DateTime<Utc> {
    DateTime::from_timestamp(253_402_300_799, 0).unwrap_or(DateTime::<Utc>::MAX_UTC) // 9999-12-31
}

fn far_past() -> DateTime<Utc> {
    DateTime::UNIX_EPOCH
}

pub(crate) fn to_micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

pub(crate) fn from_micros(us: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_micros(us)
}
