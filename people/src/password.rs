//! Password hashes: argon2id, in the PHC string format.

use argon2::{Algorithm, Argon2, Params, Version};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use subtle::ConstantTimeEq;

use crate::{PeopleError, Result, secret};

/// The only rule for a password: at least this many Unicode code points.
pub const MIN_PASSWORD_CHARS: usize = 12;

const M_COST: u32 = 65_536; // KiB
const T_COST: u32 = 3;
const P_COST: u32 = 4;
const OUTPUT_LEN: usize = 32;
const SALT_LEN: usize = 16;

// Upper bounds when verifying a stored string's own parameters: the table
// is ours, but a corrupted row must not make one sign-in allocate gigabytes.
const MAX_M_COST: u32 = 1 << 20; // 1 GiB
const MAX_T_COST: u32 = 64;
const MAX_OUTPUT_LEN: usize = 128;

/// A stored hash that is not an argon2id PHC string this crate can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unreadable password hash")]
pub struct BadHash;

/// `Err(WeakPassword)` unless `password` has enough code points.
pub(crate) fn check_strength(password: &str) -> Result<()> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(PeopleError::WeakPassword);
    }
    Ok(())
}

/// `$argon2id$v=19$m=65536,t=3,p=4$<salt>$<hash>` with a fresh salt, or
/// `WeakPassword`. Slow on purpose: call it off the async threads.
pub fn hash_password(password: &str) -> Result<String> {
    check_strength(password)?;
    let salt = secret::random::<SALT_LEN>()?;
    hash_with_salt(password, &salt)
        .ok_or_else(|| PeopleError::Store("argon2 refused its own parameters".into()))
}

fn hash_with_salt(password: &str, salt: &[u8]) -> Option<String> {
    let params = Params::new(M_COST, T_COST, P_COST, Some(OUTPUT_LEN)).ok()?;
    let mut out = [0u8; OUTPUT_LEN];
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password_into(password.as_bytes(), salt, &mut out)
        .ok()?;
    Some(format!(
        "$argon2id$v=19$m={M_COST},t={T_COST},p={P_COST}${}${}",
        STANDARD_NO_PAD.encode(salt),
        STANDARD_NO_PAD.encode(out)
    ))
}

/// Whether `password` matches `stored`, derived with the string's own
/// parameters (so hashes made under older settings still verify) and
/// compared in constant time. Anything unreadable is `Err`, never a match.
pub fn verify_password(password: &str, stored: &str) -> std::result::Result<bool, BadHash> {
    let parsed = parse(stored).ok_or(BadHash)?;
    let params =
        Params::new(parsed.m, parsed.t, parsed.p, Some(parsed.hash.len())).map_err(|_| BadHash)?;
    let mut out = vec![0u8; parsed.hash.len()];
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password_into(password.as_bytes(), &parsed.salt, &mut out)
        .map_err(|_| BadHash)?;
    Ok(bool::from(out.ct_eq(&parsed.hash)))
}

struct Parsed {
    m: u32,
    t: u32,
    p: u32,
    salt: Vec<u8>,
    hash: Vec<u8>,
}

fn parse(stored: &str) -> Option<Parsed> {
    let parts: Vec<&str> = stored.split('$').collect();
    let ["", "argon2id", "v=19", params, salt, hash] = parts.as_slice() else {
        return None;
    };
    let mut fields = params.split(',');
    let m: u32 = fields.next()?.strip_prefix("m=")?.parse().ok()?;
    let t: u32 = fields.next()?.strip_prefix("t=")?.parse().ok()?;
    let p: u8 = fields.next()?.strip_prefix("p=")?.parse().ok()?;
    if fields.next().is_some() || m > MAX_M_COST || t > MAX_T_COST {
        return None;
    }
    let salt = STANDARD_NO_PAD.decode(salt).ok()?;
    let hash = STANDARD_NO_PAD.decode(hash).ok()?;
    if hash.len() > MAX_OUTPUT_LEN {
        return None;
    }
    Some(Parsed {
        m,
        t,
        p: u32::from(p),
        salt,
        hash,
    })
}

/// A hash nobody's password is checked against for real: verifying an
/// unknown email against it costs what a real check costs, so the answer's
/// timing does not tell whether an account exists. Made once with
/// [`hash_password`] from a random password nobody kept, and written here
/// rather than made at start-up: making it took argon2's 64 MiB, which a
/// server nobody signs in to then held for good, and a fraction of a
/// second of a core at every start. Its parameters are ours (a test holds
/// them to the constants above), so checking it costs what checking a
/// real one does.
pub(crate) const DUMMY_HASH: &str = "$argon2id$v=19$m=65536,t=3,p=4$DzLj2oJuVXs+74XMXik09A$mzd1gOa/8jWvkITgQzIBRzDKZlkrlgi2JHmHn4tZess";

/// Hashings at once, in the whole process: one per core. Each takes
/// 64 MiB and ~a core for its time; without a bound, strangers posting
/// sign-ups or sign-ins with fresh addresses (each hashed, the unknown
/// ones too) would fill the blocking pool (512 threads, 32 GiB) and starve
/// every other blocking task. Beyond it they wait their turn.
fn hashing_turns() -> &'static std::sync::Arc<tokio::sync::Semaphore> {
    static TURNS: std::sync::OnceLock<std::sync::Arc<tokio::sync::Semaphore>> =
        std::sync::OnceLock::new();
    TURNS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        std::sync::Arc::new(tokio::sync::Semaphore::new(cores))
    })
}

/// Callers waiting for a turn at most, per core: beyond them a sign-up or
/// sign-in is told the server is busy at once, so that a flood of posts
/// neither queues without end nor makes a real sign-in wait behind it for
/// longer than a few hashings.
const WAITING_PER_CORE: usize = 8;

fn waiting() -> &'static std::sync::atomic::AtomicUsize {
    static WAITING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    &WAITING
}

/// One caller in the queue, until it has its turn or goes away.
struct Queued<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A place in a queue of at most `cap` waiting, or busy.
fn queue(waiting: &std::sync::atomic::AtomicUsize, cap: usize) -> Result<Queued<'_>> {
    let place = Queued(waiting);
    if waiting.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= cap {
        return Err(PeopleError::Busy);
    }
    Ok(place)
}

/// A turn, held by the hashing itself: a caller that goes away (a client
/// hanging up) does not free it while the hashing still runs.
async fn turn() -> Result<tokio::sync::OwnedSemaphorePermit> {
    let turns = hashing_turns();
    if let Ok(turn) = turns.clone().try_acquire_owned() {
        return Ok(turn);
    }
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let _queued = queue(waiting(), cores * WAITING_PER_CORE)?;
    turns
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| PeopleError::Store(format!("the hashing turns are closed: {e}")))
}

/// [`hash_password`] on the blocking pool, one of [`hashing_turns`].
pub(crate) async fn hash_blocking(password: &str) -> Result<String> {
    let password = password.to_owned();
    let turn = turn().await?;
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        hash_password(&password)
    })
    .await
    .map_err(|e| PeopleError::Store(format!("the hashing task failed: {e}")))?
}

/// [`verify_password`] on the blocking pool, one of [`hashing_turns`]; an
/// unreadable hash is no match.
pub(crate) async fn verify_blocking(password: &str, stored: &str) -> Result<bool> {
    let (password, stored) = (password.to_owned(), stored.to_owned());
    let turn = turn().await?;
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        verify_password(&password, &stored).unwrap_or_else(|BadHash| {
            tracing::warn!("a stored password hash is unreadable; treated as no match");
            false
        })
    })
    .await
    .map_err(|e| PeopleError::Store(format!("the hashing task failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The queue for a turn holds `cap` callers; the next is told busy at
    /// once, and a place given up (a turn had, a client gone) is free again.
    #[test]
    fn the_queue_for_a_turn_is_bounded() {
        let waiting = std::sync::atomic::AtomicUsize::new(0);
        let a = queue(&waiting, 2).unwrap();
        let _b = queue(&waiting, 2).unwrap();
        assert!(matches!(queue(&waiting, 2), Err(PeopleError::Busy)));
        drop(a);
        assert!(queue(&waiting, 2).is_ok());
        assert_eq!(waiting.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    /// With every turn taken, a hashing waits (it cannot start however long
    /// it is given); a turn given back lets it through.
    #[tokio::test]
    async fn hashings_wait_for_a_turn() {
        // Every turn there is (others' included: they are waited for).
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let all = u32::try_from(cores).unwrap();
        let taken = hashing_turns().acquire_many(all).await.unwrap();
        let hashing = tokio::spawn(hash_blocking("a long enough password"));
        tokio::task::yield_now().await;
        assert!(!hashing.is_finished());
        let waited = tokio::time::timeout(std::time::Duration::from_millis(300), async {
            while !hashing.is_finished() {
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(waited.is_err(), "a hashing ran with no turn free");
        drop(taken);
        assert!(hashing.await.unwrap().unwrap().starts_with("$argon2id$"));
    }

    #[test]
    fn the_dummy_hash_costs_what_a_new_one_costs() {
        let parsed = parse(DUMMY_HASH).expect("the dummy hash reads");
        assert_eq!(
            (
                parsed.m,
                parsed.t,
                parsed.p,
                parsed.salt.len(),
                parsed.hash.len()
            ),
            (M_COST, T_COST, P_COST, SALT_LEN, OUTPUT_LEN)
        );
        assert_eq!(
            verify_password(&"x".repeat(MIN_PASSWORD_CHARS), DUMMY_HASH),
            Ok(false)
        );
    }
}
