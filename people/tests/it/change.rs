//! Changing and resetting passwords.

use llmgw_people::PeopleError;

use crate::support::{AYSE, Backend, Fx, GOOD, at, both_backends};

const NEXT: &str = "a brand new passphrase";

both_backends!(
    changing_a_password_needs_the_old_one,
    changing_a_password_signs_out_everywhere,
    a_new_password_must_actually_be_new,
    guessing_the_current_password_is_bounded,
    a_reset_sets_the_password_and_closes_every_session,
);

async fn changing_a_password_needs_the_old_one(b: Backend) {
    let fx = Fx::new(b).await;
    let id = fx.active().await;
    let opened = fx.sign_in(AYSE, GOOD, at(1)).await.unwrap();
    let err = fx
        .people
        .change_password(&id, "not the password!", NEXT, at(2))
        .await
        .unwrap_err();
    assert!(matches!(err, PeopleError::BadCredentials), "{err}");
    // Nothing changed: the session lives, the old password still works.
    fx.people.resolve(&opened.token, at(3)).await.unwrap();
    fx.sign_in(AYSE, GOOD, at(4)).await.unwrap();
    let err = fx.sign_in(AYSE, NEXT, at(5)).await.unwrap_err();
    assert!(matches!(err, PeopleError::BadCredentials), "{err}");
}

async fn changing_a_password_signs_out_everywhere(b: Backend) {
    let fx = Fx::new(b).await;
    let id = fx.active().await;
    let one = fx.sign_in(AYSE, GOOD, at(1)).await.unwrap();
    let two = fx.sign_in(AYSE, GOOD, at(2)).await.unwrap();
    let here = fx
        .people
        .change_password(&id, GOOD, NEXT, at(3))
        .await
        .unwrap();
    for old in [&one, &two] {
        let r = fx.people.resolve(&old.token, at(4)).await;
        assert!(matches!(r, Err(PeopleError::NoSession)), "{r:?}");
    }
    // This browser carries on with a fresh session.
    assert_eq!(here.user_id, id);
    let session = fx.people.resolve(&here.token, at(4)).await.unwrap();
    assert!(session.csrf_ok(&here.csrf));
    assert_eq!(fx.count("SELECT count(*) FROM people_sessions").await, 1);
    fx.sign_in(AYSE, NEXT, at(5)).await.unwrap();
    let err = fx.sign_in(AYSE, GOOD, at(6)).await.unwrap_err();
    assert!(matches!(err, PeopleError::BadCredentials), "{err}");
}

async fn a_new_password_must_actually_be_new(b: Backend) {
    let fx = Fx::new(b).await;
    let id = fx.active().await;
    let err = fx
        .people
        .change_password(&id, GOOD, GOOD, at(1))
        .await
        .unwrap_err();
    assert!(matches!(err, PeopleError::SamePassword), "{err}");
    let err = fx
        .people
        .change_password(&id, GOOD, "short", at(2))
        .await
        .unwrap_err();
    assert!(matches!(err, PeopleError::WeakPassword), "{err}");
    fx.sign_in(AYSE, GOOD, at(3)).await.unwrap();
}

async fn guessing_the_current_password_is_bounded(b: Backend) {
    let fx = Fx::max3(b).await;
    let id = fx.active().await;
    for i in 0..3 {
        let err = fx
            .people
            .change_password(&id, "not the password!", NEXT, at(i))
            .await
            .unwrap_err();
        assert!(matches!(err, PeopleError::BadCredentials), "{err}");
    }
    let err = fx
        .people
        .change_password(&id, GOOD, NEXT, at(3))
        .await
        .unwrap_err();
    assert!(matches!(err, PeopleError::TooManyTries { .. }), "{err}");
    // Its own window: signing in is not locked by it.
    fx.sign_in(AYSE, GOOD, at(4)).await.unwrap();
}

async fn a_reset_sets_the_password_and_closes_every_session(b: Backend) {
    let fx = Fx::new(b).await;
    let id = fx.active().await;
    let opened = fx.sign_in(AYSE, GOOD, at(1)).await.unwrap();
    let err = fx.people.reset_password(&id, "short").await.unwrap_err();
    assert!(matches!(err, PeopleError::WeakPassword), "{err}");
    fx.people.resolve(&opened.token, at(2)).await.unwrap();
    fx.people.reset_password(&id, NEXT).await.unwrap();
    let r = fx.people.resolve(&opened.token, at(3)).await;
    assert!(matches!(r, Err(PeopleError::NoSession)), "{r:?}");
    fx.sign_in(AYSE, NEXT, at(4)).await.unwrap();
    let err = fx.sign_in(AYSE, GOOD, at(5)).await.unwrap_err();
    assert!(matches!(err, PeopleError::BadCredentials), "{err}");
    let err = fx
        .people
        .reset_password("usr-nobody", NEXT)
        .await
        .unwrap_err();
    assert!(matches!(err, PeopleError::NoPerson), "{err}");
}
