//! Periodic anchors through the binary, as an auditor uses them: the
//! server's sink holds anchors signed with its key, `events verify` names
//! the last anchor it checked, an export is held to the sink's anchor, and
//! a log rewritten before an anchor it records is caught.

use llmgw_eventstore::{RecordedEvent, hash};
use serde_json::Value;

use super::cluster::{free_port, server_yaml};
use super::{Child, json_lines, llmgw, ok, until};

fn sink_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sink_holds_signed_anchors_and_verify_holds_the_log_to_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let config = server_yaml(dir.path(), "anchored", &store, free_port(), 0);
    let key = dir.path().join("log-signing.key");
    let pem = llmgw_eventstore::signing::generate().unwrap();
    std::fs::write(&key, &pem).unwrap();
    let public = llmgw_eventstore::signing::SigningKey::parse(&pem)
        .unwrap()
        .public()
        .to_string();
    let sink = dir.path().join("anchors.jsonl");
    let server = Child::spawn_env(
        &["server", "--config", &config],
        &[
            ("LLMGW_CONTROL__ANCHORS__EVERY_EVENTS", "2".into()),
            ("LLMGW_CONTROL__ANCHORS__FILE", sink.display().to_string()),
            ("LLMGW_CONTROL__SIGNING_KEY", key.display().to_string()),
        ],
    );
    let admin = format!("http://{}", server.addr_after("admin listening on "));
    // Three models added: with the leader's own event, two anchors.
    for name in ["one", "two", "three"] {
        let model = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &model,
            format!("name: {name}\nscaling: {{min: 0, max: 1}}\nprofiles:\n  - name: sim\n    engine: sim\n"),
        )
        .unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args([
                "ctl",
                "model",
                "add",
                model.to_str().unwrap(),
                "--admin",
                &admin,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let lines = until("two anchors in the sink", || async {
        let lines = sink_lines(&sink);
        (lines.len() >= 2).then_some(lines)
    })
    .await;
    for l in &lines {
        assert_eq!(l["signature"]["key"], public.as_str(), "{l}");
        assert_eq!(l["instance"], "anchored");
    }
    let held = lines.last().unwrap()["anchor"].as_str().unwrap().to_owned();

    // The store's own verification names the last anchor it passed.
    let said = ok(&store, &["events", "verify"]);
    assert!(said.starts_with("ok: "), "{said}");
    let last_in_log = said
        .lines()
        .find_map(|l| l.strip_prefix("last anchor: "))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(last_in_log.contains("matches the chain"), "{said}");
    let report = &json_lines(&ok(&store, &["events", "verify", "--json"]))[0];
    assert_eq!(report["last_anchor"]["checked"], true, "{report}");

    // The sink's own lines, held to the store: each matches, each signed
    // by the server's key.
    let sink_arg = sink.to_str().unwrap();
    let with_sink = [
        "events",
        "verify",
        "--json",
        "--anchors",
        sink_arg,
        "--public-key",
        &public,
    ];
    let report = &json_lines(&ok(&store, &with_sink))[0];
    let matched = report["anchors"]["matched"].as_u64().unwrap();
    assert!(matched >= 2, "{report}");
    assert_eq!(report["anchors"]["proven"], matched, "{report}");
    // A line altered after signing, a line without its signature when a
    // key is asked for, and a line the server signed whose hash the log
    // does not hold (the log rewritten after it) each fail the check.
    let first = &lines[0];
    let (hash_held, position) = first["anchor"].as_str().unwrap().split_once('@').unwrap();
    let other_hash = if hash_held.starts_with('0') { "1" } else { "0" }.repeat(64);
    let mut altered = first.clone();
    altered["anchor"] = format!("{other_hash}@{position}").into();
    let mut unsigned = first.clone();
    unsigned.as_object_mut().unwrap().remove("signature");
    let rewritten: Value = serde_json::from_str(&llmgw_control::anchor::sink_line(
        "anchored",
        position.parse().unwrap(),
        &other_hash,
        first["event"].as_u64().unwrap(),
        chrono::Utc::now(),
        Some(&llmgw_eventstore::signing::SigningKey::parse(&pem).unwrap()),
    ))
    .unwrap();
    for (line, says) in [
        (Value::Null, "no anchor line in it"),
        (altered, "bad signature"),
        (unsigned, "not signed, and --public-key asks"),
        (rewritten, "the log was rewritten after this anchor"),
    ] {
        let held = dir.path().join("held.jsonl");
        let text = if line.is_null() {
            String::new()
        } else {
            format!("{line}\n")
        };
        std::fs::write(&held, text).unwrap();
        let out = llmgw(
            &store,
            &[
                "events",
                "verify",
                "--anchors",
                held.to_str().unwrap(),
                "--public-key",
                &public,
            ],
        );
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(
            said.contains("TAMPERED") && said.contains(says),
            "{says}: {said}"
        );
    }

    // An export is held to the sink's anchor, and reports the log's own.
    let export = dir.path().join("export.jsonl");
    ok(
        &store,
        &[
            "events",
            "export",
            "-o",
            export.to_str().unwrap(),
            "--sign-key",
            key.to_str().unwrap(),
        ],
    );
    let verify = |file: &std::path::Path, extra: &[&str]| {
        let mut args = vec!["events", "verify", "--file", file.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .args(&args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, said) = verify(&export, &["--anchor", &held, "--public-key", &public]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!("anchor {held}: matches"))
            && said.contains("last anchor: ")
            && said.contains("signature: good, by the key given"),
        "{said}"
    );

    // A forger rewrites the first event and rechains everything after it,
    // but not the anchors the log records: caught without the sink.
    let mut events: Vec<RecordedEvent> = std::fs::read_to_string(&export)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("{\"trailer\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    events[0].metadata = serde_json::json!({"actor": "someone else"});
    let mut prev = hash::GENESIS;
    for e in &mut events {
        e.hash = hash::chain(&prev, e);
        prev = e.hash;
    }
    let forged = dir.path().join("forged.jsonl");
    let text: Vec<String> = events
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    std::fs::write(&forged, text.join("\n") + "\n").unwrap();
    let (code, said) = verify(&forged, &[]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("TAMPERED") && said.contains("the log before it was rewritten"),
        "{said}"
    );
    // And a forger who rewrites the anchors too is caught by the sink's.
    let (code, said) = verify(&forged, &["--anchor", &held]);
    assert_eq!(code, Some(1), "{said}");
    drop(server);
    // The store is left as the server wrote it.
    assert!(llmgw(&store, &["events", "verify"]).status.success());
}
