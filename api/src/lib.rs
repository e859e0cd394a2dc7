//! Wire contracts: the agent protocol (protobuf over tonic) and the admin
//! API's JSON types, shared by the server, the agent and the CLI.
//!
//! What must not: server-side dependencies. The agent links this crate and
//! nothing else of the server's.

pub mod admin;

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
