//! For the formatters' tests: what a layer writes while a test logs.

use std::sync::{Arc, Mutex};

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{Layer, Registry};

/// What `layer` (given its writer) writes while `log` runs, alone on a
/// subscriber of its own and filtered at `level`, as the binary's layer
/// is by RUST_LOG.
pub(super) fn written<L>(layer: impl FnOnce(Buf) -> L, level: LevelFilter, log: &dyn Fn()) -> String
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
pub(super) struct Buf(Arc<Mutex<Vec<u8>>>);

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
