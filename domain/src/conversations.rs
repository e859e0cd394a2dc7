//! Per-project switches for what the gateway keeps of conversations:
//! threads (a conversation's turns, so a client sends only its new turn)
//! and memory notes (an agent's notes, searchable). Both are off until an
//! operator switches them on, always with a retention: nothing is kept
//! forever. The log records only the switch and who threw it; the text
//! itself lives in its own deletable tables, never in an event.

use serde::{Deserialize, Serialize};

use crate::Rejection;

/// The longest retention an operator may set: ten years, in hours.
pub const MAX_RETAIN_HOURS: u32 = 24 * 365 * 10;

/// Threads kept for a project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadsSetting {
    /// The model's replies are kept too (capped); otherwise only what the
    /// client sent.
    pub capture: bool,
    /// A thread unwritten this long is deleted by the next sweep.
    pub retain_hours: u32,
}

/// Memory notes kept for a project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySetting {
    /// A note unwritten this long is deleted by the next sweep.
    pub retain_hours: u32,
}

/// Retention is mandatory and bounded.
pub fn check_retention(hours: u32) -> Result<(), Rejection> {
    if hours == 0 || hours > MAX_RETAIN_HOURS {
        return Err(Rejection::invalid(format!(
            "the retention must be 1 to {MAX_RETAIN_HOURS} hours: \
             conversations are never kept without one"
        )));
    }
    Ok(())
}
