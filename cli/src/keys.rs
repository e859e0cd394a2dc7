//! `llmgw keys`: the tenancy tree, API keys and limits. Every command is a
//! request to the admin API's tenancy routes: a running server's (any
//! server: a standby forwards to the leader), or, when none answers, the
//! same routes served in this process over the store, deciding under the
//! append lease. One code path either way; a key is shown once, at
//! creation, and the log holds only its hash.

use std::io::Write;

use anyhow::bail;
use clap::{Args, Subcommand};
use llmgw_api::admin as api;
use llmgw_decider::Origin;
use llmgw_domain::conversations::MAX_RETAIN_HOURS;

use crate::Outcome;
use crate::admin_client::{AdminArgs, Api};
use crate::output::{Table, json_line};

/// A claim link's base: an http(s) URL, without a trailing slash.
fn claim_base(url: &str) -> Result<String, String> {
    let trimmed = url.trim().trim_end_matches('/');
    let rest = trimmed
        .strip_prefix("https://")
        .or_else(|| trimmed.strip_prefix("http://"));
    match rest {
        Some(host) if !host.is_empty() && !host.contains(char::is_whitespace) => {
            Ok(trimmed.to_owned())
        }
        _ => Err(format!("{url:?} must be an http:// or https:// address")),
    }
}

/// A `--models` list: names separated by commas, each trimmed; exactly
/// "" is the empty list, which suspends the level. A list that names no
/// model otherwise (",", " ") is refused: it would suspend silently.
#[derive(Debug, Clone)]
pub(crate) struct ModelList(Vec<String>);

fn model_list(text: &str) -> Result<ModelList, String> {
    if text.is_empty() {
        return Ok(ModelList(Vec::new()));
    }
    let names: Vec<String> = (text.split(','))
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .collect();
    if names.is_empty() {
        return Err(format!(
            "{text:?} names no model; to suspend, give --models \"\" (no model \
             allowed), and --all-models allows every model again"
        ));
    }
    Ok(ModelList(names))
}

/// An rpm or tpm: 1 to `u32::MAX`, as the domain takes it (0 is refused
/// there, so the range says 1, not 0).
fn per_minute(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{text} is not a whole number in 1..={}; leave it out for no limit, or give \
             --models \"\" to suspend",
            u32::MAX
        )),
    }
}

/// A claim link's lifetime as `--expires-in` takes it: a duration of 1
/// minute to 30 days, checked before any log is looked for.
fn claim_lifetime(text: &str) -> Result<String, String> {
    let d = crate::config::duration("--expires-in", text).map_err(|e| e.0)?;
    if !api::CLAIM_TTL_SECS.contains(&d.as_secs()) {
        return Err(format!(
            "{text}: a claim link works for 1 minute to 30 days"
        ));
    }
    Ok(text.to_owned())
}

/// A duration flag checked against its bounds before any log is looked
/// for, as seconds; `bounds` says them when it is outside.
fn bounded(
    flag: &str,
    text: &str,
    range: std::ops::RangeInclusive<u64>,
    bounds: &str,
) -> Result<u64, String> {
    let d = crate::config::duration(flag, text).map_err(|e| e.0)?;
    if !range.contains(&d.as_secs()) {
        return Err(format!("{text}: {bounds}"));
    }
    Ok(d.as_secs())
}

/// `--valid-for`: 1 hour to 10 years.
fn key_lifetime(text: &str) -> Result<u64, String> {
    let bounds = "a key works for 1 hour to 10 years (3650d)";
    bounded("--valid-for", text, api::KEY_VALID_SECS, bounds)
}

/// `--grace`: 1 minute to 30 days.
fn grace(text: &str) -> Result<u64, String> {
    let bounds = "an old secret keeps working for 1 minute to 30 days";
    bounded("--grace", text, api::GRACE_SECS, bounds)
}

#[derive(Debug, Args)]
pub(crate) struct KeysArgs {
    #[command(flatten)]
    to: AdminArgs,
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// Create an org, a team in it and a project in that (again: no change).
    Init {
        /// The org's id (created if missing).
        #[arg(long)]
        org: String,
        /// The team's id, in the org.
        #[arg(long)]
        team: String,
        /// The project's id, in the team.
        #[arg(long)]
        project: String,
        /// The org's display name, given when it is made (its id without).
        #[arg(long, value_name = "NAME")]
        org_name: Option<String>,
        /// The team's display name, given when it is made.
        #[arg(long, value_name = "NAME")]
        team_name: Option<String>,
        /// The project's display name, given when it is made.
        #[arg(long, value_name = "NAME")]
        project_name: Option<String>,
    },
    /// Issue a key for a project; the key is printed once.
    Create {
        /// The project the key belongs to (`keys init` makes one).
        #[arg(long)]
        project: String,
        /// Unique among the live keys of the project that one holder has
        /// (the operators', or --owner's).
        #[arg(long)]
        name: String,
        /// bronze, silver, gold or platinum.
        #[arg(long, default_value = "gold", value_parser = ["bronze", "silver", "gold", "platinum"])]
        band: String,
        /// Print a one-time claim link instead of the key: the key is
        /// sealed with the link's token and only the token's hash is kept.
        #[arg(long, requires = "base_url")]
        claim: bool,
        /// The address people open the link on (the client listener).
        #[arg(long, value_name = "URL", value_parser = claim_base)]
        base_url: Option<String>,
        /// How long the link works (30m, 24h, 7d; 1 minute to 30 days);
        /// seven days without it.
        #[arg(long, requires = "claim", value_name = "DURATION", value_parser = claim_lifetime)]
        expires_in: Option<String>,
        /// The person the key is for (`users list` shows the id): it shows
        /// on their profile, and its use counts as theirs.
        #[arg(long, value_name = "ID")]
        owner: Option<String>,
        /// How long the key works (24h, 90d; 1 hour to 10 years), after
        /// which it opens nothing; without it, until revoked.
        #[arg(long, value_name = "DURATION", value_parser = key_lifetime)]
        valid_for: Option<u64>,
    },
    /// Revoke a key by its id; it stops working once the views see it.
    Revoke {
        /// The key's id (`keys list` shows it), not the key itself.
        key_id: String,
    },
    /// Give a key a new secret, printed once; its id, limits, owner and
    /// history stay. The old secret stops at once, or after --grace.
    Rotate {
        /// The key's id (`keys list` shows it), not the key itself.
        key_id: String,
        /// How long the old secret keeps working (10m, 24h; 1 minute to
        /// 30 days), while the new one is deployed.
        #[arg(long, value_name = "DURATION", value_parser = grace)]
        grace: Option<u64>,
    },
    /// Keys with their project, band, limits, state and last use.
    List {
        /// Only this project's keys.
        #[arg(long)]
        project: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Orgs, teams and projects, each with the limits set on it, its
    /// spend, its live keys and a project's threads and memory.
    Groups {
        /// Only this org and what lies under it.
        #[arg(long, conflicts_with_all = ["team", "project"])]
        org: Option<String>,
        /// Only this team and its projects.
        #[arg(long, conflicts_with = "project")]
        team: Option<String>,
        /// Only this project.
        #[arg(long)]
        project: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Set limits at one level; the flags given replace what is set there.
    /// rpm and tpm on a team or project count for the whole group.
    Limits {
        /// org, team, project or key.
        #[arg(long, value_parser = ["org", "team", "project", "key"])]
        scope: String,
        /// The org, team, project or key id the limits are set on.
        #[arg(long)]
        id: String,
        /// Requests per minute.
        #[arg(long, value_parser = per_minute)]
        rpm: Option<u32>,
        /// Tokens per minute (prompt and completion).
        #[arg(long, value_parser = per_minute)]
        tpm: Option<u32>,
        /// The models allowed, comma-separated; "" allows none (suspends).
        #[arg(long, conflicts_with = "all_models", value_parser = model_list)]
        models: Option<ModelList>,
        /// Drop this level's model list: every model again.
        #[arg(long)]
        all_models: bool,
        /// Micro-units per --period.
        #[arg(long, requires = "period")]
        budget: Option<u64>,
        /// day or month.
        #[arg(long, requires = "budget", value_parser = ["day", "month"])]
        period: Option<String>,
        /// Drop every limit set at this level first.
        #[arg(long)]
        clear: bool,
    },
    /// Keep threads for a project: clients send only their new turn and
    /// the gateway prepends the history (`x-llmgw-thread`).
    Threads {
        /// The project whose threads are kept.
        #[arg(long)]
        project: String,
        /// Keep the model's replies too (capped); otherwise only what
        /// clients send.
        #[arg(long, conflicts_with = "off")]
        capture: bool,
        /// Hours a thread is kept after its last write (1 to 87600: ten years).
        #[arg(long, default_value_t = DEFAULT_THREAD_HOURS, conflicts_with = "off",
              value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_RETAIN_HOURS)))]
        retain_hours: u32,
        /// Keep no more threads; the next sweep deletes them.
        #[arg(long)]
        off: bool,
    },
    /// Keep memory notes for a project (`/v1/memory`, `/mcp`).
    Memory {
        /// The project whose notes are kept.
        #[arg(long)]
        project: String,
        /// Hours a note is kept after its last write (mandatory; 1 to
        /// 87600).
        #[arg(long, required_unless_present = "off", conflicts_with = "off",
              value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_RETAIN_HOURS)))]
        retain_hours: Option<u32>,
        /// Keep no more notes; the next sweep deletes them.
        #[arg(long)]
        off: bool,
    },
}

/// A week: long enough for a working conversation, short enough that
/// forgotten ones do not pile up.
const DEFAULT_THREAD_HOURS: u32 = 168;

pub(crate) async fn run(
    store: &str,
    named: crate::admin_client::Named,
    args: KeysArgs,
) -> anyhow::Result<Outcome> {
    let starts = matches!(args.command, KeysCommand::Init { .. });
    let api = Api::connect(store, &args.to, named, starts).await?;
    let done = run_on(&api, args).await;
    api.settle().await;
    done
}

async fn run_on(api: &Api, args: KeysArgs) -> anyhow::Result<Outcome> {
    let origin = Origin::operator_from_env(args.to.as_name.clone());
    let mut out = std::io::stdout().lock();
    use reqwest::Method;
    let none: Option<&()> = None;
    match args.command {
        KeysCommand::Init {
            org,
            team,
            project,
            org_name,
            team_name,
            project_name,
        } => {
            // One change: a level refused makes none of them.
            let tree = api::NewTree {
                org: api::NewOrg {
                    id: org,
                    name: org_name,
                },
                team: api::NewOrg {
                    id: team,
                    name: team_name,
                },
                project: api::NewOrg {
                    id: project.clone(),
                    name: project_name,
                },
            };
            let _: api::Changed = api
                .call(&origin, Method::POST, "/api/v1/tree", Some(&tree))
                .await?;
            writeln!(out, "project {project} is ready for keys")?;
        }
        KeysCommand::Create {
            project,
            name,
            band,
            claim,
            base_url,
            expires_in,
            owner,
            valid_for,
        } => {
            let base = base_url;
            let claim_ttl_secs = match &expires_in {
                Some(d) => Some(crate::config::duration("--expires-in", d)?.as_secs()),
                None => None,
            };
            let body = api::NewKey {
                project,
                name,
                band: Some(band),
                owner,
                claim,
                claim_ttl_secs,
                valid_for_secs: valid_for,
            };
            let created: api::KeyCreated = api
                .call(&origin, Method::POST, "/api/v1/keys", Some(&body))
                .await?;
            match (created.secret, created.claim_token, base) {
                (_, Some(token), Some(base)) => {
                    writeln!(out, "{base}/claim/{token}")?;
                    if expires_in.is_some() && created.claim_expires_at.is_none() {
                        eprintln!(
                            "warning: the server did not say when the link ends: it may predate --expires-in, and keep the link for its own default (seven days)"
                        );
                    }
                    let until = created
                        .claim_expires_at
                        .map(|t| format!(", until {t}"))
                        .unwrap_or_default();
                    eprintln!(
                        "issued {}; the link above reveals the key once{until}",
                        created.key_id
                    );
                }
                (Some(secret), _, _) => {
                    writeln!(out, "{secret}")?;
                    eprintln!("issued {}; the key above is shown only now", created.key_id);
                }
                _ => bail!("the server answered neither a key nor a claim link"),
            }
        }
        KeysCommand::Rotate { key_id, grace } => {
            let path = format!("/api/v1/keys/{key_id}/rotate");
            let body = api::RotateKey { grace_secs: grace };
            let rotated: api::KeyRotated =
                api.call(&origin, Method::POST, &path, Some(&body)).await?;
            writeln!(out, "{}", rotated.secret)?;
            let old = match &rotated.previous_until {
                Some(t) => format!("the old one works until {t}"),
                None => "the old one no longer works".to_owned(),
            };
            eprintln!(
                "rotated {}; the key above is shown only now, {old}",
                rotated.key_id
            );
        }
        KeysCommand::Revoke { key_id } => {
            let path = format!("/api/v1/keys/{key_id}/revoke");
            let changed: api::Changed = api.call(&origin, Method::POST, &path, none).await?;
            writeln!(out, "{}", changed.message)?;
        }
        KeysCommand::List { project, json } => {
            let path = match &project {
                Some(p) => format!("/api/v1/keys?project={p}"),
                None => "/api/v1/keys".to_owned(),
            };
            let rows: Vec<api::KeyRow> = api.call(&origin, Method::GET, &path, none).await?;
            if json {
                // One document, `[]` when there is nothing.
                json_line(&mut out, &rows)?;
            } else if rows.is_empty() {
                let whose = project
                    .map(|p| format!(" in project {p}"))
                    .unwrap_or_default();
                eprintln!("no key{whose} yet: llmgw keys create --project P --name N makes one");
            } else {
                print_keys(&mut out, &rows)?;
            }
        }
        KeysCommand::Groups {
            org,
            team,
            project,
            json,
        } => {
            let filter = [("org", org), ("team", team), ("project", project)]
                .into_iter()
                .find_map(|(k, v)| v.map(|v| format!("?{k}={}", crate::cluster::q(&v))))
                .unwrap_or_default();
            let path = format!("/api/v1/groups{filter}");
            let rows: Vec<api::GroupRow> = api.call(&origin, Method::GET, &path, none).await?;
            if json {
                json_line(&mut out, &rows)?;
            } else if rows.is_empty() {
                // Only the whole tree can be empty: a named group is 404.
                eprintln!("no org yet: llmgw keys init --org O --team T --project P makes one");
            } else {
                print_groups(&mut out, &rows)?;
            }
        }
        KeysCommand::Limits {
            scope,
            id,
            rpm,
            tpm,
            models,
            all_models,
            budget,
            period,
            clear,
        } => {
            let models = models.map(|ModelList(names)| names);
            let body = api::SetLimits {
                scope,
                id,
                clear,
                all_models,
                limits: api::LevelLimits {
                    rpm,
                    tpm,
                    models,
                    budget_micros: budget,
                    period,
                },
            };
            let changed: api::Changed = api
                .call(&origin, Method::PUT, "/api/v1/limits", Some(&body))
                .await?;
            writeln!(out, "{}", changed.message)?;
        }
        KeysCommand::Threads {
            project,
            capture,
            retain_hours,
            off,
        } => {
            let body = api::SetThreads {
                off,
                capture,
                retain_hours: Some(retain_hours),
            };
            let path = format!("/api/v1/projects/{project}/threads");
            let changed: api::Changed = api.call(&origin, Method::PUT, &path, Some(&body)).await?;
            writeln!(out, "{}", changed.message)?;
        }
        KeysCommand::Memory {
            project,
            retain_hours,
            off,
        } => {
            let body = api::SetMemory { off, retain_hours };
            let path = format!("/api/v1/projects/{project}/memory");
            let changed: api::Changed = api.call(&origin, Method::PUT, &path, Some(&body)).await?;
            writeln!(out, "{}", changed.message)?;
        }
    }
    out.flush()?;
    Ok(Outcome::Ok)
}

fn print_groups(out: &mut impl Write, rows: &[api::GroupRow]) -> anyhow::Result<()> {
    let mut t = Table::new(vec![
        "GROUP", "NAME", "KEYS", "RPM", "TPM", "MODELS", "BUDGET", "SPENT", "THREADS", "MEMORY",
    ]);
    for g in rows {
        let mut cells = vec![
            format!("{}{} {}", "  ".repeat(g.depth()), g.scope, g.id),
            g.name.clone(),
            g.keys.to_string(),
        ];
        cells.extend(limit_cells(&g.limits));
        cells.push(format!("{}/{}", g.spent_micros, g.spent_period));
        cells.push(or_dash(g.threads.map(|t| {
            let replies = if t.capture { ", replies" } else { "" };
            format!("{}h{replies}", t.retain_hours)
        })));
        cells.push(or_dash(g.memory_retain_hours.map(|h| format!("{h}h"))));
        t.row(cells);
    }
    t.print(out)
}

fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".into())
}

/// RPM, TPM, MODELS and BUDGET as set on one level.
fn limit_cells(l: &api::LevelLimits) -> [String; 4] {
    [
        or_dash(l.rpm.map(|n| n.to_string())),
        or_dash(l.tpm.map(|n| n.to_string())),
        or_dash(l.models.as_ref().map(|m| {
            if m.is_empty() {
                "(none)".to_owned()
            } else {
                m.join(",")
            }
        })),
        or_dash(
            l.budget_micros
                .zip(l.period.as_ref())
                .map(|(b, p)| format!("{b}/{p}")),
        ),
    ]
}

fn print_keys(out: &mut impl Write, rows: &[api::KeyRow]) -> anyhow::Result<()> {
    let mut t = Table::new(vec![
        "KEY",
        "PREFIX",
        "PROJECT",
        "NAME",
        "BAND",
        "STATE",
        "OWNER",
        "RPM",
        "TPM",
        "MODELS",
        "BUDGET",
        "LAST USED",
        "EXPIRES",
    ]);
    for k in rows {
        let mut cells = vec![
            k.key_id.clone(),
            k.prefix.clone(),
            k.project.clone(),
            k.name.clone(),
            k.band.clone(),
            k.state.clone(),
            or_dash(k.owner.clone()),
        ];
        cells.extend(limit_cells(&k.limits));
        cells.push(or_dash(k.last_used.clone()));
        cells.push(or_dash(k.expires_at.clone()));
        let width = cells.len();
        t.row(cells);
        // A rotated key's old secret in its grace, on a line of its own:
        // whoever deploys the new one sees its prefix and until when it
        // works, under PREFIX, STATE and EXPIRES.
        if let Some(until) = &k.previous_until {
            let mut old = vec![String::new(); width];
            old[1] = k.previous_prefix.clone().unwrap_or_default();
            old[5] = "old secret".to_owned();
            old[width - 1] = until.clone();
            t.row(old);
        }
    }
    t.print(out)
}
