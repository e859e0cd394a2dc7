//! What the log page was asked for: its query string, checked, and the
//! links that keep it while changing one thing (the next page, a filter).

use chrono::{DateTime, Utc};
use llmgw_eventstore::EventFilter;
use serde::Deserialize;

use super::thing::Thing;
use crate::WebError;

/// `/admin/events?…` as sent; every field optional, blanks ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct LogParams {
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    pub stream: Option<String>,
    pub actor: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub thing: Option<String>,
    pub before: Option<String>,
}

/// A checked request for one page of the log.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogQuery {
    pub params: LogParams,
    pub thing: Option<Thing>,
    /// An exact stream, or a prefix (`node-*`).
    pub stream: Option<StreamMatch>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    /// Show events below this position (keyset paging).
    pub before: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StreamMatch {
    Exact(String),
    Prefix(String),
}

fn blank_to_none(v: &mut Option<String>) {
    if v.as_deref().is_some_and(|s| s.trim().is_empty()) {
        *v = None;
    } else if let Some(s) = v {
        *s = s.trim().to_owned();
    }
}

impl LogQuery {
    pub(crate) fn parse(mut params: LogParams) -> Result<LogQuery, WebError> {
        for v in [
            &mut params.event_type,
            &mut params.stream,
            &mut params.actor,
            &mut params.from,
            &mut params.to,
            &mut params.thing,
            &mut params.before,
        ] {
            blank_to_none(v);
        }
        if let Some(t) = &mut params.event_type {
            *t = known_type(t)?.to_owned();
        }
        let thing = params.thing.as_deref().map(Thing::parse).transpose()?;
        let stream = params.stream.as_deref().map(|s| match s.strip_suffix('*') {
            Some(prefix) => StreamMatch::Prefix(prefix.to_owned()),
            None => StreamMatch::Exact(s.to_owned()),
        });
        let from = params
            .from
            .as_deref()
            .map(|t| parse_time(t, Bound::Start))
            .transpose()?;
        let to = params
            .to
            .as_deref()
            .map(|t| parse_time(t, Bound::End))
            .transpose()?;
        if let (Some(f), Some(t)) = (from, to)
            && f >= t
        {
            return Err(WebError::Bad(format!(
                "the time range is empty: {} is not before {}",
                f.to_rfc3339(),
                t.to_rfc3339()
            )));
        }
        let before = params
            .before
            .as_deref()
            .map(|b| {
                b.parse::<u64>().map_err(|_| {
                    WebError::Bad(format!("before={b:?} is not a position (a whole number)"))
                })
            })
            .transpose()?;
        Ok(LogQuery {
            params,
            thing,
            stream,
            from,
            to,
            before,
        })
    }

    /// Whether anything narrows the log.
    pub(crate) fn filtered(&self) -> bool {
        self.thing.is_some()
            || self.stream.is_some()
            || self.params.event_type.is_some()
            || self.params.actor.is_some()
            || self.from.is_some()
            || self.to.is_some()
    }

    /// The store's filter; `thing_streams` are the thing's streams when
    /// one is asked for. None when nothing can match (a stream outside
    /// the thing's).
    pub(crate) fn filter(&self, thing_streams: Vec<String>) -> Option<EventFilter> {
        let mut f = EventFilter {
            event_type: self.params.event_type.clone(),
            actor: self.params.actor.clone(),
            from: self.from,
            to: self.to,
            streams: thing_streams,
            stream_prefix: None,
        };
        match &self.stream {
            Some(StreamMatch::Prefix(p)) => f.stream_prefix = Some(p.clone()),
            Some(StreamMatch::Exact(s)) if self.thing.is_some() => {
                if !f.streams.contains(s) {
                    return None;
                }
                f.streams = vec![s.clone()];
            }
            Some(StreamMatch::Exact(s)) => f.streams = vec![s.clone()],
            None => {}
        }
        Some(f)
    }

    /// This page's query string with `before` replaced (None: the newest).
    pub(crate) fn link(&self, before: Option<u64>) -> String {
        let p = &self.params;
        let before = before.map(|b| b.to_string());
        let pairs = [
            ("thing", p.thing.as_deref()),
            ("type", p.event_type.as_deref()),
            ("stream", p.stream.as_deref()),
            ("actor", p.actor.as_deref()),
            ("from", p.from.as_deref()),
            ("to", p.to.as_deref()),
            ("before", before.as_deref()),
        ];
        query_string(&pairs)
    }
}

/// The event type `asked` names, in its own case (`keyissued` is
/// KeyIssued); a name no event has is refused with the names there are,
/// where it quietly showed no events, which read as "none such happened".
fn known_type(asked: &str) -> Result<&'static str, WebError> {
    let types = || llmgw_domain::Event::types().map(|(t, _)| t);
    types()
        .find(|t| *t == asked)
        .or_else(|| types().find(|t| t.eq_ignore_ascii_case(asked)))
        .ok_or_else(|| {
            WebError::Bad(format!(
                "no event type is {asked:?}: the types are {}",
                types().collect::<Vec<_>>().join(", ")
            ))
        })
}

/// `/admin/events?k=v&…` for the pairs that have a value.
pub(crate) fn query_string(pairs: &[(&str, Option<&str>)]) -> String {
    let mut out = String::from("/admin/events");
    let mut sep = '?';
    for (k, v) in pairs {
        if let Some(v) = v {
            out.push(sep);
            out.push_str(k);
            out.push('=');
            out.push_str(&encode(v));
            sep = '&';
        }
    }
    out
}

/// Percent-encodes everything but the unreserved characters, so a value
/// cannot break out of its parameter.
fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Which end of a range a bare date stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    /// The day's first moment.
    Start,
    /// The day's end: `to=2026-12-01` includes that whole day.
    End,
}

/// An RFC 3339 time, a time without a zone (taken as UTC), or a date.
pub(crate) fn parse_time(text: &str, bound: Bound) -> Result<DateTime<Utc>, WebError> {
    llmgw_projections::parse_time(text, bound == Bound::End).ok_or_else(|| {
        WebError::Bad(format!(
            "{text:?} is not a time: write 2026-12-01T10:00:00Z (RFC 3339) or a date, 2026-12-01"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut LogParams)) -> LogParams {
        let mut p = LogParams::default();
        f(&mut p);
        p
    }

    #[test]
    fn times_are_rfc3339_or_dates_and_a_date_ends_with_its_day() {
        let t = |s, b| parse_time(s, b).map(|t| t.to_rfc3339()).ok();
        assert_eq!(
            t("2026-12-01T10:00:00+02:00", Bound::Start).as_deref(),
            Some("2026-12-01T08:00:00+00:00")
        );
        assert_eq!(
            t("2026-12-01", Bound::Start).as_deref(),
            Some("2026-12-01T00:00:00+00:00")
        );
        assert_eq!(
            t("2026-12-01", Bound::End).as_deref(),
            Some("2026-12-02T00:00:00+00:00")
        );
        assert_eq!(
            t("2026-12-01T10:30", Bound::Start).as_deref(),
            Some("2026-12-01T10:30:00+00:00")
        );
        assert_eq!(t("yesterday", Bound::Start), None);
        assert_eq!(t("2026-13-01", Bound::Start), None);
    }

    #[test]
    fn bad_input_is_refused_with_what_to_write() {
        let bad = |p: LogParams| match LogQuery::parse(p) {
            Err(WebError::Bad(why)) => why,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert!(bad(params(|p| p.from = Some("soon".into()))).contains("RFC 3339"));
        assert!(bad(params(|p| p.before = Some("-1".into()))).contains("position"));
        assert!(bad(params(|p| p.thing = Some("gpu".into()))).contains("node:NAME"));
        let typo = bad(params(|p| p.event_type = Some("KeyIsued".into())));
        assert!(
            typo.contains(r#""KeyIsued""#) && typo.contains("KeyIssued, KeyRevoked"),
            "{typo}"
        );
        assert!(
            bad(params(|p| {
                p.from = Some("2026-12-02".into());
                p.to = Some("2026-12-01".into());
            }))
            .contains("empty")
        );
    }

    #[test]
    fn a_type_in_another_case_is_the_type() {
        let q =
            LogQuery::parse(params(|p| p.event_type = Some("keyissued".into()))).expect("valid");
        assert_eq!(q.params.event_type.as_deref(), Some("KeyIssued"));
        assert_eq!(
            q.filter(Vec::new())
                .expect("a filter")
                .event_type
                .as_deref(),
            Some("KeyIssued")
        );
    }

    #[test]
    fn blanks_are_no_filter_and_a_star_makes_a_prefix() {
        let q = LogQuery::parse(params(|p| {
            p.event_type = Some(" ".into());
            p.stream = Some("node-*".into());
        }))
        .expect("valid");
        assert_eq!(q.params.event_type, None);
        let f = q.filter(Vec::new()).expect("a filter");
        assert_eq!(f.stream_prefix.as_deref(), Some("node-"));
        assert!(f.streams.is_empty());
    }

    #[test]
    fn an_exact_stream_narrows_a_things_history() {
        let q = LogQuery::parse(params(|p| {
            p.thing = Some("node:a".into());
            p.stream = Some("audit-node-a".into());
        }))
        .expect("valid");
        let streams = vec!["audit-node-a".to_owned(), "node-a".to_owned()];
        assert_eq!(
            q.filter(streams.clone()).expect("a filter").streams,
            vec!["audit-node-a".to_owned()]
        );
        let q = LogQuery::parse(params(|p| {
            p.thing = Some("node:a".into());
            p.stream = Some("key-k1".into());
        }))
        .expect("valid");
        assert_eq!(q.filter(streams), None, "outside the thing: nothing");
    }

    #[test]
    fn links_keep_the_filters_and_escape_them() {
        let q = LogQuery::parse(params(|p| {
            p.actor = Some("a&b=c d".into());
            p.event_type = Some("KeyIssued".into());
        }))
        .expect("valid");
        assert_eq!(
            q.link(Some(42)),
            "/admin/events?type=KeyIssued&actor=a%26b%3Dc%20d&before=42"
        );
        assert_eq!(
            q.link(None),
            "/admin/events?type=KeyIssued&actor=a%26b%3Dc%20d"
        );
    }
}
