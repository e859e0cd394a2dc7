//! `llmgw events capture` as an incident engineer uses it: following
//! `replay-tests/fixtures/README.md` word for word on a recorded node-loss
//! incident, and on a live one (from `cluster.rs`), gives a fixture, a
//! test and its snapshot that pass as written.

use std::path::{Path, PathBuf};
use std::process::Command;

use llmgw_replay_tests::timeline::Timeline;
use llmgw_testkit::{Backend, Scratch};

use super::{fixture, ok};

fn readme() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../replay-tests/fixtures/README.md"),
    )
    .unwrap()
}

/// A checkout's replay-tests crate, as far as capture needs it, under a
/// temporary root.
fn checkout() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let crate_dir = root.path().join("replay-tests");
    std::fs::create_dir_all(crate_dir.join("fixtures")).unwrap();
    std::fs::create_dir_all(crate_dir.join("tests/it/captured")).unwrap();
    std::fs::write(crate_dir.join("tests/it/main.rs"), "mod captured;\n").unwrap();
    let list =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../replay-tests/tests/it/captured/mod.rs");
    std::fs::copy(list, crate_dir.join("tests/it/captured/mod.rs")).unwrap();
    (root, crate_dir)
}

/// Words of a shell command line: spaces split, double quotes group.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut word, mut quoted, mut any) = (String::new(), false, false);
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any {
                    out.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            c => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(word);
    }
    out
}

fn run_in(root: &Path, args: &[String]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .current_dir(root)
        .env_remove("LLMGW_STORE")
        .env_remove("LLMGW_SIGNING_KEY")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What the written test compares: the snapshot's contents, after its
/// metadata.
fn snapshot_contents(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let body = text
        .strip_prefix("---\n")
        .and_then(|t| t.split_once("\n---\n"))
        .map(|(_, b)| b)
        .unwrap_or_else(|| panic!("{} is not an insta snapshot", path.display()));
    body.trim_end().to_owned()
}

/// The written test passes as written: its snapshot is the story the
/// timeline tells of the fixture.
fn passes_as_written(crate_dir: &Path, name: &str) -> Timeline {
    let module = name.replace('-', "_");
    let t = Timeline::load(&crate_dir.join(format!("fixtures/{name}.jsonl"))).unwrap();
    let snap = crate_dir.join(format!(
        "tests/it/captured/snapshots/it__captured__{module}__story.snap"
    ));
    assert_eq!(snapshot_contents(&snap), t.story().trim_end(), "{name}");
    let test =
        std::fs::read_to_string(crate_dir.join(format!("tests/it/captured/{module}.rs"))).unwrap();
    assert!(
        test.contains(&format!("fn {module}()"))
            && test.contains(&format!("Timeline::fixture(\"{name}\")"))
            && test.contains("insta::assert_snapshot!(\"story\", t.story())"),
        "{test}"
    );
    let list = std::fs::read_to_string(crate_dir.join("tests/it/captured/mod.rs")).unwrap();
    assert!(
        list.lines().any(|l| l == format!("mod {module};")),
        "{list}"
    );
    t
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Postgres).await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Sqlite).await } )* }
    };
}

both_backends!(the_fixtures_readme_turns_a_recorded_node_loss_into_a_passing_test);

async fn the_fixtures_readme_turns_a_recorded_node_loss_into_a_passing_test(b: Backend) {
    // The recorded incident, in a store as it was recorded (times too).
    let (address, _scratch) = Scratch::new(b).await;
    ok(
        &address,
        &[
            "events",
            "import",
            fixture("node-lost-while-loading").to_str().unwrap(),
        ],
    );
    let readme = readme();
    // Step 2: the capture command, run at the root of a checkout, with
    // only the store changed.
    let line = readme
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("llmgw ") && l.contains("events capture"))
        .expect("the README's capture command");
    let mut args: Vec<String> = words(line)[1..].to_vec();
    let at = args.iter().position(|a| a == "--store").unwrap();
    args[at + 1] = address.clone();
    let name = args[args.iter().position(|a| a == "capture").unwrap() + 1].clone();
    let module = name.replace('-', "_");
    let (root, crate_dir) = checkout();
    let (good, out, err) = run_in(root.path(), &args);
    assert!(good, "{err}");
    assert!(
        out.contains("captured positions 1..=14 (14 events)"),
        "{out}"
    );
    // Every file the README says it writes is there.
    let named: Vec<&str> = readme
        .split('`')
        .filter(|s| s.starts_with("replay-tests/") && (s.contains(&name) || s.contains(&module)))
        .collect();
    assert_eq!(
        named.len(),
        3,
        "the fixture, the test and the snapshot: {named:?}"
    );
    for path in named {
        assert!(root.path().join(path).exists(), "the README names {path}");
    }
    // Step 3's command names the test that was written, and it passes.
    assert!(
        readme.contains(&format!("cargo test -p llmgw-replay-tests -- {module}")),
        "step 3 names the module"
    );
    let t = passes_as_written(&crate_dir, &name);
    assert_eq!((t.header.from, t.header.to), (1, 14));
    let story = t.story();
    assert!(
        story.contains("NodeLost node-n1") && story.contains("ReplicaReady replica-R2"),
        "{story}"
    );
    // Capturing again under the same name is refused, and changes nothing.
    let before = std::fs::read_to_string(crate_dir.join(format!("fixtures/{name}.jsonl"))).unwrap();
    let (good, _, err) = run_in(root.path(), &args);
    assert!(
        !good && err.contains("exists: choose another name"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(crate_dir.join(format!("fixtures/{name}.jsonl"))).unwrap(),
        before
    );
    // A later range carries the views before it, so it replays alone.
    let late: Vec<String> = [
        "--store",
        &address,
        "events",
        "capture",
        "node-lost-late",
        "--from",
        "9",
        "--to",
        "14",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (good, _, err) = run_in(root.path(), &late);
    assert!(good, "{err}");
    let late = passes_as_written(&crate_dir, "node-lost-late");
    assert!(late.header.base.is_some());
    assert_eq!(
        late.end().router.endpoints_for("llama-8b").count(),
        t.end().router.endpoints_for("llama-8b").count()
    );
    // From an export that starts late, imported from its anchor: the views
    // before the range hold only what the copy holds, and capture says so.
    let part = root.path().join("part.jsonl");
    ok(
        &address,
        &[
            "events",
            "export",
            "--from",
            "5",
            "-o",
            part.to_str().unwrap(),
        ],
    );
    let copy = format!("sqlite://{}", root.path().join("copy.db").display());
    ok(
        &copy,
        &["events", "import", "--from-anchor", part.to_str().unwrap()],
    );
    let from_copy: Vec<String> = [
        "--store",
        &copy,
        "events",
        "capture",
        "node-lost-from-a-copy",
        "--from",
        "9",
        "--to",
        "14",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (good, _, err) = run_in(root.path(), &from_copy);
    assert!(good, "{err}");
    assert!(
        err.contains("this log begins at position 5 (imported from an anchor)"),
        "{err}"
    );
}

/// Called by the live node-loss test once the replica is rebuilt: the
/// incident captured from the live log passes as written, and the header
/// holds the timings the server ran with.
pub(crate) fn a_live_node_loss_becomes_a_passing_test(store: &str, victim: &str) {
    let head: u64 = {
        let stats = &super::json_lines(&ok(store, &["events", "stats", "--json"]))[0];
        stats["head"].as_u64().unwrap()
    };
    let args: Vec<String> = [
        "--store",
        store,
        "events",
        "capture",
        "node-lost-live",
        "--from",
        "1",
        "--to",
        &head.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (root, crate_dir) = checkout();
    let (good, out, err) = run_in(root.path(), &args);
    assert!(good, "{err}");
    assert!(
        out.contains("unreachable after 1000 ms, lost after 2500 ms"),
        "{out}"
    );
    let t = passes_as_written(&crate_dir, "node-lost-live");
    let s = t.settings();
    assert_eq!(
        (
            s.unreachable_after_ms,
            s.lost_after_ms,
            s.reconcile_interval_ms
        ),
        (1000, 2500, 200)
    );
    let unreachable = t.first("NodeUnreachable", victim);
    let lost = t.first("NodeLost", victim);
    assert!(t.between(unreachable, lost) <= t.setting("lost_after"));
    assert!(t.story().contains(&format!("NodeLost node-{victim}")));
    if let Some(dir) = std::env::var_os("LLMGW_RECAPTURE") {
        // Recording the committed fixture on purpose (see the README).
        let dir = std::fs::canonicalize(dir).unwrap();
        let mut again = args.clone();
        again.extend(["--dir".into(), dir.to_string_lossy().into_owned()]);
        let (good, out, err) = run_in(root.path(), &again);
        assert!(good, "{err}");
        eprintln!("{out}");
    }
}
