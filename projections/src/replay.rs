//! The views as they stood at a point of the log: what `llmgw events
//! replay` prints and the event-log page shows. Views are the same whether
//! built live or replayed, so a replay may start from any set of views
//! whose checkpoint is not past the point.

use chrono::{DateTime, Utc};
use llmgw_eventstore::{AnyStore, DecodingReader, EventStore, StoreError};

use crate::{Projections, REPLAY_PAGE, decode_text};

/// The last position recorded at or before `t` (0 when nothing was):
/// "as it stood at `t`" includes everything recorded up to it.
pub async fn position_at(store: &AnyStore, t: DateTime<Utc>) -> Result<u64, StoreError> {
    let after = t + chrono::Duration::microseconds(1);
    let first_after = store
        .read_time_range_raw(after, DateTime::<Utc>::MAX_UTC, 0, 1)
        .await?;
    Ok(match first_after.first() {
        Some(e) => e.position - 1,
        None => store.head().await?.0,
    })
}

/// Applies the events after `views`' checkpoint up to position `stop`
/// (inclusive); returns when the last applied one was recorded.
pub async fn replay_to(
    store: &AnyStore,
    views: &mut Projections,
    stop: u64,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let mut recorded_at = None;
    let mut reader = DecodingReader::new(
        store.clone(),
        views.checkpoint.position,
        REPLAY_PAGE,
        decode_text,
    );
    while views.checkpoint.position < stop {
        let page = reader.next_page().await?;
        if page.is_empty() {
            break;
        }
        for d in page.iter().take_while(|d| d.stamp.position <= stop) {
            views.apply_decoded(d);
            recorded_at = Some(d.recorded_at);
        }
        reader.recycle(page);
    }
    Ok(recorded_at)
}

/// A time as people write it: RFC 3339; a time without a zone, taken as
/// UTC (`2026-12-02T20:21:30`, `2026-12-02 20:21:30`, `2026-12-02T20:21`);
/// or a date, meaning its first instant, or with `day_end` the first
/// instant of the next day (so that "to 2026-12-01" includes that day).
pub fn parse_time(text: &str, day_end: bool) -> Option<DateTime<Utc>> {
    use chrono::{NaiveDate, NaiveDateTime};
    let text = text.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&Utc));
    }
    // With a zone but not RFC 3339's every field: minutes only
    // (`2026-12-02T20:21Z`), or a space for the `T`.
    for format in [
        "%Y-%m-%dT%H:%M%#z",
        "%Y-%m-%d %H:%M%#z",
        "%Y-%m-%d %H:%M:%S%.f%#z",
    ] {
        if let Ok(t) = DateTime::parse_from_str(text, format) {
            return Some(t.with_timezone(&Utc));
        }
    }
    for format in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(text, format) {
            return Some(t.and_utc());
        }
    }
    let day = NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()?;
    let day = if day_end { day.succ_opt()? } else { day };
    Some(day.and_hms_opt(0, 0, 0)?.and_utc())
}

/// The instants a written time stands for: from its first to the last
/// (to the microsecond, the log's precision) of its last written unit: a
/// day for a date, a minute, a second, or the last digit of a fraction.
/// So a time copied from a table that prints milliseconds, taken as where
/// a range ends, still covers the event it was printed beside.
pub fn parse_span(text: &str) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let start = parse_time(text, false)?;
    // The clock after the date (`T` or a space between), without its zone;
    // none for a date. Read by its shape: a field may have one digit.
    let clock = text
        .trim()
        .split_once(['T', 't', ' '])
        .map(|(_, time)| time.split(['Z', 'z', '+', '-']).next().unwrap_or_default());
    let unit = match clock {
        None => chrono::Duration::days(1),
        Some(clock) => match clock.split(':').nth(2) {
            None => chrono::Duration::minutes(1),
            Some(seconds) => match seconds.split_once('.') {
                None => chrono::Duration::seconds(1),
                Some((_, fraction)) => {
                    // Past microseconds the log cannot tell instants apart.
                    let digits = fraction.len().min(6);
                    let digits = u32::try_from(digits).unwrap_or(6);
                    chrono::Duration::microseconds(10_i64.pow(6 - digits))
                }
            },
        },
    };
    Some((start, start + unit - chrono::Duration::microseconds(1)))
}

#[cfg(test)]
mod tests {
    use super::{parse_span, parse_time};

    #[test]
    fn a_written_time_spans_its_last_unit() {
        let span = |s: &str| parse_span(s).map(|(a, b)| (a.to_rfc3339(), b.to_rfc3339()));
        let (a, b) = span("2026-12-02T20:21:30.123Z").unwrap();
        assert_eq!(
            (a.as_str(), b.as_str()),
            (
                "2026-12-02T20:21:30.123+00:00",
                "2026-12-02T20:21:30.123999+00:00"
            )
        );
        assert_eq!(
            span("2026-12-02 20:21:30").unwrap().1,
            "2026-12-02T20:21:30.999999+00:00"
        );
        assert_eq!(
            span("2026-12-02T21:21:30+01:00").unwrap().1,
            "2026-12-02T20:21:30.999999+00:00"
        );
        assert_eq!(
            span("2026-12-02T20:21").unwrap().1,
            "2026-12-02T20:21:59.999999+00:00"
        );
        assert_eq!(
            span("2026-12-02").unwrap().1,
            "2026-12-02T23:59:59.999999+00:00"
        );
        // Minutes with a zone, as people shorten RFC 3339.
        assert_eq!(
            span("2026-12-02T20:21Z").unwrap(),
            span("2026-12-02T20:21").unwrap()
        );
        assert_eq!(
            span("2026-12-02T21:21+01:00").unwrap().1,
            "2026-12-02T20:21:59.999999+00:00"
        );
        assert_eq!(
            span("2026-12-02 21:21:30+01:00").unwrap().1,
            "2026-12-02T20:21:30.999999+00:00"
        );
        assert_eq!(
            span("2026-12-02T20:21:30.123456789Z").unwrap().1,
            "2026-12-02T20:21:30.123456789+00:00"
        );
        // One-digit fields, which the parser takes, keep their units.
        assert_eq!(
            span("2026-12-2 9:05:30").unwrap().1,
            "2026-12-02T09:05:30.999999+00:00"
        );
        assert_eq!(span("yesterday"), None);
    }

    #[test]
    fn times_are_read_as_people_write_them() {
        let at = |s: &str| parse_time(s, false).map(|t| t.to_rfc3339());
        let utc = Some("2026-12-02T20:21:30+00:00".to_owned());
        assert_eq!(at("2026-12-02T20:21:30Z"), utc);
        assert_eq!(at("2026-12-02T21:21:30+01:00"), utc);
        assert_eq!(at("2026-12-02 20:21:30"), utc);
        assert_eq!(at("2026-12-02T20:21:30"), utc);
        assert_eq!(at("2026-12-02"), Some("2026-12-02T00:00:00+00:00".into()));
        assert_eq!(
            parse_time("2026-12-02", true).map(|t| t.to_rfc3339()),
            Some("2026-12-03T00:00:00+00:00".into())
        );
        assert_eq!(at("yesterday"), None);
        assert_eq!(at("2026-13-02"), None);
    }
}
