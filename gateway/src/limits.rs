//! What a key may spend. Requests and tokens per minute are counted here,
//! one window per level that sets them (a team's rpm counts every key of the
//! team together), at this gateway: two gateways behind a balancer admit up
//! to twice the rate. A request's tokens are estimated from its prompt and
//! charged when it is admitted, so a burst cannot overshoot a tpm, and
//! settled with the engine's count when it ends. Budgets are read from the
//! usage view the log builds (so every gateway's spend counts, a moment
//! late); [`blocking_budget`] is the pure rule.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use llmgw_domain::catalog::Price;
use llmgw_domain::tenancy::{BudgetLevel, RateLevel, Scope};
use tokio::time::Instant;

use crate::FastMap;

const MINUTE: Duration = Duration::from_secs(60);

/// How close in time requests share a slot of a window. A window holds at
/// most a minute's worth of slots (600), however many requests a second a
/// level takes: one entry per request held 40 B per request for a minute,
/// tens of MiB per busy level, and grew on the request path. A slot ages
/// out with its newest request, so its older ones count up to a grain
/// longer than a minute: never more than the limit, a refusal's wait at
/// most a grain long.
const GRAIN: Duration = Duration::from_millis(100);

/// The requests and tokens charged within one grain.
#[derive(Debug, Clone, Copy)]
struct Slot {
    first: Instant,
    last: Instant,
    requests: u64,
    tokens: u64,
}

#[derive(Debug, Default)]
struct Window {
    slots: VecDeque<Slot>,
    request_sum: u64,
    token_sum: u64,
}

impl Window {
    fn expire(&mut self, now: Instant) {
        while let Some(s) = self.slots.front() {
            if now.duration_since(s.last) < MINUTE {
                break;
            }
            self.request_sum = self.request_sum.saturating_sub(s.requests);
            self.token_sum = self.token_sum.saturating_sub(s.tokens);
            self.slots.pop_front();
        }
    }

    /// Counts `requests` and `tokens` at `now`, in the newest slot when it
    /// began less than a grain ago.
    fn charge(&mut self, now: Instant, requests: u64, tokens: u64) {
        if requests == 0 && tokens == 0 {
            return;
        }
        self.request_sum = self.request_sum.saturating_add(requests);
        self.token_sum = self.token_sum.saturating_add(tokens);
        match self.slots.back_mut() {
            // A `now` a little before the newest slot's start (read before
            // the lock, by a request that then waited for it) joins that
            // slot, which keeps the slots in order.
            Some(s) if now.saturating_duration_since(s.first) < GRAIN => {
                s.first = s.first.min(now);
                s.last = s.last.max(now);
                s.requests += requests;
                s.tokens = s.tokens.saturating_add(tokens);
            }
            _ => self.slots.push_back(Slot {
                first: now,
                last: now,
                requests,
                tokens,
            }),
        }
    }

    /// Takes back up to `tokens` charged at `at` (nothing once its slot has
    /// aged out).
    fn give_back(&mut self, at: Instant, requests: u64, tokens: u64) {
        // From the newest: the admission's slot is near the end of a
        // window that holds a minute of requests.
        let slot = self
            .slots
            .iter_mut()
            .rev()
            .take_while(|s| s.last >= at)
            .find(|s| s.first <= at);
        if let Some(s) = slot {
            let take = tokens.min(s.tokens);
            s.tokens -= take;
            self.token_sum = self.token_sum.saturating_sub(take);
            let take = requests.min(s.requests);
            s.requests -= take;
            self.request_sum = self.request_sum.saturating_sub(take);
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
            && self.request_sum >= u64::from(rpm)
        {
            // Until enough requests have aged out for one more.
            let mut left = self.request_sum;
            let mut wait = MINUTE;
            for s in &self.slots {
                left = left.saturating_sub(s.requests);
                wait = until(s.last);
                if left < u64::from(rpm) {
                    break;
                }
            }
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
        for s in &self.slots {
            left = left.saturating_sub(s.tokens);
            wait = until(s.last);
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

/// What the tightest level leaves of one limit: OpenAI's `x-ratelimit-*`
/// headers tell a client as much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    pub limit: u64,
    pub remaining: u64,
    /// Until the level's window is empty again (OpenAI's "reset").
    pub reset: Duration,
}

/// The room a request leaves at its levels, of requests and of tokens
/// (each `None` when no level limits it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Headroom {
    pub requests: Option<Left>,
    pub tokens: Option<Left>,
}

impl Headroom {
    /// Keeps `left` where it leaves less than what is kept.
    fn tighter(slot: &mut Option<Left>, left: Left) {
        if slot.is_none_or(|l| left.remaining < l.remaining) {
            *slot = Some(left);
        }
    }
}

/// OpenAI's rate-limit headers for `room`: limit, remaining and reset, of
/// requests and of tokens, for what some level limits.
pub fn write_headroom(headers: &mut axum::http::HeaderMap, room: Headroom) {
    use axum::http::{HeaderName, HeaderValue};
    const NAMES: [[HeaderName; 3]; 2] = [
        [
            HeaderName::from_static("x-ratelimit-limit-requests"),
            HeaderName::from_static("x-ratelimit-remaining-requests"),
            HeaderName::from_static("x-ratelimit-reset-requests"),
        ],
        [
            HeaderName::from_static("x-ratelimit-limit-tokens"),
            HeaderName::from_static("x-ratelimit-remaining-tokens"),
            HeaderName::from_static("x-ratelimit-reset-tokens"),
        ],
    ];
    // Every value written into one buffer, each header a slice of it: one
    // allocation for the six, and digits without `core::fmt` (a value each
    // and `format!` was eight allocations and 1,500 instructions more).
    let mut text = Vec::with_capacity(64);
    let mut ends = [0usize; 6];
    for (i, left) in [room.requests, room.tokens].into_iter().enumerate() {
        let at = i * 3;
        match left {
            Some(l) => {
                digits(&mut text, l.limit);
                ends[at] = text.len();
                digits(&mut text, l.remaining);
                ends[at + 1] = text.len();
                write_reset(&mut text, l.reset);
                ends[at + 2] = text.len();
            }
            // Empty slices: those headers are not written.
            None => ends[at..at + 3].fill(text.len()),
        }
    }
    let bytes = axum::body::Bytes::from(text);
    headers.reserve(6);
    let mut from = 0;
    for (i, name) in NAMES.into_iter().flatten().enumerate() {
        let to = ends[i];
        if to > from
            && let Ok(v) = HeaderValue::from_maybe_shared(bytes.slice(from..to))
        {
            headers.insert(name, v);
        }
        from = to;
    }
}

/// `n` in decimal.
fn digits(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// A reset as OpenAI writes it: `20ms`, `7s`, `1m0s`.
fn write_reset(out: &mut Vec<u8>, d: Duration) {
    let ms = d.as_millis();
    if ms < 1000 {
        digits(out, ms as u64);
        out.extend_from_slice(b"ms");
        return;
    }
    let secs = d.as_secs() + u64::from(d.subsec_millis() > 0);
    if secs >= 60 {
        digits(out, secs / 60);
        out.push(b'm');
    }
    digits(out, if secs >= 60 { secs % 60 } else { secs });
    out.push(b's');
}

/// The tokens a request was charged when admitted, at each of its levels
/// with a tpm; [`RateLimits::settle`], given the same levels, puts the
/// real count in their place. The levels are not copied into the charge:
/// the caller holds them for the request's life anyway (its key's), and
/// copying each level's id cost allocations on every request.
#[derive(Debug, Default, Clone, Copy)]
pub struct Charge {
    tokens: u64,
    at: Option<Instant>,
    room: Headroom,
}

impl Charge {
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// What the request left at its levels once charged.
    pub fn headroom(&self) -> Headroom {
        self.room
    }
}

/// The windows of every level that limits rates, last minute each.
#[derive(Debug, Default)]
pub struct RateLimits {
    windows: Mutex<FastMap<Scope, FastMap<String, Window>>>,
}

impl RateLimits {
    fn lock(&self) -> std::sync::MutexGuard<'_, FastMap<Scope, FastMap<String, Window>>> {
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
        let mut room = Headroom::default();
        for level in levels {
            let w = window(&mut windows, level.scope, &level.scope_id);
            let tokens = if level.tpm.is_some() { estimate } else { 0 };
            w.charge(now, u64::from(level.rpm.is_some()), tokens);
            // The newest entry ages out last: then the window is empty.
            let reset = w.slots.back().map_or(Duration::ZERO, |s| {
                MINUTE.saturating_sub(now.saturating_duration_since(s.last))
            });
            let left = |limit: u32, used: u64| Left {
                limit: u64::from(limit),
                remaining: u64::from(limit).saturating_sub(used),
                reset,
            };
            if let Some(rpm) = level.rpm {
                Headroom::tighter(&mut room.requests, left(rpm, w.request_sum));
            }
            if let Some(tpm) = level.tpm {
                Headroom::tighter(&mut room.tokens, left(tpm, w.token_sum));
            }
        }
        Ok(Charge {
            tokens: estimate,
            at: Some(now),
            room,
        })
    }

    /// A finished request's real token count in place of its estimate, at
    /// each of `levels` (those it was admitted with) that has a tpm: the
    /// difference is added now, or given back from the admission's entry
    /// (nothing to give back once that has aged out).
    pub fn settle(&self, levels: &[RateLevel], charge: &Charge, actual: u64, now: Instant) {
        let Some(at) = charge.at else { return };
        if actual == charge.tokens || levels.iter().all(|l| l.tpm.is_none()) {
            return;
        }
        let mut windows = self.lock();
        for level in levels.iter().filter(|l| l.tpm.is_some()) {
            let w = window(&mut windows, level.scope, &level.scope_id);
            w.expire(now);
            if actual > charge.tokens {
                w.charge(now, 0, actual - charge.tokens);
            } else {
                w.give_back(at, 0, charge.tokens - actual);
            }
        }
    }

    /// A request admitted at `levels` and then not served (held back as
    /// overloaded, or its client gone while it waited): its request and
    /// its tokens are given back, so that a client told to retry shortly
    /// has not spent its minute on answers it never got.
    pub fn refund(&self, levels: &[RateLevel], charge: &Charge, now: Instant) {
        let Some(at) = charge.at else { return };
        let mut windows = self.lock();
        for level in levels {
            let w = window(&mut windows, level.scope, &level.scope_id);
            w.expire(now);
            let tokens = if level.tpm.is_some() {
                charge.tokens
            } else {
                0
            };
            w.give_back(at, u64::from(level.rpm.is_some()), tokens);
        }
    }
}

fn window<'a>(
    windows: &'a mut FastMap<Scope, FastMap<String, Window>>,
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

/// Tokens a chat template adds to a conversation of `messages`: each
/// message's role and markers (Llama 3's header and end, ChatML's start
/// and end: 4 to 6), and once the begin token, the generation prompt and
/// the system text some templates write when none is given (Llama 3.1's
/// dates, Qwen's default system prompt: 20 to 30). Counted so that a burst
/// of short messages cannot pass as a few bytes each: "hi" is 3 to 40
/// tokens to an engine, never one.
pub fn chat_framing(messages: usize) -> u64 {
    const PER_CONVERSATION: u64 = 32;
    const PER_MESSAGE: u64 = 8;
    PER_CONVERSATION.saturating_add(PER_MESSAGE.saturating_mul(messages as u64))
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

    #[test]
    fn a_reset_is_written_as_openai_writes_it() {
        let text = |ms| {
            let mut s = Vec::new();
            write_reset(&mut s, Duration::from_millis(ms));
            String::from_utf8(s).unwrap()
        };
        assert_eq!(text(20), "20ms");
        assert_eq!(text(6_200), "7s");
        assert_eq!(text(60_000), "1m0s");
    }

    #[test]
    fn the_headroom_headers_are_each_its_own_value() {
        let mut h = axum::http::HeaderMap::new();
        let left = |limit, remaining, ms| Left {
            limit,
            remaining,
            reset: Duration::from_millis(ms),
        };
        write_headroom(
            &mut h,
            Headroom {
                requests: None,
                tokens: Some(left(1000, 995, 59_400)),
            },
        );
        assert_eq!(h.len(), 3);
        assert_eq!(h["x-ratelimit-limit-tokens"], "1000");
        assert_eq!(h["x-ratelimit-remaining-tokens"], "995");
        assert_eq!(h["x-ratelimit-reset-tokens"], "1m0s");
        write_headroom(
            &mut h,
            Headroom {
                requests: Some(left(2, 0, 7)),
                tokens: None,
            },
        );
        assert_eq!(h["x-ratelimit-limit-requests"], "2");
        assert_eq!(h["x-ratelimit-remaining-requests"], "0");
        assert_eq!(h["x-ratelimit-reset-requests"], "7ms");
    }

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
        rates.settle(&key, &first, 10, now);
        let second = rates.admit(&key, 60, now).unwrap();
        // The second used 80: 20 more are counted, 90 in all.
        rates.settle(&key, &second, 80, now + Duration::from_secs(1));
        let refused = rates
            .admit(&key, 20, now + Duration::from_secs(2))
            .unwrap_err();
        assert_eq!(refused.wait, Duration::from_secs(58), "until 70 age out");
        assert!(rates.admit(&key, 10, now + Duration::from_secs(2)).is_ok());
    }

    /// A request admitted and then not served (overloaded: "retry
    /// shortly") gives back its request and tokens at every level: a
    /// client that retries as told has not spent its minute.
    #[test]
    fn a_request_not_served_is_refunded_whole() {
        let rates = RateLimits::default();
        let now = Instant::now();
        let key = [
            level(Scope::Key, "k", Some(1), Some(100)),
            level(Scope::Team, "t", Some(1), None),
        ];
        let held_back = rates.admit(&key, 60, now).unwrap();
        assert!(rates.admit(&key, 60, now).is_err(), "a minute of one");
        rates.refund(&key, &held_back, now + Duration::from_secs(1));
        let served = rates.admit(&key, 60, now + Duration::from_secs(1));
        assert!(served.is_ok(), "{:?}", served.err());
        assert!(rates.admit(&key, 1, now + Duration::from_secs(2)).is_err());
    }

    #[test]
    fn a_busy_level_holds_a_minute_of_slots_not_of_requests() {
        let rates = RateLimits::default();
        let start = Instant::now();
        let key = [level(Scope::Key, "k", Some(u32::MAX), Some(u32::MAX))];
        // 2,000 requests a second for two minutes.
        let mut now = start;
        for _ in 0..240_000 {
            rates.admit(&key, 1, now).unwrap();
            now += Duration::from_micros(500);
        }
        let windows = rates.lock();
        let w = &windows[&Scope::Key]["k"];
        assert!(w.slots.len() <= 601, "{} slots", w.slots.len());
        // The last minute's requests, and at most a grain's more.
        let minute = 120_000;
        assert!((minute..=minute + 200).contains(&w.request_sum));
        assert_eq!(w.token_sum, w.request_sum);
    }

    #[test]
    fn requests_of_one_grain_age_out_with_its_newest() {
        let rates = RateLimits::default();
        let now = Instant::now();
        let key = [level(Scope::Key, "k", Some(2), None)];
        rates.admit(&key, 0, now).unwrap();
        rates.admit(&key, 0, now + GRAIN / 2).unwrap();
        let refused = rates.admit(&key, 0, now + GRAIN).unwrap_err();
        // The first would age out at a minute; it waits for the second.
        assert_eq!(refused.wait, MINUTE - GRAIN / 2);
        assert!(rates.admit(&key, 0, now + MINUTE).is_err());
        assert!(rates.admit(&key, 0, now + MINUTE + GRAIN / 2).is_ok());
    }

    #[test]
    fn a_request_that_read_the_clock_before_waiting_for_the_lock_is_settled_in_its_slot() {
        let rates = RateLimits::default();
        let now = Instant::now();
        let key = [level(Scope::Key, "k", None, Some(100))];
        let first = rates.admit(&key, 40, now + GRAIN).unwrap();
        // Admitted after the first, with a time from before its slot.
        let late = rates.admit(&key, 40, now + GRAIN / 2).unwrap();
        rates.admit(&key, 10, now + GRAIN * 2).unwrap();
        {
            let windows = rates.lock();
            let slots = &windows[&Scope::Key]["k"].slots;
            assert!(
                slots
                    .iter()
                    .zip(slots.iter().skip(1))
                    .all(|(a, b)| a.last < b.first)
            );
        }
        // Each gives back from the slot its admission is in, not from the
        // third's: its 10 tokens still count, so 91 more do not fit.
        rates.settle(&key, &late, 0, now + GRAIN * 3);
        rates.settle(&key, &first, 0, now + GRAIN * 3);
        assert!(rates.admit(&key, 91, now + GRAIN * 3).is_err());
        assert!(rates.admit(&key, 90, now + GRAIN * 3).is_ok());
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
