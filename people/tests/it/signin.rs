//! Signing in: the password first, then the log's state; guessing bounded.

use llmgw_domain::tenancy::UserStatus;
use llmgw_people::PeopleError;

use crate::support::{AYSE, Backend, Fx, GOOD, at, both_backends};

both_backends!(
    approval_is_what_makes_an_account_work,
    a_suspended_account_cannot_sign_in,
    a_wrong_password_and_a_missing_account_are_indistinguishable,
    a_person_the_log_does_not_know_signs_in_like_a_stranger,
    guessing_is_bounded,
    a_successful_sign_in_clears_the_window,
    a_lockout_ends_with_its_window,
    signing_in_notes_the_last_login,
);

fn is<T: std::fmt::Debug>(r: Result<T, PeopleError>, want: fn(&PeopleError) -> bool) {
    match r {
        Err(e) if want(&e) => {}
        other => panic!("unexpected {other:?}"),
    }
}

async fn approval_is_what_makes_an_account_work(b: Backend) {
    let fx = Fx::new(b).await;
    let id = fx.pending().await;
    is(fx.sign_in(AYSE, GOOD, at(1)).await, |e| {
        matches!(e, PeopleError::BadCredentials)
    });
    fx.set(&id, UserStatus::Active);
    // Any spelling of the address.
    let opened = fx.sign_in(" Ayse@EXAMPLE.com", GOOD, at(2)).await.unwrap();
    assert_eq!(opened.user_id, id);
    assert!(!opened.token.is_empty() && !opened.csrf.is_empty());
    assert_ne!(opened.token, opened.csrf);
    let session = fx.people.resolve(&opened.token, at(3)).await.unwrap();
    assert_eq!(session.user_id, id);
    assert_eq!(session.opened_at, at(2));
}

async fn a_suspended_account_cannot_sign_in(b: Backend) {
    let fx = Fx::new(b).await;
    let id = fx.active().await;
    let opened = fx.sign_in(AYSE, GOOD, at(1)).await.unwrap();
    fx.people.resolve(&opened.token, at(2)).await.unwrap();
    // Suspending closes the person's sessions (A16): the caller does it
    // together with the event.
    fx.set(&id, UserStatus::Suspended);
    assert_eq!(fx.people.close_sessions(&id).await.unwrap(), 1);
    is(fx.people.resolve(&opened.token, at(3)).await, |e| {
        matches!(e, PeopleError::NoSession)
    });
    is(fx.sign_in(AYSE, GOOD, at(4)).await, |e| {
        matches!(e, PeopleError::Suspended)
    });
    // Only a right password learns the state.
    is(fx.sign_in(AYSE, "not the password!", at(5)).await, |e| {
        matches!(e, PeopleError::BadCredentials)
    });
}

async fn a_wrong_password_and_a_missing_account_are_indistinguishable(b: Backend) {
    let fx = Fx::new(b).await;
    fx.active().await;
    let wrong = fx
        .sign_in(AYSE, "not the password!", at(1))
        .await
        .unwrap_err();
    let missing = fx
        .sign_in("nobody@example.com", GOOD, at(2))
        .await
        .unwrap_err();
    let nonsense = fx.sign_in("not an address", GOOD, at(3)).await.unwrap_err();
    assert!(matches!(wrong, PeopleError::BadCredentials), "{wrong}");
    assert!(matches!(missing, PeopleError::BadCredentials), "{missing}");
    assert!(
        matches!(nonsense, PeopleError::BadCredentials),
        "{nonsense}"
    );
    assert_eq!(wrong.to_string(), missing.to_string());
}

async fn a_person_the_log_does_not_know_signs_in_like_a_stranger(b: Backend) {
    let fx = Fx::new(b).await;
    let id = fx
        .people
        .sign_up(AYSE, "Ayşe", GOOD, at(0))
        .await
        .unwrap()
        .unwrap();
    // Not in the log's view at all.
    is(fx.sign_in(AYSE, GOOD, at(1)).await, |e| {
        matches!(e, PeopleError::BadCredentials)
    });
    fx.set(&id, UserStatus::Erased);
    is(fx.sign_in(AYSE, GOOD, at(2)).await, |e| {
        matches!(e, PeopleError::BadCredentials)
    });
    assert_eq!(fx.count("SELECT count(*) FROM people_sessions").await, 0);
}

async fn guessing_is_bounded(b: Backend) {
    let fx = Fx::max3(b).await;
    fx.active().await;
    for i in 0..3 {
        is(fx.sign_in(AYSE, "not the password!", at(i)).await, |e| {
            matches!(e, PeopleError::BadCredentials)
        });
    }
    is(fx.sign_in(AYSE, "not the password!", at(10)).await, |e| {
        matches!(e, PeopleError::TooManyTries { .. })
    });
    // Even the right password, and in any spelling of the address.
    is(fx.sign_in("AYSE@example.com", GOOD, at(11)).await, |e| {
        matches!(e, PeopleError::TooManyTries { .. })
    });
    // Unknown addresses count too, each on its own.
    for i in 0..3 {
        is(fx.sign_in("nobody@example.com", GOOD, at(i)).await, |e| {
            matches!(e, PeopleError::BadCredentials)
        });
    }
    is(fx.sign_in("nobody@example.com", GOOD, at(4)).await, |e| {
        matches!(e, PeopleError::TooManyTries { .. })
    });
}

async fn a_successful_sign_in_clears_the_window(b: Backend) {
    let fx = Fx::max3(b).await;
    fx.active().await;
    for i in 0..2 {
        is(fx.sign_in(AYSE, "not the password!", at(i)).await, |e| {
            matches!(e, PeopleError::BadCredentials)
        });
    }
    fx.sign_in(AYSE, GOOD, at(2)).await.unwrap();
    for i in 3..6 {
        is(fx.sign_in(AYSE, "not the password!", at(i)).await, |e| {
            matches!(e, PeopleError::BadCredentials)
        });
    }
}

async fn a_lockout_ends_with_its_window(b: Backend) {
    let fx = Fx::max3(b).await;
    fx.active().await;
    for i in 0..4 {
        fx.sign_in(AYSE, "not the password!", at(i))
            .await
            .unwrap_err();
    }
    // The window (15 minutes) runs from the first attempt; refusals do not
    // extend it.
    is(fx.sign_in(AYSE, GOOD, at(15 * 60)).await, |e| {
        matches!(e, PeopleError::TooManyTries { .. })
    });
    fx.sign_in(AYSE, GOOD, at(15 * 60 + 1)).await.unwrap();
}

async fn signing_in_notes_the_last_login(b: Backend) {
    let fx = Fx::new(b).await;
    let id = fx.active().await;
    fx.sign_in(AYSE, GOOD, at(30)).await.unwrap();
    let p = fx.people.person(&id).await.unwrap().unwrap();
    assert_eq!(p.last_login_at, Some(at(30)));
    fx.sign_in(AYSE, "not the password!", at(40))
        .await
        .unwrap_err();
    let p = fx.people.person(&id).await.unwrap().unwrap();
    assert_eq!(p.last_login_at, Some(at(30)));
}

/// People copied into a store of the other backend (`llmgw store copy`)
/// sign in there with the same password, their times kept to the
/// microsecond; a second copy into the same store is refused whole.
#[tokio::test]
async fn people_copied_to_the_other_backend_sign_in_alike() {
    for (from, to) in [
        (Backend::Sqlite, Backend::Postgres),
        (Backend::Postgres, Backend::Sqlite),
    ] {
        let (a, b) = (Fx::new(from).await, Fx::new(to).await);
        let id = a.pending().await;
        a.set(&id, UserStatus::Active);
        a.sign_in(AYSE, GOOD, at(1)).await.unwrap();
        let rows = a.people.dump().await.unwrap();
        assert_eq!(rows.counts(), (1, 0));
        b.people.load(&rows).await.unwrap();
        b.set(&id, UserStatus::Active);
        let opened = b.sign_in(AYSE, GOOD, at(2)).await.unwrap();
        assert_eq!(opened.user_id, id, "{from:?} to {to:?}");
        let there = b.people.people().await.unwrap();
        assert_eq!(
            there,
            a.people
                .people()
                .await
                .unwrap()
                .into_iter()
                .map(|mut p| {
                    p.last_login_at = Some(at(2));
                    p
                })
                .collect::<Vec<_>>()
        );
        assert!(b.people.load(&rows).await.is_err(), "a store with people");
    }
}
