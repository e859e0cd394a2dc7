//! What a key may spend. Requests and tokens per minute are counted here,
//! one window per level that sets them (a team's rpm counts every key of the
//! team together), at this gateway: two gateways behind a balancer admit up
//! to twice the rate. A request's tokens are estimated from its prompt and
//! charged when it is admitted, so a burst cannot overshoot a tpm, and
//! settled with the engine's count when it ends. Budgets are read from the
//! usage view the log builds (so every gateway's spend counts, a moment
//! late); [`blocking_budget`] is the pure rule.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use llmgw_domain::catalog::Price;
use llmgw_domain::tenancy::{BudgetLevel, RateLevel, Scope};
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
            self.token_sum = self.token_sum.saturating_sub(n);
        }
    }

    /// Why `level` refuses one more request of `estimate` tokens, if it does.
    fn refuses(
        &self,
        level: &RateLevel,
        estimate: u64,
        now: Instant,
    ) -> Option<(Exceeded, Duration)> {
        let until = |t: Instant| MINUTE.saturating_sub(now.duration_since(t));
        if let Some(rpm) = level.rpm
            && self.requests.len() >= rpm as usize
        {
            let wait = self.requests.front().map_or(MINUTE, |t| until(*t));
            return Some((Exceeded::Requests { rpm }, wait));
        }
        let tpm = level.tpm?;
        // An empty window takes one request however large its estimate:
        // otherwise a prompt bigger than the limit could never pass.
        if self.token_sum == 0 || self.token_sum.saturating_add(estimate) <= u64::from(tpm) {
            return None;
        }
        // Until enough of the minute's tokens have aged out.
        let mut left = self.token_sum;
        let mut wait = MINUTE;
        for &(t, n) in &self.tokens {
            left = left.saturating_sub(n);
            wait = until(t);
            if left == 0 || left.saturating_add(estimate) <= u64::from(tpm) {
                break;
            }
        }
        Some((Exceeded::Tokens { tpm }, wait))
    }
}

/// Which limit was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    Requests { rpm: u32 },
    Tokens { tpm: u32 },
}

/// Why a request was not admitted: the level whose limit it met, and how
/// long until that level would take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub scope: Scope,
    pub scope_id: String,
    pub exceeded: Exceeded,
    pub wait: Duration,
}

/// The tokens a request was charged when admitted, per level with a tpm;
/// [`RateLimits::settle`] puts the real count in their place.
#[derive(Debug, Default)]
pub struct Charge {
    levels: Vec<(Scope, String)>,
    tokens: u64,
    at: Option<Instant>,
}

impl Charge {
    pub fn tokens(&self) -> u64 {
        self.tokens
    }
}

/// The windows of every level that limits rates, last minute each.
#[derive(Debug, Default)]
pub struct RateLimits {
    windows: Mutex<HashMap<Scope, HashMap<String, Window>>>,
}

impl RateLimits {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Scope, HashMap<String, Window>>> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a request of about `estimate` tokens if every level admits it
    /// (all or nothing: a refused request counts nowhere), and charges it.
    pub fn admit(
        &self,
        levels: &[RateLevel],
        estimate: u64,
        now: Instant,
    ) -> Result<Charge, Refusal> {
        if levels.is_empty() {
            return Ok(Charge::default());
        }
        let mut windows = self.lock();
        for level in levels {
            let Some(w) = windows
                .get_mut(&level.scope)
                .and_then(|m| m.get_mut(level.scope_id.as_str()))
            else {
                continue;
            };
            w.expire(now);
            if let Some((exceeded, wait)) = w.refuses(level, estimate, now) {
                return Err(Refusal {
                    scope: level.scope,
                    scope_id: level.scope_id.clone(),
                    exceeded,
                    wait,
                });
            }
        }
        let mut charge = Charge {
            levels: Vec::new(),
            tokens: estimate,
            at: Some(now),
        };
        for level in levels {
            let w = window(&mut windows, level.scope, &level.scope_id);
            if level.rpm.is_some() {
                w.requests.push_back(now);
            }
            if level.tpm.is_some() {
                w.tokens.push_back((now, estimate));
                w.token_sum = w.token_sum.saturating_add(estimate);
                charge.levels.push((level.scope, level.scope_id.clone()));
            }
        }
        Ok(charge)
    }

    /// A finished request's real token count in place of its estimate: the
    /// difference is added now, or given back from the admission's entry
    /// (nothing to give back once that has aged out).
    pub fn settle(&self, charge: &Charge, actual: u64, now: Instant) {
        let Some(at) = charge.at else { return };
        if charge.levels.is_empty() || actual == charge.tokens {
            return;
        }
        let mut windows = self.lock();
        for (scope, id) in &charge.levels {
            let w = window(&mut windows, *scope, id);
            w.expire(now);
            if actual > charge.tokens {
                let more = actual - charge.tokens;
                w.tokens.push_back((now, more));
                w.token_sum = w.token_sum.saturating_add(more);
                continue;
            }
            let mut back = charge.tokens - actual;
            // From the newest: the admission's entry is near the end of a
            // window that holds a minute of requests (from the oldest, a
            // settlement read the whole minute under the lock).
            for (t, n) in w.tokens.iter_mut().rev() {
                if back == 0 || *t < at {
                    break;
                }
                if *t == at {
                    let take = back.min(*n);
                    *n -= take;
                    w.token_sum = w.token_sum.saturating_sub(take);
                    back -= take;
                }
            }
        }
    }
}

fn window<'a>(
    windows: &'a mut HashMap<Scope, HashMap<String, Window>>,
    scope: Scope,
    id: &str,
) -> &'a mut Window {
    let by_id = windows.entry(scope).or_default();
    // Allocates the id only the first time a level is seen.
    if !by_id.contains_key(id) {
        by_id.insert(id.to_owned(), Window::default());
    }
    by_id.get_mut(id).expect("inserted above")
}

/// A request's tokens before it is sent: its prompt at about three bytes a
/// token (an overestimate for most text, on purpose) plus the completion
/// it allows itself.
pub fn estimate_tokens(prompt_bytes: usize, max_completion: Option<u64>) -> u64 {
    (prompt_bytes as u64)
        .div_ceil(3)
        .saturating_add(max_completion.unwrap_or(0))
}

/// The first budget that a request priced `price`, of about `prompt` and
/// `completion` tokens, would overrun: `spent[i]` is what `budgets[i]`'s
/// pool has spent this period. A free model is exempt from every budget.
pub fn blocking_budget<'a>(
    budgets: &'a [BudgetLevel],
    spent: &[u64],
    price: Price,
    prompt: u64,
    completion: u64,
) -> Option<&'a BudgetLevel> {
    if price.is_zero() {
        return None;
    }
    let cost = price.cost(prompt, completion);
    budgets
        .iter()
        .zip(spent)
        .find(|(b, s)| *s >= &b.micros || s.saturating_add(cost) > b.micros)
        .map(|(b, _)| b)
}

#[cfg(test)]
mod tests {
    use llmgw_domain::tenancy::Period;

    use super::*;

    fn level(scope: Scope, id: &str, rpm: Option<u32>, tpm: Option<u32>) -> RateLevel {
        RateLevel {
            scope,
            scope_id: id.into(),
            rpm,
            tpm,
        }
    }

    #[test]
    fn a_group_limit_counts_every_key_of_the_group() {
        let rates = RateLimits::default();
        let now = Instant::now();
        let team = level(Scope::Team, "t", Some(2), None);
        let key_a = [team.clone(), level(Scope::Key, "a", Some(10), None)];
        let key_b = [team, level(Scope::Key, "b", Some(10), None)];
        assert!(rates.admit(&key_a, 0, now).is_ok());
        assert!(rates.admit(&key_b, 0, now).is_ok());
        let refused = rates.admit(&key_a, 0, now).unwrap_err();
        assert_eq!(
            (refused.scope, refused.scope_id.as_str(), refused.exceeded),
            (Scope::Team, "t", Exceeded::Requests { rpm: 2 })
        );
        assert_eq!(refused.wait, MINUTE);
        // A refused request counted nowhere: key a's own window has one.
        let later = now + MINUTE;
        assert!(rates.admit(&key_a, 0, later).is_ok());
    }

    #[test]
    fn estimates_are_charged_at_admission_and_settled_at_the_end() {
        let rates = RateLimits::default();
        let now = Instant::now();
        let key = [level(Scope::Key, "k", None, Some(100))];
        let first = rates.admit(&key, 60, now).unwrap();
        // 60 charged: another 60 would overshoot, so it waits.
        let refused = rates.admit(&key, 60, now).unwrap_err();
        assert_eq!(refused.exceeded, Exceeded::Tokens { tpm: 100 });
        // The first used only 10: 50 are given back, and 60 more fit.
        rates.settle(&first, 10, now);
        let second = rates.admit(&key, 60, now).unwrap();
        // The second used 80: 20 more are counted, 90 in all.
        rates.settle(&second, 80, now + Duration::from_secs(1));
        let refused = rates
            .admit(&key, 20, now + Duration::from_secs(2))
            .unwrap_err();
        assert_eq!(refused.wait, Duration::from_secs(58), "until 70 age out");
        assert!(rates.admit(&key, 10, now + Duration::from_secs(2)).is_ok());
    }

    #[test]
    fn an_empty_window_takes_one_request_larger_than_the_limit() {
        let rates = RateLimits::default();
        let now = Instant::now();
        let key = [level(Scope::Key, "k", None, Some(5))];
        assert!(rates.admit(&key, 50, now).is_ok());
        assert!(rates.admit(&key, 1, now).is_err());
    }

    #[test]
    fn a_free_model_is_exempt_and_a_priced_one_must_fit_every_budget() {
        let budgets = [
            BudgetLevel {
                scope: Scope::Team,
                scope_id: "t".into(),
                micros: 1_000,
                period: Period::Month,
            },
            BudgetLevel {
                scope: Scope::Key,
                scope_id: "k".into(),
                micros: 100,
                period: Period::Day,
            },
        ];
        let price = Price {
            prompt_per_1k: 1_000,
            completion_per_1k: 1_000,
        };
        assert_eq!(blocking_budget(&budgets, &[0, 0], price, 10, 10), None);
        let key_over = blocking_budget(&budgets, &[0, 90], price, 10, 10);
        assert_eq!(key_over.map(|b| b.scope), Some(Scope::Key));
        let team_spent = blocking_budget(&budgets, &[1_000, 0], price, 0, 0);
        assert_eq!(team_spent.map(|b| b.scope), Some(Scope::Team));
        assert_eq!(
            blocking_budget(&budgets, &[5_000, 5_000], Price::ZERO, 10, 10),
            None
        );
    }
}
