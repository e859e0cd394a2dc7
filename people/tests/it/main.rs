//! People against real PostgreSQL and SQLite stores: every scenario runs on
//! both backends. A person's state (pending, active, ...) is the event log's;
//! here a map stands in for the log's view.

#![allow(clippy::unwrap_used, reason = "in tests an unwrap is an assertion")]

mod support;

mod change;
mod claims;
mod erase;
mod passwords;
mod sessions;
mod signin;
mod signup;
