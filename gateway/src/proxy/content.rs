//! A message's content, a completion's prompt or embeddings' input as the
//! request's head reads them: only their texts, borrowed from the body
//! where the JSON holds them without escapes, and everything else skipped
//! unread. Read into `serde_json::Value`s, a chat's every message was
//! copied (and each content part made a map) for the prompt's text alone.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The texts of a content value, a prompt or an input.
#[derive(Debug, Default)]
pub(crate) enum Content<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<Part<'a>>),
    /// Anything else: null, a number, a bool, an object.
    #[default]
    Other,
}

/// One item of an array of content.
#[derive(Debug)]
pub(crate) enum Part<'a> {
    /// A string (a completion's prompts, embeddings' inputs).
    Bare(Cow<'a, str>),
    /// An object's `text` (a chat message's text part); the last `text`
    /// key wins, as in a parsed document, and a `text` that is not a
    /// string is none.
    Object(Option<Cow<'a, str>>),
    /// Anything else (a token array, a number).
    Other,
}

impl Content<'_> {
    /// Each text as the prompt counts it: the string, or the strings and
    /// the text parts of the array.
    pub(crate) fn each_text(&self, mut f: impl FnMut(&str)) {
        match self {
            Content::Text(s) => f(s),
            Content::Parts(parts) => {
                for p in parts {
                    match p {
                        Part::Bare(s) | Part::Object(Some(s)) => f(s),
                        Part::Object(None) | Part::Other => {}
                    }
                }
            }
            Content::Other => {}
        }
    }
}

/// A visitor's answer to a string: `$wrap` of it, borrowed from the body
/// where the JSON holds it without escapes.
macro_rules! strings_are {
    ($wrap:expr) => {
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok($wrap(Cow::Borrowed(v)))
        }

        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok($wrap(Cow::Owned(v.to_owned())))
        }

        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok($wrap(Cow::Owned(v)))
        }
    };
}

/// A visitor's answer to the scalars (null, bools, numbers): `$none`.
macro_rules! scalars_are {
    ($none:expr) => {
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($none)
        }

        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($none)
        }

        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($none)
        }

        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($none)
        }

        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($none)
        }
    };
}

struct ContentVisitor;

impl<'de> Visitor<'de> for ContentVisitor {
    type Value = Content<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    strings_are!(Content::Text);

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(p) = seq.next_element::<Part<'de>>()? {
            parts.push(p);
        }
        Ok(Content::Parts(parts))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_map(map).map(|_| Content::Other)
    }

    scalars_are!(Content::Other);
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ContentVisitor)
    }
}

/// A part's keys: `text`, or one skipped unread.
#[derive(serde::Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Key {
    Text,
    #[serde(other)]
    Other,
}

/// A part's `text`: a string, or none for any other value.
struct MaybeText<'a>(Option<Cow<'a, str>>);

struct MaybeTextVisitor;

impl<'de> Visitor<'de> for MaybeTextVisitor {
    type Value = MaybeText<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    strings_are!(|t| MaybeText(Some(t)));

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| MaybeText(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_map(map).map(|_| MaybeText(None))
    }

    scalars_are!(MaybeText(None));
}

impl<'de: 'a, 'a> Deserialize<'de> for MaybeText<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MaybeTextVisitor)
    }
}

struct PartVisitor;

impl<'de> Visitor<'de> for PartVisitor {
    type Value = Part<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    strings_are!(Part::Bare);

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut text = None;
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Text => text = map.next_value::<MaybeText<'de>>()?.0,
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Part::Object(text))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| Part::Other)
    }

    scalars_are!(Part::Other);
}

impl<'de: 'a, 'a> Deserialize<'de> for Part<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PartVisitor)
    }
}

/// A string, borrowed from the body where the JSON holds it without
/// escapes. (serde's `borrow` attribute borrows a `Cow<str>` field, but
/// not one inside an `Option`.)
#[derive(Debug)]
pub(crate) struct Str<'a>(pub(crate) Cow<'a, str>);

struct StrVisitor;

impl<'de> Visitor<'de> for StrVisitor {
    type Value = Str<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    strings_are!(Str);
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor)
    }
}
