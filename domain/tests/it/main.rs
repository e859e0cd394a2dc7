//! The domain's rules, as a user of the control plane would notice them.

mod audit;
mod catalog;
mod conversations;
mod events;
mod heartbeat;
mod join;
mod nodes;
mod placement;
mod properties;
mod reconcile;
mod registration;
mod replicas;
mod tenancy;
mod usage;
