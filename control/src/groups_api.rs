//! `GET /api/v1/groups`: the tenancy tree read back, each org, team and
//! project with the limits set on it, its spend, its live keys and a
//! project's conversation settings. Everything a `keys limits`,
//! `keys threads` or `keys memory` sets can be read here, from this
//! server's views.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use llmgw_api::admin as api;
use llmgw_domain::UnixMillis;
use llmgw_domain::tenancy::{Named, Period, Scope, Tenancy};
use llmgw_projections::UsageView;
use serde::Deserialize;

use crate::admin::{AdminError, Result};
use crate::door::Door;
use crate::tenancy_api::level;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct GroupsQuery {
    org: Option<String>,
    team: Option<String>,
    project: Option<String>,
    /// At most this many rows, the first in the tree's order (a page that
    /// shows a few asks for only those).
    limit: Option<usize>,
}

pub(crate) async fn list(
    State(door): State<Door>,
    Query(q): Query<GroupsQuery>,
) -> Result<Vec<api::GroupRow>> {
    let root = match (q.org, q.team, q.project) {
        (None, None, None) => None,
        (Some(id), None, None) => Some((Scope::Org, id)),
        (None, Some(id), None) => Some((Scope::Team, id)),
        (None, None, Some(id)) => Some((Scope::Project, id)),
        _ => {
            return Err(AdminError(
                StatusCode::UNPROCESSABLE_ENTITY,
                "name at most one of org, team and project".into(),
            ));
        }
    };
    let views = door.views();
    let views = views.read().unwrap_or_else(|p| p.into_inner());
    let rows = rows(
        &views.tenancy.tenancy,
        &views.usage,
        root.as_ref().map(|(s, id)| (*s, id.as_str())),
        UnixMillis::now(),
        q.limit.unwrap_or(usize::MAX),
    )
    .ok_or_else(|| {
        let (scope, id) = root.unwrap_or((Scope::Org, String::new()));
        AdminError(StatusCode::NOT_FOUND, format!("no {} {id}", scope.name()))
    })?;
    Ok(Json(rows))
}

/// The first `limit` rows under `root` (the whole tree without one),
/// parents first and siblings by id; None when `root` does not exist.
pub(crate) fn rows(
    t: &Tenancy,
    usage: &UsageView,
    root: Option<(Scope, &str)>,
    now: UnixMillis,
    limit: usize,
) -> Option<Vec<api::GroupRow>> {
    let tree = Tree::new(t, usage, now, limit);
    let mut out = Vec::new();
    match root {
        None => t.orgs.keys().for_each(|org| tree.org(&mut out, org)),
        Some((Scope::Org, id)) if t.orgs.contains_key(id) => tree.org(&mut out, id),
        Some((Scope::Team, id)) if t.teams.contains_key(id) => tree.team(&mut out, id),
        Some((Scope::Project, id)) if t.projects.contains_key(id) => {
            tree.push(&mut out, Scope::Project, id)
        }
        Some(_) => return None,
    }
    Some(out)
}

/// One level's groups under each parent (by id, as the level's map is
/// ordered), and each group's parent.
type Index<'a> = (BTreeMap<&'a str, Vec<&'a str>>, BTreeMap<&'a str, &'a str>);

fn index(level: &BTreeMap<String, Named>) -> Index<'_> {
    let (mut under, mut parent_of) = (BTreeMap::<&str, Vec<&str>>::new(), BTreeMap::new());
    for (id, n) in level {
        if let Some(parent) = n.parent.as_deref() {
            under.entry(parent).or_default().push(id.as_str());
            parent_of.insert(id.as_str(), parent);
        }
    }
    (under, parent_of)
}

/// The tree indexed once, so that a read costs one pass over the groups
/// and keys however they are spread (it runs under the views' read lock).
struct Tree<'a> {
    t: &'a Tenancy,
    usage: &'a UsageView,
    now: UnixMillis,
    /// Org → its teams, by id.
    teams_of: BTreeMap<&'a str, Vec<&'a str>>,
    /// Team → its projects, by id.
    projects_of: BTreeMap<&'a str, Vec<&'a str>>,
    /// Live keys under each group, by its id (ids are unique per level;
    /// the level is part of the key).
    live_keys: BTreeMap<(Scope, &'a str), u64>,
    /// Rows past this many are not built.
    limit: usize,
}

impl<'a> Tree<'a> {
    fn new(t: &'a Tenancy, usage: &'a UsageView, now: UnixMillis, limit: usize) -> Tree<'a> {
        let (teams_of, org_of) = index(&t.teams);
        let (projects_of, team_of) = index(&t.projects);
        let mut live_keys = BTreeMap::new();
        for k in t.keys.values().filter(|k| t.key_works(k, now)) {
            let project = k.project_id.as_str();
            let team = team_of.get(project).copied();
            let org = team.and_then(|t| org_of.get(t).copied());
            for level in [
                Some((Scope::Project, project)),
                team.map(|t| (Scope::Team, t)),
                org.map(|o| (Scope::Org, o)),
            ]
            .into_iter()
            .flatten()
            {
                *live_keys.entry(level).or_default() += 1;
            }
        }
        Tree {
            t,
            usage,
            now,
            teams_of,
            projects_of,
            live_keys,
            limit,
        }
    }

    fn push(&self, out: &mut Vec<api::GroupRow>, scope: Scope, id: &str) {
        if out.len() < self.limit {
            out.push(self.row(scope, id));
        }
    }

    fn org(&self, out: &mut Vec<api::GroupRow>, id: &str) {
        self.push(out, Scope::Org, id);
        for team in self.teams_of.get(id).into_iter().flatten() {
            self.team(out, team);
        }
    }

    fn team(&self, out: &mut Vec<api::GroupRow>, id: &str) {
        self.push(out, Scope::Team, id);
        for project in self.projects_of.get(id).into_iter().flatten() {
            self.push(out, Scope::Project, project);
        }
    }

    fn row(&self, scope: Scope, id: &str) -> api::GroupRow {
        let (t, now) = (self.t, self.now);
        let named = match scope {
            Scope::Org => t.orgs.get(id),
            Scope::Team => t.teams.get(id),
            _ => t.projects.get(id),
        };
        let limits = t.limits_at(scope, id);
        let period = limits.and_then(|l| l.period).unwrap_or(Period::Month);
        let spend = self.usage.spend_of(scope, id);
        let keys = self.live_keys.get(&(scope, id)).copied().unwrap_or(0);
        let project = scope == Scope::Project;
        api::GroupRow {
            scope: scope.name().to_owned(),
            id: id.to_owned(),
            name: named.map(|n| n.name.clone()).unwrap_or_default(),
            parent: named.and_then(|n| n.parent.clone()),
            limits: limits.map(level).unwrap_or_default(),
            spent_micros: spend.in_period(period, now.0),
            spent_period: period.name().to_owned(),
            requests: spend.requests,
            keys,
            threads: project
                .then(|| t.threads.get(id))
                .flatten()
                .map(|s| api::ThreadsRow {
                    capture: s.capture,
                    retain_hours: s.retain_hours,
                }),
            memory_retain_hours: project
                .then(|| t.memory.get(id))
                .flatten()
                .map(|s| s.retain_hours),
        }
    }
}

#[cfg(test)]
mod tests {
    use llmgw_domain::conversations::ThreadsSetting;
    use llmgw_domain::tenancy::{Band, Key, Limits, TenancyCommand as C};

    use super::*;

    fn tenancy() -> Tenancy {
        let mut t = Tenancy::default();
        let key = |id: &str, project: &str, revoked: bool| Key {
            key_id: id.into(),
            project_id: project.into(),
            name: id.into(),
            hash: format!("{:064x}", id.as_bytes()[1]),
            prefix: "llmgw-sk-abc".into(),
            band: Band::Gold,
            routing_profile: None,
            revoked,
            owner: None,
            claim_by: None,
            expires_at: None,
            previous: None,
        };
        let limits = Limits {
            rpm: Some(60),
            budget_micros: Some(5_000),
            period: Some(Period::Day),
            ..Limits::default()
        };
        for c in [
            C::CreateOrg {
                org_id: "o".into(),
                name: "Org".into(),
            },
            C::CreateOrg {
                org_id: "lone".into(),
                name: "lone".into(),
            },
            C::CreateTeam {
                team_id: "t2".into(),
                org_id: "o".into(),
                name: "t2".into(),
            },
            C::CreateTeam {
                team_id: "t1".into(),
                org_id: "o".into(),
                name: "t1".into(),
            },
            C::CreateProject {
                project_id: "p".into(),
                team_id: "t1".into(),
                name: "p".into(),
            },
            C::CreateProject {
                project_id: "q".into(),
                team_id: "t2".into(),
                name: "q".into(),
            },
            C::IssueKey(key("k1", "p", false)),
            C::IssueKey(key("k2", "p", false)),
            C::IssueKey(key("k3", "q", false)),
            C::SetLimits {
                scope: Scope::Team,
                scope_id: "t1".into(),
                limits,
            },
            C::SetThreads {
                project_id: "p".into(),
                setting: Some(ThreadsSetting {
                    capture: true,
                    retain_hours: 24,
                }),
                by: "alice".into(),
            },
            C::RevokeKey {
                key_id: "k3".into(),
                by: "alice".into(),
            },
        ] {
            for e in t.decide(c).unwrap() {
                t.evolve(&e);
            }
        }
        t
    }

    fn ids(rows: &[api::GroupRow]) -> Vec<String> {
        rows.iter()
            .map(|r| format!("{} {}", r.scope, r.id))
            .collect()
    }

    #[test]
    fn the_tree_reads_parents_first_with_what_was_set_on_each_level() {
        let (t, usage) = (tenancy(), UsageView::default());
        let all = rows(&t, &usage, None, UnixMillis(0), usize::MAX).unwrap();
        assert_eq!(
            ids(&all),
            [
                "org lone",
                "org o",
                "team t1",
                "project p",
                "team t2",
                "project q"
            ]
        );
        let o = &all[1];
        assert_eq!(
            (o.name.as_str(), o.keys, o.spent_period.as_str()),
            ("Org", 2, "month")
        );
        let t1 = &all[2];
        assert_eq!(t1.parent.as_deref(), Some("o"));
        assert_eq!(
            (t1.limits.rpm, t1.limits.budget_micros),
            (Some(60), Some(5_000))
        );
        assert_eq!(
            t1.spent_period, "day",
            "spend is shown in the budget's period"
        );
        let p = &all[3];
        assert_eq!(
            p.threads,
            Some(api::ThreadsRow {
                capture: true,
                retain_hours: 24
            })
        );
        assert_eq!(
            (p.keys, all[5].keys),
            (2, 0),
            "a revoked key is not counted"
        );
    }

    #[test]
    fn an_org_and_a_team_of_one_name_keep_their_own_children() {
        let mut t = tenancy();
        for c in [
            C::CreateTeam {
                team_id: "lone".into(),
                org_id: "o".into(),
                name: "lone".into(),
            },
            C::CreateProject {
                project_id: "x".into(),
                team_id: "lone".into(),
                name: "x".into(),
            },
        ] {
            for e in t.decide(c).unwrap() {
                t.evolve(&e);
            }
        }
        let usage = UsageView::default();
        let lone = rows(
            &t,
            &usage,
            Some((Scope::Org, "lone")),
            UnixMillis(0),
            usize::MAX,
        )
        .unwrap();
        assert_eq!(ids(&lone), ["org lone"]);
        let team = rows(
            &t,
            &usage,
            Some((Scope::Team, "lone")),
            UnixMillis(0),
            usize::MAX,
        )
        .unwrap();
        assert_eq!(ids(&team), ["team lone", "project x"]);
    }

    #[test]
    fn one_group_shows_what_lies_under_it_and_an_unknown_one_nothing() {
        let (t, usage) = (tenancy(), UsageView::default());
        let under = |scope, id| {
            rows(&t, &usage, Some((scope, id)), UnixMillis(0), usize::MAX).map(|r| ids(&r))
        };
        assert_eq!(under(Scope::Team, "t1").unwrap(), ["team t1", "project p"]);
        assert_eq!(under(Scope::Project, "q").unwrap(), ["project q"]);
        assert_eq!(under(Scope::Org, "o").unwrap().len(), 5);
        assert_eq!(under(Scope::Team, "p"), None, "a project is not a team");
        assert_eq!(under(Scope::Org, "nobody"), None);
        let first = rows(&t, &usage, None, UnixMillis(0), 3).unwrap();
        assert_eq!(
            ids(&first),
            ["org lone", "org o", "team t1"],
            "the tree's first rows"
        );
    }
}
