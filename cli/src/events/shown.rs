//! Text from the log as `events log`, `tail` and `show` print it: a
//! control, invisible or direction character (`hidden_char`) is written
//! escaped, never raw. An operator's name with a newline forged a second
//! line in `events log`, and one with an escape sequence cleared the
//! auditor's screen; names are refused such characters now, but older
//! events (and an imported log) may hold them.

use std::borrow::Cow;
use std::fmt::Write;

use llmgw_domain::tenancy::hidden_char;

/// `text` with each hidden character as `\n`, `\r`, `\t` or `\u{XXXX}`.
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if hidden_char(c) => {
                let _ = write!(out, "\\u{{{:04x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A table row's cells, each [`printable`].
pub(crate) fn cells(row: Vec<String>) -> Vec<String> {
    row.into_iter()
        .map(|cell| match printable(&cell) {
            Cow::Borrowed(_) => cell,
            Cow::Owned(escaped) => escaped,
        })
        .collect()
}

/// Text of several lines (a pretty-printed payload, a table), each line
/// [`printable`], the line breaks kept.
pub(crate) fn lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        out.push_str(&printable(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_would_print_as_something_else_is_escaped() {
        assert!(matches!(printable("alice"), Cow::Borrowed("alice")));
        assert_eq!(
            printable("bob\n2026-12-07T18:00:00.000Z  1  key-K  KeyRevoked  alice"),
            "bob\\n2026-12-07T18:00:00.000Z  1  key-K  KeyRevoked  alice"
        );
        assert_eq!(printable("\u{1b}[2Jbob"), "\\u{001b}[2Jbob");
        assert_eq!(
            printable("a\u{202E}b\u{9b}c\td"),
            "a\\u{202e}b\\u{009b}c\\td"
        );
        assert_eq!(printable("jürgen"), "jürgen");
        assert_eq!(
            lines("{\n  \"by\": \"x\u{202E}\"\n}"),
            "{\n  \"by\": \"x\\u{202e}\"\n}\n"
        );
    }
}
