//! Where the process's log lines go: stderr, written by a thread of its
//! own. A line is formatted where it is logged and queued; the thread
//! writes all that has queued when it wakes, then lets lines gather for a
//! moment before it looks again. Written where it was logged, every
//! request's access line cost its request a write(2) and woke whatever
//! reads the pipe (a journal, a container runtime), and waking the writer
//! thread for every line cost it a wake of its own (docs/benchmarks.md,
//! "The binary's own logging").

use std::io::Write;
use std::time::Duration;

pub use tracing_appender::non_blocking::{NonBlocking, WorkerGuard};
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

mod json;
mod plain;
#[cfg(test)]
pub(crate) mod written;

/// Lines queued, up to this many; past it, the threads that log wait (no
/// line is dropped). About 5 MB of access lines: a burst of a fraction of
/// a second at full speed.
const QUEUED_LINES: usize = 16_384;

/// How long lines gather after each write: what a line may wait before
/// anyone sees it, and the writer thread's wakes bounded to 50 a second.
const LINGER: Duration = Duration::from_millis(20);

/// stderr's writer for a `tracing_subscriber` layer, and the guard that
/// writes out what is queued when dropped (waiting up to a second for a
/// reader of stderr that has stopped reading).
pub fn stderr() -> (NonBlocking, WorkerGuard) {
    tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(QUEUED_LINES)
        .thread_name("llmgw-log")
        .finish(Lingering {
            out: std::io::BufWriter::new(std::io::stderr()),
            wrote: false,
        })
}

/// How the lines are formatted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One line of text an event; colours when `ansi`.
    Text { ansi: bool },
    /// One JSON object a line, with the current span and the spans
    /// around it with their fields.
    Json,
}

/// The layer that formats the process's lines into `writer` (from
/// [`stderr`]): the one the binary logs through, and the proxy bench's
/// logged child, so that the bench measures what the binary does.
pub fn layer<S>(format: Format, writer: NonBlocking) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    match format {
        Format::Text { ansi: true } => tracing_subscriber::fmt::layer()
            .with_ansi(true)
            .with_writer(writer)
            .boxed(),
        Format::Text { ansi: false } => tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .event_format(plain::PlainLine)
            .fmt_fields(plain::PlainFields)
            .with_writer(writer)
            .boxed(),
        Format::Json => tracing_subscriber::fmt::layer()
            .json()
            .event_format(json::JsonLine)
            .with_writer(writer)
            .boxed(),
    }
}

/// The writer thread flushes after taking everything queued; pausing
/// there, when it wrote something, lets the next lines gather in the queue
/// instead of each waking the thread. Its last flush at exit wrote nothing
/// since the one before, so an exit waits for no pause of its own.
struct Lingering<W> {
    out: W,
    wrote: bool,
}

impl<W: Write> Write for Lingering<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.wrote = true;
        self.out.write(buf)
    }

    #[expect(
        clippy::disallowed_methods,
        reason = "a pause of the writer's own thread so that lines gather, not a wait for an event"
    )]
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        if std::mem::take(&mut self.wrote) {
            std::thread::sleep(LINGER);
        }
        Ok(())
    }
}
