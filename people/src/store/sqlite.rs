//! The people tables on SQLite: instants are INTEGER microseconds.

use chrono::{DateTime, Utc};
use sqlx::{Row, SqlitePool, sqlite::SqliteRow};

use super::{
    ClaimRow, NewClaim, NewPassword, NewPerson, NewSession, PersonRow, Rows, SessionRow, db_err,
};
use crate::time::{from_micros, to_micros};
use crate::{PeopleError, Person, Result, Swept};

type Tx = sqlx::Transaction<'static, sqlx::Sqlite>;

/// A write transaction that takes the file's write lock at once, so that
/// its reads and writes see one state even against another process.
async fn begin(pool: &SqlitePool) -> Result<Tx> {
    pool.begin_with("BEGIN IMMEDIATE").await.map_err(db_err)
}

fn instant(us: i64) -> Result<DateTime<Utc>> {
    from_micros(us).ok_or_else(|| PeopleError::Store(format!("instant out of range: {us}")))
}

pub(super) async fn insert_person(pool: &SqlitePool, p: &NewPerson<'_>) -> Result<bool> {
    let done = sqlx::query(
        "INSERT INTO people (user_id, email, name, password_hash, created_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (email) DO NOTHING",
    )
    .bind(p.user_id)
    .bind(p.email)
    .bind(p.name)
    .bind(p.password_hash)
    .bind(to_micros(p.created_at))
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn login(pool: &SqlitePool, email: &str) -> Result<Option<(String, String)>> {
    sqlx::query_as("SELECT user_id, password_hash FROM people WHERE email = $1")
        .bind(email)
        .fetch_optional(pool)
        .await
        .map_err(db_err)
}

pub(super) async fn password_hash(pool: &SqlitePool, user_id: &str) -> Result<Option<String>> {
    sqlx::query_scalar("SELECT password_hash FROM people WHERE user_id = $1")
        .bind(user_id)
        .fetch_optional(pool)
        .await
        .map_err(db_err)
}

pub(super) async fn touch_login(
    pool: &SqlitePool,
    user_id: &str,
    now: DateTime<Utc>,
) -> Result<()> {
    sqlx::query("UPDATE people SET last_login_at = $2 WHERE user_id = $1")
        .bind(user_id)
        .bind(to_micros(now))
        .execute(pool)
        .await
        .map_err(db_err)?;
    Ok(())
}

async fn insert_session<'e>(
    exec: impl sqlx::SqliteExecutor<'e>,
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
    .bind(to_micros(s.created_at))
    .bind(to_micros(s.expires_at))
    .execute(exec)
    .await?;
    Ok(())
}

pub(super) async fn open_session(pool: &SqlitePool, s: &NewSession) -> Result<()> {
    insert_session(pool, s).await.map_err(db_err)
}

pub(super) async fn session(pool: &SqlitePool, token_hash: &str) -> Result<Option<SessionRow>> {
    let row: Option<(String, String, i64, i64, i64)> = sqlx::query_as(
        "SELECT s.user_id, s.csrf_hash, s.created_at, s.last_seen_at, s.expires_at
           FROM people_sessions s JOIN people p ON p.user_id = s.user_id
          WHERE s.token_hash = $1",
    )
    .bind(token_hash)
    .fetch_optional(pool)
    .await
    .map_err(db_err)?;
    row.map(|(user_id, csrf_hash, created, seen, expires)| {
        Ok(SessionRow {
            user_id,
            csrf_hash,
            created_at: instant(created)?,
            last_seen_at: instant(seen)?,
            expires_at: instant(expires)?,
        })
    })
    .transpose()
}

pub(super) async fn touch_session(
    pool: &SqlitePool,
    token_hash: &str,
    now: DateTime<Utc>,
) -> Result<()> {
    // Only forward: see pg.rs.
    sqlx::query(
        "UPDATE people_sessions SET last_seen_at = $2
          WHERE token_hash = $1 AND last_seen_at < $2",
    )
    .bind(token_hash)
    .bind(to_micros(now))
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(())
}

pub(super) async fn close_session(pool: &SqlitePool, token_hash: &str) -> Result<()> {
    sqlx::query("DELETE FROM people_sessions WHERE token_hash = $1")
        .bind(token_hash)
        .execute(pool)
        .await
        .map_err(db_err)?;
    Ok(())
}

pub(super) async fn close_sessions(pool: &SqlitePool, user_id: &str) -> Result<u64> {
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
          WHERE user_id = $1 AND ($3 IS NULL OR password_hash = $3)",
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

pub(super) async fn set_password(pool: &SqlitePool, p: &NewPassword<'_>) -> Result<bool> {
    let mut tx = begin(pool).await?;
    let done = set_password_in(&mut tx, p).await.map_err(db_err)?;
    if done {
        tx.commit().await.map_err(db_err)?;
    }
    Ok(done)
}

pub(super) async fn erase(pool: &SqlitePool, user_id: &str) -> Result<bool> {
    let mut tx = begin(pool).await?;
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
    // The write-ahead log still holds the pages as they were: copied into
    // the file (whose deleted rows are zeroed) and emptied, so that no
    // copy of the person's data is left in it. A reader in the way leaves
    // it for the next checkpoint, which SQLite makes on its own.
    if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(pool)
        .await
    {
        tracing::warn!(error = %e, "the write-ahead log could not be emptied after an erasure");
    }
    Ok(done.rows_affected() == 1)
}

const PERSON: &str = "SELECT user_id, email, name, created_at, last_login_at
                        FROM people WHERE user_id = $1";
const PEOPLE: &str = "SELECT user_id, email, name, created_at, last_login_at
                        FROM people ORDER BY created_at, user_id";

fn person_row(r: &SqliteRow) -> Result<Person> {
    let last: Option<i64> = r.try_get(4).map_err(db_err)?;
    Ok(Person {
        user_id: r.try_get(0).map_err(db_err)?,
        email: r.try_get(1).map_err(db_err)?,
        name: r.try_get(2).map_err(db_err)?,
        created_at: instant(r.try_get(3).map_err(db_err)?)?,
        last_login_at: last.map(instant).transpose()?,
    })
}

pub(super) async fn person(pool: &SqlitePool, user_id: &str) -> Result<Option<Person>> {
    let row = sqlx::query(PERSON)
        .bind(user_id)
        .fetch_optional(pool)
        .await
        .map_err(db_err)?;
    row.as_ref().map(person_row).transpose()
}

pub(super) async fn people(pool: &SqlitePool) -> Result<Vec<Person>> {
    let rows = sqlx::query(PEOPLE).fetch_all(pool).await.map_err(db_err)?;
    rows.iter().map(person_row).collect()
}

pub(super) async fn insert_claim(pool: &SqlitePool, c: &NewClaim<'_>) -> Result<()> {
    sqlx::query(
        "INSERT INTO key_claims (token_hash, key_id, sealed, created_at, expires_at)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(c.token_hash)
    .bind(c.key_id)
    .bind(c.sealed)
    .bind(to_micros(c.created_at))
    .bind(to_micros(c.expires_at))
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(())
}

pub(super) async fn claim_open(
    pool: &SqlitePool,
    token_hash: &str,
    now: DateTime<Utc>,
) -> Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM key_claims
                         WHERE token_hash = $1 AND claimed_at IS NULL
                           AND sealed IS NOT NULL AND expires_at > $2)",
    )
    .bind(token_hash)
    .bind(to_micros(now))
    .fetch_one(pool)
    .await
    .map_err(db_err)
}

pub(super) async fn take_claim(
    pool: &SqlitePool,
    token_hash: &str,
    now: DateTime<Utc>,
) -> Result<Option<(String, Vec<u8>)>> {
    // BEGIN IMMEDIATE holds the write lock from the read on: nobody can
    // claim the link between this read and the update.
    let mut tx = begin(pool).await?;
    let found: Option<(String, Vec<u8>)> = sqlx::query_as(
        "SELECT key_id, sealed FROM key_claims
          WHERE token_hash = $1 AND claimed_at IS NULL
            AND sealed IS NOT NULL AND expires_at > $2",
    )
    .bind(token_hash)
    .bind(to_micros(now))
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
    .bind(to_micros(now))
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
    pool: &SqlitePool,
    now: DateTime<Utc>,
    idle_cutoff: DateTime<Utc>,
) -> Result<Swept> {
    let sessions =
        sqlx::query("DELETE FROM people_sessions WHERE expires_at <= $1 OR last_seen_at < $2")
            .bind(to_micros(now))
            .bind(to_micros(idle_cutoff))
            .execute(pool)
            .await
            .map_err(db_err)?;
    let claims = sqlx::query(
        "UPDATE key_claims SET sealed = NULL WHERE sealed IS NOT NULL AND expires_at <= $1",
    )
    .bind(to_micros(now))
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(Swept {
        sessions: sessions.rows_affected(),
        claims: claims.rows_affected(),
    })
}

pub(super) async fn dump(pool: &SqlitePool) -> Result<Rows> {
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
    let at = |r: &SqliteRow, c: &str| -> Result<Option<DateTime<Utc>>> {
        r.try_get::<Option<i64>, _>(c)
            .map_err(db_err)?
            .map(instant)
            .transpose()
    };
    let need = |t: Option<DateTime<Utc>>| {
        t.ok_or_else(|| PeopleError::Store("a required instant is missing".into()))
    };
    Ok(Rows {
        people: people
            .iter()
            .map(|r| {
                Ok(PersonRow {
                    user_id: r.try_get("user_id").map_err(db_err)?,
                    email: r.try_get("email").map_err(db_err)?,
                    name: r.try_get("name").map_err(db_err)?,
                    password_hash: r.try_get("password_hash").map_err(db_err)?,
                    created_at: need(at(r, "created_at")?)?,
                    last_login_at: at(r, "last_login_at")?,
                })
            })
            .collect::<Result<_>>()?,
        claims: claims
            .iter()
            .map(|r| {
                Ok(ClaimRow {
                    token_hash: r.try_get("token_hash").map_err(db_err)?,
                    key_id: r.try_get("key_id").map_err(db_err)?,
                    sealed: r.try_get("sealed").map_err(db_err)?,
                    created_at: need(at(r, "created_at")?)?,
                    expires_at: need(at(r, "expires_at")?)?,
                    claimed_at: at(r, "claimed_at")?,
                })
            })
            .collect::<Result<_>>()?,
    })
}

pub(super) async fn load(pool: &SqlitePool, rows: &Rows) -> Result<()> {
    let mut tx = begin(pool).await?;
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
        .bind(to_micros(p.created_at))
        .bind(p.last_login_at.map(to_micros))
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
        .bind(to_micros(c.created_at))
        .bind(to_micros(c.expires_at))
        .bind(c.claimed_at.map(to_micros))
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
    }
    tx.commit().await.map_err(db_err)
}
