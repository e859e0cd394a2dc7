//! `events export` and `events import` as an incident engineer and an
//! auditor use them: the copy is the source, byte for byte; a range joins
//! only the log it came from; and every file that is not a faithful export
//! is refused with its reason, leaving the store as it was.

use llmgw_eventstore::{RecordedEvent, hash};
use llmgw_testkit::{Backend, Scratch};
use serde_json::{Value, json};

use super::{fixture, json_lines, llmgw, ok};

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Postgres).await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Sqlite).await } )* }
    };
}

both_backends!(
    verify_file_proves_an_export_against_its_store_or_an_anchor,
    an_imported_copy_exports_the_same_bytes_and_travels_in_time_alike,
    a_range_joins_only_the_log_it_came_from,
    files_that_are_not_faithful_exports_are_refused_and_change_nothing,
    a_node_or_a_model_shows_its_replicas_and_tail_filters_by_type_and_actor,
    an_operator_name_that_would_print_as_something_else_is_refused_and_never_printed_raw,
    an_imported_erasure_deletes_the_persons_data_from_the_copy,
    an_add_refused_for_a_taken_address_is_recorded_without_it,
    usage_by_person_counts_their_keys_and_chat_together_and_the_operators_apart,
);

fn other(b: Backend) -> Backend {
    match b {
        Backend::Postgres => Backend::Sqlite,
        Backend::Sqlite => Backend::Postgres,
    }
}

/// A store holding one of the recorded incidents, imported as it was.
async fn incident(b: Backend, name: &str) -> (String, Scratch) {
    let (address, scratch) = Scratch::new(b).await;
    ok(
        &address,
        &["events", "import", fixture(name).to_str().unwrap()],
    );
    (address, scratch)
}

/// The export, trailer and all.
fn export_whole(address: &str, args: &[&str]) -> String {
    let mut all = vec!["events", "export"];
    all.extend_from_slice(args);
    ok(address, &all)
}

/// The export's events: every line but the trailer, which says when and
/// where it was written.
fn export(address: &str, args: &[&str]) -> String {
    let whole = export_whole(address, args);
    let (events, trailer) = split_trailer(&whole);
    assert!(
        trailer.is_some(),
        "an export ends with its trailer: {whole}"
    );
    events
}

fn split_trailer(text: &str) -> (String, Option<Value>) {
    let mut events = String::new();
    let mut trailer = None;
    for line in text.lines() {
        if line.starts_with("{\"trailer\"") {
            trailer = Some(serde_json::from_str(line).unwrap());
        } else {
            events.push_str(line);
            events.push('\n');
        }
    }
    (events, trailer)
}

/// The chain head, as `events stats` prints it: HASH@POSITION.
fn chain_head(address: &str) -> String {
    let stats = &json_lines(&ok(address, &["events", "stats", "--json"]))[0];
    stats["chain_head"].as_str().unwrap().to_owned()
}

/// A new Ed25519 key in `dir`: its file and its public half (hex).
fn signing_key(dir: &tempfile::TempDir, name: &str) -> (String, String) {
    use llmgw_eventstore::signing::{SigningKey, generate};
    let pem = generate().unwrap();
    let public = SigningKey::parse(&pem).unwrap().public().to_string();
    (write(dir, name, &pem), public)
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// The file's events with an edit at `line` (1-based) and every later
/// hash recomputed, as a forger would: consistent in itself.
fn rechained_edit(text: &str, line: usize) -> String {
    rechained_with(text, line, |e| {
        e.metadata = serde_json::json!({"actor": "someone else"});
    })
}

/// The file's events with `edit` made to the one at `line` (1-based) and
/// every later hash recomputed.
fn rechained_with(text: &str, line: usize, edit: impl FnOnce(&mut RecordedEvent)) -> String {
    let mut events: Vec<RecordedEvent> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    edit(&mut events[line - 1]);
    let mut prev = hash::GENESIS;
    for e in &mut events {
        e.hash = hash::chain(&prev, e);
        prev = e.hash;
    }
    let lines: Vec<String> = events
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    lines.join("\n") + "\n"
}

async fn an_imported_copy_exports_the_same_bytes_and_travels_in_time_alike(b: Backend) {
    for name in ["leadership-change-mid-placement", "node-lost-while-loading"] {
        let recorded = std::fs::read_to_string(fixture(name)).unwrap();
        let (source, _s1) = incident(b, name).await;
        // The fixture came back out as it went in: positions, times, epochs
        // and hashes as recorded, not as imported.
        assert_eq!(export(&source, &[]), recorded, "{name}");
        let epochs: Vec<u64> = json_lines(&recorded)
            .iter()
            .map(|e| e["epoch"].as_u64().unwrap())
            .collect();
        assert!(
            name != "leadership-change-mid-placement" || epochs.iter().any(|e| *e > 1),
            "{epochs:?}"
        );

        let dir = tempfile::tempdir().unwrap();
        let file = write(&dir, "export.jsonl", &export_whole(&source, &[]));
        for target in [b, other(b)] {
            let (copy, _s2) = Scratch::new(target).await;
            let said = ok(&copy, &["events", "import", &file]);
            let head = chain_head(&source);
            assert!(
                said.contains(&format!("the chain head is {head}")),
                "{said}"
            );
            assert_eq!(chain_head(&copy), head);
            assert_eq!(export(&copy, &[]), recorded, "{name} on {target:?}");
            assert!(ok(&copy, &["events", "verify"]).starts_with("ok: "));

            // Time travel lands on the same position in both.
            let events = json_lines(&recorded);
            let middle = events[events.len() / 2]["recorded_at"].as_str().unwrap();
            for view in ["cluster", "router"] {
                let args = ["events", "replay", "--until", middle, "--view", view];
                assert_eq!(ok(&copy, &args), ok(&source, &args), "{name} {view}");
            }
            let at = ok(
                &copy,
                &["events", "replay", "--until", middle, "--view", "cluster"],
            );
            let time = |e: &Value| {
                chrono::DateTime::parse_from_rfc3339(e["recorded_at"].as_str().unwrap()).unwrap()
            };
            let until = time(&events[events.len() / 2]);
            let want = events.iter().filter(|e| time(e) <= until).count();
            assert!(
                at.starts_with(&format!("cluster view at position {want}\n")),
                "{at}"
            );
        }
    }
}

async fn a_range_joins_only_the_log_it_came_from(b: Backend) {
    let name = "two-node-shard-failure";
    let (source, _s1) = incident(b, name).await;
    let dir = tempfile::tempdir().unwrap();
    let head = write(&dir, "head.jsonl", &export_whole(&source, &["--to", "6"]));
    let tail_text = export(&source, &["--from", "7"]);
    let first: Value = serde_json::from_str(tail_text.lines().next().unwrap()).unwrap();
    let sixth = &json_lines(&export(&source, &["--from", "6", "--to", "6"]))[0];
    assert_eq!(first["position"], 7);
    assert_eq!(
        first["prev_hash"], sixth["hash"],
        "the range names its link"
    );
    let tail = write(&dir, "tail.jsonl", &tail_text);

    // Into a copy that holds 1..6: it joins, and the copy is the source.
    let (copy, _s2) = Scratch::new(b).await;
    ok(&copy, &["events", "import", &head]);
    let said = ok(&copy, &["events", "import", &tail]);
    assert!(said.contains("positions 7..=16"), "{said}");
    assert_eq!(chain_head(&copy), chain_head(&source));
    // Again: nothing to write, everything checked.
    let again = ok(&copy, &["events", "import", &tail]);
    assert!(again.contains("imported nothing; all 10 events were already present"));

    // Into an empty store only on the operator's word, and it says so.
    let (fresh, _s3) = Scratch::new(b).await;
    let out = llmgw(&fresh, &["events", "import", &tail]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("this store is empty and the file starts at position 7")
            && err.contains("--from-anchor"),
        "{err}"
    );
    let said = ok(&fresh, &["events", "import", "--from-anchor", &tail]);
    assert!(said.contains("the log begins after position 6"), "{said}");
    let verified = ok(&fresh, &["events", "verify"]);
    assert!(
        verified.starts_with("ok: 10 events in 7..=16 verified (the log begins after position 6"),
        "{verified}"
    );
    assert!(ok(&fresh, &["events", "stats"]).contains("begins   after position 6"));
    let before = llmgw(&fresh, &["events", "show", "3"]);
    let err = String::from_utf8_lossy(&before.stderr);
    assert!(err.contains("this log begins after position 6"), "{err}");
    assert_eq!(chain_head(&fresh), chain_head(&source));
    // Its views would lack what came before position 7: replaying them
    // is refused rather than shown as the past (no nodes where there were).
    for args in [
        vec!["events", "replay", "--until", "12", "--view", "cluster"],
        vec![
            "events", "diff", "--from", "8", "--to", "12", "--view", "cluster",
        ],
    ] {
        let out = llmgw(&fresh, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains("begins after position 6"), "{err}");
    }
    // The whole log again: what it holds is checked, and what lies before
    // its start is not counted as present.
    let whole = write(&dir, "whole.jsonl", &export(&source, &[]));
    let said = ok(&fresh, &["events", "import", &whole]);
    assert!(
        said.starts_with(
            "imported nothing; 10 events were already present; 6 lie before this store's first event (its log begins after position 6)"
        ),
        "{said}"
    );
    // Its own export names the same link, so it can be passed on.
    assert_eq!(export(&fresh, &[]), tail_text);
}

async fn files_that_are_not_faithful_exports_are_refused_and_change_nothing(b: Backend) {
    let name = "node-lost-while-loading";
    let (source, _s1) = incident(b, name).await;
    let whole = export(&source, &[]);
    let lines: Vec<&str> = whole.lines().collect();
    let anchor = chain_head(&source);
    let dir = tempfile::tempdir().unwrap();
    // A copy holding the first half, and an address where no store is yet.
    let (copy, _s2) = Scratch::new(b).await;
    let half = write(&dir, "half.jsonl", &export_whole(&source, &["--to", "7"]));
    ok(&copy, &["events", "import", &half]);
    let before = export(&copy, &[]);
    let nowhere = dir.path().join("never.db");
    let nowhere = nowhere.to_str().unwrap();
    let (other_log, _s3) = incident(b, "two-node-shard-failure").await;

    let rechained = write(&dir, "rechained.jsonl", &rechained_edit(&whole, 3));
    let cut_mid_line = write(&dir, "cut.jsonl", &whole[..whole.len() - 40]);
    let cut_at_line = write(&dir, "short.jsonl", &(lines[..10].join("\n") + "\n"));
    // Cut, but with the trailer put back: the trailer no longer fits.
    let trailer = split_trailer(&export_whole(&source, &[])).1.unwrap();
    let cut_under_trailer = write(
        &dir,
        "cut-under-trailer.jsonl",
        &(lines[..10].join("\n") + "\n" + &trailer.to_string() + "\n"),
    );
    let mut holed = lines.clone();
    holed.remove(4);
    let gap = write(&dir, "gap.jsonl", &(holed.join("\n") + "\n"));
    let foreign = write(&dir, "foreign.jsonl", &export(&other_log, &["--from", "8"]));
    // Signed by the source's key, then its trailer altered; and a file
    // signed by someone else's key.
    let (key, public) = signing_key(&dir, "source.key");
    let (other_key, _) = signing_key(&dir, "other.key");
    let signed = export_whole(&source, &["--sign-key", &key]);
    let resigned = signed.replace("\"head\":14", "\"head\":15");
    assert_ne!(signed, resigned);
    let bad_signature = write(&dir, "bad-signature.jsonl", &resigned);
    // A field added to a signed trailer, which the signature does not
    // cover: it passed as well signed.
    let noted = signed.replace("{\"trailer\":{", "{\"trailer\":{\"note\":\"hello\",");
    assert_ne!(signed, noted);
    let added_field = write(&dir, "added-field.jsonl", &noted);
    let someone_else = write(
        &dir,
        "someone-else.jsonl",
        &export_whole(&source, &["--sign-key", &other_key]),
    );
    let with_key = |file: &str| -> Vec<String> {
        ["events", "import", "--public-key", &public, file]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let anchored = |file: &str| -> Vec<String> {
        ["events", "import", "--anchor", &anchor, file]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let cases: Vec<(&str, &str, Vec<String>, &str)> = vec![
        (
            "rechained edit, against a copy",
            copy.as_str(),
            vec!["events".into(), "import".into(), rechained.clone()],
            "position 7: the file's event differs from this store's",
        ),
        (
            "rechained edit, against the source's anchor",
            nowhere,
            anchored(&rechained),
            "not the anchor's",
        ),
        (
            "cut in the middle of a line",
            copy.as_str(),
            vec!["events".into(), "import".into(), cut_mid_line],
            "not an exported event (the file was cut short?)",
        ),
        (
            "cut at a line, against the anchor",
            nowhere,
            anchored(&cut_at_line),
            "the file ends at position 10, before the anchor at 14",
        ),
        (
            "cut at a line, under its trailer",
            nowhere,
            vec!["events".into(), "import".into(), cut_under_trailer],
            "the trailer says the export holds 14 events, 1..=14, but the file holds 10",
        ),
        (
            "a gap",
            copy.as_str(),
            vec!["events".into(), "import".into(), gap],
            "line 5 (position 6): position 6 follows 4",
        ),
        (
            "a foreign start",
            copy.as_str(),
            vec!["events".into(), "import".into(), foreign],
            "position 8: does not follow this store's head at 7",
        ),
        (
            "a bad signature",
            copy.as_str(),
            vec!["events".into(), "import".into(), bad_signature.clone()],
            "(the trailer): bad signature: key",
        ),
        (
            "a bad signature, with the source's key",
            nowhere,
            with_key(&bad_signature),
            "bad signature",
        ),
        (
            "signed by another key",
            nowhere,
            with_key(&someone_else),
            "not by the key given",
        ),
        (
            "a field added to a signed trailer",
            nowhere,
            with_key(&added_field),
            "unknown field `note`",
        ),
        (
            "not signed, and the key asks for a signature",
            nowhere,
            with_key(&write(&dir, "unsigned.jsonl", &export_whole(&source, &[]))),
            "it is not signed",
        ),
    ];
    for (what, store, args, says) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = llmgw(store, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(says),
            "{what}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
        assert_eq!(export(&copy, &[]), before, "{what} changed the copy");
        assert!(
            !std::path::Path::new(nowhere).exists(),
            "{what} left a store behind"
        );
    }
    // A file with nothing in it imports nothing, and makes no store for it.
    let empty = write(&dir, "empty.jsonl", "");
    assert!(ok(nowhere, &["events", "import", &empty]).contains("nothing to import"));
    assert!(
        !std::path::Path::new(nowhere).exists(),
        "an empty import made a store"
    );
    // The anchor admits the faithful file, and creates the store for it.
    let faithful = write(&dir, "whole.jsonl", &whole);
    let args = anchored(&faithful);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(nowhere, &args);
    assert_eq!(chain_head(nowhere), anchor);
    let said = ok(&copy, &["events", "import", &faithful]);
    assert!(
        said.contains("positions 8..=14; 7 were already present"),
        "{said}"
    );
    // The source's signed export is taken on its key.
    let (fresh, _s4) = Scratch::new(b).await;
    let signed = write(&dir, "signed.jsonl", &signed);
    let args = with_key(&signed);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(&fresh, &args);
    assert_eq!(chain_head(&fresh), anchor);
}

fn positions(text: &str) -> Vec<u64> {
    json_lines(text)
        .iter()
        .map(|e| e["position"].as_u64().unwrap())
        .collect()
}

/// `2026-12-03T07:45:12.345Z`: UTC, to the millisecond, with its zone.
fn is_millisecond_utc(s: &str) -> bool {
    chrono::DateTime::parse_from_rfc3339(s).is_ok()
        && s.len() == 24
        && s.as_bytes()[19] == b'.'
        && s.ends_with('Z')
}

async fn a_node_or_a_model_shows_its_replicas_and_tail_filters_by_type_and_actor(b: Backend) {
    let (two_nodes, _s1) = incident(b, "two-node-shard-failure").await;
    // n2 held r1's second shard and r2's first: their replicas' lives, and
    // only the shards that ran on n2.
    let log = |args: &[&str]| {
        let mut all = vec!["events", "log", "--json"];
        all.extend_from_slice(args);
        positions(&ok(&two_nodes, &all))
    };
    assert_eq!(log(&["--node", "n2"]), [4, 6, 8, 10, 11, 12, 13, 14, 16]);
    assert_eq!(log(&["--node", "n1"]), [3, 6, 7, 9, 11, 12]);
    assert_eq!(
        log(&["--model", "llama-70b"]),
        [2, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    );
    let table = ok(&two_nodes, &["events", "log", "--node", "n2"]);
    let rows: Vec<&str> = table.lines().collect();
    assert!(
        rows[0].starts_with("WHEN") && rows[0].contains("STREAM"),
        "{table}"
    );
    for row in &rows[1..] {
        let when = row.split_whitespace().next().unwrap();
        assert!(is_millisecond_utc(when), "{row}");
    }
    assert!(
        rows.iter()
            .any(|r| r.contains("replica-r1") && r.contains("r1-1 failed: NCCL error")),
        "{table}"
    );

    let (lost, _s2) = incident(b, "node-lost-while-loading").await;
    let tail = |args: &[&str]| {
        let mut all = vec!["events", "tail", "--json"];
        all.extend_from_slice(args);
        positions(&ok(&lost, &all))
    };
    assert_eq!(tail(&["--type", "NodeLost,Replica*"]), [5, 9, 10, 11, 14]);
    assert_eq!(
        tail(&["--type", "NodeLost,Replica*", "--limit", "2"]),
        [11, 14]
    );
    assert_eq!(tail(&["--type", "Replica*", "--from", "6"]), [10, 11, 14]);
    assert_eq!(tail(&["--type", "NodeLost"]), [9]);
    let table = ok(&lost, &["events", "tail", "--type", "NodeLost"]);
    let row = table.lines().nth(1).unwrap();
    assert!(
        is_millisecond_utc(row.split_whitespace().nth(1).unwrap()),
        "{row}"
    );
    let bad = llmgw(&lost, &["events", "tail", "--type", "Re*plica"]);
    assert_eq!(bad.status.code(), Some(2));
    // A type no event has is a typo, not "none such": refused, with the
    // name meant when only its case is off.
    for (typo, says) in [
        (
            "nodecordoned",
            "no event type is nodecordoned; did you mean NodeCordoned?",
        ),
        ("Nosuch*", "no event type is Nosuch*"),
        // A prefix in the wrong case means every type it starts, not the
        // first; a letter or two off is the type meant.
        ("key*", "no event type is key*; did you mean Key*?"),
        (
            "KeyIsued",
            "no event type is KeyIsued; did you mean KeyIssued?",
        ),
        (
            "KeyIssue",
            "no event type is KeyIssue; did you mean KeyIssued?",
        ),
    ] {
        let out = llmgw(&lost, &["events", "tail", "--type", typo]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(says), "{err}");
    }

    let (key, _s3) = incident(b, "key-revoked-in-use").await;
    let by = |actor: &str| positions(&ok(&key, &["events", "tail", "--json", "--actor", actor]));
    assert_eq!(by("gw-1"), [8, 9, 10, 12]);
    assert_eq!(by("ops@acme"), [11], "the actor the log's BY column names");
    assert!(by("nobody").is_empty());

    let shown = ok(&lost, &["events", "show", "5"]);
    let at = shown
        .lines()
        .find_map(|l| l.strip_prefix("recorded at"))
        .unwrap()
        .trim();
    assert!(is_millisecond_utc(at), "{shown}");
    let help = ok(&lost, &["events", "diff", "--help"]);
    assert!(help.contains("--to <POSITION|TIME>"), "{help}");
}

fn verify_file(args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec!["events", "verify"];
    all.extend_from_slice(args);
    // --store is refused with --file (the store is named by --against),
    // so none is given.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_remove("LLMGW_STORE")
        .args(&all)
        .output()
        .expect("run llmgw");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

async fn verify_file_proves_an_export_against_its_store_or_an_anchor(b: Backend) {
    let name = "two-node-shard-failure";
    let (source, _s1) = incident(b, name).await;
    let (other_log, _s2) = incident(b, "node-lost-while-loading").await;
    let dir = tempfile::tempdir().unwrap();
    let whole_text = export_whole(&source, &[]);
    let trailer = split_trailer(&whole_text).1.unwrap();
    let t = &trailer["trailer"];
    let head = chain_head(&source);
    assert_eq!(
        (t["from"].as_u64(), t["to"].as_u64(), t["events"].as_u64()),
        (Some(1), Some(16), Some(16))
    );
    assert_eq!(
        format!("{}@{}", t["head_hash"].as_str().unwrap(), t["head"]),
        head
    );
    assert!(t["host"].as_str().is_some_and(|h| !h.is_empty()));
    let first = &json_lines(&whole_text)[0];
    assert_eq!(
        t["log_start"],
        format!("{}@1", first["hash"].as_str().unwrap())
    );
    assert!(chrono::DateTime::parse_from_rfc3339(t["exported_at"].as_str().unwrap()).is_ok());
    let whole = write(&dir, "whole.jsonl", &whole_text);

    // On its own: consistent, and it says what that does not prove.
    let (code, said) = verify_file(&["--file", &whole]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("ok: 16 events in 1..=16 chain correctly")
            && said.contains("the source's head was 16")
            && said.contains("not proven"),
        "{said}"
    );
    // What cannot be read is said so, not called tampered.
    let (code, said) = verify_file(&["--file", dir.path().to_str().unwrap()]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("is a directory, not an export") && !said.contains("TAMPERED"),
        "{said}"
    );
    // Against its store, or an anchor held from it: proven.
    let (code, said) = verify_file(&["--file", &whole, "--against", &source]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("positions 1..=16 are the store's"), "{said}");
    let (code, said) = verify_file(&["--file", &whole, "--anchor", &head]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("matches") && !said.contains("not proven"),
        "{said}"
    );
    // Everything since an anchor, checked against it: the anchor is the
    // hash the range names before its first event.
    let since = write(
        &dir,
        "since.jsonl",
        &export_whole(&source, &["--from", "9"]),
    );
    let eighth = format!("{}@8", json_lines(&whole_text)[7]["hash"].as_str().unwrap());
    let (code, said) = verify_file(&["--file", &since, "--anchor", &eighth]);
    assert_eq!(code, Some(0), "{said}");
    assert!(!said.contains("TAMPERED"), "{said}");
    let seventh = format!("{}@8", json_lines(&whole_text)[6]["hash"].as_str().unwrap());
    let (code, said) = verify_file(&["--file", &since, "--anchor", &seventh]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("not the anchor's"), "{said}");

    // A rechained edit passes on its own, and nowhere else.
    let forged = write(
        &dir,
        "forged.jsonl",
        &rechained_edit(&export(&source, &[]), 5),
    );
    let (code, said) = verify_file(&["--file", &forged]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("not proven") && said.contains("no trailer"),
        "{said}"
    );
    let (code, said) = verify_file(&["--file", &forged, "--against", &source]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("TAMPERED: position 5 is the first that differs from the store's"),
        "{said}"
    );
    let (code, said) = verify_file(&["--file", &forged, "--anchor", &head]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("not the anchor's"), "{said}");
    // Another log's file, and a range joined to the wrong log.
    let theirs = write(&dir, "theirs.jsonl", &export_whole(&other_log, &[]));
    let (code, said) = verify_file(&["--file", &theirs, "--against", &source]);
    assert_eq!(code, Some(1), "{said}");
    let range = write(
        &dir,
        "range.jsonl",
        &export_whole(&source, &["--from", "9", "--to", "12"]),
    );
    let (code, said) = verify_file(&["--file", &range, "--against", &source]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("positions 9..=12 are the store's"), "{said}");
    let (code, said) = verify_file(&["--file", &range, "--against", &other_log]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("TAMPERED: position 9 is the first that differs"),
        "{said}"
    );

    // Signed with the server's key: the public key proves it, on its own.
    let (key, public) = signing_key(&dir, "server.key");
    let signed = write(
        &dir,
        "signed.jsonl",
        &export_whole(&source, &["--sign-key", &key]),
    );
    let (code, said) = verify_file(&["--file", &signed, "--public-key", &public]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!(
            "signature: good, by the key given ({})",
            &public[..16]
        )) && !said.contains("not proven"),
        "{said}"
    );
    let (code, said) = verify_file(&["--file", &signed]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("give --public-key") && said.contains("not proven"),
        "{said}"
    );
    let forged_signed = write(
        &dir,
        "forged-signed.jsonl",
        &std::fs::read_to_string(&signed)
            .unwrap()
            .replace("\"head\":16", "\"head\":17"),
    );
    let (code, said) = verify_file(&["--file", &forged_signed, "--public-key", &public]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("TAMPERED") && said.contains("bad signature"),
        "{said}"
    );
    let (code, said) = verify_file(&["--file", &whole, "--public-key", &public]);
    assert_eq!(code, Some(1), "an unsigned file, a key asked for: {said}");

    let report = &json_lines(&verify_file(&["--file", &whole, "--json"]).1)[0];
    assert_eq!(
        (report["ok"].as_bool(), report["to"].as_u64()),
        (Some(true), Some(16))
    );
    let (code, said) = verify_file(&["--against", &source]);
    assert_eq!(code, Some(2), "--against needs --file: {said}");
}

const PASSWORD: &str = "correct horse battery staple";

/// `users …` run as `--as NAME` against the store itself (no server
/// answers at the address the tests give).
fn users(store: &str, actor: &str, args: &[&str]) -> std::process::Output {
    let mut all = vec!["users", "--as", actor];
    all.extend_from_slice(args);
    llmgw(store, &all)
}

/// A person added to project p by alice: their id.
fn add_person(store: &str, email: &str) -> String {
    let out = users(
        store,
        "alice",
        &[
            "add",
            "--email",
            email,
            "--name",
            "Gina",
            "--project",
            "p",
            "--password",
            PASSWORD,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// `users list --json`: each person's row by id.
fn people(store: &str) -> Vec<Value> {
    let out = users(store, "alice", &["list", "--json"]);
    assert!(out.status.success());
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn person<'a>(rows: &'a [Value], id: &str) -> &'a Value {
    rows.iter().find(|r| r["user_id"] == id).unwrap()
}

/// A store with org o, team t and project p, made by alice.
async fn tree(b: Backend) -> (String, Scratch) {
    let (store, scratch) = Scratch::new(b).await;
    ok(
        &store,
        &[
            "keys",
            "--as",
            "alice",
            "init",
            "--org",
            "o",
            "--team",
            "t",
            "--project",
            "p",
        ],
    );
    (store, scratch)
}

/// Whether `text` holds a character that a terminal would not print as
/// itself: a control (the line breaks of `lines` aside), an invisible one
/// or a direction mark.
fn holds_hidden(text: &str) -> bool {
    text.lines()
        .any(|l| l.chars().any(llmgw_domain::tenancy::hidden_char))
}

async fn an_operator_name_that_would_print_as_something_else_is_refused_and_never_printed_raw(
    b: Backend,
) {
    let forged_line =
        "bob\n2026-12-07T18:00:00.000Z  1  key-K  KeyRevoked  alice  {\"forged\":true}";
    let (store, _s1) = tree(b).await;
    let before = export(&store, &[]);
    for (actor, says) in [
        (
            forged_line,
            "U+000A, a control, invisible or direction character",
        ),
        ("\u{1b}[2Jbob", "U+001B"),
        ("bob\u{202E}ecila", "U+202E"),
        (&"b".repeat(65) as &str, "too long: at most 64 characters"),
    ] {
        let out = users(
            &store,
            actor,
            &[
                "add",
                "--email",
                "gina@example.com",
                "--project",
                "p",
                "--password",
                PASSWORD,
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{actor:?}: {err}");
        assert!(err.contains(says), "{actor:?}: {err}");
        assert!(!holds_hidden(&err), "the refusal printed it raw: {err:?}");
        assert_eq!(export(&store, &[]), before, "{actor:?} was recorded");
    }
    assert!(people(&store).is_empty(), "a refused add left an account");

    // A log written before names were checked (or imported from one):
    // its text is printed escaped, one event a line.
    let crafted = rechained_with(&before, 1, |e| {
        e.metadata["actor"] = forged_line.into();
        e.payload["name"] = "\u{1b}[2Jacme\u{202E}gro".into();
    });
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, "older.jsonl", &crafted);
    let (older, _s2) = Scratch::new(b).await;
    ok(&older, &["events", "import", &file]);
    let first: RecordedEvent = serde_json::from_str(crafted.lines().next().unwrap()).unwrap();
    let events = crafted.lines().count();

    let log = ok(&older, &["events", "log", "--stream", &first.stream_id]);
    assert!(!holds_hidden(&log), "{log:?}");
    let in_stream = crafted
        .lines()
        .filter(|l| l.contains(&format!("\"stream_id\":\"{}\"", first.stream_id)))
        .count();
    assert_eq!(log.lines().count(), in_stream + 1, "a row an event: {log}");
    let row = log.lines().nth(1).unwrap();
    assert!(
        row.contains("bob\\n2026-12-07T18:00:00.000Z  1  key-K  KeyRevoked  alice"),
        "{row}"
    );
    let tail = ok(&older, &["events", "tail"]);
    assert!(!holds_hidden(&tail), "{tail:?}");
    assert_eq!(tail.lines().count(), events + 1, "{tail}");
    assert!(tail.contains("acme\\u{202e}gro"), "{tail}");
    let shown = ok(&older, &["events", "show", "1"]);
    assert!(!holds_hidden(&shown), "{shown:?}");
    assert!(shown.contains("\\u{202e}"), "{shown}");
    // JSON is for programs, and carries the text as stored.
    let json = json_lines(&ok(&older, &["events", "tail", "--json"]));
    assert_eq!(json[0]["metadata"]["actor"], forged_line);
}

async fn an_imported_erasure_deletes_the_persons_data_from_the_copy(b: Backend) {
    let (source, _s1) = tree(b).await;
    let gina = add_person(&source, "gina@example.com");
    let hank = add_person(&source, "hank@example.com");
    // A copy, people and all, made before the erasure; and one brought up
    // to date by an older llmgw, which wrote the events alone.
    let (copy, _s2) = Scratch::new(b).await;
    ok(&source, &["store", "copy", "--to", &copy]);
    let (older, _s3) = Scratch::new(b).await;
    ok(&source, &["store", "copy", "--to", &older]);

    let erased = users(&source, "alice", &["erase", &gina]);
    assert!(erased.status.success());
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, "since.jsonl", &export_whole(&source, &[]));
    let said = ok(&copy, &["events", "import", &file]);
    assert!(
        said.contains(&format!(
            "deleted the personal data of 1 person the imported log erased ({gina}) from this store's people table"
        )),
        "{said}"
    );
    let rows = people(&copy);
    let (g, h) = (person(&rows, &gina), person(&rows, &hank));
    assert_eq!(
        (&g["status"], &g["email"], &g["name"]),
        (&json!("erased"), &json!(""), &json!("")),
        "{g}"
    );
    assert_eq!(h["email"], "hank@example.com", "{h}");
    // Again: nothing written, nothing left to delete, nothing said of it.
    let again = ok(&copy, &["events", "import", &file]);
    assert!(!again.contains("deleted"), "{again}");

    // The older copy: the log erased gina, the table still has her.
    import_events_alone(&older, &export(&source, &[])).await;
    assert_eq!(person(&people(&older), &gina)["email"], "gina@example.com");
    let out = users(&older, "alice", &["erase", &gina]);
    assert!(out.status.success(), "{out:?}");
    let told = String::from_utf8_lossy(&out.stdout);
    assert!(
        told.contains(&format!(
            "{gina} was erased in the log already, but this store's people table still held their personal data: deleted now"
        )),
        "{told}"
    );
    assert_eq!(person(&people(&older), &gina)["email"], "");
    let out = users(&older, "alice", &["erase", &gina]);
    let told = String::from_utf8_lossy(&out.stdout);
    assert!(told.contains("nothing to change"), "{told}");
}

/// The events of `text` imported into `address` as an llmgw before
/// imports applied erasures did it: the log alone.
async fn import_events_alone(address: &str, text: &str) {
    use llmgw_eventstore::{AnyStore, EventStore, ImportOptions, OpenOptions, StoreAddress};
    let store = AnyStore::open(
        &StoreAddress::parse(address).unwrap(),
        OpenOptions::default(),
    )
    .await
    .unwrap();
    let lease = store
        .acquire_lease("older-llmgw", std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let events: Vec<RecordedEvent> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    store
        .import(
            &lease.token,
            &ImportOptions::default(),
            events.into_iter().map(Ok),
        )
        .await
        .unwrap();
    store.release_lease(&lease.token).await.unwrap();
}

async fn an_add_refused_for_a_taken_address_is_recorded_without_it(b: Backend) {
    let (store, _s1) = tree(b).await;
    let gina = add_person(&store, "gina@example.com");
    let out = users(
        &store,
        "carol",
        &[
            "add",
            "--email",
            "Gina@Example.com",
            "--name",
            "G",
            "--project",
            "p",
            "--password",
            PASSWORD,
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("has an account already"), "{err}");
    // In the log as every refused operator command is: who, what, why, in
    // the stream of the person the address belongs to.
    let log = json_lines(&ok(&store, &["events", "log", "--user", &gina, "--json"]));
    let refused: Vec<&Value> = log
        .iter()
        .filter(|e| e["event_type"] == "CommandRefused")
        .collect();
    assert_eq!(refused.len(), 1, "{log:?}");
    let r = refused[0];
    assert_eq!(r["metadata"]["actor"], "carol", "{r}");
    assert!(
        r["payload"]["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("the email given has an account already, {gina}")),
        "{r}"
    );
    let table = ok(&store, &["events", "log", "--user", &gina]);
    assert!(
        table.contains("CommandRefused") && table.contains("carol"),
        "{table}"
    );
    // Personal data never enters the log: not the address, in any case.
    let whole = export(&store, &[]).to_lowercase();
    assert!(!whole.contains("gina@example.com"), "{whole}");
}

/// A line longer than any event is refused by its number, by import and
/// by verify --file alike, without reading the rest of it.
#[tokio::test]
async fn a_line_longer_than_any_event_is_refused_by_its_number() {
    let (source, _s1) = incident(Backend::Sqlite, "two-node-shard-failure").await;
    let text = export(&source, &[]);
    let first = text.lines().next().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.jsonl");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        writeln!(f, "{first}").unwrap();
        // A 65 MiB "event": an object with one long string.
        f.write_all(b"{\"payload\":\"").unwrap();
        let block = vec![b'x'; 1 << 20];
        for _ in 0..65 {
            f.write_all(&block).unwrap();
        }
        f.write_all(b"\"}\n").unwrap();
    }
    let file = path.to_str().unwrap();
    let (copy, _s2) = Scratch::new(Backend::Sqlite).await;
    let out = llmgw(&copy, &["events", "import", file]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("line 2: longer than 64 MiB, which no exported event is"),
        "{err}"
    );
    assert!(
        !std::path::Path::new(&copy).exists(),
        "the refusal left a store"
    );
    let (code, said) = verify_file(&["--file", file]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("TAMPERED: line 2: longer than 64 MiB"),
        "{said}"
    );
}

/// A key made by alice in project p, for `owner` when given: its id.
fn key_in_p(store: &str, name: &str, owner: Option<&str>) -> String {
    let mut args = vec![
        "keys",
        "--as",
        "alice",
        "create",
        "--project",
        "p",
        "--name",
        name,
    ];
    if let Some(o) = owner {
        args.extend(["--owner", o]);
    }
    let out = llmgw(store, &args);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    said.split_whitespace()
        .skip_while(|w| *w != "issued")
        .nth(1)
        .map(|id| id.trim_end_matches(';').to_owned())
        .unwrap_or_else(|| panic!("{said}"))
}

/// Requests a gateway finished, appended as it appends them: one batch,
/// each request `(key id, prompt tokens, completion tokens)`, priced at
/// 1,000 micro-units per 1,000 tokens each way (a token costs 1).
async fn served(store: &str, requests: &[(&str, u64, u64)]) {
    use llmgw_decider::{Actor, Decider, Origin};
    use llmgw_domain::catalog::Price;
    use llmgw_domain::usage::{FinishedRequest, record_batch};
    use llmgw_eventstore::{AnyStore, OpenOptions, StoreAddress};
    let log = AnyStore::open(&StoreAddress::parse(store).unwrap(), OpenOptions::default())
        .await
        .unwrap();
    let now = llmgw_domain::time::UnixMillis::now();
    let finished = requests
        .iter()
        .enumerate()
        .map(|(i, (key, prompt, completion))| FinishedRequest {
            request_id: format!("req-{i}"),
            key_id: (*key).into(),
            project_id: "p".into(),
            model_asked: "tiny".into(),
            model_served: "tiny".into(),
            prompt_tokens: *prompt,
            completion_tokens: *completion,
            status: 200,
            latency_ms: 10,
            ttft_ms: None,
            band: llmgw_domain::tenancy::Band::Gold,
            at: now,
            price: Price {
                prompt_per_1k: 1000,
                completion_per_1k: 1000,
            },
        });
    let (batch, refused) = record_batch("gw-1", finished);
    assert!(refused.is_empty(), "{refused:?}");
    Decider::new(log, "gw-1".into())
        .observe(
            &Origin::new(Actor::Gateway("gw-1".into())),
            vec![llmgw_domain::Event::Usage(batch.unwrap())],
        )
        .await
        .unwrap();
}

/// `events usage --by person` counts a person's own keys and their chat
/// on the pages together, as the admin usage page does, and every key
/// made without an owner together as the operators', which the table
/// says; another person is a row of their own.
async fn usage_by_person_counts_their_keys_and_chat_together_and_the_operators_apart(b: Backend) {
    let (store, _s1) = tree(b).await;
    let gina = add_person(&store, "gina@example.com");
    let hank = add_person(&store, "hank@example.com");
    let laptop = key_in_p(&store, "laptop", Some(&gina));
    let phone = key_in_p(&store, "phone", Some(&gina));
    let hanks = key_in_p(&store, "laptop", Some(&hank));
    let ci = key_in_p(&store, "ci", None);
    let deploy = key_in_p(&store, "deploy", None);
    let gina_chat = format!("session:{gina}");
    served(
        &store,
        &[
            (&laptop, 10, 1),
            (&phone, 20, 2),
            (&gina_chat, 30, 3),
            (&hanks, 40, 4),
            (&ci, 50, 5),
            (&deploy, 60, 6),
        ],
    )
    .await;

    let rows = json_lines(&ok(
        &store,
        &["events", "usage", "--by", "person", "--json"],
    ));
    let row = |who: &str| {
        let r = rows
            .iter()
            .find(|r| r["person"] == who)
            .unwrap_or_else(|| panic!("no row for {who}: {rows:?}"));
        (
            r["requests"].as_u64().unwrap(),
            r["prompt_tokens"].as_u64().unwrap(),
            r["completion_tokens"].as_u64().unwrap(),
            r["cost_micros"].as_u64().unwrap(),
        )
    };
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(row(&gina), (3, 60, 6, 66), "two keys and the chat");
    assert_eq!(row(&hank), (1, 40, 4, 44));
    assert_eq!(row("(operators)"), (2, 110, 11, 121), "both unowned keys");

    // Beside another grouping; and the table says what the operators' row is.
    let by_key = json_lines(&ok(
        &store,
        &["events", "usage", "--by", "person,key", "--json"],
    ));
    assert!(
        by_key
            .iter()
            .any(|r| r["person"] == gina.as_str() && r["key"] == gina_chat.as_str()),
        "{by_key:?}"
    );
    let table = ok(&store, &["events", "usage", "--by", "person"]);
    assert!(table.contains("PERSON"), "{table}");
    assert!(
        table.contains("(operators): every key made without an owner (an operator's), together"),
        "{table}"
    );
    let csv = ok(&store, &["events", "usage", "--by", "person", "--csv"]);
    assert!(
        csv.lines()
            .any(|l| l.starts_with(&format!("{gina},3,0,60,6,66,"))),
        "{csv}"
    );
}
