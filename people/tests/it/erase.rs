//! Erasure removes a person's personal data and sessions.

use llmgw_people::PeopleError;

use crate::support::{AYSE, Backend, Fx, GOOD, at, both_backends};

both_backends!(erasing_removes_the_person, erasing_leaves_others_alone);

/// On SQLite the erased person's bytes are gone from the files too: the
/// deleted row's space was left as it was, and the write-ahead log kept
/// copies, for anyone with the file or a backup of it to read.
#[tokio::test]
async fn an_erased_person_is_not_left_in_the_sqlite_files() {
    let fx = Fx::new(Backend::Sqlite).await;
    let id = fx.active().await;
    fx.sign_in(AYSE, GOOD, at(1)).await.unwrap();
    let llmgw_eventstore::StoreAddress::Sqlite(path) = &fx.address else {
        unreachable!("a SQLite store")
    };
    let files = [
        path.clone(),
        std::path::PathBuf::from(format!("{}-wal", path.display())),
    ];
    let holding = || {
        files
            .iter()
            .filter(|f| {
                std::fs::read(f).is_ok_and(|b| b.windows(AYSE.len()).any(|w| w == AYSE.as_bytes()))
            })
            .count()
    };
    assert!(holding() > 0, "the address is there before");
    assert!(fx.people.erase(&id).await.unwrap());
    assert_eq!(holding(), 0, "the address is in no file after");
}

async fn erasing_removes_the_person(b: Backend) {
    let fx = Fx::new(b).await;
    let id = fx.active().await;
    let opened = fx.sign_in(AYSE, GOOD, at(1)).await.unwrap();
    fx.sign_in(AYSE, GOOD, at(2)).await.unwrap();
    assert!(fx.people.erase(&id).await.unwrap());
    assert_eq!(fx.people.person(&id).await.unwrap(), None);
    assert!(fx.people.people().await.unwrap().is_empty());
    let r = fx.people.resolve(&opened.token, at(3)).await;
    assert!(matches!(r, Err(PeopleError::NoSession)), "{r:?}");
    assert_eq!(fx.count("SELECT count(*) FROM people_sessions").await, 0);
    let email = format!("SELECT count(*) FROM people WHERE email = '{AYSE}'");
    assert_eq!(fx.count(&email).await, 0);
    // Even before the log says so, the address signs in like a stranger's.
    let err = fx.sign_in(AYSE, GOOD, at(4)).await.unwrap_err();
    assert!(matches!(err, PeopleError::BadCredentials), "{err}");
    // Nothing left to erase.
    assert!(!fx.people.erase(&id).await.unwrap());
    // The address is free again.
    let again = fx.people.sign_up(AYSE, "Ayşe", GOOD, at(5)).await.unwrap();
    assert!(again.is_some_and(|new| new != id));
}

async fn erasing_leaves_others_alone(b: Backend) {
    let fx = Fx::new(b).await;
    let ayse = fx.active().await;
    let bo = fx
        .people
        .sign_up("bo@example.com", "Bo", GOOD, at(0))
        .await
        .unwrap()
        .unwrap();
    fx.set(&bo, llmgw_domain::tenancy::UserStatus::Active);
    let bos = fx.sign_in("bo@example.com", GOOD, at(1)).await.unwrap();
    assert!(fx.people.erase(&ayse).await.unwrap());
    fx.people.resolve(&bos.token, at(2)).await.unwrap();
    let left: Vec<String> = fx
        .people
        .people()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.user_id)
        .collect();
    assert_eq!(left, [bo]);
}
