//! JSON lines: the object `tracing_subscriber`'s JSON format writes (the
//! same keys, the same values), written straight into the line.
//!
//! That format stores a span's fields as a JSON string and, for every
//! event, parses each span's string back into a map twice (once for
//! `span`, once for `spans`) to write it again: logged at info, JSON
//! lines cost the gateway ~13 µs of CPU a request against text's ~6. Here
//! a span's stored object is copied as it stands, with its name added, and
//! the event's fields are escaped as they are recorded. Keys within an
//! object may come in another order (a span's in the order recorded, not
//! sorted); the line parses to the same value.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::{LookupSpan, SpanRef};

/// `FormatEvent` for JSON lines: time, level, the event's fields, target,
/// the current span and the spans from the root, as `tracing_subscriber`'s
/// JSON format with the current span and the span list on.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct JsonLine;

impl<S> FormatEvent<S, JsonFields> for JsonLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let w = &mut writer;
        w.write_str("{\"timestamp\":\"")?;
        SystemTime.format_time(w)?;
        w.write_str("\",\"level\":\"")?;
        w.write_str(match *meta.level() {
            Level::TRACE => "TRACE",
            Level::DEBUG => "DEBUG",
            Level::INFO => "INFO",
            Level::WARN => "WARN",
            Level::ERROR => "ERROR",
        })?;
        w.write_str("\",\"fields\":{")?;
        let mut fields = Fields {
            writer: w.by_ref(),
            first: true,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        w.write_str("},\"target\":")?;
        string(w, meta.target())?;
        let current = event
            .parent()
            .and_then(|id| ctx.span(id))
            .or_else(|| ctx.lookup_current());
        if let Some(span) = current {
            w.write_str(",\"span\":")?;
            span_object(w, &span)?;
            w.write_str(",\"spans\":[")?;
            if let Some(leaf) = ctx.lookup_current() {
                for (i, span) in leaf.scope().from_root().enumerate() {
                    if i > 0 {
                        w.write_char(',')?;
                    }
                    span_object(w, &span)?;
                }
            }
            w.write_char(']')?;
        }
        w.write_str("}\n")
    }
}

/// A span's stored fields (a JSON object, as `JsonFields` keeps them) with
/// its `name` added.
fn span_object<S>(w: &mut Writer<'_>, span: &SpanRef<'_, S>) -> fmt::Result
where
    S: for<'a> LookupSpan<'a>,
{
    w.write_char('{')?;
    let ext = span.extensions();
    let inner = ext
        .get::<FormattedFields<JsonFields>>()
        .and_then(|f| f.fields.strip_prefix('{')?.strip_suffix('}'))
        .filter(|inner| !inner.trim().is_empty());
    if let Some(inner) = inner {
        w.write_str(inner)?;
        w.write_char(',')?;
    }
    w.write_str("\"name\":")?;
    string(w, span.metadata().name())?;
    w.write_char('}')
}

/// The event's fields, as `tracing_serde` records them: numbers and
/// bools as such, everything else a string (`Debug`, errors by `Display`).
struct Fields<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Fields<'_> {
    fn entry(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        let w = &mut self.writer;
        let comma = !std::mem::take(&mut self.first);
        self.result = (|| {
            if comma {
                w.write_char(',')?;
            }
            string(w, field.name())?;
            w.write_char(':')?;
            value(w)
        })();
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.entry(field, |w| string(w, value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field, |w| write!(w, "{value}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field, |w| write!(w, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field, |w| w.write_str(if value { "true" } else { "false" }));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // serde_json's own number format (and null for NaN and infinities).
        self.entry(field, |w| {
            serde_json::to_writer(Utf8(w), &value).map_err(|_| fmt::Error)
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.entry(field, |w| {
            w.write_char('"')?;
            write!(Escaped(w), "{value:?}")?;
            w.write_char('"')
        });
    }
}

/// `s` as a JSON string.
fn string(w: &mut Writer<'_>, s: &str) -> fmt::Result {
    w.write_char('"')?;
    Escaped(w).write_str(s)?;
    w.write_char('"')
}

/// Writes what it is given escaped for a JSON string, as serde_json
/// escapes: quotes, backslashes and control characters.
struct Escaped<'a, 'w>(&'a mut Writer<'w>);

impl fmt::Write for Escaped<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut start = 0;
        for (i, b) in s.bytes().enumerate() {
            let escape = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                0..=0x1f => "",
                _ => continue,
            };
            self.0.write_str(&s[start..i])?;
            if escape.is_empty() {
                write!(self.0, "\\u{b:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            start = i + 1;
        }
        self.0.write_str(&s[start..])
    }
}

/// serde_json's writer side onto a `fmt` writer; it writes only UTF-8.
struct Utf8<'a, 'w>(&'a mut Writer<'w>);

impl std::io::Write for Utf8<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let s = std::str::from_utf8(buf).map_err(std::io::Error::other)?;
        self.0.write_str(s).map_err(std::io::Error::other)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;
    use tracing_subscriber::filter::LevelFilter;

    use super::super::written::{self, written};
    use super::*;

    /// The lines each format writes for the same spans and events,
    /// parsed, their times checked and removed.
    fn lines(level: LevelFilter, log: impl Fn()) -> (Vec<Value>, Vec<Value>) {
        let parsed = |text: String| {
            text.lines()
                .map(|line| {
                    let mut v: Value = serde_json::from_str(line)
                        .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                    let time = v.as_object_mut().unwrap().remove("timestamp").unwrap();
                    assert!(time.as_str().is_some_and(|t| t.len() == 27), "{line}");
                    v
                })
                .collect::<Vec<_>>()
        };
        let ours = written(
            |w| {
                tracing_subscriber::fmt::layer()
                    .json()
                    .event_format(JsonLine)
                    .with_writer(w)
            },
            level,
            &log,
        );
        let theirs = written(
            |w| {
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(true)
                    .with_writer(w)
            },
            level,
            &log,
        );
        (parsed(ours), parsed(theirs))
    }

    #[test]
    fn lines_parse_to_what_the_default_json_format_writes() {
        let (ours, theirs) = lines(LevelFilter::TRACE, written::every_kind);
        assert_eq!(ours.len(), 8, "{ours:?}");
        assert_eq!(ours[0]["fields"]["key_id"], "key-9", "{}", ours[0]);
        assert_eq!(ours[0]["span"]["request_id"], "a-1", "{}", ours[0]);
        assert_eq!(ours[4]["spans"].as_array().map(Vec::len), Some(2));
        assert_eq!(ours, theirs);
    }

    #[test]
    fn spans_the_filter_leaves_out_are_left_out_of_the_line() {
        let (ours, theirs) = lines(LevelFilter::INFO, written::filtered);
        assert_eq!(ours.len(), 3, "{ours:?}");
        assert_eq!(ours[0]["span"]["name"], "outer", "{}", ours[0]);
        assert!(ours[2].get("span").is_none(), "{}", ours[2]);
        assert_eq!(ours, theirs);
    }
}
