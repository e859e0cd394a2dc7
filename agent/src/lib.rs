//! The node agent: hardware discovery (nvidia-smi, NVML, sysfs InfiniBand),
//! engine launch and supervision, weights and provisioning, and the one
//! outbound stream to the control plane.
//!
//! What must not: any dependency on the server's crates. The agent speaks to
//! the control plane only through `llmgw-api`.
//!
//! So far: GPU discovery through nvidia-smi, GPU classes and health, and
//! InfiniBand adapters from sysfs with the fabric checks. Every parser is
//! tested on captured output and fixture trees, never on the build
//! machine's own hardware.

pub mod discovery;
pub mod engines;
pub mod fetch;
pub mod join;
pub mod metrics;
pub mod provision;
pub mod secrets;
pub mod session;
pub mod state_files;
pub mod supervisor;
