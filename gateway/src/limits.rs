//! What a key may spend: requests and tokens per minute, counted here (each
//! gateway counts its own traffic: two gateways behind a balancer admit up
//! to twice the rate), and budgets, read from the usage view the log builds
//! (so every gateway sees every gateway's spend, a moment late).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

const MINUTE: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct Window {
    requests: VecDeque<Instant>,
    tokens: VecDeque<(Instant, u64)>,
    token_sum: u64,
}

impl Window {
    fn expire(&mut self, now: Instant) {
        while self
            .requests
            .front()
            .is_some_and(|t| now.duration_since(*t) >= MINUTE)
        {
            self.requests.pop_front();
        }
        while let Some(&(t, n)) = self.tokens.front() {
            if now.duration_since(t) < MINUTE {
                break;
            }
            self.tokens.pop_front();
            self.token_sum -= n;
        }
    }
}

/// Why a request was not admitted, and how long until it would be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Requests { rpm: u32, wait: Duration },
    Tokens { tpm: u32, wait: Duration },
}

/// Each key's requests and tokens in the last minute.
#[derive(Debug, Default)]
pub struct RateLimits {
    windows: Mutex<HashMap<String, Window>>,
}

impl RateLimits {
    /// Counts a request of `key` against its limits. Tokens are known only
    /// once a request ends, so `tpm` refuses a key that has already used
    /// its minute's tokens.
    pub fn admit(
        &self,
        key: &str,
        rpm: Option<u32>,
        tpm: Option<u32>,
        now: Instant,
    ) -> Result<(), Refusal> {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let w = windows.entry(key.to_owned()).or_default();
        w.expire(now);
        let until_free =
            |t: Option<Instant>| MINUTE.saturating_sub(now.duration_since(t.unwrap_or(now)));
        if let Some(tpm) = tpm
            && w.token_sum >= u64::from(tpm)
        {
            return Err(Refusal::Tokens {
                tpm,
                wait: until_free(w.tokens.front().map(|(t, _)| *t)),
            });
        }
        if let Some(rpm) = rpm
            && w.requests.len() >= rpm as usize
        {
            return Err(Refusal::Requests {
                rpm,
                wait: until_free(w.requests.front().copied()),
            });
        }
        if rpm.is_some() {
            w.requests.push_back(now);
        }
        Ok(())
    }

    /// A finished request's tokens, counted against the key's next minute.
    pub fn spent(&self, key: &str, tokens: u64, now: Instant) {
        if tokens == 0 {
            return;
        }
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let w = windows.entry(key.to_owned()).or_default();
        w.expire(now);
        w.tokens.push_back((now, tokens));
        w.token_sum += tokens;
    }
}
