//! API keys, when authentication is on: the key in `Authorization: Bearer`
//! is hashed (SHA-256) and looked up in the tenancy view, which holds only
//! hashes. Every failure — no key, an unknown key, a revoked key — gets the
//! same answer, so a caller learns nothing about which keys exist. The key
//! decides the band, and its composed allowlist which models it can see.

use std::sync::{Arc, Mutex, RwLock};

use axum::http::HeaderMap;
use llmgw_domain::time::UnixMillis;
use llmgw_projections::{KeyEntry, Projections};
use sha2::{Digest, Sha256};

use crate::unflushed::Unflushed;
use crate::{ApiError, FastMap};

/// Where keys are looked up: the tenancy view kept by a projection runner.
#[derive(Debug, Clone)]
pub struct KeyDirectory {
    pub views: Arc<RwLock<Projections>>,
    cache: Arc<Mutex<Composed>>,
}

/// Keys as the views composed them (their limits from every level up),
/// by hash, as of one revision of the tenancy view: composing a key's
/// limits was the largest single cost of a request's path. Any event that
/// changes the tenancy view empties it, so a change of limits, a
/// revocation or a new alias counts from the request after it; events
/// that do not (usage batches, nodes, replicas: most of the log) leave it
/// whole, where keying it on the views' position emptied it at every usage
/// flush. Only keys that were found are kept, so unknown keys cannot grow
/// it.
#[derive(Debug, Default)]
struct Composed {
    revision: u64,
    /// By the SHA-256 of the key: a hit needs no hex string.
    keys: FastMap<[u8; 32], Arc<KeyEntry>>,
}

impl KeyDirectory {
    pub fn new(views: Arc<RwLock<Projections>>) -> Self {
        KeyDirectory {
            views,
            cache: Arc::default(),
        }
    }

    /// The live key presented in `headers`, or the one refusal for all cases.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Arc<KeyEntry>, ApiError> {
        let presented = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .ok_or_else(ApiError::invalid_key)?;
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let views = self.views.read().unwrap_or_else(|p| p.into_inner());
        let revision = views.tenancy.revision();
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.revision != revision {
            cache.keys.clear();
            cache.revision = revision;
        }
        let key = match cache.keys.get(&digest) {
            Some(k) => k.clone(),
            None => {
                let key = Arc::new(
                    views
                        .tenancy
                        .lookup(&hex(&digest))
                        .ok_or_else(ApiError::invalid_key)?,
                );
                cache.keys.insert(digest, key.clone());
                key
            }
        };
        // Only a key that can end by the clock reads it: one handed out by
        // a claim link not yet used, one made to expire, a rotated key's
        // old secret in its grace.
        if key.ends() && !key.works_at(UnixMillis::now()) {
            return Err(ApiError::invalid_key());
        }
        Ok(key)
    }
}

impl KeyDirectory {
    /// What each of the key's budgets has spent in its period at `now_ms`,
    /// in the order of `key.limits.budgets`: what the views hold (every
    /// gateway's flushed usage) and, when given, this gateway's own spend
    /// not in them yet. Nothing is read when it has none.
    /// What the key itself has cost in the current UTC day and month, as
    /// the log holds it (up to one flush behind): a key without a budget
    /// reads its own use too.
    /// What the key spent today and this month: the views', and this
    /// server's unflushed requests of a key under a budget (the only ones
    /// it tallies), as its budgets' figures count them.
    pub fn key_spend(
        &self,
        key: &KeyEntry,
        unflushed: Option<&Unflushed>,
        now_ms: i64,
    ) -> (u64, u64) {
        use llmgw_domain::tenancy::{Period, Scope};
        let views = self.views.read().unwrap_or_else(|p| p.into_inner());
        let mark = unflushed
            .and_then(Unflushed::gateway)
            .and_then(|g| views.usage.flushed(g));
        let spend = views.usage.spend_of(Scope::Key, &key.key_id);
        let in_period = |period| {
            let own = unflushed.map_or(0, |u| {
                u.pending_in(mark, (Scope::Key, &key.key_id, period), now_ms)
            });
            spend.in_period(period, now_ms).saturating_add(own)
        };
        (in_period(Period::Day), in_period(Period::Month))
    }

    pub fn budget_spend(
        &self,
        key: &KeyEntry,
        unflushed: Option<&Unflushed>,
        now_ms: i64,
    ) -> Vec<u64> {
        if key.limits.budgets.is_empty() {
            return Vec::new();
        }
        // One moment for both: under the read lock the views apply no
        // batch, so the mark and the figures agree.
        let views = self.views.read().unwrap_or_else(|p| p.into_inner());
        let mark = unflushed
            .and_then(Unflushed::gateway)
            .and_then(|g| views.usage.flushed(g));
        key.limits
            .budgets
            .iter()
            .map(|b| {
                let held = views
                    .usage
                    .spend_of(b.scope, &b.scope_id)
                    .in_period(b.period, now_ms);
                let own = unflushed.map_or(0, |u| u.pending(mark, b, now_ms));
                held.saturating_add(own)
            })
            .collect()
    }
}

/// Lower-case hex, by table: a `format!` per byte was a visible share of
/// authenticating a request.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// The stored form of a key: what `KeyIssued` carries instead of the key.
pub fn key_hash(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

/// The credentials of a `Bearer` authorization, its scheme named in any
/// case (RFC 9110: schemes are case-insensitive; some clients send
/// `bearer`).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(rest)
}
