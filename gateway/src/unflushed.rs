//! This gateway's spend that the views do not hold yet: requests still
//! running (by their estimate, held from the budget check until they
//! end), requests queued for the next flush, and batches on their way to
//! the log (or in it, and not yet read back). Budget checks add it to the
//! views' figures, so a key cannot overshoot its budget at this gateway
//! however long the flush interval or however many requests it runs at
//! once; other gateways' spend still counts once they flush.
//!
//! A batch leaves this tally exactly when the views count it: the usage
//! view marks each gateway's newest batch counted (by its last request
//! id), and the tally is read under the views' lock against that mark. A
//! batch retried after an unanswered commit is the same batch, with the
//! same last request, so it too is counted once, whichever answer came.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

use llmgw_domain::tenancy::{BudgetLevel, Period, Scope};
use llmgw_domain::usage::period_start;
use llmgw_projections::KeyEntry;

use crate::FastMap;

/// What one finished request costs the budgets over its key, in the
/// periods its time falls in.
#[derive(Debug, Clone)]
pub struct Spending {
    pub cost_micros: u64,
    /// The key, whose composed budgets the request counts against (shared
    /// with the request, not copied).
    key: Arc<KeyEntry>,
    /// When the request finished (ms): the periods it counts in.
    pub at_ms: i64,
    /// The start of the day and of the month it finished in: worked out
    /// once, not at each of its budgets on each of its three ways through
    /// the tally.
    day_start: i64,
    month_start: i64,
}

impl Spending {
    /// A request of `key` that cost `cost_micros`, finished at `at_ms`;
    /// None when it costs nothing or no budget is over it.
    pub fn of(key: &Arc<KeyEntry>, cost_micros: u64, at_ms: i64) -> Option<Spending> {
        if cost_micros == 0 || key.limits.budgets.is_empty() {
            return None;
        }
        Some(Spending {
            cost_micros,
            key: key.clone(),
            at_ms,
            day_start: period_start(Period::Day, at_ms),
            month_start: period_start(Period::Month, at_ms),
        })
    }

    /// (scope, id, period, the period's start) of each budget it counts
    /// against, and of its key's own day and month where no budget of the
    /// key is one (what `/me` says the key used, beside its budgets).
    fn pools(&self) -> impl Iterator<Item = (Scope, &str, Period, i64)> {
        let start = |period| match period {
            Period::Day => self.day_start,
            Period::Month => self.month_start,
        };
        let budgets = self.key.limits.budgets.iter();
        let key = &*self.key.key_id;
        let own = [Period::Day, Period::Month].into_iter().filter(move |p| {
            !(self.key.limits.budgets.iter())
                .any(|b| b.scope == Scope::Key && b.period == *p && b.scope_id == key)
        });
        budgets
            .map(move |b| (b.scope, b.scope_id.as_str(), b.period, start(b.period)))
            .chain(own.map(move |p| (Scope::Key, key, p, start(p))))
    }
}

/// Spend per budget pool: by the pool's id, then (scope, period, the
/// period's start). Keyed by the id as a `String` so that a lookup by
/// `&str` allocates nothing.
#[derive(Debug, Default)]
struct Tally(FastMap<String, Vec<(Scope, Period, i64, u64)>>);

impl Tally {
    fn add(&mut self, s: &Spending) {
        for (scope, id, period, start) in s.pools() {
            let pools = match self.0.get_mut(id) {
                Some(pools) => pools,
                None => self.0.entry(id.to_owned()).or_default(),
            };
            match pools
                .iter_mut()
                .find(|p| (p.0, p.1, p.2) == (scope, period, start))
            {
                Some(p) => p.3 = p.3.saturating_add(s.cost_micros),
                None => pools.push((scope, period, start, s.cost_micros)),
            }
        }
    }

    fn take(&mut self, s: &Spending) {
        for (scope, id, period, start) in s.pools() {
            let Some(pools) = self.0.get_mut(id) else {
                continue;
            };
            if let Some(p) = pools
                .iter_mut()
                .find(|p| (p.0, p.1, p.2) == (scope, period, start))
            {
                p.3 = p.3.saturating_sub(s.cost_micros);
            }
            pools.retain(|p| p.3 > 0);
            if pools.is_empty() {
                self.0.remove(id);
            }
        }
    }

    fn get(&self, scope: Scope, id: &str, period: Period, start: i64) -> u64 {
        self.0.get(id).map_or(0, |pools| {
            pools
                .iter()
                .filter(|p| (p.0, p.1, p.2) == (scope, period, start))
                .map(|p| p.3)
                .sum()
        })
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A batch taken off the queue, until the views count it.
#[derive(Debug)]
struct Sent {
    /// Its last row's request id: the views' mark once they count it.
    last_request: String,
    tally: Tally,
}

#[derive(Debug, Default)]
struct Ledger {
    /// Requests running, by their estimate: what they may yet cost.
    held: Tally,
    queued: Tally,
    /// Oldest first, as they are appended.
    sent: VecDeque<Sent>,
}

/// This gateway's spend not yet in the views.
#[derive(Debug, Default)]
pub struct Unflushed {
    /// The name this gateway's batches carry (set by the batcher).
    gateway: OnceLock<String>,
    ledger: Mutex<Ledger>,
}

impl Unflushed {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The name this gateway's batches carry, which the views mark.
    pub(crate) fn name_batches(&self, gateway: &str) {
        let _ = self.gateway.set(gateway.to_owned());
    }

    pub(crate) fn gateway(&self) -> Option<&str> {
        self.gateway.get().map(String::as_str)
    }

    /// A request's estimate, counted while it runs (until `release`).
    pub(crate) fn hold(&self, s: &Spending) {
        self.lock().held.add(s);
    }

    pub(crate) fn release(&self, s: &Spending) {
        self.lock().held.take(s);
    }

    pub(crate) fn queued(&self, s: &Spending) {
        self.lock().queued.add(s);
    }

    /// A queued request that will never be appended (the queue was full,
    /// or the log refused it).
    pub(crate) fn unqueued(&self, s: &Spending) {
        self.lock().queued.take(s);
    }

    /// Requests taken off the queue into a batch whose last row is
    /// `last_request`, before it is appended.
    pub(crate) fn sent<'a>(&self, last_request: &str, rows: impl Iterator<Item = &'a Spending>) {
        let mut tally = Tally::default();
        let mut ledger = self.lock();
        for s in rows {
            ledger.queued.take(s);
            tally.add(s);
        }
        if !tally.is_empty() {
            ledger.sent.push_back(Sent {
                last_request: last_request.to_owned(),
                tally,
            });
        }
    }

    /// A batch that will not reach the log as it was sent (refused, or
    /// split into single rows, which the views count as they land).
    pub(crate) fn unsent(&self, last_request: &str) {
        self.lock().sent.retain(|b| b.last_request != last_request);
    }

    /// What `budget`'s pool has spent at `now_ms` here and not in views
    /// whose newest batch of this gateway ends with `flushed`. Call it
    /// under the views' read lock, so that the mark and the figures it is
    /// added to are of the same moment.
    pub fn pending(&self, flushed: Option<&str>, budget: &BudgetLevel, now_ms: i64) -> u64 {
        self.pending_in(
            flushed,
            (budget.scope, &budget.scope_id, budget.period),
            now_ms,
        )
    }

    /// As [`Unflushed::pending`], of one pool by its scope, id and period:
    /// a budget's, or a budgeted key's own day or month.
    pub fn pending_in(
        &self,
        flushed: Option<&str>,
        (scope, id, period): (Scope, &str, Period),
        now_ms: i64,
    ) -> u64 {
        let mut ledger = self.lock();
        // Batches land one after another: the mark's batch and every one
        // before it are in the views.
        if let Some(mark) = flushed
            && let Some(i) = ledger.sent.iter().position(|b| b.last_request == mark)
        {
            ledger.sent.drain(..=i);
        }
        let start = period_start(period, now_ms);
        let mut n = (ledger.queued.get(scope, id, period, start))
            .saturating_add(ledger.held.get(scope, id, period, start));
        for b in &ledger.sent {
            n = n.saturating_add(b.tally.get(scope, id, period, start));
        }
        n
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const T0: i64 = 1_780_000_000_000;

    fn budget(scope: Scope, id: &str, period: Period) -> BudgetLevel {
        BudgetLevel {
            scope,
            scope_id: id.into(),
            micros: 1_000,
            period,
        }
    }

    /// A key under `budgets`.
    pub(crate) fn key(budgets: &[BudgetLevel]) -> Arc<KeyEntry> {
        let v = serde_json::json!({
            "key_id": "k", "prefix": "llmgw-ab", "project_id": "p",
            "team_id": "t", "org_id": "o", "band": "gold", "routing_profile": null,
            "limits": {"rpm": null, "tpm": null, "budgets": budgets, "models": {"kind": "all"}},
        });
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn spend_counts_until_the_views_mark_its_batch_or_a_later_one() {
        let u = Unflushed::default();
        let team = budget(Scope::Team, "t", Period::Day);
        let month = budget(Scope::Key, "k", Period::Month);
        let k = key(&[team.clone(), month.clone()]);
        let s = |cost| Spending::of(&k, cost, T0).unwrap();
        u.queued(&s(10));
        u.queued(&s(20));
        assert_eq!(u.pending(None, &team, T0), 30);
        u.sent("r2", [s(10), s(20)].iter());
        u.queued(&s(5));
        u.sent("r3", [s(5)].iter());
        u.queued(&s(1));
        assert_eq!(
            u.pending(Some("older"), &month, T0),
            36,
            "nothing counted yet"
        );
        assert_eq!(u.pending(Some("r2"), &month, T0), 6);
        assert_eq!(u.pending(Some("r3"), &month, T0), 1);
        // The next day the team's day pool starts afresh; the month's not.
        let tomorrow = T0 + 86_400_000;
        assert_eq!(u.pending(Some("r3"), &team, tomorrow), 0);
        u.unqueued(&s(1));
        assert_eq!(u.pending(None, &month, T0), 0);
    }

    #[test]
    fn a_later_mark_counts_every_batch_before_it() {
        let u = Unflushed::default();
        let day = budget(Scope::Key, "k", Period::Day);
        let k = key(std::slice::from_ref(&day));
        let s = |cost| Spending::of(&k, cost, T0).unwrap();
        for (i, cost) in [(1, 1), (2, 2), (3, 4)] {
            u.queued(&s(cost));
            u.sent(&format!("r{i}"), [s(cost)].iter());
        }
        assert_eq!(u.pending(Some("r0"), &day, T0), 7);
        assert_eq!(u.pending(Some("r2"), &day, T0), 4);
        u.unsent("r3");
        assert_eq!(u.pending(None, &day, T0), 0);
        assert!(Spending::of(&k, 0, T0).is_none(), "free: exempt");
        assert!(Spending::of(&key(&[]), 5, T0).is_none(), "no budget");
    }
}
