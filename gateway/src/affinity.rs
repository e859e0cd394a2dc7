//! Session and prefix affinity: send a request where its conversation, or
//! the prompt prefix it shares with earlier requests, has probably already
//! been prefilled. Affinity yields to load only when the preferred endpoint
//! is overloaded by both measures at once — more than `balance_abs`
//! requests and more than `balance_rel` times the least-loaded one — since
//! without the guard the hit rate rises while p99 collapses.
//!
//! For an endpoint whose engine publishes KV-cache events, what it holds
//! is known (`kv_events`): the candidate carries the bytes of the prompt
//! it holds, and the longest such prefix is preferred (`ExactHit`), the
//! least loaded among equals. The approximate index guesses only for the
//! endpoints without live events; the longer match of the two wins.
//!
//! An endpoint whose events are live but which has announced nothing yet
//! (`cold`) is preferred before any prefix (`ExactCold`): otherwise the
//! engines whose first events land within the first few milliseconds hold
//! the shared prefix (a system prompt) alone, win every comparison after,
//! and the others never get traffic, so never announce anything either.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct AffinityConfig {
    pub enabled: bool,
    /// Bytes of prompt that must match before a prefix counts.
    pub min_match: usize,
    /// Share of the prompt that must match.
    pub match_ratio: f64,
    pub balance_abs: f64,
    pub balance_rel: f64,
    pub ttl: Duration,
    /// Entries kept at most (prefix blocks and sessions each).
    pub max_entries: usize,
    /// Prefix granularity in bytes.
    pub block_bytes: usize,
}

impl Default for AffinityConfig {
    fn default() -> Self {
        AffinityConfig {
            enabled: true,
            min_match: 64,
            match_ratio: 0.3,
            balance_abs: 8.0,
            balance_rel: 1.5,
            ttl: Duration::from_secs(600),
            max_entries: 100_000,
            block_bytes: 64,
        }
    }
}

/// Why an endpoint was chosen, counted per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// The session's endpoint.
    Session,
    /// The endpoint that probably holds the prompt's prefix (the
    /// approximate index).
    PrefixHit,
    /// The endpoint whose KV-cache events say it holds the longest prefix.
    ExactHit,
    /// An endpoint whose KV-cache events are live but which has announced
    /// nothing yet: it gets traffic so that it gets a prefix to announce.
    ExactCold,
    /// A preferred endpoint was too loaded; the least-loaded one instead.
    LoadBalanceOverride,
    /// Nothing preferred: the least-loaded endpoint.
    CacheMissMinLoad,
}

impl Decision {
    pub fn name(self) -> &'static str {
        match self {
            Decision::Session => "session",
            Decision::PrefixHit => "prefix_hit",
            Decision::ExactHit => "exact_hit",
            Decision::ExactCold => "exact_cold",
            Decision::LoadBalanceOverride => "load_balance_override",
            Decision::CacheMissMinLoad => "cache_miss_min_load",
        }
    }
}

/// A bounded map with expiry: oldest entries go first.
#[derive(Debug)]
struct Expiring {
    map: HashMap<u64, (String, Instant)>,
    order: VecDeque<(u64, Instant)>,
    max: usize,
    ttl: Duration,
}

impl Expiring {
    fn new(max: usize, ttl: Duration) -> Self {
        Expiring {
            map: HashMap::new(),
            order: VecDeque::new(),
            max: max.max(1),
            ttl,
        }
    }

    fn get(&self, key: u64) -> Option<&str> {
        self.map
            .get(&key)
            .filter(|(_, at)| at.elapsed() <= self.ttl)
            .map(|(v, _)| v.as_str())
    }

    fn put(&mut self, key: u64, value: &str) {
        let now = Instant::now();
        self.map.insert(key, (value.to_owned(), now));
        self.order.push_back((key, now));
        while self.map.len() > self.max
            || self
                .order
                .front()
                .is_some_and(|(_, at)| at.elapsed() > self.ttl)
        {
            let Some((k, at)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&k).is_some_and(|(_, t)| *t == at) {
                self.map.remove(&k);
            }
        }
        if self.order.len() > 4 * self.max {
            let map = &self.map;
            self.order
                .retain(|(k, at)| map.get(k).is_some_and(|(_, t)| t == at));
        }
    }
}

#[derive(Debug)]
pub struct Affinity {
    config: AffinityConfig,
    sessions: Mutex<Expiring>,
    prefixes: Mutex<Expiring>,
}

/// A candidate as affinity sees it.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub id: &'a str,
    pub load: f64,
    /// Bytes of the rendered prompt the endpoint holds, by its KV-cache
    /// events; None when it has no live events.
    pub exact: Option<usize>,
    /// Its events are live but it has announced nothing yet (and has not
    /// yet been sent so many requests in silence that it seems mute).
    pub cold: bool,
}

fn hash_of(v: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

impl Affinity {
    pub fn new(config: AffinityConfig) -> Self {
        Affinity {
            sessions: Mutex::new(Expiring::new(config.max_entries, config.ttl)),
            prefixes: Mutex::new(Expiring::new(config.max_entries, config.ttl)),
            config,
        }
    }

    fn block_hashes(&self, prompt: &[u8]) -> Vec<u64> {
        let mut h = DefaultHasher::new();
        prompt
            .chunks(self.config.block_bytes.max(1))
            .filter(|c| c.len() == self.config.block_bytes)
            .map(|c| {
                c.hash(&mut h);
                h.finish()
            })
            .collect()
    }

    /// Chooses among `candidates` (non-empty, least loaded first) and
    /// remembers the choice for the session and the prompt's prefix.
    /// `rendered` is the length of the prompt as the engines' events count
    /// it (the candidates' `exact`).
    pub fn choose(
        &self,
        model: &str,
        session: Option<&str>,
        prompt: &[u8],
        rendered: usize,
        candidates: &[Candidate<'_>],
    ) -> (usize, Decision) {
        let least = 0;
        if !self.config.enabled || candidates.len() < 2 {
            return (least, Decision::CacheMissMinLoad);
        }
        let session_key = session.map(|s| hash_of((model, s)));
        let blocks = self.block_hashes(prompt);
        let preferred = session_key
            .and_then(|k| {
                self.sessions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(k)
                    .map(str::to_owned)
            })
            .and_then(|id| candidates.iter().position(|c| c.id == id))
            .map(|i| (i, Decision::Session))
            // Least loaded first: the least-loaded cold endpoint, if the
            // load guard lets it take more; an overloaded one is passed
            // over, so that it cannot stop prefix routing for the model.
            .or_else(|| {
                let i = candidates
                    .iter()
                    .position(|c| c.cold && !self.overloaded(c.load, candidates[least].load))?;
                Some((i, Decision::ExactCold))
            })
            .or_else(|| self.prefix_choice(model, &blocks, prompt.len(), rendered, candidates));
        let chosen = match preferred {
            Some((i, d)) if !self.overloaded(candidates[i].load, candidates[least].load) => (i, d),
            Some(_) => (least, Decision::LoadBalanceOverride),
            None => (least, Decision::CacheMissMinLoad),
        };
        let id = candidates[chosen.0].id;
        if let Some(k) = session_key {
            self.sessions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .put(k, id);
        }
        let mut prefixes = self.prefixes.lock().unwrap_or_else(|p| p.into_inner());
        for b in &blocks {
            prefixes.put(hash_of((model, b)), id);
        }
        chosen
    }

    /// Long enough by both the absolute and the relative rule.
    fn long_enough(&self, matched: usize, of: usize) -> bool {
        matched >= self.config.min_match
            && matched as f64 >= self.config.match_ratio * of.max(1) as f64
    }

    /// The candidate holding the longest prefix: known from events, or
    /// guessed for an endpoint without them; None unless long enough.
    fn prefix_choice(
        &self,
        model: &str,
        blocks: &[u64],
        prompt_len: usize,
        rendered: usize,
        candidates: &[Candidate<'_>],
    ) -> Option<(usize, Decision)> {
        // The longest held prefix; among equals the least loaded (first).
        let exact = candidates
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i, c.exact?)))
            .fold(None, |best: Option<(usize, usize)>, (i, m)| match best {
                Some((_, b)) if b >= m => best,
                _ => Some((i, m)),
            })
            .filter(|(_, m)| self.long_enough(*m, rendered));
        let guessed = self
            .prefix_owner(model, blocks)
            .and_then(|(id, m)| {
                let i = candidates
                    .iter()
                    .position(|c| c.id == id && c.exact.is_none())?;
                Some((i, m))
            })
            .filter(|(_, m)| self.long_enough(*m, prompt_len));
        match (exact, guessed) {
            // Shares of their own prompts, since the two count differently.
            (Some((i, m)), Some((j, g))) => {
                if m as f64 / rendered.max(1) as f64 >= g as f64 / prompt_len.max(1) as f64 {
                    Some((i, Decision::ExactHit))
                } else {
                    Some((j, Decision::PrefixHit))
                }
            }
            (Some((i, _)), None) => Some((i, Decision::ExactHit)),
            (None, Some((j, _))) => Some((j, Decision::PrefixHit)),
            (None, None) => None,
        }
    }

    /// The endpoint holding the longest matching prefix by the approximate
    /// index, and the bytes matched.
    fn prefix_owner(&self, model: &str, blocks: &[u64]) -> Option<(String, usize)> {
        let prefixes = self.prefixes.lock().unwrap_or_else(|p| p.into_inner());
        let mut owner = None;
        let mut matched = 0;
        for b in blocks {
            match prefixes.get(hash_of((model, b))) {
                Some(id) => {
                    owner = Some(id.to_owned());
                    matched += self.config.block_bytes;
                }
                None => break,
            }
        }
        owner.map(|o| (o, matched))
    }

    fn overloaded(&self, preferred: f64, least: f64) -> bool {
        preferred - least > self.config.balance_abs && preferred > self.config.balance_rel * least
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: &str, load: f64) -> Candidate<'_> {
        Candidate {
            id,
            load,
            exact: None,
            cold: false,
        }
    }

    /// A candidate with live events, holding `held` bytes of the prompt.
    fn ev(id: &str, load: f64, held: usize) -> Candidate<'_> {
        Candidate {
            exact: Some(held),
            ..c(id, load)
        }
    }

    /// Every request of the events tests: one prompt, 700 bytes once
    /// rendered.
    fn one_prompt(a: &Affinity, candidates: &[Candidate<'_>]) -> (usize, Decision) {
        a.choose("m", None, "p".repeat(640).as_bytes(), 700, candidates)
    }

    /// A candidate with live events that has announced nothing yet.
    fn cold(id: &str, load: f64) -> Candidate<'_> {
        Candidate {
            cold: true,
            ..ev(id, load, 0)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeated_prefix_returns_to_its_endpoint_until_the_guard_trips() {
        let a = Affinity::new(AffinityConfig::default());
        let system = "s".repeat(640);
        let first = format!("{system} user: one");
        let second = format!("{system} user: two, a different question");
        // First sight: least loaded (index 0 is "x").
        assert_eq!(
            a.choose("m", None, first.as_bytes(), 0, &[c("x", 0.0), c("y", 0.0)]),
            (0, Decision::CacheMissMinLoad)
        );
        // Now y is least loaded, but x holds the prefix.
        assert_eq!(
            a.choose("m", None, second.as_bytes(), 0, &[c("y", 0.0), c("x", 3.0)]),
            (1, Decision::PrefixHit)
        );
        // Only absolute overload: 9 - 7 is not > 8.
        assert_eq!(
            a.choose("m", None, second.as_bytes(), 0, &[c("y", 7.0), c("x", 9.0)])
                .1,
            Decision::PrefixHit
        );
        // Both thresholds: 10 - 1 > 8 and 10 > 1.5.
        assert_eq!(
            a.choose(
                "m",
                None,
                second.as_bytes(),
                0,
                &[c("y", 1.0), c("x", 10.0)]
            ),
            (0, Decision::LoadBalanceOverride)
        );
        // Entries expire.
        tokio::time::advance(Duration::from_secs(601)).await;
        assert_eq!(
            a.choose("m", None, second.as_bytes(), 0, &[c("x", 0.0), c("y", 0.0)])
                .1,
            Decision::CacheMissMinLoad
        );
    }

    #[tokio::test(start_paused = true)]
    async fn short_or_mostly_new_prompts_do_not_count_as_a_match() {
        let a = Affinity::new(AffinityConfig::default());
        let shared = "p".repeat(128);
        a.choose("m", None, shared.as_bytes(), 0, &[c("x", 0.0), c("y", 0.0)]);
        // 128 bytes match, but of a 1,000-byte prompt: under 30%.
        let long = format!("{shared}{}", "n".repeat(872));
        assert_eq!(
            a.choose("m", None, long.as_bytes(), 0, &[c("y", 0.0), c("x", 0.0)])
                .1,
            Decision::CacheMissMinLoad
        );
        // Another model's prefix is not this one's.
        assert_eq!(
            a.choose(
                "other",
                None,
                shared.as_bytes(),
                0,
                &[c("y", 0.0), c("x", 0.0)]
            )
            .1,
            Decision::CacheMissMinLoad
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_sticks_to_its_endpoint() {
        let a = Affinity::new(AffinityConfig::default());
        assert_eq!(
            a.choose("m", Some("s1"), b"hi", 0, &[c("x", 0.0), c("y", 0.0)])
                .0,
            0
        );
        assert_eq!(
            a.choose("m", Some("s1"), b"hello", 0, &[c("y", 0.0), c("x", 2.0)]),
            (1, Decision::Session)
        );
        assert_eq!(
            a.choose("m", Some("s2"), b"hello", 0, &[c("y", 0.0), c("x", 2.0)]),
            (0, Decision::CacheMissMinLoad)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn what_events_say_beats_what_was_guessed_for_those_endpoints() {
        let a = Affinity::new(AffinityConfig::default());
        let choose = |candidates: &[Candidate<'_>]| one_prompt(&a, candidates);
        // The approximate index remembers x for this prompt...
        choose(&[c("x", 0.0), c("y", 0.0)]);
        // ...but both publish events, and only y holds it now.
        assert_eq!(
            choose(&[ev("x", 0.0, 0), ev("y", 1.0, 640)]),
            (1, Decision::ExactHit)
        );
        // The longest held prefix wins; among equals the least loaded.
        assert_eq!(
            choose(&[ev("x", 0.0, 320), ev("y", 1.0, 640), ev("z", 2.0, 640)]),
            (1, Decision::ExactHit)
        );
        // Too short a share is a miss; the guard still applies.
        assert_eq!(
            choose(&[ev("x", 0.0, 64), ev("y", 1.0, 64)]).1,
            Decision::CacheMissMinLoad
        );
        assert_eq!(
            choose(&[ev("x", 1.0, 0), ev("y", 10.0, 640)]),
            (0, Decision::LoadBalanceOverride)
        );
        // A guess for an endpoint without events still counts beside them.
        assert_eq!(
            choose(&[ev("y", 0.0, 0), c("x", 1.0)]),
            (1, Decision::PrefixHit)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cold_endpoint_gets_the_shared_prefix_until_it_announces() {
        let a = Affinity::new(AffinityConfig::default());
        let choose = |candidates: &[Candidate<'_>]| one_prompt(&a, candidates);
        // x holds the whole prompt; y is live but silent: y gets it.
        assert_eq!(
            choose(&[ev("x", 0.0, 700), cold("y", 1.0)]),
            (1, Decision::ExactCold)
        );
        // Among cold endpoints, the least loaded (first).
        assert_eq!(
            choose(&[ev("x", 0.0, 700), cold("y", 1.0), cold("z", 2.0)]),
            (1, Decision::ExactCold)
        );
        // An overloaded cold endpoint (10 - 1 > 8 and 10 > 1.5) is passed
        // over, and the prefix decides.
        assert_eq!(
            choose(&[ev("x", 1.0, 700), cold("y", 10.0)]),
            (0, Decision::ExactHit)
        );
        assert_eq!(
            choose(&[ev("z", 0.0, 0), ev("x", 2.0, 700), cold("y", 12.0)]),
            (1, Decision::ExactHit)
        );
        // Once it announced (or seems mute), the longest prefix again.
        assert_eq!(
            choose(&[ev("y", 0.0, 0), ev("x", 1.0, 700)]),
            (1, Decision::ExactHit)
        );
        // A session's endpoint comes first.
        a.choose("m", Some("s"), b"hi", 0, &[c("x", 0.0), c("y", 0.0)]);
        assert_eq!(
            a.choose("m", Some("s"), b"hi", 0, &[cold("y", 0.0), ev("x", 1.0, 0)]),
            (1, Decision::Session)
        );
    }

    #[test]
    fn the_index_is_bounded() {
        let mut e = Expiring::new(3, Duration::from_secs(60));
        for k in 0..10 {
            e.put(k, "x");
        }
        assert_eq!(e.map.len(), 3);
        assert!(e.get(9).is_some() && e.get(0).is_none());
    }
}
