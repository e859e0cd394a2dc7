//! Claim links reveal a key's secret once, and the tables never hold it in
//! the clear.

use llmgw_people::{PeopleConfig, PeopleError};

use crate::support::{Backend, Fx, at, both_backends, hours};

const SECRET: &str = "llmgw-sk-0123456789abcdefghijklmnopqrstuv";

both_backends!(
    a_claim_link_reveals_the_key_once,
    an_expired_link_reveals_nothing,
    a_wrong_token_reveals_nothing,
    the_claims_table_holds_no_plaintext_secret,
    two_claims_at_once_reveal_the_key_once,
);

fn invalid<T: std::fmt::Debug>(r: Result<T, PeopleError>) {
    assert!(matches!(r, Err(PeopleError::ClaimInvalid)), "{r:?}");
}

async fn a_claim_link_reveals_the_key_once(b: Backend) {
    let fx = Fx::new(b).await;
    let (token, _) = fx
        .people
        .seal_claim("key-1", SECRET, at(0), None)
        .await
        .unwrap();
    assert!(fx.people.claim_open(&token, at(1)).await.unwrap());
    // Looking does not use it up.
    assert!(fx.people.claim_open(&token, at(1)).await.unwrap());
    let claimed = fx.people.claim(&token, at(2)).await.unwrap();
    assert_eq!(claimed.key_id, "key-1");
    assert_eq!(claimed.secret, SECRET);
    invalid(fx.people.claim(&token, at(3)).await);
    assert!(!fx.people.claim_open(&token, at(3)).await.unwrap());
    // Used up: the sealed copy is gone, the use noted.
    let wiped = "SELECT count(*) FROM key_claims WHERE sealed IS NULL AND claimed_at IS NOT NULL";
    assert_eq!(fx.count(wiped).await, 1);
}

async fn an_expired_link_reveals_nothing(b: Backend) {
    let fx = Fx::with(
        b,
        PeopleConfig {
            claim_ttl: hours(24),
            ..PeopleConfig::default()
        },
    )
    .await;
    let (token, _) = fx
        .people
        .seal_claim("key-1", SECRET, at(0), None)
        .await
        .unwrap();
    assert!(
        fx.people
            .claim_open(&token, at(24 * 3600 - 1))
            .await
            .unwrap()
    );
    assert!(!fx.people.claim_open(&token, at(24 * 3600)).await.unwrap());
    invalid(fx.people.claim(&token, at(24 * 3600)).await);
    // An earlier clock would have worked: the link itself was fine.
    let (other, _) = fx
        .people
        .seal_claim("key-2", SECRET, at(0), None)
        .await
        .unwrap();
    fx.people.claim(&other, at(24 * 3600 - 1)).await.unwrap();
    // A link given its own lifetime keeps to it, and says when it ends.
    let (short, ends) = fx
        .people
        .seal_claim("key-3", SECRET, at(0), Some(hours(1)))
        .await
        .unwrap();
    assert_eq!(ends, at(3600));
    assert!(fx.people.claim_open(&short, at(3599)).await.unwrap());
    invalid(fx.people.claim(&short, at(3600)).await);
}

async fn a_wrong_token_reveals_nothing(b: Backend) {
    let fx = Fx::new(b).await;
    let (token, _) = fx
        .people
        .seal_claim("key-1", SECRET, at(0), None)
        .await
        .unwrap();
    let mut near = token.clone();
    let last = near.pop().unwrap();
    near.push(if last == 'A' { 'B' } else { 'A' });
    for bad in ["", "nonsense", near.as_str()] {
        invalid(fx.people.claim(bad, at(1)).await);
        assert!(!fx.people.claim_open(bad, at(1)).await.unwrap());
    }
    // A wrong guess does not spend the real link.
    assert_eq!(fx.people.claim(&token, at(2)).await.unwrap().secret, SECRET);
}

async fn the_claims_table_holds_no_plaintext_secret(b: Backend) {
    let fx = Fx::new(b).await;
    let (token, _) = fx
        .people
        .seal_claim("key-1", SECRET, at(0), None)
        .await
        .unwrap();
    let sealed: Vec<u8> = match &fx.store {
        llmgw_eventstore::AnyStore::Postgres(s) => {
            sqlx::query_scalar("SELECT sealed FROM key_claims")
                .fetch_one(s.pool())
                .await
                .unwrap()
        }
        llmgw_eventstore::AnyStore::Sqlite(s) => {
            sqlx::query_scalar("SELECT sealed FROM key_claims")
                .fetch_one(s.pool())
                .await
                .unwrap()
        }
    };
    assert!(sealed.len() > SECRET.len());
    let hay = |needle: &[u8]| sealed.windows(needle.len()).any(|w| w == needle);
    assert!(!hay(SECRET.as_bytes()), "the secret is stored in the clear");
    assert!(!hay(b"0123456789"));
    // Nor the token that opens it.
    let by_token = format!("SELECT count(*) FROM key_claims WHERE token_hash = '{token}'");
    assert_eq!(fx.count(&by_token).await, 0);
    assert_eq!(fx.people.claim(&token, at(1)).await.unwrap().secret, SECRET);
}

async fn two_claims_at_once_reveal_the_key_once(b: Backend) {
    let fx = Fx::new(b).await;
    for round in 0..5 {
        let (token, _) = fx
            .people
            .seal_claim("key-1", SECRET, at(0), None)
            .await
            .unwrap();
        let (one, two) = tokio::join!(
            fx.people.claim(&token, at(1)),
            fx.people.claim(&token, at(1))
        );
        let revealed = [&one, &two].iter().filter(|r| r.is_ok()).count();
        assert_eq!(revealed, 1, "round {round}: {one:?} {two:?}");
        for r in [one, two] {
            if let Err(e) = r {
                assert!(matches!(e, PeopleError::ClaimInvalid), "{e}");
            }
        }
    }
}
