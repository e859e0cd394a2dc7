//! `/profile/usage`: a person's own use, today and this month, all of it
//! and per key (their chat on these pages is one of the rows), the last
//! thirty days drawn by day, and the limits that bind them.
//!
//! Only what is theirs: their own keys (by the rule the admin usage page
//! counts a person's use by, `admin::spend::keys_of_person`) and their
//! chat. A budget set on their project, team or org is shared, so its
//! spend is everyone's under it together, and says so; no other person,
//! and no key but their own, is named.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use chrono::{DateTime, Utc};
use llmgw_domain::tenancy::{Allowed, Effective, Period, Scope, UserStatus};
use llmgw_domain::time::UnixMillis;
use llmgw_domain::usage::period_start;
use llmgw_projections::{DAY_MS, GroupBy, PeriodSpend, Projections, Spend};

use crate::admin::chart::{self, Chart};
use crate::admin::{fmt, spend};
use crate::session::Person;
use crate::{Chrome, Visitor, Web, WebError, render};

/// Days the chart draws, today the last.
const CHART_DAYS: i64 = 30;

/// One period's figures, as the page prints them.
#[derive(Debug, Clone, Default)]
pub(super) struct Figures {
    pub requests: String,
    pub tokens: String,
    pub spend: String,
}

impl Figures {
    /// What `p` holds if it is the period `now` is in; nothing once the
    /// period has rolled over with no request since.
    fn of(p: &PeriodSpend, period: Period, now: i64) -> Figures {
        let current = if p.start == period_start(period, now) {
            *p
        } else {
            PeriodSpend::default()
        };
        Figures {
            requests: fmt::count(current.requests),
            tokens: fmt::count(current.tokens),
            spend: fmt::exact_money(current.micros),
        }
    }
}

/// A line of the use table: all of it, the chat, or one key.
#[derive(Debug, Clone)]
pub(super) struct UseRow {
    /// The row's element id, for links and tests.
    pub id: String,
    pub what: String,
    /// The key's prefix and project, or what the chat stands for.
    pub detail: String,
    /// Why a key no longer works (revoked, stopped, expired); empty while
    /// it works.
    pub ended: &'static str,
    pub today: Figures,
    pub month: Figures,
    pub requests_ever: String,
    pub spend_ever: String,
    pub last: String,
}

impl UseRow {
    fn new(id: String, what: String, detail: String, s: &Spend, now: i64) -> UseRow {
        UseRow {
            id,
            what,
            detail,
            ended: "",
            today: Figures::of(&s.day, Period::Day, now),
            month: Figures::of(&s.month, Period::Month, now),
            requests_ever: fmt::count(s.requests),
            spend_ever: fmt::exact_money(s.total_micros),
            last: fmt::when(s.last_at),
        }
    }
}

/// One level's rates.
#[derive(Debug, Clone)]
pub(super) struct RateRow {
    pub level: String,
    pub rpm: String,
    pub tpm: String,
}

/// One level's budget and what is spent of it in its current period.
#[derive(Debug, Clone)]
pub(super) struct BudgetRow {
    pub level: String,
    pub budget: String,
    pub period: &'static str,
    pub spent: String,
    pub left: String,
    /// Spent to the budget, 0 to 100, for the meter.
    pub percent: u64,
    /// The level is above one key: its spend is everyone's under it.
    pub shared: bool,
}

/// Limits that bind some of what a person uses: the same for their chat
/// and every key of theirs that no limit of its own sets apart.
#[derive(Debug, Clone)]
pub(super) struct LimitSet {
    /// Their chat and the keys these limits bind.
    pub applies_to: Vec<String>,
    pub project: String,
    /// The tightest on the way down: what one of them alone can reach.
    pub rpm: String,
    pub tpm: String,
    pub rates: Vec<RateRow>,
    pub budgets: Vec<BudgetRow>,
    pub models: String,
}

#[derive(Debug, askama::Template)]
#[template(path = "pages/usage.html")]
struct UsagePage {
    chrome: Chrome,
    today: String,
    month: String,
    /// The person's whole use: keys and chat together.
    total: UseRow,
    rows: Vec<UseRow>,
    /// Inline SVG made by `chart::stacked_bars` (escaped there).
    charts: Vec<String>,
    limits: Vec<LimitSet>,
    /// Why there are no limits to show, when there are none.
    no_limits: Option<&'static str>,
    /// How far behind the figures may be: the usage flush interval.
    behind: String,
}

pub(super) async fn page(
    State(web): State<Arc<Web>>,
    visitor: Visitor,
) -> Result<Response, WebError> {
    super::people(&web)?;
    let person = visitor.person()?;
    let chrome = Chrome::for_visitor(&web, &visitor);
    let now = UnixMillis::now();
    let mut page = {
        let views = web.views();
        mine(&views, person, chrome, now)
    };
    if let Some(every) = web.settings.usage_flush {
        page.behind = format!("up to {} behind", interval(every));
    }
    render(&page)
}

/// What the profile shows of a person's use: today's and this month's,
/// keys and chat together.
pub(super) fn summary(web: &Web, me: &str) -> (Figures, Figures) {
    let now = UnixMillis::now().0;
    let s = web
        .views()
        .usage
        .people
        .get(me)
        .copied()
        .unwrap_or_default();
    (
        Figures::of(&s.day, Period::Day, now),
        Figures::of(&s.month, Period::Month, now),
    )
}

/// The page's figures, from the views under one read.
fn mine(views: &Projections, person: &Person, chrome: Chrome, now: UnixMillis) -> UsagePage {
    let me = person.user_id.as_str();
    let total = UseRow::new(
        "use-total".into(),
        "All your use".into(),
        "your keys and your chat together".into(),
        &views.usage.people.get(me).copied().unwrap_or_default(),
        now.0,
    );
    let user = views.tenancy.tenancy.users.get(me);
    let (limits, no_limits) = match user {
        Some(u) if u.status == UserStatus::Erased => (Vec::new(), Some("erased")),
        None => (Vec::new(), Some("pending")),
        Some(u) if u.project_id.is_none() => (Vec::new(), Some("pending")),
        Some(_) => (limit_sets(views, me, now), None),
    };
    UsagePage {
        chrome,
        today: day_label(now.0),
        month: month_label(now.0),
        total,
        rows: rows(views, me, now),
        charts: charts(views, me, now.0),
        no_limits: no_limits.or(limits.is_empty().then_some("none")),
        behind: "up to one usage flush behind (how often is the operators' setting, a minute unless they chose another)".into(),
        limits,
    }
}

/// The chat's row, then each key's, most spent this month first.
fn rows(views: &Projections, me: &str, now: UnixMillis) -> Vec<UseRow> {
    let tenancy = &views.tenancy.tenancy;
    let none = Spend::default();
    let chat_id = format!("{}{me}", llmgw_projections::SESSION_KEY_PREFIX);
    let mut used: std::collections::BTreeMap<&str, &Spend> = spend::keys_of_person(views, me)
        .map(|(id, s)| (id.as_str(), s))
        .collect();
    let chat_spend = used.remove(chat_id.as_str()).unwrap_or(&none);
    let chat_in = match tenancy.users.get(me).and_then(|u| u.project_id.as_deref()) {
        Some(p) => format!("counted in project {p}"),
        None => "not in a project yet".to_owned(),
    };
    let mut rows = vec![UseRow::new(
        "use-chat".into(),
        "Chat on these pages".into(),
        chat_in,
        chat_spend,
        now.0,
    )];
    // Their keys with use, and the live ones without any yet.
    let live = (tenancy.keys.iter())
        .filter(|(_, k)| k.owner.as_deref() == Some(me) && spend::ended(tenancy, k, now).is_empty())
        .map(|(id, _)| id.as_str());
    let mut ids: Vec<&str> = used.keys().copied().chain(live).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut keys: Vec<(UseRow, u64)> = ids
        .into_iter()
        .map(|id| {
            let s = used.get(id).copied().unwrap_or(&none);
            let month = if s.month.start == period_start(Period::Month, now.0) {
                s.month.micros
            } else {
                0
            };
            let mut row = UseRow::new(
                format!("use-key-{id}"),
                id.to_owned(),
                String::new(),
                s,
                now.0,
            );
            if let Some(k) = tenancy.keys.get(id) {
                row.what.clone_from(&k.name);
                row.detail = format!("{}… in project {}", k.prefix, k.project_id);
                row.ended = spend::ended(tenancy, k, now);
            }
            (row, month)
        })
        .collect();
    keys.sort_by(|(a, am), (b, bm)| bm.cmp(am).then_with(|| a.what.cmp(&b.what)));
    rows.extend(keys.into_iter().map(|(r, _)| r));
    rows
}

/// The last thirty days of their use by day: requests and spend.
fn charts(views: &Projections, me: &str, now: i64) -> Vec<String> {
    let end = now.div_euclid(DAY_MS) * DAY_MS + DAY_MS;
    let start = end - CHART_DAYS * DAY_MS;
    let n = usize::try_from(CHART_DAYS).unwrap_or(0);
    let (mut requests, mut spent) = (vec![0u64; n], vec![0u64; n]);
    if let Some(series) = views.usage.series_of(GroupBy::Person, me) {
        for (t, b) in series.buckets(DAY_MS, start, end) {
            if let Some(i) = usize::try_from((t - start) / DAY_MS)
                .ok()
                .filter(|i| *i < n)
            {
                requests[i] = requests[i].saturating_add(b.requests);
                spent[i] = spent[i].saturating_add(b.micros);
            }
        }
    }
    let days: Vec<String> = (0..CHART_DAYS)
        .map(|i| {
            DateTime::<Utc>::from_timestamp_millis(start + i * DAY_MS)
                .map(|t| t.format("%m-%d").to_string())
                .unwrap_or_default()
        })
        .collect();
    let chart_of = |title: &str, values: Vec<u64>, format: fn(u64) -> String| {
        chart::stacked_bars(&Chart {
            title: title.to_owned(),
            buckets: days.clone(),
            series: vec![("you".to_owned(), values)],
            format,
        })
    };
    vec![
        chart_of("Requests a day (UTC), last 30 days", requests, fmt::short),
        chart_of("Spend a day (UTC), last 30 days", spent, fmt::short_money),
    ]
}

/// The limits on their chat (their project's) and on each live key of
/// theirs, those that come to the same limits together.
fn limit_sets(views: &Projections, me: &str, now: UnixMillis) -> Vec<LimitSet> {
    let tenancy = &views.tenancy.tenancy;
    let mut bound: Vec<(Effective, String, Vec<String>)> = Vec::new();
    let mut add = |limits: Effective, project: &str, what: String| match bound
        .iter_mut()
        .find(|(l, p, _)| *l == limits && p == project)
    {
        Some((_, _, whats)) => whats.push(what),
        None => bound.push((limits, project.to_owned(), vec![what])),
    };
    if let Some(chat) = views.tenancy.person_entry(me) {
        add(
            chat.limits,
            &chat.project_id,
            "your chat on these pages".into(),
        );
    }
    let mut mine: Vec<_> = (tenancy.keys.values())
        .filter(|k| k.owner.as_deref() == Some(me) && !k.ended(now))
        .filter_map(|k| views.tenancy.key_entry(&k.key_id).map(|e| (k, e)))
        .collect();
    mine.sort_by(|(a, _), (b, _)| a.name.cmp(&b.name));
    for (k, entry) in mine {
        add(
            entry.limits,
            &entry.project_id,
            format!("the key {} ({}…)", k.name, k.prefix),
        );
    }
    bound
        .into_iter()
        .map(|(limits, project, applies_to)| limit_set(views, limits, project, applies_to, now))
        .collect()
}

fn limit_set(
    views: &Projections,
    limits: Effective,
    project: String,
    applies_to: Vec<String>,
    now: UnixMillis,
) -> LimitSet {
    let per_minute =
        |v: Option<u32>| v.map_or_else(|| "no limit".to_owned(), |n| fmt::count(n.into()));
    let rates = (limits.rates.iter())
        .map(|r| RateRow {
            level: level(r.scope, &r.scope_id),
            rpm: per_minute(r.rpm),
            tpm: per_minute(r.tpm),
        })
        .collect();
    let budgets = (limits.budgets.iter())
        .map(|b| {
            let spent = (views.usage.spend_of(b.scope, &b.scope_id)).in_period(b.period, now.0);
            let percent = u128::from(spent.min(b.micros)) * 100;
            BudgetRow {
                level: level(b.scope, &b.scope_id),
                budget: fmt::money(b.micros),
                period: match b.period {
                    Period::Day => "a day (UTC)",
                    Period::Month => "a month (UTC)",
                },
                spent: fmt::money(spent),
                left: fmt::money(b.micros.saturating_sub(spent)),
                percent: u64::try_from(percent.checked_div(b.micros.into()).unwrap_or(100))
                    .unwrap_or(100),
                shared: b.scope != Scope::Key,
            }
        })
        .collect();
    let models = match &limits.models {
        Allowed::All => "every model this server serves".to_owned(),
        Allowed::Only(m) if m.is_empty() => "none: this use is suspended".to_owned(),
        Allowed::Only(m) => m.iter().cloned().collect::<Vec<_>>().join(", "),
    };
    LimitSet {
        applies_to,
        project,
        rpm: per_minute(limits.rpm),
        tpm: per_minute(limits.tpm),
        rates,
        budgets,
        models,
    }
}

/// `project p1`, `team ml`, `org acme`, `this key`.
fn level(scope: Scope, id: &str) -> String {
    match scope {
        Scope::Key => "the key itself".to_owned(),
        s => format!("{} {id}", s.name()),
    }
}

fn day_label(now: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(now)
        .map(|t| t.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

fn month_label(now: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(now)
        .map(|t| t.format("%B %Y").to_string())
        .unwrap_or_default()
}

/// A flush interval as an operator wrote it: `50 ms`, `5 s`, `2 min`.
fn interval(d: std::time::Duration) -> String {
    match d.as_millis() {
        ms if ms % 60_000 == 0 => format!("{} min", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{} s", ms / 1_000),
        ms => format!("{ms} ms"),
    }
}
