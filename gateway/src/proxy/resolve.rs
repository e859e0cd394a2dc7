//! Stage two: which model answers. An alias is its canonical model; a
//! model outside the key's allowlist does not exist for it. A spent budget
//! (or one this request would overrun) turns the request to the model's
//! fallbacks that are free or still affordable; a model without capacity
//! turns it to its fallbacks too. Every fallback obeys the key's allowlist
//! and its budgets. Then, for an on-demand model, a bounded wait.

use std::sync::Arc;
use std::time::Duration;

use llmgw_domain::catalog::Price;
use llmgw_domain::tenancy::BudgetLevel;

use super::admit::Caller;
use super::request::ClientRequest;
use crate::routes::Routes;
use crate::{ApiError, Gateway};

/// The models to try, in order: the first is tried first, the others
/// only when it (or the one before them) has no capacity: admission holds
/// it back, its engines all say they are full, or none can be reached.
/// Its names are borrowed from the routing table and the request, which
/// the request holds to its end.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    /// The canonical model the client asked for.
    pub(crate) asked: &'a str,
    pub(crate) candidates: Vec<&'a str>,
    /// What the request may cost, held against its key's budgets while it
    /// runs (the ticket keeps it to the end).
    pub(crate) hold: Option<Hold>,
    /// An on-demand model the request waited for in vain: with nothing
    /// else to serve it, the client is told that, not "no capacity".
    pub(crate) not_started: Option<NotStarted<'a>>,
    /// The on-demand model the request already waited for, if any: not
    /// waited for again when the request reaches it.
    pub(crate) waited: Option<&'a str>,
}

/// An on-demand model that did not serve in time, and whether it never
/// could here (no node of the cluster could take it: not waited for), or
/// its starts failed and it is held back this long before the next.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NotStarted<'a> {
    pub(crate) model: &'a str,
    pub(crate) fits_nowhere: bool,
    pub(crate) held_back: Option<Duration>,
}

/// How often a request waiting for an on-demand model looks whether its
/// start failed: the reconciler holds a model back on its own pass, which
/// changes no route to wake the request.
const HELD_BACK_POLL: Duration = Duration::from_millis(500);

/// Completion tokens a request that sets no `max_tokens` is held at while
/// it runs: enough that concurrent requests cannot each fit a budget's
/// remainder on their prompts alone.
const UNSET_COMPLETION_HELD: u64 = 4096;

/// A running request's estimate in this gateway's budget figures, until
/// dropped.
#[derive(Debug)]
pub(crate) struct Hold {
    gw: Arc<Gateway>,
    spending: crate::usage::Spending,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(q) = &self.gw.usage {
            q.unflushed().release(&self.spending);
        }
    }
}

/// A known model's name (a metric label may be a model's name only if the
/// gateway knows it: never a client's string).
pub(crate) fn known(gw: &Gateway, routes: &Routes, model: &str) -> bool {
    routes.catalogued(model) || gw.endpoints.knows_model(model)
}

/// The price a model is charged at.
pub(crate) fn price(gw: &Gateway, routes: &Routes, model: &str) -> Price {
    routes.price(model).unwrap_or(gw.config.default_price)
}

/// Plans the request, or refuses it: 404 for a model unknown or not the
/// key's, 429 `insufficient_quota` when a budget leaves nothing to serve.
/// The error comes with the metric label to count it under.
pub(crate) fn plan<'a>(
    gw: &Arc<Gateway>,
    routes: &'a Routes,
    caller: &Caller,
    request: &'a ClientRequest,
) -> Result<Plan<'a>, (Option<String>, ApiError)> {
    let asked = routes.canonical(&request.model);
    // Refusals name the model as asked: the canonical name behind an
    // alias the key may not use is not the caller's to learn.
    if !known(gw, routes, asked) {
        return Err((None, ApiError::unknown_model(&request.model)));
    }
    let label = || Some(asked.to_owned());
    let permits = |m: &str| {
        caller
            .key
            .as_ref()
            .is_none_or(|k| k.limits.models.permits(m))
    };
    if !permits(asked) {
        return Err((label(), ApiError::unknown_model(&request.model)));
    }
    let mut hold = None;
    let (budgets, spent): (&[BudgetLevel], Vec<u64>) = match (&caller.key, &gw.keys) {
        (Some(k), Some(directory)) if !k.limits.budgets.is_empty() => {
            let unflushed = gw.usage.as_deref().map(|q| q.unflushed());
            let now = now_ms();
            // Held before the figures are read: two requests at once each
            // see the other's estimate, so neither fits a remainder both
            // would overrun. Its own estimate is then taken out again.
            // At the dearest model the plan may reach: a fallback for
            // capacity may cost more than the model asked for.
            let held = std::iter::once(asked)
                .chain(routes.fallbacks(asked).iter().map(String::as_str))
                .filter(|m| known(gw, routes, m) && permits(m))
                .map(|m| {
                    price(gw, routes, m).cost(
                        request.prompt_estimate,
                        request.max_completion.unwrap_or(UNSET_COMPLETION_HELD),
                    )
                })
                .max()
                .unwrap_or(0);
            if let (Some(u), Some(spending)) = (unflushed, crate::usage::Spending::of(k, held, now))
            {
                u.hold(&spending);
                hold = Some(Hold {
                    gw: gw.clone(),
                    spending,
                });
            }
            let own = if hold.is_some() { held } else { 0 };
            let spent = directory.budget_spend(k, unflushed, now);
            (
                &k.limits.budgets,
                spent.into_iter().map(|s| s.saturating_sub(own)).collect(),
            )
        }
        _ => (&[], Vec::new()),
    };
    let blocking = |m: &str| {
        crate::limits::blocking_budget(
            budgets,
            &spent,
            price(gw, routes, m),
            request.prompt_estimate,
            // What it may cost, as it is held: a request that sets no
            // `max_tokens` may run to the context's end (it was checked as
            // if it asked for none, and got past a remainder).
            request.max_completion.unwrap_or(UNSET_COMPLETION_HELD),
        )
    };
    let fits = |m: &&String| known(gw, routes, m) && permits(m) && blocking(m).is_none();
    let mut candidates = Vec::new();
    match blocking(asked) {
        None => candidates.push(asked),
        Some(b) => {
            let first = routes.fallbacks(asked).iter().find(fits);
            if first.is_none() {
                let i = budgets.iter().position(|x| x == b).unwrap_or(0);
                let unset = request.max_completion.is_none();
                return Err((label(), budget_refusal(b, spent.get(i).copied(), unset)));
            }
        }
    }
    candidates.extend(
        routes
            .fallbacks(asked)
            .iter()
            .filter(fits)
            .map(String::as_str),
    );
    Ok(Plan {
        asked,
        candidates,
        hold,
        not_started: None,
        waited: None,
    })
}

fn budget_refusal(b: &BudgetLevel, spent: Option<u64>, unset: bool) -> ApiError {
    let period = match b.period {
        llmgw_domain::tenancy::Period::Day => "day",
        llmgw_domain::tenancy::Period::Month => "month",
    };
    match spent {
        Some(s) if s < b.micros => {
            ApiError::budget_short(b.scope.name(), &b.scope_id, period, b.micros - s, unset)
        }
        _ if b.micros == 0 => ApiError::budget_none(b.scope.name(), &b.scope_id),
        _ => ApiError::budget_spent(b.scope.name(), &b.scope_id, period),
    }
}

/// The wall clock in milliseconds, for the views' budget periods (their
/// figures are plain numbers).
pub(crate) fn now_ms() -> i64 {
    llmgw_domain::UnixMillis::now().0
}

/// Tells the control plane an on-demand model is wanted (it keeps it up
/// for its idle time); nothing for any other model.
pub(crate) fn demand(gw: &Gateway, routes: &Routes, model: &str) {
    if routes.on_demand(model)
        && let Some(hook) = gw.demand.get()
    {
        (hook.0)(model);
    }
}

/// The on-demand model a request waits for: the one asked for, or, when
/// that has no endpoint to take it, an on-demand fallback the plan reaches
/// before any model that serves now (else a fallback nothing started would
/// never serve; one behind a serving fallback is not needed).
pub(crate) fn to_wait_for<'a>(gw: &Gateway, routes: &Routes, plan: &Plan<'a>) -> Option<&'a str> {
    let first = *plan.candidates.first()?;
    if routes.on_demand(first) {
        return Some(first);
    }
    // The common case, read before the list of serving models is made: no
    // fallback starts on demand.
    if !plan.candidates[1..].iter().any(|m| routes.on_demand(m)) {
        return None;
    }
    let serving = gw.endpoints.routable_models();
    for m in plan.candidates.iter().copied() {
        if serving.iter().any(|s| s == m) {
            return None;
        }
        if routes.on_demand(m) {
            return Some(m);
        }
    }
    None
}

/// Tells the control plane the model is wanted and, while nothing serves
/// it, waits (bounded) for a replica to come up; not at all when no node
/// of the cluster could ever take it. Why not, when none came up.
pub(crate) async fn wait_on_demand<'a>(
    gw: &Gateway,
    routes: &Routes,
    model: &'a str,
) -> Result<(), NotStarted<'a>> {
    if !routes.on_demand(model) {
        return Ok(());
    }
    let serving = || gw.endpoints.routable_models().iter().any(|m| m == model);
    let not_started = |fits_nowhere| NotStarted {
        model,
        fits_nowhere,
        held_back: None,
    };
    // Not asked for when no node could ever take it: the ask kept a
    // replica "waiting for a place" in `ctl status` for the model's idle
    // time after one refused request.
    if !serving() && gw.fits_nowhere(model) {
        return Err(not_started(true));
    }
    demand(gw, routes, model);
    if serving() {
        return Ok(());
    }
    // Asked for again once it serves: the request that started it counts
    // as use of the replica placed for it (its first stamp came before
    // the placement, and a model used only by the request that started it
    // could never be evicted for another).
    let started = || {
        demand(gw, routes, model);
        Ok(())
    };
    let deadline = tokio::time::Instant::now() + gw.config.on_demand_wait;
    loop {
        let changed = gw.routes_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if serving() {
            return started();
        }
        // Its engine failed to start and the next try is a backoff away:
        // said now, with when, rather than after the whole wait (every
        // start of an engine given a bad flag fails at once).
        if let Some(wait) = gw.held_back(model) {
            return Err(NotStarted {
                held_back: Some(wait),
                ..not_started(false)
            });
        }
        let look = deadline.min(tokio::time::Instant::now() + HELD_BACK_POLL);
        if tokio::time::timeout_at(look, changed).await.is_err()
            && tokio::time::Instant::now() >= deadline
        {
            return if serving() {
                started()
            } else {
                Err(not_started(false))
            };
        }
    }
}
