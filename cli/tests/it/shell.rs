//! Completions, man pages and the global `--store` as a user meets them.

use std::process::Command;

fn llmgw(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_remove("LLMGW_STORE")
        .args(args)
        .output()
        .expect("run llmgw")
}

/// Sourced into a real bash, the script registers a completion for
/// `llmgw` that offers the subcommands.
#[test]
fn bash_completion_registers_and_offers_the_commands() {
    let out = llmgw(&["completions", "bash"]);
    assert!(out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("llmgw.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    let probe = format!(
        "source {}; complete -p llmgw; COMP_WORDS=(llmgw ct); COMP_CWORD=1; COMP_LINE='llmgw ct'; COMP_POINT=8; _llmgw llmgw ct llmgw; echo \"${{COMPREPLY[@]}}\"",
        script.display()
    );
    let bash = Command::new("bash").args(["-c", &probe]).output().unwrap();
    let said = String::from_utf8_lossy(&bash.stdout);
    assert!(
        said.contains("-F _llmgw llmgw") && said.trim_end().lines().last() == Some("ctl"),
        "{said}{}",
        String::from_utf8_lossy(&bash.stderr)
    );
    for shell in ["zsh", "fish"] {
        let out = llmgw(&["completions", shell]);
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let bad = llmgw(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2));
}

/// Into a pipe already closed (`llmgw completions bash | head -1`): an
/// ordinary end, not a panic.
#[test]
fn completions_into_a_closed_pipe_end_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["completions", "bash"])
        .stdout(writer)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.is_empty(), "{said}");
}

/// One page per command, each naming its options as --help does.
#[test]
fn man_pages_cover_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = llmgw(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = |name: &str| {
        std::fs::read_to_string(dir.path().join(format!("{name}.1")))
            .unwrap_or_else(|e| panic!("{name}.1: {e}"))
    };
    assert!(page("llmgw").contains(".TH LLMGW 1"));
    assert!(page("llmgw-server").contains("admin\\-listen"));
    let status = page("llmgw-ctl-status");
    assert!(
        status.contains(".TH LLMGW-CTL-STATUS 1") && status.contains("Models serving"),
        "{status}"
    );
    assert!(page("llmgw-agent-run").contains("metrics\\-listen"));
    let top = llmgw(&["man"]);
    assert!(String::from_utf8_lossy(&top.stdout).contains(".TH llmgw 1"));
}

/// A command that never reads the log refuses `--store` instead of
/// ignoring it; the variable (ambient, for the commands that do) is fine.
#[test]
fn store_is_refused_where_it_would_be_ignored() {
    let out = llmgw(&[
        "--store",
        "x.db",
        "ctl",
        "--admin",
        "http://127.0.0.1:1",
        "status",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--store does not apply here") && err.contains("--admin"),
        "{err}"
    );
    let out = llmgw(&["--store", "x.db", "events", "verify", "--file", "x.jsonl"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--against"), "{err}");
    let out = llmgw(&["sim-engine", "--store", "x.db", "--help"]);
    assert!(out.status.success(), "help still shows");
    // The help of a command that refuses --store, or of `server init`
    // (whose store is its server.env's), shows no default as if it used
    // one; the flag's text says where the default applies.
    for command in [&["up", "--help"][..], &["server", "init", "--help"]] {
        let out = llmgw(command);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(!help.contains("[default: llmgw.db]"), "{help}");
        assert!(
            help.contains("default: llmgw.db here; `server init`"),
            "{help}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env("LLMGW_STORE", "x.db")
        .args(["ctl", "--admin", "http://127.0.0.1:1", "status"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("--store"), "{err}");
}

/// The ctl commands that ask no server refuse `--admin` on their command
/// line instead of ignoring it; the variable stays ambient. A bench of no
/// concurrency is refused rather than run at one.
#[test]
fn admin_is_refused_where_it_would_be_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let help = dir.path().join("help.txt");
    std::fs::write(&help, "--help\n").unwrap();
    let help = help.to_str().unwrap();
    let cases: [&[&str]; 3] = [
        &[
            "ctl",
            "--admin",
            "http://10.0.0.1:9090",
            "engine-check",
            "sim",
            "--help-output",
            help,
        ],
        &["ctl", "tool-check", "m", "--admin", "http://10.0.0.1:9090"],
        &[
            "ctl",
            "--admin",
            "http://10.0.0.1:9090",
            "cert",
            "init-ca",
            "--dir",
            "x",
        ],
    ];
    for args in cases {
        let out = llmgw(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("--admin does not apply here"),
            "{args:?}: {err}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env("LLMGW_ADMIN", "http://10.0.0.1:9090")
        .args(["ctl", "engine-check", "sim", "--help-output", help])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("--admin"), "{err}");
    let out = llmgw(&["ctl", "bench", "m", "--max-concurrency", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--max-concurrency"), "{err}");
    // `--as` names the operator of a change the log records: a command
    // that records nothing refuses it (it read as recorded under it).
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    for args in [
        &[
            "ctl",
            "cert",
            "issue-client",
            "node-q",
            "--dir",
            d,
            "--as",
            "bob",
        ][..],
        &["ctl", "--as", "bob", "tool-check", "m"],
    ] {
        let out = llmgw(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--as does not apply here"), "{args:?}: {err}");
    }
}

/// A ctl flag out of range is a bad question (exit 2) before anything is
/// asked, apart from a failure of what was asked (1): `plan`'s 1 says the
/// model fits no class. A watch whose first look finds no server ends
/// (1) rather than warning every second for ever.
#[test]
fn ctl_flags_out_of_range_exit_2_and_a_watch_of_nothing_ends() {
    let closed = format!(
        "http://127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    );
    for (args, says) in [
        (
            vec![
                "ctl",
                "--admin",
                &closed,
                "replicas",
                "--watch",
                "--interval-s",
                "0",
            ],
            "--interval-s",
        ),
        (
            vec![
                "ctl",
                "--admin",
                &closed,
                "plan",
                "m",
                "--path",
                "/tmp",
                "--utilization",
                "2",
            ],
            "--utilization",
        ),
        (
            vec![
                "ctl", "--admin", &closed, "plan", "m", "--path", "/tmp", "--dtype", "fp7",
            ],
            "--dtype",
        ),
        (
            vec!["ctl", "--admin", &closed, "node", "token", "--ttl", "30d"],
            "at most 7d",
        ),
    ] {
        let out = llmgw(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = llmgw(&[
        "ctl",
        "--admin",
        &closed,
        "replicas",
        "--watch",
        "--interval-s",
        "0.1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot reach the admin API"), "{err}");
}
