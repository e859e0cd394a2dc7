//! Incidents captured from real logs with `llmgw events capture`, one
//! module each; capture adds the `mod` line below.

mod node_lost_live;
