//! Spend and tokens per key, project, team, org and person in the current
//! budget periods, request counts, errors and latency per model and per
//! scope, and totals over time (hourly and daily buckets) for the usage
//! charts.

use std::collections::BTreeMap;

use llmgw_domain::Event;
use llmgw_domain::tenancy::{Period, Scope, TenancyEvent};
use llmgw_domain::usage::{UsageEvent, UsageRecorded, period_start};
use serde::{Deserialize, Serialize};

use crate::{Stamp, View};

pub const HOUR_MS: i64 = 3_600_000;
pub const DAY_MS: i64 = 24 * HOUR_MS;
/// Hourly buckets cover the last 8 days of log time (a day and a week
/// read by the hour); older hours survive only in the daily buckets.
pub const HOURLY_KEPT: i64 = 8 * 24;
/// Daily buckets cover the last 400 days (a year read by the day).
pub const DAILY_KEPT: i64 = 400;

/// The key id a signed-in person's chat is counted under, before the
/// user id.
pub const SESSION_KEY_PREFIX: &str = "session:";

/// Spend within one period, which starts at `start` (ms, UTC).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodSpend {
    pub start: i64,
    pub micros: u64,
    pub tokens: u64,
    pub requests: u64,
}

impl PeriodSpend {
    fn add(&mut self, period: Period, at: i64, micros: u64, tokens: u64) {
        let start = period_start(period, at);
        // Lazy rollover: the first record of a new period starts it afresh;
        // a late record from an earlier period leaves the current one alone.
        if start > self.start {
            *self = PeriodSpend {
                start,
                ..PeriodSpend::default()
            };
        }
        if start == self.start {
            self.micros = self.micros.saturating_add(micros);
            self.tokens = self.tokens.saturating_add(tokens);
            self.requests += 1;
        }
    }

    /// Spend as seen at `now`: nothing once the period has rolled over.
    pub fn at(&self, period: Period, now: i64) -> u64 {
        if period_start(period, now) == self.start {
            self.micros
        } else {
            0
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spend {
    pub day: PeriodSpend,
    pub month: PeriodSpend,
    pub total_micros: u64,
    pub total_tokens: u64,
    /// When the newest request counted here was made (ms, UTC); 0: never.
    #[serde(default)]
    pub last_at: i64,
    /// Every request counted here, ever.
    #[serde(default)]
    pub requests: u64,
    /// Responses with a status of 400 or more.
    #[serde(default)]
    pub errors: u64,
    #[serde(default)]
    pub latency_ms_total: u64,
    #[serde(default)]
    pub latency_ms_max: u32,
}

impl Spend {
    pub fn in_period(&self, period: Period, now: i64) -> u64 {
        match period {
            Period::Day => self.day.at(period, now),
            Period::Month => self.month.at(period, now),
        }
    }

    /// Mean latency in ms; 0 without requests.
    pub fn latency_ms_avg(&self) -> u64 {
        self.latency_ms_total
            .checked_div(self.requests)
            .unwrap_or(0)
    }

    fn add(&mut self, u: &UsageRecorded) {
        let tokens = u.prompt_tokens.saturating_add(u.completion_tokens);
        self.day.add(Period::Day, u.at.0, u.cost_micros, tokens);
        self.month.add(Period::Month, u.at.0, u.cost_micros, tokens);
        self.total_micros = self.total_micros.saturating_add(u.cost_micros);
        self.total_tokens = self.total_tokens.saturating_add(tokens);
        self.last_at = self.last_at.max(u.at.0);
        self.requests += 1;
        if u.status >= 400 {
            self.errors += 1;
        }
        self.latency_ms_total = self
            .latency_ms_total
            .saturating_add(u64::from(u.latency_ms));
        self.latency_ms_max = self.latency_ms_max.max(u.latency_ms);
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelStats {
    pub requests: u64,
    /// Responses with a status of 400 or more.
    pub errors: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub latency_ms_total: u64,
    pub latency_ms_max: u32,
    pub ttft_ms_total: u64,
    pub ttft_count: u64,
    /// What the requests it served cost, at its price when they were made.
    #[serde(default)]
    pub cost_micros: u64,
}

/// What the usage charts group by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    Org,
    Team,
    Project,
    /// The owner of a person's own keys, and their chat.
    Person,
}

impl GroupBy {
    pub const ALL: [GroupBy; 4] = [
        GroupBy::Org,
        GroupBy::Team,
        GroupBy::Project,
        GroupBy::Person,
    ];

    pub fn name(self) -> &'static str {
        match self {
            GroupBy::Org => "org",
            GroupBy::Team => "team",
            GroupBy::Project => "project",
            GroupBy::Person => "person",
        }
    }

    /// `org`, `team`, `project` or `person`.
    pub fn parse(s: &str) -> Option<GroupBy> {
        GroupBy::ALL.into_iter().find(|g| g.name() == s)
    }
}

/// Totals within one hour or one day.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    pub requests: u64,
    pub errors: u64,
    /// Prompt and completion tokens.
    pub tokens: u64,
    pub micros: u64,
}

impl Bucket {
    pub fn merge(&mut self, other: &Bucket) {
        self.requests = self.requests.saturating_add(other.requests);
        self.errors = self.errors.saturating_add(other.errors);
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.micros = self.micros.saturating_add(other.micros);
    }

    fn of(u: &UsageRecorded) -> Bucket {
        Bucket {
            requests: 1,
            errors: u64::from(u.status >= 400),
            tokens: u.prompt_tokens.saturating_add(u.completion_tokens),
            micros: u.cost_micros,
        }
    }
}

/// One group's totals over time, keyed by the bucket's start (ms, UTC).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Series {
    pub hourly: BTreeMap<i64, Bucket>,
    pub daily: BTreeMap<i64, Bucket>,
}

impl Series {
    /// The buckets that start in `[from, to)`: hourly ones for a step
    /// under a day, else daily ones (a caller adds them up into its steps).
    pub fn buckets(
        &self,
        step_ms: i64,
        from: i64,
        to: i64,
    ) -> impl Iterator<Item = (i64, &Bucket)> {
        let map = if step_ms < DAY_MS {
            &self.hourly
        } else {
            &self.daily
        };
        map.range(from..to.max(from)).map(|(t, b)| (*t, b))
    }

    /// Everything in `[from, to)` at one resolution, added up.
    pub fn total(&self, step_ms: i64, from: i64, to: i64) -> Bucket {
        let mut sum = Bucket::default();
        for (_, b) in self.buckets(step_ms, from, to) {
            sum.merge(b);
        }
        sum
    }

    fn is_empty(&self) -> bool {
        self.hourly.is_empty() && self.daily.is_empty()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageView {
    /// Scope → id → spend.
    pub spend: BTreeMap<Scope, BTreeMap<String, Spend>>,
    /// Person (user id) → spend of their own keys and their chat.
    #[serde(default)]
    pub people: BTreeMap<String, Spend>,
    /// Served model → counters.
    pub models: BTreeMap<String, ModelStats>,
    /// Group → id → totals over time, for the charts. Bounded: hours older
    /// than `HOURLY_KEPT` and days older than `DAILY_KEPT` before the
    /// newest record are dropped as the log's time advances.
    #[serde(default)]
    pub series: BTreeMap<GroupBy, BTreeMap<String, Series>>,
    /// The hour of the newest record (ms): where the buckets' window ends.
    #[serde(default)]
    newest_hour: i64,
    team_of_project: BTreeMap<String, String>,
    org_of_team: BTreeMap<String, String>,
    /// A person's own keys → that person.
    #[serde(default)]
    owner_of_key: BTreeMap<String, String>,
    /// Each gateway's newest batch counted here (see [`UsageView::flushed`]).
    /// Left out of the document while empty, as in logs of single-row
    /// records. No format change: an older snapshot reads as having none,
    /// which is true of every gateway started after it was taken.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    flushed: BTreeMap<String, Flushed>,
}

/// A gateway's newest batch the view has counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flushed {
    /// The request id of the batch's last row.
    pub last_request: String,
    /// The newest row's time (ms): marks of gateways silent for longer
    /// than the hourly window are forgotten.
    pub at: i64,
}

/// By person, the group of every key made without an owner (an
/// operator's), as `events usage --by person` and the usage pages name it
/// (no person's id has parentheses, so it cannot be taken for one).
pub const OPERATORS: &str = "(operators)";

/// The person a key's use counts for: the person behind a
/// `session:<user id>` chat, or the key's owner as `owner` says it. One
/// rule for the usage pages and `events usage --by person`.
pub fn person_of_key<'a>(
    key_id: &'a str,
    owner: impl FnOnce(&'a str) -> Option<&'a str>,
) -> Option<&'a str> {
    key_id
        .strip_prefix(SESSION_KEY_PREFIX)
        .or_else(|| owner(key_id))
        .filter(|p| !p.is_empty())
}

impl UsageView {
    /// The last request of `gateway`'s newest batch counted here. A
    /// gateway counts its own spend that is not yet in the view (queued,
    /// or in a batch on its way to the log) in its budget checks; this is
    /// how it tells, under the views' lock, which of its batches the view
    /// already holds, so that none is counted twice, whatever became of
    /// the append's answer. A gateway's batches land one after another,
    /// so every batch of its before this one is counted too.
    pub fn flushed(&self, gateway: &str) -> Option<&str> {
        self.flushed.get(gateway).map(|f| f.last_request.as_str())
    }

    pub fn spend_of(&self, scope: Scope, id: &str) -> Spend {
        self.spend
            .get(&scope)
            .and_then(|m| m.get(id))
            .copied()
            .unwrap_or_default()
    }

    /// The person a key's use counts for: its owner, or the person behind
    /// a `session:<user id>` chat.
    pub fn person_of_key<'a>(&'a self, key_id: &'a str) -> Option<&'a str> {
        person_of_key(key_id, |k| self.owner_of_key.get(k).map(String::as_str))
    }

    /// Every group's series of one kind.
    pub fn series_by(&self, by: GroupBy) -> impl Iterator<Item = (&String, &Series)> {
        self.series.get(&by).into_iter().flatten()
    }

    /// One group's series, if it has anything in the window.
    pub fn series_of(&self, by: GroupBy, id: &str) -> Option<&Series> {
        self.series.get(&by).and_then(|g| g.get(id))
    }

    /// The start of the hour of the newest record counted (ms, UTC); 0
    /// before any.
    pub fn newest_hour(&self) -> i64 {
        self.newest_hour
    }

    /// The oldest hour the hourly buckets keep.
    fn first_hour(&self) -> i64 {
        self.newest_hour - (HOURLY_KEPT - 1) * HOUR_MS
    }

    /// The oldest day the daily buckets keep.
    fn first_day(&self) -> i64 {
        (self.newest_hour.div_euclid(DAY_MS) - (DAILY_KEPT - 1)) * DAY_MS
    }

    fn record(&mut self, u: &UsageRecorded) {
        // Replay applies this once per request ever served: keys are looked
        // up by reference and copied only the first time they are seen.
        let hour = u.at.0.div_euclid(HOUR_MS) * HOUR_MS;
        if hour > self.newest_hour {
            self.newest_hour = hour;
            self.prune();
        }
        let day = u.at.0.div_euclid(DAY_MS) * DAY_MS;
        // A record older than the window (a late batch) counts in the
        // totals but not in buckets that are already gone.
        let keep_hour = hour >= self.first_hour();
        let keep_day = day >= self.first_day();

        let team = self.team_of_project.get(&*u.project_id).map(String::as_str);
        let org = team
            .and_then(|t| self.org_of_team.get(t))
            .map(String::as_str);
        let person = u
            .key_id
            .strip_prefix(SESSION_KEY_PREFIX)
            .or_else(|| self.owner_of_key.get(&*u.key_id).map(String::as_str))
            .filter(|p| !p.is_empty());
        let owners = [
            (Scope::Key, Some(&*u.key_id)),
            (Scope::Project, Some(&*u.project_id)),
            (Scope::Team, team),
            (Scope::Org, org),
        ];
        for (scope, id) in owners {
            let Some(id) = id.filter(|id| !id.is_empty()) else {
                continue;
            };
            slot(self.spend.entry(scope).or_default(), id).add(u);
        }
        if let Some(p) = person {
            slot(&mut self.people, p).add(u);
        }
        let m = slot(&mut self.models, &u.model_served);
        m.requests += 1;
        if u.status >= 400 {
            m.errors += 1;
        }
        m.prompt_tokens += u.prompt_tokens;
        m.completion_tokens += u.completion_tokens;
        m.latency_ms_total += u64::from(u.latency_ms);
        m.latency_ms_max = m.latency_ms_max.max(u.latency_ms);
        m.cost_micros = m.cost_micros.saturating_add(u.cost_micros);
        if let Some(t) = u.ttft_ms {
            m.ttft_ms_total += u64::from(t);
            m.ttft_count += 1;
        }

        if !(keep_hour || keep_day) {
            return;
        }
        let bucket = Bucket::of(u);
        let groups = [
            (GroupBy::Project, Some(&*u.project_id)),
            (GroupBy::Team, team),
            (GroupBy::Org, org),
            (GroupBy::Person, person),
        ];
        for (by, id) in groups {
            let Some(id) = id.filter(|id| !id.is_empty()) else {
                continue;
            };
            let s = slot(self.series.entry(by).or_default(), id);
            if keep_hour {
                s.hourly.entry(hour).or_default().merge(&bucket);
            }
            if keep_day {
                s.daily.entry(day).or_default().merge(&bucket);
            }
        }
    }

    /// Drops buckets that fell out of the window; runs once per new hour
    /// of log time, so its cost does not grow with the request rate.
    fn prune(&mut self) {
        let (first_hour, first_day) = (self.first_hour(), self.first_day());
        for groups in self.series.values_mut() {
            for s in groups.values_mut() {
                s.hourly = s.hourly.split_off(&first_hour);
                s.daily = s.daily.split_off(&first_day);
            }
            groups.retain(|_, s| !s.is_empty());
        }
        self.series.retain(|_, g| !g.is_empty());
        // A mark matters only while its gateway has a batch on the way;
        // one silent for the whole window is from a gateway long gone.
        self.flushed.retain(|_, f| f.at >= first_hour);
    }
}

impl View for UsageView {
    const NAME: &'static str = "usage";

    fn apply_event(&mut self, _stamp: Stamp, event: &Event) {
        match event {
            Event::Tenancy(TenancyEvent::ProjectCreated {
                project_id,
                team_id,
                ..
            }) => {
                self.team_of_project
                    .insert(project_id.clone(), team_id.clone());
            }
            Event::Tenancy(TenancyEvent::TeamCreated {
                team_id, org_id, ..
            }) => {
                self.org_of_team.insert(team_id.clone(), org_id.clone());
            }
            Event::Tenancy(TenancyEvent::KeyIssued(k)) => {
                if let Some(owner) = &k.owner {
                    self.owner_of_key.insert(k.key_id.clone(), owner.clone());
                }
            }
            // A batch and an older single-row record count alike, row by row.
            Event::Usage(e) => {
                e.rows().iter().for_each(|u| self.record(u));
                if let UsageEvent::UsageBatchRecorded(b) = e
                    && let Some(last) = b.rows.last()
                {
                    let at = b.rows.iter().map(|u| u.at.0).max().unwrap_or(0);
                    let mark = Flushed {
                        last_request: last.request_id.clone(),
                        at,
                    };
                    self.flushed.insert(b.gateway.clone(), mark);
                }
            }
            _ => {}
        }
    }
}

/// The entry for `key`, made (with the key copied) only when it is new.
fn slot<'a, V: Default>(map: &'a mut BTreeMap<String, V>, key: &str) -> &'a mut V {
    if !map.contains_key(key) {
        map.insert(key.to_owned(), V::default());
    }
    map.get_mut(key).expect("present: inserted above")
}

#[cfg(test)]
mod tests {
    use llmgw_domain::tenancy::{Band, Key};
    use llmgw_domain::usage::UsageEvent;

    use super::*;

    const T0: i64 = 1_780_000_000_000;

    fn stamp() -> Stamp {
        Stamp {
            position: 0,
            recorded_at_ms: 0,
        }
    }

    fn tree(view: &mut UsageView) {
        let events = [
            TenancyEvent::TeamCreated {
                team_id: "t".into(),
                org_id: "o".into(),
                name: "team".into(),
            },
            TenancyEvent::ProjectCreated {
                project_id: "p".into(),
                team_id: "t".into(),
                name: "proj".into(),
            },
            TenancyEvent::KeyIssued(key("mine", Some("ada"))),
            TenancyEvent::KeyIssued(key("ops", None)),
        ];
        for e in events {
            view.apply_event(stamp(), &Event::Tenancy(e));
        }
    }

    fn key(id: &str, owner: Option<&str>) -> Key {
        Key {
            key_id: id.into(),
            project_id: "p".into(),
            name: id.into(),
            hash: format!("{id:0>64}"),
            prefix: "llmgw-ab".into(),
            band: Band::Gold,
            routing_profile: None,
            revoked: false,
            owner: owner.map(str::to_owned),
            claim_by: None,
            expires_at: None,
            previous: None,
        }
    }

    fn used(view: &mut UsageView, key_id: &str, at: i64, status: u16, latency_ms: u32) {
        let u = UsageRecorded {
            prompt_tokens: 10,
            completion_tokens: 5,
            cost_micros: 100,
            status,
            latency_ms,
            ..crate::testing::request(&format!("r-{key_id}-{at}"), key_id, at)
        };
        view.apply_event(stamp(), &Event::Usage(UsageEvent::UsageRecorded(u)));
    }

    /// The same requests recorded one event each (older logs) or as one
    /// batch count alike in every total, bucket and model.
    #[test]
    fn a_batch_counts_as_its_rows_one_by_one() {
        let mut singles = UsageView::default();
        tree(&mut singles);
        let mut batched = singles.clone();
        let rows: Vec<UsageRecorded> = (0..50)
            .map(|i| UsageRecorded {
                request_id: format!("r{i}"),
                key_id: ["ops", "mine", "session:ada"][i % 3].into(),
                project_id: "p".into(),
                model_asked: "m".into(),
                model_served: ["m", "n"][i % 2].into(),
                prompt_tokens: i as u64,
                completion_tokens: 2 * i as u64,
                cost_micros: 7 * i as u64,
                status: if i % 7 == 0 { 502 } else { 200 },
                latency_ms: i as u32,
                ttft_ms: (i % 2 == 0).then_some(i as u32),
                band: Band::Gold,
                at: llmgw_domain::UnixMillis(T0 + i as i64 * HOUR_MS / 4),
            })
            .collect();
        for u in &rows {
            singles.apply_event(stamp(), &Event::Usage(UsageEvent::UsageRecorded(u.clone())));
        }
        batched.apply_event(
            stamp(),
            &Event::Usage(UsageEvent::UsageBatchRecorded(
                llmgw_domain::usage::UsageBatchRecorded {
                    gateway: "gateway-a".into(),
                    rows,
                },
            )),
        );
        // The batch also marks its gateway's newest batch counted.
        assert_eq!(batched.flushed("gateway-a"), Some("r49"));
        batched.flushed.clear();
        assert_eq!(batched, singles);
        assert_eq!(batched.spend_of(Scope::Org, "o").requests, 50);
    }

    /// Each gateway sharing the log finds its own newest batch, and a
    /// gateway silent for longer than the hourly window is forgotten.
    #[test]
    fn each_gateway_has_its_own_mark() {
        let mut v = UsageView::default();
        tree(&mut v);
        let batch = |gateway: &str, ids: &[&str], at: i64| {
            let rows = ids
                .iter()
                .map(|id| crate::testing::request(id, "ops", at))
                .collect();
            Event::Usage(UsageEvent::UsageBatchRecorded(
                llmgw_domain::usage::UsageBatchRecorded {
                    gateway: gateway.into(),
                    rows,
                },
            ))
        };
        v.apply_event(stamp(), &batch("a", &["a1", "a2"], T0));
        v.apply_event(stamp(), &batch("b", &["b1"], T0));
        v.apply_event(stamp(), &batch("a", &["a3"], T0 + 1));
        assert_eq!(
            (v.flushed("a"), v.flushed("b"), v.flushed("c")),
            (Some("a3"), Some("b1"), None)
        );
        let later = T0 + HOURLY_KEPT * HOUR_MS;
        v.apply_event(stamp(), &batch("a", &["a4"], later));
        assert_eq!((v.flushed("a"), v.flushed("b")), (Some("a4"), None));
    }

    #[test]
    fn a_key_counts_requests_errors_and_latency() {
        let mut v = UsageView::default();
        tree(&mut v);
        used(&mut v, "ops", T0, 200, 100);
        used(&mut v, "ops", T0 + 1, 502, 300);
        let s = v.spend_of(Scope::Key, "ops");
        assert_eq!((s.requests, s.errors), (2, 1));
        assert_eq!((s.latency_ms_avg(), s.latency_ms_max), (200, 300));
        assert_eq!((s.total_tokens, s.total_micros), (30, 200));
        assert_eq!(v.spend_of(Scope::Org, "o").requests, 2);
        assert_eq!(v.models["m"].cost_micros, 200);
    }

    #[test]
    fn a_persons_own_keys_and_chat_are_theirs_and_an_operators_key_is_nobodys() {
        let mut v = UsageView::default();
        tree(&mut v);
        used(&mut v, "mine", T0, 200, 10);
        used(&mut v, "session:ada", T0, 200, 10);
        used(&mut v, "ops", T0, 200, 10);
        assert_eq!(v.people["ada"].requests, 2);
        assert_eq!(v.people.len(), 1, "{:?}", v.people.keys());
        let ada: Vec<_> = v
            .series_by(GroupBy::Person)
            .map(|(id, _)| id.as_str())
            .collect();
        assert_eq!(ada, ["ada"]);
    }

    #[test]
    fn requests_fall_into_hourly_and_daily_buckets_of_every_group() {
        let mut v = UsageView::default();
        tree(&mut v);
        let hour = T0.div_euclid(HOUR_MS) * HOUR_MS;
        used(&mut v, "mine", hour + 5, 200, 10);
        used(&mut v, "mine", hour + 10, 500, 10);
        used(&mut v, "ops", hour + HOUR_MS, 200, 10);
        for (by, id, requests) in [
            (GroupBy::Org, "o", 3),
            (GroupBy::Team, "t", 3),
            (GroupBy::Project, "p", 3),
            (GroupBy::Person, "ada", 2),
        ] {
            let s = &v.series[&by][id];
            assert_eq!(s.total(HOUR_MS, 0, i64::MAX).requests, requests, "{by:?}");
            assert_eq!(s.total(DAY_MS, 0, i64::MAX).requests, requests, "{by:?}");
        }
        let p = &v.series[&GroupBy::Project]["p"];
        let first = p.hourly[&hour];
        assert_eq!(
            (first.requests, first.errors, first.tokens, first.micros),
            (2, 1, 30, 200)
        );
        assert_eq!(
            p.buckets(HOUR_MS, hour + HOUR_MS, hour + 2 * HOUR_MS)
                .count(),
            1
        );
        assert_eq!(v.newest_hour(), hour + HOUR_MS);
    }

    #[test]
    fn old_buckets_are_dropped_as_the_logs_time_advances() {
        let mut v = UsageView::default();
        tree(&mut v);
        let hour = T0.div_euclid(HOUR_MS) * HOUR_MS;
        used(&mut v, "mine", hour, 200, 10);
        used(&mut v, "ops", hour + HOURLY_KEPT * HOUR_MS, 200, 10);
        let p = &v.series[&GroupBy::Project]["p"];
        assert!(
            !p.hourly.contains_key(&hour),
            "the first hour left the hourly window"
        );
        assert_eq!(p.total(DAY_MS, 0, i64::MAX).requests, 2, "days keep it");
        assert!(v.series_of(GroupBy::Person, "ada").is_some());

        used(&mut v, "ops", hour + DAILY_KEPT * DAY_MS, 200, 10);
        assert!(
            v.series_of(GroupBy::Person, "ada").is_none(),
            "a group with nothing left in the window is gone"
        );
        // A late record from before the window is counted, not bucketed.
        used(&mut v, "mine", hour, 200, 10);
        assert!(v.series_of(GroupBy::Person, "ada").is_none());
        assert_eq!(v.people["ada"].requests, 2);
    }
}
