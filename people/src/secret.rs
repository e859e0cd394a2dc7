//! Random tokens and their stored hashes.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};

use crate::{PeopleError, Result};

/// `N` bytes from the operating system's CSPRNG.
pub(crate) fn random<const N: usize>() -> Result<[u8; N]> {
    let mut out = [0u8; N];
    SystemRandom::new()
        .fill(&mut out)
        .map_err(|_| PeopleError::Store("the system random generator failed".into()))?;
    Ok(out)
}

/// A fresh bearer token: 256 random bits, base64url without padding.
pub(crate) fn token() -> Result<String> {
    Ok(URL_SAFE_NO_PAD.encode(random::<32>()?))
}

/// What the tables keep instead of a token: SHA-256, lowercase hex. Tokens
/// carry 256 random bits, so a fast hash is enough (no guessing to slow).
pub(crate) fn token_hash(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// Lowercase RFC 4648 base32 without padding.
pub(crate) fn base32(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for &b in bytes {
        buffer = (buffer << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

/// `usr-` and 16 base32 characters (80 random bits).
pub(crate) fn new_user_id() -> Result<String> {
    Ok(format!("usr-{}", base32(&random::<10>()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_follows_rfc_4648() {
        assert_eq!(base32(b""), "");
        assert_eq!(base32(b"f"), "my");
        assert_eq!(base32(b"foobar"), "mzxw6ytboi");
    }

    #[test]
    fn user_ids_have_sixteen_base32_characters() {
        let id = new_user_id().unwrap();
        let tail = id.strip_prefix("usr-").unwrap();
        assert_eq!(tail.len(), 16);
        assert!(tail.bytes().all(|c| matches!(c, b'a'..=b'z' | b'2'..=b'7')));
        assert_ne!(id, new_user_id().unwrap());
    }

    #[test]
    fn token_hashes_are_sha256_hex() {
        assert_eq!(
            token_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let t = token().unwrap();
        assert_eq!(t.len(), 43);
        assert_ne!(t, token().unwrap());
    }
}
