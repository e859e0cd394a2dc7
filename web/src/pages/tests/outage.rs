//! The pages while the account store (PostgreSQL) cannot be reached, on
//! real listeners: a signed-in person is told so, not sent to sign in,
//! and the error page names the request for them to quote.

use axum::http::StatusCode;
use llmgw_testkit::{Relay, TestDb};

use super::harness::{Browser, Site, Wire, wire};

const PASSWORD: &str = "correct horse battery";

use llmgw_testkit::until;

/// An approved person, signed in through the pages: their browser.
async fn signed_in(site: &Site) -> Browser {
    let mut browser = Browser::default();
    let csrf = browser.get(site, "/signup").await.field("csrf");
    let form = [
        ("csrf", csrf.as_str()),
        ("email", "ada@example.org"),
        ("name", "Ada"),
        ("password", PASSWORD),
    ];
    assert_eq!(
        browser.post(site, "/signup", &form).await.status,
        StatusCode::OK
    );
    site.catch_up().await;
    let user_id = site.people.people().await.expect("people")[0]
        .user_id
        .clone();
    site.approve(&user_id, "p1").await;
    let csrf = browser.get(site, "/login").await.field("csrf");
    let form = [
        ("csrf", csrf.as_str()),
        ("email", "ada@example.org"),
        ("password", PASSWORD),
    ];
    let page = browser.post(site, "/login", &form).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    browser
}

fn says_store_down(answer: &Wire, what: &str) {
    assert_eq!(answer.status, 503, "{what}: {answer:?}");
    assert!(
        answer.body.contains("account store cannot be reached"),
        "{what}: {}",
        answer.body
    );
}

/// With the store unreachable a signed-in `/profile` answered 303 to
/// `/login` (nothing logged), signing in a bare 500 "something went wrong
/// on our side", and `/admin/users` 500; the sessions were intact all
/// along. Now each says the store cannot be reached (503), the browser
/// keeps its cookies and is offered no sign-in, and the page names the
/// request's id as its `x-request-id` does.
#[tokio::test]
async fn an_unreachable_account_store_is_said_and_signs_no_one_out() {
    let db = TestDb::create().await;
    let relay = Relay::to_postgres(&db.url).await;
    let site = Site::on_postgres(&relay.url(&db.url), true).await;
    let browser = signed_in(&site).await;
    let served = site.serve().await;
    let cookie = format!("cookie: {}\r\n", browser.cookie_header());
    let profile = format!("GET /profile HTTP/1.1\r\n{cookie}");
    assert_eq!(wire(served.client, &profile, "").await.status, 200);

    // A stranger's sign-in form: its pre-session token needs no store.
    let mut stranger = Browser::default();
    let csrf = stranger.get(&site, "/login").await.field("csrf");
    let login = format!(
        "POST /login HTTP/1.1\r\ncookie: {}\r\ncontent-type: application/x-www-form-urlencoded\r\n",
        stranger.cookie_header()
    );
    let form = format!("csrf={csrf}&email=ada%40example.org&password=correct+horse+battery");

    relay.cut();
    let named = "GET /profile HTTP/1.1\r\nx-request-id: ask-me-about-7\r\n".to_owned() + &cookie;
    let chat =
        format!("POST /chat/completions HTTP/1.1\r\n{cookie}content-type: application/json\r\n");
    let (mine, theirs, named, people, turn) = tokio::join!(
        wire(served.client, &profile, ""),
        wire(served.client, &login, &form),
        wire(served.client, &named, ""),
        wire(served.admin, "GET /admin/users HTTP/1.1\r\n", ""),
        wire(served.client, &chat, "{}"),
    );
    says_store_down(&mine, "a signed-in profile");
    assert_eq!(mine.header("location"), None, "not sent to sign in");
    assert_eq!(mine.header("set-cookie"), None, "no cookie cleared");
    assert!(!mine.body.contains("href=\"/login\""), "{}", mine.body);
    let id = mine.header("x-request-id").expect("an id");
    assert!(
        mine.body
            .contains(&format!("<code id=\"request-id\">{id}</code>")),
        "{id}: {}",
        mine.body
    );
    says_store_down(&theirs, "signing in");
    let id = theirs.header("x-request-id").expect("an id");
    assert!(theirs.body.contains(id), "{id}: {}", theirs.body);
    // A client's own id is the one named.
    says_store_down(&named, "a profile with the client's id");
    assert!(
        named
            .body
            .contains("<code id=\"request-id\">ask-me-about-7</code>"),
        "{}",
        named.body
    );
    says_store_down(&people, "the admin listener's people");
    // The chat page's script reads the API's envelope.
    says_store_down(&turn, "a chat turn");
    assert!(turn.body.contains("\"store_unavailable\""), "{}", turn.body);

    // The same session works again once the store does.
    relay.restore();
    until("the profile once the store is back", || async {
        let page = wire(served.client, &profile, "").await;
        (page.status == 200).then_some(page)
    })
    .await;
}
