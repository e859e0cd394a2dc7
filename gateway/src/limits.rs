//! What a key may spend: requests per minute, counted here (each gateway
//! counts its own traffic: two gateways behind a balancer admit up to twice
//! the rate), and budgets, read from the usage view the log builds (so every
//! gateway sees every gateway's spend, a moment late).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

const MINUTE: Duration = Duration::from_secs(60);

/// Each key's requests in the last minute.
#[derive(Debug, Default)]
pub struct RateLimits {
    windows: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl RateLimits {
    /// Counts a request of `key` against `rpm`; when the minute is full,
    /// how long until a slot frees.
    pub fn admit(&self, key: &str, rpm: u32, now: Instant) -> Result<(), Duration> {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let q = windows.entry(key.to_owned()).or_default();
        while q.front().is_some_and(|t| now.duration_since(*t) >= MINUTE) {
            q.pop_front();
        }
        if q.len() >= rpm as usize {
            let oldest = q.front().copied().unwrap_or(now);
            return Err(MINUTE.saturating_sub(now.duration_since(oldest)));
        }
        q.push_back(now);
        Ok(())
    }
}
