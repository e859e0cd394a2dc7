//! The pure core of llmgw: ids, commands, events and the decisions that turn
//! one into the other.
//!
//! What belongs here: value types, `decide(&State, Command) -> Result<Vec<Event>,
//! Rejection>` and `evolve(State, &Event)`, catalog validation, placement,
//! limit composition and pricing.
//!
//! What must not: any I/O. No tokio, no sqlx, no clock and no random ids: time
//! and ids are passed in, so that every decision can be replayed and tested
//! deterministically.
