//! Admission by priority band. An engine's queue is first come, first
//! served whatever the tenant, so the gateway holds the lower bands back
//! when the pool is busy: each band has a saturation threshold, the lowest
//! band's lowest, so it is the first to wait. Saturation is the worse of
//! queue depth and KV-cache occupancy, each against its ceiling, on the
//! least saturated endpoint of the pool. Waiting is bounded in time and in
//! number; past either, the request is refused with 429 and Retry-After.
//! A full waiting room makes room for a higher band: its lowest band's
//! newest request is refused, so a flood of bronze never shuts out gold.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llmgw_domain::tenancy::Band;
use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    pub enabled: bool,
    /// The band of a request that names none.
    pub default_band: Band,
    /// KV-cache occupancy at which an endpoint counts as full.
    pub kv_ceiling: f64,
    /// Requests waiting in an engine at which it counts as full.
    pub waiting_ceiling: f64,
    pub max_wait: Duration,
    /// Requests held at once, across bands.
    pub max_waiting: usize,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            enabled: true,
            default_band: Band::Gold,
            kv_ceiling: 0.9,
            waiting_ceiling: 8.0,
            max_wait: Duration::from_secs(5),
            max_waiting: 1024,
        }
    }
}

/// The saturation below which a band goes straight through: bronze waits
/// first, platinum last (it may push a pool a little past full).
pub fn threshold(band: Band) -> f64 {
    match band {
        Band::Bronze => 0.7,
        Band::Silver => 0.85,
        Band::Gold => 1.0,
        Band::Platinum => 1.2,
    }
}

#[derive(Debug)]
pub struct Admission {
    pub(crate) config: AdmissionConfig,
    room: Mutex<Room>,
    changed: Notify,
}

/// The requests held now, across bands.
#[derive(Debug, Default)]
struct Room {
    /// Places handed out so far: the newest place has the highest number.
    handed: u64,
    held: Vec<Place>,
}

/// One held request's place in the room.
#[derive(Debug)]
struct Place {
    band: Band,
    number: u64,
    /// Given up to a higher band's request: its holder is refused.
    given_up: Arc<AtomicBool>,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Still saturated when its wait ran out.
    Saturated,
    /// Too many requests already waiting, none of a lower band.
    QueueFull,
    /// Its place was given to a higher band's request.
    Displaced,
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Self {
        Admission {
            config,
            room: Mutex::default(),
            changed: Notify::new(),
        }
    }

    fn room(&self) -> std::sync::MutexGuard<'_, Room> {
        self.room.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Requests held now, waiting for room.
    pub fn held(&self) -> usize {
        self.room().held.len()
    }

    /// A place for a request of `band`: a free one, else the one of the
    /// newest request of the lowest band below it, whose holder is
    /// refused. None when the room is full of its band and higher.
    fn enter(&self, band: Band) -> Option<Seat<'_>> {
        let mut room = self.room();
        let mut displaced = false;
        if room.held.len() >= self.config.max_waiting {
            let (i, _) = (room.held.iter().enumerate())
                .filter(|(_, p)| p.band < band)
                .min_by_key(|(_, p)| (p.band, std::cmp::Reverse(p.number)))?;
            room.held
                .swap_remove(i)
                .given_up
                .store(true, Ordering::Relaxed);
            displaced = true;
        }
        room.handed += 1;
        let number = room.handed;
        let given_up = Arc::new(AtomicBool::new(false));
        room.held.push(Place {
            band,
            number,
            given_up: given_up.clone(),
        });
        drop(room);
        if displaced {
            // The displaced request is woken to be refused.
            self.changed.notify_waiters();
        }
        Some(Seat {
            admission: self,
            number,
            given_up,
        })
    }

    /// Something that may lower saturation happened (a request finished,
    /// new figures arrived): waiters look again.
    pub fn load_changed(&self) {
        self.changed.notify_waiters();
    }

    /// Admits `band` once `saturation()` is under its threshold, waiting up
    /// to the configured bound.
    pub async fn admit(&self, band: Band, saturation: impl Fn() -> f64) -> Result<(), Refused> {
        self.admit_first(band, 1, |_| Some(saturation()))
            .await
            .map(|_| ())
    }

    /// Admits `band` to the first of `pools` pools (a model, then its
    /// fallbacks in order) with room for it: `saturation(i)` under the
    /// band's threshold (None: pool `i` cannot take requests at all).
    /// The first pool is read alone while it has room; only when it has
    /// none are the others read, and the request goes to the first of
    /// them with room at once rather than wait (a saturated model whose
    /// fallback was idle refused with 429). With no room anywhere it
    /// waits, bounded, for the first pool to have room. The pool's index.
    pub async fn admit_first(
        &self,
        band: Band,
        pools: usize,
        saturation: impl Fn(usize) -> Option<f64>,
    ) -> Result<usize, Refused> {
        let room = |i: usize| saturation(i).is_some_and(|s| s < threshold(band));
        if !self.config.enabled || room(0) {
            return Ok(0);
        }
        if let Some(i) = (1..pools).find(|i| room(*i)) {
            return Ok(i);
        }
        let first = || (0..pools).find(|i| room(*i));
        // Given back however the wait ends, a client that leaves (the
        // future dropped) included: a place left behind would refuse
        // requests that should wait, for good.
        let seat = self.enter(band).ok_or(Refused::QueueFull)?;
        let deadline = Instant::now() + self.config.max_wait;
        loop {
            let notified = self.changed.notified();
            if seat.given_up() {
                break Err(Refused::Displaced);
            }
            if let Some(i) = first() {
                break Ok(i);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break match first() {
                    _ if seat.given_up() => Err(Refused::Displaced),
                    Some(i) => Ok(i),
                    None => Err(Refused::Saturated),
                };
            }
        }
    }
}

/// A held request's place in the room, until dropped.
struct Seat<'a> {
    admission: &'a Admission,
    number: u64,
    given_up: Arc<AtomicBool>,
}

impl Seat<'_> {
    fn given_up(&self) -> bool {
        self.given_up.load(Ordering::Relaxed)
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        let mut room = self.admission.room();
        if let Some(i) = room.held.iter().position(|p| p.number == self.number) {
            room.held.swap_remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_lowest_band_waits_first_and_goes_when_load_falls() {
        let adm = Arc::new(Admission::new(AdmissionConfig::default()));
        let sat = Arc::new(AtomicU64::new(0.8f64.to_bits()));
        let now = {
            let sat = sat.clone();
            move || f64::from_bits(sat.load(Ordering::Relaxed))
        };
        assert_eq!(
            adm.admit(Band::Silver, now.clone()).await,
            Ok(()),
            "0.8 is under silver's 0.85"
        );
        let waiting = {
            let (adm, now) = (adm.clone(), now.clone());
            tokio::spawn(async move { adm.admit(Band::Bronze, now).await })
        };
        // A second of virtual time with nothing changing: still held.
        tokio::time::advance(Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "bronze is held at 0.8");
        sat.store(0.5f64.to_bits(), Ordering::Relaxed);
        adm.load_changed();
        assert_eq!(waiting.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_is_bounded_in_time_and_number() {
        let adm = Arc::new(Admission::new(AdmissionConfig {
            max_waiting: 1,
            ..AdmissionConfig::default()
        }));
        let full = || 2.0;
        let first = {
            let adm = adm.clone();
            tokio::spawn(async move { adm.admit(Band::Gold, full).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(adm.admit(Band::Gold, full).await, Err(Refused::QueueFull));
        let start = Instant::now();
        assert_eq!(first.await.unwrap(), Err(Refused::Saturated));
        assert!(start.elapsed() <= Duration::from_secs(5));
        assert_eq!(
            adm.admit(Band::Platinum, || 1.1).await,
            Ok(()),
            "platinum passes a little past full"
        );
    }

    /// A pool held back goes to the first of the others with room, at
    /// once; one that cannot take requests (None) is passed over; with no
    /// room anywhere, the first pool to get some takes the request.
    #[tokio::test(start_paused = true)]
    async fn a_request_held_back_goes_to_the_first_pool_with_room() {
        let adm = Arc::new(Admission::new(AdmissionConfig::default()));
        let pools = [Some(1.5), None, Some(0.2)];
        assert_eq!(adm.admit_first(Band::Gold, 3, |i| pools[i]).await, Ok(2));
        assert_eq!(
            adm.admit_first(Band::Gold, 3, |i| [Some(0.5), None, None][i])
                .await,
            Ok(0),
            "room on the first: the others are not read"
        );
        let second = Arc::new(AtomicU64::new(2.0f64.to_bits()));
        let waiting = {
            let (adm, second) = (adm.clone(), second.clone());
            tokio::spawn(async move {
                let now = |i: usize| match i {
                    0 => Some(1.5),
                    _ => Some(f64::from_bits(second.load(Ordering::Relaxed))),
                };
                adm.admit_first(Band::Gold, 2, now).await
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "no room anywhere: held");
        second.store(0.5f64.to_bits(), Ordering::Relaxed);
        adm.load_changed();
        assert_eq!(waiting.await.unwrap(), Ok(1));
    }

    /// A full room makes room for a higher band: the newest request of
    /// the lowest band below it is refused; one of the lowest band held
    /// finds no room.
    #[tokio::test(start_paused = true)]
    async fn a_full_room_gives_the_lowest_bands_newest_place_to_a_higher_band() {
        let adm = Arc::new(Admission::new(AdmissionConfig {
            max_waiting: 3,
            ..AdmissionConfig::default()
        }));
        let hold = |band| {
            let adm = adm.clone();
            tokio::spawn(async move { adm.admit(band, || 2.0).await })
        };
        let mut held = Vec::new();
        for band in [Band::Silver, Band::Bronze, Band::Bronze] {
            held.push(hold(band));
            tokio::task::yield_now().await;
        }
        assert_eq!(adm.held(), 3);
        assert_eq!(
            adm.admit(Band::Bronze, || 2.0).await,
            Err(Refused::QueueFull),
            "no lower band to make room"
        );
        let gold = hold(Band::Gold);
        let newest_bronze = held.pop().unwrap();
        assert_eq!(newest_bronze.await.unwrap(), Err(Refused::Displaced));
        tokio::task::yield_now().await;
        assert!(!held.iter().any(|h| h.is_finished()), "the others wait on");
        assert_eq!(adm.held(), 3);
        let platinum = hold(Band::Platinum);
        let bronze = held.pop().unwrap();
        assert_eq!(bronze.await.unwrap(), Err(Refused::Displaced));
        let platinum_too = hold(Band::Platinum);
        let silver = held.pop().unwrap();
        assert_eq!(silver.await.unwrap(), Err(Refused::Displaced));
        assert_eq!(
            adm.admit(Band::Gold, || 2.0).await,
            Err(Refused::QueueFull),
            "gold and platinum held: none lower"
        );
        for h in [gold, platinum, platinum_too] {
            assert_eq!(h.await.unwrap(), Err(Refused::Saturated));
        }
        assert_eq!(adm.held(), 0);
    }

    /// A held request whose client leaves is no longer counted: the next
    /// one is held, not refused as if the queue were full.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_leaves_frees_its_place() {
        let adm = Arc::new(Admission::new(AdmissionConfig {
            max_waiting: 1,
            ..AdmissionConfig::default()
        }));
        let full = || 2.0;
        let left = {
            let adm = adm.clone();
            tokio::spawn(async move { adm.admit(Band::Gold, full).await })
        };
        tokio::task::yield_now().await;
        left.abort();
        let _ = left.await;
        assert_eq!(
            adm.admit(Band::Gold, full).await,
            Err(Refused::Saturated),
            "held for its wait, then refused as saturated"
        );
    }
}
