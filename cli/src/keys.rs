//! `llmgw keys`: the tenancy tree and API keys, decided by the domain and
//! appended to the log under a short-lived lease. A key is shown once, at
//! creation; the log holds only its SHA-256 hash and a display prefix.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use llmgw_domain::tenancy::{Band, Key, TenancyCommand};
use llmgw_domain::{Command, Event, State};
use llmgw_eventstore::{
    AnyStore, DEFAULT_PAGE, EventStore, ExpectedVersion, NewEvent, StreamAppend, Writer,
};

use crate::Outcome;
use crate::output::{Table, json_line};

#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// Create an org, a team in it and a project in that (again: no change).
    Init {
        #[arg(long)]
        org: String,
        #[arg(long)]
        team: String,
        #[arg(long)]
        project: String,
    },
    /// Issue a key for a project; the key is printed once.
    Create {
        #[arg(long)]
        project: String,
        #[arg(long)]
        name: String,
        /// bronze, silver, gold or platinum.
        #[arg(long, default_value = "gold", value_parser = band)]
        band: Band,
    },
    /// Revoke a key by its id; it stops working once the views see it.
    Revoke { key_id: String },
    /// Keys by id, with their project, band and state.
    List {
        #[arg(long)]
        json: bool,
    },
}

fn band(s: &str) -> Result<Band, String> {
    match s {
        "bronze" => Ok(Band::Bronze),
        "silver" => Ok(Band::Silver),
        "gold" => Ok(Band::Gold),
        "platinum" => Ok(Band::Platinum),
        other => Err(format!(
            "unknown band {other:?}: bronze, silver, gold or platinum"
        )),
    }
}

/// The decision state, from the whole log.
async fn load(store: &AnyStore) -> anyhow::Result<State> {
    let mut state = State::default();
    let mut after = 0;
    loop {
        let page = store.read_all(after, DEFAULT_PAGE).await?;
        let Some(last) = page.last() else {
            return Ok(state);
        };
        after = last.position;
        for e in &page {
            if let Ok(event) = Event::decode(&e.event_type, e.schema_version, &e.payload) {
                state.evolve(&event);
            }
        }
    }
}

/// Decides `commands` in turn and appends what they produce.
async fn run_commands(store: &AnyStore, commands: Vec<TenancyCommand>) -> anyhow::Result<State> {
    let mut state = load(store).await?;
    let mut events = Vec::new();
    for c in commands {
        for e in state.decide(Command::Tenancy(c))? {
            state.evolve(&e);
            events.push(e);
        }
    }
    if events.is_empty() {
        return Ok(state);
    }
    let holder = format!("cli-keys-{}", std::process::id());
    let lease = store
        .acquire_lease(&holder, Duration::from_secs(30))
        .await
        .context("keys are written under the append lease")?;
    let batch: Vec<StreamAppend> = events
        .iter()
        .map(|e| {
            let (kind, version, payload) = e.encode();
            let event = NewEvent::new(kind, version, payload)
                .with_metadata(serde_json::json!({ "actor": "cli" }));
            StreamAppend::new(e.stream_id(), ExpectedVersion::Any, vec![event])
        })
        .fold(Vec::new(), |mut acc: Vec<StreamAppend>, s| {
            // One append; a stream that recurs joins its earlier entry.
            match acc.iter_mut().find(|a| a.stream_id == s.stream_id) {
                Some(a) => a.events.extend(s.events),
                None => acc.push(s),
            }
            acc
        });
    let result = store
        .append(&Writer::Leader(lease.token.clone()), &batch)
        .await;
    store.release_lease(&lease.token).await?;
    result?;
    Ok(state)
}

fn random_hex(n: usize) -> String {
    let mut s = String::new();
    while s.len() < n {
        s.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    s.truncate(n);
    s
}

pub(crate) async fn run(address: &str, cmd: KeysCommand) -> anyhow::Result<Outcome> {
    let store = crate::store::open(address).await?;
    let mut out = std::io::stdout().lock();
    match cmd {
        KeysCommand::Init { org, team, project } => {
            run_commands(
                &store,
                vec![
                    TenancyCommand::CreateOrg {
                        org_id: org.clone(),
                        name: org.clone(),
                    },
                    TenancyCommand::CreateTeam {
                        team_id: team.clone(),
                        org_id: org,
                        name: team.clone(),
                    },
                    TenancyCommand::CreateProject {
                        project_id: project.clone(),
                        team_id: team,
                        name: project.clone(),
                    },
                ],
            )
            .await?;
            writeln!(out, "project {project} is ready for keys")?;
        }
        KeysCommand::Create {
            project,
            name,
            band,
        } => {
            let secret = format!("llmgw-sk-{}", random_hex(48));
            let key = Key {
                key_id: format!("key-{}", random_hex(12)),
                project_id: project,
                name,
                hash: llmgw_gateway::auth::key_hash(&secret),
                prefix: secret[..12].to_owned(),
                band,
                routing_profile: None,
                revoked: false,
            };
            let id = key.key_id.clone();
            run_commands(&store, vec![TenancyCommand::IssueKey(key)]).await?;
            writeln!(out, "{secret}")?;
            eprintln!("issued {id}; the key above is shown only now");
        }
        KeysCommand::Revoke { key_id } => {
            run_commands(
                &store,
                vec![TenancyCommand::RevokeKey {
                    key_id: key_id.clone(),
                    by: "cli".into(),
                }],
            )
            .await?;
            writeln!(out, "revoked {key_id}")?;
        }
        KeysCommand::List { json } => {
            let state = load(&store).await?;
            if json {
                for k in state.tenancy.keys.values() {
                    let mut v = serde_json::to_value(k)?;
                    if let Some(o) = v.as_object_mut() {
                        o.remove("hash");
                    }
                    json_line(&mut out, &v)?;
                }
            } else {
                let mut t = Table::new(vec!["KEY", "PREFIX", "PROJECT", "NAME", "BAND", "STATE"]);
                for k in state.tenancy.keys.values() {
                    t.row(vec![
                        k.key_id.clone(),
                        k.prefix.clone(),
                        k.project_id.clone(),
                        k.name.clone(),
                        format!("{:?}", k.band).to_lowercase(),
                        if k.revoked {
                            "revoked".into()
                        } else {
                            "active".into()
                        },
                    ]);
                }
                t.print(&mut out)?;
            }
        }
    }
    out.flush()?;
    Ok(Outcome::Ok)
}
