//! Recorded incidents as event logs (JSON lines), replayed into the
//! projections and the reconciler and compared as insta snapshots.
//!
//! What must not: production code. This crate exists for its tests and the
//! fixtures they read.
