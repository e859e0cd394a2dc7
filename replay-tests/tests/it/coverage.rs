//! Every fixture is replayed by some test: a committed fixture that no
//! test reads would pass silently while checking nothing.

use std::path::{Path, PathBuf};

use llmgw_replay_tests::{fixtures_dir, incidents};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it")
}

#[test]
fn every_fixture_has_a_test() {
    let mut files = Vec::new();
    rust_files(&tests_dir(), &mut files);
    let sources: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let mut untested = Vec::new();
    for entry in std::fs::read_dir(fixtures_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let quoted = format!("\"{name}\"");
        if !incidents::ALL.contains(&name.as_str()) && !sources.iter().any(|s| s.contains(&quoted))
        {
            untested.push(name);
        }
    }
    assert!(
        untested.is_empty(),
        "fixtures no test reads: {untested:?}; `llmgw events capture` writes a test with its fixture, or name it in a test under tests/it"
    );
}

#[test]
fn every_captured_test_is_compiled() {
    let dir = tests_dir().join("captured");
    let list = std::fs::read_to_string(dir.join("mod.rs")).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_str().unwrap();
        if path.extension().is_some_and(|e| e == "rs") && stem != "mod" {
            assert!(
                list.lines().any(|l| l == format!("mod {stem};")),
                "{} is not in captured/mod.rs, so it never runs",
                path.display()
            );
        }
    }
}
