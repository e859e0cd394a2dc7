//! The operator's documents against the program: every `llmgw …` command
//! line in a shell block of the docs and the README names a command that
//! exists and only options that command takes, so a renamed flag cannot
//! leave a guide that fails when followed.

use clap::CommandFactory;

const PAGES: &[(&str, &str)] = &[
    ("README.md", include_str!("../../README.md")),
    ("docs/install.md", include_str!("../../docs/install.md")),
    (
        "docs/operations.md",
        include_str!("../../docs/operations.md"),
    ),
    ("docs/cluster.md", include_str!("../../docs/cluster.md")),
    ("docs/mirror.md", include_str!("../../docs/mirror.md")),
    ("docs/tenancy.md", include_str!("../../docs/tenancy.md")),
    ("docs/people.md", include_str!("../../docs/people.md")),
    (
        "docs/event-store.md",
        include_str!("../../docs/event-store.md"),
    ),
    ("deploy/README.md", include_str!("../../deploy/README.md")),
    (
        "replay-tests/fixtures/README.md",
        include_str!("../../replay-tests/fixtures/README.md"),
    ),
];

/// The `llmgw` command lines of a page's ```sh blocks, continuation lines
/// joined, comments dropped.
fn command_lines(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in page.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_sh = !in_sh && (t == "```sh" || t == "```bash");
            continue;
        }
        if !in_sh {
            continue;
        }
        let code = t.split(" #").next().unwrap_or_default().trim_end();
        if let Some(head) = code.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(code);
        let whole = std::mem::take(&mut pending);
        // Every `llmgw` invocation on the line, after sudo, pipes or `&&`.
        for part in whole.split(['|', ';']).flat_map(|p| p.split("&&")) {
            let words: Vec<&str> = part.split_whitespace().collect();
            // `llmgw` as the command itself, perhaps after sudo or
            // variables, not as an argument (`createdb llmgw`).
            let start = words
                .iter()
                .position(|w| *w != "sudo" && !w.contains('='))
                .filter(|s| words[*s] == "llmgw");
            if let Some(s) = start {
                out.push(words[s..].join(" "));
            }
        }
    }
    out
}

/// What is wrong with one command line, if anything.
fn check(line: &str) -> Option<String> {
    let root = super::Cli::command();
    let mut cmd = &root;
    let mut globals: Vec<String> = root
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_owned))
        .collect();
    globals.extend(["help".into(), "version".into()]);
    let words = line.split_whitespace().skip(1);
    let mut expects_value = false;
    // `--auth [BOOL]`: a value only when the next word is not a flag.
    let mut value_optional = false;
    for w in words {
        if expects_value && !(value_optional && w.starts_with('-')) {
            expects_value = false;
            continue;
        }
        expects_value = false;
        if let Some(flag) = w.strip_prefix("--") {
            let name = flag.split('=').next().unwrap_or_default();
            let arg = cmd.get_arguments().find(|a| a.get_long() == Some(name));
            match arg {
                Some(a) => {
                    expects_value = !flag.contains('=') && a.get_action().takes_values();
                    value_optional = a.get_num_args().is_some_and(|n| n.min_values() == 0);
                }
                None if globals.iter().any(|g| g == name) => {
                    expects_value = !flag.contains('=') && name != "help" && name != "version";
                    value_optional = false;
                }
                None => return Some(format!("`{line}`: no option --{name}")),
            }
            continue;
        }
        if w.starts_with('-') || cmd.get_subcommands().next().is_none() {
            // A short flag or a positional value: nothing more to walk.
            continue;
        }
        match cmd.find_subcommand(w) {
            Some(sub) => cmd = sub,
            None if w.contains('|') || w.starts_with('[') => return None,
            None => return Some(format!("`{line}`: no command {w}")),
        }
    }
    None
}

#[test]
fn every_documented_command_line_exists() {
    let mut wrong = Vec::new();
    let mut seen = 0;
    for (name, page) in PAGES {
        for line in command_lines(page) {
            seen += 1;
            if let Some(why) = check(&line) {
                wrong.push(format!("{name}: {why}"));
            }
        }
    }
    assert!(seen > 40, "only {seen} command lines found");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_misspelt_flag_or_command_is_caught() {
    assert!(check("llmgw ctl status --jsn").is_some());
    assert!(check("llmgw ctl stats").is_some());
    assert!(check("llmgw --store x.db events verify --from 3").is_none());
    assert!(check("llmgw server init --admin a@b.c --host h").is_none());
}

/// docs/README.md is the way into the documents: every page under docs/
/// is in its index.
#[test]
fn every_page_is_in_the_docs_index() {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let index = std::fs::read_to_string(docs.join("README.md")).unwrap();
    let mut missing: Vec<String> = std::fs::read_dir(&docs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && n != "README.md")
        .filter(|n| !index.contains(&format!("]({n})")))
        .collect();
    missing.sort();
    assert!(missing.is_empty(), "not in docs/README.md: {missing:?}");
}
