//! The conversation tables against real PostgreSQL and SQLite stores:
//! every scenario runs on both backends, and search is compared across
//! them.

#![allow(clippy::unwrap_used, reason = "in tests an unwrap is an assertion")]

mod notes;
mod support;
mod threads;
