//! A shipped `llmgw server` for the programs that measure the binary
//! itself (the proxy and scale benches' `--binary PATH`): started on a
//! configuration with a SQLite log of its own in a scratch directory,
//! ready once it has named the addresses asked for,
//! and stopped by SIGTERM when dropped, so that it exits as it would in
//! service (and a build instrumented for PGO writes its profile).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};

/// The lines of its stderr kept to explain a server that stopped early.
const KEPT: usize = 40;

/// A running `llmgw server`.
#[derive(Debug)]
pub struct Served {
    child: Child,
    addrs: Vec<String>,
    store: String,
    /// Removed once the server has stopped (fields drop after `drop`).
    _dir: tempfile::TempDir,
}

/// What its stderr has said, as the thread reading it tells.
#[derive(Debug, Default)]
struct Heard {
    last: VecDeque<String>,
    /// A line held the text waited for.
    found: bool,
    /// Its stderr closed: it has exited.
    ended: bool,
}

type Shared = Arc<(Mutex<Heard>, Condvar)>;

fn heard(shared: &Shared) -> std::sync::MutexGuard<'_, Heard> {
    shared.0.lock().unwrap_or_else(|p| p.into_inner())
}

impl Served {
    /// `binary server` on `config` (YAML, without a `store`: the server's
    /// log is a SQLite file in a scratch directory) with `RUST_LOG=rust_log` (None:
    /// the binary's default), ready once its stdout has named an address
    /// after each of `ready`'s prefixes ("client listening on ", …) and,
    /// with `logged`, a line of its log has held that text (such as
    /// "leading", which a control plane logs at info once it holds the
    /// lease). Panics with the end of its stderr if it stops first (a
    /// configuration it refuses).
    pub fn start(
        binary: &str,
        config: &str,
        rust_log: Option<&str>,
        ready: &[&str],
        logged: Option<&str>,
    ) -> Served {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
        let file = dir.path().join("server.yaml");
        std::fs::write(&file, format!("store: \"{store}\"\n{config}"))
            .expect("the configuration written");
        let mut command = Command::new(binary);
        command.args(["server", "--config", &file.display().to_string()]);
        if let Some(filter) = rust_log {
            command.env("RUST_LOG", filter);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        // Read to its end, so that the server never blocks on a full pipe;
        // only the last lines are kept.
        let shared: Shared = Arc::default();
        let stderr = BufReader::new(child.stderr.take().expect("piped"));
        let (reader, needle) = (shared.clone(), logged.map(str::to_owned));
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let mut h = heard(&reader);
                h.found |= needle.as_deref().is_some_and(|n| line.contains(n));
                if h.last.len() == KEPT {
                    h.last.pop_front();
                }
                h.last.push_back(line);
                reader.1.notify_all();
            }
            heard(&reader).ended = true;
            reader.1.notify_all();
        });
        let stopped = |child: &mut Child| -> ! {
            let _ = child.wait();
            let h = shared
                .1
                .wait_while(heard(&shared), |h| !h.ended)
                .unwrap_or_else(|p| p.into_inner());
            let said: Vec<&str> = h.last.iter().map(String::as_str).collect();
            panic!(
                "{binary} server stopped before it was serving:\n{}",
                said.join("\n")
            );
        };
        let mut addrs: Vec<Option<String>> = vec![None; ready.len()];
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        while addrs.iter().any(Option::is_none) {
            let Some(Ok(line)) = lines.next() else {
                stopped(&mut child);
            };
            for (prefix, addr) in ready.iter().zip(addrs.iter_mut()) {
                if let Some(a) = line.strip_prefix(prefix) {
                    *addr = Some(a.trim().to_owned());
                }
            }
        }
        std::thread::spawn(move || lines.for_each(drop));
        if logged.is_some() {
            let found = shared
                .1
                .wait_while(heard(&shared), |h| !h.found && !h.ended)
                .unwrap_or_else(|p| p.into_inner())
                .found;
            if !found {
                stopped(&mut child);
            }
        }
        Served {
            child,
            addrs: addrs.into_iter().flatten().collect(),
            store,
            _dir: dir,
        }
    }

    /// Its log's address, for the CLI's `--store`.
    pub fn store(&self) -> &str {
        &self.store
    }

    /// The address printed after `ready`'s `i`th prefix.
    pub fn addr(&self, i: usize) -> &str {
        &self.addrs[i]
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}
