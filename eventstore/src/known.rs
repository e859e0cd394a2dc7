//! The head of the log as this store's group writer last left it, so that
//! the next group can be planned before the control row is locked and
//! written in one statement that checks, under the lock, that the head is
//! still that one (the fast path of `postgres.rs` and `sqlite.rs`).
//!
//! Why: a group written the careful way is four round trips (begin; lock
//! the control row and read the lease, the group's event ids and its
//! streams' versions; insert; commit). When nothing else has written since
//! this store's last group, everything the careful way reads is already
//! known: the head and its hash, the epoch, and the versions of the streams
//! this store wrote or looked up. One statement then checks the fence, the
//! head and the clock and writes the rows, in one round trip and one
//! implicit transaction; when any check fails it writes nothing and the
//! group is written the careful way, which also refreshes what is known.
//!
//! What is *not* known is whether an event id is already in the log (a
//! retry): the fast statement's insert then fails on the unique event id,
//! writes nothing, and the careful way answers the retry. A group whose
//! plan holds any refusal (a version conflict, which for a retry the careful
//! way would answer as the retry) is also written the careful way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, Utc};

use crate::Writer;
use crate::append::{self, Locked, Planned, Prepared};

/// At most this many streams' versions are kept; past it they are
/// forgotten and looked up again the careful way.
const MAX_STREAMS: usize = 10_000;

#[derive(Debug)]
struct Known {
    position: u64,
    hash: [u8; 32],
    epoch: u64,
    /// When the last event this store wrote was recorded (no earlier than
    /// the last lock's clock): the next group's time is never before it.
    recorded_at: DateTime<Utc>,
    streams: HashMap<String, u64>,
}

/// What the fast statement must find under the lock for its plan to hold.
#[derive(Debug)]
pub(crate) struct Expect {
    pub(crate) position: u64,
    pub(crate) hash: [u8; 32],
    pub(crate) epoch: u64,
    /// The lease holder the group writes for; `None` for observers, who
    /// are not fenced.
    pub(crate) holder: Option<String>,
    /// The group's time (as the careful way takes it under the lock): the
    /// statement checks that it is not in the database's future and not
    /// more than [`CLOCK_SLACK_MS`] in its past.
    pub(crate) recorded_at: DateTime<Utc>,
}

/// How far behind the database's clock the writer's may be for the fast
/// path; a writer whose clock is further off (or ahead) writes the careful
/// way, with the database's time.
pub(crate) const CLOCK_SLACK_MS: i64 = 1000;

#[derive(Debug, Default)]
pub(crate) struct Head {
    known: Mutex<Option<Known>>,
    /// Set when the fast statement found the writer's clock out of step
    /// with the database's: from then on every group goes the careful way.
    clock_off: AtomicBool,
}

impl Head {
    fn lock(&self) -> MutexGuard<'_, Option<Known>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets the head: the next group goes the careful way.
    pub(crate) fn forget(&self) {
        *self.lock() = None;
    }

    pub(crate) fn clock_off(&self) {
        if !self.clock_off.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "this machine's clock is not within {CLOCK_SLACK_MS} ms behind the event store's; \
                 appends take the database's time under the lock (one round trip more each)"
            );
        }
        self.forget();
    }

    /// After a group written (or refused whole) the careful way: `lock` as
    /// read under the control row's lock, `versions` the group's streams'
    /// versions read with it, `planned` what was then committed (`None`:
    /// nothing was).
    pub(crate) fn learn_locked(
        &self,
        group: &[Prepared],
        lock: &Locked,
        versions: &HashMap<String, u64>,
        planned: Option<&Planned<'_>>,
    ) {
        let mut known = self.lock();
        let still = known
            .as_ref()
            .is_some_and(|k| k.position == lock.position && k.hash == lock.hash);
        let mut streams = match known.take() {
            Some(k) if still => k.streams,
            _ => HashMap::new(),
        };
        // A stream of the group not in the log is known to be at 0.
        for s in group.iter().flat_map(|p| &p.stream_ids) {
            streams.insert(s.clone(), versions.get(s).copied().unwrap_or(0));
        }
        let (position, hash) = match planned {
            Some(p) => {
                for (s, v) in &p.stream_versions {
                    streams.insert((*s).to_owned(), *v);
                }
                (p.head, p.head_hash)
            }
            None => (lock.position, lock.hash),
        };
        if streams.len() > MAX_STREAMS {
            streams.clear();
        }
        *known = Some(Known {
            position,
            hash,
            epoch: lock.epoch,
            recorded_at: lock.now,
            streams,
        });
    }

    /// After the fast statement wrote `planned`.
    pub(crate) fn learn_fast(&self, planned: &Planned<'_>, expect: &Expect) {
        let mut known = self.lock();
        let Some(k) = known.as_mut() else {
            return;
        };
        for (s, v) in &planned.stream_versions {
            k.streams.insert((*s).to_owned(), *v);
        }
        k.position = planned.head;
        k.hash = planned.head_hash;
        k.recorded_at = expect.recorded_at;
    }

    /// The group planned against what is known, if everything it needs is
    /// known and every request in it would be written: `None` sends it the
    /// careful way. The test seams (`hooked`) sit between the lock and the
    /// fence check, which the fast way does at once: with a hook every
    /// group goes the careful way.
    pub(crate) fn plan<'a>(
        &self,
        hooked: bool,
        group: &'a [Prepared],
    ) -> Option<(Planned<'a>, Expect)> {
        if hooked || self.clock_off.load(Ordering::Relaxed) {
            return None;
        }
        let known = self.lock();
        let k = known.as_ref()?;
        // One fence for the whole statement: every request writes for the
        // same lease (or none is fenced).
        let holder = match &group.first()?.writer {
            Writer::Leader(t) => {
                let same = group
                    .iter()
                    .all(|p| matches!(&p.writer, Writer::Leader(u) if u == t));
                if !same || t.epoch != k.epoch {
                    return None;
                }
                Some(t.holder.clone())
            }
            Writer::Observer { .. } => {
                if !group
                    .iter()
                    .all(|p| matches!(p.writer, Writer::Observer { .. }))
                {
                    return None;
                }
                None
            }
        };
        let mut versions = HashMap::new();
        for s in group.iter().flat_map(|p| &p.stream_ids) {
            versions.insert(s.clone(), *k.streams.get(s)?);
        }
        let recorded_at = append::micros(Utc::now()).max(k.recorded_at);
        let lock = Locked {
            position: k.position,
            hash: k.hash,
            epoch: k.epoch,
            holder: holder.clone(),
            live: true,
            now: recorded_at,
        };
        let planned = append::plan_group(group, &lock, &[], &versions);
        if planned.rows.is_empty() || planned.outcomes.iter().any(Result::is_err) {
            return None;
        }
        Some((
            planned,
            Expect {
                position: k.position,
                hash: k.hash,
                epoch: k.epoch,
                holder,
                recorded_at,
            },
        ))
    }
}
