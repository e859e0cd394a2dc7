//! Wire contracts: the agent protocol (protobuf over tonic) and the admin
//! API's JSON types, shared by the server, the agent and the CLI.
//!
//! What must not: server-side dependencies. The agent links this crate and
//! nothing else of the server's.
