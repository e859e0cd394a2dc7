//! A PostgreSQL server of a test's own, for what cannot be done to the
//! shared one: restarting it under load. Started with the installed
//! server binaries (`initdb`, `pg_ctl` on PATH or under
//! `/usr/lib/postgresql/*/bin`) in a temporary directory, listening only on
//! a Unix socket there (no port to collide with), with trust
//! authentication for `postgres`. PostgreSQL refuses to run as root: as
//! root it runs as the `postgres` user (else `nobody`), as `scripts/test`
//! does. Stopped and removed when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct PrivatePostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The user to run the server as (when this process is root).
    user: Option<String>,
}

impl PrivatePostgres {
    /// Initialises and starts a server; blocks for the few seconds that
    /// takes. Without the server binaries it fails, saying how to get them.
    pub fn start() -> PrivatePostgres {
        let bin = server_bin().unwrap_or_else(|| {
            panic!(
                "no PostgreSQL server binaries (initdb, pg_ctl) for a private server; \
                 install them (Debian/Ubuntu: apt-get install postgresql)"
            )
        });
        let dir = tempfile::Builder::new()
            .prefix("llmgw-pg")
            .tempdir()
            .expect("a directory for a private PostgreSQL");
        let user = (output("id", &["-u"]) == "0").then(|| {
            if Command::new("id")
                .arg("postgres")
                .output()
                .is_ok_and(|o| o.status.success())
            {
                "postgres".to_owned()
            } else {
                "nobody".to_owned()
            }
        });
        let pg = PrivatePostgres { dir, bin, user };
        if let Some(user) = &pg.user {
            let uid: u32 = output("id", &["-u", user]).parse().expect("a uid");
            let gid: u32 = output("id", &["-g", user]).parse().expect("a gid");
            std::os::unix::fs::chown(pg.dir.path(), Some(uid), Some(gid))
                .expect("hand the private PostgreSQL's directory to its user");
        }
        let data = pg.data();
        pg.run(
            "initdb",
            &["-D", &data, "-U", "postgres", "--auth=trust", "--no-sync"],
        );
        pg.ctl(&["start"]);
        pg
    }

    /// Where the server's socket is: a URL for the `postgres` database.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@localhost/postgres?host={}",
            self.dir.path().display()
        )
    }

    /// `pg_ctl restart -m fast`: sessions are ended, the server stops and
    /// starts again. Returns once it accepts connections, with how long
    /// that took.
    pub fn restart(&self) -> Duration {
        let began = Instant::now();
        self.ctl(&["restart", "-m", "fast"]);
        began.elapsed()
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn ctl(&self, what: &[&str]) {
        let (data, dir, log) = (
            self.data(),
            self.dir.path().display().to_string(),
            self.dir.path().join("server.log").display().to_string(),
        );
        // Only the Unix socket in our directory: no port to collide with.
        let options = format!("-c listen_addresses='' -k {dir} -c fsync=off");
        let mut args = vec!["-D", &data, "-l", &log, "-w", "-o", &options];
        args.extend_from_slice(what);
        self.run("pg_ctl", &args);
    }

    fn run(&self, program: &str, args: &[&str]) {
        let program = self.bin.join(program);
        let mut command = match &self.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&program);
                c
            }
            None => Command::new(&program),
        };
        let out = command
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
        assert!(
            out.status.success(),
            "{} {args:?} failed: {}{}\n{}",
            program.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
        );
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let data = self.data();
        let program = self.bin.join("pg_ctl");
        let mut command = match &self.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&program);
                c
            }
            None => Command::new(&program),
        };
        let _ = command
            .args(["-D", &data, "-m", "immediate", "stop"])
            .output();
    }
}

/// The directory holding `initdb` and `pg_ctl`: PATH first, then the
/// newest `/usr/lib/postgresql/*/bin`.
fn server_bin() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).find(|d| has_server(d)));
    if on_path.is_some() {
        return on_path;
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_server(&bin).then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

fn has_server(bin: &Path) -> bool {
    bin.join("initdb").is_file() && bin.join("pg_ctl").is_file()
}

fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}
