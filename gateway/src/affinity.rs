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
//! least loaded among equals. A prompt no events announce (not yet, or no
//! longer) goes where the approximate index sent it before, if anywhere:
//! one just sent is held before its engine's events can say so. Otherwise
//! the approximate index guesses only for the
//! endpoints without live events: it remembers every endpoint each prefix
//! block was sent to, so a shared prefix counts as held wherever it went.
//! The larger share of the prompt wins, events or guess.
//!
//! An endpoint whose events are live but which has announced nothing yet
//! and been sent nothing since (`cold`) is preferred before any prefix,
//! for one request (`ExactCold`): otherwise the
//! engines whose first events land within the first few milliseconds hold
//! the shared prefix (a system prompt) alone, win every comparison after,
//! and the others never get traffic, so never announce anything either.
//! The approximate index starves engines the same way, so an endpoint
//! without events that it has sent nothing for the model yet is preferred
//! over a prefix held elsewhere (`PrefixCold`), once: after that it holds
//! the shared prefix too.

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
    /// approximate index): one without events, or any where events say
    /// nothing.
    PrefixHit,
    /// The endpoint whose KV-cache events say it holds the longest prefix.
    ExactHit,
    /// An endpoint whose KV-cache events are live but which has announced
    /// nothing yet: it gets traffic so that it gets a prefix to announce.
    ExactCold,
    /// An endpoint without events that the approximate index has sent
    /// nothing for the model yet, given a prompt whose prefix is held
    /// elsewhere.
    PrefixCold,
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
            Decision::PrefixCold => "prefix_cold",
            Decision::LoadBalanceOverride => "load_balance_override",
            Decision::CacheMissMinLoad => "cache_miss_min_load",
        }
    }
}

/// A bounded map with expiry: the entries touched longest ago go first.
#[derive(Debug)]
struct Expiring<V> {
    map: HashMap<u64, (V, Instant)>,
    order: VecDeque<(u64, Instant)>,
    max: usize,
    ttl: Duration,
}

impl<V: Default> Expiring<V> {
    fn new(max: usize, ttl: Duration) -> Self {
        Expiring {
            map: HashMap::new(),
            order: VecDeque::new(),
            max: max.max(1),
            ttl,
        }
    }

    fn get(&self, key: u64, now: Instant) -> Option<&V> {
        self.map
            .get(&key)
            .filter(|(_, at)| now.duration_since(*at) <= self.ttl)
            .map(|(v, _)| v)
    }

    /// Updates the entry for `key` (a fresh one if it had none or it
    /// expired) and marks it touched at `now`.
    fn touch(&mut self, key: u64, now: Instant, update: impl FnOnce(&mut V)) {
        let (value, at) = self.map.entry(key).or_insert_with(|| (V::default(), now));
        if now.duration_since(*at) > self.ttl {
            *value = V::default();
        }
        update(value);
        *at = now;
        self.order.push_back((key, now));
        while self.map.len() > self.max
            || self
                .order
                .front()
                .is_some_and(|(_, at)| now.duration_since(*at) > self.ttl)
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

/// Owners kept for one prefix block at most; a model with more replicas
/// forgets the one sent the block longest ago.
const MAX_OWNERS: usize = 16;

/// The endpoints a prefix block was sent to (their ids' hashes: 24 bytes
/// an owner, nothing allocated for the name), each with when it last was.
/// A shared prefix (a system prompt) is held wherever it went, not only
/// where it went last: requests that share only it go to the least
/// loaded of those, and a conversation's own blocks still pick its
/// endpoint.
#[derive(Debug, Default)]
struct Owners(Vec<(u64, Instant)>);

impl Owners {
    fn holds(&self, id: u64, now: Instant, ttl: Duration) -> bool {
        self.0
            .iter()
            .any(|(o, at)| *o == id && now.duration_since(*at) <= ttl)
    }

    fn touch(&mut self, id: u64, now: Instant, ttl: Duration) {
        self.0.retain(|(_, at)| now.duration_since(*at) <= ttl);
        if let Some((_, at)) = self.0.iter_mut().find(|(o, _)| *o == id) {
            *at = now;
            return;
        }
        if self.0.len() >= MAX_OWNERS
            && let Some(oldest) = (0..self.0.len()).min_by_key(|&i| self.0[i].1)
        {
            self.0.swap_remove(oldest);
        }
        self.0.push((id, now));
    }
}

#[derive(Debug)]
pub struct Affinity {
    config: AffinityConfig,
    sessions: Mutex<Expiring<String>>,
    prefixes: Mutex<Expiring<Owners>>,
    /// The (model, endpoint) pairs the index has sent a request: the
    /// others are cold to it.
    warm: Mutex<Expiring<()>>,
}

/// A candidate as affinity sees it.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub id: &'a str,
    pub load: f64,
    /// Bytes of the rendered prompt the endpoint holds, by its KV-cache
    /// events; None when it has no live events.
    pub exact: Option<usize>,
    /// Its events are live but it has announced nothing yet, and it has
    /// been sent nothing since.
    pub cold: bool,
}

fn hash_of(v: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Affinity {
    pub fn new(config: AffinityConfig) -> Self {
        Affinity {
            sessions: Mutex::new(Expiring::new(config.max_entries, config.ttl)),
            prefixes: Mutex::new(Expiring::new(config.max_entries, config.ttl)),
            warm: Mutex::new(Expiring::new(config.max_entries, config.ttl)),
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
        let now = Instant::now();
        let session_key = session.map(|s| hash_of((model, s)));
        let blocks = self.block_hashes(prompt);
        let fits = |c: &Candidate<'_>| !self.overloaded(c.load, candidates[least].load);
        let preferred = session_key
            .and_then(|k| lock(&self.sessions).get(k, now).cloned())
            .and_then(|id| candidates.iter().position(|c| c.id == id))
            .map(|i| (i, Decision::Session))
            // Least loaded first: the least-loaded cold endpoint, if the
            // load guard lets it take more; an overloaded one is passed
            // over, so that it cannot stop prefix routing for the model.
            .or_else(|| {
                let i = candidates.iter().position(|c| c.cold && fits(c))?;
                Some((i, Decision::ExactCold))
            })
            .or_else(|| {
                let chosen =
                    self.prefix_choice(model, &blocks, prompt.len(), rendered, candidates, now)?;
                // A prefix held elsewhere goes first to an endpoint without
                // events that the index has sent nothing for this model
                // (a new replica, or every one but the first): as with
                // `ExactCold`, the endpoints that got a shared prefix first
                // would otherwise win every comparison after.
                let warm = lock(&self.warm);
                let cold = candidates.iter().position(|c| {
                    c.exact.is_none() && warm.get(hash_of((model, c.id)), now).is_none() && fits(c)
                });
                Some(cold.map_or(chosen, |i| (i, Decision::PrefixCold)))
            });
        let chosen = match preferred {
            Some((i, d)) if fits(&candidates[i]) => (i, d),
            Some(_) => (least, Decision::LoadBalanceOverride),
            None => (least, Decision::CacheMissMinLoad),
        };
        let id = candidates[chosen.0].id;
        if let Some(k) = session_key {
            lock(&self.sessions).touch(k, now, |v| id.clone_into(v));
        }
        let (ttl, owner) = (self.config.ttl, hash_of(id));
        let mut prefixes = lock(&self.prefixes);
        for b in &blocks {
            prefixes.touch(hash_of((model, b)), now, |o| o.touch(owner, now, ttl));
        }
        drop(prefixes);
        lock(&self.warm).touch(hash_of((model, id)), now, |_| ());
        chosen
    }

    /// Long enough by both the absolute and the relative rule.
    fn long_enough(&self, matched: usize, of: usize) -> bool {
        matched >= self.config.min_match
            && matched as f64 >= self.config.match_ratio * of.max(1) as f64
    }

    /// The candidate holding the largest share of the prompt: known from
    /// its events, or guessed for an endpoint without them; among equal
    /// shares the least loaded (first). None unless long enough.
    fn prefix_choice(
        &self,
        model: &str,
        blocks: &[u64],
        prompt_len: usize,
        rendered: usize,
        candidates: &[Candidate<'_>],
        now: Instant,
    ) -> Option<(usize, Decision)> {
        // Where the index sent the prompt, for every candidate: read for
        // those without events first, and for the rest where events say
        // nothing.
        let guessed = self.guessed(model, blocks, candidates, now);
        // Shares of their own prompts, since the two count differently.
        let known = candidates.iter().enumerate().map(|(i, c)| match c.exact {
            Some(m) => (i, m, rendered, Decision::ExactHit),
            None => (i, guessed[i], prompt_len, Decision::PrefixHit),
        });
        let best = self.largest_share(known);
        if best.is_some() || candidates.iter().all(|c| c.exact.is_none()) {
            return best;
        }
        // Held nowhere, as far as events say (not announced yet, or
        // evicted): where it was sent before, endpoints with events
        // included. A prompt just sent is held before its engine's events
        // can say so, and requests sharing it, arriving in between, would
        // otherwise each prefill it on another engine.
        let sent = guessed.iter().enumerate();
        self.largest_share(sent.map(|(i, &held)| (i, held, prompt_len, Decision::PrefixHit)))
    }

    /// Of `(candidate, bytes held, of how many, why)`, the first with the
    /// largest share that is long enough.
    fn largest_share(
        &self,
        held: impl Iterator<Item = (usize, usize, usize, Decision)>,
    ) -> Option<(usize, Decision)> {
        let mut best: Option<(usize, f64, Decision)> = None;
        for (i, held, of, decision) in held {
            let share = held as f64 / of.max(1) as f64;
            if self.long_enough(held, of) && best.is_none_or(|(_, b, _)| share > b) {
                best = Some((i, share, decision));
            }
        }
        best.map(|(i, _, d)| (i, d))
    }

    /// Bytes of the prompt's leading blocks the index sent to each
    /// candidate.
    fn guessed(
        &self,
        model: &str,
        blocks: &[u64],
        candidates: &[Candidate<'_>],
        now: Instant,
    ) -> Vec<usize> {
        let ttl = self.config.ttl;
        // Per candidate: its id's hash, whether its run of blocks goes on,
        // and the bytes it covers.
        let mut runs: Vec<(u64, bool, usize)> = candidates
            .iter()
            .map(|c| (hash_of(c.id), true, 0))
            .collect();
        let prefixes = lock(&self.prefixes);
        for b in blocks {
            let Some(owners) = prefixes.get(hash_of((model, b)), now) else {
                break;
            };
            let mut any = false;
            for (id, open, held) in &mut runs {
                *open = *open && owners.holds(*id, now, ttl);
                if *open {
                    *held += self.config.block_bytes;
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
        runs.into_iter().map(|(_, _, held)| held).collect()
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
    async fn a_shared_prefix_reaches_each_endpoint_once_then_the_least_loaded() {
        let a = Affinity::new(AffinityConfig::default());
        let system = "s".repeat(640);
        let ask = |n: usize| format!("{system} user {n}: {}", "q".repeat(100));
        // First sight: least loaded (index 0 is "x").
        assert_eq!(
            a.choose("m", None, ask(1).as_bytes(), 0, &[c("x", 0.0), c("y", 0.0)]),
            (0, Decision::CacheMissMinLoad)
        );
        // x holds the system prompt; y was sent nothing yet, but it is
        // overloaded (10 - 0 > 8 and 10 > 1.5 x 0): the prefix decides.
        assert_eq!(
            a.choose(
                "m",
                None,
                ask(2).as_bytes(),
                0,
                &[c("x", 0.0), c("y", 10.0)]
            ),
            (0, Decision::PrefixHit)
        );
        // Not overloaded, y gets it first...
        assert_eq!(
            a.choose("m", None, ask(3).as_bytes(), 0, &[c("x", 0.0), c("y", 1.0)]),
            (1, Decision::PrefixCold)
        );
        // ...and holds it too after: the least loaded of the two.
        for (n, order) in [(4, ["y", "x"]), (5, ["x", "y"])] {
            assert_eq!(
                a.choose(
                    "m",
                    None,
                    ask(n).as_bytes(),
                    0,
                    &[c(order[0], 0.0), c(order[1], 1.0)]
                ),
                (0, Decision::PrefixHit)
            );
        }
        // A conversation's own blocks pick its endpoint: user 3's are on y.
        let again = format!("{} answer. user 3 again: {}", ask(3), "r".repeat(200));
        assert_eq!(
            a.choose("m", None, again.as_bytes(), 0, &[c("x", 0.0), c("y", 3.0)]),
            (1, Decision::PrefixHit)
        );
        // Only absolute overload: 9 - 7 is not > 8.
        assert_eq!(
            a.choose("m", None, again.as_bytes(), 0, &[c("x", 7.0), c("y", 9.0)]),
            (1, Decision::PrefixHit)
        );
        // Both thresholds: 10 - 1 > 8 and 10 > 1.5.
        assert_eq!(
            a.choose("m", None, again.as_bytes(), 0, &[c("x", 1.0), c("y", 10.0)]),
            (0, Decision::LoadBalanceOverride)
        );
        // Entries expire, and with them what was warm.
        tokio::time::advance(Duration::from_secs(601)).await;
        assert_eq!(
            a.choose("m", None, again.as_bytes(), 0, &[c("y", 0.0), c("x", 0.0)]),
            (0, Decision::CacheMissMinLoad)
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
        // Too short a share counts for nothing by events; where the prompt
        // was sent decides then (both were: the least loaded). The guard
        // still applies.
        assert_eq!(
            choose(&[ev("x", 0.0, 64), ev("y", 1.0, 64)]),
            (0, Decision::PrefixHit)
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

    #[tokio::test(start_paused = true)]
    async fn what_no_events_announce_goes_where_it_was_sent_before() {
        let a = Affinity::new(AffinityConfig::default());
        let choose = |candidates: &[Candidate<'_>]| one_prompt(&a, candidates);
        // Neither has announced the prompt: the least loaded, x.
        assert_eq!(
            choose(&[ev("x", 0.0, 0), ev("y", 0.0, 0)]),
            (0, Decision::CacheMissMinLoad)
        );
        // x's events have not said so yet (or it evicted the prompt since):
        // x still, where it was sent, though y is less loaded.
        assert_eq!(
            choose(&[ev("y", 0.0, 0), ev("x", 1.0, 0)]),
            (1, Decision::PrefixHit)
        );
        // What events say beats that guess.
        assert_eq!(
            choose(&[ev("y", 0.0, 640), ev("x", 1.0, 0)]),
            (0, Decision::ExactHit)
        );
        // And the guard still applies: 10 - 1 > 8 and 10 > 1.5.
        assert_eq!(
            choose(&[ev("z", 1.0, 0), ev("x", 10.0, 0), ev("y", 11.0, 0)]),
            (0, Decision::LoadBalanceOverride)
        );
    }

    #[test]
    fn the_index_is_bounded() {
        let mut e = Expiring::<()>::new(3, Duration::from_secs(60));
        let now = Instant::now();
        for k in 0..10 {
            e.touch(k, now, |_| ());
        }
        assert_eq!(e.map.len(), 3);
        assert!(e.get(9, now).is_some() && e.get(0, now).is_none());
        // A block's owners too: the one sent it longest ago goes first.
        let mut o = Owners::default();
        let ttl = Duration::from_secs(60);
        for i in 0..=MAX_OWNERS {
            o.touch(i as u64, now + Duration::from_millis(i as u64), ttl);
        }
        let later = now + Duration::from_secs(1);
        assert_eq!(o.0.len(), MAX_OWNERS);
        assert!(!o.holds(0, later, ttl) && o.holds(1, later, ttl));
        assert!(o.holds(MAX_OWNERS as u64, later, ttl));
        assert!(!o.holds(1, later + ttl, ttl), "expired");
    }
}
