//! Keys, limits, prices and usage through the shipped binary, in every
//! mode a user can configure: router-only and with a control plane, auth
//! on and off, SQLite and PostgreSQL, one server and two.

use std::process::Command;

use llmgw_testkit::{Backend, Scratch};
use serde_json::{Value, json};

use super::{Child, until};

/// A sim engine serving `paid` and `free`.
pub(super) fn engine() -> Child {
    Child::spawn(&[
        "sim-engine",
        "--listen",
        "127.0.0.1:0",
        "--model",
        "paid",
        "--model",
        "free",
        "--ttft-ms",
        "1",
        "--tps",
        "1000",
    ])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Static endpoints, no control plane.
    RouterOnly,
    /// A catalog (so the control plane leads) and the same static endpoint.
    Control,
}

/// A server configuration for `mode`; `extra` is appended as is.
pub(super) fn config(
    dir: &std::path::Path,
    name: &str,
    store: &str,
    engine: &str,
    mode: Mode,
    extra: &str,
) -> String {
    let mut text = format!(
        r#"listen: "127.0.0.1:0"
admin_listen: "127.0.0.1:0"
store: "{store}"
endpoints: ["e1=http://{engine}=paid,free"]
"#
    );
    if mode == Mode::Control {
        text.push_str(&format!(
            r#"agent_listen: "127.0.0.1:0"
control:
  instance: {name}
  interval: 200ms
  lease_ttl: 2s
  unreachable_after: 1s
  lost_after: 2500ms
models:
  - name: paid
    price: {{prompt_per_1k: 1000000, completion_per_1k: 1000000}}
    fallbacks: [free]
    scaling: {{min: 0, max: 1}}
    profiles: [{{name: sim, engine: sim}}]
  - name: free
    price: {{prompt_per_1k: 0, completion_per_1k: 0}}
    scaling: {{min: 0, max: 1}}
    profiles: [{{name: sim, engine: sim}}]
"#
        ));
    }
    text.push_str(extra);
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Waits until the server whose admin API is at `admin` leads.
pub(super) async fn leads(admin: &str) {
    until("the server to lead", || async {
        let v: Value = reqwest::get(format!("{admin}/api/v1/leader"))
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (v["is_leader"] == true).then_some(())
    })
    .await;
}

pub(super) struct Server {
    pub(super) child: Child,
    pub(super) base: String,
    pub(super) admin: String,
}

pub(super) fn start(config: &str) -> Server {
    let child = Child::spawn(&["server", "--config", config]);
    let base = format!("http://{}", child.addr_after("client listening on "));
    let admin = format!("http://{}", child.addr_after("admin listening on "));
    Server { child, base, admin }
}

/// `llmgw keys …` against `admin`, as operator `alice`.
pub(super) fn keys(store: &str, admin: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_remove("LLMGW_STORE")
        .env_remove("LLMGW_ADMIN")
        .args(["--store", store, "keys", "--admin", admin, "--as", "alice"])
        .args(args)
        .output()
        .unwrap()
}

pub(super) fn keys_ok(store: &str, admin: &str, args: &[&str]) -> String {
    let out = keys(store, admin, args);
    assert!(
        out.status.success(),
        "keys {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// What the servers of one test share: a sim engine and a directory for
/// their configurations, both kept while the stage lives.
pub(super) struct Stage {
    dir: tempfile::TempDir,
    engine: String,
    _engine: Child,
}

impl Stage {
    pub(super) fn new() -> Stage {
        let child = engine();
        Stage {
            dir: tempfile::tempdir().unwrap(),
            engine: child.addr_after("listening on "),
            _engine: child,
        }
    }

    /// Server `name` on `store` in `mode`, `extra` appended to its file.
    pub(super) fn start(&self, name: &str, store: &str, mode: Mode, extra: &str) -> Server {
        self.start_env(name, store, mode, extra, &[])
    }

    /// The same, with variables laid over its file.
    pub(super) fn start_env(
        &self,
        name: &str,
        store: &str,
        mode: Mode,
        extra: &str,
        env: &[(&str, String)],
    ) -> Server {
        let cfg = config(self.dir.path(), name, store, &self.engine, mode, extra);
        let child = Child::spawn_env(&["server", "--config", &cfg], env);
        let base = format!("http://{}", child.addr_after("client listening on "));
        let admin = format!("http://{}", child.addr_after("admin listening on "));
        Server { child, base, admin }
    }
}

/// Org `o`, team `t` and project `p`, the tree every key of these tests
/// is made in.
pub(super) fn tree(store: &str, admin: &str) {
    keys_ok(
        store,
        admin,
        &["init", "--org", "o", "--team", "t", "--project", "p"],
    );
}

async fn chat(base: &str, key: Option<&str>, model: &str) -> reqwest::Response {
    let mut r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": model, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hello there"}]}));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    r.send().await.unwrap()
}

async fn status_becomes(base: &str, key: Option<&str>, model: &str, want: u16) {
    until(&format!("{model} to answer {want}"), || async {
        (chat(base, key, model).await.status() == want).then_some(())
    })
    .await;
}

pub(super) fn new_key(store: &str, admin: &str, name: &str) -> (String, String) {
    let out = keys(store, admin, &["create", "--project", "p", "--name", name]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secret = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let err = String::from_utf8(out.stderr).unwrap();
    let id = err
        .split_whitespace()
        .find(|w| w.starts_with("key-"))
        .unwrap()
        .trim_end_matches(';')
        .to_owned();
    (secret, id)
}

/// The whole tenancy story with auth on, in one mode and on one backend.
async fn auth_on(mode: Mode, backend: Backend) {
    let (store, _scratch) = Scratch::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let extra = "auth:\n  enabled: true\n  flush_interval: 50ms\n  default_price: {prompt_per_1k: 1000000, completion_per_1k: 1000000}\n";
    let server = start(&config(dir.path(), "cp-a", &store, &e, mode, extra));
    let (base, admin) = (server.base.as_str(), server.admin.as_str());

    assert_eq!(
        chat(base, None, "paid").await.status(),
        401,
        "no key, no answer"
    );
    tree(&store, admin);
    let (secret, id) = new_key(&store, admin, "backend");
    status_becomes(base, Some(&secret), "free", 200).await;

    // Limits set with the CLI: the third request in a minute is refused.
    let (limited, limited_id) = new_key(&store, admin, "limited");
    keys_ok(
        &store,
        admin,
        &[
            "limits",
            "--scope",
            "key",
            "--id",
            &limited_id,
            "--rpm",
            "2",
        ],
    );
    let refused = until("the rpm limit to bind", || async {
        let r = chat(base, Some(&limited), "free").await;
        (r.status() == 429).then_some(r)
    })
    .await;
    assert!(refused.headers().contains_key("retry-after"));

    // A budget: once spent, a priced model falls back to a free one where
    // the catalog has one, else the key gets insufficient_quota. At a
    // micro-unit a token, one short request fits in it and a second does not.
    let (budgeted, budgeted_id) = budgeted_key(&store, admin);
    status_becomes(base, Some(&budgeted), "paid", 200).await;
    let answer = until("the budget to be spent", || async {
        let r = chat(base, Some(&budgeted), "paid").await;
        (r.status() != 200 || r.headers()["x-llmgw-served-model"] != "paid").then_some(r)
    })
    .await;
    match mode {
        Mode::Control => {
            assert_eq!(answer.status(), 200);
            assert_eq!(answer.headers()["x-llmgw-served-model"], "free");
        }
        Mode::RouterOnly => {
            // Every model is priced (the default price): nothing to fall back to.
            assert_eq!(answer.status(), 429);
            let body: Value = answer.json().await.unwrap();
            assert_eq!(body["error"]["code"], "insufficient_quota", "{body}");
            assert!(
                body["error"]["message"].as_str().unwrap().contains("key"),
                "{body}"
            );
        }
    }

    // /me agrees with the usage the log holds, once the views have read
    // all of it (usage is appended in batches, so the two converge).
    until("/me to agree with the log", || async {
        let r = reqwest::Client::new()
            .get(format!("{base}/me"))
            .bearer_auth(&budgeted)
            .send()
            .await
            .ok()?;
        let me: Value = r.json().await.ok()?;
        let log = super::ok(&store, &["events", "tail", "--limit", "1000", "--json"]);
        let cost: u64 = super::usage_rows_of(&super::json_lines(&log))
            .iter()
            .filter(|u| u["key_id"] == budgeted_id.as_str())
            .filter_map(|u| u["cost_micros"].as_u64())
            .sum();
        (cost > 0 && me.to_string().contains(&format!("\"spent_micros\":{cost}"))).then_some(())
    })
    .await;

    // What was set on each group reads back, with the spend the log holds.
    groups_read_back(&store, admin).await;

    // A rotation with a grace: both secrets open the gateway, the key's
    // id (its limits, its history) stays; one without ends every old one.
    let rotated = |grace: &[&str]| {
        let out = keys(&store, admin, &[&["rotate", id.as_str()], grace].concat());
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{said}");
        (
            String::from_utf8(out.stdout).unwrap().trim().to_owned(),
            said,
        )
    };
    let (second, said) = rotated(&["--grace", "1h"]);
    assert!(said.contains("the old one works until"), "{said}");
    status_becomes(base, Some(&second), "free", 200).await;
    assert_eq!(chat(base, Some(&secret), "free").await.status(), 200);
    let listed = keys_ok(&store, admin, &["list"]);
    assert!(listed.contains("old secret"), "{listed}");
    // The old secret's prefix, to tell the two apart.
    assert!(listed.contains(&secret[..12]), "{listed}");
    let (third, said) = rotated(&[]);
    assert!(said.contains("the old one no longer works"), "{said}");
    status_becomes(base, Some(&third), "free", 200).await;
    for old in [&secret, &second] {
        assert_eq!(chat(base, Some(old), "free").await.status(), 401);
    }
    // A key made to end says when.
    let out = keys(
        &store,
        admin,
        &[
            "create",
            "--project",
            "p",
            "--name",
            "demo",
            "--valid-for",
            "2h",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let listed = keys_ok(&store, admin, &["list", "--json"]);
    let demo: Vec<Value> = serde_json::from_str(&listed).unwrap();
    let demo = demo.iter().find(|k| k["name"] == "demo").unwrap();
    assert!(
        demo["expires_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{demo}"
    );
    // Its old secret works no longer than the key itself, and is said so.
    let out = keys(
        &store,
        admin,
        &["rotate", demo["key_id"].as_str().unwrap(), "--grace", "30d"],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!(
            "the old one works until {}",
            demo["expires_at"].as_str().unwrap()
        )),
        "{said}"
    );
    let out = keys(
        &store,
        admin,
        &[
            "create",
            "--project",
            "p",
            "--name",
            "typo",
            "--valid-for",
            "90s",
        ],
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a key works for 1 hour to 10 years"),
        "{out:?}"
    );

    // Who issued, limited and revoked the key is on the record, and so is
    // a refused command.
    keys_ok(
        &store,
        admin,
        &["limits", "--scope", "key", "--id", &id, "--tpm", "100000"],
    );
    // A limit of nothing is refused before anything is sent.
    let out = keys(
        &store,
        admin,
        &["limits", "--scope", "key", "--id", &id, "--rpm", "0"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a whole number in 1..=4294967295"),
        "{out:?}"
    );
    // With a catalog, an allowlist's typo is said: it locked the key out
    // of every model, with a 404 that hid why.
    if mode == Mode::Control {
        let said = keys_ok(
            &store,
            admin,
            &["limits", "--scope", "key", "--id", &id, "--models", "fre"],
        );
        assert!(
            said.contains("\"fre\" is no model or alias of the catalog"),
            "{said}"
        );
    }
    keys_ok(&store, admin, &["revoke", &id]);
    status_becomes(base, Some(&third), "free", 401).await;
    // Limits on a revoked key are refused by the decision, and recorded.
    let out = keys(
        &store,
        admin,
        &["limits", "--scope", "key", "--id", &id, "--rpm", "5"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is revoked"),
        "{out:?}"
    );
    let history = super::ok(&store, &["events", "log", "--key", &id]);
    for needle in [
        "KeyIssued",
        "LimitsSet",
        "KeyRotated",
        "KeyRevoked",
        "CommandRefused",
    ] {
        let row = history.lines().find(|l| l.contains(needle));
        assert!(
            row.is_some_and(|r| r.contains("alice")),
            "{needle} by alice in {history}"
        );
    }
    drop(server);
}

/// `keys groups` shows the limits set on a team, a project's threads and
/// memory, the live keys under each group and the spend the log holds
/// (every key of the test is in project `p`), and refuses an unknown group.
async fn groups_read_back(store: &str, admin: &str) {
    keys_ok(
        store,
        admin,
        &[
            "limits", "--scope", "team", "--id", "t", "--rpm", "600", "--budget", "7000000",
            "--period", "day",
        ],
    );
    keys_ok(store, admin, &["threads", "--project", "p", "--capture"]);
    keys_ok(
        store,
        admin,
        &["memory", "--project", "p", "--retain-hours", "48"],
    );
    let live = keys_ok(store, admin, &["list", "--json"]);
    let live: Vec<Value> = serde_json::from_str(&live).unwrap();
    let live = live.iter().filter(|k| k["state"] == "active").count();
    // The project's spend is this month's rows; its requests are all of them.
    let rows = until("the groups to show the log's spend", || async {
        let log = super::ok(store, &["events", "tail", "--limit", "1000", "--json"]);
        let used = super::usage_rows_of(&super::json_lines(&log));
        let month = chrono::Utc::now().format("%Y-%m").to_string();
        let this_month = |u: &&Value| {
            u["at"]
                .as_i64()
                .and_then(chrono::DateTime::from_timestamp_millis)
                .is_some_and(|at| at.format("%Y-%m").to_string() == month)
        };
        let cost: u64 = used
            .iter()
            .filter(this_month)
            .filter_map(|u| u["cost_micros"].as_u64())
            .sum();
        let rows: Value =
            serde_json::from_str(&keys_ok(store, admin, &["groups", "--json"])).ok()?;
        let project = &rows[2];
        (cost > 0 && project["spent_micros"] == cost && project["requests"] == used.len())
            .then_some(rows)
    })
    .await;
    let at = |i: usize, field: &str| rows[i][field].clone();
    let shape: Vec<String> = (0..3)
        .map(|i| format!("{} {}", at(i, "scope"), at(i, "id")))
        .collect();
    assert_eq!(shape, [r#""org" "o""#, r#""team" "t""#, r#""project" "p""#]);
    assert_eq!(rows.as_array().unwrap().len(), 3, "{rows}");
    assert_eq!(
        at(1, "limits"),
        json!({"rpm": 600, "budget_micros": 7000000, "period": "day"})
    );
    assert_eq!(at(1, "spent_period"), "day");
    assert_eq!(
        at(2, "threads"),
        json!({"capture": true, "retain_hours": 168})
    );
    assert_eq!(at(2, "memory_retain_hours"), 48);
    for i in 0..3 {
        assert_eq!(at(i, "keys"), live, "{rows}");
    }
    let table = keys_ok(store, admin, &["groups", "--project", "p"]);
    assert!(
        table.contains("project p") && table.contains("168h, replies") && table.contains("48h"),
        "{table}"
    );
    let out = keys(store, admin, &["groups", "--team", "nobody"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no team nobody"),
        "{out:?}"
    );
}

/// A new key named `budgeted` with a budget of 50,000 micro-units a day
/// (at the tests' 1,000 a token, one short request's estimate, 48 tokens
/// with its template's framing, fits it, and a second's does not after
/// the first's cost): its secret and id.
fn budgeted_key(store: &str, admin: &str) -> (String, String) {
    let (secret, id) = new_key(store, admin, "budgeted");
    keys_ok(
        store,
        admin,
        &[
            "limits", "--scope", "key", "--id", &id, "--budget", "50000", "--period", "day",
        ],
    );
    (secret, id)
}

/// With auth off nothing asks for a key, and usage is still recorded when
/// asked for.
async fn auth_off(mode: Mode, backend: Backend) {
    let (store, _scratch) = Scratch::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let server = start(&config(
        dir.path(),
        "cp-off",
        &store,
        &e,
        mode,
        "record_usage: true\nauth:\n  flush_interval: 50ms\n",
    ));
    assert_eq!(chat(&server.base, None, "paid").await.status(), 200);
    let r = chat(&server.base, None, "nope").await;
    assert_eq!(r.status(), 404);
    if mode == Mode::RouterOnly {
        // No control plane leads its store: `ctl` says what it talks to.
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["ctl", "--admin", &server.admin, "status"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("has no control plane (router-only mode)"),
            "{err}"
        );
    }
    until("the usage record", || async {
        let log = super::ok(&store, &["events", "stats", "--json"]);
        log.contains("UsageBatchRecorded").then_some(())
    })
    .await;
    drop(server);
}

/// The key's `/me`.
async fn me(base: &str, key: &str) -> Option<Value> {
    let r = reqwest::Client::new()
        .get(format!("{base}/me"))
        .bearer_auth(key)
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

/// What `/me` says the key's first budget has spent.
async fn spent(base: &str, key: &str) -> Option<u64> {
    me(base, key).await?["spend"][0]["spent_micros"].as_u64()
}

/// A flush an hour away does not let a key overshoot its budget at the
/// server serving it: the server's own spend that is not in the log yet
/// counts at once, and once its batch is in the log and read back, once.
async fn own_unflushed_spend_counts(backend: Backend) {
    let (store, _scratch) = Scratch::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let extra = "auth:\n  enabled: true\n  flush_interval: 1h\n  batch_size: 2\n  default_price: {prompt_per_1k: 1000000, completion_per_1k: 1000000}\n";
    let server = start(&config(
        dir.path(),
        "cp-a",
        &store,
        &e,
        Mode::RouterOnly,
        extra,
    ));
    let (base, admin) = (server.base.as_str(), server.admin.as_str());
    tree(&store, admin);
    let (budgeted, budgeted_id) = budgeted_key(&store, admin);
    until("the budget to be read", || spent(base, &budgeted)).await;

    // One short request fits in the budget and a second does not, with
    // nothing flushed: the batch holds two and the interval is an hour.
    assert_eq!(chat(base, Some(&budgeted), "paid").await.status(), 200);
    let refused = chat(base, Some(&budgeted), "paid").await;
    assert_eq!(refused.status(), 429);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "insufficient_quota", "{body}");
    let stats = super::ok(&store, &["events", "stats", "--json"]);
    assert!(
        !stats.contains("UsageBatchRecorded"),
        "nothing flushed: {stats}"
    );
    let pending = spent(base, &budgeted).await.unwrap();
    assert!(pending > 0, "its own unflushed spend counts");
    // What it used says the same, in one answer (it said the log's 0).
    let used = &me(base, &budgeted).await.unwrap()["used"];
    assert_eq!(
        (&used["day_micros"], &used["month_micros"]),
        (&json!(pending), &json!(pending)),
        "{used}"
    );

    // Another key's request fills the batch, which goes to the log.
    let (other, other_id) = new_key(&store, admin, "other");
    status_becomes(base, Some(&other), "paid", 200).await;
    let logged = until("the batch in the log", || async {
        let log = super::ok(&store, &["events", "tail", "--limit", "1000", "--json"]);
        let rows = super::usage_rows_of(&super::json_lines(&log));
        rows.iter()
            .find(|u| u["key_id"] == budgeted_id.as_str())
            .and_then(|u| u["cost_micros"].as_u64())
    })
    .await;
    assert_eq!(logged, pending, "priced alike before and after the flush");
    // An event after the batch: once the views show it, they hold the batch.
    keys_ok(
        &store,
        admin,
        &[
            "limits", "--scope", "key", "--id", &other_id, "--rpm", "1000",
        ],
    );
    until("the views to pass the batch", || async {
        let rates = me(base, &other).await?["limits"]["rates"].to_string();
        rates.contains("\"rpm\":1000").then_some(())
    })
    .await;
    let now = spent(base, &budgeted).await.unwrap();
    assert_eq!(now, logged, "the flushed batch counts once");
    let used = &me(base, &budgeted).await.unwrap()["used"];
    assert_eq!(used["month_micros"], json!(logged), "once: {used}");
    assert_eq!(chat(base, Some(&budgeted), "paid").await.status(), 429);
    drop(server);
}

/// A stop (SIGTERM) waits for a log that stalls for longer than its lock
/// timeout to take the usage still queued: it waited 5 s and dropped
/// it, so one slow append at a stop lost the records for good (and their
/// spend for the budgets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_waits_for_a_stalled_log_to_take_its_usage() {
    use sqlx::{Connection, Executor};
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let extra = "auth:\n  enabled: true\n  flush_interval: 1h\n";
    let mut server = start(&config(
        dir.path(),
        "gw-a",
        &store,
        &e,
        Mode::RouterOnly,
        extra,
    ));
    // Its start says which log it keeps.
    let serving = Child::expect(&server.child.stderr, "serving");
    assert!(serving.contains(&format!("store={store}")), "{serving}");
    tree(&store, &server.admin);
    let (key, key_id) = new_key(&store, &server.admin, "k");
    for _ in 0..3 {
        assert_eq!(chat(&server.base, Some(&key), "paid").await.status(), 200);
    }
    // Every append waits on this lock, and gives up at the store's lock
    // timeout.
    let mut pg = sqlx::PgConnection::connect(&store).await.unwrap();
    pg.execute("BEGIN").await.unwrap();
    pg.execute("LOCK TABLE es_events IN EXCLUSIVE MODE")
        .await
        .unwrap();
    server.child.terminate();
    Child::expect(
        &server.child.stderr,
        "waiting for the log to take the usage",
    );
    Child::expect(&server.child.stderr, "cannot append usage");
    pg.execute("COMMIT").await.unwrap();
    let stopped = server.child.process.wait().unwrap();
    assert!(stopped.success(), "{stopped:?}");
    let log = super::ok(&store, &["events", "tail", "--limit", "1000", "--json"]);
    let rows = super::usage_rows_of(&super::json_lines(&log));
    assert_eq!(
        rows.iter()
            .filter(|u| u["key_id"] == key_id.as_str())
            .count(),
        3,
        "{log}"
    );
}

/// A request whose usage record the full queue loses says so on its
/// access line, with no usage id: the id named a row an auditor then
/// looked for in vain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_usage_record_is_said_on_the_access_line() {
    use sqlx::{Connection, Executor};
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let extra = "auth:\n  enabled: true\n  flush_interval: 1h\n  buffer_size: 2\n";
    let server = start(&config(
        dir.path(),
        "gw-a",
        &store,
        &e,
        Mode::RouterOnly,
        extra,
    ));
    tree(&store, &server.admin);
    let (key, _) = new_key(&store, &server.admin, "k");
    // Appends wait on this lock: the batcher holds the first record, the
    // queue's two places fill, and the next record has nowhere to go.
    let mut pg = sqlx::PgConnection::connect(&store).await.unwrap();
    pg.execute("BEGIN").await.unwrap();
    pg.execute("LOCK TABLE es_events IN EXCLUSIVE MODE")
        .await
        .unwrap();
    for _ in 0..5 {
        assert_eq!(chat(&server.base, Some(&key), "paid").await.status(), 200);
    }
    let lost = Child::expect(&server.child.stderr, "usage_lost=true");
    assert!(!lost.contains("usage_id="), "{lost}");
    pg.execute("COMMIT").await.unwrap();
}

macro_rules! cells {
    ($($name:ident => $body:expr),* $(,)?) => {
        $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { $body.await } )*
    };
}

cells!(
    router_only_with_auth_on_sqlite => auth_on(Mode::RouterOnly, Backend::Sqlite),
    router_only_with_auth_on_postgres => auth_on(Mode::RouterOnly, Backend::Postgres),
    control_plane_with_auth_on_sqlite => auth_on(Mode::Control, Backend::Sqlite),
    control_plane_with_auth_on_postgres => auth_on(Mode::Control, Backend::Postgres),
    router_only_with_auth_off => auth_off(Mode::RouterOnly, Backend::Sqlite),
    control_plane_with_auth_off => auth_off(Mode::Control, Backend::Postgres),
    own_unflushed_spend_counts_on_sqlite => own_unflushed_spend_counts(Backend::Sqlite),
    own_unflushed_spend_counts_on_postgres => own_unflushed_spend_counts(Backend::Postgres),
);

/// The first key in the log was written by the leader, cp-a, for alice.
fn issued_by_the_leader_for_alice(store: &str) {
    let history = super::ok(store, &["events", "tail", "--limit", "100", "--json"]);
    let issued = super::json_lines(&history)
        .into_iter()
        .find(|e| e["event_type"] == "KeyIssued")
        .unwrap();
    assert_eq!(
        (&issued["metadata"]["writer"], &issued["metadata"]["actor"]),
        (&json!("cp-a"), &json!("alice")),
        "the leader wrote it for alice: {issued}"
    );
}

/// Two servers on one PostgreSQL: a key made through the standby lands via
/// the leader and works on both; with the leader killed, the next key is
/// made once the standby leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_forwards_key_commands_to_the_leader_and_takes_over() {
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let stage = Stage::new();
    let mut a = stage.start("cp-a", &store, Mode::Control, "auth: true\n");
    leads(&a.admin).await;
    let b = stage.start("cp-b", &store, Mode::Control, "auth: true\n");
    tree(&store, &b.admin);
    let (secret, _) = new_key(&store, &b.admin, "via-standby");
    status_becomes(&a.base, Some(&secret), "free", 200).await;
    status_becomes(&b.base, Some(&secret), "free", 200).await;
    issued_by_the_leader_for_alice(&store);

    a.child.process.kill().unwrap();
    let _ = a.child.process.wait();
    let (later, _) = until("the standby to take over key commands", || async {
        let out = keys(
            &store,
            &b.admin,
            &["create", "--project", "p", "--name", "after"],
        );
        out.status.success().then(|| {
            let s = String::from_utf8(out.stdout).unwrap().trim().to_owned();
            (s, ())
        })
    })
    .await;
    status_becomes(&b.base, Some(&later), "free", 200).await;
}

/// A router-only server on a store that a control plane leads sends the
/// key commands it cannot decide on to the leader, as a standby does: the
/// key is the leader's write and works on both servers. The CLI with no
/// server at `--admin` does the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_only_server_sends_key_commands_to_the_leader() {
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let stage = Stage::new();
    let a = stage.start("cp-a", &store, Mode::Control, "auth: true\n");
    leads(&a.admin).await;
    let router = stage.start("router", &store, Mode::RouterOnly, "auth: true\n");
    tree(&store, &router.admin);
    let (secret, _) = new_key(&store, &router.admin, "via-router");
    status_becomes(&router.base, Some(&secret), "free", 200).await;
    status_becomes(&a.base, Some(&secret), "free", 200).await;
    issued_by_the_leader_for_alice(&store);
    // So does the CLI when nothing answers at its --admin: it finds the
    // leader's admin address in the log.
    let nobody = format!("http://127.0.0.1:{}", super::cluster::free_port());
    let out = keys(
        &store,
        &nobody,
        &["create", "--project", "p", "--name", "via-cli"],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!("sent to the leader cp-a at {}", a.admin)),
        "the CLI says where the command went: {said}"
    );
    let secret = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    status_becomes(&a.base, Some(&secret), "free", 200).await;
    // The control plane's own commands go to the leader too, reads and
    // writes, and say where they were answered.
    let ctl = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["ctl", "--admin", &router.admin])
            .args(args)
            .output()
            .unwrap()
    };
    let models = ctl(&["models", "--json"]);
    let listed = String::from_utf8_lossy(&models.stdout);
    assert!(models.status.success(), "{models:?}");
    assert!(
        listed.contains("paid") && listed.contains("free"),
        "{listed}"
    );
    assert!(
        String::from_utf8_lossy(&models.stderr).contains("answered by the leader cp-a"),
        "{models:?}"
    );
    let leader = ctl(&["leader"]);
    assert!(
        String::from_utf8_lossy(&leader.stdout).contains("cp-a"),
        "{leader:?}"
    );
    // A refusal is the leader's, answered as it is.
    let out = keys(
        &store,
        &router.admin,
        &["create", "--project", "nowhere", "--name", "k"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nowhere"), "{err}");
}

/// A leader that recorded an address where it does not answer (here: the
/// router-only server's own, as a loopback default seen from another
/// machine would be) gets a refusal that names the address and the
/// setting, not the router's own "the leader leads".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_address_that_reaches_no_leader_is_named() {
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let stage = Stage::new();
    let port = super::cluster::free_port();
    let misrecorded = format!("http://127.0.0.1:{port}");
    let a = stage.start_env(
        "cp-a",
        &store,
        Mode::Control,
        "auth: true\n",
        &[("LLMGW_CONTROL__ADVERTISE_ADMIN", misrecorded.clone())],
    );
    leads(&a.admin).await;
    let router = stage.start_env(
        "router",
        &store,
        Mode::RouterOnly,
        "auth: true\n",
        &[("LLMGW_ADMIN_LISTEN", format!("127.0.0.1:{port}"))],
    );
    let router_admin = router.admin.clone();
    assert_eq!(router_admin, misrecorded);
    let out = keys(
        &store,
        &router_admin,
        &["init", "--org", "o", "--team", "t", "--project", "p"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("recorded its admin address as {misrecorded}"))
            && err.contains("control.advertise_admin"),
        "{err}"
    );
}

/// A router-only server on a store a control plane led: with none leading
/// for a moment (here: its leader gone, its lease run out), ctl is told
/// that, not that the server is in router-only mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_between_leaders_does_not_say_router_only() {
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let stage = Stage::new();
    let a = stage.start("cp-a", &store, Mode::Control, "auth: true\n");
    leads(&a.admin).await;
    let router = stage.start("router", &store, Mode::RouterOnly, "auth: true\n");
    drop(a);
    let said = until("the lease to run out", || async {
        let (ok, _, err) = super::cluster::ctl(&router.admin, &["status"]);
        (!ok && err.contains("no control plane leads this store now")).then_some(err)
    })
    .await;
    assert!(!said.contains("router-only mode"), "{said}");
}

/// The same through a standby: the leader recorded the standby's own
/// address, so the standby's forward comes back to it. It does not answer
/// it as the leader would (nor wait for a leader as if one were taking
/// office); it names the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_whose_forward_comes_back_to_it_names_the_setting() {
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let stage = Stage::new();
    let port = super::cluster::free_port();
    let misrecorded = format!("http://127.0.0.1:{port}");
    let a = stage.start_env(
        "cp-a",
        &store,
        Mode::Control,
        "auth: true\n",
        &[("LLMGW_CONTROL__ADVERTISE_ADMIN", misrecorded.clone())],
    );
    leads(&a.admin).await;
    let b = stage.start_env(
        "cp-b",
        &store,
        Mode::Control,
        "auth: true\n",
        &[
            ("LLMGW_ADMIN_LISTEN", format!("127.0.0.1:{port}")),
            ("LLMGW_CONTROL__LOST_AFTER", "45s".into()),
        ],
    );
    // The leader's loopback admin address is said as the standby stands
    // by, and so is a setting it would run the fleet with otherwise, with
    // both values.
    let said = Child::expect(&b.child.stderr, "recorded this server's own admin address");
    assert!(said.contains("control.advertise_admin"), "{said}");
    let said = Child::expect(&b.child.stderr, "control settings differ");
    assert!(
        said.contains("lost_after_ms: 45000 here, 2500 at the leader"),
        "{said}"
    );
    let out = keys(
        &store,
        &b.admin,
        &["init", "--org", "o", "--team", "t", "--project", "p"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // Said at once: no wait for a leader mends an address that loops.
    // The other case it may be (this server's own run before a restart,
    // whose lease runs out) is said too, with when.
    assert!(
        err.contains("reaches this server itself") && err.contains("control.advertise_admin"),
        "{err}"
    );
    assert!(
        err.contains("this server before a restart") && err.contains("lease runs out in"),
        "{err}"
    );
}

/// With `admin_token`, every admin request but `/health` carries the
/// token: `keys` (and `ctl`) send `LLMGW_ADMIN_TOKEN`, a browser its Basic
/// password, and a standby forwarding a command to the leader its own.
/// Two servers on PostgreSQL, the token read from a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_token_guards_the_admin_api_and_goes_with_forwards() {
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let stage = Stage::new();
    let token = "0123456789abcdef0123456789abcdef";
    let file = stage.dir.path().join("admin-token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let setting = format!("auth: true\nadmin_token: \"@{}\"\n", file.display());
    let a = stage.start("cp-a", &store, Mode::Control, &setting);
    let http = reqwest::Client::new();
    let leader = format!("{}/api/v1/leader", a.admin);
    until("the server to lead", || async {
        let r = http.get(&leader).bearer_auth(token).send().await.ok()?;
        let v: Value = r.json().await.ok()?;
        (v["is_leader"] == true).then_some(())
    })
    .await;
    let b = stage.start("cp-b", &store, Mode::Control, &setting);

    // Without it: 401, saying what to send; a wrong one is told apart.
    let r = http.get(&leader).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(
        r.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Basic")
    );
    let said: Value = r.json().await.unwrap();
    assert!(
        said["error"]
            .as_str()
            .unwrap()
            .contains("LLMGW_ADMIN_TOKEN"),
        "{said}"
    );
    let r = http
        .get(&leader)
        .bearer_auth("not-the-token-0123456789")
        .send()
        .await
        .unwrap();
    let said: Value = r.json().await.unwrap();
    assert!(
        said["error"]
            .as_str()
            .unwrap()
            .contains("is not this admin API's"),
        "{said}"
    );
    // A balancer's look needs nothing; a browser's Basic password will do.
    let health = http
        .get(format!("{}/health", a.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let r = http
        .get(&leader)
        .basic_auth("me", Some(token))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // keys through the standby, which forwards to the leader with its own
    // token: refused without the operator's, done with it.
    let init = ["init", "--org", "o", "--team", "t", "--project", "p"];
    let out = keys(&store, &b.admin, &init);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("LLMGW_ADMIN_TOKEN"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_remove("LLMGW_STORE")
        .env("LLMGW_ADMIN_TOKEN", format!("@{}", file.display()))
        .args([
            "--store", &store, "keys", "--admin", &b.admin, "--as", "alice",
        ])
        .args(init)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Decided by the leader: the standby sent it on with its own token.
    assert!(out.status.success(), "{err}");
}

/// Two `keys create` for one name at once: exactly one wins, through a
/// server and with none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_creates_of_one_name_make_one_key() {
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let closed = format!("http://127.0.0.1:{}", super::cluster::free_port());
    tree(&store, &closed);
    let race = |admin: String, name: &'static str| {
        let store = store.clone();
        let spawn = move || {
            let (store, admin) = (store.clone(), admin.clone());
            std::thread::spawn(move || {
                keys(
                    &store,
                    &admin,
                    &["create", "--project", "p", "--name", name],
                )
            })
        };
        let (x, y) = (spawn(), spawn());
        [x.join().unwrap(), y.join().unwrap()]
    };
    let offline = race(closed.clone(), "same");
    let wins = offline.iter().filter(|o| o.status.success()).count();
    assert_eq!(wins, 1, "{offline:?}");
    let loser = offline.iter().find(|o| !o.status.success()).unwrap();
    assert!(String::from_utf8_lossy(&loser.stderr).contains("already has a key named same"));

    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let server = start(&config(
        dir.path(),
        "cp-a",
        &store,
        &e,
        Mode::Control,
        "auth: true\n",
    ));
    let online = race(server.admin.clone(), "twin");
    assert_eq!(
        online.iter().filter(|o| o.status.success()).count(),
        1,
        "{online:?}"
    );
    let list = keys_ok(&store, &server.admin, &["list", "--json"]);
    assert_eq!(list.matches("\"name\":\"twin\"").count(), 1, "{list}");
    // --offline while the server leads: refused, and the error says why
    // (the admin API did answer).
    let forced = keys(
        &store,
        &server.admin,
        &["create", "--offline", "--project", "p", "--name", "forced"],
    );
    let err = String::from_utf8_lossy(&forced.stderr);
    assert!(!forced.status.success());
    assert!(
        err.contains("--offline writes only while no server holds the lease"),
        "{err}"
    );
}

/// `keys --store S` with a server answering at the ambient admin address
/// (LLMGW_ADMIN, or the default) on another log: the key lands in S, not
/// in that server's log. With --admin on the command line too, the server
/// is asked, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_on_the_command_line_is_where_keys_go_whatever_answers_nearby() {
    let stage = Stage::new();
    let dir = tempfile::tempdir().unwrap();
    let served = format!("sqlite://{}", dir.path().join("served.db").display());
    let other = format!("sqlite://{}", dir.path().join("other.db").display());
    let server = stage.start("near", &served, Mode::RouterOnly, "auth: true\n");
    let closed = format!("http://127.0.0.1:{}", super::cluster::free_port());
    tree(&other, &closed);
    let ambient = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .env("LLMGW_ADMIN", &server.admin)
            .args(["--store", other.as_str(), "keys"])
            .args(args)
            .output()
            .unwrap()
    };
    let made = ambient(&["create", "--project", "p", "--name", "elsewhere"]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let listed = keys_ok(&other, &closed, &["list", "--json"]);
    assert!(listed.contains("\"name\":\"elsewhere\""), "{listed}");
    // With nothing at --admin, the log used instead is named: a mistyped
    // address or a stopped server is not answered for quietly.
    let said = keys(&other, &closed, &["list"]);
    let said = String::from_utf8_lossy(&said.stderr);
    assert!(
        said.contains(&format!(
            "nothing answers at {closed}: using the log at sqlite://"
        )) && said.contains("(--store)"),
        "{said}"
    );
    // Named by the variable, it says so (it said --store, which was not
    // given).
    let by_variable = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env("LLMGW_STORE", &other)
        .args(["keys", "list", "--admin", closed.as_str()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&by_variable.stderr);
    assert!(
        by_variable.status.success() && said.contains(&format!("{other} (LLMGW_STORE)")),
        "{said}"
    );
    let near = keys_ok(&served, &server.admin, &["list", "--json"]);
    assert!(!near.contains("elsewhere"), "{near}");
    // Nothing at --admin and no log named: no empty ./llmgw.db is made
    // and answered from, as if the cluster had no keys.
    let here = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .current_dir(here.path())
        .env_remove("LLMGW_STORE")
        .env_remove("LLMGW_ADMIN")
        .args(["keys", "list", "--admin", closed.as_str()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "nothing answers at {closed} and there is no log at sqlite://"
        )),
        "{said}"
    );
    assert!(!here.path().join("llmgw.db").exists());
    // Nor does the first `keys init` start a log of its own when the
    // server it names does not answer (a mistyped --admin, here or in
    // LLMGW_ADMIN): no server would read it.
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
    for (flag, env) in [(true, None), (false, Some(closed.as_str()))] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_llmgw"));
        c.current_dir(here.path())
            .env_remove("LLMGW_STORE")
            .args(init);
        match env {
            Some(a) => c.env("LLMGW_ADMIN", a),
            None => c.env_remove("LLMGW_ADMIN"),
        };
        if flag {
            c.args(["--admin", closed.as_str()]);
        }
        let out = c.output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{said}");
        assert!(said.contains("and there is no log at sqlite://"), "{said}");
        assert!(!here.path().join("llmgw.db").exists());
    }
}

/// A setting a mode cannot honour stops the start with one line.
#[test]
fn settings_a_mode_cannot_honour_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());
    let cases = [
        (
            "agent_listen: \"127.0.0.1:0\"\n",
            "agent_listen needs the control plane",
        ),
        ("tls: {ca: a, cert: b, key: c}\n", "tls"),
        (
            "agent_plaintext: true\n",
            "agent_plaintext needs the control plane",
        ),
        (
            "control: {lease_ttl: 5s}\n",
            "control.lease_ttl needs the control plane",
        ),
        (
            "auth: {flush_interval: 1s}\n",
            "auth.flush_interval applies only when usage is recorded",
        ),
        (
            "auth: true\nadmission: {default_band: bronze}\n",
            "admission.default_band applies only with auth off",
        ),
        (
            "auth: {enabled: true, batch_size: 100001}\n",
            "auth.batch_size is at most 100000",
        ),
        ("router: {retires: 2}\n", "unknown field `retires`"),
        (
            "router: {on_demand_wait: 30s}\n",
            "router.on_demand_wait needs the control plane",
        ),
        (
            "mirror: {url: \"http://models.internal:8081\"}\n",
            "mirror needs the control plane",
        ),
        (
            "router: {prefix: {match_ratio: 2}}\n",
            "router.prefix.match_ratio",
        ),
        (
            "models:\n  - name: m\n    profiles: [{name: p, engine: sim, gpu_clas: x}]\n",
            "unknown field `gpu_clas` in models.0.profiles.0",
        ),
        // Settings under a switch that is off.
        (
            "router: {prefix: {enabled: false, ttl: 1h}}\n",
            "router.prefix.ttl applies only with prefix routing on",
        ),
        (
            "router: {session_header: x-conv, prefix: {enabled: false}}\n",
            "router.session_header applies only with prefix routing on",
        ),
        (
            "admission: {enabled: false, max_wait: 60s}\n",
            "admission.max_wait applies only with admission on",
        ),
        (
            "connections: {max: {metrics: 1}}\n",
            "connections.max.metrics applies only with a metrics listener",
        ),
        (
            "threads: {retain_hours: 24, capture: false}\nconversations: {capture_max_bytes: 10}\n",
            "conversations.capture_max_bytes applies only where replies are captured",
        ),
        (
            "fallbacks: {piad: [free]}\n",
            "fallbacks: \"piad\" is served by no endpoint",
        ),
        (
            "conversations: {default_context: 100}\n",
            "conversations.default_context applies only where conversations are kept",
        ),
        (
            "landing: {base_url: \"https://llm.example.com/v1/\"}\n",
            "without /v1 or another path",
        ),
        (
            "admission: {kv_ceiling: 0}\n",
            "admission.kv_ceiling: 0 would count every engine as full",
        ),
        // Taken and never honoured: below a block, and at 1 or below.
        (
            "router: {prefix: {min_match: 1}}\n",
            "router.prefix.min_match: 1 is below 64",
        ),
        (
            "router: {prefix: {balance_rel: 0.5}}\n",
            "router.prefix.balance_rel: 0.5 must be above 1",
        ),
    ];
    for (extra, says) in cases {
        let path = config(
            dir.path(),
            "bad",
            &store,
            "127.0.0.1:9",
            Mode::RouterOnly,
            extra,
        );
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["server", "--config", &path])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra}: {err}");
        assert!(err.contains(says), "expected {says:?} for {extra:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// A catalog alias that is the name an endpoint serves would take the
/// endpoint's requests (or, now that the endpoint wins, be dead): refused
/// at start, naming both.
#[test]
fn an_alias_that_is_an_endpoints_model_is_refused_at_start() {
    let alias = "  - name: b\n    aliases: [m1]\n    scaling: {min: 0, max: 1}\n    profiles: [{name: sim, engine: sim}]\n";
    let (code, out) = check_in(
        Mode::Control,
        alias,
        &[],
        &["--endpoint", "e2=http://127.0.0.1:9=m1"],
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("models: b's alias \"m1\" is the model endpoint e2 serves"),
        "{out}"
    );
    let (code, out) = check_in(Mode::Control, alias, &[], &[]);
    assert_eq!(code, Some(0), "no endpoint serves m1: {out}");
    // A fallback to a name nothing knows is taken (the catalog may grow)
    // but said: most often a typo.
    let (code, out) = check_in(Mode::Control, "fallbacks: {paid: [fre]}\n", &[], &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("fallbacks name \"fre\", which is no model of the file's catalog"),
        "{out}"
    );
}

/// `--check` of a router-only file with `extra` under `env` and `args`:
/// its exit status and what it printed.
fn check_with(extra: &str, env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String) {
    check_in(Mode::RouterOnly, extra, env, args)
}

/// As [`check_with`], of a file for `mode`.
fn check_in(mode: Mode, extra: &str, env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());
    let path = config(dir.path(), "c", &store, "127.0.0.1:9", mode, extra);
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_remove("LLMGW_AUTH")
        .env_remove("LLMGW_RECORD_USAGE")
        .envs(env.iter().copied())
        .args(["server", "--config", &path, "--check"])
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Without `tls:` nothing identifies an agent, so a plaintext agent
/// listener off loopback is refused unless `agent_plaintext` (the key, the
/// flag or the variable) says the network is trusted; with `tls:` the
/// opt-in is refused as contradictory.
#[test]
fn a_plaintext_agent_listener_off_loopback_needs_agent_plaintext() {
    let everywhere = [("LLMGW_AGENT_LISTEN", "0.0.0.0:0")];
    let (code, out) = check_in(Mode::Control, "", &everywhere, &[]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("agent_listen 0.0.0.0:0 is off loopback without tls")
            && out.contains("agent_plaintext: true"),
        "{out}"
    );
    let (code, out) = check_in(Mode::Control, "", &[("LLMGW_AGENT_LISTEN", "[::1]:0")], &[]);
    assert_eq!(code, Some(0), "loopback needs no opt-in: {out}");
    for (extra, env, args) in [
        ("agent_plaintext: true\n", &everywhere[..], &[][..]),
        (
            "",
            &[everywhere[0], ("LLMGW_AGENT_PLAINTEXT", "true")][..],
            &[][..],
        ),
        ("", &everywhere[..], &["--agent-plaintext"][..]),
    ] {
        let (code, out) = check_in(Mode::Control, extra, env, args);
        assert_eq!(code, Some(0), "{extra:?} {env:?} {args:?}: {out}");
        assert!(out.contains("control plane, no keys"), "{out}");
    }
    // The flag wins over the file, `false` too.
    let (code, out) = check_in(
        Mode::Control,
        "agent_plaintext: true\n",
        &everywhere,
        &["--agent-plaintext=false"],
    );
    assert_eq!(code, Some(2), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().to_str().unwrap();
    super::authority_and(pki, &["issue-server", "cp", "--host", "127.0.0.1"]);
    let tls = format!("tls: {{ca: {pki}/ca.pem, cert: {pki}/cp.pem, key: {pki}/cp-key.pem}}\n");
    let (code, out) = check_in(Mode::Control, &tls, &everywhere, &[]);
    assert_eq!(code, Some(0), "mutual TLS anywhere: {out}");
    let (code, out) = check_in(
        Mode::Control,
        &format!("{tls}agent_plaintext: true\n"),
        &everywhere,
        &[],
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("agent_plaintext with tls"), "{out}");
}

/// Without a token the admin API has no authentication: off loopback
/// (every interface too) it is refused unless `admin_open` (key, flag or
/// variable) says a firewall keeps it to the servers and operators, or
/// `admin_token` guards it; said on loopback, the opt-in is refused as
/// doing nothing.
#[test]
fn an_admin_listener_off_loopback_needs_admin_open() {
    for mode in [Mode::RouterOnly, Mode::Control] {
        let everywhere = [("LLMGW_ADMIN_LISTEN", ":0")];
        let (code, out) = check_in(mode, "", &everywhere, &[]);
        assert_eq!(code, Some(2), "{out}");
        assert!(
            out.contains("admin_listen 0.0.0.0:0 is off loopback")
                && out.contains("admin_open: true"),
            "{out}"
        );
        assert!(out.contains("set admin_token"), "{out}");
        // A token guards it as well: no admin_open needed then. One too
        // short to be secret is refused, with how to make one.
        let token = ("LLMGW_ADMIN_TOKEN", "0123456789abcdef0123");
        for (extra, env, args) in [
            ("admin_open: true\n", &everywhere[..], &[][..]),
            ("", &[everywhere[0], ("LLMGW_ADMIN_OPEN", "1")][..], &[][..]),
            ("", &everywhere[..], &["--admin-open"][..]),
            ("", &[everywhere[0], token][..], &[][..]),
        ] {
            let (code, out) = check_in(mode, extra, env, args);
            assert_eq!(code, Some(0), "{extra:?} {env:?} {args:?}: {out}");
        }
        let (code, out) = check_in(mode, "admin_token: short\n", &everywhere, &[]);
        assert_eq!(code, Some(2), "{out}");
        assert!(out.contains("openssl rand"), "{out}");
        let (code, out) = check_in(mode, "admin_open: true\n", &[], &[]);
        assert_eq!(code, Some(2), "{out}");
        assert!(
            out.contains("admin_open applies only with admin_listen off loopback"),
            "{out}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["up", "--admin-listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is off loopback"),
        "{err}"
    );
}

/// `ctl status` is wanted most in an incident: with the store unreachable
/// it failed outright, though the server held its views. It answers from
/// them now, and says the store cannot be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_status_answers_from_the_views_while_the_store_cannot_be_read() {
    use sqlx::{Connection, Executor};
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let server = start(&config(dir.path(), "cp-s", &store, &e, Mode::Control, ""));
    leads(&server.admin).await;
    let db = store.rsplit('/').next().unwrap().to_owned();
    let mut pg = sqlx::PgConnection::connect(&llmgw_testkit::admin_url())
        .await
        .unwrap();
    let closed = |allow: bool| format!("ALTER DATABASE {db} ALLOW_CONNECTIONS {allow}");
    pg.execute(closed(false).as_str()).await.unwrap();
    pg.execute(
        format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'")
            .as_str(),
    )
    .await
    .unwrap();
    // Said, and exit 1: a script checking the status sees it.
    let said = until("status to say the store cannot be read", || async {
        let (ok, out, _) = super::cluster::ctl(&server.admin, &["status"]);
        (!ok && out.contains("store     cannot be read")).then_some(out)
    })
    .await;
    assert!(said.contains("models serving"), "{said}");
    assert!(said.contains("this server's views, at"), "{said}");
    // No head to work a lag out from: none, not the views' own position.
    let (_, json, _) = super::cluster::ctl(&server.admin, &["status", "--json"]);
    let json: Value = serde_json::from_str(&json).unwrap();
    assert!(
        json["log_head"].is_null() && json["store_error"].is_string(),
        "{json}"
    );
    pg.execute(closed(true).as_str()).await.unwrap();
    drop(server);
}

/// `--check` reaches a PostgreSQL store as the start would: a database
/// that is not there was "configuration ok" and then a start that failed
/// before binding. Nothing is made in one that is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reaches_a_postgres_store_and_makes_nothing_there() {
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let missing = llmgw_testkit::with_database(
        &llmgw_testkit::admin_url(),
        &format!("llmgw_none_{}", std::process::id()),
    );
    let check = |store: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .args(["server", "--check", "--auth", "--store", store])
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
    let (code, said) = check(&missing);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("does not exist"), "{said}");
    let (code, said) = check(&store);
    assert_eq!(code, Some(0), "{said}");
    let read = super::llmgw(&store, &["events", "tail"]);
    let said = String::from_utf8_lossy(&read.stderr);
    assert!(
        said.contains("has no llmgw schema yet"),
        "not migrated: {said}"
    );
}

/// `llmgw up` builds its server from its flags: a variable that sets a
/// server, an agent or the store is refused, not passed over (auth was
/// off and the listener elsewhere than the variables said), and a typo of
/// one is named; the admin token and the log format are read.
#[test]
fn up_refuses_the_settings_of_a_server_it_does_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let up = |var: (&str, &str)| {
        let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env(var.0, var.1)
            // Refused before anything listens, whatever the ports.
            .args(["up", "--admin-listen", "0.0.0.0:0", "--data-dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    for var in [
        ("LLMGW_AUTH", "true"),
        ("LLMGW_ROUTER__BODY_LIMIT", "100"),
        ("LLMGW_CONFIG", "/etc/llmgw/server.yaml"),
        ("LLMGW_STORE", "postgres://db/llmgw"),
        ("LLMGW_AGENT_JOIN", "llmgw-join-x"),
        // An older name the agent still reads.
        ("LLMGW_NODE_ID", "n1"),
    ] {
        let err = up(var);
        assert!(
            err.contains(&format!(
                "{} is a setting of `llmgw server` or `llmgw agent`",
                var.0
            )),
            "{var:?}: {err}"
        );
    }
    let err = up(("LLMGW_ADMIN_LISTN", "127.0.0.1:1"));
    assert!(err.contains("did you mean LLMGW_ADMIN_LISTEN?"), "{err}");
    // Read by `up`: on to the next check (the admin listener's).
    let err = up(("LLMGW_LOG_FORMAT", "json"));
    assert!(err.contains("is off loopback"), "{err}");
}

/// What a file or a variable says is read whole or refused: a key given
/// twice dropped the earlier one (a whole section), a non-finite number
/// read as unset and an empty variable erased the file's value, each
/// unsaid, and the default applied.
#[test]
fn a_key_twice_a_number_not_finite_or_an_empty_variable_is_refused() {
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 5] = [
        (
            "auth: yes\n",
            &[],
            "auth is true, false or a section (auth: {enabled: true, …}), not \"yes\"",
        ),
        (
            "router: {body_limit: 100}\nlanding: {notice: hi}\nrouter: {retries: 1}\n",
            &[],
            "duplicate entry with key \"router\"",
        ),
        (
            "router: {prefix: {balance_abs: .inf}}\n",
            &[],
            "router.prefix.balance_abs: .inf is not a finite number",
        ),
        (
            "",
            &[("LLMGW_ADMISSION__KV_CEILING", ".nan")],
            "LLMGW_ADMISSION__KV_CEILING: the value: .nan is not a finite number",
        ),
        (
            "router: {retries: 0}\n",
            &[("LLMGW_ROUTER__RETRIES", "")],
            "LLMGW_ROUTER__RETRIES is empty",
        ),
    ];
    for (extra, env, says) in cases {
        let (code, out) = check_with(extra, env, &[]);
        assert_eq!(code, Some(2), "{extra:?} {env:?}: {out}");
        assert!(out.contains(says), "expected {says:?}: {out}");
    }
    let dir = tempfile::tempdir().unwrap();
    // Upper case too: read as YAML, it failed with a message about mappings.
    let toml = dir.path().join("s.TOML");
    std::fs::write(
        &toml,
        "endpoints = [\"e=http://127.0.0.1:9=m\"]\n[router.prefix]\nbalance_abs = nan\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["server", "--check", "--config"])
        .arg(&toml)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("router.prefix.balance_abs: NaN is not a finite number"),
        "{err}"
    );
    // A default said is no setting a mode must refuse: an env file shared
    // with the control plane's servers starts a router too.
    let (code, out) = check_with("", &[("LLMGW_AGENT_PLAINTEXT", "false")], &[]);
    assert_eq!(code, Some(0), "{out}");
}

/// A server named by nothing cannot lead: refused at start, not left
/// standing by for ever, warning that the store cannot be reached.
#[test]
fn an_empty_instance_name_is_refused() {
    let (code, out) = check_in(
        Mode::Control,
        "",
        &[("LLMGW_CONTROL__INSTANCE", "\"\"")],
        &[],
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("control.instance is empty"), "{out}");
}

/// A flag or its variable wins over the file in both directions: it can
/// turn off what the file turns on, and the kv_events an endpoint flag
/// names are refused when the file turns prefix routing off.
#[test]
fn a_flag_or_its_variable_wins_over_the_file_both_ways() {
    let keyed = "auth: true\n";
    for (env, args) in [
        (&[("LLMGW_AUTH", "false")][..], &[][..]),
        (&[][..], &["--auth=false"][..]),
    ] {
        let (code, out) = check_with(keyed, env, args);
        assert_eq!(code, Some(0), "{out}");
        assert!(
            out.contains("router only, no keys"),
            "{env:?} {args:?}: {out}"
        );
    }
    let (_, out) = check_with("", &[], &["--auth"]);
    assert!(out.contains("router only, keys required"), "{out}");
    let (_, out) = check_with("", &[("LLMGW_AUTH", "true")], &[]);
    assert!(out.contains("router only, keys required"), "{out}");

    // Usage turned off by the variable: the batcher's settings in the file
    // now apply to nothing, and are refused.
    let recorded = "record_usage: true\nauth: {flush_interval: 1s}\n";
    let (code, out) = check_with(recorded, &[], &[]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = check_with(recorded, &[("LLMGW_RECORD_USAGE", "false")], &[]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("auth.flush_interval applies only when usage is recorded"),
        "{out}"
    );

    // With keys on usage is always recorded: saying not to is refused.
    let (code, out) = check_with(keyed, &[("LLMGW_RECORD_USAGE", "false")], &[]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("usage is always recorded then"), "{out}");
    let (code, out) = check_with(keyed, &[], &["--record-usage=false", "--auth=false"]);
    assert_eq!(code, Some(0), "keys off, nothing recorded: {out}");
    // Keys turned off by the flag take usage with them: the file's usage
    // settings are refused, with both ways out said.
    let keyed_flush = "auth: {enabled: true, flush_interval: 1s}\n";
    let (code, out) = check_with(keyed_flush, &[], &["--auth=false"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("--auth false (or LLMGW_AUTH=false) turned keys off")
            && out.contains("--record-usage true"),
        "{out}"
    );
    let (code, out) = check_with(keyed_flush, &[], &["--auth=false", "--record-usage=true"]);
    assert_eq!(code, Some(0), "{out}");

    let (code, out) = check_with(
        "router: {prefix: {enabled: false}}\n",
        &[],
        &[
            "--endpoint",
            "e9=http://127.0.0.1:9=m;kv_events=tcp://127.0.0.1:5557;tokenizer=sim",
        ],
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("endpoint e9: kv_events applies only with prefix routing on"),
        "{out}"
    );
}

/// LLMGW_STORE wins over the file's `store:`, as `--store` does: the
/// server opens the store the variable names and never the file's.
#[test]
fn the_store_variable_wins_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (from_file, from_env) = (dir.path().join("file.db"), dir.path().join("env.db"));
    let path = config(
        dir.path(),
        "s",
        &format!("sqlite://{}", from_file.display()),
        "127.0.0.1:9",
        Mode::RouterOnly,
        "",
    );
    let server = Child::spawn_env(
        &["server", "--config", &path],
        &[("LLMGW_STORE", format!("sqlite://{}", from_env.display()))],
    );
    Child::expect(&server.stderr, "views started");
    drop(server);
    assert!(from_env.exists(), "the variable's store was not opened");
    assert!(!from_file.exists(), "the file's store was opened");
}

/// A SQLite log in a directory of its own with org o, team t and project
/// p, made by `keys` with nothing at the admin address it is given
/// (`closed`, for the next commands too): the directory, log and address.
fn offline_tree() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let closed = format!("http://127.0.0.1:{}", super::cluster::free_port());
    let store = format!("sqlite://{}", dir.path().join("keys.db").display());
    tree(&store, &closed);
    (dir, store, closed)
}

/// An operator's name with a newline forged a second line in `events
/// log`: a keys command naming one is refused, and nothing is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_command_by_an_unprintable_name_is_refused() {
    let (_dir, store, closed) = offline_tree();
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_remove("LLMGW_STORE")
        .args(["--store", &store, "keys", "--admin", &closed])
        .args(["--as", "bob\n2026-12-07  1  key-x  KeyRevoked  alice"])
        .args(["limits", "--scope", "project", "--id", "p", "--rpm", "5"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("holds U+000A"), "{said}");
    let log = super::ok(&store, &["events", "log", "--stream", "project-p"]);
    assert!(!log.contains("LimitsSet"), "{log}");
    // The project's switches too (they were recorded as admin-api).
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_remove("LLMGW_STORE")
        .args(["--store", &store, "keys", "--admin", &closed])
        .args(["--as", "bob\u{1b}[2J"])
        .args(["threads", "--project", "p"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("holds U+001B"), "{said}");
    let log = super::ok(&store, &["events", "log", "--stream", "project-p"]);
    assert!(!log.contains("ThreadsSet"), "{log}");
}

/// `keys init` and `events import` give a fresh store its schema, as a
/// server would, instead of failing on a missing table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_init_and_events_import_give_a_fresh_store_its_schema() {
    let (dir, keyed, _closed) = offline_tree();
    let exported = super::ok(&keyed, &["events", "export"]);
    let file = dir.path().join("log.jsonl");
    std::fs::write(&file, &exported).unwrap();
    let (imported, _scratch) = Scratch::new(Backend::Postgres).await;
    super::ok(&imported, &["events", "import", file.to_str().unwrap()]);
    let stats = super::ok(&imported, &["events", "stats", "--json"]);
    assert!(stats.contains("ProjectCreated"), "{stats}");

    // A SQLite file that a command wrote and then exited holds it alone:
    // copied without its write-ahead log (as `cp` of a backup does), it
    // is the same log. The events stayed in the WAL, so the copy had no
    // schema at all.
    let alone = |db: &std::path::Path| {
        let wal = std::fs::metadata(format!("{}-wal", db.display()));
        assert!(
            wal.as_ref().map_or(true, |m| m.len() == 0),
            "{}: {wal:?}",
            db.display()
        );
        let copy = dir.path().join("copy.db");
        std::fs::copy(db, &copy).unwrap();
        let copy = format!("sqlite://{}", copy.display());
        let stats = super::ok(&copy, &["events", "stats", "--json"]);
        std::fs::remove_file(dir.path().join("copy.db")).unwrap();
        stats
    };
    let keys_db = dir.path().join("keys.db");
    assert!(alone(&keys_db).contains("ProjectCreated"), "keys init");
    let sqlite_import = dir.path().join("imported.db");
    super::ok(
        &format!("sqlite://{}", sqlite_import.display()),
        &["events", "import", file.to_str().unwrap()],
    );
    assert!(
        alone(&sqlite_import).contains("ProjectCreated"),
        "events import"
    );
    let migrated = dir.path().join("migrated.db");
    super::ok(
        &format!("sqlite://{}", migrated.display()),
        &["store", "migrate"],
    );
    assert!(alone(&migrated).contains("\"count\":0"), "store migrate");
}

/// `keys init` refused at one level makes none: a project already in
/// another team used to leave the new team (and org) made before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_keys_init_makes_nothing() {
    let (_dir, store, closed) = offline_tree();
    let before = super::ok(&store, &["events", "export"]);
    for args in [
        ["init", "--org", "o", "--team", "t2", "--project", "p"],
        ["init", "--org", "o2", "--team", "t", "--project", "p3"],
    ] {
        let out = keys(&store, &closed, &args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && said.contains("already exists"),
            "{said}"
        );
    }
    let after = super::ok(&store, &["events", "export"]);
    for made in ["\"t2\"", "\"o2\"", "\"p3\""] {
        assert!(!after.contains(made), "{made} was made: {after}");
    }
    assert!(after.len() > before.len(), "the refusals are recorded");
    // The same again, where it fits, is no change and no error.
    tree(&store, &closed);
}

/// A key pasted where its id goes is refused and does not go into the
/// log, which keeps refusals for good: it used to record the whole key
/// (still valid) in the refusal's command and stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_given_for_its_id_is_refused_and_never_logged() {
    let (_dir, store, closed) = offline_tree();
    let (secret, _id) = new_key(&store, &closed, "pasted");
    for args in [
        vec!["revoke", secret.as_str()],
        vec![
            "limits",
            "--scope",
            "key",
            "--id",
            secret.as_str(),
            "--rpm",
            "5",
        ],
        vec!["create", "--project", "p", "--name", secret.as_str()],
    ] {
        let out = keys(&store, &closed, &args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{said}");
        assert!(
            said.contains("that is an API key itself, not an id or a name"),
            "{said}"
        );
        assert!(!said.contains(&secret), "{said}");
    }
    let log = super::ok(&store, &["events", "export"]);
    assert!(!log.contains(&secret), "the key is in the log");
    assert!(log.contains("CommandRefused"), "the attempts are: {log}");
}

/// The admin listener answers the operator's tools, not a web page in the
/// operator's browser: a write that carries Origin (every write a page
/// sends does) is refused and decides nothing, and a name rebound to
/// 127.0.0.1 gets no answer; the same revoke from `llmgw keys` works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_takes_no_writes_from_web_pages() {
    let stage = Stage::new();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("guard.db").display());
    let server = stage.start("guarded", &store, Mode::RouterOnly, "auth: true\n");
    tree(&store, &server.admin);
    let (secret, id) = new_key(&store, &server.admin, "laptop");
    let http = reqwest::Client::new();
    let forged = http
        .post(format!("{}/api/v1/keys/{id}/revoke", server.admin))
        .header("origin", "https://evil.example")
        .header("content-type", "application/x-www-form-urlencoded")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);
    let rebound = http
        .get(format!("{}/api/v1/keys", server.admin))
        .header("host", "evil.example:9090")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 421);
    status_becomes(&server.base, Some(&secret), "free", 200).await;
    let log = super::ok(&store, &["events", "log", "--key", &id]);
    assert!(!log.contains("KeyRevoked"), "{log}");
    keys_ok(&store, &server.admin, &["revoke", &id]);
    status_becomes(&server.base, Some(&secret), "free", 401).await;
}

/// `--models ","` names no model: it is refused, and says how to suspend,
/// where it used to suspend the key silently as `--models ""` does;
/// names are still trimmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_list_of_only_commas_is_refused_and_says_how_to_suspend() {
    let (_dir, store, closed) = offline_tree();
    let (_secret, id) = new_key(&store, &closed, "laptop");
    let limits = |models: &str| {
        keys(
            &store,
            &closed,
            &["limits", "--scope", "key", "--id", &id, "--models", models],
        )
    };
    for nothing in [",", " , "] {
        let out = limits(nothing);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{said}");
        assert!(
            said.contains("names no model") && said.contains(r#"--models """#),
            "{said}"
        );
    }
    let log = super::ok(&store, &["events", "export"]);
    assert!(!log.contains("LimitsSet"), "{log}");
    assert!(limits(" tiny, big").status.success());
    let rows: Value = serde_json::from_str(&keys_ok(&store, &closed, &["list", "--json"])).unwrap();
    assert_eq!(rows[0]["limits"]["models"], json!(["tiny", "big"]));
    assert!(limits("").status.success());
    let rows: Value = serde_json::from_str(&keys_ok(&store, &closed, &["list", "--json"])).unwrap();
    assert_eq!(rows[0]["limits"]["models"], json!([]), "\"\" suspends");
}

/// rpm and tpm are 1 or more: past u32 the message said 0..=4294967295,
/// yet 0 is refused too; both now name 1..=4294967295 and nothing is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rpm_or_tpm_out_of_range_names_the_range_from_one() {
    let (_dir, store, closed) = offline_tree();
    for (flag, value) in [("--tpm", "5000000000"), ("--rpm", "0")] {
        let out = keys(
            &store,
            &closed,
            &["limits", "--scope", "project", "--id", "p", flag, value],
        );
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{said}");
        assert!(
            said.contains("1..=4294967295") && !said.contains("0..="),
            "{said}"
        );
    }
    let log = super::ok(&store, &["events", "export"]);
    assert!(!log.contains("LimitsSet"), "{log}");
    keys_ok(
        &store,
        &closed,
        &[
            "limits",
            "--scope",
            "project",
            "--id",
            "p",
            "--tpm",
            "4294967295",
        ],
    );
}

/// `keys limits` on a key whose claim link ended unused is refused, as on
/// a revoked key: it opens nothing, so limits on it would change nothing.
/// Offline, against the log (nothing answers at --admin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_on_a_key_whose_claim_link_lapsed_are_refused() {
    use llmgw_domain::Command as C;
    use llmgw_domain::tenancy::{Band, Key, TenancyCommand as T};
    use llmgw_domain::time::UnixMillis;
    use llmgw_eventstore::{AnyStore, OpenOptions, StoreAddress};
    let (store, _scratch) = Scratch::new(Backend::Sqlite).await;
    let nobody = "http://127.0.0.1:9";
    tree(&store, nobody);
    let key = |id: &str| {
        T::IssueKey(Key {
            key_id: id.into(),
            project_id: "p".into(),
            name: id.into(),
            hash: format!("{:0>64}", id.len()),
            prefix: "llmgw-sk-x".into(),
            band: Band::Gold,
            routing_profile: None,
            revoked: false,
            owner: None,
            claim_by: None,
            expires_at: None,
            previous: None,
        })
    };
    let offer = |id: &str, until: i64| T::OfferClaim {
        key_id: id.into(),
        by: "alice".into(),
        until: Some(UnixMillis(until)),
    };
    let later = UnixMillis::now().0 + 3_600_000;
    let log = AnyStore::open(
        &StoreAddress::parse(&store).unwrap(),
        OpenOptions::default(),
    )
    .await
    .unwrap();
    let origin = llmgw_decider::Origin::new(llmgw_decider::Actor::Recorder("test".into()));
    let commands = [
        key("lapsed"),
        offer("lapsed", 1_000),
        key("waiting"),
        offer("waiting", later),
    ];
    llmgw_decider::offline::execute(
        &log,
        &origin,
        commands.into_iter().map(C::Tenancy).collect(),
    )
    .await
    .unwrap();
    drop(log);
    let limits = |id: &str| {
        keys(
            &store,
            nobody,
            &["limits", "--scope", "key", "--id", id, "--rpm", "5"],
        )
    };
    let out = limits("lapsed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("key lapsed's claim link expired unclaimed"),
        "{err}"
    );
    // A link still open: the key may be limited before it is handed out.
    let out = limits("waiting");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
