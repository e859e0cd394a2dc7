//! Browser sessions: hashed at rest, idle and absolute expiry, CSRF.

use llmgw_people::{PeopleConfig, PeopleError, Swept};

use crate::support::{AYSE, Backend, Fx, GOOD, at, both_backends, hours};

both_backends!(
    sign_out_ends_the_session,
    csrf_tokens_are_checked_against_the_session,
    an_idle_session_expires,
    using_a_session_keeps_it_alive_until_its_absolute_end,
    sessions_are_stored_as_hashes_only,
    a_sweep_removes_what_can_no_longer_be_used,
);

fn no_session<T: std::fmt::Debug>(r: Result<T, PeopleError>) {
    assert!(matches!(r, Err(PeopleError::NoSession)), "{r:?}");
}

async fn sign_out_ends_the_session(b: Backend) {
    let fx = Fx::new(b).await;
    fx.active().await;
    let one = fx.sign_in(AYSE, GOOD, at(1)).await.unwrap();
    let two = fx.sign_in(AYSE, GOOD, at(2)).await.unwrap();
    fx.people.sign_out(&one.token).await.unwrap();
    no_session(fx.people.resolve(&one.token, at(3)).await);
    // Only that one.
    fx.people.resolve(&two.token, at(3)).await.unwrap();
    // Nothing to end is no error.
    fx.people.sign_out("").await.unwrap();
    fx.people.sign_out(&one.token).await.unwrap();
    no_session(fx.people.resolve("", at(4)).await);
    no_session(fx.people.resolve("made-up-token", at(4)).await);
    // The CSRF token is no session token.
    no_session(fx.people.resolve(&two.csrf, at(4)).await);
}

async fn csrf_tokens_are_checked_against_the_session(b: Backend) {
    let fx = Fx::new(b).await;
    fx.active().await;
    let one = fx.sign_in(AYSE, GOOD, at(1)).await.unwrap();
    let two = fx.sign_in(AYSE, GOOD, at(2)).await.unwrap();
    let session = fx.people.resolve(&one.token, at(3)).await.unwrap();
    assert!(session.csrf_ok(&one.csrf));
    let mut shorter = one.csrf.clone();
    shorter.pop();
    for bad in [
        String::new(),
        "wrong".into(),
        format!("{}x", one.csrf),
        shorter,
        two.csrf.clone(),
        one.token.clone(),
        session.csrf_hash.clone(),
    ] {
        assert!(!session.csrf_ok(&bad), "{bad:?} passed");
    }
}

async fn an_idle_session_expires(b: Backend) {
    let fx = Fx::with(
        b,
        PeopleConfig {
            session_idle: hours(1),
            ..PeopleConfig::default()
        },
    )
    .await;
    fx.active().await;
    let opened = fx.sign_in(AYSE, GOOD, at(0)).await.unwrap();
    // Exactly the idle time is still fine; a second more is not.
    fx.people.resolve(&opened.token, at(3600)).await.unwrap();
    no_session(fx.people.resolve(&opened.token, at(2 * 3600 + 1)).await);
    // And it stays gone.
    no_session(fx.people.resolve(&opened.token, at(2 * 3600)).await);
}

async fn using_a_session_keeps_it_alive_until_its_absolute_end(b: Backend) {
    let fx = Fx::with(
        b,
        PeopleConfig {
            session_idle: hours(1),
            session_max: hours(3),
            ..PeopleConfig::default()
        },
    )
    .await;
    fx.active().await;
    let opened = fx.sign_in(AYSE, GOOD, at(0)).await.unwrap();
    // Used every 50 minutes: never idle for an hour.
    for minute in [50, 100, 150] {
        fx.people
            .resolve(&opened.token, at(minute * 60))
            .await
            .unwrap();
    }
    // Three hours after opening it ends however busy it is.
    no_session(fx.people.resolve(&opened.token, at(3 * 3600)).await);
}

async fn sessions_are_stored_as_hashes_only(b: Backend) {
    let fx = Fx::new(b).await;
    fx.active().await;
    let opened = fx.sign_in(AYSE, GOOD, at(1)).await.unwrap();
    let q =
        |col: &str, v: &str| format!("SELECT count(*) FROM people_sessions WHERE {col} = '{v}'");
    assert_eq!(fx.count(&q("token_hash", &opened.token)).await, 0);
    assert_eq!(fx.count(&q("csrf_hash", &opened.csrf)).await, 0);
    let session = fx.people.resolve(&opened.token, at(2)).await.unwrap();
    assert_eq!(session.csrf_hash.len(), 64);
    assert_eq!(fx.count(&q("csrf_hash", &session.csrf_hash)).await, 1);
}

async fn a_sweep_removes_what_can_no_longer_be_used(b: Backend) {
    let fx = Fx::with(
        b,
        PeopleConfig {
            session_idle: hours(1),
            claim_ttl: hours(1),
            ..PeopleConfig::default()
        },
    )
    .await;
    fx.active().await;
    let stale = fx.sign_in(AYSE, GOOD, at(0)).await.unwrap();
    let fresh = fx.sign_in(AYSE, GOOD, at(1800)).await.unwrap();
    fx.people
        .seal_claim("key-1", "sk-one", at(0), None)
        .await
        .unwrap();
    let (live, _) = fx
        .people
        .seal_claim("key-2", "sk-two", at(1800), None)
        .await
        .unwrap();
    let swept = fx.people.sweep(at(3600 + 60)).await.unwrap();
    assert_eq!(
        swept,
        Swept {
            sessions: 1,
            claims: 1
        }
    );
    no_session(fx.people.resolve(&stale.token, at(3600)).await);
    fx.people
        .resolve(&fresh.token, at(3600 + 60))
        .await
        .unwrap();
    assert_eq!(
        fx.count("SELECT count(*) FROM key_claims WHERE sealed IS NOT NULL")
            .await,
        1
    );
    let claimed = fx.people.claim(&live, at(3600 + 60)).await.unwrap();
    assert_eq!(claimed.secret, "sk-two");
}
