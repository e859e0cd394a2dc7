//! The pages in a real browser (headless Chromium over WebDriver): a person
//! signs up, is approved from the CLI, signs in, makes a key on the profile
//! and calls the API with it, chats with a streamed answer from a sim
//! engine, claims a link; an admin opens every admin page; a stored
//! `javascript:` contact does not run. With `LLMGW_SCREENSHOTS=DIR` the
//! main pages are saved there (`docs/screenshots/` is made this way).

use std::time::Duration;

use llmgw_testkit::{Backend, Browser, Scratch};

use super::tenancy::{Mode, config, engine, keys_ok, start, tree};
use super::web::users;

const WAIT: Duration = Duration::from_secs(20);
const GOOD: &str = "correct horse battery staple";

async fn shot(b: &Browser, name: &str) {
    if let Ok(dir) = std::env::var("LLMGW_SCREENSHOTS") {
        std::fs::create_dir_all(&dir).unwrap();
        let png = b.screenshot_png().await.unwrap();
        std::fs::write(format!("{dir}/{name}.png"), png).unwrap();
    }
}

async fn fill(b: &Browser, css: &str, text: &str) {
    let e = b.find(css).await.unwrap();
    e.clear().await.unwrap();
    e.send_keys(text).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_and_an_admin_in_a_real_browser() {
    let (store, _scratch) = Scratch::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let extra = "auth:\n  enabled: true\nlanding:\n  contact: \"javascript:alert(1)\"\n  notice: \"Research cluster: be kind to the GPUs\"\n";
    let cfg = config(dir.path(), "browser", &store, &e, Mode::Control, extra);
    let server = start(&cfg);
    let (base, admin) = (server.base.clone(), server.admin.clone());
    tree(&store, &admin);
    let b = Browser::start()
        .await
        .expect("a browser (chromium, chromium-driver)");

    // The start page; its stored `javascript:` contact is text and runs
    // nothing when clicked.
    b.goto(&format!("{base}/")).await.unwrap();
    b.wait_text("body", "be kind to the GPUs", WAIT)
        .await
        .unwrap();
    shot(&b, "landing").await;
    b.find("#contact").await.unwrap().click().await.unwrap();
    assert_eq!(b.alert_text().await.unwrap(), None);
    assert!(b.find_all("#contact a").await.unwrap().is_empty());

    // Sign up, and be approved from the CLI.
    b.goto(&format!("{base}/signup")).await.unwrap();
    fill(&b, "input[name=email]", "ayse@example.com").await;
    fill(&b, "input[name=name]", "Ayşe").await;
    fill(&b, "input[name=password]", GOOD).await;
    b.find("form button[type=submit]")
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait_text("body", "approval", WAIT).await.unwrap();
    let pending = users(&store, &admin, &["list", "--pending", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&pending).unwrap();
    let id = rows[0]["user_id"].as_str().unwrap().to_owned();
    users(&store, &admin, &["approve", &id, "--project", "p"]);

    // Sign in, make a key on the profile, and call the API with it.
    b.goto(&format!("{base}/login")).await.unwrap();
    fill(&b, "input[name=email]", "ayse@example.com").await;
    fill(&b, "input[name=password]", GOOD).await;
    b.find("form button[type=submit]")
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait_text("#profile-email", "ayse@example.com", WAIT)
        .await
        .unwrap();
    fill(&b, "#new-key input[name=name]", "laptop").await;
    b.find("#new-key button")
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let secret = b
        .wait_for("#secret", WAIT)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(secret.starts_with("llmgw-sk-"), "{secret}");
    shot(&b, "key-created").await;
    let answer = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(&secret)
        .json(&serde_json::json!({"model": "free", "max_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    b.goto(&format!("{base}/profile")).await.unwrap();
    b.wait_text("#keys", "laptop", WAIT).await.unwrap();
    shot(&b, "profile").await;

    // Chat: the answer streams into the page.
    b.goto(&format!("{base}/chat")).await.unwrap();
    b.wait_for("#chat-model", WAIT).await.unwrap();
    b.execute(
        "document.getElementById('chat-model').value = 'free'",
        vec![],
    )
    .await
    .unwrap();
    fill(&b, "#chat-input", "Tell me something").await;
    b.find("#chat-send").await.unwrap().click().await.unwrap();
    // The sim engine's answer is a function of the conversation: its
    // first words, asked of the engine directly, must stream into the log.
    let direct: serde_json::Value = reqwest::Client::new()
        .post(format!("http://{e}/v1/chat/completions"))
        .json(&serde_json::json!({"model": "free", "max_tokens": 3,
            "messages": [{"role": "user", "content": "Tell me something"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let first_words = direct["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .trim_end()
        .to_owned();
    b.wait_text("#chat-log", &first_words, WAIT).await.unwrap();
    b.wait_text("#chat-log", "Tell me something", WAIT)
        .await
        .unwrap();
    shot(&b, "chat").await;

    // A claim link reveals its key once.
    let link = keys_ok(
        &store,
        &admin,
        &[
            "create",
            "--project",
            "p",
            "--name",
            "shared",
            "--claim",
            "--base-url",
            &base,
        ],
    );
    b.goto(link.trim()).await.unwrap();
    b.find("#reveal").await.unwrap().click().await.unwrap();
    let claimed = b
        .wait_for("#secret", WAIT)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(claimed.starts_with("llmgw-sk-"), "{claimed}");
    shot(&b, "claimed").await;
    b.goto(link.trim()).await.unwrap();
    b.wait_text("body", "not valid", WAIT).await.unwrap();

    // An admin opens every admin page.
    users(&store, &admin, &["promote", &id]);
    for (page, says, name) in [
        ("/admin", "Nodes", "admin"),
        ("/admin/users", "ayse@example.com", "admin-users"),
        ("/admin/usage", "Usage", "admin-usage"),
        ("/admin/events", "UserPromoted", "admin-events"),
    ] {
        b.goto(&format!("{base}{page}")).await.unwrap();
        b.wait_text("main", says, WAIT).await.unwrap();
        shot(&b, name).await;
    }
    b.goto(&format!("{base}/admin/usage")).await.unwrap();
    assert!(!b.find_all("svg").await.unwrap().is_empty(), "usage charts");
    b.quit().await.unwrap();
}
