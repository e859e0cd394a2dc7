//! Ed25519 signatures over what the log hands to the outside: an export's
//! trailer and the anchors a leader writes to its sink. The hash chain
//! shows a file is consistent in itself; a signature by the server's key
//! shows the server wrote it, so a rechained forgery needs the key too.
//!
//! Keys are PEM files as `openssl genpkey -algorithm ed25519` writes them
//! (PKCS#8), or as [`generate`] does; a public key is the PEM that
//! `openssl pkey -pubout` writes, or its 32 bytes as 64 hex digits. The
//! crypto is ring's, the library under this project's TLS already.

use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

use crate::hash;

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo: the 32 key bytes
/// follow it (RFC 8410).
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// Why a key could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyError(String);

/// A private signing key.
pub struct SigningKey {
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the private half.
        write!(f, "SigningKey({})", self.public())
    }
}

/// A public key: what an auditor holds to check a signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(pub [u8; 32]);

impl std::fmt::Display for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hash::to_hex(&self.0))
    }
}

impl PublicKey {
    /// A short name for the key, as people compare it: its first 8 bytes.
    pub fn short(&self) -> String {
        hash::to_hex(&self.0[..8])
    }

    /// 64 hex digits, or a PEM public key (`-----BEGIN PUBLIC KEY-----`).
    pub fn parse(text: &str) -> Result<PublicKey, KeyError> {
        let text = text.trim();
        if let Some(bytes) = hash::from_hex(&text.to_ascii_lowercase()) {
            return Ok(PublicKey(bytes));
        }
        let der = pem_body(text, "PUBLIC KEY").ok_or_else(|| {
            KeyError("not an Ed25519 public key (64 hex digits, or a PEM PUBLIC KEY)".into())
        })?;
        match der.strip_prefix(&SPKI_PREFIX[..]) {
            Some(key) if key.len() == 32 => {
                let mut out = [0; 32];
                out.copy_from_slice(key);
                Ok(PublicKey(out))
            }
            _ => Err(KeyError(
                "the PEM PUBLIC KEY is not an Ed25519 key (only Ed25519 signs the log)".into(),
            )),
        }
    }

    /// The PEM `openssl pkey -pubin` reads.
    pub fn to_pem(&self) -> String {
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.0);
        pem("PUBLIC KEY", &der)
    }

    /// Whether `signature` is this key's over `message`.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, self.0)
            .verify(message, signature)
            .is_ok()
    }
}

impl SigningKey {
    /// A PEM private key (`-----BEGIN PRIVATE KEY-----`, PKCS#8).
    pub fn parse(text: &str) -> Result<SigningKey, KeyError> {
        let der = pem_body(text.trim(), "PRIVATE KEY").ok_or_else(|| {
            KeyError("not a PEM private key (-----BEGIN PRIVATE KEY-----)".into())
        })?;
        // openssl writes PKCS#8 version 1, without the public half: ring
        // derives it, which is what "maybe unchecked" admits.
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
            .map_err(|e| KeyError(format!("not an Ed25519 private key: {e}")))?;
        Ok(SigningKey { pair })
    }

    /// Reads a key file.
    pub fn read(path: &std::path::Path) -> Result<SigningKey, KeyError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| KeyError(format!("cannot read {}: {e}", path.display())))?;
        SigningKey::parse(&text).map_err(|e| KeyError(format!("{}: {e}", path.display())))
    }

    pub fn public(&self) -> PublicKey {
        let mut out = [0; 32];
        out.copy_from_slice(self.pair.public_key().as_ref());
        PublicKey(out)
    }

    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        let mut out = [0; 64];
        out.copy_from_slice(self.pair.sign(message).as_ref());
        out
    }
}

/// A new key as PEM (PKCS#8), from the system's random source.
pub fn generate() -> Result<String, KeyError> {
    let doc = Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
        .map_err(|_| KeyError("the system's random source failed".into()))?;
    Ok(pem("PRIVATE KEY", doc.as_ref()))
}

/// A signature as it travels in a trailer or an anchor line: the signer's
/// public key and the signature, in hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// Always `ed25519`: a reader refuses what it does not know.
    pub alg: String,
    /// The signer's public key (64 hex digits). It says who claims to have
    /// signed; only a key the reader already holds proves it.
    pub key: String,
    /// 128 hex digits.
    pub sig: String,
}

/// What a signature check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Good, and by the key the reader holds.
    Proven(PublicKey),
    /// Good by the key it names, which the reader was not given.
    SelfConsistent(PublicKey),
}

impl Signature {
    /// Signs `value` (canonical JSON, prefixed with what it is, so that a
    /// signature over one kind of thing is never valid for another).
    pub fn over(key: &SigningKey, context: &str, value: &serde_json::Value) -> Signature {
        let sig = key.sign(&message(context, value));
        Signature {
            alg: "ed25519".into(),
            key: key.public().to_string(),
            sig: hash::to_hex(&sig),
        }
    }

    /// Checks the signature over `value`; with `trusted`, also that the key
    /// is that one. The reason when it fails.
    pub fn check(
        &self,
        context: &str,
        value: &serde_json::Value,
        trusted: Option<&PublicKey>,
    ) -> Result<Checked, String> {
        if self.alg != "ed25519" {
            return Err(format!(
                "the signature is {:?}, and only ed25519 is known",
                self.alg
            ));
        }
        let key = PublicKey::parse(&self.key)
            .map_err(|_| "the signature names no valid public key".to_owned())?;
        let sig = from_hex_any(&self.sig)
            .filter(|s| s.len() == 64)
            .ok_or_else(|| "the signature is not 128 hex digits".to_owned())?;
        if !key.verifies(&message(context, value), &sig) {
            return Err(format!(
                "bad signature: key {} did not sign this (it was altered after signing, or signed by another key)",
                key.short()
            ));
        }
        match trusted {
            Some(t) if *t != key => Err(format!(
                "signed by key {}, not by the key given ({}): someone else signed it",
                key.short(),
                t.short()
            )),
            Some(_) => Ok(Checked::Proven(key)),
            None => Ok(Checked::SelfConsistent(key)),
        }
    }
}

fn message(context: &str, value: &serde_json::Value) -> Vec<u8> {
    let mut out = format!("llmgw {context}\n").into_bytes();
    hash::write_canonical(value, &mut out);
    out
}

fn from_hex_any(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.as_bytes()
        .chunks(2)
        .map(|c| u8::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok())
        .collect()
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// The DER inside a PEM block labelled `label`.
fn pem_body(text: &str, label: &str) -> Option<Vec<u8>> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text.find(&begin)? + begin.len();
    let stop = start + text[start..].find(&end)?;
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in text[start..stop].bytes() {
        if c.is_ascii_whitespace() {
            continue;
        }
        if c == b'=' {
            break;
        }
        let v = B64.iter().position(|&b| b == c)? as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
            bits &= (1 << n) - 1;
        }
    }
    Some(out)
}

fn pem(label: &str, der: &[u8]) -> String {
    let mut b64 = String::new();
    for chunk in der.chunks(3) {
        let v = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(B64[((v >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_generated_key_signs_and_its_public_half_checks() {
        let key = SigningKey::parse(&generate().unwrap()).unwrap();
        let public = PublicKey::parse(&key.public().to_pem()).unwrap();
        assert_eq!(public, key.public());
        assert_eq!(PublicKey::parse(&public.to_string()).unwrap(), public);
        let value = json!({"head": 5, "hash": "ab"});
        let s = Signature::over(&key, "trailer", &value);
        assert_eq!(
            s.check("trailer", &value, Some(&public)),
            Ok(Checked::Proven(public))
        );
        assert_eq!(
            s.check("trailer", &value, None),
            Ok(Checked::SelfConsistent(public))
        );
        let err = s
            .check("trailer", &json!({"head": 6, "hash": "ab"}), None)
            .unwrap_err();
        assert!(err.starts_with("bad signature"), "{err}");
        assert!(s.check("anchor", &value, None).is_err(), "another context");
        let other = SigningKey::parse(&generate().unwrap()).unwrap().public();
        let err = s.check("trailer", &value, Some(&other)).unwrap_err();
        assert!(err.contains("not by the key given"), "{err}");
    }

    #[test]
    fn openssl_keys_are_read() {
        // `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout`
        // (RFC 8410's example key).
        let private = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n-----END PRIVATE KEY-----\n";
        let public = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n";
        let key = SigningKey::parse(private).unwrap();
        assert_eq!(key.public(), PublicKey::parse(public).unwrap());
        assert_eq!(key.public().to_pem(), public);
        assert!(PublicKey::parse("nonsense").is_err());
        assert!(SigningKey::parse(public).is_err());
    }
}
