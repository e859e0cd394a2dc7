//! For the formatters' tests: what a layer writes while a test logs, and
//! what the tests log: the same spans and events for every format.

use std::sync::{Arc, Mutex};

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{Layer, Registry};

/// What `layer` (given its writer) writes while `log` runs, alone on a
/// subscriber of its own and filtered at `level`, as the binary's layer
/// is by RUST_LOG.
pub(crate) fn written<L>(layer: impl FnOnce(Buf) -> L, level: LevelFilter, log: &dyn Fn()) -> String
where
    L: Layer<Registry> + Send + Sync + 'static,
{
    let buf = Buf::default();
    let subscriber = tracing_subscriber::registry().with(layer(buf.clone()).with_filter(level));
    tracing::subscriber::with_default(subscriber, log);
    let bytes = buf.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

/// A writer whose lines the test reads back.
#[derive(Clone, Default)]
pub(crate) struct Buf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Buf {
    type Writer = Buf;

    fn make_writer(&'a self) -> Buf {
        self.clone()
    }
}

#[derive(Debug)]
struct Thing<'a> {
    #[expect(dead_code, reason = "read by Debug only")]
    says: &'a str,
}

/// Eight lines: every kind of field (strings needing escapes or not,
/// unicode, integers at their bounds, floats with NaN, `Debug`, `Display`
/// and error values, a raw name, a message made of arguments), a span
/// field recorded later, nested and field-less spans, every level, an
/// event outside any span and one with an explicit parent.
pub(super) fn every_kind() {
    let span = tracing::info_span!(
        "request",
        request_id = "a-1",
        method = %"POST",
        path = "/v1/x",
        later = tracing::field::Empty
    );
    let _in = span.enter();
    let err = std::io::Error::other("disk \"full\"");
    tracing::info!(
        key_id = "key-9",
        none = None::<&str>,
        quoted = "say \"hi\"\n\tthen \\ go",
        control = "\x1b[31m\x00\x7f",
        unicode = "café ✓ 𝄞",
        empty = "",
        big = u64::MAX,
        neg = i64::MIN,
        yes = true,
        ms = 1.5f64,
        whole = 2.0f64,
        huge = 1e300f64,
        nan = f64::NAN,
        debug = ?Thing { says: "\"quoted\"" },
        shown = %"shown\u{1}",
        error = &err as &(dyn std::error::Error + 'static),
        r#type = "raw",
        "served {} with \"quotes\" \x1b[0m",
        "it"
    );
    span.record("later", 7u8);
    tracing::warn!(status = 499u16, "alone");
    tracing::info!(first = "x");
    tracing::info!(message = "plain \"message\"", after = 1u8);
    let inner = tracing::debug_span!("inner", n = 2u8, label = "x\"y");
    inner.in_scope(|| tracing::error!(target: "else\"where", "nested"));
    let bare = tracing::info_span!("bare");
    bare.in_scope(|| tracing::trace!("in a span without fields"));
    drop(_in);
    tracing::info!("outside any span");
    tracing::info!(parent: &inner, "an explicit parent, none entered");
}

/// Three lines behind a filter at info: spans it leaves out, an event
/// inside one (within a span kept, and alone), and one naming such a
/// span its parent.
pub(super) fn filtered() {
    let outer = tracing::info_span!("outer", id = 1u8);
    let _in = outer.enter();
    let quiet = tracing::debug_span!("quiet", id = 2u8);
    quiet.in_scope(|| tracing::info!("inside a span left out"));
    tracing::info!(parent: &quiet, "its child, by name");
    let alone = tracing::debug_span!("alone");
    drop(_in);
    alone.in_scope(|| tracing::warn!("inside only a span left out"));
}
