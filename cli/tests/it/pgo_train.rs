//! `scripts/pgo-train`, the run that `scripts/release-pgo` records a
//! profile from, kept working against the binary as it changes: a server
//! with a control plane and keys, a bare router, then a router with keys,
//! each serving its clients, and the log verified, exported and replayed.
//! A flag renamed or an output line changed would otherwise break only
//! the release build.

use std::process::Command;

#[test]
fn the_profile_training_serves_through_all_three_servers() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pgo-train");
    let out = Command::new(script)
        .args([env!("CARGO_BIN_EXE_llmgw"), "2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let phase = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name:?} in {stdout}"))
            .to_owned()
    };
    // Answered, and with keys on the wrong key refused.
    let control = phase("control plane, keys on: ");
    assert!(
        control.contains("200: ") && control.contains("401: "),
        "{control}"
    );
    let router = phase("router only, auth off: ");
    assert!(
        router.contains("200: ") && !router.contains("401: "),
        "{router}"
    );
    // The key made through the control plane's admin API is honoured by
    // a router reading the same log.
    let keyed = phase("router only, keys on, plain chat: ");
    assert!(
        keyed.contains("200: ") && !keyed.contains("401: "),
        "{keyed}"
    );
}
