//! The browser driver against a real headless Chromium and a small site
//! served from inside the test: a form, a button wired up by a script file,
//! and a `javascript:` link.

use std::time::Duration;

use axum::Form;
use axum::Router;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::{get, post};
use llmgw_testkit::{Browser, WebDriverError};

mod relay;

/// Generous: the machine may be busy; a pass never waits this long.
const WAIT: Duration = Duration::from_secs(10);

const HOME: &str = r#"<!doctype html>
<html><head><title>Testkit home</title></head>
<body>
  <form method="post" action="/greet">
    <label>Name <input id="name" name="name" value="placeholder"></label>
    <button id="send" type="submit">Send</button>
  </form>
  <p id="out">before</p>
  <button id="change" type="button">Change</button>
  <ul><li class="item">one</li><li class="item">two</li><li class="item" hidden>three</li></ul>
  <a id="evil" href="javascript:alert(1)">do not click</a>
  <script src="/app.js"></script>
</body></html>"#;

/// The text arrives from the server after the click, so the page changes
/// some time after `click` returns, as a streamed answer would.
const APP_JS: &str = r#"
document.getElementById('change').addEventListener('click', function () {
  fetch('/later').then(function (r) { return r.text(); }).then(function (t) {
    document.getElementById('out').textContent = t;
  });
});
"#;

#[derive(serde::Deserialize)]
struct Greet {
    name: String,
}

async fn greet(Form(form): Form<Greet>) -> impl IntoResponse {
    let name = form
        .name
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    (
        [(
            header::SET_COOKIE,
            "visited=yes; Path=/; HttpOnly; SameSite=Lax",
        )],
        Html(format!(
            "<!doctype html><title>Greeted</title><h1 id=\"greeting\">Hello, {name}!</h1>"
        )),
    )
}

/// Serves the site on a free local port; returns its base URL.
async fn serve() -> String {
    let app = Router::new()
        .route("/", get(|| async { Html(HOME) }))
        .route(
            "/app.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript")], APP_JS) }),
        )
        .route("/later", get(|| async { "changed by the script" }))
        .route(
            "/strict",
            get(|| async {
                (
                    [(header::CONTENT_SECURITY_POLICY, "script-src 'self'")],
                    Html(HOME),
                )
            }),
        )
        .route("/greet", post(greet));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_user_fills_a_form_clicks_a_scripted_button_and_meets_an_alert() {
    let site = serve().await;
    let browser = Browser::start().await.expect("start browser");

    browser.goto(&site).await.expect("open home");
    assert_eq!(browser.title().await.unwrap(), "Testkit home");
    assert_eq!(browser.current_url().await.unwrap(), format!("{site}/"));
    assert!(
        browser
            .page_source()
            .await
            .unwrap()
            .contains("do not click")
    );

    // Elements: counting, visibility, attributes and live properties.
    let items = browser.find_all("li.item").await.unwrap();
    assert_eq!(items.len(), 3);
    assert!(items[0].is_displayed().await.unwrap());
    assert!(!items[2].is_displayed().await.unwrap());
    assert!(browser.find_all("li.nothing").await.unwrap().is_empty());
    let evil = browser.find("#evil").await.unwrap();
    assert_eq!(
        evil.attr("href").await.unwrap().as_deref(),
        Some("javascript:alert(1)")
    );
    assert_eq!(evil.attr("target").await.unwrap(), None);

    // The button's script came from /app.js and answers a click.
    assert_eq!(
        browser.find("#out").await.unwrap().text().await.unwrap(),
        "before"
    );
    browser
        .find("#change")
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let out = browser
        .wait_text("#out", "changed by the script", WAIT)
        .await
        .expect("the script changes the text");
    assert_eq!(out.text().await.unwrap(), "changed by the script");

    // Scripts see the page and take elements as arguments.
    let tag = browser
        .execute(
            "return arguments[0].tagName + ':' + arguments[1];",
            vec![out.to_json(), serde_json::json!(7)],
        )
        .await
        .unwrap();
    assert_eq!(tag, serde_json::json!("P:7"));

    // No alert is open yet; the javascript: link opens one, and
    // `alert_text` sees it without waiting for it: that is what lets a test
    // take `None` as proof that a link ran no script.
    assert_eq!(browser.alert_text().await.unwrap(), None);
    evil.click().await.unwrap();
    assert_eq!(browser.alert_text().await.unwrap().as_deref(), Some("1"));
    browser.accept_alert().await.unwrap();
    assert_eq!(browser.alert_text().await.unwrap(), None);

    // Under a policy that forbids inline script the same link does nothing.
    browser.goto(&format!("{site}/strict")).await.unwrap();
    browser.find("#evil").await.unwrap().click().await.unwrap();
    assert_eq!(browser.alert_text().await.unwrap(), None);
    browser.back().await.unwrap();

    // The form: replace the value, submit, read the next page.
    let name = browser.find("#name").await.unwrap();
    assert_eq!(
        name.property("value").await.unwrap(),
        serde_json::json!("placeholder")
    );
    name.clear().await.unwrap();
    name.send_keys("Ada <Lovelace>").await.unwrap();
    browser.find("#send").await.unwrap().click().await.unwrap();
    let greeting = browser
        .wait_text("#greeting", "Hello, Ada <Lovelace>!", WAIT)
        .await
        .expect("the greeting page");
    assert_eq!(greeting.text().await.unwrap(), "Hello, Ada <Lovelace>!");
    assert_eq!(
        browser.current_url().await.unwrap(),
        format!("{site}/greet")
    );

    // The server's cookie is there, HttpOnly, until deleted.
    let cookies = browser.cookies().await.unwrap();
    let visited = cookies
        .iter()
        .find(|c| c["name"] == "visited")
        .expect("the visited cookie");
    assert_eq!(visited["value"], "yes");
    assert_eq!(visited["httpOnly"], true);
    browser.delete_cookies().await.unwrap();
    assert!(browser.cookies().await.unwrap().is_empty());

    // A screenshot is a PNG of the 1280-pixel-wide window.
    let png = browser.screenshot_png().await.unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    assert_eq!(width, 1280);

    browser.quit().await.expect("quit");
}

#[tokio::test]
async fn waiting_for_what_never_comes_says_what_was_missing() {
    let site = serve().await;
    let browser = Browser::start().await.expect("start browser");
    browser.goto(&site).await.unwrap();
    let short = Duration::from_millis(300);

    let err = browser.wait_for("#missing", short).await.unwrap_err();
    assert!(
        matches!(&err, WebDriverError::NotFound { css, .. } if css == "#missing"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("no element matches `#missing`"),
        "{err}"
    );

    let err = browser.wait_text("#out", "never", short).await.unwrap_err();
    assert!(
        matches!(&err, WebDriverError::TextNotFound { last: Some(t), .. } if t == "before"),
        "{err:?}"
    );

    let err = browser.find("#missing").await.unwrap_err();
    assert!(matches!(err, WebDriverError::NotFound { .. }), "{err:?}");
    let err = browser.wait_alert(short).await.unwrap_err();
    assert!(matches!(err, WebDriverError::NoAlert { .. }), "{err:?}");

    // Found as soon as it is there.
    let out = browser.wait_for("#out", short).await.unwrap();
    assert_eq!(out.text().await.unwrap(), "before");
}
