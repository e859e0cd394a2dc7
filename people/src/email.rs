//! Email addresses: one spelling per person.

use crate::{PeopleError, Result};

/// Longest address SMTP carries (RFC 5321); longer is not a real address.
const MAX_EMAIL_LEN: usize = 254;

/// Trimmed and lower-cased, so `Ayse@Example.COM` and `ayse@example.com`
/// are one account.
pub fn normalize_email(raw: &str) -> String {
    raw.trim().to_lowercase()
}

/// The normalised address, or `InvalidEmail` unless it has exactly one `@`
/// with something before and after it, no spaces, line breaks, `<`, `>` or
/// `"`, and a `.` in the domain.
pub fn check_email(raw: &str) -> Result<String> {
    let email = normalize_email(raw);
    let ok = email.len() <= MAX_EMAIL_LEN
        && !email.contains([' ', '\t', '\r', '\n', '<', '>', '"'])
        && matches!(email.split_once('@'),
            Some((local, domain)) if !local.is_empty() && !domain.contains('@') && domain.contains('.'));
    if ok {
        Ok(email)
    } else {
        Err(PeopleError::InvalidEmail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_lower_cased_and_trimmed() {
        assert_eq!(
            check_email(" Ayse@Example.COM ").unwrap(),
            "ayse@example.com"
        );
    }

    #[test]
    fn obvious_non_addresses_are_refused() {
        for bad in [
            "",
            "ayse",
            "ayse@",
            "@example.com",
            "a b@example.com",
            "a@b",
            "a@@b.com",
            "a@b.com@c.com",
            "<a@b.com>",
            "\"a\"@b.com",
            "a@b\n.com",
        ] {
            assert!(
                matches!(check_email(bad), Err(PeopleError::InvalidEmail)),
                "{bad:?} passed"
            );
        }
        let long = format!("{}@example.com", "a".repeat(250));
        assert!(check_email(&long).is_err());
    }
}
