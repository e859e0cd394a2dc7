//! The control plane: command handling, the leadership loop around the append
//! lease, the reconciler, the agent stream service and the admin HTTP API.
//!
//! What must not: hot-path request routing (that is `llmgw-gateway`) or pure
//! decisions (those live in `llmgw-domain`, where they can be tested without
//! a database).
