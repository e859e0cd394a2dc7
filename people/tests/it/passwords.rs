//! Password hashes: argon2id in the PHC format, never the plaintext.

use argon2::{Algorithm, Argon2, Params, Version};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use llmgw_people::{BadHash, PeopleError, hash_password, verify_password};

use crate::support::{Backend, Fx, GOOD, both_backends};

#[test]
fn passwords_are_hashed_not_stored() {
    let hash = hash_password(GOOD).unwrap();
    assert!(!hash.contains(GOOD));
    assert!(
        hash.starts_with("$argon2id$v=19$m=65536,t=3,p=4$"),
        "{hash}"
    );
    let parts: Vec<&str> = hash.split('$').collect();
    assert_eq!(STANDARD_NO_PAD.decode(parts[4]).unwrap().len(), 16);
    assert_eq!(STANDARD_NO_PAD.decode(parts[5]).unwrap().len(), 32);
    assert!(
        !parts[4].contains('=') && !parts[5].contains('='),
        "padding in {hash}"
    );
    assert_eq!(verify_password(GOOD, &hash), Ok(true));
    assert_eq!(
        verify_password("correct horse battery stapler", &hash),
        Ok(false)
    );
}

#[test]
fn two_hashes_of_one_password_differ() {
    let (a, b) = (hash_password(GOOD).unwrap(), hash_password(GOOD).unwrap());
    assert_ne!(a, b);
    assert_eq!(verify_password(GOOD, &b), Ok(true));
}

#[test]
fn short_passwords_are_refused() {
    assert!(matches!(
        hash_password("short"),
        Err(PeopleError::WeakPassword)
    ));
    assert!(matches!(
        hash_password(&"ğ".repeat(11)),
        Err(PeopleError::WeakPassword)
    ));
    assert!(hash_password(&"ğ".repeat(12)).is_ok());
}

#[test]
fn malformed_hashes_are_rejected_rather_than_matched() {
    let good = hash_password(GOOD).unwrap();
    let with_padding = format!("{good}=");
    let other_version = good.replace("v=19", "v=16");
    let argon2i = good.replace("argon2id", "argon2i");
    let extra_param = good.replace("p=4", "p=4,x=1");
    let huge_memory = good.replace("m=65536", "m=4000000000");
    for bad in [
        "",
        "plaintext",
        "$argon2id$",
        "$bcrypt$v=19$m=1,t=1,p=1$aa$bb",
        "$argon2id$v=19$m=65536,t=3,p=4$not base64!$aaaa",
        "$argon2id$v=19$m=65536,t=3,p=999$c2FsdHNhbHQ$aGFzaGhhc2g",
        &with_padding,
        &other_version,
        &argon2i,
        &extra_param,
        &huge_memory,
    ] {
        assert_eq!(verify_password(GOOD, bad), Err(BadHash), "{bad:?}");
    }
}

#[test]
fn hashes_made_under_older_parameters_still_verify() {
    // What a cheaper configuration would have stored, with a 24-byte key.
    let salt = b"an older salt!!!";
    let mut out = [0u8; 24];
    Argon2::new(
        Algorithm::Argon2id,
        Version::V0x13,
        Params::new(19_456, 2, 1, Some(24)).unwrap(),
    )
    .hash_password_into(GOOD.as_bytes(), salt, &mut out)
    .unwrap();
    let old = format!(
        "$argon2id$v=19$m=19456,t=2,p=1${}${}",
        STANDARD_NO_PAD.encode(salt),
        STANDARD_NO_PAD.encode(out)
    );
    assert_eq!(verify_password(GOOD, &old), Ok(true));
    assert_eq!(verify_password("something else entirely", &old), Ok(false));
}

both_backends!(the_people_table_holds_no_plaintext_password);

async fn the_people_table_holds_no_plaintext_password(b: Backend) {
    let fx = Fx::new(b).await;
    fx.active().await;
    let plain = format!("SELECT count(*) FROM people WHERE password_hash LIKE '%{GOOD}%'");
    assert_eq!(fx.count(&plain).await, 0);
    let hashed = "SELECT count(*) FROM people WHERE password_hash LIKE '$argon2id$v=19$%'";
    assert_eq!(fx.count(hashed).await, 1);
}
