//! What this machine offers: GPUs, InfiniBand adapters, memory.

pub mod fabric;
pub mod gpu;
pub mod ib;
pub mod memory;
pub mod smi;
