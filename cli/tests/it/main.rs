//! The `llmgw` binary as an operator runs it: real processes, real stores.

#![allow(clippy::unwrap_used, reason = "in tests an unwrap is an assertion")]

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use llmgw_eventstore::{
    AnyStore, EventStore, ExpectedVersion, NewEvent, OpenOptions, RecordedEvent, StoreAddress,
    StreamAppend, Writer,
};
use llmgw_testkit::{Backend, Scratch, until};
use serde_json::{Value, json};

mod agent_config;
mod anchors;
mod bench;
mod browser;
mod capture;
mod cluster;
mod connections;
mod conversations;
mod deploy_kit;
mod deploy_rules;
mod drain;
mod drills;
mod events_io;
mod failover;
mod fence;
mod follow;
mod join;
mod kv_events;
mod logs;
mod metrics;
mod migration;
mod mirror;
mod node_agent;
mod outage;
mod partition;
mod pgo_train;
mod plan;
mod provision;
mod restart;
mod shell;
mod store_setting;
mod tenancy;
mod tool_check;
mod upstream;
mod web;

fn llmgw(store: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_remove("LLMGW_STORE")
        // No server answers there: `keys` writes to the store itself.
        .env("LLMGW_ADMIN", "http://127.0.0.1:1")
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .expect("run llmgw")
}

fn ok(store: &str, args: &[&str]) -> String {
    let out = llmgw(store, args);
    assert!(
        out.status.success(),
        "llmgw {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// The usage rows of events as `events tail --json` prints them: each
/// batch's rows, and an older single-row record as itself.
fn usage_rows_of(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .flat_map(|e| {
            let (kind, version) = (e["event_type"].as_str(), e["schema_version"].as_u64());
            let decoded = llmgw_domain::Event::decode(
                kind.unwrap_or_default(),
                version.unwrap_or_default() as u32,
                &e["payload"],
            );
            match decoded {
                Ok(llmgw_domain::Event::Usage(u)) => (u.rows().iter())
                    .map(|r| serde_json::to_value(r).unwrap())
                    .collect(),
                _ => Vec::new(),
            }
        })
        .collect()
}

/// A migrated store with `n` events over two streams.
async fn seeded(backend: Backend, n: u64) -> (String, Scratch, AnyStore) {
    store_with(
        backend,
        (0..n).map(|i| {
            let s = if i % 3 == 0 { "node-a" } else { "model-b" };
            let e = NewEvent::new(
                if i % 3 == 0 {
                    "NodeRegistered"
                } else {
                    "ModelAdded"
                },
                1,
                json!({"i": i, "gib": 44.99}),
            )
            .with_metadata(json!({"actor": "test"}));
            vec![StreamAppend::new(s, ExpectedVersion::Any, vec![e])]
        }),
    )
    .await
}

/// A migrated store holding `appends`, each appended in turn under a lease
/// released afterwards.
async fn store_with(
    backend: Backend,
    appends: impl IntoIterator<Item = Vec<StreamAppend>>,
) -> (String, Scratch, AnyStore) {
    let (address, scratch) = Scratch::new(backend).await;
    ok(&address, &["store", "migrate"]);
    let store = AnyStore::open(
        &StoreAddress::parse(&address).unwrap(),
        OpenOptions::default(),
    )
    .await
    .unwrap();
    let lease = store
        .acquire_lease("seed", Duration::from_secs(30))
        .await
        .unwrap();
    let w = Writer::Leader(lease.token.clone());
    for append in appends {
        store.append(&w, &append).await.unwrap();
    }
    store.release_lease(&lease.token).await.unwrap();
    (address, scratch, store)
}

async fn all(store: &AnyStore) -> Vec<RecordedEvent> {
    store.read_all_raw(0, 10_000).await.unwrap()
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Postgres).await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Sqlite).await } )* }
    };
}

both_backends!(
    migrate_is_idempotent_and_stats_count_by_type,
    export_then_import_reproduces_the_log,
    tail_show_and_lease_show_print_tables_and_json,
    tail_follow_prints_what_another_process_appends,
    a_subscriber_sees_another_process_append,
    verify_exits_1_and_names_a_tampered_position,
    a_bad_import_is_refused_whole,
    history_commands_replay_log_and_diff_an_imported_incident,
);

async fn migrate_is_idempotent_and_stats_count_by_type(b: Backend) {
    let (address, _scratch, _store) = seeded(b, 6).await;
    // Quietly: PostgreSQL's "already exists, skipping" notices for the
    // schema's IF NOT EXISTS stay on the server, not in every start's log.
    let again = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env("RUST_LOG", "info")
        .args(["--store", &address, "store", "migrate"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("schema is up to date"),
        "{said}"
    );
    assert!(!said.contains("already exists"), "{said}");
    let stats = &json_lines(&ok(&address, &["events", "stats", "--json"]))[0];
    assert_eq!(
        (
            stats["count"].as_u64(),
            stats["head"].as_u64(),
            stats["streams"].as_u64()
        ),
        (Some(6), Some(6), Some(2))
    );
    assert_eq!(
        stats["by_type"],
        json!([["ModelAdded", 4], ["NodeRegistered", 2]])
    );
    let table = ok(&address, &["events", "stats"]);
    assert!(
        table.contains("events   6") && table.contains("ModelAdded"),
        "{table}"
    );
}

async fn export_then_import_reproduces_the_log(b: Backend) {
    let (source, _s1, store) = seeded(b, 12).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("export.jsonl");
    ok(
        &source,
        &["events", "export", "--output", file.to_str().unwrap()],
    );
    let exported = std::fs::read_to_string(&file).unwrap();
    assert_eq!(exported.lines().count(), 13, "12 events and the trailer");
    // A range, to standard output.
    let middle = json_lines(&ok(
        &source,
        &["events", "export", "--from", "4", "--to", "6"],
    ));
    assert_eq!(
        middle
            .iter()
            .map(|e| e.get("position").and_then(Value::as_u64))
            .collect::<Vec<_>>(),
        vec![Some(4), Some(5), Some(6), None]
    );
    assert_eq!(middle[3]["trailer"]["to"], 6);

    // Into a fresh store of the other backend as well as the same one.
    for target_backend in [
        b,
        if b == Backend::Sqlite {
            Backend::Postgres
        } else {
            Backend::Sqlite
        },
    ] {
        let (target, _s2) = Scratch::new(target_backend).await;
        ok(&target, &["store", "migrate"]);
        let said = ok(&target, &["events", "import", file.to_str().unwrap()]);
        assert!(
            said.contains("imported 12 events at positions 1..=12"),
            "{said}"
        );
        let again = ok(&target, &["events", "import", file.to_str().unwrap()]);
        assert!(
            again.contains("all 12 events were already present"),
            "{again}"
        );

        let copy = AnyStore::open(
            &StoreAddress::parse(&target).unwrap(),
            OpenOptions::default(),
        )
        .await
        .unwrap();
        let key = |e: &RecordedEvent| {
            (
                e.position,
                e.stream_id.clone(),
                e.stream_version,
                e.event_id,
                e.event_type.clone(),
                e.payload.clone(),
                e.metadata.clone(),
            )
        };
        assert_eq!(
            all(&copy).await.iter().map(key).collect::<Vec<_>>(),
            all(&store).await.iter().map(key).collect::<Vec<_>>()
        );
        assert!(ok(&target, &["events", "verify"]).starts_with("ok: 12 events"));
    }
}

async fn tail_show_and_lease_show_print_tables_and_json(b: Backend) {
    let (address, _scratch, store) = seeded(b, 30).await;
    let table = ok(&address, &["events", "tail"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("POSITION"), "{table}");
    assert_eq!(lines.len(), 21, "header plus the last 20 events");
    assert!(
        lines[1].starts_with("11 ") && lines[20].starts_with("30 "),
        "{table}"
    );
    let from = json_lines(&ok(&address, &["events", "tail", "--from", "28", "--json"]));
    assert_eq!(
        from.iter()
            .map(|e| e["position"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![28, 29, 30]
    );

    let shown = &json_lines(&ok(&address, &["events", "show", "7", "--json"]))[0];
    let stored = store.event_at(7).await.unwrap().unwrap();
    assert_eq!(shown["event_id"], json!(stored.event_id));
    assert_eq!(shown["hash"].as_str().map(str::len), Some(64));
    let text = ok(&address, &["events", "show", "7"]);
    assert!(
        text.contains("NodeRegistered (schema v1)") && text.contains("\"gib\": 44.99"),
        "{text}"
    );
    let missing = llmgw(&address, &["events", "show", "99"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&missing.stderr)
            .contains("no event at position 99 (the log's head is 30)")
    );

    let lease = &json_lines(&ok(&address, &["lease", "show", "--json"]))[0];
    assert_eq!(
        (
            lease["holder"].as_str(),
            lease["epoch"].as_u64(),
            lease["held"].as_bool()
        ),
        (Some("seed"), Some(1), Some(false))
    );
    let held = store
        .acquire_lease("ctl-a", Duration::from_secs(60))
        .await
        .unwrap();
    let table = ok(&address, &["lease", "show"]);
    assert!(
        table.contains("ctl-a") && table.contains(" 2 ") && table.contains("held"),
        "{table}"
    );
    store.release_lease(&held.token).await.unwrap();
}

async fn tail_follow_prints_what_another_process_appends(b: Backend) {
    let (address, _scratch, store) = seeded(b, 2).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args([
            "--store", &address, "events", "tail", "--follow", "--json", "--from", "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let recv = || {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("tail printed a line");
        serde_json::from_str::<Value>(&line).unwrap()["position"]
            .as_u64()
            .unwrap()
    };
    assert_eq!((recv(), recv()), (1, 2));
    let lease = store
        .acquire_lease("ctl", Duration::from_secs(30))
        .await
        .unwrap();
    let w = Writer::Leader(lease.token);
    store
        .append(
            &w,
            &[StreamAppend::new(
                "node-z",
                ExpectedVersion::NoStream,
                vec![NewEvent::new("NodeRegistered", 1, json!({}))],
            )],
        )
        .await
        .unwrap();
    assert_eq!(recv(), 3);
    child.kill().unwrap();
    child.wait().unwrap();
}

async fn a_subscriber_sees_another_process_append(b: Backend) {
    let (address, _scratch, store) = seeded(b, 0).await;
    let (_other, _s2, source) = seeded(b, 4).await;
    let mut sub = store.subscribe(0);
    assert!(sub.next_now().await.unwrap().is_none());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("e.jsonl");
    let lines: Vec<String> = all(&source)
        .await
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    // Another process appends; this one's subscription must see it.
    ok(&address, &["events", "import", file.to_str().unwrap()]);
    for want in 1..=4 {
        let e = tokio::time::timeout(Duration::from_secs(20), sub.next())
            .await
            .expect("in time")
            .unwrap();
        assert_eq!(e.position, want);
    }
}

async fn verify_exits_1_and_names_a_tampered_position(b: Backend) {
    let (address, _scratch, store) = seeded(b, 5).await;
    assert_eq!(
        ok(&address, &["events", "verify"]).trim(),
        "ok: 5 events in 1..=5 verified"
    );
    let whole = &json_lines(&ok(&address, &["events", "verify", "--json"]))[0];
    assert_eq!(whole["ok"], json!(true), "{whole}");
    let sql = match b {
        Backend::Postgres => {
            "ALTER TABLE es_events DISABLE TRIGGER es_events_immutable;
             UPDATE es_events SET payload = '{\"i\": 99}' WHERE position = 2;
             ALTER TABLE es_events ENABLE TRIGGER es_events_immutable;"
        }
        Backend::Sqlite => {
            "DROP TRIGGER es_events_no_update; UPDATE es_events SET payload = '{\"i\":99}' WHERE position = 2;"
        }
    };
    match &store {
        AnyStore::Postgres(s) => sqlx::raw_sql(sql).execute(s.pool()).await.map(|_| ()),
        AnyStore::Sqlite(s) => sqlx::raw_sql(sql).execute(s.pool()).await.map(|_| ()),
    }
    .unwrap();
    let out = llmgw(&address, &["events", "verify"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("TAMPERED: position 2"),
        "{out:?}"
    );
    let report = &json_lines(&String::from_utf8_lossy(
        &llmgw(&address, &["events", "verify", "--json"]).stdout,
    ))[0];
    assert_eq!(report["first_mismatch"], json!(2));
    assert_eq!(
        (&report["ok"], &report["problem"]),
        (&json!(false), &json!("position 2 does not match its hash"))
    );
    assert_eq!(
        ok(&address, &["events", "verify", "--from", "3"]).trim(),
        "ok: 3 events in 3..=5 verified"
    );
    // Nor is it exported or copied as if whole (the file was then blamed).
    let dir = tempfile::tempdir().unwrap();
    let out = llmgw(&address, &["events", "export"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the store's chain breaks at position 2"),
        "{err}"
    );
    let copy = format!("sqlite://{}", dir.path().join("copy.db").display());
    let out = llmgw(&address, &["store", "copy", "--to", &copy]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("chain breaks at position 2"),
        "{err}"
    );
    assert!(
        !dir.path().join("copy.db").exists(),
        "no empty store left behind"
    );
}

async fn a_bad_import_is_refused_whole(b: Backend) {
    let (address, _scratch, _store) = seeded(b, 3).await;
    let (_src, _s2, source) = seeded(b, 4).await;
    let dir = tempfile::tempdir().unwrap();
    let mut lines: Vec<String> = all(&source)
        .await
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    lines.insert(2, "{not json".into());
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let out = llmgw(&address, &["events", "import", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 3: not an exported event"),
        "{out:?}"
    );

    // An altered line breaks the chain: refused before anything is written.
    lines.remove(2);
    let mut altered: Vec<String> = lines.clone();
    altered[1] = altered[1].replace("\"gib\":44.99", "\"gib\":45.0");
    assert_ne!(altered[1], lines[1]);
    let forged = dir.path().join("forged.jsonl");
    std::fs::write(&forged, altered.join("\n")).unwrap();
    let out = llmgw(&address, &["events", "import", forged.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("line 2 (position 2): its hash does not match"),
        "{out:?}"
    );
    let gap = dir.path().join("gap.jsonl");
    std::fs::write(&gap, [lines[0].clone(), lines[2].clone()].join("\n")).unwrap();
    let out = llmgw(&address, &["events", "import", gap.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("position 3 follows 1"),
        "{out:?}"
    );

    // Another log's events where this store has its own: refused, named.
    let clash = dir.path().join("clash.jsonl");
    std::fs::write(&clash, lines.join("\n")).unwrap();
    let out = llmgw(&address, &["events", "import", clash.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("position 3: the file's event differs from this store's"),
        "{out:?}"
    );
    assert_eq!(
        json_lines(&ok(&address, &["events", "stats", "--json"]))[0]["count"],
        json!(3)
    );
}

#[test]
fn bad_addresses_fail_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.db");
    let cases = [
        ("mysql://db/x", "unknown scheme"),
        (
            "postgres://postgres@127.0.0.1:1/x",
            "cannot open the store at postgres://postgres@127.0.0.1:1/x",
        ),
        ("@/nonexistent/dsn", "cannot read /nonexistent/dsn"),
        ("sqlite://x.db?mode=ro", "takes no options"),
        (missing.to_str().unwrap(), "there is no log at sqlite://"),
    ];
    for (address, says) in cases {
        let out = llmgw(address, &["events", "stats"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{address}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(says),
            "{address}: {stderr}"
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(!stderr.contains("panicked"));
    }
    assert!(!missing.exists(), "a read command must not create a store");
}

/// Reading a log changes nothing in it: a copy in SQLite's rollback
/// journal mode (a backup, another tool's) kept its bytes only until the
/// first read switched it to WAL. And the commands that only use a log
/// refuse a file that is not one, where they made it one.
#[tokio::test]
async fn reading_commands_leave_a_store_as_it_was_and_keys_make_none() {
    let (address, scratch, store) = seeded(Backend::Sqlite, 5).await;
    let (AnyStore::Sqlite(s), Scratch::Sqlite(dir)) = (&store, &scratch) else {
        unreachable!("a SQLite scratch")
    };
    // Leaving WAL wants the file to itself.
    s.read_pool().close().await;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode=DELETE")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(mode, "delete");
    s.pool().close().await;
    let path = std::path::PathBuf::from(&address);
    let bytes = || std::fs::read(&path).unwrap();
    let before = bytes();
    let out = dir.path().join("out.jsonl");
    for args in [
        &["events", "tail"][..],
        &["events", "verify"],
        &["events", "stats"],
        &["events", "show", "3"],
        &["events", "export", "-o", out.to_str().unwrap()],
        &["events", "replay", "--until", "5", "--view", "router"],
        &["lease", "show"],
        &["keys", "list", "--offline"],
        &["users", "list", "--offline"],
    ] {
        ok(&address, args);
        assert!(bytes() == before, "{args:?} changed the file");
        let wal = format!("{}-wal", path.display());
        assert!(!std::path::Path::new(&wal).exists(), "{args:?} left {wal}");
    }

    // A typo in --store: no log is made to answer from.
    let typo = dir.path().join("typo.db");
    let typo_address = typo.to_str().unwrap();
    for args in [
        &["keys", "list", "--offline"][..],
        &["users", "list", "--offline"],
    ] {
        let out = llmgw(typo_address, args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(said.contains("there is no log at sqlite://"), "{said}");
        assert!(said.contains("`llmgw keys init`"), "{said}");
    }
    assert!(!typo.exists(), "a command that only uses a log made one");
    // Another program's database gets no llmgw tables.
    let foreign = dir.path().join("shop.db");
    let shop = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", foreign.display()))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE customers (name TEXT)")
        .execute(&shop)
        .await
        .unwrap();
    shop.close().await;
    let before = std::fs::read(&foreign).unwrap();
    let out = llmgw(foreign.to_str().unwrap(), &["keys", "list", "--offline"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("holds no llmgw log"), "{said}");
    assert!(
        std::fs::read(&foreign).unwrap() == before,
        "tables were added"
    );
}

#[test]
fn the_store_address_comes_from_the_environment_or_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("env.db");
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env("LLMGW_STORE", &db)
        .args(["store", "migrate"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let dsn = dir.path().join("dsn");
    std::fs::write(&dsn, format!("sqlite://{}\n", db.display())).unwrap();
    let stats = ok(
        &format!("@{}", dsn.display()),
        &["events", "stats", "--json"],
    );
    assert_eq!(json_lines(&stats)[0]["count"], json!(0));
    let version = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("llmgw "));
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../replay-tests/fixtures")
        .join(format!("{name}.jsonl"))
}

async fn history_commands_replay_log_and_diff_an_imported_incident(b: Backend) {
    let (address, _scratch) = Scratch::new(b).await;
    ok(&address, &["store", "migrate"]);
    let file = fixture("key-revoked-in-use");
    ok(&address, &["events", "import", file.to_str().unwrap()]);
    let events: Vec<Value> = json_lines(&std::fs::read_to_string(&file).unwrap());
    let revoked_at = events
        .iter()
        .find(|e| e["event_type"] == "KeyRevoked")
        .unwrap();
    let before = (revoked_at["position"].as_u64().unwrap() - 1).to_string();
    let hash = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";

    let then = &json_lines(&ok(
        &address,
        &[
            "events", "replay", "--until", &before, "--view", "tenancy", "--json",
        ],
    ))[0];
    assert_eq!(then[hash]["key_id"], json!("k"));
    let head = events.len().to_string();
    let now = &json_lines(&ok(
        &address,
        &[
            "events", "replay", "--until", &head, "--view", "tenancy", "--json",
        ],
    ))[0];
    assert!(now.get(hash).is_none(), "revoked by the head");
    // A time works as well as a position.
    let first = &json_lines(&ok(&address, &["events", "show", "1", "--json"]))[0];
    let t0 = first["recorded_at"].as_str().unwrap();
    let table = ok(
        &address,
        &["events", "replay", "--until", t0, "--view", "router"],
    );
    let at = table.lines().next().unwrap();
    assert!(
        at.starts_with("router view at position ") && !at.ends_with(&format!(" {head}")),
        "{table}"
    );
    // As people write it: a space, no zone (UTC).
    let plain = t0
        .replacen('T', " ", 1)
        .trim_end_matches('Z')
        .trim_end_matches("+00:00")
        .to_owned();
    let same = ok(
        &address,
        &["events", "replay", "--until", &plain, "--view", "router"],
    );
    assert_eq!(same, table, "{plain}");
    let usage = ok(
        &address,
        &["events", "replay", "--until", &head, "--view", "usage"],
    );
    assert!(
        usage
            .lines()
            .any(|l| l.starts_with("llama-8b") && l.contains(" 4 ")),
        "{usage}"
    );

    let timeline = ok(&address, &["events", "log", "--key", "k"]);
    let rows: Vec<&str> = timeline.lines().collect();
    assert!(rows[0].starts_with("WHEN") && rows.len() == 4, "{timeline}");
    assert!(
        rows[1].contains("KeyIssued")
            && rows[3].contains("KeyRevoked")
            && rows[3].contains("ops@acme"),
        "{timeline}"
    );
    let missing = llmgw(&address, &["events", "log", "--node", "ghost"]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no events in stream node-ghost"));
    // Nothing named is a usage error (2), as clap's are.
    let unnamed = llmgw(&address, &["events", "log"]);
    assert_eq!(
        unnamed.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&unnamed.stderr)
    );

    let diff = ok(
        &address,
        &[
            "events", "diff", "--from", &before, "--to", &head, "--view", "tenancy",
        ],
    );
    assert!(
        diff.contains("1 change(s)") && diff.contains(&format!("- /{hash} = ")),
        "{diff}"
    );
    let changes = json_lines(&ok(
        &address,
        &[
            "events", "diff", "--from", "1", "--to", &head, "--view", "usage", "--json",
        ],
    ));
    assert!(
        changes.iter().any(|c| c["path"] == "/models/llama-8b"),
        "{changes:?}"
    );

    for (args, says) in [
        (
            vec![
                "events",
                "replay",
                "--until",
                "yesterday",
                "--view",
                "router",
            ],
            "neither a position nor a time",
        ),
        (
            vec!["events", "replay", "--until", "3", "--view", "routers"],
            "unknown view \"routers\"; the views are router, cluster, tenancy, usage",
        ),
        (vec!["events", "show", "0"], "positions start at 1"),
        (
            vec!["events", "tail", "--from", "0"],
            "positions start at 1",
        ),
    ] {
        // Each a usage error: exit 2, as clap's own.
        let out = llmgw(&address, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{:?}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // A time as the tables print it (to the millisecond) covers the event
    // printed beside it, though the log holds it to the microsecond.
    assert!(t0.len() > "2026-12-02T10:39:48.305Z".len(), "{t0}");
    let tail = ok(&address, &["events", "tail", "--from", "1"]);
    let printed = tail
        .lines()
        .find_map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            (cells.first() == Some(&"1")).then(|| cells[1].to_owned())
        })
        .unwrap_or_else(|| panic!("position 1 in {tail}"));
    let at = ok(
        &address,
        &["events", "replay", "--until", &printed, "--view", "router"],
    );
    assert!(
        at.starts_with("router view at position ") && !at.starts_with("router view at position 0"),
        "{printed}: {at}"
    );
    // A date as both ends is that whole day.
    let day = &t0[..10];
    let changes = ok(
        &address,
        &[
            "events", "diff", "--from", day, "--to", day, "--view", "usage",
        ],
    );
    assert!(
        changes.contains(&format!("from position 0 to {}", events.len())),
        "{changes}"
    );

    // A range that is not one is refused (exit 2), naming the log's head.
    let past = (events.len() + 5).to_string();
    for (args, says) in [
        (
            vec!["events", "replay", "--until", &past, "--view", "router"],
            "past the log's head",
        ),
        (
            vec![
                "events", "diff", "--from", "5", "--to", "2", "--view", "router",
            ],
            "comes after --to",
        ),
        (
            vec!["events", "verify", "--from", "5", "--to", "2"],
            "comes after --to",
        ),
        (
            vec!["events", "verify", "--to", &past],
            "past the log's head",
        ),
        (
            vec!["events", "export", "--from", "5", "--to", "2"],
            "comes after --to",
        ),
        // A start past the head passed (verify) or wrote an empty file
        // (export); the position just after it is where the next event
        // goes, an empty export of what is new.
        (vec!["events", "verify", "--from", &past], "--from"),
        (
            vec!["events", "export", "--from", &past],
            "past the log's head",
        ),
    ] {
        let out = llmgw(&address, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let next = (events.len() + 1).to_string();
    let nothing_new = ok(&address, &["events", "export", "--from", &next]);
    assert!(nothing_new.contains("\"events\":0"), "{nothing_new}");
    // An export to a file replaces it only once whole: a refused one
    // leaves it as it was (it was emptied before anything was checked).
    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("earlier.jsonl");
    std::fs::write(&kept, "an earlier export\n").unwrap();
    let kept_arg = kept.to_str().unwrap();
    let refused = llmgw(
        &address,
        &["events", "export", "--to", &past, "-o", kept_arg],
    );
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert_eq!(
        std::fs::read_to_string(&kept).unwrap(),
        "an earlier export\n"
    );
    ok(&address, &["events", "export", "--to", "3", "-o", kept_arg]);
    let written = json_lines(&std::fs::read_to_string(&kept).unwrap());
    assert_eq!(written.len(), 4, "three events and the trailer");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "nothing left beside it"
    );
    // It keeps the mode it had; a new export is its owner's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o640)).unwrap();
    ok(&address, &["events", "export", "--to", "2", "-o", kept_arg]);
    assert_eq!(mode(&kept), 0o640);
    let fresh = dir.path().join("fresh.jsonl");
    ok(
        &address,
        &["events", "export", "-o", fresh.to_str().unwrap()],
    );
    assert_eq!(mode(&fresh), 0o600);
    // A link is written through, not replaced.
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(&kept, &link).unwrap();
    ok(
        &address,
        &[
            "events",
            "export",
            "--to",
            "1",
            "-o",
            link.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        json_lines(&std::fs::read_to_string(&kept).unwrap()).len(),
        2
    );
}

/// A view replayed or diffed from a log a newer build wrote says what it
/// left out (how many events, of which kinds), and the log says so once
/// per kind rather than once an event.
#[tokio::test]
async fn replay_and_diff_say_which_events_they_could_not_read() {
    use llmgw_eventstore::{ExpectedVersion, NewEvent, StreamAppend};
    let future = || NewEvent::new("FromTheFuture", 3, json!({"x": 1}));
    let (store, _scratch, _log) = store_with(
        Backend::Sqlite,
        [vec![StreamAppend::new(
            "later",
            ExpectedVersion::Any,
            vec![future(), future(), future()],
        )]],
    )
    .await;
    let says = "3 event(s) this build cannot read were skipped: FromTheFuture v3";
    let replay = llmgw(
        &store,
        &["events", "replay", "--until", "3", "--view", "router"],
    );
    assert!(
        String::from_utf8_lossy(&replay.stdout).contains(says),
        "{replay:?}"
    );
    let logged = String::from_utf8_lossy(&replay.stderr);
    assert_eq!(logged.matches("skipping").count(), 1, "{logged}");
    let diff = ok(
        &store,
        &[
            "events", "diff", "--from", "0", "--to", "3", "--view", "router",
        ],
    );
    assert!(diff.contains(says), "{diff}");
}

/// An authority in `dir`, and one certificate from it, as `llmgw ctl cert`
/// makes them: `issue` is its subcommand and arguments (`issue-server
/// NAME --host H`, `issue-client NODE`).
pub(crate) fn authority_and(dir: &str, issue: &[&str]) {
    let with_dir = [issue, &["--dir", dir]].concat();
    for args in [&["init-ca", "--dir", dir][..], &with_dir[..]] {
        let made = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["ctl", "cert"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            made.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&made.stderr)
        );
    }
}

/// A child process whose output lines arrive on channels.
struct Child {
    process: std::process::Child,
    stdout: std::sync::mpsc::Receiver<String>,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl Child {
    fn spawn(args: &[&str]) -> Child {
        Child::spawn_env(args, &[])
    }

    fn spawn_env(args: &[&str], env: &[(&str, String)]) -> Child {
        let mut command = Command::new(env!("CARGO_BIN_EXE_llmgw"));
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        Child::spawn_command(command)
    }

    /// `command` (llmgw, or a program that runs it) at info, its output
    /// read line by line.
    fn spawn_command(mut command: Command) -> Child {
        let mut process = command
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = |r: Box<dyn std::io::Read + Send>| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(r).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            rx
        };
        let stdout = lines(Box::new(process.stdout.take().unwrap()));
        let stderr = lines(Box::new(process.stderr.take().unwrap()));
        Child {
            process,
            stdout,
            stderr,
        }
    }

    /// Waits for a line on `stream` containing `needle`; returns it.
    fn expect(rx: &std::sync::mpsc::Receiver<String>, needle: &str) -> String {
        Child::expect_or(rx, needle, String::new)
    }

    /// As [`Child::expect`], saying `why()` when no such line comes (the
    /// process's own account of a start that failed).
    fn expect_or(
        rx: &std::sync::mpsc::Receiver<String>,
        needle: &str,
        why: impl Fn() -> String,
    ) -> String {
        loop {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(e) => panic!("no line with {needle:?} ({e:?}){}", why()),
            }
        }
    }

    /// SIGTERM, as systemd stops a unit: a clean stop.
    fn terminate(&self) {
        let pid = self.process.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
    }

    /// What follows `prefix` on the next stdout line that has it (the
    /// line's message, for a process logging JSON).
    fn addr_after(&self, prefix: &str) -> String {
        // A start that failed (a port taken meanwhile, say) says why on
        // stderr: shown, not only that the line never came.
        let said = || {
            let lines: Vec<String> = self.stderr.try_iter().collect();
            format!("; its stderr:\n{}", lines.join("\n"))
        };
        let line = Child::expect_or(&self.stdout, prefix, said);
        serde_json::from_str::<Value>(&line)
            .ok()
            .and_then(|v| v["fields"]["message"].as_str().map(str::to_owned))
            .unwrap_or(line)
            .trim_start_matches(prefix)
            .trim()
            .to_owned()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A client listener off loopback says at start what it offers there:
/// every model without a key, or keys and passwords over plain HTTP.
#[test]
fn a_client_listener_off_loopback_says_what_it_exposes() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("s.db").display());
    for (auth, says) in [
        ("false", "auth is off: anyone who reaches this listener"),
        ("true", "no client_tls: API keys, passwords and sessions"),
    ] {
        let server = Child::spawn(&[
            "--store",
            &store,
            "server",
            "--endpoint",
            "e=http://127.0.0.1:1=m",
            "--listen",
            "0.0.0.0:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--auth",
            auth,
        ]);
        Child::expect(&server.stderr, says);
    }
}

#[tokio::test]
async fn sim_engine_answers_openai_clients_over_a_socket() {
    let engine = tiny_engine();
    let base = format!("http://{}", engine.addr_after("listening on "));
    let client = reqwest::Client::new();
    let body = json!({"model": "tiny", "stream": true, "max_tokens": 5, "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "hello"}]});
    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.len(), 1 + 5 + 1 + 1 + 1, "{text}");
    assert_eq!(*data.last().unwrap(), "[DONE]");
    let usage: Value = serde_json::from_str(data[data.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 5);

    let plain: Value = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(plain["choices"][0]["message"]["content"], "fox was ");
    let missing = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "big", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let metrics = page(format!("{base}/metrics")).await;
    assert!(
        metrics.contains("vllm:num_requests_running{model_name=\"tiny\"} 0"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_multi_node_sim_engine_serves_only_once_every_worker_has_joined() {
    let rank0 = Child::spawn(&[
        "sim-engine",
        "--listen",
        "127.0.0.1:0",
        "--model",
        "big",
        "--nnodes",
        "3",
        "--node-rank",
        "0",
        "--dist-init-addr",
        "127.0.0.1:0",
    ]);
    let rendezvous = rank0.addr_after("rendezvous on ");
    let worker = |rank: &str| {
        Child::spawn(&[
            "sim-engine",
            "--listen",
            "127.0.0.1:0",
            "--model",
            "big",
            "--nnodes",
            "3",
            "--node-rank",
            rank,
            "--dist-init-addr",
            &rendezvous,
        ])
    };
    let w1 = worker("1");
    Child::expect(&rank0.stderr, "worker joined");
    // One of two workers in: rank 0 has not started serving.
    assert!(
        rank0.stdout.try_recv().is_err(),
        "rank 0 must not serve before every worker has joined"
    );
    let w2 = worker("2");
    let base = format!("http://{}", rank0.addr_after("listening on "));
    let health = reqwest::get(format!("{base}/health")).await.unwrap();
    assert_eq!(health.status(), 200);
    // Workers serve nothing and go when rank 0 goes.
    assert!(w1.stdout.try_recv().is_err() && w2.stdout.try_recv().is_err());
    drop(rank0);
    for mut w in [w1, w2] {
        let status = w.process.wait().unwrap();
        assert!(!status.success());
        Child::expect(&w.stderr, "rank 0 closed the rendezvous");
    }
}

#[tokio::test]
async fn the_server_routes_to_static_endpoints_and_refuses_to_start_with_none() {
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["server"])
        .env_remove("LLMGW_ENDPOINTS")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "a setting that cannot serve is a configuration error"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to serve"));
    let bad = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["server", "--endpoint", "a=localhost:1=m"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("the URL must start with http://"));

    let engine = tiny_engine();
    let engine_addr = engine.addr_after("listening on ");
    let endpoint = format!("e1=http://{engine_addr}=tiny");
    let server = Child::spawn(&[
        "server",
        "--endpoint",
        &endpoint,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let base = format!("http://{}", server.addr_after("client listening on "));
    let admin = format!("http://{}", server.addr_after("admin listening on "));
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (
            r.status().as_u16(),
            r.headers()["x-llmgw-served-model"].to_str().unwrap()
        ),
        (200, "tiny")
    );
    let reply: Value = r.json().await.unwrap();
    assert_eq!(reply["choices"][0]["message"]["content"], "fox was sun ");
    let metrics = page(format!("{admin}/metrics")).await;
    assert!(
        metrics.contains("llmgw_requests_total{model=\"tiny\",status=\"200\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_server_records_usage_in_the_event_log_and_flushes_it_on_stop() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("log.db");
    let store = store.to_str().unwrap();
    let engine = tiny_engine();
    let endpoint = format!("e1=http://{}=tiny", engine.addr_after("listening on "));
    let mut server = Child::spawn(&[
        "--store",
        store,
        "server",
        "--record-usage",
        "--endpoint",
        &endpoint,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let base = format!("http://{}", server.addr_after("client listening on "));
    let client = reqwest::Client::new();
    for stream in [false, true] {
        let body = json!({"model": "tiny", "stream": stream, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]});
        client
            .post(format!("{base}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
    }
    // A clean stop (SIGTERM) flushes what the batcher still holds.
    server.terminate();
    assert!(server.process.wait().unwrap().success());
    let stats = &json_lines(&ok(store, &["events", "stats", "--json"]))[0];
    // One batch per flush: the two requests, in one or two of them.
    let by_type = stats["by_type"].as_array().unwrap();
    assert!(
        by_type.len() == 1 && by_type[0][0] == "UsageBatchRecorded",
        "{stats}"
    );
    let events = json_lines(&ok(store, &["events", "tail", "--json"]));
    assert!(events.iter().all(|e| {
        e["metadata"]["writer"]
            .as_str()
            .is_some_and(|w| w.starts_with("gateway-"))
    }));
    let rows = usage_rows_of(&events);
    assert_eq!(rows.len(), 2, "{events:?}");
    assert!(rows.iter().all(|u| u["completion_tokens"] == 3), "{rows:?}");
    // People read a batch as one line with its row count and totals.
    let table = ok(store, &["events", "tail"]);
    assert!(
        table.contains("UsageBatchRecorded v2") && table.contains(" rows, "),
        "{table}"
    );
    // `events show` lists a batch's requests, one a line, not its columns.
    let batch = events
        .iter()
        .find(|e| e["event_type"] == "UsageBatchRecorded")
        .unwrap();
    let shown = ok(store, &["events", "show", &batch["position"].to_string()]);
    let first = &usage_rows_of(std::slice::from_ref(batch))[0];
    let line = shown
        .lines()
        .find(|l| l.starts_with(first["request_id"].as_str().unwrap()))
        .unwrap_or_else(|| panic!("{shown}"));
    let tokens = format!("{}+3", first["prompt_tokens"]);
    assert!(line.contains(&tokens) && line.contains("200"), "{shown}");
    assert!(!shown.contains("\"names\""), "{shown}");

    // `events usage` adds the rows up: by model by default with the
    // project; as CSV per model and day; a window that holds none.
    let sum = |args: &[&str]| {
        let mut all = vec!["events", "usage"];
        all.extend_from_slice(args);
        ok(store, &all)
    };
    let prompt: u64 = rows
        .iter()
        .map(|u| u["prompt_tokens"].as_u64().unwrap())
        .sum();
    let table = sum(&[]);
    let line = table
        .lines()
        .find(|l| l.contains("tiny"))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[2..6], ["2", "0", &prompt.to_string(), "6"], "{table}");
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let csv = sum(&["--by", "model,day", "--csv"]);
    assert_eq!(
        csv.lines().collect::<Vec<_>>(),
        [
            "model,day,requests,errors,prompt_tokens,completion_tokens,cost_micros,cost_usd",
            &format!(
                "tiny,{today},2,0,{prompt},6,{},{}",
                rows_cost(&rows),
                usd(rows_cost(&rows))
            ),
        ],
        "{csv}"
    );
    let json = json_lines(&sum(&[
        "--by", "key", "--json", "--since", "24h", "--until", &today,
    ]));
    assert_eq!(json.len(), 1, "{json:?}");
    assert_eq!(
        (
            json[0]["requests"].as_u64(),
            json[0]["completion_tokens"].as_u64()
        ),
        (Some(2), Some(6))
    );
    let tomorrow = (chrono::Utc::now() + chrono::Duration::days(1))
        .format("%Y-%m-%d")
        .to_string();
    assert_eq!(
        sum(&["--since", &tomorrow, "--json"]),
        "",
        "nothing after today"
    );
    let bad = llmgw(store, &["events", "usage", "--by", "team"]);
    assert_eq!(bad.status.code(), Some(2), "a usage error");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("possible values: key, project, model, day")
    );

    // Batches travel like any event: exported, imported into PostgreSQL,
    // and the copy's chain verifies and holds the same rows.
    let file = dir.path().join("export.jsonl");
    std::fs::write(&file, ok(store, &["events", "export"])).unwrap();
    let (copy, _scratch) = Scratch::new(Backend::Postgres).await;
    ok(&copy, &["store", "migrate"]);
    ok(&copy, &["events", "import", file.to_str().unwrap()]);
    ok(&copy, &["events", "verify"]);
    let copied = json_lines(&ok(&copy, &["events", "tail", "--json"]));
    assert_eq!(usage_rows_of(&copied), rows);
}

fn rows_cost(rows: &[Value]) -> u64 {
    rows.iter()
        .map(|u| u["cost_micros"].as_u64().unwrap())
        .sum()
}

fn usd(micros: u64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// `store copy` says what it copied, from where to where; it named the
/// export file it went through, removed by the time anyone read it.
#[tokio::test]
async fn store_copy_says_what_it_copied_and_names_no_temporary_file() {
    let (from, _scratch, _log) = seeded(Backend::Sqlite, 3).await;
    let dir = tempfile::tempdir().unwrap();
    let to = format!("sqlite://{}", dir.path().join("copy.db").display());
    let out = llmgw(&from, &["store", "copy", "--to", &to]);
    let (said, told) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{told}");
    let line = said.lines().next().unwrap_or_default();
    assert!(
        line.starts_with("copied 3 events from sqlite://") && line.contains(&format!(" to {to} ")),
        "{said}"
    );
    for temporary in ["llmgw-copy-", "log.jsonl", "exported"] {
        assert!(
            !said.contains(temporary) && !told.contains(temporary),
            "{said}{told}"
        );
    }
    ok(&to, &["events", "verify"]);
}

/// `events usage --since` takes minutes and seconds back from now as it
/// takes hours and days ("10m" was not a time); what is none is refused
/// with the forms it takes.
#[tokio::test]
async fn usage_since_takes_minutes_and_seconds_back() {
    let (store, _scratch, _log) = seeded(Backend::Sqlite, 1).await;
    for span in ["10m", "90s", "1h"] {
        let said = ok(&store, &["events", "usage", "--since", span, "--json"]);
        assert_eq!(said, "", "no usage in the last {span}");
    }
    let bad = llmgw(&store, &["events", "usage", "--since", "10x"]);
    assert_eq!(bad.status.code(), Some(2), "a usage error");
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        said.contains("a span back from now (30s, 10m, 24h, 7d)"),
        "{said}"
    );
}

/// With the control plane too: a clean stop appends the usage still
/// queued (its sender is held by more than the gateway there, and the
/// batcher waited for them all to go: the stop took 5 s and lost it).
#[tokio::test]
async fn a_control_plane_server_flushes_queued_usage_on_stop() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("log.db");
    let store = store.to_str().unwrap();
    let config = dir.path().join("server.yaml");
    std::fs::write(
        &config,
        "control: {enabled: true}\nagent_listen: \"127.0.0.1:0\"\nauth: {flush_interval: 1h}\n",
    )
    .unwrap();
    let engine = tiny_engine();
    let endpoint = format!("e1=http://{}=tiny", engine.addr_after("listening on "));
    let mut server = Child::spawn(&[
        "--store",
        store,
        "server",
        "--config",
        config.to_str().unwrap(),
        "--record-usage",
        "--endpoint",
        &endpoint,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let base = format!("http://{}", server.addr_after("client listening on "));
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let r = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&json!({"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    server.terminate();
    assert!(server.process.wait().unwrap().success());
    // The database file alone holds it all after a clean stop (copied
    // without its write-ahead log, the newest events were missing and
    // `events verify` still said ok).
    let copy = dir.path().join("copy.db");
    std::fs::copy(store, &copy).unwrap();
    let events = json_lines(&ok(
        copy.to_str().unwrap(),
        &[
            "events",
            "tail",
            "--type",
            "UsageBatchRecorded",
            "--from",
            "1",
            "--json",
        ],
    ));
    assert_eq!(usage_rows_of(&events).len(), 3, "{events:?}");
}

/// The official OpenAI Python SDK, streaming and not, through the gateway.
/// `scripts/test` installs the SDK; without it this fails and says how.
#[tokio::test]
async fn the_official_openai_sdk_works_through_the_gateway() {
    let probe = Command::new("python3")
        .args(["-c", "import openai"])
        .output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "the OpenAI Python SDK is needed: python3 -m pip install openai==3.57.0 (scripts/test does this)"
    );
    let engine = tiny_engine();
    let endpoint = format!("e1=http://{}=tiny", engine.addr_after("listening on "));
    let server = Child::spawn(&[
        "server",
        "--endpoint",
        &endpoint,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let base = format!("http://{}", server.addr_after("client listening on "));
    sdk_script("openai_sdk.py", vec![base, "tiny".into()]).await;
}

/// Runs `cli/tests/sdk/<script>` with `args` and asserts that it passed,
/// showing what it printed when not.
pub(crate) async fn sdk_script(script: &str, args: Vec<String>) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sdk")
        .join(script);
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn server_settings_come_from_a_config_file_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let engine = tiny_engine();
    let engine_addr = engine.addr_after("listening on ");
    let config = dir.path().join("server.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\n\
             endpoints = [\"e1=http://{engine_addr}=tiny,big;engine=vllm\"]\n[fallbacks]\nbig = [\"tiny\"]\n"
        ),
    )
    .unwrap();
    let server = Child::spawn(&["server", "--config", config.to_str().unwrap()]);
    let base = format!("http://{}", server.addr_after("client listening on "));
    let metrics = format!("http://{}", server.addr_after("metrics listening on "));
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let page = page(format!("{metrics}/metrics")).await;
    assert!(
        page.contains("llmgw_requests_total"),
        "the metrics-only port serves metrics"
    );

    // A flag wins over the file: the file's admin address cannot be bound
    // here, the flag's can.
    let unbindable = dir.path().join("unbindable.toml");
    std::fs::write(
        &unbindable,
        format!("listen = \"127.0.0.1:0\"\nadmin_listen = \"192.0.2.1:9\"\nendpoints = [\"e1=http://{engine_addr}=tiny\"]\n"),
    )
    .unwrap();
    let flagged = Child::spawn(&[
        "server",
        "--config",
        unbindable.to_str().unwrap(),
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    assert!(
        flagged
            .addr_after("admin listening on ")
            .starts_with("127.0.0.1:")
    );

    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "listen = \":8080\"\nendpoint = []\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["server", "--config", typo.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a bad configuration exits 2");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not a valid configuration") && err.contains("unknown field `endpoint`"),
        "{err}"
    );

    // A YAML file's mistake is pointed at: its key, line and column.
    let wrong = dir.path().join("wrong.yaml");
    std::fs::write(&wrong, "listen: \":8080\"\nauth:\n  enabled: maybe\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["server", "--config", wrong.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("auth.enabled: invalid type") && err.contains("at line 3 column 12"),
        "{err}"
    );
    // A number out of range names its key too (the YAML reader gives no
    // line for it, and the message named nothing).
    std::fs::write(&wrong, "router:\n  retries: -1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["server", "--check", "--config", wrong.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("router.retries: invalid value: integer `-1`"),
        "{err}"
    );
}

#[test]
fn the_example_server_configuration_parses() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/server.toml");
    // Its endpoints are unreachable from here, which does not stop a server
    // from starting: a configuration that parses gets as far as serving.
    let server = Child::spawn(&[
        "server",
        "--config",
        example.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    assert!(
        server
            .addr_after("client listening on ")
            .starts_with("127.0.0.1:")
    );
    // Keys turned on by the variable its header names: nothing in the
    // file contradicts them.
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["server", "--check", "--config", example.to_str().unwrap()])
        .env("LLMGW_AUTH", "true")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn the_server_with_auth_reads_keys_from_the_event_log() {
    use llmgw_domain::Command;
    use llmgw_domain::tenancy::{Band, Key, TenancyCommand as T};
    let (address, _scratch, store) = seeded(Backend::Sqlite, 0).await;
    let secret = "llmgw-sk-cli-test";
    let hash = llmgw_gateway::auth::key_hash(secret);
    let commands = [
        T::CreateOrg {
            org_id: "o".into(),
            name: "o".into(),
        },
        T::CreateTeam {
            team_id: "t".into(),
            org_id: "o".into(),
            name: "t".into(),
        },
        T::CreateProject {
            project_id: "p".into(),
            team_id: "t".into(),
            name: "p".into(),
        },
        T::IssueKey(Key {
            key_id: "k".into(),
            project_id: "p".into(),
            name: "k".into(),
            hash,
            prefix: "llmgw-sk".into(),
            band: Band::Gold,
            routing_profile: None,
            revoked: false,
            owner: None,
            claim_by: None,
            expires_at: None,
            previous: None,
        }),
    ];
    let origin = llmgw_decider::Origin::new(llmgw_decider::Actor::Recorder("test".into()));
    llmgw_decider::offline::execute(
        &store,
        &origin,
        commands.into_iter().map(Command::Tenancy).collect(),
    )
    .await
    .unwrap();
    let engine = tiny_engine();
    let endpoint = format!("e1=http://{}=tiny", engine.addr_after("listening on "));
    let server = Child::spawn(&[
        "--store",
        &address,
        "server",
        "--auth",
        "--endpoint",
        &endpoint,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let base = format!("http://{}", server.addr_after("client listening on "));
    let client = reqwest::Client::new();
    let body =
        json!({"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]});
    let anonymous = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    let keyed = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(secret)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(keyed.status(), 200);
}

/// A fast sim engine serving `tiny`, as a real process.
fn tiny_engine() -> Child {
    Child::spawn(&[
        "sim-engine",
        "--listen",
        "127.0.0.1:0",
        "--model",
        "tiny",
        "--ttft-ms",
        "1",
        "--tps",
        "1000",
    ])
}

#[test]
fn agent_inventory_reports_what_the_scheduler_sees() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let write = |p: &str, text: &str| {
        let path = r.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "etc/os-release",
        "ID=debian\nVERSION_ID=\"12\"\nVERSION_CODENAME=bookworm\n",
    );
    write("proc/meminfo", "MemTotal:       32876244 kB\n");
    write("proc/cpuinfo", "flags : avx avx2\n");
    for (f, v) in [
        ("state", "4: ACTIVE"),
        ("phys_state", "5: LinkUp"),
        ("rate", "200 Gb/sec (4X HDR)"),
        ("link_layer", "InfiniBand"),
    ] {
        write(&format!("sys/class/infiniband/mlx5_0/ports/1/{f}"), v);
    }
    write(
        "bin/nvidia-smi",
        "#!/bin/sh\necho '0, GPU-1, NVIDIA H100 80GB HBM3, 81559, 4, 9.0, 00000000:1B:00.0, 550.54.15, 34, 0, 12'\n",
    );
    Command::new("chmod")
        .arg("+x")
        .arg(r.join("bin/nvidia-smi"))
        .status()
        .unwrap();
    let smi = r.join("bin/nvidia-smi");
    let args = |json: bool| {
        let mut a = vec![
            "agent".to_string(),
            "inventory".into(),
            "--root".into(),
            r.display().to_string(),
            "--nvidia-smi".into(),
            smi.display().to_string(),
            "--fabric".into(),
            "ib-a=mlx5_0,mlx5_9".into(),
        ];
        if json {
            a.push("--json".into());
        }
        a
    };
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(args(true))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inv: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (inv["source"].as_str(), inv["gpus"][0]["class"].as_str()),
        (Some("nvidia-smi"), Some("h100-80g"))
    );
    assert_eq!(inv["gpus"][0]["utilization_percent"], 12);
    assert_eq!(
        (
            inv["memory_total_mb"].as_u64(),
            inv["host"]["os_codename"].as_str()
        ),
        (Some(32105), Some("bookworm"))
    );
    assert_eq!(inv["hcas"][0]["name"], "mlx5_0");
    assert_eq!(inv["fabrics"][0]["usable"], json!(["mlx5_0"]));
    assert_eq!(
        inv["fabrics"][0]["problems"],
        json!(["mlx5_9 is not on this node (found: mlx5_0)"])
    );
    let table = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(args(false))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("h100-80g") && text.contains("fabric   ib-a: ok at 200 Gb/s"),
        "{text}"
    );
    let missing = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args([
            "agent",
            "inventory",
            "--nvidia-smi",
            "/nonexistent/nvidia-smi",
        ])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("running /nonexistent/nvidia-smi"));
    // NVML is asked first; where it cannot load (no driver here) the
    // nvidia-smi on PATH answers, and the fallback is said.
    let path = format!(
        "{}:{}",
        r.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args([
            "agent",
            "inventory",
            "--json",
            "--root",
            r.to_str().unwrap(),
        ])
        .env("PATH", path)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success());
    let inv: Value = serde_json::from_slice(&out.stdout).unwrap();
    let source = inv["source"].as_str().unwrap_or_default().to_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if source == "nvidia-smi" {
        assert!(stderr.contains("falling back to nvidia-smi"), "{stderr}");
        assert_eq!(inv["gpus"][0]["class"], "h100-80g");
    } else {
        // A machine with a driver: NVML itself answered.
        assert_eq!(source, "nvml", "{inv}");
    }
}

#[test]
fn engine_check_compares_the_flags_llmgw_passes_with_the_engines_help() {
    // The sim engine is this very binary: every flag must be in its help.
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args([
            "ctl",
            "engine-check",
            "sim",
            "--bin",
            env!("CARGO_BIN_EXE_llmgw"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for flag in [
        "--listen",
        "--model",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(flag) && l.ends_with("yes")),
            "{flag}: {text}"
        );
    }
    // A llama-server whose help lacks --jinja (an old build, or a truncated help).
    let dir = tempfile::tempdir().unwrap();
    let help = dir.path().join("help.txt");
    std::fs::write(&help, "--model FNAME\n--host HOST\n--port PORT\n--metrics\n--alias NAME\n--parallel N\n--n-gpu-layers N\n--ctx-size N\n--jinja-ish\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args([
            "ctl",
            "engine-check",
            "llamacpp",
            "--help-output",
            help.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("--jinja") && l.ends_with("MISSING")),
        "a longer flag is not the flag: {text}"
    );
    assert!(text.contains("8 of 9 flags found"), "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["ctl", "engine-check", "llamacpp", "--json", "--help-output"])
        .arg(&help)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).expect("--json prints one document");
    assert_eq!(
        (v["engine"].as_str(), v["found"].as_u64()),
        (Some("llamacpp"), Some(8))
    );
    let jinja = v["flags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["flag"] == "--jinja");
    assert_eq!(jinja.unwrap()["in_help"], false, "{v}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not document --help itself"),
        "a help text without --help may be cut short"
    );
    // vLLM gives its whole help only for --help=all, and on a machine
    // without an accelerator only when told which device to assume.
    let flags = llmgw_agent::engines::check::flags_used(&llmgw_agent::engines::Vllm::default());
    let full = dir.path().join("full-help");
    let mut text = String::from("usage: vllm serve [-h] [--help=all]\n");
    for f in &flags {
        text.push_str(&format!("  {f} VALUE\n"));
    }
    std::fs::write(&full, text).unwrap();
    let vllm = dir.path().join("vllm");
    std::fs::write(
        &vllm,
        format!(
            "#!/bin/sh\nif [ \"$1 $2\" = 'serve --help=all' ] && [ -n \"$VLLM_TARGET_DEVICE\" ]; then cat {}; else echo 'usage: vllm serve [--help=all] (sections: frontend, model)'; fi\n",
            full.display()
        ),
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&vllm).status().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args([
            "ctl",
            "engine-check",
            "vllm",
            "--bin",
            vllm.to_str().unwrap(),
        ])
        .env_remove("VLLM_TARGET_DEVICE")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("{0} of {0} flags found", flags.len())),
        "{text}"
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args([
            "ctl",
            "engine-check",
            "llama.cpp",
            "--help-output",
            help.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("unknown engine \"llama.cpp\" (have llamacpp, sglang, sim, vllm)")
    );
}

/// The supervisor with the sim engine, which is this binary: the rest of
/// the supervisor's behaviour is tested in the agent crate with scripts.
mod supervision {
    use std::time::Duration;

    use llmgw_agent::engines::{Engine, Profile, ShardSpec, Sim};
    use llmgw_agent::supervisor::{State, Status, SupervisorOptions, start};

    async fn until(rx: &mut tokio::sync::watch::Receiver<Status>, want: State) -> Status {
        tokio::time::timeout(
            Duration::from_secs(30),
            rx.wait_for(|s| s.state == want || s.state == State::Failed),
        )
        .await
        .expect("state reached in time")
        .unwrap()
        .clone()
    }

    fn options() -> SupervisorOptions {
        SupervisorOptions {
            stop_timeout: Duration::from_secs(2),
            alive_grace: Duration::from_millis(100),
            ..SupervisorOptions::default()
        }
    }

    #[tokio::test]
    async fn a_sim_engine_shard_becomes_ready_then_stops_as_a_group() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let spec = ShardSpec {
            nnodes: 1,
            http_port: port,
            profile: Profile {
                tp: 1,
                model_path: "/m".into(),
                served_model_name: "tiny".into(),
                ..Profile::default()
            },
            ..ShardSpec::default()
        };
        let sim = Sim {
            bin: Some(env!("CARGO_BIN_EXE_llmgw").into()),
        };
        let shard = start(
            sim.commands(&spec).unwrap(),
            SupervisorOptions {
                http_port: Some(port),
                ..options()
            },
        );
        let mut status = shard.status();
        assert_eq!(
            until(&mut status, State::Ready).await.state,
            State::Ready,
            "ready once /health and /v1/models answer"
        );
        let models = super::page(format!("http://127.0.0.1:{port}/v1/models")).await;
        assert!(models.contains("tiny"));
        assert_eq!(shard.stop().await.state, State::Stopped);
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "the engine is gone"
        );
    }
}

#[tokio::test]
async fn keys_are_issued_listed_used_and_revoked_from_the_cli() {
    let (address, _scratch) = Scratch::new(Backend::Sqlite).await;
    ok(&address, &["store", "migrate"]);
    let init = |project: &str| {
        ok(
            &address,
            &[
                "keys",
                "init",
                "--org",
                "acme",
                "--team",
                "ml",
                "--project",
                project,
            ],
        )
    };
    assert!(init("chat").contains("ready"));
    // Again: no change, no error.
    init("chat");
    let out = llmgw(
        &address,
        &[
            "keys",
            "create",
            "--project",
            "chat",
            "--name",
            "backend",
            "--band",
            "silver",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secret = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(
        secret.starts_with("llmgw-sk-") && secret.len() == 57,
        "{secret}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("shown only now"));
    init("quiet");
    let empty: Value = serde_json::from_str(&ok(
        &address,
        &["keys", "list", "--project", "quiet", "--json"],
    ))
    .unwrap();
    assert_eq!(empty, json!([]), "one document, empty when nothing matches");
    // A project that is not there is said, not listed as keyless.
    let typo = llmgw(&address, &["keys", "list", "--project", "none"]);
    let said = String::from_utf8_lossy(&typo.stderr);
    assert!(
        !typo.status.success() && said.contains("no project none"),
        "{said}"
    );
    let keys: Vec<Value> =
        serde_json::from_str(&ok(&address, &["keys", "list", "--json"])).unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(
        (keys[0]["project"].as_str(), keys[0]["band"].as_str()),
        (Some("chat"), Some("silver"))
    );
    assert!(
        keys[0].get("hash").is_none(),
        "the list does not print hashes"
    );
    let dump = ok(&address, &["events", "export"]);
    assert!(
        !dump.contains(&secret) && dump.contains(&llmgw_gateway::auth::key_hash(&secret)),
        "the log holds the hash only"
    );
    let missing = llmgw(
        &address,
        &["keys", "create", "--project", "nope", "--name", "x"],
    );
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no project nope"));

    let engine = tiny_engine();
    let endpoint = format!("e1=http://{}=tiny", engine.addr_after("listening on "));
    let server = Child::spawn(&[
        "--store",
        &address,
        "server",
        "--auth",
        "--endpoint",
        &endpoint,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let base = format!("http://{}", server.addr_after("client listening on "));
    let body =
        json!({"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]});
    let client = reqwest::Client::new();
    let send = || {
        client
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(&secret)
            .json(&body)
            .send()
    };
    assert_eq!(send().await.unwrap().status(), 200);
    let key_id = keys[0]["key_id"].as_str().unwrap();
    assert!(ok(&address, &["keys", "revoke", key_id]).contains("revoked"));
    // The server's views follow the log: the revocation lands within a poll.
    let refused = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if send().await.unwrap().status() == 401 {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(refused.is_ok(), "a revoked key stops working");
    let table = ok(&address, &["keys", "list"]);
    assert!(table.contains("revoked"), "{table}");
}

/// The body of a GET, as text.
async fn page(url: String) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

/// A bad configuration, the variables laid over it, and what it must say.
type BadCase<'a> = (String, Vec<(&'a str, &'a str)>, &'a str);

#[tokio::test]
async fn the_example_control_plane_configuration_parses_and_bad_files_exit_2() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/server.yaml");
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    // The files the example's tls: names, as `llmgw server init` makes them.
    let pki = dir.path().join("pki");
    let pki = pki.to_str().unwrap();
    authority_and(pki, &["issue-server", "server", "--host", "127.0.0.1"]);
    let good = std::fs::read_to_string(&example)
        .unwrap()
        .replace("postgres://llmgw@db.internal:5432/llmgw", &store)
        .replace("/etc/llmgw/", &format!("{pki}/"));
    let copy = dir.path().join("server.yaml");
    std::fs::write(&copy, &good).unwrap();
    // The example's addresses are taken here: variables override them.
    let mut server = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["server", "--config", copy.to_str().unwrap()])
        .env("LLMGW_LISTEN", "127.0.0.1:0")
        .env("LLMGW_ADMIN_LISTEN", "127.0.0.1:0")
        .env("LLMGW_AGENT_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines: Vec<String> = BufReader::new(server.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .take(3)
        .collect();
    let admin = lines
        .iter()
        .find_map(|l| l.strip_prefix("admin listening on "))
        .unwrap_or_else(|| panic!("{lines:?}"))
        .to_owned();
    // The leader applies the file's catalog once it holds the lease.
    let table = until("the catalog is applied", || async {
        let models = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["ctl", "models", "--admin", &format!("http://{admin}")])
            .output()
            .unwrap();
        let table = String::from_utf8_lossy(&models.stdout).into_owned();
        // The header, a row a model, and a line a model that waits.
        let rows = table
            .lines()
            .take_while(|l| !l.contains(" waits for a node"));
        (rows.count() == 5).then_some(table)
    })
    .await;
    let _ = server.kill();
    let _ = server.wait();
    for m in ["llama-3.1-8b", "llama-3.1-405b", "qwen-0.5b", "demo"] {
        assert!(table.contains(m), "{table}");
    }

    let anchors_file = dir.path().join("anchors.jsonl").display().to_string();
    let key_file = dir.path().join("signing.key");
    std::fs::write(&key_file, llmgw_eventstore::signing::generate().unwrap()).unwrap();
    let key_file = key_file.display().to_string();
    let not_a_log = dir.path().join("notes.txt");
    std::fs::write(&not_a_log, "shopping list").unwrap();
    let not_a_log = not_a_log.display().to_string();
    let a_dir = dir.path().display().to_string();
    // The server on `text` with `env` and `extra` flags (`--check`).
    let run = |text: &str, env: &[(&str, &str)], extra: &[&str]| {
        let f = dir.path().join("s.yaml");
        std::fs::write(&f, text).unwrap();
        Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["server", "--config", f.to_str().unwrap()])
            .args(extra)
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    let cases: Vec<BadCase> = vec![
        (
            good.replace("lost_after: 60s", "lost_after: 5s"),
            vec![],
            "lost_after",
        ),
        (
            good.replace("interval: 5s", "interval: soon"),
            vec![],
            "is not a duration",
        ),
        (
            good.replace("gpus_per_node: 2", "gpus_per_node: 3"),
            vec![],
            "tp × pp",
        ),
        (
            good.replace("gpus_per_node: 2", "gpus_per_node: 2\n        startup_timeout_s: 0"),
            vec![],
            "startup_timeout_s 0",
        ),
        (
            good.replace("fallbacks: [qwen-0.5b]", "fallbacks: [nope]"),
            vec![],
            "fallback nope",
        ),
        (
            good.replace("fallbacks: [qwen-0.5b]", "routing_profile: batch"),
            vec![],
            "routing_profile \"batch\" is not supported",
        ),
        (
            good.clone(),
            vec![("LLMGW_CONTROL__PORT_RANGE", "[9, 1]")],
            "port_range",
        ),
        (
            format!("{good}\nlisten_typo: 1\n"),
            vec![],
            "unknown field `listen_typo`",
        ),
        (
            format!("{good}\nfallbacks: {{qwen-0.5b: []}}\n"),
            vec![],
            "fallbacks: \"qwen-0.5b\": name a model and at least one other",
        ),
        (
            format!("{good}\nfallbacks: {{qwen-0.5b: [qwen-0.5b]}}\n"),
            vec![],
            "fallbacks: \"qwen-0.5b\": name a model and at least one other",
        ),
        // Anchors: a sink with no cadence, a zero cadence, a sink nowhere,
        // and a key that is missing or has nothing to sign.
        (
            good.clone(),
            vec![("LLMGW_CONTROL__ANCHORS__FILE", anchors_file.as_str())],
            "control.anchors needs every_events or every",
        ),
        (
            good.clone(),
            vec![("LLMGW_CONTROL__ANCHORS__EVERY_EVENTS", "0")],
            "every_events must be at least 1",
        ),
        (
            good.clone(),
            vec![
                ("LLMGW_CONTROL__ANCHORS__EVERY", "10m"),
                ("LLMGW_CONTROL__ANCHORS__FILE", "/no/such/dir/anchors.jsonl"),
            ],
            "not a file in an existing directory",
        ),
        (
            good.clone(),
            vec![("LLMGW_CONTROL__SIGNING_KEY", "/no/such/key.pem")],
            "control.signing_key: cannot read",
        ),
        (
            good.clone(),
            vec![("LLMGW_CONTROL__SIGNING_KEY", key_file.as_str())],
            "control.signing_key signs the anchors",
        ),
        // A variable no command reads but that names a key is a typo, not
        // something to pass over: one underscore where two were meant, and
        // a key that has no variable.
        (
            good.clone(),
            vec![("LLMGW_CONTROL_LOST_AFTER", "90s")],
            "the key `control.lost_after` is set by LLMGW_CONTROL__LOST_AFTER",
        ),
        (
            good.clone(),
            vec![("LLMGW_AUTH_ENABLED", "true")],
            "is set by LLMGW_AUTH__ENABLED",
        ),
        (
            good.clone(),
            vec![("LLMGW_MODELS", "[]")],
            "`models` has none of its own",
        ),
        // A letter off a variable some command reads.
        (
            good.clone(),
            vec![("LLMGW_ADMIN_LISTN", "127.0.0.1:9")],
            "LLMGW_ADMIN_LISTN is not a variable of llmgw; did you mean LLMGW_ADMIN_LISTEN?",
        ),
        // A catalog runs the control plane: false is refused, not passed
        // over.
        (
            good.clone(),
            vec![("LLMGW_CONTROL__ENABLED", "false")],
            "control.enabled: false with a models: catalog",
        ),
        // As the flag is, the file's false with keys on is refused.
        (
            format!("{good}\nrecord_usage: false\n"),
            vec![("LLMGW_AUTH", "true")],
            "record_usage: false with keys on",
        ),
        // A store address, of the log or of threads, is read before the
        // start (--check refuses it too, below).
        (
            good.clone(),
            vec![("LLMGW_STORE", "mysql://db/llmgw")],
            "store: bad store address",
        ),
        (
            good.clone(),
            vec![("LLMGW_STORE", "sqlite:///no/such/dir/llmgw.db")],
            "store: /no/such/dir is not a directory",
        ),
        (
            good.clone(),
            vec![("LLMGW_STORE", not_a_log.as_str())],
            "is not a SQLite database",
        ),
        (
            good.clone(),
            vec![("LLMGW_STORE", a_dir.as_str())],
            "is a directory, not a SQLite file",
        ),
        // Two listeners on one port, and one endpoint id twice: said by
        // name, not found as "Address already in use" at the start.
        (
            good.clone(),
            vec![
                ("LLMGW_LISTEN", "127.0.0.1:18181"),
                ("LLMGW_ADMIN_LISTEN", "127.0.0.1:18181"),
            ],
            "listen 127.0.0.1:18181 and admin_listen 127.0.0.1:18181 take the same port",
        ),
        (
            good.clone(),
            vec![(
                "LLMGW_ENDPOINTS",
                "e1=http://127.0.0.1:9=m e1=http://127.0.0.1:10=m",
            )],
            "the id e1 is given twice",
        ),
        // An origin with a path never matches a browser's Origin.
        (
            good.clone(),
            vec![(
                "LLMGW_ROUTER__CORS_ORIGINS",
                "[\"https://app.example.com/\"]",
            )],
            "router.cors_origins: \"https://app.example.com/\" has a path",
        ),
        // A bare `*` is YAML's alias: the parser's words alone did not
        // say how to write it.
        (
            good.clone(),
            vec![("LLMGW_ROUTER__CORS_ORIGINS", "*")],
            "the value is read as YAML: write a list as '[\"a\", \"b\"]'",
        ),
        (
            good.clone(),
            vec![("LLMGW_CONTROL__INTERVAL", "0s")],
            "control.interval must be longer than 0",
        ),
        (
            good.clone(),
            vec![("LLMGW_CONTROL__BASE_BACKOFF", "20m")],
            "must not be longer than control.max_backoff",
        ),
        // A variable that names no key is blamed, not the file.
        (
            good.clone(),
            vec![("LLMGW_CONTROL__BOGUS", "1")],
            "LLMGW_CONTROL__BOGUS is not a valid setting: unknown field `bogus`",
        ),
        // A timeout of nothing would fail every engine over at once.
        (
            good.clone(),
            vec![("LLMGW_ROUTER__STREAM_IDLE_TIMEOUT", "0s")],
            "router.stream_idle_timeout must be above 0",
        ),
        // A level mistyped: nothing at all would be logged.
        (
            good.clone(),
            vec![("RUST_LOG", "inof")],
            "\"inof\" is not a level; did you mean info?",
        ),
        (
            good.clone(),
            vec![("RUST_LOG", "llmgw=loud")],
            "RUST_LOG=\"llmgw=loud\"",
        ),
        // A price's key mistyped is named, not reported as the right one
        // missing.
        (
            good.replacen(
                "\nmodels:\n",
                "\nmodels:\n  - name: priced\n    price: {prompt_per_1k: 1, completion_per_1K: 2}\n    profiles: [{name: p, engine: sim}]\n",
                1,
            ),
            vec![],
            "`models.0.price.completion_per_1K` is a key llmgw does not know",
        ),
        // A stop that would wait days for streams.
        (
            good.clone(),
            vec![("LLMGW_SHUTDOWN_GRACE", "100h")],
            "shutdown_grace: 360000 s is more than an hour",
        ),
        // The file's endpoints are checked though the variable's replace
        // them.
        (
            format!("{good}\nendpoints: [\"no equals\"]\n"),
            vec![("LLMGW_ENDPOINTS", "e1=http://127.0.0.1:9=m")],
            "endpoints:",
        ),
    ];
    for (text, env, says) in cases {
        let out = run(&text, &env, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{says}: {err}");
        assert!(err.contains(says), "expected {says:?} in {err}");
        assert_eq!(err.lines().count(), 1, "one clear line: {err}");
    }
    let check = |text: &str, env: &[(&str, &str)]| {
        let out = run(text, env, &["--check"]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // --check refuses what the start would: a bad address of the threads'
    // store too.
    let (code, err) = check(
        &format!("{good}\nthreads: {{store: \"mysql://db/t\", retain_hours: 24}}\n"),
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("threads.store: bad store address"), "{err}");
    // Durations as bare numbers of seconds, in the file and in a variable
    // (read as YAML, so a number).
    let (code, err) = check(
        &format!("{good}\nshutdown_grace: 30\n"),
        &[
            ("LLMGW_CONNECTIONS__IDLE_TIMEOUT", "60"),
            ("LLMGW_ROUTER__RESPONSE_TIMEOUT", "900"),
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    // A variable that names no key is another program's, left alone.
    let (code, err) = check(
        &good,
        &[
            ("LLMGW_KEY", "sk-mine"),
            ("LLMGW_TEST_X", "1"),
            ("LLMGW_STORE_PASSWORD", "x"),
            ("LLMGW_MODELS_DIR", "/m"),
            // Near a short name, not a letter off it: not a typo.
            ("LLMGW_PATH", "/opt/llmgw"),
            ("LLMGW_STATE", "x"),
            ("LLMGW_LISTENER", "x"),
        ],
    );
    assert_eq!(code, Some(0), "{err}");
}

/// The README's "gateway alone" commands, run as a person pastes them (one
/// at a time: a background command is given until its port answers), with
/// the binary this test built as `llmgw`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_gateway_example_runs_as_written() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let block = readme
        .split("The gateway alone")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("the README's gateway example");
    let commands: Vec<String> = block
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    assert_eq!(commands.len(), 3, "{block}");
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_llmgw"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut background = Vec::new();
    let mut answer = String::new();
    for command in &commands {
        if let Some(cmd) = command.strip_suffix('&') {
            let child = Command::new("sh")
                .args(["-c", &format!("exec {cmd}")])
                .env("PATH", &path)
                .env_remove("LLMGW_STORE")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            background.push(KillOnDrop(child));
            let port = cmd
                .split("--listen 127.0.0.1:")
                .last()
                .and_then(|p| p.split_whitespace().next())
                .expect("a --listen port");
            until(&format!("{cmd} to listen"), || async {
                tokio::net::TcpStream::connect(format!("127.0.0.1:{port}"))
                    .await
                    .ok()
                    .map(|_| ())
            })
            .await;
        } else {
            let out = Command::new("sh")
                .args(["-c", command])
                .env("PATH", &path)
                .output()
                .unwrap();
            assert!(out.status.success(), "{command}: {out:?}");
            answer = String::from_utf8_lossy(&out.stdout).into_owned();
        }
    }
    assert!(
        answer.contains("data: ") && answer.trim_end().ends_with("data: [DONE]"),
        "{answer}"
    );
    drop(background);
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

mod check_schema {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        check_refuses_the_schema_a_start_refuses_and_changes_nothing(Backend::Postgres).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        check_refuses_the_schema_a_start_refuses_and_changes_nothing(Backend::Sqlite).await
    }
}

/// `server --check` reads the store's applied migrations as a start does
/// and refuses (exit 2), in the start's words, the stores a start refuses:
/// one a newer binary migrated (a binary rolled back), and one with an
/// applied migration edited. It said "configuration ok" and the start
/// then failed before binding. An older schema passes, saying a start
/// migrates it. The check changes nothing in the store, and makes no file
/// beside a SQLite one.
async fn check_refuses_the_schema_a_start_refuses_and_changes_nothing(b: Backend) {
    let (address, scratch, store) = seeded(b, 2).await;
    let exec = |sql: &'static str| {
        let store = store.clone();
        async move {
            match &store {
                AnyStore::Postgres(s) => sqlx::raw_sql(sql).execute(s.pool()).await.map(|_| ()),
                AnyStore::Sqlite(s) => sqlx::raw_sql(sql).execute(s.pool()).await.map(|_| ()),
            }
            .unwrap()
        }
    };
    let versions = || {
        let store = store.clone();
        async move {
            let sql = "SELECT version FROM es_schema_migrations ORDER BY version";
            match &store {
                AnyStore::Postgres(s) => sqlx::query_scalar(sql).fetch_all(s.pool()).await,
                AnyStore::Sqlite(s) => sqlx::query_scalar(sql).fetch_all(s.pool()).await,
            }
            .unwrap()
        }
    };
    let check = || {
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .args(["server", "--check", "--auth", "--store", &address])
            .args(["--endpoint", "e=http://127.0.0.1:9=m"])
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), said)
    };
    let all: Vec<i64> = versions().await;
    let newest = *all.last().unwrap();

    let (code, said) = check();
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!("schema: version {newest} in ")) && said.contains("this binary's"),
        "{said}"
    );

    // What a newer binary's migration leaves.
    exec("UPDATE es_schema_migrations SET version = version + 100 WHERE version = (SELECT max(version) FROM es_schema_migrations)").await;
    let (code, said) = check();
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains(&format!(
            "error: store: the store's schema (version {}) is newer than this binary knows ({newest})",
            newest + 100
        )),
        "{said}"
    );
    assert_eq!(versions().await.last(), Some(&(newest + 100)));

    // Older: a start migrates it, and says so; the check does not.
    exec("DELETE FROM es_schema_migrations WHERE version > (SELECT max(version) FROM es_schema_migrations) - 100").await;
    let (code, said) = check();
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!(
            "schema: version {} in {}; a start migrates it to version {newest}",
            newest - 1,
            StoreAddress::parse(&address).unwrap().redacted()
        )),
        "{said}"
    );
    assert_eq!(versions().await, all[..all.len() - 1]);

    exec("UPDATE es_schema_migrations SET checksum = substr(checksum, 2) WHERE version = 3").await;
    let (code, said) = check();
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("error: store: migration 3 (people) was changed after it was applied"),
        "{said}"
    );

    // A SQLite file alone (a backup, a stopped server's store) stays as
    // it was, and nothing is made beside it.
    if let (AnyStore::Sqlite(s), Scratch::Sqlite(dir)) = (&store, &scratch) {
        s.pool().close().await;
        s.read_pool().close().await;
        let listing = || {
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        assert_eq!(listing(), ["llmgw.db"]);
        let bytes = std::fs::read(&address).unwrap();
        let (code, said) = check();
        assert_eq!(code, Some(2), "{said}");
        assert_eq!(listing(), ["llmgw.db"]);
        assert!(
            std::fs::read(&address).unwrap() == bytes,
            "the file changed"
        );
    }
}

/// `keys list`, `keys groups` and `users list` decided here (--offline, a
/// backup's file) only read the log: opened for writing, a read-only
/// backup was refused ("attempt to write a readonly database") and a
/// large one was rewritten, its catch-up saving a `cli-keys` snapshot
/// past 10,000 events. The file's bytes now stay as they were and no
/// snapshot is saved; a command that writes still saves one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_keys_and_users_here_leaves_the_log_as_it_was() {
    use std::os::unix::fs::PermissionsExt;
    let (address, _scratch) = Scratch::new(Backend::Sqlite).await;
    let init = [
        "keys",
        "init",
        "--org",
        "o",
        "--team",
        "t",
        "--project",
        "p",
    ];
    ok(&address, &init);
    ok(
        &address,
        &["keys", "create", "--project", "p", "--name", "k1"],
    );
    let at = StoreAddress::parse(&address).unwrap();
    let store = AnyStore::open(&at, OpenOptions::default()).await.unwrap();
    let lease = store
        .acquire_lease("seed", Duration::from_secs(30))
        .await
        .unwrap();
    // Past the views' snapshot floor, of a kind the views skip.
    let filler = (0..10_050)
        .map(|i| NewEvent::new("TestFiller", 1, json!({"i": i})))
        .collect();
    let batch = [StreamAppend::new("filler", ExpectedVersion::Any, filler)];
    let w = Writer::Leader(lease.token.clone());
    store.append(&w, &batch).await.unwrap();
    store.release_lease(&lease.token).await.unwrap();
    let AnyStore::Sqlite(s) = &store else {
        unreachable!()
    };
    s.pool().close().await;
    s.read_pool().close().await;
    let snapshots = || async {
        let read = AnyStore::open(&at, OpenOptions::reading()).await.unwrap();
        let AnyStore::Sqlite(r) = &read else {
            unreachable!()
        };
        let names: Vec<String> = sqlx::query_scalar("SELECT name FROM es_snapshots")
            .fetch_all(r.read_pool())
            .await
            .unwrap();
        r.read_pool().close().await;
        names
    };
    let before = snapshots().await;
    let file = std::path::Path::new(&address);
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o444)).unwrap();
    let bytes = std::fs::read(file).unwrap();
    let keys = ok(&address, &["keys", "list", "--offline"]);
    assert!(keys.contains("k1"), "{keys}");
    let groups = ok(&address, &["keys", "groups", "--offline"]);
    assert!(groups.contains("project p"), "{groups}");
    ok(&address, &["users", "list", "--offline"]);
    assert!(
        std::fs::read(file).unwrap() == bytes,
        "the log's file changed"
    );
    assert_eq!(snapshots().await, before);

    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)).unwrap();
    ok(
        &address,
        &["keys", "create", "--project", "p", "--name", "k2"],
    );
    assert!(snapshots().await.contains(&"cli-keys".to_owned()));
}

/// `store copy` stopped by SIGINT (Ctrl-C) or SIGTERM removes the export
/// file it goes through: it left the whole log in plain text in the
/// temporary directory, and an empty SQLite file it had made. Stopped
/// before the log is in, it says that nothing was written and exits as a
/// shell says of such a signal (130, 143); a store it did not make stays.
/// The source's events are locked away from the copy's export meanwhile,
/// so the stop lands at a known point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_store_copy_leaves_neither_its_export_nor_a_file_it_made() {
    let (from, _scratch, log) = seeded(Backend::Postgres, 5).await;
    let AnyStore::Postgres(pg) = &log else {
        unreachable!()
    };
    let dir = tempfile::tempdir().unwrap();
    for (signal, code, made) in [("INT", 130, true), ("TERM", 143, false)] {
        let tmp = tempfile::tempdir().unwrap();
        let to = dir.path().join(format!("copy-{signal}.db"));
        let to = to.to_str().unwrap();
        if !made {
            ok(to, &["store", "migrate"]);
        }
        let mut locked = pg.pool().begin().await.unwrap();
        sqlx::query("LOCK TABLE es_events IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *locked)
            .await
            .unwrap();
        let copy = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .env("TMPDIR", tmp.path())
            .args(["--store", &from, "store", "copy", "--to", to])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The export has begun (its directory is there) and waits for
        // the lock.
        until("the copy's export to begin", || async {
            let entries = std::fs::read_dir(tmp.path()).unwrap().count();
            (entries > 0 && std::path::Path::new(to).exists()).then_some(())
        })
        .await;
        let kill = Command::new("kill")
            .args([format!("-{signal}"), copy.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let out = copy.wait_with_output().unwrap();
        locked.rollback().await.unwrap();
        let told = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{told}");
        assert!(
            told.contains(&format!(
                "store copy stopped (SIG{signal}): nothing was written"
            )),
            "{told}"
        );
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert!(left.is_empty(), "left in the temporary directory: {left:?}");
        assert_eq!(std::path::Path::new(to).exists(), !made, "{told}");
        if !made {
            let stats = &json_lines(&ok(to, &["events", "stats", "--json"]))[0];
            assert_eq!(stats["head"].as_u64(), Some(0), "{stats}");
        }
    }
}

/// `store migrate` and `store copy` whose reader has gone (`| head -1`)
/// end quietly, their work done, as `events tail | head` does: they
/// panicked ("failed printing to stdout: Broken pipe", exit 101) after
/// the copy was whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_commands_whose_reader_has_gone_end_quietly() {
    let (from, _scratch, _log) = seeded(Backend::Sqlite, 3).await;
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("copy.db");
    let to = to.to_str().unwrap();
    for args in [&["store", "migrate"][..], &["store", "copy", "--to", to]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .arg("--store")
            .arg(&from)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Closed before anything is said: every line meets a closed pipe.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let told = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {told}");
        assert!(!told.contains("panicked"), "{args:?}: {told}");
    }
    ok(to, &["events", "verify"]);
}

/// A SQLite backup restored with `cp` over a crashed server's file, its
/// write-ahead log left beside it, reads as neither (the log's pages over
/// the backup's: 23 events, head 63): `events verify` calls it tampered,
/// and now says that a `-wal` from another copy of the database gives
/// that picture. Without the `-wal` the backup reads whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_a_foreign_write_ahead_log_beside_a_restored_file() {
    let (address, scratch) = Scratch::new(Backend::Sqlite).await;
    let Scratch::Sqlite(dir) = &scratch else {
        unreachable!()
    };
    ok(&address, &["store", "migrate"]);
    let at = StoreAddress::parse(&address).unwrap();
    let store = AnyStore::open(&at, OpenOptions::default()).await.unwrap();
    let lease = store
        .acquire_lease("server", Duration::from_secs(60))
        .await
        .unwrap();
    let w = Writer::Leader(lease.token.clone());
    let append = |n: usize| {
        let (store, w) = (store.clone(), w.clone());
        async move {
            for i in 0..n {
                let e = NewEvent::new("ModelAdded", 1, json!({"i": i}));
                let batch = [StreamAppend::new(
                    format!("model-{i}"),
                    ExpectedVersion::Any,
                    vec![e],
                )];
                store.append(&w, &batch).await.unwrap();
            }
        }
    };
    append(23).await;
    store.fold_wal().await;
    let backup = dir.path().join("backup.db");
    std::fs::copy(&address, &backup).unwrap();
    // The server goes on: a checkpoint, then events only its
    // write-ahead log holds when it crashes.
    append(20).await;
    store.fold_wal().await;
    append(20).await;
    let crashed_wal = dir.path().join("crashed.db-wal");
    std::fs::copy(format!("{address}-wal"), &crashed_wal).unwrap();

    let restored = dir.path().join("restored.db");
    std::fs::copy(&backup, &restored).unwrap();
    std::fs::copy(&crashed_wal, dir.path().join("restored.db-wal")).unwrap();
    let restored = restored.to_str().unwrap();
    let out = llmgw(restored, &["events", "verify"]);
    let (said, told) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{said}{told}");
    assert!(
        said.contains("TAMPERED: position 24 is missing"),
        "{said}{told}"
    );
    assert!(
        told.contains(&format!("{restored}-wal lies beside it")),
        "{said}{told}"
    );
    // The backup alone, as the restore in docs/operations.md leaves it.
    for end in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{restored}{end}"));
    }
    let whole = ok(restored, &["events", "verify"]);
    assert!(whole.contains("ok: 23 events in 1..=23"), "{whole}");
}

/// `store copy` and `events import` refused for a lease held say when it
/// runs out, and that a holder that crashed (a killed server, a killed
/// import) frees it then: they named a holder to stop, and an operator
/// hunted for a server that was no longer there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lease_refusal_says_when_it_runs_out() {
    let (from, _s1, source) = seeded(Backend::Sqlite, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("log.jsonl");
    let file = file.to_str().unwrap();
    ok(&from, &["events", "export", "-o", file]);
    // What a crashed server, then a killed import, leave behind.
    source
        .acquire_lease("cp-back", Duration::from_secs(300))
        .await
        .unwrap();
    let (into, _s2) = Scratch::new(Backend::Sqlite).await;
    ok(&into, &["store", "migrate"]);
    let target = AnyStore::open(&StoreAddress::parse(&into).unwrap(), OpenOptions::default())
        .await
        .unwrap();
    target
        .acquire_lease("import-24061", Duration::from_secs(300))
        .await
        .unwrap();
    let to = dir.path().join("copy.db");
    for (store, args, says) in [
        (
            &from,
            &["store", "copy", "--to", to.to_str().unwrap()][..],
            "cp-back holds the append lease of sqlite://",
        ),
        (
            &into,
            &["events", "import", file],
            "another import, import-24061, holds it until ",
        ),
    ] {
        let out = llmgw(store, args);
        let told = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{told}");
        assert!(told.contains(says), "{told}");
        assert!(
            told.contains(" until 20") && told.contains(" s): ") && told.contains("frees itself"),
            "{told}"
        );
    }
    assert!(!to.exists());
}
