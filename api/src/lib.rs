//! Wire contracts: the agent protocol (protobuf over tonic) and the admin
//! API's JSON types, shared by the server, the agent and the CLI.
//!
//! What must not: server-side dependencies. The agent links this crate and
//! nothing else of the server's.

pub mod admin;

/// How a standby refuses an agent's stream: gRPC `UNAVAILABLE` with these
/// metadata keys, so that the agent knows whom to dial and when to ask
/// again instead of backing off as from a server it cannot reach.
pub mod refusal {
    /// Milliseconds until the refusing server may lead (the current lease's
    /// expiry), or until it is worth asking again when no lease is held.
    pub const RETRY_AFTER_MS: &str = "retry-after-ms";
    /// The instance that holds the lease, when one does.
    pub const LEADER: &str = "llmgw-leader";
    /// Where the leader takes agent streams, as it advertised on taking
    /// office (`http://…` or `https://…`).
    pub const LEADER_AGENT: &str = "llmgw-leader-agent";
}

/// The agent protocol, generated from `proto/llmgw/v1/agent.proto`.
#[allow(
    missing_debug_implementations,
    clippy::unwrap_used,
    clippy::large_enum_variant,
    reason = "generated code"
)]
pub mod v1 {
    tonic::include_proto!("llmgw.v1");
}

pub use v1::agent_service_client::AgentServiceClient;
pub use v1::agent_service_server::{AgentService, AgentServiceServer};
pub use v1::{AgentMessage, ControlMessage, agent_message, control_message};
