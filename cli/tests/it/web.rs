//! People and the pages through the shipped binary: sign-up, approval from
//! the CLI, sessions, CSRF, keys on the profile, chat, claim links, the
//! admin gate, erasure; router-only on SQLite and with a control plane on
//! PostgreSQL.

use std::collections::BTreeMap;

use llmgw_testkit::{Backend, Scratch};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use super::tenancy::{Mode, Stage, config, engine, keys, keys_ok, start, tree};
use super::until;

/// A browser without a browser: follows no redirects, keeps cookies.
struct Visit {
    http: reqwest::Client,
    base: String,
    jar: BTreeMap<String, String>,
}

struct Page {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Page {
    /// The value of the first `name="csrf"` field.
    fn csrf(&self) -> String {
        let at = self
            .body
            .find("name=\"csrf\" value=\"")
            .unwrap_or_else(|| panic!("no csrf field in {}", self.body));
        let rest = &self.body[at + "name=\"csrf\" value=\"".len()..];
        rest[..rest.find('"').unwrap()].to_owned()
    }

    fn location(&self) -> &str {
        self.headers
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

impl Visit {
    fn new(base: &str) -> Visit {
        Visit {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            base: base.to_owned(),
            jar: BTreeMap::new(),
        }
    }

    fn cookie_header(&self) -> String {
        self.jar
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    async fn page(&mut self, r: reqwest::RequestBuilder) -> Page {
        let r = r
            .header("cookie", self.cookie_header())
            .send()
            .await
            .unwrap();
        for c in r.headers().get_all("set-cookie") {
            let c = c.to_str().unwrap();
            let (pair, attrs) = c.split_once(';').unwrap_or((c, ""));
            let (k, v) = pair.split_once('=').unwrap();
            if v.is_empty() || attrs.contains("Max-Age=0") {
                self.jar.remove(k);
            } else {
                self.jar.insert(k.to_owned(), v.to_owned());
            }
        }
        Page {
            status: r.status(),
            headers: r.headers().clone(),
            body: r.text().await.unwrap(),
        }
    }

    async fn get(&mut self, path: &str) -> Page {
        let r = self.http.get(format!("{}{path}", self.base));
        self.page(r).await
    }

    async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Page {
        let r = self.http.post(format!("{}{path}", self.base)).form(form);
        self.page(r).await
    }

    async fn post_owned(&mut self, path: &str, form: &[(&str, String)]) -> Page {
        let r = self.http.post(format!("{}{path}", self.base)).form(form);
        self.page(r).await
    }

    /// Signs in; panics unless the server lets them in.
    async fn sign_in(&mut self, email: &str, password: &str) {
        let form = self.get("/login").await;
        let csrf = form.csrf();
        let p = self
            .post(
                "/login",
                &[("email", email), ("password", password), ("csrf", &csrf)],
            )
            .await;
        assert_eq!(p.status, StatusCode::SEE_OTHER, "{}", p.body);
        assert_eq!(p.location(), "/profile");
    }

    async fn signed_in(&mut self) -> bool {
        self.get("/profile").await.status == StatusCode::OK
    }
}

/// `llmgw users …` against the server's admin API, as operator `alice`.
pub(super) fn users(store: &str, admin: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_remove("LLMGW_STORE")
        .env_remove("LLMGW_ADMIN")
        .args(["--store", store, "users", "--admin", admin, "--as", "alice"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "users {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn user_rows(store: &str, admin: &str, pending: bool) -> Vec<Value> {
    let mut args = vec!["list", "--json"];
    if pending {
        args.push("--pending");
    }
    serde_json::from_str(&users(store, admin, &args)).unwrap()
}

fn secret_in(body: &str) -> String {
    let at = body
        .find("llmgw-sk-")
        .unwrap_or_else(|| panic!("no key in {body}"));
    body[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect()
}

async fn api_chat(base: &str, key: &str) -> StatusCode {
    reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({"model": "free", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap()
        .status()
}

const GOOD: &str = "correct horse battery staple";

// Usage flushed often: the test reads the chat's usage in the log.
const LANDING: &str = r#"auth:
  enabled: true
  flush_interval: 50ms
landing:
  contact: "javascript:alert(1)"
  notice: "Be kind to the GPUs"
"#;

async fn the_people_pages(mode: Mode, backend: Backend) {
    let (store, _scratch) = Scratch::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let cfg = config(dir.path(), "web", &store, &e, mode, LANDING);
    let server = start(&cfg);
    let (base, admin) = (server.base.clone(), server.admin.clone());
    tree(&store, &admin);
    let mut ayse = Visit::new(&base);

    // The start page says how to connect; the stored contact is text, and
    // no page allows inline script.
    let landing = ayse.get("/").await;
    assert_eq!(landing.status, StatusCode::OK);
    let csp = landing.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"));
    assert!(landing.body.contains("Be kind to the GPUs"));
    assert!(landing.body.contains("/v1/chat/completions"));
    assert!(landing.body.contains("javascript:alert(1)"));
    assert!(!landing.body.contains("href=\"javascript:"));

    // Sign-up: a form without its token is refused; a taken address gets
    // the same answer as a new one.
    let form = ayse.get("/signup").await;
    assert_eq!(form.status, StatusCode::OK);
    let signup = |csrf: &str| {
        [
            ("email", "Ayse@Example.COM".to_owned()),
            ("name", "Ayşe".to_owned()),
            ("password", GOOD.to_owned()),
            ("csrf", csrf.to_owned()),
        ]
    };
    let forged = ayse.post_owned("/signup", &signup("")).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let done = ayse.post_owned("/signup", &signup(&form.csrf())).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert!(done.body.contains("approval"));
    let again = ayse.get("/signup").await.csrf();
    let twice = ayse.post_owned("/signup", &signup(&again)).await;
    assert_eq!(twice.status, done.status);
    assert_eq!(twice.body, done.body);

    // Pending: powerless until an operator approves, and told so.
    let pending = user_rows(&store, &admin, true);
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["email"], "ayse@example.com");
    let id = pending[0]["user_id"].as_str().unwrap().to_owned();
    let login = ayse.get("/login").await;
    let refused = ayse
        .post(
            "/login",
            &[
                ("email", "ayse@example.com"),
                ("password", GOOD),
                ("csrf", &login.csrf()),
            ],
        )
        .await;
    assert_ne!(refused.status, StatusCode::SEE_OTHER);
    assert!(
        refused.body.contains("once an operator approves it"),
        "{}",
        refused.body
    );
    users(&store, &admin, &["approve", &id, "--project", "p"]);

    // Signed in: the session cookie is HttpOnly and SameSite=Lax (a link
    // from an email to a page opens signed in).
    let login = ayse.get("/login").await;
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{base}/login"))
        .header("cookie", ayse.cookie_header())
        .form(&[
            ("email", "ayse@example.com"),
            ("password", GOOD),
            ("csrf", &login.csrf()),
        ])
        .send()
        .await
        .unwrap();
    let session_cookie = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("llmgw_session="))
        .expect("a session cookie");
    assert!(session_cookie.contains("HttpOnly"), "{session_cookie}");
    assert!(session_cookie.contains("SameSite=Lax"), "{session_cookie}");
    ayse.sign_in("ayse@example.com", GOOD).await;
    let profile = ayse.get("/profile").await;
    assert_eq!(profile.status, StatusCode::OK);
    assert!(profile.body.contains("ayse@example.com"));

    // A key made on the profile works on the API, and is shown once. A
    // colleague's key of the same name neither stops it nor is revealed.
    keys_ok(
        &store,
        &admin,
        &["create", "--project", "p", "--name", "laptop"],
    );
    let forged = ayse.post("/profile/keys", &[("name", "laptop")]).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let made = ayse
        .post(
            "/profile/keys",
            &[("name", "laptop"), ("csrf", &profile.csrf())],
        )
        .await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.body);
    let csrf = ayse.get("/profile").await.csrf();
    let twice = ayse
        .post("/profile/keys", &[("name", "laptop"), ("csrf", &csrf)])
        .await;
    // The same form again (a reload of the new key's page, or a second
    // laptop): said to her (not by her id), with why no secret is shown.
    assert_eq!(twice.status, StatusCode::CONFLICT, "{}", twice.body);
    assert!(
        twice.body.contains("You already have a key “laptop”")
            && twice.body.contains("shown only once")
            && !twice.body.contains(&id),
        "her own second laptop, said to her (not by her id): {}",
        twice.body
    );
    let secret = secret_in(&made.body);
    assert_eq!(api_chat(&base, &secret).await, StatusCode::OK);
    assert!(!ayse.get("/profile").await.body.contains(&secret));
    // Her usage page says how far behind it may be: this server's flush.
    let usage = ayse.get("/profile/usage").await;
    assert!(
        usage.body.contains("may be up to 50 ms behind"),
        "{}",
        usage.body
    );
    // Her history: signed up, approved by alice, and the key she made.
    let history = super::ok(&store, &["events", "log", "--user", &id]);
    let row = |what: &str| history.lines().find(|l| l.contains(what));
    assert!(row("UserSignedUp").is_some(), "{history}");
    // Her own acts say so (a person on the pages, not an operator).
    assert!(
        row("KeyIssued").is_some_and(|r| r.contains(&format!("{id} (person)"))),
        "{history}"
    );
    assert!(
        row("UserSignedUp").is_some_and(|r| r.contains(&format!("{id} (person)"))),
        "{history}"
    );
    assert!(
        row("UserApproved").is_some_and(|r| r.contains("alice") && !r.contains("(person)")),
        "approved by alice: {history}"
    );
    assert!(history.contains(" key-key-"), "her key's stream: {history}");

    // Chat: the session stands for the project; no key in the browser, the
    // form's token is required, and a turn is capped at 512 tokens.
    let csrf = ayse.get("/profile").await.csrf();
    let turn = json!({"model": "free", "stream": true, "max_tokens": 5000,
        "messages": [{"role": "user", "content": "hello"}]});
    let chat = |csrf: Option<&str>| {
        let mut r = reqwest::Client::new()
            .post(format!("{base}/chat/completions"))
            .header("cookie", ayse.cookie_header())
            .json(&turn);
        if let Some(c) = csrf {
            r = r.header("x-csrf-token", c);
        }
        r.send()
    };
    assert_eq!(chat(None).await.unwrap().status(), StatusCode::FORBIDDEN);
    let streamed = chat(Some(&csrf)).await.unwrap();
    assert_eq!(streamed.status(), StatusCode::OK);
    let text = streamed.text().await.unwrap();
    // The sim engine sends one token per chunk.
    let tokens = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
        .count();
    assert_eq!(tokens, 512, "{text}");
    // Counted as the person's, with the tokens the answer had.
    let session = format!("session:{id}");
    let usage = until("the chat's usage in the log", || async {
        let log = super::ok(&store, &["events", "tail", "--limit", "200", "--json"]);
        super::usage_rows_of(&super::json_lines(&log))
            .into_iter()
            .find(|u| u["key_id"] == session.as_str())
    })
    .await;
    assert_eq!(usage["project_id"], "p", "{usage}");
    assert_eq!(usage["completion_tokens"], 512, "{usage}");

    // The admin pages are not there for a person who is not an admin.
    assert_eq!(ayse.get("/admin").await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        ayse.get("/admin/usage.csv").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        ayse.get("/admin/events").await.status,
        StatusCode::NOT_FOUND
    );
    users(&store, &admin, &["promote", &id]);
    for page in ["/admin", "/admin/users", "/admin/usage", "/admin/events"] {
        let p = ayse.get(page).await;
        assert_eq!(p.status, StatusCode::OK, "{page}: {}", p.body);
    }
    assert!(ayse.get("/admin/usage").await.body.contains("<svg"));
    // The usage as a file: the chat above, counted as hers, to the
    // micro-unit; not there for someone who is not an admin.
    // Read as her browser would (her cookies), until the views have read
    // the chat's usage.
    let cookies = ayse.cookie_header();
    let csv = until("the chat in the usage file", || async {
        let got = reqwest::Client::new()
            .get(format!("{base}/admin/usage.csv?by=person&range=24h"))
            .header("cookie", &cookies)
            .send()
            .await
            .ok()?;
        assert_eq!(got.status(), StatusCode::OK);
        let body = got.text().await.ok()?;
        body.lines()
            .find(|l| l.contains(&format!(",{id},")))
            .map(str::to_owned)
    })
    .await;
    let cells: Vec<&str> = csv.split(',').collect();
    assert_eq!(cells.len(), 9, "{csv}");
    // Her chats: the one above and the page's first (512 tokens above).
    assert!(cells[3] == "Ayşe" && cells[4] != "0", "{csv}");
    assert!(cells[5].parse::<u64>().is_ok_and(|t| t > 512), "{csv}");
    // Spend in whole micro-units, and the same in units.
    assert!(cells[7].parse::<u64>().is_ok(), "{csv}");
    assert!(
        cells[8].split_once('.').is_some_and(|(_, f)| f.len() == 6),
        "{csv}"
    );
    // The groups with what is set on them, from the admin API.
    keys_ok(
        &store,
        &admin,
        &["limits", "--scope", "project", "--id", "p", "--rpm", "1234"],
    );
    let dashboard = ayse.get("/admin").await.body;
    let groups = dashboard
        .split("id=\"groups\"")
        .nth(1)
        .and_then(|rest| rest.split("</table>").next())
        .unwrap_or_default();
    for cell in ["depth-0", "depth-1", "depth-2", "1,234 rpm"] {
        assert!(groups.contains(cell), "{cell} in {groups}");
    }
    assert!(
        ayse.get("/admin/users")
            .await
            .body
            .contains("ayse@example.com")
    );
    // The admin listener shows the same pages without sign-in.
    let mut local = Visit::new(&admin);
    for page in ["/admin", "/admin/users", "/admin/usage", "/admin/events"] {
        let p = local.get(page).await;
        assert_eq!(p.status, StatusCode::OK, "{page}: {}", p.body);
    }

    // A password change needs the current one and signs out other
    // browsers, not this one.
    let mut other = Visit::new(&base);
    other.sign_in("ayse@example.com", GOOD).await;
    let csrf = ayse.get("/profile").await.csrf();
    let wrong = ayse
        .post(
            "/profile/password",
            &[
                ("current", "not my password at all"),
                ("next", "a brand new passphrase"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert!(
        wrong.body.contains("that is not your current password"),
        "{}",
        wrong.body
    );
    assert!(other.signed_in().await);
    let changed = ayse
        .post(
            "/profile/password",
            &[
                ("current", GOOD),
                ("next", "a brand new passphrase"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert!(changed.status.is_success() || changed.status.is_redirection());
    assert!(ayse.signed_in().await);
    assert!(!other.signed_in().await);

    // An operator's reset (the password read from stdin) closes the
    // person's sessions; the new password lets them in.
    let mut reset = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_remove("LLMGW_STORE")
        .env_remove("LLMGW_ADMIN")
        .args(["--store", &store, "users", "--admin", &admin])
        .args(["reset-password", &id])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = reset.stdin.take().unwrap();
        stdin.write_all(b"an operator's choice 42\n").unwrap();
    }
    let out = reset.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!ayse.signed_in().await);
    ayse.sign_in("ayse@example.com", "an operator's choice 42")
        .await;

    // A one-time claim link reveals a key once.
    let claim_path = |name: &str| {
        let link = keys_ok(
            &store,
            &admin,
            &[
                "create",
                "--project",
                "p",
                "--name",
                name,
                "--claim",
                "--base-url",
                &base,
            ],
        );
        let path = link.trim().strip_prefix(base.as_str()).unwrap().to_owned();
        assert!(path.starts_with("/claim/"), "{link}");
        path
    };
    let path = claim_path("shared");
    // Until its link is used, the list says so (past the link's end it
    // says expired: the key opens nothing).
    let state_of = |name: &str| {
        let listed: serde_json::Value =
            serde_json::from_str(&keys_ok(&store, &admin, &["list", "--json"])).unwrap();
        let row = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == name);
        row.unwrap()["state"].as_str().unwrap().to_owned()
    };
    assert_eq!(state_of("shared"), "unclaimed");
    let mut visitor = Visit::new(&base);
    let offer = visitor.get(&path).await;
    assert_eq!(offer.status, StatusCode::OK);
    assert!(!offer.body.contains("llmgw-sk-"));
    let revealed = visitor.post(&path, &[("csrf", &offer.csrf())]).await;
    assert_eq!(revealed.status, StatusCode::OK, "{}", revealed.body);
    let claimed = secret_in(&revealed.body);
    assert_eq!(api_chat(&base, &claimed).await, StatusCode::OK);
    assert_eq!(state_of("shared"), "active");
    // Claimed by someone not signed in: the log says a claim link, not an
    // operator.
    let log = super::ok(
        &store,
        &["events", "tail", "--type", "KeyClaimed", "--json"],
    );
    let claim = super::json_lines(&log).pop().expect("KeyClaimed");
    assert_eq!(
        (
            &claim["metadata"]["actor"],
            &claim["metadata"]["actor_kind"]
        ),
        (&json!("claim-link"), &json!("visitor")),
        "{claim}"
    );
    let mut late = Visit::new(&base);
    assert_eq!(late.get(&path).await.status, StatusCode::NOT_FOUND);

    // A link whose key was revoked after it was made shows nothing.
    let path = claim_path("gone");
    let listed: serde_json::Value =
        serde_json::from_str(&keys_ok(&store, &admin, &["list", "--json"])).unwrap();
    let gone_id = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "gone")
        .unwrap()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    keys_ok(&store, &admin, &["revoke", &gone_id]);
    let mut visitor = Visit::new(&base);
    let offer = visitor.get(&path).await;
    let refused = visitor.post(&path, &[("csrf", &offer.csrf())]).await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND, "{}", refused.body);
    assert!(!refused.body.contains("llmgw-sk-"));

    // The last active admin is not suspended: the admin pages would answer
    // no one. With a second admin, she is.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .env_remove("LLMGW_STORE")
        .env_remove("LLMGW_ADMIN")
        .args([
            "--store", &store, "users", "--admin", &admin, "--as", "alice",
        ])
        .args(["suspend", &id])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("the last active admin"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let second = users(
        &store,
        &admin,
        &[
            "add",
            "--email",
            "bo@example.com",
            "--name",
            "Bo",
            "--project",
            "p",
            "--password",
            GOOD,
        ],
    );
    let second = second
        .split_whitespace()
        .find(|w| w.starts_with("usr-"))
        .unwrap()
        .trim_end_matches(',');
    users(&store, &admin, &["promote", second]);
    // Suspension closes the sessions; the keys keep working until revoked.
    users(&store, &admin, &["suspend", &id]);
    assert!(!ayse.signed_in().await);
    assert_eq!(api_chat(&base, &secret).await, StatusCode::OK);

    // Erasure removes the personal data, and the person's own keys stop
    // working; the log still verifies.
    users(&store, &admin, &["erase", &id]);
    until("the erased person's key is refused", || async {
        (api_chat(&base, &secret).await == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    // And say so: their key is listed as stopped, not active, and no key
    // is made for them (it would never work).
    let keys = super::tenancy::keys(&store, &admin, &["list", "--json"]);
    let listed = String::from_utf8_lossy(&keys.stdout);
    let theirs = listed
        .lines()
        .flat_map(|l| serde_json::from_str::<Vec<Value>>(l).unwrap_or_default())
        .find(|k| k["owner"] == id.as_str())
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(theirs["state"], "stopped", "{theirs}");
    // The key's own history says what stopped it.
    let history = super::ok(
        &store,
        &[
            "events",
            "log",
            "--key",
            theirs["key_id"].as_str().unwrap(),
            "--json",
        ],
    );
    assert!(history.contains("\"UserErased\""), "{history}");
    let late = super::tenancy::keys(
        &store,
        &admin,
        &["create", "--project", "p", "--name", "late", "--owner", &id],
    );
    let said = String::from_utf8_lossy(&late.stderr);
    assert!(
        !late.status.success() && said.contains("was erased"),
        "{said}"
    );
    let rows = user_rows(&store, &admin, false);
    let row = rows.iter().find(|r| r["user_id"] == id.as_str()).unwrap();
    assert_eq!(row["status"], "erased");
    assert_eq!(row["email"], "");
    let mut again = Visit::new(&base);
    let login = again.get("/login").await;
    let gone = again
        .post(
            "/login",
            &[
                ("email", "ayse@example.com"),
                ("password", "a brand new passphrase"),
                ("csrf", &login.csrf()),
            ],
        )
        .await;
    assert!(gone.body.contains("do not match"), "{}", gone.body);
    let verify = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["--store", &store, "events", "verify"])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let log = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["--store", &store, "events", "export"])
        .output()
        .unwrap();
    let exported = String::from_utf8_lossy(&log.stdout);
    assert!(exported.contains(&id), "the log keeps the person's id");
    assert!(!exported.contains("ayse@example.com"));
    assert!(!exported.contains("Ayşe"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_pages_router_only_on_sqlite() {
    the_people_pages(Mode::RouterOnly, Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_pages_with_a_control_plane_on_postgres() {
    the_people_pages(Mode::Control, Backend::Postgres).await;
}

/// A session ends at its absolute expiry however busy it is. Three seconds
/// leave room for signing in on a loaded machine before it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_at_its_expiry() {
    let (store, _scratch) = Scratch::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let extra = "auth:\n  enabled: true\n  session_idle: 3s\n  session_max: 3s\nlanding:\n  base_url: https://llm.example.com\n";
    let cfg = config(dir.path(), "expiry", &store, &e, Mode::RouterOnly, extra);
    let server = start(&cfg);
    let (base, admin) = (server.base.clone(), server.admin.clone());
    tree(&store, &admin);
    let mut v = Visit::new(&base);
    let form = v.get("/signup").await;
    // Served behind https (the base URL says so): the cookies are Secure
    // and `__Host-` prefixed, so no other host can plant them.
    let cookie = form.headers["set-cookie"].to_str().unwrap();
    assert!(cookie.contains("; Secure"), "{cookie}");
    assert!(cookie.starts_with("__Host-llmgw_pre="), "{cookie}");
    assert!(
        form.body.contains("https://llm.example.com")
            || v.get("/").await.body.contains("https://llm.example.com")
    );
    let csrf = form.csrf();
    v.post(
        "/signup",
        &[
            ("email", "bo@example.com"),
            ("name", "Bo"),
            ("password", GOOD),
            ("csrf", &csrf),
        ],
    )
    .await;
    let id = user_rows(&store, &admin, true)[0]["user_id"]
        .as_str()
        .unwrap()
        .to_owned();
    users(&store, &admin, &["approve", &id, "--project", "p"]);
    v.sign_in("bo@example.com", GOOD).await;
    assert!(v.signed_in().await);
    assert!(
        v.jar.contains_key("__Host-llmgw_session") && v.jar.contains_key("__Host-llmgw_csrf"),
        "{:?}",
        v.jar.keys()
    );
    // Polling touches the session, so only the absolute expiry can end it.
    until("the session to expire", || {
        let mut probe = Visit {
            http: v.http.clone(),
            base: v.base.clone(),
            jar: v.jar.clone(),
        };
        async move { (!probe.signed_in().await).then_some(()) }
    })
    .await;
    assert_eq!(v.get("/profile").await.location(), "/login");
}

/// `auth.sign_in_attempts` is how many tries an email gets in a window:
/// with two, a third is refused even with the right password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_attempts_are_as_configured() {
    let (store, _scratch) = Scratch::new(Backend::Sqlite).await;
    let stage = Stage::new();
    let extra = "auth:\n  enabled: true\n  sign_in_attempts: 2\n  sign_in_window: 1h\n";
    let server = stage.start("tries", &store, Mode::RouterOnly, extra);
    let (base, admin) = (server.base.clone(), server.admin.clone());
    tree(&store, &admin);
    let mut v = Visit::new(&base);
    let id = sign_up(&mut v, &store, &admin, "cy@example.com").await;
    users(&store, &admin, &["approve", &id, "--project", "p"]);
    let mut attempt = async |password: &str| {
        let csrf = v.get("/login").await.csrf();
        v.post(
            "/login",
            &[
                ("email", "cy@example.com"),
                ("password", password),
                ("csrf", &csrf),
            ],
        )
        .await
    };
    for _ in 0..2 {
        let wrong = attempt("not the password at all").await;
        assert_eq!(wrong.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(!wrong.body.contains("too many attempts"), "{}", wrong.body);
    }
    let third = attempt(GOOD).await;
    // Locked out: a 429, as any "too many", saying when to come back.
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(third.body.contains("too many attempts"), "{}", third.body);
    // It says when to come back: the window (an hour here) from the first.
    assert!(
        third.body.contains("try again in 60 minutes"),
        "{}",
        third.body
    );
}

/// Sign-up pauses while `auth.signup_pending_max` accounts wait for
/// approval (503, said on the form), and goes on once one is approved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_up_pauses_while_too_many_wait_for_approval() {
    let (store, _scratch) = Scratch::new(Backend::Sqlite).await;
    let stage = Stage::new();
    let extra = "auth:\n  enabled: true\n  signup_pending_max: 1\n";
    let server = stage.start("pending", &store, Mode::RouterOnly, extra);
    let (base, admin) = (server.base.clone(), server.admin.clone());
    tree(&store, &admin);
    let mut v = Visit::new(&base);
    let first = sign_up(&mut v, &store, &admin, "one@example.com").await;
    let paused = post_sign_up(&mut Visit::new(&base), "two@example.com").await;
    assert_eq!(
        paused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        paused.body
    );
    assert!(paused.body.contains("sign-up is paused"), "{}", paused.body);
    assert_eq!(user_rows(&store, &admin, true).len(), 1, "nothing was made");
    users(&store, &admin, &["approve", &first, "--project", "p"]);
    until("the approval reaches the pages' view", || async {
        let done = post_sign_up(&mut Visit::new(&base), "two@example.com").await;
        (done.status == StatusCode::OK).then_some(())
    })
    .await;
}

/// Account settings without accounts, and a base URL that is not one, stop
/// the start.
#[tokio::test]
async fn account_settings_without_auth_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, says) in [
        ("auth:\n  signup_open: true\n", "auth.signup_open"),
        ("auth:\n  session_max: 1h\n", "auth.session_max"),
        ("auth:\n  sign_in_attempts: 3\n", "auth.sign_in_attempts"),
        (
            "auth:\n  signup_pending_max: 5\n",
            "auth.signup_pending_max",
        ),
        (
            "auth:\n  enabled: true\n  signup_pending_max: 0\n",
            "auth.signup_pending_max must be at least 1",
        ),
        (
            "auth:\n  enabled: true\n  sign_in_attempts: 0\n",
            "auth.sign_in_attempts must be at least 1",
        ),
        (
            "auth:\n  enabled: true\n  sign_in_window: 0s\n",
            "auth.sign_in_window must be at least 1s",
        ),
        (
            "landing:\n  base_url: \"ftp://example.com\"\n",
            "landing.base_url",
        ),
    ] {
        let cfg = config(
            dir.path(),
            "refused",
            &format!("{}/s.db", dir.path().display()),
            "127.0.0.1:1",
            Mode::RouterOnly,
            extra,
        );
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(["server", "--config", &cfg])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{extra}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
    }
}

/// Claim links and `users` need no running server: in-process over the
/// store, like `keys`.
#[tokio::test]
async fn a_claim_link_needs_an_http_base_url() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("c.db").display());
    let closed = format!("http://127.0.0.1:{}", super::cluster::free_port());
    let out = keys(
        &store,
        &closed,
        &[
            "create",
            "--project",
            "p",
            "--name",
            "n",
            "--claim",
            "--base-url",
            "javascript:x",
        ],
    );
    // A usage error, said before any log is looked for.
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--base-url"));
}

/// `--expires-in` gives one claim link its own lifetime, said when it is
/// made; a lifetime out of bounds, or without a link, is refused before any
/// key is made.
#[tokio::test]
async fn a_claim_link_lives_as_long_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("c.db").display());
    let closed = format!("http://127.0.0.1:{}", super::cluster::free_port());
    // No log yet: a listing makes none, and says what starts one.
    for what in ["list", "groups"] {
        let out = keys(&store, &closed, &[what]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("`llmgw keys init`"),
            "{out:?}"
        );
    }
    assert!(!dir.path().join("c.db").exists());
    tree(&store, &closed);
    // No key yet: the listing says how to make the first.
    let out = keys(&store, &closed, &["list"]);
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("keys create"),
        "{out:?}"
    );
    let create = |name: &str, more: &[&str]| {
        let mut args = vec!["create", "--project", "p", "--name", name];
        args.extend_from_slice(more);
        keys(&store, &closed, &args)
    };
    let link = ["--claim", "--base-url", "http://llm.example.com"];
    let out = create("short", &[&link[..], &["--expires-in", "2h"]].concat());
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    let until = said
        .split("until ")
        .nth(1)
        .map(str::trim)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("when the link ends: {said}"));
    let left = until.with_timezone(&chrono::Utc) - chrono::Utc::now();
    assert!(
        (7000..=7200).contains(&left.num_seconds()),
        "two hours from now: {said}"
    );

    let out = create("long", &[&link[..], &["--expires-in", "40d"]].concat());
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("1 minute to 30 days"), "{err}");
    let out = create("bare", &["--expires-in", "2h"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let listed = keys_ok(&store, &closed, &["list", "--json"]);
    let names: Vec<Value> = serde_json::from_str::<Vec<Value>>(&listed)
        .unwrap()
        .into_iter()
        .map(|k| k["name"].clone())
        .collect();
    assert_eq!(names, [json!("short")], "no key for a refused link");
}

/// The sign-up form, filled in for `email` (its own name) and posted: the
/// answer, whatever it is.
async fn post_sign_up(visit: &mut Visit, email: &str) -> Page {
    let csrf = visit.get("/signup").await.csrf();
    visit
        .post(
            "/signup",
            &[
                ("email", email),
                ("name", email),
                ("password", GOOD),
                ("csrf", &csrf),
            ],
        )
        .await
}

/// Signs up `email` on `visit`'s server; returns the new person's id.
async fn sign_up(visit: &mut Visit, store: &str, admin: &str, email: &str) -> String {
    let done = post_sign_up(visit, email).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    user_rows(store, admin, true)
        .into_iter()
        .find(|r| r["email"] == email)
        .and_then(|r| r["user_id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("{email} is pending"))
}

/// Two servers on one PostgreSQL: a person signs up on the standby and an
/// admin approves them on the standby's people page; the leader decides
/// and records who approved, and both servers let the person in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_page_sends_its_decisions_to_the_leader() {
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let stage = Stage::new();
    let a = stage.start("cp-a", &store, Mode::Control, "auth: true\n");
    super::tenancy::leads(&a.admin).await;
    let b = stage.start("cp-b", &store, Mode::Control, "auth: true\n");
    tree(&store, &b.admin);
    // The admin: signed up on the standby, approved and promoted from the
    // CLI through it.
    let mut boss = Visit::new(&b.base);
    let boss_id = sign_up(&mut boss, &store, &b.admin, "boss@example.com").await;
    users(&store, &b.admin, &["approve", &boss_id, "--project", "p"]);
    users(&store, &b.admin, &["promote", &boss_id]);
    boss.sign_in("boss@example.com", GOOD).await;

    let mut cem = Visit::new(&b.base);
    let cem_id = sign_up(&mut cem, &store, &b.admin, "cem@example.com").await;
    let page = boss.get("/admin/users").await;
    assert!(page.body.contains("cem@example.com"), "{}", page.body);
    let approved = boss
        .post(
            &format!("/admin/users/{cem_id}/approve"),
            &[("project", "p"), ("csrf", &page.csrf())],
        )
        .await;
    assert!(approved.status.is_redirection(), "{}", approved.body);
    cem.sign_in("cem@example.com", GOOD).await;
    let mut cem_on_a = Visit::new(&a.base);
    cem_on_a.sign_in("cem@example.com", GOOD).await;

    let history = super::ok(&store, &["events", "tail", "--limit", "100", "--json"]);
    let event = super::json_lines(&history)
        .into_iter()
        .find(|e| e["event_type"] == "UserApproved" && e["payload"]["user_id"] == cem_id.as_str())
        .expect("UserApproved");
    assert_eq!(
        event["metadata"]["writer"], "cp-a",
        "the leader decided: {event}"
    );
    assert_eq!(event["metadata"]["actor"], boss_id.as_str());
    // A person on the dashboard, through the standby's forward; the CLI's
    // approval of the boss, an operator.
    assert_eq!(event["metadata"]["actor_kind"], "person", "{event}");
    let by_cli = super::json_lines(&history)
        .into_iter()
        .find(|e| e["event_type"] == "UserApproved" && e["payload"]["user_id"] == boss_id.as_str())
        .expect("UserApproved");
    assert_eq!(by_cli["metadata"]["actor_kind"], "operator", "{by_cli}");
}

/// With auth off there are no accounts: the start page and chat work for
/// anyone, the account pages are not there, and the admin pages are only
/// on the admin listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_accounts_the_pages_need_no_sign_in() {
    let (store, _scratch) = Scratch::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let cfg = config(dir.path(), "open", &store, &e, Mode::RouterOnly, "");
    let server = start(&cfg);
    let mut v = Visit::new(&server.base);
    let landing = v.get("/").await;
    assert_eq!(landing.status, StatusCode::OK);
    assert!(!landing.body.contains("Authorization: Bearer"));
    for gone in ["/login", "/signup", "/profile", "/admin", "/admin/events"] {
        let p = v.get(gone).await;
        assert!(
            p.status == StatusCode::NOT_FOUND || p.location() == "/login",
            "{gone}: {}",
            p.status
        );
    }
    assert_eq!(v.get("/chat").await.status, StatusCode::OK);
    let streamed = reqwest::Client::new()
        .post(format!("{}/chat/completions", server.base))
        .json(&json!({"model": "free", "stream": true, "max_tokens": 3,
            "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), StatusCode::OK);
    assert!(streamed.text().await.unwrap().contains("[DONE]"));
    let mut local = Visit::new(&server.admin);
    for page in ["/admin", "/admin/users", "/admin/usage", "/admin/events"] {
        let p = local.get(page).await;
        assert_eq!(p.status, StatusCode::OK, "{page}: {}", p.body);
    }
}

/// A key an operator makes for a person (`keys create --owner`) is
/// theirs: `keys list` names them, their profile shows it; a key for no
/// one who signed up is refused. `keys init` names the groups it makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_makes_a_key_for_a_person_and_it_shows_on_their_profile() {
    let (store, _scratch) = Scratch::new(Backend::Sqlite).await;
    let stage = Stage::new();
    let server = stage.start("owned", &store, Mode::RouterOnly, "auth: true\n");
    let (base, admin) = (server.base.clone(), server.admin.clone());
    keys_ok(
        &store,
        &admin,
        &[
            "init",
            "--org",
            "o",
            "--team",
            "t",
            "--project",
            "p",
            "--org-name",
            "Acme Corp",
            "--project-name",
            "Chat bots",
        ],
    );
    // Again without the names (another project under the same org): the
    // groups keep theirs.
    keys_ok(
        &store,
        &admin,
        &["init", "--org", "o", "--team", "t", "--project", "p2"],
    );
    let groups = keys_ok(&store, &admin, &["groups", "--json"]);
    assert!(
        groups.contains("Acme Corp") && groups.contains("Chat bots"),
        "{groups}"
    );
    let mut v = Visit::new(&base);
    let id = sign_up(&mut v, &store, &admin, "dee@example.com").await;
    users(&store, &admin, &["approve", &id, "--project", "p"]);
    let refused = keys(
        &store,
        &admin,
        &[
            "create",
            "--project",
            "p",
            "--name",
            "x",
            "--owner",
            "nobody",
        ],
    );
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no person nobody"));
    keys_ok(
        &store,
        &admin,
        &[
            "create",
            "--project",
            "p",
            "--name",
            "for-dee",
            "--owner",
            &id,
        ],
    );
    let listed: Value =
        serde_json::from_str(&keys_ok(&store, &admin, &["list", "--json"])).unwrap();
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "for-dee")
        .unwrap();
    assert_eq!(row["owner"], json!(id));
    let table = keys_ok(&store, &admin, &["list"]);
    assert!(table.lines().next().unwrap().contains("OWNER"), "{table}");
    v.sign_in("dee@example.com", GOOD).await;
    let profile = v.get("/profile").await;
    assert!(profile.body.contains("for-dee"), "{}", profile.body);
    // Moved to another project, Dee's own key in p goes with the move
    // (it kept opening p, counted against it, while the pages said p2):
    // said by the command, shown revoked on her profile.
    let said = users(&store, &admin, &["approve", &id, "--project", "p2"]);
    assert!(
        said.contains("their 1 own key in the project they left is revoked"),
        "{said}"
    );
    let moved = until("the move reaches the pages", || async {
        let mut probe = Visit {
            http: v.http.clone(),
            base: v.base.clone(),
            jar: v.jar.clone(),
        };
        let page = probe.get("/profile").await;
        page.body.contains("p2").then_some(page)
    })
    .await;
    assert!(moved.body.contains("for-dee"), "{}", moved.body);
    let listed: Value =
        serde_json::from_str(&keys_ok(&store, &admin, &["list", "--json"])).unwrap();
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "for-dee")
        .unwrap();
    assert_eq!(row["state"], "revoked", "{row}");
}

/// The cells of the usage page's "all" row.
fn all_row(page: &str) -> Vec<String> {
    let row = page
        .split("<tfoot>")
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .unwrap_or_else(|| panic!("no all row: {page}"));
    let mut cells: Vec<&str> = row.split("</th>").collect();
    cells.pop();
    cells
        .into_iter()
        .filter_map(|c| c.rsplit_once('>').map(|(_, text)| text.to_owned()))
        .collect()
}

/// By person, `events usage`, the admin usage page and its file count
/// alike: every key made without an owner is one row, `(operators)`, of
/// the same figures, so the page's "all" is everything, as by org (the
/// page and the file had the people alone: 2 requests where the CLI and
/// the page by org said 5). Spend in the file is whole micro-units, as
/// the CLI's `cost_micros`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_by_person_is_the_same_on_the_page_in_its_file_and_from_the_cli() {
    let (store, _scratch) = Scratch::new(Backend::Sqlite).await;
    let stage = Stage::new();
    let extra = "auth:
  enabled: true
  flush_interval: 50ms
  default_price: {prompt_per_1k: 1300, completion_per_1k: 700}
";
    let server = stage.start("by-person", &store, Mode::RouterOnly, extra);
    let (base, admin) = (server.base.clone(), server.admin.clone());
    tree(&store, &admin);
    let mut v = Visit::new(&base);
    let gus = sign_up(&mut v, &store, &admin, "gus@example.com").await;
    users(&store, &admin, &["approve", &gus, "--project", "p"]);
    let own = keys_ok(
        &store,
        &admin,
        &[
            "create",
            "--project",
            "p",
            "--name",
            "gus-laptop",
            "--owner",
            &gus,
        ],
    )
    .trim()
    .to_owned();
    let (ops, _) = super::tenancy::new_key(&store, &admin, "ci");
    for key in [&ops, &ops, &ops, &own, &own] {
        assert_eq!(api_chat(&base, key).await, StatusCode::OK);
    }

    // (requests, cost in micro-units) by person, once the log has all five.
    let cli = until("the five requests in the log", || async {
        let rows = super::json_lines(&super::ok(
            &store,
            &["events", "usage", "--by", "person", "--json"],
        ));
        let sums: BTreeMap<String, (u64, u64)> = rows
            .iter()
            .map(|r| {
                let n = |f: &str| r[f].as_u64().unwrap_or_default();
                (
                    r["person"].as_str().unwrap_or_default().to_owned(),
                    (n("requests"), n("cost_micros")),
                )
            })
            .collect();
        (sums.values().map(|(n, _)| n).sum::<u64>() == 5).then_some(sums)
    })
    .await;
    assert_eq!(
        cli.iter()
            .map(|(p, (n, _))| (p.as_str(), *n))
            .collect::<Vec<_>>(),
        [("(operators)", 3), (gus.as_str(), 2)],
        "{cli:?}"
    );
    // The file's bars added up, once the server's views hold the five.
    let file = until("the same in the usage file", || async {
        let csv = reqwest::get(format!("{admin}/admin/usage.csv?by=person&range=24h"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        assert!(
            csv.starts_with(
                "start,end,person,name,requests,tokens,errors,spend_micros,spend_units\n"
            ),
            "{csv}"
        );
        let mut sums: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for line in csv.lines().skip(1) {
            let person = line.split(',').nth(2).unwrap_or_default().to_owned();
            // From the end: a name may hold a comma.
            let tail: Vec<&str> = line.rsplitn(6, ',').collect();
            let (requests, micros) = (tail[4].parse::<u64>(), tail[1].parse::<u64>());
            let sum = sums.entry(person).or_default();
            sum.0 += requests.unwrap_or_default();
            sum.1 += micros.unwrap_or_default();
        }
        (sums == cli).then_some(sums)
    })
    .await;
    let (requests, micros) = file
        .values()
        .fold((0, 0), |(n, m), (rn, rm)| (n + rn, m + rm));
    let exact = format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000);
    let page = |by: &str| {
        let admin = admin.clone();
        let by = by.to_owned();
        async move {
            reqwest::get(format!("{admin}/admin/usage?by={by}&range=24h"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let by_person = page("person").await;
    assert!(by_person.contains(">(operators)</td>"), "{by_person}");
    let all = all_row(&by_person);
    assert_eq!(
        (all[0].as_str(), all[2].as_str(), all[5].as_str()),
        ("all", requests.to_string().as_str(), exact.as_str()),
        "{by_person}"
    );
    assert_eq!(all_row(&page("org").await), all, "by org, the same all");
}

/// `store copy` moves a SQLite store to PostgreSQL with its people: the
/// copy verifies, and a person added on SQLite signs in, with the same
/// password, to a server on the copy (an export and import left everyone
/// without an account). A copy into a store that holds events, or of a
/// store a server leads, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_copied_to_postgres_keeps_its_people() {
    let (from, _a) = Scratch::new(Backend::Sqlite).await;
    let (to, _b) = Scratch::new(Backend::Postgres).await;
    // Nothing answers there: the commands decide under the store's lease.
    let offline = "http://127.0.0.1:9";
    tree(&from, offline);
    let llmgw = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .env_remove("LLMGW_ADMIN")
            .args(args)
            .output()
            .unwrap()
    };
    let added = llmgw(&[
        "--store",
        &from,
        "users",
        "--admin",
        offline,
        "add",
        "--email",
        "eve@example.com",
        "--project",
        "p",
        "--password",
        GOOD,
    ]);
    assert!(added.status.success(), "{added:?}");
    let copied = llmgw(&["--store", &from, "store", "copy", "--to", &to]);
    let said = String::from_utf8_lossy(&copied.stdout).into_owned();
    assert!(copied.status.success(), "{copied:?}");
    assert!(said.contains("copied 1 people"), "{said}");
    let verified = llmgw(&["--store", &to, "events", "verify"]);
    assert!(verified.status.success(), "{verified:?}");
    let again = llmgw(&["--store", &from, "store", "copy", "--to", &to]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already holds"),
        "{again:?}"
    );

    let stage = Stage::new();
    let server = stage.start("copied", &to, Mode::Control, "auth:\n  enabled: true\n");
    let mut v = Visit::new(&server.base);
    v.sign_in("eve@example.com", GOOD).await;
    assert!(v.signed_in().await);
    // The copy now has a leader writing it: copying it is refused.
    let elsewhere = format!("sqlite://{}/elsewhere.db", std::env::temp_dir().display());
    let led = llmgw(&["--store", &to, "store", "copy", "--to", &elsewhere]);
    assert!(!led.status.success());
    assert!(
        String::from_utf8_lossy(&led.stderr).contains("holds the append lease"),
        "{led:?}"
    );
}

/// With sign-up closed an operator still adds people: `users add`
/// approves them to a project at once and prints their id; they sign in
/// with the password given. A taken address, a weak password and an
/// unknown project are refused, and a refused add leaves no account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_adds_a_person_while_sign_up_is_closed() {
    let (store, _scratch) = Scratch::new(Backend::Sqlite).await;
    let stage = Stage::new();
    let extra = "auth:\n  enabled: true\n  signup_open: false\n";
    let server = stage.start("closed", &store, Mode::RouterOnly, extra);
    let (base, admin) = (server.base.clone(), server.admin.clone());
    tree(&store, &admin);
    let add = |email: &str, password: &str, project: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .env_remove("LLMGW_STORE")
            .env_remove("LLMGW_ADMIN")
            .args([
                "--store", &store, "users", "--admin", &admin, "--as", "alice",
            ])
            .args([
                "add",
                "--email",
                email,
                "--name",
                "Eve",
                "--project",
                project,
            ])
            .args(["--password", password])
            .output()
            .unwrap()
    };
    let refused = add("eve@example.com", GOOD, "nope");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no project nope"));
    let weak = add("eve@example.com", "short", "p");
    assert!(!weak.status.success());
    let added = add("eve@example.com", GOOD, "p");
    let said = String::from_utf8_lossy(&added.stdout).into_owned();
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let rows: Value = serde_json::from_str(&users(&store, &admin, &["list", "--json"])).unwrap();
    let eve = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["email"] == "eve@example.com")
        .unwrap();
    assert_eq!(
        (&eve["status"], &eve["project"]),
        (&json!("active"), &json!("p")),
        "{eve}"
    );
    // The id alone on stdout (`U=$(llmgw users add …)`), what was done on
    // stderr.
    assert_eq!(said, format!("{}\n", eve["user_id"].as_str().unwrap()));
    let told = String::from_utf8_lossy(&added.stderr);
    assert!(
        told.contains("eve@example.com is usr-") && told.contains("may use project p"),
        "{told}"
    );
    let twice = add("eve@example.com", GOOD, "p");
    assert!(String::from_utf8_lossy(&twice.stderr).contains("has an account already"));
    let mut v = Visit::new(&base);
    assert_eq!(v.get("/signup").await.status, StatusCode::NOT_FOUND);
    v.sign_in("eve@example.com", GOOD).await;
}

/// A router-only server without keys in front of `endpoint`, its chat
/// page open in headless Chromium with `words` sent: the server (kept
/// alive by the caller) and the browser.
async fn chat_page_sent(endpoint: &str, words: &str) -> (super::Child, llmgw_testkit::Browser) {
    let server = super::Child::spawn(&[
        "server",
        "--endpoint",
        endpoint,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let base = format!("http://{}", server.addr_after("client listening on "));
    let b = llmgw_testkit::Browser::start()
        .await
        .expect("a browser (chromium, chromium-driver)");
    b.goto(&format!("{base}/chat")).await.unwrap();
    let input = b
        .wait_for("#chat-input", std::time::Duration::from_secs(30))
        .await
        .unwrap();
    input.send_keys(words).await.unwrap();
    b.find("#chat-send").await.unwrap().click().await.unwrap();
    (server, b)
}

/// A chat turn that fails, in a real browser (headless Chromium): the
/// question goes back into the box and off the page (it stayed on screen
/// though the next turn no longer carried it, and the box was empty), and
/// the error names the request's id, where it pointed at a header a person
/// in a browser cannot see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_chat_turn_gives_the_question_back_with_its_request_id() {
    use std::time::Duration;
    const WAIT: Duration = Duration::from_secs(20);
    // Nothing listens on the discard port: every turn fails at once.
    let (_server, b) = chat_page_sent("e1=http://127.0.0.1:9=dead", "hello there").await;

    let status = b
        .wait_text("#chat-status", "request id: ", WAIT)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!status.contains("x-request-id header"), "{status}");
    let id = status
        .split("request id: ")
        .nth(1)
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or_else(|| panic!("an id in {status:?}"));
    assert!(!id.is_empty(), "{status}");
    assert_eq!(
        b.find("#chat-input")
            .await
            .unwrap()
            .property("value")
            .await
            .unwrap(),
        json!("hello there")
    );
    assert!(
        b.find_all("#chat-log .turn").await.unwrap().is_empty(),
        "no bubble of a question that was not asked"
    );
    b.quit().await.unwrap();
}

/// An answer cut at the chat page's limit says so, in a real browser: it
/// ended mid-word, unsaid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_answer_cut_at_the_pages_limit_says_so() {
    use std::time::Duration;
    const WAIT: Duration = Duration::from_secs(30);
    let engine = super::tenancy::engine();
    let e = engine.addr_after("listening on ");
    let endpoint = format!("e1=http://{e}=paid");
    let (_server, b) = chat_page_sent(&endpoint, "tell me everything").await;
    let status = b
        .wait_text("#chat-status", "the answer stops here", WAIT)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(status.contains("at most 512 tokens"), "{status}");
    b.quit().await.unwrap();
}
