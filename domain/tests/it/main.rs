//! The domain's rules, as a user of the control plane would notice them.

mod catalog;
mod events;
mod nodes;
mod properties;
mod replicas;
mod tenancy;
mod usage;
