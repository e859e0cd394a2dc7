//! Read models built from the event log: the router, cluster, tenancy and
//! usage views, each a plain struct with `apply(&mut self, &RecordedEvent)`,
//! and the runner that feeds them from a subscription and keeps their
//! checkpoints.
//!
//! What must not: decisions (those are in `llmgw-domain`) or writes to the
//! event log (only `llmgw-eventstore` appends, on behalf of the control plane).
