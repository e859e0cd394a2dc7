//! A server with accounts: signing up, in and out, the profile, claim
//! links and chat on a person's behalf.

use axum::http::StatusCode;
use chrono::Utc;
use serde_json::json;

use super::harness::{Browser, Page, Site, endpoint, engine};

const PASSWORD: &str = "correct horse battery";

async fn post_signup(
    site: &Site,
    browser: &mut Browser,
    csrf: &str,
    email: &str,
    password: &str,
) -> Page {
    let form = [
        ("csrf", csrf),
        ("email", email),
        ("name", "Ada"),
        ("password", password),
    ];
    browser.post(site, "/signup", &form).await
}

/// Signs up through the page; the new person's id from the log.
async fn sign_up(site: &Site, browser: &mut Browser, email: &str) -> String {
    let form = browser.get(site, "/signup").await;
    let csrf = form.field("csrf");
    let done = browser
        .post(
            site,
            "/signup",
            &[
                ("csrf", &csrf),
                ("email", email),
                ("name", "Ada"),
                ("password", PASSWORD),
            ],
        )
        .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    site.catch_up().await;
    site.events()
        .await
        .iter()
        .rev()
        .find(|(t, _)| t == "UserSignedUp")
        .and_then(|(_, p)| p["user_id"].as_str().map(str::to_owned))
        .expect("a UserSignedUp")
}

async fn sign_in(site: &Site, browser: &mut Browser, email: &str, password: &str) -> Page {
    let form = browser.get(site, "/login").await;
    assert_eq!(form.status, StatusCode::OK);
    let csrf = form.field("csrf");
    browser
        .post(
            site,
            "/login",
            &[("csrf", &csrf), ("email", email), ("password", password)],
        )
        .await
}

/// A person approved into `p1` and signed in; their id.
pub(super) async fn signed_in(site: &Site, browser: &mut Browser, email: &str) -> String {
    let user_id = sign_up(site, browser, email).await;
    site.approve(&user_id, "p1").await;
    let page = sign_in(site, browser, email, PASSWORD).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    assert_eq!(page.location(), Some("/profile"));
    user_id
}

fn count(events: &[(String, serde_json::Value)], kind: &str) -> usize {
    events.iter().filter(|(t, _)| t == kind).count()
}

#[tokio::test]
async fn signing_up_waits_for_approval_and_a_taken_address_gets_the_same_answer() {
    let site = Site::open(true, Vec::new()).await;
    let mut browser = Browser::default();
    let form = browser.get(&site, "/signup").await;
    assert_eq!(form.status, StatusCode::OK);
    let csrf = form.field("csrf");
    assert_eq!(browser.cookies.get("llmgw_pre"), Some(&csrf));

    // Another site's form: no cookie of ours.
    let forged = post_signup(
        &site,
        &mut Browser::default(),
        &csrf,
        "ada@example.org",
        PASSWORD,
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(site.events().await.is_empty());

    let first = post_signup(&site, &mut browser, &csrf, "ada@example.org", PASSWORD).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(
        first.body.contains("waits for an administrator"),
        "{}",
        first.body
    );
    assert_eq!(count(&site.events().await, "UserSignedUp"), 1);

    let again = post_signup(
        &site,
        &mut browser,
        &csrf,
        "ada@example.org",
        "another long password",
    )
    .await;
    assert_eq!(again.status, first.status);
    assert_eq!(again.body, first.body);
    assert_eq!(count(&site.events().await, "UserSignedUp"), 1);

    let weak = post_signup(&site, &mut browser, &csrf, "bob@example.org", "short").await;
    assert_eq!(weak.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        weak.body.contains("at least 12 characters"),
        "{}",
        weak.body
    );
    assert!(weak.body.contains(r#"value="bob@example.org""#));

    // Pending: powerless, and told no more than a wrong password is
    // (whoever signed up chose the password).
    site.catch_up().await;
    let pending = sign_in(&site, &mut browser, "ada@example.org", PASSWORD).await;
    assert_eq!(pending.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        pending.body.contains("once an operator approves it"),
        "{}",
        pending.body
    );
    assert!(!browser.cookies.contains_key("llmgw_session"));
}

/// An address is printed to an operator's terminal (`llmgw users list`):
/// one carrying escape sequences or a direction mark was taken, and
/// later recoloured and retitled that terminal. The form says why not.
#[tokio::test]
async fn a_sign_up_address_with_hidden_characters_is_refused_with_a_reason() {
    let site = Site::open(true, Vec::new()).await;
    let mut browser = Browser::default();
    let csrf = browser.get(&site, "/signup").await.field("csrf");
    for bad in [
        "eve\x1b[31mRED\x1b]0;pwned\x07@x.com",
        "mallory\u{202e}@x.com",
    ] {
        let page = post_signup(&site, &mut browser, &csrf, bad, PASSWORD).await;
        assert_eq!(page.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}");
        assert!(
            page.body
                .contains("may hold no spaces, quotes, angle brackets, or control, invisible or direction characters"),
            "{bad:?}: {}",
            page.body
        );
    }
    assert!(site.people.people().await.expect("people").is_empty());
    assert_eq!(count(&site.events().await, "UserSignedUp"), 0);
}

#[tokio::test]
async fn a_sign_up_the_log_does_not_take_leaves_no_personal_data() {
    let site = Site::open(true, Vec::new()).await;
    let broken = site.without_log();
    let mut browser = Browser::default();
    let csrf = browser.get(&broken, "/signup").await.field("csrf");
    let page = post_signup(&broken, &mut browser, &csrf, "ada@example.org", PASSWORD).await;
    assert_eq!(page.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(site.people.people().await.expect("people").is_empty());
    // The address is free again once the log works.
    sign_up(&site, &mut browser, "ada@example.org").await;
    assert_eq!(site.people.people().await.expect("people").len(), 1);
}

/// The lockout after ten tries answered 422, as a wrong password does,
/// with nothing saying when to come back: now 429 with `Retry-After`,
/// the seconds until the window ends.
#[tokio::test]
async fn a_locked_sign_in_is_429_with_the_seconds_until_it_ends() {
    let site = Site::open(true, Vec::new()).await;
    let mut browser = Browser::default();
    let tries = llmgw_people::PeopleConfig::default().max_attempts;
    for _ in 0..tries {
        let wrong = sign_in(&site, &mut browser, "ada@example.org", "not the password").await;
        assert_eq!(
            wrong.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{}",
            wrong.body
        );
        assert!(wrong.headers.get("retry-after").is_none());
    }
    let locked = sign_in(&site, &mut browser, "ada@example.org", "not the password").await;
    assert_eq!(
        locked.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        locked.body
    );
    assert!(
        locked.body.contains("try again in 15 minutes"),
        "{}",
        locked.body
    );
    let window = llmgw_people::PeopleConfig::default()
        .attempt_window
        .as_secs();
    let seconds: u64 = (locked.headers.get("retry-after"))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in seconds");
    assert!(
        (window - 60..=window).contains(&seconds),
        "{seconds} of {window}"
    );
}

#[tokio::test]
async fn signup_is_not_there_when_closed() {
    let site = Site::open(false, Vec::new()).await;
    let mut browser = Browser::default();
    assert_eq!(
        browser.get(&site, "/signup").await.status,
        StatusCode::NOT_FOUND
    );
    let form = browser.get(&site, "/login").await;
    let csrf = form.field("csrf");
    assert!(!form.body.contains("/signup"));
    let post = browser
        .post(
            &site,
            "/signup",
            &[
                ("csrf", &csrf),
                ("email", "a@example.org"),
                ("password", PASSWORD),
            ],
        )
        .await;
    assert_eq!(post.status, StatusCode::NOT_FOUND);
}

/// Signs in from `/login?next=<asked>` with the form's `next` set to
/// `next`; the answer to the post.
async fn sign_in_to(site: &Site, browser: &mut Browser, password: &str, next: &str) -> Page {
    let asked = format!("/login?next={}", crate::pages::encode(next));
    let csrf = browser.get(site, &asked).await.field("csrf");
    let form = [
        ("csrf", csrf.as_str()),
        ("email", "ada@example.org"),
        ("password", password),
        ("next", next),
    ];
    browser.post(site, "/login", &form).await
}

#[tokio::test]
async fn signing_in_returns_to_the_page_that_asked_for_it_and_never_off_the_site() {
    let site = Site::open(true, Vec::new()).await;
    let mut browser = Browser::default();
    let user_id = sign_up(&site, &mut browser, "ada@example.org").await;
    site.approve(&user_id, "p1").await;

    let away = browser.get(&site, "/chat?model=a%20b").await;
    assert_eq!(away.status, StatusCode::SEE_OTHER);
    let login = away.location().expect("a redirect").to_owned();
    assert_eq!(login, "/login?next=%2Fchat%3Fmodel%3Da%2520b");
    let form = browser.get(&site, &login).await;
    assert_eq!(form.status, StatusCode::OK);
    assert_eq!(form.field("next"), "/chat?model=a%20b");

    // A wrong password keeps the page to return to.
    let wrong = sign_in_to(&site, &mut browser, "not the password", "/chat").await;
    assert_eq!(wrong.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(wrong.field("next"), "/chat");

    // Anywhere off this site leads to the profile instead.
    for hostile in [
        "//evil.example/chat",
        "https://evil.example/",
        "/\\evil.example",
        "evil.example",
        "javascript:alert(1)",
    ] {
        let mut stranger = Browser::default();
        let page = sign_in_to(&site, &mut stranger, PASSWORD, hostile).await;
        assert_eq!(
            page.status,
            StatusCode::SEE_OTHER,
            "{hostile}: {}",
            page.body
        );
        assert_eq!(page.location(), Some("/profile"), "{hostile}");
    }

    let page = sign_in_to(&site, &mut browser, PASSWORD, "/chat?model=a%20b").await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    assert_eq!(page.location(), Some("/chat?model=a%20b"));
    // Already signed in, a sign-in link goes straight on.
    let again = browser.get(&site, "/login?next=%2Fchat").await;
    assert_eq!(again.location(), Some("/chat"));
}

#[tokio::test]
async fn a_sign_in_form_from_elsewhere_is_refused() {
    let site = Site::open(true, Vec::new()).await;
    let mut browser = Browser::default();
    browser.get(&site, "/login").await;
    let page = browser
        .post(
            &site,
            "/login",
            &[
                ("csrf", "0".repeat(64).as_str()),
                ("email", "a@example.org"),
                ("password", PASSWORD),
            ],
        )
        .await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
}

/// A screen reader heard a column of identical "Revoke" buttons, and a
/// refused sign-in was not announced: each button names its key, and a
/// form's error is an alert.
#[tokio::test]
async fn revoke_buttons_name_their_key_and_form_errors_are_announced() {
    let site = Site::open(true, Vec::new()).await;
    let mut browser = Browser::default();
    signed_in(&site, &mut browser, "ada@example.org").await;
    let profile = browser.get(&site, "/profile").await;
    assert_eq!(profile.status, StatusCode::OK, "{}", profile.body);
    assert!(
        profile.body.contains(
            r#"aria-label="Revoke the key key-mine name (sk-key-mine…)">Revoke</button>"#
        ),
        "{}",
        profile.body
    );
    let wrong = sign_in(
        &site,
        &mut Browser::default(),
        "ada@example.org",
        "not the password",
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        wrong
            .body
            .contains(r#"<p class="error" id="form-error" role="alert">"#),
        "{}",
        wrong.body
    );
}

#[tokio::test]
async fn a_person_manages_their_own_keys_from_the_profile() {
    let site = Site::open(true, Vec::new()).await;
    let mut browser = Browser::default();
    // Signed out, the profile asks to sign in.
    let away = browser.get(&site, "/profile").await;
    assert_eq!(away.status, StatusCode::SEE_OTHER);
    assert_eq!(away.location(), Some("/login"));

    let user_id = signed_in(&site, &mut browser, "ada@example.org").await;
    assert!(!browser.cookies.contains_key("llmgw_pre"));
    let profile = browser.get(&site, "/profile").await;
    assert_eq!(profile.status, StatusCode::OK, "{}", profile.body);
    assert!(profile.body.contains("ada@example.org"));
    assert!(profile.body.contains("p1"));
    assert!(profile.body.contains("keeps working until it is revoked"));
    // Key names outlive an erasure (the log keeps them): said where typed.
    assert!(
        profile.body.contains("put no personal data in it"),
        "{}",
        profile.body
    );
    // Only their own key is listed.
    assert!(profile.body.contains("key-mine name"));
    assert!(!profile.body.contains("key-theirs"));
    assert!(!profile.body.contains("key-ops"));
    let csrf = profile.field("csrf");
    assert_eq!(browser.cookies.get("llmgw_csrf"), Some(&csrf));

    let forged = browser
        .post(
            &site,
            "/profile/keys",
            &[("csrf", "nope"), ("name", "laptop")],
        )
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);

    let made = browser
        .post(
            &site,
            "/profile/keys",
            &[("csrf", &csrf), ("name", "laptop")],
        )
        .await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.body);
    assert!(made.body.contains("sk-new-0123456789abcdef"));
    assert!(
        made.body
            .contains("Authorization: Bearer sk-new-0123456789abcdef")
    );
    assert!(made.body.contains("http://gw.example/v1/chat/completions"));
    // Reloading the new key's page posts its form again: told that the
    // key exists and its secret is not shown twice, not "choose another
    // name".
    let reloaded = browser
        .post(
            &site,
            "/profile/keys",
            &[("csrf", &csrf), ("name", "laptop")],
        )
        .await;
    assert_eq!(reloaded.status, StatusCode::CONFLICT, "{}", reloaded.body);
    assert!(
        reloaded.body.contains("shown only once"),
        "{}",
        reloaded.body
    );
    assert!(!reloaded.body.contains("sk-new-0123456789abcdef"));
    assert!(!reloaded.body.contains("choose another name"));
    assert!(reloaded.body.contains(r#"href="/profile""#));
    let asked_to_make: Vec<_> = site
        .asked
        .lock()
        .expect("lock")
        .iter()
        .filter(|(what, _, _)| what == "POST keys")
        .cloned()
        .collect();
    // The second ask was refused (the name is taken): one key made.
    assert_eq!(asked_to_make.len(), 2);
    assert_eq!(asked_to_make[0].1, user_id);
    assert_eq!(
        asked_to_make[0].2,
        json!({"project": "p1", "name": "laptop", "owner": user_id, "claim": false})
    );

    // Someone else's key and a key that does not exist: the same 404.
    for key in ["key-theirs", "key-ops", "key-nope"] {
        let page = browser
            .post(
                &site,
                &format!("/profile/keys/{key}/revoke"),
                &[("csrf", &csrf)],
            )
            .await;
        assert_eq!(page.status, StatusCode::NOT_FOUND, "{key}");
        // The error page keeps the signed-in person's navigation.
        assert!(page.body.contains("Sign out"), "{}", page.body);
    }
    let revoked = browser
        .post(&site, "/profile/keys/key-mine/revoke", &[("csrf", &csrf)])
        .await;
    assert_eq!(revoked.status, StatusCode::SEE_OTHER);
    let revokes: Vec<_> = site
        .asked
        .lock()
        .expect("lock")
        .iter()
        .filter(|(what, _, _)| what.ends_with("/revoke"))
        .map(|(what, who, _)| (what.clone(), who.clone()))
        .collect();
    assert_eq!(
        revokes,
        vec![("POST keys/key-mine/revoke".to_owned(), user_id)]
    );
}

#[tokio::test]
async fn a_password_change_keeps_this_browser_and_signs_out_the_others() {
    let site = Site::open(true, Vec::new()).await;
    let mut browser = Browser::default();
    let user_id = signed_in(&site, &mut browser, "ada@example.org").await;
    let mut other = Browser::default();
    let page = sign_in(&site, &mut other, "ada@example.org", PASSWORD).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);

    let csrf = browser.get(&site, "/profile").await.field("csrf");
    let wrong = browser
        .post(
            &site,
            "/profile/password",
            &[
                ("csrf", &csrf),
                ("current", "not the password"),
                ("next", "a brand new password"),
            ],
        )
        .await;
    assert_eq!(wrong.status, StatusCode::UNPROCESSABLE_ENTITY);
    // Said of the password typed, with no email in sight.
    assert!(
        wrong.body.contains("that is not your current password"),
        "{}",
        wrong.body
    );
    assert_eq!(other.get(&site, "/profile").await.status, StatusCode::OK);

    let old_session = browser.cookies.get("llmgw_session").cloned();
    let changed = browser
        .post(
            &site,
            "/profile/password",
            &[
                ("csrf", &csrf),
                ("current", PASSWORD),
                ("next", "a brand new password"),
            ],
        )
        .await;
    // A redirect, so that reloading the page does not post the form again.
    assert_eq!(changed.status, StatusCode::SEE_OTHER, "{}", changed.body);
    assert_eq!(changed.location(), Some("/profile?changed=password"));
    assert_ne!(browser.cookies.get("llmgw_session"), old_session.as_ref());
    let told = browser.get(&site, "/profile?changed=password").await;
    assert_eq!(told.status, StatusCode::OK, "{}", told.body);
    assert!(told.body.contains("Your password has changed"));
    // The page's forms carry the new session's token.
    assert_eq!(browser.cookies.get("llmgw_csrf"), Some(&told.field("csrf")));
    let plain = browser.get(&site, "/profile").await;
    assert_eq!(plain.status, StatusCode::OK);
    assert!(!plain.body.contains("Your password has changed"));
    let signed_out = other.get(&site, "/profile").await;
    assert_eq!(signed_out.location(), Some("/login"));

    let events = site.events().await;
    assert!(
        events
            .iter()
            .any(|(t, p)| t == "PasswordChanged" && p["user_id"] == user_id.as_str())
    );
    assert!(
        !events
            .iter()
            .any(|(_, p)| p.to_string().contains("brand new"))
    );

    // The new password signs in; signing out ends this browser's session.
    let csrf = browser.get(&site, "/profile").await.field("csrf");
    let out = browser.post(&site, "/logout", &[("csrf", &csrf)]).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(!browser.cookies.contains_key("llmgw_session"));
    assert_eq!(
        browser.get(&site, "/profile").await.location(),
        Some("/login")
    );
    let again = sign_in(
        &site,
        &mut browser,
        "ada@example.org",
        "a brand new password",
    )
    .await;
    assert_eq!(again.status, StatusCode::SEE_OTHER, "{}", again.body);
}

#[tokio::test]
async fn a_claim_link_shows_its_key_once() {
    let site = Site::open(false, Vec::new()).await;
    let (token, _) = site
        .people
        .seal_claim("key-claimed", "sk-claimed-secret", Utc::now(), None)
        .await
        .expect("seal");
    let mut browser = Browser::default();

    let bogus = browser.get(&site, "/claim/not-a-token").await;
    assert_eq!(bogus.status, StatusCode::NOT_FOUND);
    assert!(
        bogus
            .body
            .contains("not valid, has expired or has already been used")
    );

    let ask = browser.get(&site, &format!("/claim/{token}")).await;
    assert_eq!(ask.status, StatusCode::OK);
    assert!(ask.body.contains("Reveal the key"));
    assert!(!ask.body.contains("sk-claimed-secret"));
    let csrf = ask.field("csrf");

    // A post from elsewhere does not use the link up.
    let forged = Browser::default()
        .post(&site, &format!("/claim/{token}"), &[("csrf", &csrf)])
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);

    let shown = browser
        .post(&site, &format!("/claim/{token}"), &[("csrf", &csrf)])
        .await;
    assert_eq!(shown.status, StatusCode::OK);
    assert!(shown.body.contains("sk-claimed-secret"));
    assert!(
        shown
            .body
            .contains("Authorization: Bearer sk-claimed-secret")
    );
    assert!(shown.body.contains("http://gw.example/v1"));
    assert!(shown.body.contains(r#"href="/v1/models""#) && shown.body.contains(r#"href="/me""#));
    let events = site.events().await;
    assert!(
        events
            .iter()
            .any(|(t, p)| t == "KeyClaimed" && p["key_id"] == "key-claimed")
    );

    let twice = browser
        .post(&site, &format!("/claim/{token}"), &[("csrf", &csrf)])
        .await;
    assert_eq!(twice.status, StatusCode::NOT_FOUND);
    assert!(!twice.body.contains("sk-claimed-secret"));
    assert_eq!(
        browser.get(&site, &format!("/claim/{token}")).await.body,
        bogus.body
    );
}

/// With keys required, the start page lists no model to a stranger (as
/// `/v1/models` answers one 401), and a signed-in person's project's.
#[tokio::test]
async fn the_start_page_lists_models_only_to_those_who_may_use_them() {
    let site = Site::open(true, vec![endpoint("http://127.0.0.1:9", "llama-8b")]).await;
    let mut browser = Browser::default();
    let stranger = browser.get(&site, "/").await;
    assert_eq!(stranger.status, StatusCode::OK);
    assert!(!stranger.body.contains("llama-8b"), "{}", stranger.body);
    assert!(
        stranger.body.contains(r#"id="models-hidden""#),
        "{}",
        stranger.body
    );
    signed_in(&site, &mut browser, "ada@example.org").await;
    let person = browser.get(&site, "/").await;
    assert!(
        person.body.contains(r#"<td class="mono">llama-8b</td>"#),
        "{}",
        person.body
    );
}

#[tokio::test]
async fn chat_stands_for_the_persons_project_with_no_key_in_the_browser() {
    let (url, seen) = engine().await;
    let site = Site::open(true, vec![endpoint(&url, "llama-8b")]).await;
    let mut browser = Browser::default();
    assert_eq!(
        browser.get(&site, "/chat").await.location(),
        Some("/login?next=%2Fchat")
    );
    let turn = json!({"model": "llama-8b", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 100});
    let anonymous = browser
        .post_json(&site, "/chat/completions", None, &turn)
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);

    signed_in(&site, &mut browser, "ada@example.org").await;
    let page = browser.get(&site, "/chat").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains(r#"<option value="llama-8b""#));
    let csrf = browser.cookies.get("llmgw_csrf").cloned().expect("csrf");
    assert!(page.body.contains(&format!(r#"data-csrf="{csrf}""#)));
    assert!(!page.body.contains("sk-"));

    let forged = browser
        .post_json(&site, "/chat/completions", None, &turn)
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(seen.lock().expect("lock").is_empty());

    let answer = browser
        .post_json(&site, "/chat/completions", Some(&csrf), &turn)
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["max_tokens"], 100);
}

/// `/logout` typed or bookmarked: a button for the signed in, the start
/// page for anyone else; a visit to a form's address is a page saying so,
/// and never reveals an admin address to a stranger.
#[tokio::test]
async fn visiting_a_forms_address_gets_a_page_not_an_empty_405() {
    let site = Site::open(true, Vec::new()).await;
    let mut stranger = Browser::default();
    let away = stranger.get(&site, "/logout").await;
    assert_eq!(away.status, StatusCode::SEE_OTHER);
    assert_eq!(away.location(), Some("/"));
    let hidden = stranger.get(&site, "/admin/users/usr-x/approve").await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);

    let mut browser = Browser::default();
    signed_in(&site, &mut browser, "ada@example.org").await;
    let page = browser.get(&site, "/logout").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains(r#"id="sign-out""#), "{}", page.body);
    // Visiting it signs no one out; its button does.
    assert!(browser.cookies.contains_key("llmgw_session"));
    let csrf = page.field("csrf");
    assert_eq!(browser.cookies.get("llmgw_csrf"), Some(&csrf));
    let out = browser.post(&site, "/logout", &[("csrf", &csrf)]).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(!browser.cookies.contains_key("llmgw_session"));

    sign_in(&site, &mut browser, "ada@example.org", PASSWORD).await;
    let visit = browser.get(&site, "/profile/password").await;
    assert_eq!(visit.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(
        visit.body.contains("go back to the page the form is on"),
        "{}",
        visit.body
    );
    // In the site's chrome: the person keeps their navigation.
    assert!(visit.body.contains("Sign out"), "{}", visit.body);
}
