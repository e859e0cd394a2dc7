//! The agent's own log, kept in memory as well as written to stderr, so
//! that `llmgw ctl logs NODE --source agent` shows why an agent misbehaves
//! without a shell on its machine.

use std::io::Write;

use llmgw_agent::supervisor::LogTail;

/// Lines kept of the agent's own log.
pub(crate) const LINES: usize = 2000;

/// A `MakeWriter` for tracing's formatter: each event is formatted into
/// one writer, whose lines go into the ring when it is dropped.
#[derive(Clone)]
pub(crate) struct Ring(pub(crate) LogTail);

pub(crate) struct EventWriter {
    ring: LogTail,
    buf: Vec<u8>,
}

impl Write for EventWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        for line in String::from_utf8_lossy(&self.buf).lines() {
            if !line.is_empty() {
                self.ring.push(line.to_owned());
            }
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Ring {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> EventWriter {
        EventWriter {
            ring: self.0.clone(),
            buf: Vec::new(),
        }
    }
}
