//! A plain answer's usage, read without building any of the document: the
//! other fields are skipped unread, and the `usage` object's two counts are
//! read as numbers, each as `Value::as_u64` would read it (a count of any
//! other type reads as absent). Building the `usage` object as a `Value`
//! took a map and a string for each of its keys, on every request.

use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A plain answer as far as its usage.
#[derive(serde::Deserialize)]
pub(super) struct Answer {
    pub(super) usage: Option<Usage>,
}

/// A `usage` object's counts. Anything but an object (or null) is no
/// usage, and fails the answer's reading, as a `Value` that is not an
/// object has no fields.
#[derive(Debug, Default)]
pub(super) struct Usage {
    pub(super) prompt: Option<u64>,
    pub(super) completion: Option<u64>,
}

impl<'de> Deserialize<'de> for Usage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(UsageVisitor)
    }
}

#[derive(serde::Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Key {
    PromptTokens,
    CompletionTokens,
    #[serde(other)]
    Other,
}

struct UsageVisitor;

impl<'de> Visitor<'de> for UsageVisitor {
    type Value = Usage;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a usage object")
    }

    /// A repeated key counts as its last value, as in a parsed `Value`.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Usage, A::Error> {
        let mut usage = Usage::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::PromptTokens => usage.prompt = map.next_value::<Count>()?.0,
                Key::CompletionTokens => usage.completion = map.next_value::<Count>()?.0,
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(usage)
    }
}

/// Any JSON value: a non-negative integer that fits a u64 is its count;
/// every other value (negative, fractional, a string, an array…) is None.
struct Count(Option<u64>);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CountVisitor)
    }
}

struct CountVisitor;

impl<'de> Visitor<'de> for CountVisitor {
    type Value = Count;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_u64<E>(self, v: u64) -> Result<Count, E> {
        Ok(Count(Some(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Count, E> {
        Ok(Count(u64::try_from(v).ok()))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Count, E> {
        Ok(Count(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Count, E> {
        Ok(Count(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<Count, E> {
        Ok(Count(None))
    }
    fn visit_unit<E>(self) -> Result<Count, E> {
        Ok(Count(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Count(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Count, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Count(None))
    }
}
