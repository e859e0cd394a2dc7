//! Signing up: one pending account per address, no enumeration.

use llmgw_people::PeopleError;

use crate::support::{AYSE, Backend, Fx, GOOD, at, both_backends, t0};

both_backends!(
    signup_leaves_an_account_waiting,
    signup_does_not_reveal_existing_accounts,
    short_passwords_are_refused_at_signup,
    obvious_non_addresses_are_refused,
    addresses_that_would_steer_a_terminal_are_refused,
    an_empty_name_becomes_the_address,
    people_are_listed_oldest_first,
);

async fn signup_leaves_an_account_waiting(b: Backend) {
    let fx = Fx::new(b).await;
    let id = fx.pending().await;
    assert!(id.starts_with("usr-") && id.len() == 20, "{id}");
    let p = fx.people.person(&id).await.unwrap().unwrap();
    assert_eq!(p.email, AYSE);
    assert_eq!(p.name, "Ayşe");
    assert_eq!(p.created_at, t0());
    assert_eq!(p.last_login_at, None);
    // Answered as a wrong password: whoever signed up chose it.
    let err = fx.sign_in(AYSE, GOOD, at(1)).await.unwrap_err();
    assert!(matches!(err, PeopleError::BadCredentials), "{err}");
}

async fn signup_does_not_reveal_existing_accounts(b: Backend) {
    let fx = Fx::new(b).await;
    let id = fx.active().await;
    let again = fx
        .people
        .sign_up(
            " AYSE@example.com",
            "Impostor",
            "another long passphrase",
            at(1),
        )
        .await
        .unwrap();
    assert_eq!(again, None);
    // The existing account is untouched: same name, same password.
    let people = fx.people.people().await.unwrap();
    assert_eq!(people.len(), 1);
    assert_eq!(people[0].name, "Ayşe");
    let opened = fx.sign_in(AYSE, GOOD, at(2)).await.unwrap();
    assert_eq!(opened.user_id, id);
    let taken = fx
        .sign_in(AYSE, "another long passphrase", at(3))
        .await
        .unwrap_err();
    assert!(matches!(taken, PeopleError::BadCredentials), "{taken}");
    // A sign-up for a new address, then a sign-in with the password it
    // chose, is answered word for word as for the taken one: signing up
    // then signing in tells no one which addresses have accounts.
    let fresh = "new@example.com";
    let made = fx
        .people
        .sign_up(fresh, "New", "another long passphrase", at(4));
    assert!(made.await.unwrap().is_some());
    let new = fx
        .sign_in(fresh, "another long passphrase", at(5))
        .await
        .unwrap_err();
    assert_eq!(new.to_string(), taken.to_string());
}

async fn short_passwords_are_refused_at_signup(b: Backend) {
    let fx = Fx::new(b).await;
    let err = fx
        .people
        .sign_up(AYSE, "Ayşe", "short", t0())
        .await
        .unwrap_err();
    assert!(matches!(err, PeopleError::WeakPassword), "{err}");
    // Code points, not bytes: eleven two-byte letters are still too short.
    let err = fx
        .people
        .sign_up(AYSE, "Ayşe", &"ş".repeat(11), t0())
        .await
        .unwrap_err();
    assert!(matches!(err, PeopleError::WeakPassword), "{err}");
    assert!(fx.people.people().await.unwrap().is_empty());
    let ok = fx.people.sign_up(AYSE, "Ayşe", &"ş".repeat(12), t0()).await;
    assert!(ok.unwrap().is_some());
}

async fn obvious_non_addresses_are_refused(b: Backend) {
    let fx = Fx::new(b).await;
    for bad in [
        "",
        "ayse",
        "ayse@",
        "@example.com",
        "a b@example.com",
        "a@b",
        "a@@b.com",
    ] {
        let err = fx.people.sign_up(bad, "x", GOOD, t0()).await.unwrap_err();
        assert!(matches!(err, PeopleError::InvalidEmail), "{bad:?}: {err}");
    }
    // The address is checked before the password.
    let err = fx
        .people
        .sign_up("ayse", "x", "short", t0())
        .await
        .unwrap_err();
    assert!(matches!(err, PeopleError::InvalidEmail), "{err}");
    assert!(fx.people.people().await.unwrap().is_empty());
}

/// `llmgw users list` prints addresses to an operator's terminal: an
/// escape sequence in one recoloured and retitled it, and U+202E made an
/// address read as another. Refused as names are; nothing is stored.
async fn addresses_that_would_steer_a_terminal_are_refused(b: Backend) {
    let fx = Fx::new(b).await;
    for bad in [
        "eve\x1b[31mRED\x1b]0;pwned\x07@x.com",
        "mallory\u{202e}@x.com",
        "zero\u{200b}width@x.com",
        "c1\u{9b}@x.com",
    ] {
        let err = fx.people.sign_up(bad, "x", GOOD, t0()).await.unwrap_err();
        assert!(matches!(err, PeopleError::InvalidEmail), "{bad:?}: {err}");
        assert!(
            err.to_string().contains("control, invisible or direction"),
            "{err}"
        );
    }
    assert!(fx.people.people().await.unwrap().is_empty());
    // Letters beyond ASCII are addresses (RFC 6531).
    let ok = fx.people.sign_up("ayşe@örnek.com.tr", "", GOOD, t0()).await;
    assert!(ok.unwrap().is_some());
}

async fn an_empty_name_becomes_the_address(b: Backend) {
    let fx = Fx::new(b).await;
    let id = fx
        .people
        .sign_up("Bo@Example.com", "   ", GOOD, t0())
        .await
        .unwrap()
        .unwrap();
    let p = fx.people.person(&id).await.unwrap().unwrap();
    assert_eq!(p.name, "bo@example.com");
    let id2 = fx
        .people
        .sign_up("cy@example.com", "  Cy Twombly ", GOOD, t0())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        fx.people.person(&id2).await.unwrap().unwrap().name,
        "Cy Twombly"
    );
    assert_eq!(fx.people.person("usr-nobody").await.unwrap(), None);
    // A name is a line's worth of text: a longer one, or one with control
    // characters, is refused before anything is kept.
    for name in ["x".repeat(101), "a\u{1b}[2Jb".to_owned()] {
        let err = fx
            .people
            .sign_up("dee@example.com", &name, GOOD, t0())
            .await
            .unwrap_err();
        assert!(matches!(err, PeopleError::BadName), "{err}");
    }
    assert!(
        fx.people
            .sign_up("dee@example.com", "Dee", GOOD, t0())
            .await
            .unwrap()
            .is_some(),
        "the address was not taken by a refused sign-up"
    );
}

async fn people_are_listed_oldest_first(b: Backend) {
    let fx = Fx::new(b).await;
    let later = fx
        .people
        .sign_up("later@example.com", "Later", GOOD, at(60))
        .await
        .unwrap()
        .unwrap();
    let first = fx
        .people
        .sign_up("first@example.com", "First", GOOD, at(0))
        .await
        .unwrap()
        .unwrap();
    let ids: Vec<String> = fx
        .people
        .people()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.user_id)
        .collect();
    assert_eq!(ids, [first, later]);
}
