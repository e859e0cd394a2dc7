//! The dashboard's groups: each org, team and project with what is set on
//! it, as the admin API's `GET /api/v1/groups` answers them.

use llmgw_api::admin::GroupRow;

use super::fmt;

/// One line of the groups table, ready to show.
#[derive(Debug, Clone)]
pub(crate) struct GroupLine {
    pub scope: String,
    /// 0 for an org, 1 for a team, 2 for a project: the indent.
    pub depth: usize,
    pub id: String,
    /// The name, when it is not the id.
    pub name: String,
    pub keys: String,
    pub rates: String,
    pub models: String,
    pub budget: String,
    pub spent: String,
    pub kept: String,
}

pub(crate) fn lines(rows: Vec<GroupRow>) -> Vec<GroupLine> {
    rows.into_iter().map(line).collect()
}

fn line(g: GroupRow) -> GroupLine {
    let l = &g.limits;
    let rates = [
        l.rpm.map(|n| format!("{} rpm", fmt::count(n.into()))),
        l.tpm.map(|n| format!("{} tpm", fmt::count(n.into()))),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ");
    let models = match &l.models {
        None => String::new(),
        Some(m) if m.is_empty() => "none (suspended)".into(),
        Some(m) => m.join(", "),
    };
    let budget = match (l.budget_micros, &l.period) {
        (Some(b), Some(p)) => format!("{} a {p}", fmt::money(b)),
        _ => String::new(),
    };
    let mut kept = Vec::new();
    if let Some(t) = g.threads {
        let replies = if t.capture { " with replies" } else { "" };
        kept.push(format!("threads{replies}, {} h", t.retain_hours));
    }
    if let Some(h) = g.memory_retain_hours {
        kept.push(format!("memory, {h} h"));
    }
    GroupLine {
        depth: g.depth(),
        name: if g.name == g.id {
            String::new()
        } else {
            g.name
        },
        keys: fmt::count(g.keys),
        rates,
        models,
        budget,
        spent: format!("{} this {}", fmt::money(g.spent_micros), g.spent_period),
        kept: kept.join("; "),
        scope: g.scope,
        id: g.id,
    }
}
