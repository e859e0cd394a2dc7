//! Usage per key, per person and per model, biggest spender first, one
//! page at a time.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use llmgw_domain::tenancy::Scope;
use llmgw_projections::{ModelStats, Projections, Spend};

use super::{Pager, fmt};

/// One line of a usage table.
#[derive(Debug, Clone)]
pub(crate) struct UsageRow {
    pub id: String,
    /// The key's name, or empty.
    pub name: String,
    pub project: String,
    /// The key's owner, or empty for an operator's key.
    pub owner: String,
    /// Why a key no longer works, in `llmgw keys list`'s words (revoked,
    /// stopped, expired); empty while it works.
    pub ended: &'static str,
    pub requests: String,
    pub tokens: String,
    pub errors: String,
    pub spend: String,
    pub latency: String,
    /// Time to first token (models only).
    pub ttft: String,
    pub last: String,
}

impl UsageRow {
    fn new(id: &str, s: &Spend) -> UsageRow {
        UsageRow {
            id: id.to_owned(),
            name: String::new(),
            project: String::new(),
            owner: String::new(),
            ended: "",
            requests: fmt::count(s.requests),
            tokens: fmt::count(s.total_tokens),
            errors: fmt::count(s.errors),
            spend: fmt::money(s.total_micros),
            latency: latency(s.requests, s.latency_ms_avg(), s.latency_ms_max),
            ttft: String::new(),
            last: fmt::when(s.last_at),
        }
    }
}

fn latency(requests: u64, avg: u64, max: u32) -> String {
    if requests == 0 {
        "—".into()
    } else {
        format!("{avg} / {max} ms")
    }
}

/// Biggest spend first, then most requests, then by id: a stable order,
/// so that paging never shows a row twice.
fn rank<'a>(&(id, s): &(&'a String, &'a Spend)) -> (Reverse<u64>, Reverse<u64>, &'a String) {
    (Reverse(s.total_micros), Reverse(s.requests), id)
}

/// One page of keys (live and revoked), with their use.
pub(crate) fn keys(
    views: &Projections,
    per_page: usize,
    page: usize,
    href: impl Fn(usize) -> String,
) -> (Vec<UsageRow>, Pager) {
    let used = views.usage.spend.get(&Scope::Key);
    let none = Spend::default();
    let mut all: Vec<(&String, &Spend)> = views
        .tenancy
        .tenancy
        .keys
        .keys()
        .map(|id| (id, used.and_then(|u| u.get(id)).unwrap_or(&none)))
        .collect();
    // Only the page is sorted in full; the rest need only be on the right
    // side of it.
    let pager = Pager::new(all.len(), per_page, page, href);
    let range = pager.range();
    let now = llmgw_domain::time::UnixMillis::now();
    if range.end < all.len() {
        all.select_nth_unstable_by_key(range.end, rank);
        all.truncate(range.end);
    }
    all.sort_unstable_by_key(rank);
    let rows = all[range]
        .iter()
        .map(|(id, s)| {
            let mut row = UsageRow::new(id, s);
            if let Some(k) = views.tenancy.tenancy.keys.get(*id) {
                row.name.clone_from(&k.name);
                row.project.clone_from(&k.project_id);
                row.owner = k.owner.clone().unwrap_or_default();
                row.ended = ended(&views.tenancy.tenancy, k, now);
            }
            row
        })
        .collect();
    (rows, pager)
}

/// Why `key` no longer works, as `llmgw keys list` says it: every key that
/// stopped working read "revoked", an unclaimed link's key included.
pub(crate) fn ended(
    tenancy: &llmgw_domain::tenancy::Tenancy,
    key: &llmgw_domain::tenancy::Key,
    now: llmgw_domain::time::UnixMillis,
) -> &'static str {
    if key.revoked {
        "revoked"
    } else if !tenancy.key_stands(key) {
        // Its person was erased.
        "stopped"
    } else if key.ended(now) {
        // Its claim link ended unused, or its own end came.
        "expired"
    } else {
        ""
    }
}

/// One page of people: their own keys' use and their chat, together.
pub(crate) fn people(
    views: &Projections,
    per_page: usize,
    page: usize,
    href: impl Fn(usize) -> String,
) -> (Vec<UsageRow>, Pager) {
    let none = Spend::default();
    let users = &views.tenancy.tenancy.users;
    let mut all: Vec<(&String, &Spend)> = users
        .keys()
        .map(|id| (id, views.usage.people.get(id).unwrap_or(&none)))
        .collect();
    // Someone the tenancy no longer lists (never, today) still shows.
    all.extend(
        views
            .usage
            .people
            .iter()
            .filter(|(id, _)| !users.contains_key(*id)),
    );
    all.sort_unstable_by_key(rank);
    let pager = Pager::new(all.len(), per_page, page, href);
    let shown = &all[pager.range()];
    let mut used_in = projects_used(views, shown.iter().map(|(id, _)| id.as_str()));
    let rows = shown
        .iter()
        .map(|(id, s)| {
            let mut row = UsageRow::new(id, s);
            row.project = match used_in.remove(id.as_str()) {
                Some(projects) => projects_line(projects),
                // No use yet: the project they were approved into.
                None => (users.get(*id))
                    .and_then(|u| u.project_id.clone())
                    .unwrap_or_default(),
            };
            row
        })
        .collect();
    (rows, pager)
}

/// The keys whose use counts for `person`, with that use: their own keys
/// and their chat (`session:<id>`), by the rule the people rows above add
/// them up by, so that a person's own page shows what admins see of them.
pub(crate) fn keys_of_person<'a>(
    views: &'a Projections,
    person: &'a str,
) -> impl Iterator<Item = (&'a String, &'a Spend)> {
    (views.usage.spend.get(&Scope::Key).into_iter().flatten())
        .filter(move |(id, _)| views.usage.person_of_key(id) == Some(person))
}

/// The projects each of `people` used, with their requests: their own
/// keys' projects and, for their chat, the project they stand for. A
/// person's keys may span projects (the row said only the one they were
/// approved into).
fn projects_used<'a>(
    views: &'a Projections,
    people: impl Iterator<Item = &'a str>,
) -> BTreeMap<&'a str, BTreeMap<&'a str, u64>> {
    let tenancy = &views.tenancy.tenancy;
    let mut used: BTreeMap<&str, BTreeMap<&str, u64>> =
        people.map(|p| (p, BTreeMap::new())).collect();
    let Some(spend) = views.usage.spend.get(&Scope::Key) else {
        return BTreeMap::new();
    };
    for (key_id, s) in spend.iter().filter(|(_, s)| s.requests > 0) {
        let Some(person) = views.usage.person_of_key(key_id) else {
            continue;
        };
        let Some(projects) = used.get_mut(person) else {
            continue;
        };
        let project = match tenancy.keys.get(key_id) {
            Some(k) => Some(k.project_id.as_str()),
            None => (tenancy.users.get(person)).and_then(|u| u.project_id.as_deref()),
        };
        if let Some(project) = project {
            *projects.entry(project).or_default() += s.requests;
        }
    }
    used.retain(|_, projects| !projects.is_empty());
    used
}

/// Projects as a row names them: most requests first, then by id.
fn projects_line(projects: BTreeMap<&str, u64>) -> String {
    let mut projects: Vec<(&str, u64)> = projects.into_iter().collect();
    projects.sort_by_key(|&(p, n)| (Reverse(n), p));
    let names: Vec<&str> = projects.into_iter().map(|(p, _)| p).collect();
    names.join(", ")
}

/// Every model that served a request.
pub(crate) fn models(views: &Projections) -> Vec<UsageRow> {
    let mut all: Vec<(&String, &ModelStats)> = views.usage.models.iter().collect();
    all.sort_by_key(|(id, m)| (Reverse(m.cost_micros), Reverse(m.requests), (*id).clone()));
    all.into_iter()
        .map(|(id, m)| {
            let avg = m.latency_ms_total.checked_div(m.requests).unwrap_or(0);
            UsageRow {
                id: id.clone(),
                name: String::new(),
                project: String::new(),
                owner: String::new(),
                ended: "",
                requests: fmt::count(m.requests),
                tokens: fmt::count(m.prompt_tokens.saturating_add(m.completion_tokens)),
                errors: fmt::count(m.errors),
                spend: fmt::money(m.cost_micros),
                latency: latency(m.requests, avg, m.latency_ms_max),
                ttft: m
                    .ttft_ms_total
                    .checked_div(m.ttft_count)
                    .map_or_else(|| "—".to_owned(), |t| format!("{t} ms")),
                last: String::new(),
            }
        })
        .collect()
}
