//! Wire contracts: the agent protocol (protobuf over tonic) and the admin
//! API's JSON types, shared by the server, the agent and the CLI.
//!
//! What must not: server-side dependencies. The agent links this crate and
//! nothing else of the server's.

pub mod admin;
pub mod codec;

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
    /// The lease's epoch as the standby read it: a leader under a lower
    /// one is deposed, and the agent obeys it no more.
    pub const EPOCH: &str = "llmgw-epoch";
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
pub use v1::join_service_client::JoinServiceClient;
pub use v1::join_service_server::{JoinService, JoinServiceServer};
pub use v1::{AgentMessage, ControlMessage, agent_message, control_message};

/// Join tokens as `llmgw ctl node token` prints them:
/// `llmgw-join-<secret>.<pin>`, where the pin is the start of the SHA-256
/// of the authority's certificate (DER), so that the node can check the
/// server it sends the token to before it sends it.
pub mod join_token {
    pub const PREFIX: &str = "llmgw-join-";
    /// Hex characters of the authority's hash in a token: 128 bits.
    pub const PIN_LEN: usize = 32;

    /// The secret and the pin of a token, when it has their shape.
    pub fn split(token: &str) -> Option<(&str, &str)> {
        let rest = token.trim().strip_prefix(PREFIX)?;
        let (secret, pin) = rest.split_once('.')?;
        let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
        (hex(secret) && secret.len() >= 32 && pin.len() == PIN_LEN && hex(pin))
            .then_some((secret, pin))
    }

    pub fn format(secret: &str, pin: &str) -> String {
        format!("{PREFIX}{secret}.{pin}")
    }

    /// The pin of an authority's certificate (DER).
    pub fn pin(ca_der: &[u8]) -> String {
        use sha2::Digest;
        let hash = sha2::Sha256::digest(ca_der);
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        hex[..PIN_LEN].to_owned()
    }
}
