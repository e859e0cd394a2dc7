//! A shipped `llmgw server` for the programs that measure the binary
//! itself (the proxy and scale benches' `--binary PATH`): started on its
//! configuration file, ready once it has named the addresses asked for,
//! and stopped by SIGTERM when dropped, so that it exits as it would in
//! service (and a build instrumented for PGO writes its profile).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// The lines of its stderr kept to explain a server that stopped early.
const KEPT: usize = 40;

/// A running `llmgw server`.
#[derive(Debug)]
pub struct Served {
    child: Child,
    addrs: Vec<String>,
}

impl Served {
    /// `binary server --config config`, logging warnings only unless
    /// `logged`, once its stdout has named an address after each of
    /// `ready`'s prefixes ("client listening on ", …). Panics with the
    /// end of its stderr if it stops first (a configuration it refuses).
    pub fn start(binary: &str, config: &Path, ready: &[&str], logged: bool) -> Served {
        let mut command = Command::new(binary);
        command.args(["server", "--config", &config.display().to_string()]);
        if !logged {
            command.env("RUST_LOG", "warn");
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        // Read to its end, so that the server never blocks on a full pipe;
        // only the last lines are kept.
        let said = Arc::new(Mutex::new(VecDeque::new()));
        let stderr = BufReader::new(child.stderr.take().expect("piped"));
        let kept = said.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let mut kept = kept.lock().unwrap_or_else(|p| p.into_inner());
                if kept.len() == KEPT {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
        });
        let mut addrs: Vec<Option<String>> = vec![None; ready.len()];
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        while addrs.iter().any(Option::is_none) {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.wait();
                let said = said.lock().unwrap_or_else(|p| p.into_inner());
                let said: Vec<&str> = said.iter().map(String::as_str).collect();
                panic!(
                    "{binary} server stopped before it was serving:\n{}",
                    said.join("\n")
                );
            };
            for (prefix, addr) in ready.iter().zip(addrs.iter_mut()) {
                if let Some(a) = line.strip_prefix(prefix) {
                    *addr = Some(a.trim().to_owned());
                }
            }
        }
        std::thread::spawn(move || lines.for_each(drop));
        Served {
            child,
            addrs: addrs.into_iter().flatten().collect(),
        }
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
