//! The relay against the real PostgreSQL: a pause holds a query until the
//! link is restored, a cut fails it, and a lost answer leaves a commit done
//! that its client never heard of.

use std::time::Duration;

use llmgw_testkit::{Relay, TestDb};
use sqlx::{Connection, Executor, PgConnection};

#[tokio::test]
async fn a_paused_link_holds_a_query_until_it_is_restored() {
    let db = TestDb::create().await;
    let relay = Relay::to_postgres(&db.url).await;
    let mut conn = PgConnection::connect(&relay.url(&db.url)).await.unwrap();
    relay.pause();
    let query = tokio::spawn(async move {
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        one
    });
    // A negative: the query must still be waiting (a broken pause answers
    // at once).
    let held = tokio::time::timeout(Duration::from_millis(300), async {
        while !query.is_finished() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(held.is_err(), "the query went through a paused link");
    relay.restore();
    assert_eq!(query.await.unwrap(), 1);
}

#[tokio::test]
async fn a_cut_link_fails_queries_and_connections_until_restored() {
    let db = TestDb::create().await;
    let relay = Relay::to_postgres(&db.url).await;
    let url = relay.url(&db.url);
    let mut conn = PgConnection::connect(&url).await.unwrap();
    relay.cut();
    assert!(conn.execute("SELECT 1").await.is_err());
    assert!(PgConnection::connect(&url).await.is_err());
    relay.restore();
    let mut conn = PgConnection::connect(&url).await.unwrap();
    conn.execute("SELECT 1").await.unwrap();
}

#[tokio::test]
async fn a_lost_answer_to_commit_leaves_the_commit_done() {
    let db = TestDb::create().await;
    let relay = Relay::to_postgres(&db.url).await;
    let mut direct = PgConnection::connect(&db.url).await.unwrap();
    direct.execute("CREATE TABLE t (x int)").await.unwrap();
    let mut conn = PgConnection::connect(&relay.url(&db.url)).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    tx.execute("INSERT INTO t VALUES (7)").await.unwrap();
    relay.lose_reply(b"", b"COMMIT");
    assert!(tx.commit().await.is_err(), "the client heard the answer");
    assert_eq!(relay.replies_lost(), 1);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE x = 7")
        .fetch_one(&mut direct)
        .await
        .unwrap();
    assert_eq!(rows, 1, "the commit happened");
}

/// A statement run on its own commits without a `COMMIT` being sent: the
/// commit trap loses its answer all the same, and inside a transaction it
/// lets the statement's answer through and loses the commit's.
#[tokio::test]
async fn a_lost_answer_to_a_commit_however_made_leaves_it_done() {
    let db = TestDb::create().await;
    let relay = Relay::to_postgres(&db.url).await;
    let mut direct = PgConnection::connect(&db.url).await.unwrap();
    direct.execute("CREATE TABLE t (x int)").await.unwrap();
    let count = |x: i32| format!("SELECT count(*) FROM t WHERE x = {x}");

    let mut conn = PgConnection::connect(&relay.url(&db.url)).await.unwrap();
    relay.lose_commit_reply(b"7007");
    assert!(
        conn.execute("INSERT INTO t VALUES (7007)").await.is_err(),
        "the client heard the answer"
    );
    assert_eq!(relay.replies_lost(), 1);
    let rows: i64 = sqlx::query_scalar(&count(7007))
        .fetch_one(&mut direct)
        .await
        .unwrap();
    assert_eq!(rows, 1, "the statement committed");

    let mut conn = PgConnection::connect(&relay.url(&db.url)).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    relay.lose_commit_reply(b"7008");
    tx.execute("INSERT INTO t VALUES (7008)").await.unwrap();
    assert!(tx.commit().await.is_err(), "the client heard the commit");
    assert_eq!(relay.replies_lost(), 2);
    let rows: i64 = sqlx::query_scalar(&count(7008))
        .fetch_one(&mut direct)
        .await
        .unwrap();
    assert_eq!(rows, 1, "the commit happened");
}
