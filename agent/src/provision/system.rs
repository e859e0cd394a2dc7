//! The node's own tools, run as processes: its package manager (waiting
//! on its lock, bounded), `ldd`, and the engine's `--version`.
//!
//! Which tools are run is seen through [`System`]: its `path` is the
//! `PATH` they are looked up on, so tests put small scripts standing in
//! for `dpkg-query` and `apt-get` first on it and nothing is installed on
//! the machine running them.

use crate::secrets::WithoutSecrets;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

/// How long a package manager busy with another's work is waited for.
pub const LOCK_WAIT: Duration = Duration::from_secs(600);
/// How often it is asked again meanwhile.
pub const LOCK_RETRY: Duration = Duration::from_secs(10);
/// How long one package manager run may take (an `update` on a slow
/// mirror, an install of large libraries).
pub const PACKAGE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a `--version` run may take (a cold start on a slow disk).
pub const VERSION_TIMEOUT: Duration = Duration::from_secs(60);
/// Any other tool (a query, ldd): long enough for a loaded machine.
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// What the package manager prints when another holds its lock.
const LOCK_SIGNS: [&str; 5] = [
    "Unable to lock",
    "Could not get lock",
    "is locked by another process",
    "waiting for process with pid",
    "System management is locked",
];

/// How the node's tools are run.
#[derive(Debug, Clone)]
pub struct System {
    /// The `PATH` tools are looked up on (None: the agent's own).
    pub path: Option<OsString>,
    /// Install missing OS packages with the node's package manager; off,
    /// a missing library is only named (by `ldd`) for the operator.
    pub install_packages: bool,
    pub lock_wait: Duration,
    pub lock_retry: Duration,
    /// One package manager run's bound, apart from the lock wait: a
    /// short lock wait must not cut off an install that has the lock.
    pub package_timeout: Duration,
    pub version_timeout: Duration,
}

impl Default for System {
    fn default() -> Self {
        System {
            path: None,
            install_packages: true,
            lock_wait: LOCK_WAIT,
            lock_retry: LOCK_RETRY,
            package_timeout: PACKAGE_TIMEOUT,
            version_timeout: VERSION_TIMEOUT,
        }
    }
}

/// A finished run: whether it exited 0, and its output (both streams).
#[derive(Debug, Clone)]
pub struct Ran {
    pub ok: bool,
    pub output: String,
}

impl Ran {
    fn last_line(&self) -> &str {
        self.output
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
    }
}

impl System {
    /// Runs `program` with `args` (and `env` over the agent's
    /// environment), for at most `timeout`; Err when it could not be
    /// started or did not finish.
    pub async fn run(
        &self,
        env: &[(&str, &str)],
        program: &Path,
        args: &[&str],
        timeout: Duration,
    ) -> Result<Ran, String> {
        // A bare name is looked up on our PATH, not the agent's.
        let resolved = match program.components().count() {
            1 => self
                .which(&program.to_string_lossy())
                .unwrap_or_else(|| program.to_path_buf()),
            _ => program.to_path_buf(),
        };
        let mut cmd = tokio::process::Command::new(resolved);
        cmd.envs_without_secrets()
            .args(args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        if let Some(p) = &self.path {
            cmd.env("PATH", p);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let run = async {
            // ETXTBSY: a file just written, still open for writing in a
            // child another thread forked meanwhile (until its exec).
            let mut busy = 0;
            loop {
                match cmd.output().await {
                    Err(e)
                        if e.raw_os_error() == Some(rustix::io::Errno::TXTBSY.raw_os_error())
                            && busy < 10 =>
                    {
                        busy += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    other => return other,
                }
            }
        };
        let out = match tokio::time::timeout(timeout, run).await {
            Err(_) => {
                return Err(format!(
                    "{} did not finish within {} s",
                    program.display(),
                    timeout.as_secs()
                ));
            }
            Ok(Err(e)) => return Err(format!("{}: {e}", program.display())),
            Ok(Ok(out)) => out,
        };
        let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
        output.push_str(&String::from_utf8_lossy(&out.stderr));
        Ok(Ran {
            ok: out.status.success(),
            output,
        })
    }

    /// An executable `name` on our PATH.
    pub fn which(&self, name: &str) -> Option<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.path.clone().or_else(|| std::env::var_os("PATH"))?;
        std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|c| {
                std::fs::metadata(c)
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
    }

    /// Installs whichever of `pkgs` is missing, from the node's own
    /// sources, upgrading nothing. `progress` hears what is going on.
    pub async fn packages(
        &self,
        family: &str,
        pkgs: &[&str],
        progress: &(dyn Fn(String) + Sync),
    ) -> Result<(), String> {
        if pkgs.is_empty() {
            return Ok(());
        }
        let mut missing = Vec::new();
        for p in pkgs {
            if !self.installed(family, p).await {
                missing.push(*p);
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let list = missing.join(", ");
        if !self.install_packages {
            // ldd names what the build then lacks.
            tracing::warn!(packages = %list, "missing OS packages are not installed (os_packages is off)");
            return Ok(());
        }
        let (tool, commands, env) = match family {
            "deb" => {
                let lock = "-o=DPkg::Lock::Timeout=600";
                let mut install = vec!["apt-get", lock, "install", "-y", "--no-install-recommends"];
                install.extend(&missing);
                (
                    "apt-get",
                    vec![vec!["apt-get", lock, "update"], install],
                    vec![("DEBIAN_FRONTEND", "noninteractive")],
                )
            }
            _ => {
                let tool = if self.which("dnf").is_some() {
                    "dnf"
                } else if self.which("yum").is_some() {
                    "yum"
                } else if self.which("zypper").is_some() {
                    "zypper"
                } else {
                    return Err(format!(
                        "{list} is missing and no package manager was found to install it"
                    ));
                };
                let mut install = match tool {
                    "zypper" => vec!["zypper", "--non-interactive", "install"],
                    t => vec![t, "install", "-y"],
                };
                install.extend(&missing);
                (tool, vec![install], vec![])
            }
        };
        progress(format!("installing {} with {tool}", missing.join(" ")));
        for c in commands {
            self.waiting_for_lock(&env, &c, progress).await?;
        }
        Ok(())
    }

    /// Whether a package is installed: for dpkg, fully (`ii`), since
    /// `dpkg -s` passes for packages merely known.
    async fn installed(&self, family: &str, pkg: &str) -> bool {
        let ran = match family {
            "deb" => {
                self.run(
                    &[],
                    Path::new("sh"),
                    &[
                        "-c",
                        r#"test "$(dpkg-query -W -f='${db:Status-Abbrev}' "$0" 2>/dev/null)" = "ii ""#,
                        pkg,
                    ],
                    TOOL_TIMEOUT,
                )
                .await
            }
            _ => {
                self.run(&[], Path::new("rpm"), &["-q", pkg], TOOL_TIMEOUT)
                    .await
            }
        };
        ran.is_ok_and(|r| r.ok)
    }

    /// Runs a package manager's command, waiting (bounded) while another
    /// holds its lock: a new machine runs its own updates first, and
    /// `DPkg::Lock::Timeout` does not cover the lists lock `update` takes.
    async fn waiting_for_lock(
        &self,
        env: &[(&str, &str)],
        c: &[&str],
        progress: &(dyn Fn(String) + Sync),
    ) -> Result<(), String> {
        let deadline = Instant::now() + self.lock_wait;
        loop {
            let ran = self
                .run(env, Path::new(c[0]), &c[1..], self.package_timeout)
                .await;
            let ran = match ran {
                Ok(r) if r.ok => return Ok(()),
                Ok(r) => r,
                Err(e) => return Err(format!("{}: {e}", c.join(" "))),
            };
            let locked = LOCK_SIGNS.iter().any(|s| ran.output.contains(s));
            if !locked || Instant::now() >= deadline {
                return Err(format!("{}: failed: {}", c.join(" "), ran.last_line()));
            }
            progress(format!(
                "waiting for another {} to finish (a new machine runs its own updates first)",
                c[0]
            ));
            tokio::time::sleep(self.lock_retry).await;
        }
    }

    /// What `ldd` says `bin` lacks; nothing when ldd cannot say (a static
    /// binary, no ldd): the `--version` run decides then.
    pub async fn missing_libraries(&self, bin: &Path) -> Vec<String> {
        let bin = bin.to_string_lossy();
        match self.run(&[], Path::new("ldd"), &[&bin], TOOL_TIMEOUT).await {
            Ok(r) if r.ok => ldd_missing(&r.output),
            _ => Vec::new(),
        }
    }

    /// Runs `bin --version`, bounded: the first line that says "version",
    /// or "" when none does.
    pub async fn version(&self, bin: &Path, binary: &str) -> Result<String, String> {
        let ran = self
            .run(&[], bin, &["--version"], self.version_timeout)
            .await
            .map_err(|e| format!("{binary} --version failed: {e}"))?;
        if !ran.ok {
            return Err(format!(
                "{binary} --version failed: it exited with an error: {}",
                ran.last_line()
            ));
        }
        Ok(ran
            .output
            .lines()
            .find(|l| l.to_lowercase().contains("version"))
            .map(|l| l.trim().to_owned())
            .unwrap_or_default())
    }
}

/// What each `not found` line of ldd's output means, once each, in order:
/// `libcuda.so.1 is not installed`, or for a symbol version
/// `libstdc++.so.6 is too old (needs GLIBCXX_3.4.30)`.
pub fn ldd_missing(output: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in output.lines().map(str::trim) {
        if !line.contains("not found") {
            continue;
        }
        let said = match line.split_once(": version `") {
            Some((lib, rest)) => {
                let lib = lib.rsplit('/').next().unwrap_or(lib);
                let symbol = rest.split('\'').next().unwrap_or(rest);
                format!("{lib} is too old (needs {symbol})")
            }
            None => {
                let lib = line.split("=>").next().unwrap_or(line).trim();
                format!("{lib} is not installed")
            }
        };
        if !out.contains(&said) {
            out.push(said);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_become_what_the_node_lacks() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
            \tlibcuda.so.1 => not found\n\
            /lib64/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by ./llama-server)\n\
            /lib64/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by ./libllama.so)\n\
            \tlibcuda.so.1 => not found\n";
        assert_eq!(
            ldd_missing(text),
            vec![
                "libcuda.so.1 is not installed",
                "libstdc++.so.6 is too old (needs GLIBCXX_3.4.30)"
            ]
        );
        assert!(ldd_missing("\tlibc.so.6 => /lib/libc.so.6\n").is_empty());
    }
}
