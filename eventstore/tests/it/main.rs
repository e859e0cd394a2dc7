//! The event store's integration tests: one conformance suite, run against a
//! real PostgreSQL and a real SQLite file alike.

#![allow(clippy::unwrap_used, reason = "in tests an unwrap is an assertion")]

mod support;

mod browse;
mod conformance;
mod fencing;
mod group_commit;
mod head_known;
mod import;
mod properties;
mod subscriptions;
mod tamper;
mod text_reads;
