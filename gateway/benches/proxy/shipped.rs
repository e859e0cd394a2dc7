//! `--binary PATH`: the `--profile` modes measure llmgw as shipped instead
//! of this program's `--serve` child: `PATH server`, router-only with keys
//! on (SQLite), in front of the same upstream, its key and limits made
//! with `PATH keys` as an operator would. So a build of the binary (with
//! or without a profile, `scripts/release-pgo`) is measured by the same
//! clients, against the same direct path and bare relay.

use std::net::SocketAddr;
use std::process::Command;

use llmgw_testkit::Served;

/// A running `llmgw server`, stopped (SIGTERM, so it exits as it would in
/// service) when dropped.
pub(crate) struct Shipped {
    served: Served,
    /// Its chat completions URL.
    pub(crate) url: String,
    /// The key it was given.
    pub(crate) key: String,
}

impl Shipped {
    pub(crate) fn pid(&self) -> u32 {
        self.served.pid()
    }
}

/// `binary server` in front of `up`, ready, with a key limited as the
/// bench's own gateway's is (generous limits at every level, checked on
/// every request, never refusing one). Unless `logged`, it logs warnings
/// only (`RUST_LOG=warn`), as the `--serve` child logs nothing.
pub(crate) fn start(binary: &str, up: SocketAddr, logged: bool) -> Shipped {
    let config = format!(
        "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\n\
         endpoints: [\"e=http://{up}=m\"]\nauth:\n  enabled: true\n"
    );
    let served = Served::start(
        binary,
        &config,
        (!logged).then_some("warn"),
        &["client listening on ", "admin listening on "],
        None,
    );
    let admin = format!("http://{}", served.addr(1));
    let keys = |args: &[&str]| {
        let out = Command::new(binary)
            .args([
                "--store",
                served.store(),
                "keys",
                "--admin",
                &admin,
                "--as",
                "bench",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "keys {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    keys(&["init", "--org", "o", "--team", "t", "--project", "p"]);
    let key = keys(&["create", "--project", "p", "--name", "bench"]);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&keys(&["list", "--json"])).unwrap();
    let key_id = listed
        .iter()
        .find(|k| k["name"] == "bench")
        .and_then(|k| k["key_id"].as_str())
        .expect("the key just made is listed")
        .to_owned();
    for (scope, id) in [
        ("org", "o"),
        ("team", "t"),
        ("project", "p"),
        ("key", &key_id),
    ] {
        keys(&[
            "limits",
            "--scope",
            scope,
            "--id",
            id,
            "--rpm",
            "100000000",
            "--tpm",
            "2000000000",
            "--budget",
            &(u64::MAX / 4).to_string(),
            "--period",
            "month",
            "--models",
            "m",
        ]);
    }
    Shipped {
        url: format!("http://{}/v1/chat/completions", served.addr(0)),
        served,
        key,
    }
}
