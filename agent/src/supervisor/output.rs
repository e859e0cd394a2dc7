//! A shard's output: one pipe (or one append-only file) shared by stdout
//! and stderr, so lines keep the order they were written in, and a bounded
//! tail of it for failures and `ctl logs`.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// How many lines a tail keeps when asked for none.
const DEFAULT_LINES: usize = 256;
/// A longer line is split rather than buffered whole: an engine printing
/// megabytes without a newline must not grow the agent without bound.
pub const MAX_LINE: usize = 1024 * 1024;

/// The last lines of a shard's output: kept in memory, or read from the
/// shard's log file.
#[derive(Debug, Clone, Default)]
pub struct LogTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    max: usize,
    file: Option<PathBuf>,
}

impl LogTail {
    /// Keeps the last `max` lines (0 keeps the default 256).
    pub fn new(max: usize) -> Self {
        LogTail {
            lines: Arc::default(),
            max: if max == 0 { DEFAULT_LINES } else { max },
            file: None,
        }
    }

    pub fn of_file(path: PathBuf, max: usize) -> Self {
        LogTail {
            file: Some(path),
            ..LogTail::new(max)
        }
    }

    pub fn push(&self, line: String) {
        let mut l = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if l.len() == self.max {
            l.pop_front();
        }
        l.push_back(line);
    }

    /// The newest `n` lines, oldest first; 0, or more than are kept, gives
    /// every line kept.
    pub fn tail(&self, n: usize) -> Vec<String> {
        let n = if n == 0 || n > self.max { self.max } else { n };
        if let Some(f) = &self.file {
            return file_tail(f, n).lines().map(str::to_owned).collect();
        }
        let l = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        l.iter().skip(l.len().saturating_sub(n)).cloned().collect()
    }

    /// Every line kept, joined by newlines.
    pub fn text(&self) -> String {
        self.tail(0).join("\n")
    }
}

/// The last `max` lines of a file (reading at most its last 256 KiB).
pub fn file_tail(path: &Path, max: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let from = len.saturating_sub(256 * 1024);
    let _ = f.seek(SeekFrom::Start(from));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(max)..].join("\n")
}

/// Reads `stream` to its end, line by line, into `log` as `[name] line`
/// (a trailing `\r` dropped, a line over [`MAX_LINE`] split). It runs to
/// EOF whatever the shard does, so nothing written is lost.
pub async fn pump(stream: impl AsyncRead + Unpin, log: LogTail, name: String) {
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let mut line: Vec<u8> = Vec::new();
    let emit = |line: &mut Vec<u8>| {
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        let text = String::from_utf8_lossy(line);
        tracing::debug!(command = %name, "{text}");
        log.push(format!("[{name}] {text}"));
        line.clear();
    };
    // Just split a long line: a newline right after it ends that line,
    // not an empty one.
    let mut split = false;
    while let Ok(buf) = reader.fill_buf().await {
        if buf.is_empty() {
            if !line.is_empty() {
                emit(&mut line);
            }
            break;
        }
        if split && line.is_empty() && buf[0] == b'\n' {
            reader.consume(1);
            split = false;
            continue;
        }
        split = false;
        let room = MAX_LINE - line.len();
        let window = &buf[..buf.len().min(room)];
        match window.iter().position(|b| *b == b'\n') {
            Some(i) => {
                line.extend_from_slice(&window[..i]);
                reader.consume(i + 1);
                emit(&mut line);
            }
            None => {
                let n = window.len();
                line.extend_from_slice(window);
                reader.consume(n);
                if line.len() == MAX_LINE {
                    emit(&mut line);
                    split = true;
                }
            }
        }
    }
}
