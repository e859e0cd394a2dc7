//! `/admin/usage`: requests, tokens and spend over time by org, team,
//! project or person, as charts drawn on the server, with the groups'
//! totals for the range underneath.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::Response;
use chrono::{DateTime, Utc};
use llmgw_projections::{
    Bucket, DAY_MS, GroupBy, HOUR_MS, OPERATORS, Projections, Series, UsageView,
};
use serde::Deserialize;

use super::chart::{self, Chart, OTHER};
use super::{Pager, fmt, page_number};
use crate::{Chrome, Viewer, Web, WebError, render};

mod csv;
pub(crate) use csv::csv;

/// Groups drawn on their own; the rest are stacked as "other".
const TOP: usize = 6;
const PER_PAGE: usize = 50;

/// A range the page offers: its name, bar width and number of bars. A
/// bar shorter than a day adds up hourly buckets, a longer one daily ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Range {
    pub name: &'static str,
    step_ms: i64,
    buckets: i64,
}

/// At most about sixty bars a chart: more would be thinner than a pixel
/// or two and make the page heavy, so longer ranges add buckets up.
const RANGES: [Range; 5] = [
    Range {
        name: "24h",
        step_ms: HOUR_MS,
        buckets: 24,
    },
    Range {
        name: "7d",
        step_ms: 3 * HOUR_MS,
        buckets: 7 * 8,
    },
    Range {
        name: "30d",
        step_ms: DAY_MS,
        buckets: 30,
    },
    Range {
        name: "90d",
        step_ms: 2 * DAY_MS,
        buckets: 45,
    },
    Range {
        name: "365d",
        step_ms: 7 * DAY_MS,
        buckets: 53,
    },
];
const DEFAULT_RANGE: usize = 1;

impl Range {
    fn parse(s: Option<&str>) -> Range {
        RANGES
            .into_iter()
            .find(|r| Some(r.name) == s)
            .unwrap_or(RANGES[DEFAULT_RANGE])
    }

    /// `[start, end)` ending with the bucket that holds `now`.
    fn window(self, now: i64) -> (i64, i64) {
        let end = now.div_euclid(self.step_ms) * self.step_ms + self.step_ms;
        (end - self.buckets * self.step_ms, end)
    }

    fn label(self, start_ms: i64) -> String {
        let format = if self.step_ms < DAY_MS {
            "%m-%d %H:00"
        } else {
            "%Y-%m-%d"
        };
        DateTime::<Utc>::from_timestamp_millis(start_ms)
            .map(|t| t.format(format).to_string())
            .unwrap_or_default()
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct UsageQuery {
    by: Option<String>,
    range: Option<String>,
    page: Option<String>,
    /// `YYYY-MM-DD`: the range ends with that day (UTC) instead of now.
    until: Option<String>,
}

/// The end (exclusive, ms) of the day `until` names, if it names one
/// before `now`'s; else None (the range ends now).
fn until_end(until: Option<&str>, now: i64) -> Option<i64> {
    let day = chrono::NaiveDate::parse_from_str(until?, "%Y-%m-%d").ok()?;
    let end = day
        .succ_opt()?
        .and_hms_opt(0, 0, 0)?
        .and_utc()
        .timestamp_millis();
    (end <= now).then_some(end)
}

/// The `YYYY-MM-DD` of the day holding `ms`.
fn day_of(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

/// A link in the page's selectors.
#[derive(Debug, Clone)]
pub(crate) struct Choice {
    pub label: &'static str,
    pub href: String,
    pub current: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct GroupRow {
    pub id: String,
    pub name: String,
    pub requests: String,
    pub tokens: String,
    pub errors: String,
    pub spend: String,
}

#[derive(askama::Template)]
#[template(path = "admin/usage.html")]
struct UsagePage {
    chrome: Chrome,
    by: &'static str,
    range: &'static str,
    by_choices: Vec<Choice>,
    range_choices: Vec<Choice>,
    /// Inline SVG made by `chart::stacked_bars` (escaped there).
    charts: Vec<String>,
    groups: Vec<GroupRow>,
    pager: Pager,
    total: GroupRow,
    from: String,
    to: String,
    earlier: String,
    later: Option<String>,
    /// The same range and grouping as a CSV file.
    csv: String,
}

/// Every group of one kind with its series. By person that is one more
/// than the view keeps, [`OPERATORS`], as `events usage --by person`
/// counts: without it the people's rows added up to less than everything
/// (and than the same range by project), and the two could not be
/// reconciled.
pub(super) struct Groups<'a> {
    usage: &'a UsageView,
    by: GroupBy,
    operators: Option<(String, Series)>,
}

impl<'a> Groups<'a> {
    /// The groups by `by`, with what the operators' keys did in
    /// `[start, end)` when by person.
    pub(super) fn of(usage: &'a UsageView, by: GroupBy, start: i64, end: i64) -> Groups<'a> {
        let operators = (by == GroupBy::Person)
            .then(|| operators(usage, start, end))
            .filter(|s| !(s.hourly.is_empty() && s.daily.is_empty()))
            .map(|s| (OPERATORS.to_owned(), s));
        Groups {
            usage,
            by,
            operators,
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&String, &Series)> {
        (self.usage.series_by(self.by)).chain(self.operators.iter().map(|(id, s)| (id, s)))
    }
}

/// What keys without an owner did in `[start, end)`, bucket by bucket:
/// everything less what counts for a person. The view keeps no series
/// for them, and everything is every project's: with keys on, each
/// request is in a project (its key's, or for a chat the person's), and
/// each that counts for a person is among them.
fn operators(usage: &UsageView, start: i64, end: i64) -> Series {
    let mut out = Series::default();
    let each = |by: GroupBy, out: &mut Series, apply: fn(&mut Bucket, &Bucket)| {
        for (_, s) in usage.series_by(by) {
            for (t, b) in s.hourly.range(start..end.max(start)) {
                apply(out.hourly.entry(*t).or_default(), b);
            }
            for (t, b) in s.daily.range(start..end.max(start)) {
                apply(out.daily.entry(*t).or_default(), b);
            }
        }
    };
    each(GroupBy::Project, &mut out, Bucket::merge);
    each(GroupBy::Person, &mut out, less);
    out.hourly.retain(|_, b| b.requests > 0);
    out.daily.retain(|_, b| b.requests > 0);
    out
}

/// `from` less `what`, field by field.
fn less(from: &mut Bucket, what: &Bucket) {
    from.requests = from.requests.saturating_sub(what.requests);
    from.errors = from.errors.saturating_sub(what.errors);
    from.tokens = from.tokens.saturating_sub(what.tokens);
    from.micros = from.micros.saturating_sub(what.micros);
}

/// One group's name as people know it: the tree's names, a person's
/// name or email (from outside the log) when this server has them.
fn display_name(
    views: &Projections,
    by: GroupBy,
    id: &str,
    people: &BTreeMap<String, String>,
) -> String {
    let t = &views.tenancy.tenancy;
    let named = match by {
        GroupBy::Org => t.orgs.get(id).map(|n| n.name.clone()),
        GroupBy::Team => t.teams.get(id).map(|n| n.name.clone()),
        GroupBy::Project => t.projects.get(id).map(|n| n.name.clone()),
        GroupBy::Person if id == OPERATORS => {
            Some("every key made without an owner (an operator's)".to_owned())
        }
        GroupBy::Person => people.get(id).cloned(),
    };
    named.unwrap_or_default()
}

/// Each group's values per bucket in `[start, end)`, biggest spender first,
/// the groups past `TOP` added up as "other".
pub(crate) fn stack<'a>(
    groups: impl Iterator<Item = (&'a String, &'a Series)>,
    step_ms: i64,
    start: i64,
    end: i64,
) -> Vec<(String, Vec<Bucket>)> {
    let n = usize::try_from((end - start) / step_ms).unwrap_or(0);
    let mut ranked: Vec<(&String, &Series, Bucket)> = groups
        .map(|(id, s)| (id, s, s.total(step_ms, start, end)))
        .filter(|(_, _, t)| t.requests > 0)
        .collect();
    ranked.sort_by_key(|(id, _, t)| (Reverse(t.micros), Reverse(t.requests), (*id).clone()));
    let mut out: Vec<(String, Vec<Bucket>)> = Vec::new();
    for (i, (id, s, _)) in ranked.iter().enumerate() {
        if i == TOP {
            out.push((OTHER.to_owned(), vec![Bucket::default(); n]));
        }
        let slot = out.len().min(TOP);
        if i < TOP {
            out.push(((*id).clone(), vec![Bucket::default(); n]));
        }
        for (t, b) in s.buckets(step_ms, start, end) {
            let at = usize::try_from((t - start) / step_ms).unwrap_or(usize::MAX);
            if let Some(cell) = out[slot].1.get_mut(at) {
                cell.merge(b);
            }
        }
    }
    out
}

fn chart_of(
    title: &str,
    buckets: &[String],
    stacked: &[(String, Vec<Bucket>)],
    legend: &dyn Fn(&str) -> String,
    value: fn(&Bucket) -> u64,
    format: fn(u64) -> String,
) -> String {
    chart::stacked_bars(&Chart {
        title: title.to_owned(),
        buckets: buckets.to_vec(),
        series: stacked
            .iter()
            .map(|(id, values)| (legend(id), values.iter().map(value).collect()))
            .collect(),
        format,
    })
}

fn row(id: &str, name: String, b: &Bucket) -> GroupRow {
    GroupRow {
        id: id.to_owned(),
        name,
        requests: fmt::count(b.requests),
        tokens: fmt::count(b.tokens),
        errors: fmt::count(b.errors),
        // Exact, so that the rows add up to the total below them.
        spend: fmt::exact_money(b.micros),
    }
}

/// What the address asks: the grouping, the range, and the end of the
/// range (exclusive, ms) when it ends before now. A mistyped address is
/// said to be, rather than shown as the default view as if it were what
/// was asked (as the event log's pages do).
fn asked(q: &UsageQuery, now: i64) -> Result<(GroupBy, Range, Option<i64>), WebError> {
    let by = match q.by.as_deref().filter(|b| !b.is_empty()) {
        None => GroupBy::Project,
        Some(b) => GroupBy::parse(b).ok_or_else(|| {
            let names: Vec<&str> = GroupBy::ALL.iter().map(|g| g.name()).collect();
            WebError::Bad(format!("by={b:?}: one of {}", names.join(", ")))
        })?,
    };
    let range = match q.range.as_deref().filter(|r| !r.is_empty()) {
        Some(r) if !RANGES.iter().any(|x| x.name == r) => {
            let names: Vec<&str> = RANGES.iter().map(|x| x.name).collect();
            return Err(WebError::Bad(format!(
                "range={r:?}: one of {}",
                names.join(", ")
            )));
        }
        r => Range::parse(r),
    };
    if let Some(u) = q.until.as_deref().filter(|u| !u.is_empty())
        && chrono::NaiveDate::parse_from_str(u, "%Y-%m-%d").is_err()
    {
        return Err(WebError::Bad(format!(
            "until={u:?} is not a day: write YYYY-MM-DD"
        )));
    }
    Ok((by, range, until_end(q.until.as_deref(), now)))
}

/// People's names by id, when grouping by person and this server has
/// them (they live outside the log).
async fn people_names(web: &Web, by: GroupBy) -> Result<BTreeMap<String, String>, WebError> {
    let mut people = BTreeMap::new();
    if by == GroupBy::Person
        && let Some(p) = &web.people
    {
        let persons = p
            .people()
            .await
            .map_err(|e| WebError::people("naming people", e))?;
        for p in persons {
            let name = if p.name.is_empty() { p.email } else { p.name };
            people.insert(p.user_id, name);
        }
    }
    Ok(people)
}

/// What the page and its file show: the question asked, the window it
/// covers (`[start, end)`, ms) and the people's names it needs.
pub(super) struct Shown {
    pub(super) now: i64,
    pub(super) by: GroupBy,
    pub(super) range: Range,
    pub(super) until: Option<i64>,
    pub(super) start: i64,
    pub(super) end: i64,
    pub(super) people: BTreeMap<String, String>,
}

pub(super) async fn shown(web: &Web, q: &UsageQuery) -> Result<Shown, WebError> {
    let now = Utc::now().timestamp_millis();
    let (by, range, until) = asked(q, now)?;
    let people = people_names(web, by).await?;
    let (start, end) = range.window(until.map_or(now, |e| e - 1));
    Ok(Shown {
        now,
        by,
        range,
        until,
        start,
        end,
        people,
    })
}

pub(crate) async fn page(
    State(web): State<Arc<Web>>,
    viewer: Viewer,
    Query(q): Query<UsageQuery>,
) -> Result<Response, WebError> {
    let Shown {
        now,
        by,
        range,
        until,
        start,
        end,
        people,
    } = shown(&web, &q).await?;
    let buckets: Vec<String> = (0..range.buckets)
        .map(|i| range.label(start + i * range.step_ms))
        .collect();
    let until_param = until.map(|e| format!("&until={}", day_of(e - 1)));
    let href = |by: &str, range: &str| {
        format!(
            "/admin/usage?by={by}&range={range}{}",
            until_param.as_deref().unwrap_or_default()
        )
    };
    // The range before this one, and the one after unless this is the
    // latest.
    let earlier = format!(
        "/admin/usage?by={}&range={}&until={}",
        by.name(),
        range.name,
        day_of(start - 1)
    );
    let later = until.map(|e| {
        let next = e + range.buckets * range.step_ms;
        if next >= now {
            format!("/admin/usage?by={}&range={}", by.name(), range.name)
        } else {
            format!(
                "/admin/usage?by={}&range={}&until={}",
                by.name(),
                range.name,
                day_of(next - 1)
            )
        }
    });
    let page = {
        let views = web.views();
        let groups = Groups::of(&views.usage, by, start, end);
        let stacked = stack(groups.iter(), range.step_ms, start, end);
        let legend = |id: &str| {
            if id == OTHER {
                return OTHER.to_owned();
            }
            match by {
                GroupBy::Person => people.get(id).cloned().unwrap_or_else(|| id.to_owned()),
                _ => id.to_owned(),
            }
        };
        let charts = vec![
            chart_of(
                "Requests",
                &buckets,
                &stacked,
                &legend,
                |b| b.requests,
                fmt::short,
            ),
            chart_of(
                "Tokens (prompt and completion)",
                &buckets,
                &stacked,
                &legend,
                |b| b.tokens,
                fmt::short,
            ),
            chart_of(
                "Spend",
                &buckets,
                &stacked,
                &legend,
                |b| b.micros,
                fmt::short_money,
            ),
        ];
        let mut totals: Vec<(&String, Bucket)> = groups
            .iter()
            .map(|(id, s)| (id, s.total(range.step_ms, start, end)))
            .filter(|(_, t)| t.requests > 0)
            .collect();
        totals.sort_by_key(|(id, t)| (Reverse(t.micros), Reverse(t.requests), (*id).clone()));
        let mut sum = Bucket::default();
        for (_, t) in &totals {
            sum.merge(t);
        }
        let pager = Pager::new(
            totals.len(),
            PER_PAGE,
            page_number(q.page.as_deref()),
            |n| format!("{}&page={n}", href(by.name(), range.name)),
        );
        let groups = totals[pager.range()]
            .iter()
            .map(|(id, t)| row(id, display_name(&views, by, id, &people), t))
            .collect();
        UsagePage {
            chrome: Chrome::for_viewer(&web, &viewer),
            by: by.name(),
            range: range.name,
            by_choices: GroupBy::ALL
                .into_iter()
                .map(|g| Choice {
                    label: g.name(),
                    href: href(g.name(), range.name),
                    current: g == by,
                })
                .collect(),
            range_choices: RANGES
                .into_iter()
                .map(|r| Choice {
                    label: r.name,
                    href: href(by.name(), r.name),
                    current: r == range,
                })
                .collect(),
            charts,
            groups,
            pager,
            total: row("all", String::new(), &sum),
            from: fmt::when(start),
            to: fmt::when(end),
            earlier,
            later,
            csv: href(by.name(), range.name).replacen("/admin/usage?", "/admin/usage.csv?", 1),
        }
    };
    render(&page)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(points: &[(i64, u64, u64)]) -> Series {
        let mut s = Series::default();
        for (t, requests, micros) in points {
            s.hourly.insert(
                *t,
                Bucket {
                    requests: *requests,
                    micros: *micros,
                    ..Bucket::default()
                },
            );
        }
        s
    }

    #[test]
    fn a_range_may_end_with_an_earlier_day_but_not_a_later_one() {
        let now = 10 * DAY_MS + 5 * HOUR_MS;
        assert_eq!(until_end(Some("1970-01-03"), now), Some(3 * DAY_MS));
        assert_eq!(until_end(Some("1970-01-11"), now), None, "today is now");
        assert_eq!(until_end(Some("1970-02-01"), now), None);
        assert_eq!(until_end(Some("yesterday"), now), None);
        assert_eq!(until_end(None, now), None);
        assert_eq!(day_of(3 * DAY_MS - 1), "1970-01-03");
    }

    #[test]
    fn ranges_end_with_the_current_bucket() {
        let r = Range::parse(Some("24h"));
        let now = 10 * DAY_MS + 5 * HOUR_MS + 17;
        assert_eq!(
            r.window(now),
            (9 * DAY_MS + 6 * HOUR_MS, 10 * DAY_MS + 6 * HOUR_MS)
        );
        assert_eq!(Range::parse(Some("bogus")).name, "7d");
        assert_eq!(Range::parse(Some("30d")).window(now).1, 11 * DAY_MS);
        assert_eq!(r.label(0), "01-01 00:00");
        assert_eq!(Range::parse(Some("365d")).label(DAY_MS), "1970-01-02");
    }

    #[test]
    fn the_biggest_spenders_stack_on_their_own_and_the_rest_as_other() {
        let ids: Vec<String> = (0..8).map(|i| format!("g{i}")).collect();
        // g7 spends most; g0 least. Each has one request in hour 1,
        // and g3 one more in hour 0.
        let all: Vec<Series> = (0..8u64)
            .map(|i| {
                let mut points = vec![(HOUR_MS, 1, (i + 1) * 10)];
                if i == 3 {
                    points.push((0, 2, 1));
                }
                series(&points)
            })
            .collect();
        let stacked = stack(ids.iter().zip(all.iter()), HOUR_MS, 0, 3 * HOUR_MS);
        let names: Vec<&str> = stacked.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["g7", "g6", "g5", "g4", "g3", "g2", OTHER]);
        let other = &stacked[6].1;
        assert_eq!(other.len(), 3);
        assert_eq!(
            (other[1].requests, other[1].micros),
            (2, 30),
            "g1 and g0 together"
        );
        let g3 = &stacked[4].1;
        assert_eq!((g3[0].requests, g3[1].requests, g3[2].requests), (2, 1, 0));
        // Outside the window: nothing.
        assert!(
            stack(
                ids.iter().zip(all.iter()),
                HOUR_MS,
                5 * HOUR_MS,
                8 * HOUR_MS
            )
            .is_empty()
        );
    }
}
