//! Requests for on-demand models, as an observed fact any server records.
//!
//! The leader keeps demand in memory from its own gateway; a standby's
//! gateway (behind the same load balancer) records it in the log instead,
//! rate-limited, so the leader starts the model whichever server the
//! request reached.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum DemandEvent {
    ModelDemanded { model: String },
}
