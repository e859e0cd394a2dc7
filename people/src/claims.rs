//! Claim links: a new key's secret, sealed under a one-time link token that
//! is never stored, revealed once.

use chrono::{DateTime, Utc};
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use sha2::{Digest, Sha256};

use crate::store::NewClaim;
use crate::{Claimed, People, PeopleError, Result, secret, time};

/// Domain separation: the sealing key and the stored lookup hash both come
/// from the token, and knowing one must not give the other.
const SEAL_CONTEXT: &[u8] = b"llmgw-claim-seal:";

fn seal_key(token: &str) -> Result<LessSafeKey> {
    let mut h = Sha256::new();
    h.update(SEAL_CONTEXT);
    h.update(token.as_bytes());
    let unbound = UnboundKey::new(&CHACHA20_POLY1305, &h.finalize())
        .map_err(|_| PeopleError::Store("could not make a sealing key".into()))?;
    Ok(LessSafeKey::new(unbound))
}

/// Nonce, then ciphertext and tag. The key id is authenticated data: a
/// sealed secret moved to another key's row does not open.
fn seal(token: &str, key_id: &str, secret_text: &str) -> Result<Vec<u8>> {
    let nonce = secret::random::<NONCE_LEN>()?;
    let mut body = secret_text.as_bytes().to_vec();
    seal_key(token)?
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(key_id.as_bytes()),
            &mut body,
        )
        .map_err(|_| PeopleError::Store("could not seal a key".into()))?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&body);
    Ok(out)
}

fn unseal(token: &str, key_id: &str, sealed: &[u8]) -> Option<String> {
    let (nonce, body) = sealed.split_at_checked(NONCE_LEN)?;
    let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
    let mut body = body.to_vec();
    let plain = seal_key(token)
        .ok()?
        .open_in_place(nonce, Aad::from(key_id.as_bytes()), &mut body)
        .ok()?;
    String::from_utf8(plain.to_vec()).ok()
}

impl People {
    /// When a link made at `now` stops working: `ttl` from then, or the
    /// configured lifetime without one. [`People::seal_claim`] given the
    /// same `now` ends its link at this very moment, so the log can say
    /// when the key's link ends before the link is made.
    pub fn claim_ends(
        &self,
        now: DateTime<Utc>,
        ttl: Option<std::time::Duration>,
    ) -> DateTime<Utc> {
        time::plus(time::exact(now), ttl.unwrap_or(self.config.claim_ttl))
    }

    /// Seals `secret` with a fresh link token and keeps only its hash;
    /// returns the token and when the link stops working (`ttl` from now,
    /// or the configured lifetime without one).
    pub async fn seal_claim(
        &self,
        key_id: &str,
        secret: &str,
        now: DateTime<Utc>,
        ttl: Option<std::time::Duration>,
    ) -> Result<(String, DateTime<Utc>)> {
        let expires_at = self.claim_ends(now, ttl);
        let now = time::exact(now);
        let token = secret::token()?;
        let sealed = seal(&token, key_id, secret)?;
        self.db
            .insert_claim(&NewClaim {
                token_hash: &secret::token_hash(&token),
                key_id,
                sealed: &sealed,
                created_at: now,
                expires_at,
            })
            .await?;
        Ok((token, expires_at))
    }

    /// Whether the link still works (without using it).
    pub async fn claim_open(&self, token: &str, now: DateTime<Utc>) -> Result<bool> {
        if token.is_empty() {
            return Ok(false);
        }
        self.db
            .claim_open(&secret::token_hash(token), time::exact(now))
            .await
    }

    /// Reveals the key once: the sealed copy is wiped in the same step.
    /// Unknown, used, expired and tampered links all fail alike.
    pub async fn claim(&self, token: &str, now: DateTime<Utc>) -> Result<Claimed> {
        if token.is_empty() {
            return Err(PeopleError::ClaimInvalid);
        }
        let taken = self
            .db
            .take_claim(&secret::token_hash(token), time::exact(now))
            .await?;
        let Some((key_id, sealed)) = taken else {
            return Err(PeopleError::ClaimInvalid);
        };
        let Some(secret) = unseal(token, &key_id, &sealed) else {
            tracing::warn!(
                key_id,
                "a claim link's sealed key did not open; it is used up"
            );
            return Err(PeopleError::ClaimInvalid);
        };
        Ok(Claimed { key_id, secret })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_with_its_token_and_key_id() {
        let sealed = seal("tok", "key-1", "llmgw-sk-secret").unwrap();
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        assert_eq!(
            unseal("tok", "key-1", &sealed).as_deref(),
            Some("llmgw-sk-secret")
        );
        assert_eq!(unseal("tok2", "key-1", &sealed), None);
        assert_eq!(unseal("tok", "key-2", &sealed), None);
        let mut bent = sealed.clone();
        let last = bent.len() - 1;
        bent[last] ^= 1;
        assert_eq!(unseal("tok", "key-1", &bent), None);
        assert_eq!(unseal("tok", "key-1", &sealed[..5]), None);
    }
}
