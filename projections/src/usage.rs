//! Spend and tokens per key, project, team and org in the current budget
//! periods, and request counts, errors and latency per model.

use std::collections::BTreeMap;

use llmgw_domain::Event;
use llmgw_domain::tenancy::{Period, Scope, TenancyEvent};
use llmgw_domain::usage::{UsageEvent, period_start};
use serde::{Deserialize, Serialize};

use crate::{Stamp, View};

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
}

impl Spend {
    pub fn in_period(&self, period: Period, now: i64) -> u64 {
        match period {
            Period::Day => self.day.at(period, now),
            Period::Month => self.month.at(period, now),
        }
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
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageView {
    /// Scope → id → spend.
    pub spend: BTreeMap<Scope, BTreeMap<String, Spend>>,
    /// Served model → counters.
    pub models: BTreeMap<String, ModelStats>,
    team_of_project: BTreeMap<String, String>,
    org_of_team: BTreeMap<String, String>,
}

impl UsageView {
    pub fn spend_of(&self, scope: Scope, id: &str) -> Spend {
        self.spend
            .get(&scope)
            .and_then(|m| m.get(id))
            .copied()
            .unwrap_or_default()
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
            Event::Usage(UsageEvent::UsageRecorded(u)) => {
                let tokens = u.prompt_tokens.saturating_add(u.completion_tokens);
                let team = self.team_of_project.get(&u.project_id).cloned();
                let org = team.as_ref().and_then(|t| self.org_of_team.get(t)).cloned();
                let owners = [
                    (Scope::Key, Some(u.key_id.clone())),
                    (Scope::Project, Some(u.project_id.clone())),
                    (Scope::Team, team),
                    (Scope::Org, org),
                ];
                for (scope, id) in owners {
                    let Some(id) = id.filter(|id| !id.is_empty()) else {
                        continue;
                    };
                    let s = self.spend.entry(scope).or_default().entry(id).or_default();
                    s.day.add(Period::Day, u.at, u.cost_micros, tokens);
                    s.month.add(Period::Month, u.at, u.cost_micros, tokens);
                    s.total_micros = s.total_micros.saturating_add(u.cost_micros);
                    s.total_tokens = s.total_tokens.saturating_add(tokens);
                    s.last_at = s.last_at.max(u.at);
                }
                let m = self.models.entry(u.model_served.clone()).or_default();
                m.requests += 1;
                if u.status >= 400 {
                    m.errors += 1;
                }
                m.prompt_tokens += u.prompt_tokens;
                m.completion_tokens += u.completion_tokens;
                m.latency_ms_total += u64::from(u.latency_ms);
                m.latency_ms_max = m.latency_ms_max.max(u.latency_ms);
                if let Some(t) = u.ttft_ms {
                    m.ttft_ms_total += u64::from(t);
                    m.ttft_count += 1;
                }
            }
            _ => {}
        }
    }
}
