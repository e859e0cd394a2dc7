//! The limits of a memory note, each with its own refusal, so a client
//! (often an agent, reading the message) knows which one it hit.

use crate::ConvoError;

/// A note's key, in bytes.
pub const MAX_KEY_BYTES: usize = 200;
/// A note's text, in bytes (16 KiB).
pub const MAX_TEXT_BYTES: usize = 16 * 1024;
/// Tags on one note.
pub const MAX_TAGS: usize = 16;
/// One tag, in bytes.
pub const MAX_TAG_BYTES: usize = 64;
/// Notes one agent of a project keeps.
pub const MAX_NOTES_PER_AGENT: u64 = 1000;
/// Words in one search.
pub const MAX_QUERY_WORDS: usize = 16;
/// An agent's name or a thread's id, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

pub fn check_key(key: &str) -> Result<(), ConvoError> {
    if key.is_empty() {
        return Err(ConvoError::Invalid("a note needs a key".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(ConvoError::Invalid(format!(
            "a note's key is at most {MAX_KEY_BYTES} bytes; this one has {}",
            key.len()
        )));
    }
    if key.chars().any(char::is_control) {
        return Err(ConvoError::Invalid(
            "a note's key has no control characters".into(),
        ));
    }
    Ok(())
}

pub fn check_text(text: &str) -> Result<(), ConvoError> {
    // PostgreSQL's text holds no NUL: refused for every store alike, so
    // a client is told, not answered "try again" for ever.
    if text.contains('\0') {
        return Err(ConvoError::Invalid(
            "a note's text has no NUL characters (\\u0000)".into(),
        ));
    }
    if text.len() > MAX_TEXT_BYTES {
        return Err(ConvoError::Invalid(format!(
            "a note's text is at most 16 KiB ({MAX_TEXT_BYTES} bytes); this one has {}",
            text.len()
        )));
    }
    Ok(())
}

pub fn check_tag(tag: &str) -> Result<(), ConvoError> {
    let ok = !tag.is_empty()
        && tag.len() <= MAX_TAG_BYTES
        && tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ConvoError::Invalid(format!(
            "tag {tag:?} must be 1 to {MAX_TAG_BYTES} of a-z, 0-9, _ and -"
        )))
    }
}

/// The tags, checked, without repeats, in the order given.
pub fn check_tags(tags: &[String]) -> Result<Vec<String>, ConvoError> {
    let mut out: Vec<String> = Vec::new();
    for t in tags {
        check_tag(t)?;
        if !out.contains(t) {
            out.push(t.clone());
        }
    }
    if out.len() > MAX_TAGS {
        return Err(ConvoError::Invalid(format!(
            "a note has at most {MAX_TAGS} tags; this one has {}",
            out.len()
        )));
    }
    Ok(out)
}

/// An agent's name (`x-llmgw-agent`) or a thread's id: 1 to 128 of
/// letters, digits and `- _ . :`.
pub fn check_name(kind: &str, name: &str) -> Result<(), ConvoError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ConvoError::Invalid(format!(
            "{kind} {name:?} must be 1 to {MAX_NAME_BYTES} of letters, digits and - _ . :"
        )))
    }
}

/// Latin letters with accents, lower then upper case, and what each folds
/// to: SQLite's unicode61 tokenizer folds them, and PostgreSQL's index of
/// a note (migration 0007) translates by this same table, so `cafe` finds
/// `café` on both.
pub const FOLD_FROM: &str = "áàâäãåāçćčéèêëēěíìîïīñńňóòôöõōśšşúùûüūůýÿźžżğřťďÁÀÂÄÃÅĀÇĆČÉÈÊËĒĚÍÌÎÏĪÑŃŇÓÒÔÖÕŌŚŠŞÚÙÛÜŪŮÝŸŹŽŻĞŘŤĎ";
/// See [`FOLD_FROM`].
pub const FOLD_TO: &str = "aaaaaaaccceeeeeeiiiiinnnoooooosssuuuuuuyyzzzgrtdaaaaaaaccceeeeeeiiiiinnnoooooosssuuuuuuyyzzzgrtd";

/// `word` with its accents folded by [`FOLD_FROM`].
pub fn fold(word: &str) -> String {
    word.chars()
        .map(|c| match FOLD_FROM.chars().position(|f| f == c) {
            Some(i) => FOLD_TO.chars().nth(i).unwrap_or(c),
            None => c,
        })
        .collect()
}

/// The words of a search, lower-cased: runs of letters and digits, as both
/// backends' tokenizers split text (SQLite's unicode61, PostgreSQL's
/// 'simple' configuration), so that a query means the same on both.
pub fn query_words(q: &str) -> Result<Vec<String>, ConvoError> {
    let words: Vec<String> = q
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| fold(&w.to_lowercase()))
        .collect();
    if words.is_empty() {
        return Err(ConvoError::Invalid(
            "q has no words to search for (letters or digits)".into(),
        ));
    }
    if words.len() > MAX_QUERY_WORDS {
        return Err(ConvoError::Invalid(format!(
            "a search has at most {MAX_QUERY_WORDS} words; this one has {}",
            words.len()
        )));
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_names_itself() {
        let msg = |r: Result<(), ConvoError>| r.unwrap_err().to_string();
        assert!(msg(check_key(&"k".repeat(201))).contains("200 bytes"));
        assert!(check_key(&"k".repeat(200)).is_ok());
        assert!(msg(check_text(&"t".repeat(16 * 1024 + 1))).contains("16 KiB"));
        assert!(msg(check_text("a\0b")).contains("no NUL"));
        assert_eq!(
            query_words("Café NAÏVE v1.2").unwrap(),
            ["cafe", "naive", "v1", "2"]
        );
        // PostgreSQL's index folds by the same table.
        let pg = include_str!("../../migrations/postgres/0007_notes_search.sql");
        assert!(pg.contains(FOLD_FROM) && pg.contains(FOLD_TO));
        assert_eq!(FOLD_FROM.chars().count(), FOLD_TO.chars().count());
        assert!(check_text(&"t".repeat(16 * 1024)).is_ok());
        let tags: Vec<String> = (0..17).map(|i| format!("t{i}")).collect();
        assert!(
            check_tags(&tags)
                .unwrap_err()
                .to_string()
                .contains("at most 16 tags")
        );
        assert!(msg(check_tag("Upper")).contains("a-z, 0-9"));
        assert_eq!(
            query_words("Deploy, the GPU-node!").unwrap(),
            ["deploy", "the", "gpu", "node"]
        );
        assert!(query_words(" -- ").is_err());
    }
}
