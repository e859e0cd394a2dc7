//! The pages through the client listener's router: without accounts, and
//! with accounts on real people tables (SQLite) and the log, the admin API
//! stood in for by a small router that answers what the pages ask.

mod accounts;
mod anonymous;
pub(super) mod harness;
mod outage;
mod usage;
