//! The text format without colours, written straight into the line:
//! byte for byte what `tracing_subscriber`'s default format writes, for
//! less.
//!
//! Every request's access line carries a dozen fields, and its span three
//! more. The default format writes each field through a `write!` of
//! three arguments and a string's `Debug` escaping, char by char, and
//! every piece of the line through a colour "paint" that, colours off,
//! paints nothing: logged at info, the line and its span were ~9% of the
//! gateway's CPU a request. A string of printable ASCII without quotes or
//! backslashes, an integer and a bool come out of `Debug` unchanged or
//! merely quoted, so they are written as such; everything else (the
//! message, floats, errors, `Debug` values, any string needing escapes)
//! goes to the default field formatter.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// `FormatEvent` for text without ANSI colours: the default (`Full`)
/// format's line: time, level, the spans from the root with their
/// fields, the target, the fields.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct PlainLine;

impl<S, N> FormatEvent<S, N> for PlainLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        if SystemTime.format_time(&mut writer).is_err() {
            writer.write_str("<unknown time>")?;
        }
        writer.write_str(match *meta.level() {
            Level::TRACE => " TRACE ",
            Level::DEBUG => " DEBUG ",
            Level::INFO => "  INFO ",
            Level::WARN => "  WARN ",
            Level::ERROR => " ERROR ",
        })?;
        if let Some(scope) = ctx.event_scope() {
            let mut seen = false;
            for span in scope.from_root() {
                seen = true;
                writer.write_str(span.metadata().name())?;
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    writer.write_char('{')?;
                    writer.write_str(fields)?;
                    writer.write_char('}')?;
                }
                writer.write_char(':')?;
            }
            if seen {
                writer.write_char(' ')?;
            }
        }
        writer.write_str(meta.target())?;
        writer.write_str(": ")?;
        ctx.format_fields(writer.by_ref(), event)?;
        writer.write_char('\n')
    }
}

/// `FormatFields` for text without ANSI colours.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct PlainFields;

impl<'w> FormatFields<'w> for PlainFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut v = Plain {
            writer,
            is_empty: true,
            result: Ok(()),
        };
        fields.record(&mut v);
        v.result
    }
}

struct Plain<'w> {
    writer: Writer<'w>,
    is_empty: bool,
    result: fmt::Result,
}

/// Whether `Debug` writes `s` as itself between quotes.
fn verbatim(s: &str) -> bool {
    s.bytes()
        .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\')
}

/// Names the default formatter treats apart: the message is written bare,
/// a raw identifier without its `r#`.
fn special(field: &Field) -> bool {
    let name = field.name();
    name == "message" || name.starts_with("r#")
}

impl Plain<'_> {
    fn by_default(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        if self.result.is_err() {
            return;
        }
        let mut d = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut d);
        self.result = d.finish();
        self.is_empty = false;
    }

    /// ` name=` (no space before the first field).
    fn name(&mut self, field: &Field) -> fmt::Result {
        if !std::mem::take(&mut self.is_empty) {
            self.writer.write_char(' ')?;
        }
        self.writer.write_str(field.name())?;
        self.writer.write_char('=')
    }

    fn write(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        self.result = self.name(field).and_then(|()| value(&mut self.writer));
    }
}

impl Visit for Plain<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if special(field) || !verbatim(value) {
            return self.by_default(|d| d.record_str(field, value));
        }
        self.write(field, |w| {
            w.write_char('"')?;
            w.write_str(value)?;
            w.write_char('"')
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if special(field) {
            return self.by_default(|d| d.record_u64(field, value));
        }
        self.write(field, |w| write!(w, "{value}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if special(field) {
            return self.by_default(|d| d.record_i64(field, value));
        }
        self.write(field, |w| write!(w, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if special(field) {
            return self.by_default(|d| d.record_bool(field, value));
        }
        self.write(field, |w| w.write_str(if value { "true" } else { "false" }));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.by_default(|d| d.record_f64(field, value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.by_default(|d| d.record_error(field, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.by_default(|d| d.record_debug(field, value));
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::filter::LevelFilter;

    use super::super::written::{self, written};
    use super::*;

    /// What each formatter writes for the same spans and events, without
    /// the times (they differ by the microseconds between the two runs).
    fn lines(level: LevelFilter, log: impl Fn()) -> (String, String) {
        let untimed = |text: String| {
            let mut lines = String::new();
            for line in text.lines() {
                let (time, rest) = line.split_once(' ').unwrap();
                assert!(time.len() == 27 && time.ends_with('Z'), "{line}");
                lines.push_str(rest);
                lines.push('\n');
            }
            lines
        };
        let ours = written(
            |w| {
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .event_format(PlainLine)
                    .fmt_fields(PlainFields)
                    .with_writer(w)
            },
            level,
            &log,
        );
        let theirs = written(
            |w| {
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(w)
            },
            level,
            &log,
        );
        (untimed(ours), untimed(theirs))
    }

    #[test]
    fn lines_are_what_the_default_formatter_writes() {
        let (ours, theirs) = lines(LevelFilter::TRACE, written::every_kind);
        assert_eq!(ours.lines().count(), 8, "{ours}");
        assert!(ours.contains(r#"key_id="key-9""#), "{ours}");
        assert!(
            ours.contains(r#"request{request_id="a-1" method=POST path="/v1/x" later=7}"#),
            "{ours}"
        );
        assert_eq!(ours, theirs);
    }

    #[test]
    fn spans_the_filter_leaves_out_are_left_out_of_the_line() {
        let (ours, theirs) = lines(LevelFilter::INFO, written::filtered);
        assert_eq!(ours.lines().count(), 3, "{ours}");
        assert!(!ours.contains("quiet"), "{ours}");
        assert_eq!(ours, theirs);
    }
}
