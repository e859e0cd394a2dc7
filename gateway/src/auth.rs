//! API keys, when authentication is on: the key in `Authorization: Bearer`
//! is hashed (SHA-256) and looked up in the tenancy view, which holds only
//! hashes. Every failure — no key, an unknown key, a revoked key — gets the
//! same answer, so a caller learns nothing about which keys exist. The key
//! decides the band, and its composed allowlist which models it can see.

use std::sync::{Arc, RwLock};

use axum::http::HeaderMap;
use llmgw_projections::{KeyEntry, Projections};
use sha2::{Digest, Sha256};

use crate::ApiError;

/// Where keys are looked up: the tenancy view kept by a projection runner.
#[derive(Debug, Clone)]
pub struct KeyDirectory(pub Arc<RwLock<Projections>>);

impl KeyDirectory {
    /// The live key presented in `headers`, or the one refusal for all cases.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<KeyEntry, ApiError> {
        let presented = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .ok_or_else(ApiError::invalid_key)?;
        let hash = hex(&Sha256::digest(presented.as_bytes()));
        let views = self.0.read().unwrap_or_else(|p| p.into_inner());
        views
            .tenancy
            .lookup(&hash)
            .ok_or_else(ApiError::invalid_key)
    }
}

impl KeyDirectory {
    /// What each of the key's budgets has spent in its period at `now_ms`,
    /// in the order of `key.limits.budgets`. Nothing is read when it has
    /// none.
    pub fn budget_spend(&self, key: &KeyEntry, now_ms: i64) -> Vec<u64> {
        if key.limits.budgets.is_empty() {
            return Vec::new();
        }
        let views = self.0.read().unwrap_or_else(|p| p.into_inner());
        key.limits
            .budgets
            .iter()
            .map(|b| {
                views
                    .usage
                    .spend_of(b.scope, &b.scope_id)
                    .in_period(b.period, now_ms)
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
