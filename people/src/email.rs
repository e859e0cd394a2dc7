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
/// with something before and after it, no spaces, `<`, `>` or `"`, no
/// control, invisible or direction character, and a `.` in the domain.
///
/// The address is printed where an operator reads it (`llmgw users list`
/// in a terminal, the admin pages): an escape sequence in it recoloured
/// or retitled the operator's terminal, and U+202E made it read as
/// another address. Names and key names refuse the same characters.
pub fn check_email(raw: &str) -> Result<String> {
    let email = normalize_email(raw);
    let ok = email.len() <= MAX_EMAIL_LEN
        && !email.contains([' ', '<', '>', '"'])
        && !email.chars().any(llmgw_domain::tenancy::hidden_char)
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
            "a\tb@example.com",
            "eve\x1b[31mred\x1b]0;pwned\x07@x.com",
            "mallory\u{202e}@x.com",
            "zero\u{200b}width@x.com",
            "soft\u{00ad}hyphen@x.com",
            "bom\u{feff}@x.com",
            "del\u{7f}@x.com",
            "c1\u{9b}31m@x.com",
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
