//! The people tables on PostgreSQL.

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row, postgres::PgRow};

use super::{
    ClaimRow, NewClaim, NewPassword, NewPerson, NewSession, PersonRow, Rows, SessionRow, db_err,
};
use crate::{PeopleError, Person, Result, Swept};

type Tx = sqlx::Transaction<'static, sqlx::Postgres>;

pub(super) async fn insert_person(pool: &PgPool, p: &NewPerson<'_>) -> Result<bool> {
    let done = sqlx::query(
        "INSERT INTO people (user_id, email, name, password_hash, created_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (email) DO NOTHING",
    )
    .bind(p.user_id)
    .bind(p.email)
    .bind(p.name)
    .bind(p.password_hash)
    .bind(p.created_at)
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn login(pool: &PgPool, email: &str) -> Result<Option<(String, String)>> {
    sqlx::query_as("SELECT user_id, password_hash FROM people WHERE email = $1")
        .bind(email)
        .fetch_optional(pool)
        .await
        .map_err(db_err)
}

pub(super) async fn password_hash(pool: &PgPool, user_id: &str) -> Result<Option<String>> {
    sqlx::query_scalar("SELECT password_hash FROM people WHERE user_id = $1")
        .bind(user_id)
        .fetch_optional(pool)
        .await
        .map_err(db_err)
}

pub(super) async fn touch_login(pool: &PgPool, user_id: &str, now: DateTime<Utc>) -> Result<()> {
    sqlx::query("UPDATE people SET last_login_at = $2 WHERE user_id = $1")
        .bind(user_id)
        .bind(now)
        .execute(pool)
        .await
        .map_err(db_err)?;
    Ok(())
}

async fn insert_session<'e>(
    exec: impl sqlx::PgExecutor<'e>,
    s: &NewSession,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO people_sessions
             (token_hash, user_id, csrf_hash, created_at, last_seen_at, expires_at)
         VALUES ($1, $2, $3, $4, $4, $5)",
    )
    .bind(&s.token_hash)
    .bind(&s.user_id)
    .bind(&s.csrf_hash)
    .bind(s.created_at)
    .bind(s.expires_at)
    .execute(exec)
    .await?;
    Ok(())
}

pub(super) async fn open_session(pool: &PgPool, s: &NewSession) -> Result<()> {
    insert_session(pool, s).await.map_err(db_err)
}

pub(super) async fn session(pool: &PgPool, token_hash: &str) -> Result<Option<SessionRow>> {
    let row = sqlx::query(
        "SELECT s.user_id, s.csrf_hash, s.created_at, s.last_seen_at, s.expires_at
           FROM people_sessions s JOIN people p ON p.user_id = s.user_id
          WHERE s.token_hash = $1",
    )
    .bind(token_hash)
    .fetch_optional(pool)
    .await
    .map_err(db_err)?;
    row.map(|r| {
        Ok(SessionRow {
            user_id: r.try_get(0)?,
            csrf_hash: r.try_get(1)?,
            created_at: r.try_get(2)?,
            last_seen_at: r.try_get(3)?,
            expires_at: r.try_get(4)?,
        })
    })
    .transpose()
    .map_err(db_err)
}

pub(super) async fn touch_session(
    pool: &PgPool,
    token_hash: &str,
    now: DateTime<Utc>,
) -> Result<()> {
    // Only forward: a request carrying an older `now` must not shorten
    // the session's idle time.
    sqlx::query(
        "UPDATE people_sessions SET last_seen_at = $2
          WHERE token_hash = $1 AND last_seen_at < $2",
    )
    .bind(token_hash)
    .bind(now)
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(())
}

pub(super) async fn close_session(pool: &PgPool, token_hash: &str) -> Result<()> {
    sqlx::query("DELETE FROM people_sessions WHERE token_hash = $1")
        .bind(token_hash)
        .execute(pool)
        .await
        .map_err(db_err)?;
    Ok(())
}

pub(super) async fn close_sessions(pool: &PgPool, user_id: &str) -> Result<u64> {
    let done = sqlx::query("DELETE FROM people_sessions WHERE user_id = $1")
        .bind(user_id)
        .execute(pool)
        .await
        .map_err(db_err)?;
    Ok(done.rows_affected())
}

async fn set_password_in(
    tx: &mut Tx,
    p: &NewPassword<'_>,
) -> std::result::Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE people SET password_hash = $2
          WHERE user_id = $1 AND ($3::text IS NULL OR password_hash = $3)",
    )
    .bind(p.user_id)
    .bind(p.hash)
    .bind(p.replaces)
    .execute(&mut **tx)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    sqlx::query("DELETE FROM people_sessions WHERE user_id = $1")
        .bind(p.user_id)
        .execute(&mut **tx)
        .await?;
    if let Some(s) = p.reopen {
        insert_session(&mut **tx, s).await?;
    }
    Ok(true)
}

pub(super) async fn set_password(pool: &PgPool, p: &NewPassword<'_>) -> Result<bool> {
    let mut tx = pool.begin().await.map_err(db_err)?;
    let done = set_password_in(&mut tx, p).await.map_err(db_err)?;
    if done {
        tx.commit().await.map_err(db_err)?;
    }
    Ok(done)
}

pub(super) async fn erase(pool: &PgPool, user_id: &str) -> Result<bool> {
    let mut tx = pool.begin().await.map_err(db_err)?;
    sqlx::query("DELETE FROM people_sessions WHERE user_id = $1")
        .bind(user_id)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
    let done = sqlx::query("DELETE FROM people WHERE user_id = $1")
        .bind(user_id)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
    tx.commit().await.map_err(db_err)?;
    Ok(done.rows_affected() == 1)
}

const PERSON: &str = "SELECT user_id, email, name, created_at, last_login_at
                        FROM people WHERE user_id = $1";
const PEOPLE: &str = "SELECT user_id, email, name, created_at, last_login_at
                        FROM people ORDER BY created_at, user_id";

fn person_row(r: &PgRow) -> std::result::Result<Person, sqlx::Error> {
    Ok(Person {
        user_id: r.try_get(0)?,
        email: r.try_get(1)?,
        name: r.try_get(2)?,
        created_at: r.try_get(3)?,
        last_login_at: r.try_get(4)?,
    })
}

pub(super) async fn person(pool: &PgPool, user_id: &str) -> Result<Option<Person>> {
    let row = sqlx::query(PERSON)
        .bind(user_id)
        .fetch_optional(pool)
        .await
        .map_err(db_err)?;
    row.as_ref().map(person_row).transpose().map_err(db_err)
}

pub(super) async fn people(pool: &PgPool) -> Result<Vec<Person>> {
    let rows = sqlx::query(PEOPLE).fetch_all(pool).await.map_err(db_err)?;
    rows.iter()
        .map(person_row)
        .collect::<std::result::Result<_, _>>()
        .map_err(db_err)
}

pub(super) async fn insert_claim(pool: &PgPool, c: &NewClaim<'_>) -> Result<()> {
    sqlx::query(
        "INSERT INTO key_claims (token_hash, key_id, sealed, created_at, expires_at)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(c.token_hash)
    .bind(c.key_id)
    .bind(c.sealed)
    .bind(c.created_at)
    .bind(c.expires_at)
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(())
}

pub(super) async fn claim_open(
    pool: &PgPool,
    token_hash: &str,
    now: DateTime<Utc>,
) -> Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM key_claims
                         WHERE token_hash = $1 AND claimed_at IS NULL
                           AND sealed IS NOT NULL AND expires_at > $2)",
    )
    .bind(token_hash)
    .bind(now)
    .fetch_one(pool)
    .await
    .map_err(db_err)
}

pub(super) async fn take_claim(
    pool: &PgPool,
    token_hash: &str,
    now: DateTime<Utc>,
) -> Result<Option<(String, Vec<u8>)>> {
    let mut tx = pool.begin().await.map_err(db_err)?;
    // FOR UPDATE: a second claim of the same link waits here, then finds
    // it claimed.
    let found: Option<(String, Vec<u8>)> = sqlx::query_as(
        "SELECT key_id, sealed FROM key_claims
          WHERE token_hash = $1 AND claimed_at IS NULL
            AND sealed IS NOT NULL AND expires_at > $2
            FOR UPDATE",
    )
    .bind(token_hash)
    .bind(now)
    .fetch_optional(&mut *tx)
    .await
    .map_err(db_err)?;
    let Some(found) = found else {
        return Ok(None);
    };
    let done = sqlx::query(
        "UPDATE key_claims SET claimed_at = $2, sealed = NULL
          WHERE token_hash = $1 AND claimed_at IS NULL",
    )
    .bind(token_hash)
    .bind(now)
    .execute(&mut *tx)
    .await
    .map_err(db_err)?;
    if done.rows_affected() != 1 {
        return Ok(None);
    }
    tx.commit().await.map_err(db_err)?;
    Ok(Some(found))
}

pub(super) async fn sweep(
    pool: &PgPool,
    now: DateTime<Utc>,
    idle_cutoff: DateTime<Utc>,
) -> Result<Swept> {
    let sessions =
        sqlx::query("DELETE FROM people_sessions WHERE expires_at <= $1 OR last_seen_at < $2")
            .bind(now)
            .bind(idle_cutoff)
            .execute(pool)
            .await
            .map_err(db_err)?;
    let claims = sqlx::query(
        "UPDATE key_claims SET sealed = NULL WHERE sealed IS NOT NULL AND expires_at <= $1",
    )
    .bind(now)
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(Swept {
        sessions: sessions.rows_affected(),
        claims: claims.rows_affected(),
    })
}

pub(super) async fn dump(pool: &PgPool) -> Result<Rows> {
    let people = sqlx::query(
        "SELECT user_id, email, name, password_hash, created_at, last_login_at
         FROM people ORDER BY user_id",
    )
    .fetch_all(pool)
    .await
    .map_err(db_err)?;
    let claims = sqlx::query(
        "SELECT token_hash, key_id, sealed, created_at, expires_at, claimed_at
         FROM key_claims ORDER BY token_hash",
    )
    .fetch_all(pool)
    .await
    .map_err(db_err)?;
    let person = |r: &PgRow| -> std::result::Result<PersonRow, sqlx::Error> {
        Ok(PersonRow {
            user_id: r.try_get("user_id")?,
            email: r.try_get("email")?,
            name: r.try_get("name")?,
            password_hash: r.try_get("password_hash")?,
            created_at: r.try_get("created_at")?,
            last_login_at: r.try_get("last_login_at")?,
        })
    };
    let claim = |r: &PgRow| -> std::result::Result<ClaimRow, sqlx::Error> {
        Ok(ClaimRow {
            token_hash: r.try_get("token_hash")?,
            key_id: r.try_get("key_id")?,
            sealed: r.try_get("sealed")?,
            created_at: r.try_get("created_at")?,
            expires_at: r.try_get("expires_at")?,
            claimed_at: r.try_get("claimed_at")?,
        })
    };
    Ok(Rows {
        people: people
            .iter()
            .map(person)
            .collect::<std::result::Result<_, _>>()
            .map_err(db_err)?,
        claims: claims
            .iter()
            .map(claim)
            .collect::<std::result::Result<_, _>>()
            .map_err(db_err)?,
    })
}

pub(super) async fn load(pool: &PgPool, rows: &Rows) -> Result<()> {
    let mut tx: Tx = pool.begin().await.map_err(db_err)?;
    // Two copies into one store at once: the second waits, then finds the
    // first's people.
    sqlx::query("LOCK TABLE people IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
    let there: i64 = sqlx::query_scalar("SELECT count(*) FROM people")
        .fetch_one(&mut *tx)
        .await
        .map_err(db_err)?;
    if there > 0 {
        return Err(PeopleError::Store(format!(
            "the destination already has {there} people: copy into a new store"
        )));
    }
    for p in &rows.people {
        sqlx::query(
            "INSERT INTO people (user_id, email, name, password_hash, created_at, last_login_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&p.user_id)
        .bind(&p.email)
        .bind(&p.name)
        .bind(&p.password_hash)
        .bind(p.created_at)
        .bind(p.last_login_at)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
    }
    for c in &rows.claims {
        sqlx::query(
            "INSERT INTO key_claims (token_hash, key_id, sealed, created_at, expires_at, claimed_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&c.token_hash)
        .bind(&c.key_id)
        .bind(c.sealed.as_deref())
        .bind(c.created_at)
        .bind(c.expires_at)
        .bind(c.claimed_at)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
    }
    tx.commit().await.map_err(db_err)
}
