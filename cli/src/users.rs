//! `llmgw users`: the people who sign in to the pages. Signing up is the
//! person's own act (on `/signup`); approving, suspending, promoting,
//! resetting a password and erasing are an operator's, here only: each
//! would let a stolen browser session escalate, so the pages show, they do
//! not steer. Commands go where `llmgw keys` sends them.

use std::io::{BufRead, Write};

use clap::{Args, Subcommand};
use llmgw_api::admin as api;
use llmgw_decider::Origin;
use reqwest::Method;

use crate::Outcome;
use crate::admin_client::{AdminArgs, Api};
use crate::output::{Table, json_line};

#[derive(Debug, Args)]
pub(crate) struct UsersArgs {
    #[command(flatten)]
    to: AdminArgs,
    #[command(subcommand)]
    command: UsersCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum UsersCommand {
    /// Everyone who signed up, pending first.
    List {
        /// Only those waiting for approval.
        #[arg(long)]
        pending: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Add a person (sign-up may be closed), approved to a project at
    /// once; prints their id alone (what was done goes to stderr). The
    /// password is read from stdin unless --password; tell it to them out
    /// of band.
    Add {
        /// Their email, which they sign in with.
        #[arg(long)]
        email: String,
        /// Their name on the pages (the email without it).
        #[arg(long, default_value = "")]
        name: String,
        /// The project they may use; their chat counts there.
        #[arg(long)]
        project: String,
        /// Visible to other users of this machine while the command runs;
        /// prefer stdin.
        #[arg(long)]
        password: Option<String>,
    },
    /// Let a pending (or suspended) person in, to a project.
    Approve {
        /// The person's id (`users list` shows it).
        id: String,
        /// The project they may use; their chat counts there.
        #[arg(long)]
        project: String,
    },
    /// Close a person's sessions and keep them out; their keys keep
    /// working until revoked.
    Suspend {
        /// The person's id (`users list` shows it).
        id: String,
    },
    /// Give an active person the admin pages.
    Promote {
        /// The person's id (`users list` shows it).
        id: String,
    },
    /// Set a new password (read from stdin unless --password) and close the
    /// person's sessions.
    ResetPassword {
        /// The person's id.
        id: String,
        /// Visible to other users of this machine while the command runs;
        /// prefer stdin.
        #[arg(long)]
        password: Option<String>,
    },
    /// Remove a person's personal data (email, name, password, sessions).
    /// The log keeps their id and what was done, and still verifies. The
    /// threads and memory notes kept for their project are the project's
    /// and stay (what is printed says how to delete them).
    Erase {
        /// The person's id (`users list` shows it).
        id: String,
    },
}

pub(crate) async fn run(
    store: &str,
    named: crate::admin_client::Named,
    args: UsersArgs,
) -> anyhow::Result<Outcome> {
    let starts = matches!(args.command, UsersCommand::Add { .. });
    let api = Api::connect(store, &args.to, named, starts).await?;
    let done = run_on(&api, args).await;
    api.settle().await;
    done
}

async fn run_on(api: &Api, args: UsersArgs) -> anyhow::Result<Outcome> {
    let origin = Origin::operator_from_env(args.to.as_name.clone());
    let mut out = std::io::stdout().lock();
    let none: Option<&()> = None;
    let post = |id: &str, verb: &str| format!("/api/v1/users/{id}/{verb}");
    let changed: api::Changed = match args.command {
        UsersCommand::List { pending, json } => {
            let path = if pending {
                "/api/v1/users?pending=true"
            } else {
                "/api/v1/users"
            };
            let rows: Vec<api::UserRow> = api.call(&origin, Method::GET, path, none).await?;
            if json {
                // One document, `[]` when there is nothing.
                json_line(&mut out, &rows)?;
            } else {
                print_users(&mut out, &rows)?;
            }
            return Ok(Outcome::Ok);
        }
        UsersCommand::Approve { id, project } => {
            let body = api::Approve { project };
            api.call(&origin, Method::POST, &post(&id, "approve"), Some(&body))
                .await?
        }
        UsersCommand::Suspend { id } => {
            api.call(&origin, Method::POST, &post(&id, "suspend"), none)
                .await?
        }
        UsersCommand::Promote { id } => {
            api.call(&origin, Method::POST, &post(&id, "promote"), none)
                .await?
        }
        UsersCommand::Add {
            email,
            name,
            project,
            password,
        } => {
            let password = match password {
                Some(p) => p,
                None => read_password()?,
            };
            let body = api::NewUser {
                email,
                name,
                password,
                project,
            };
            let added: Added = api
                .call(&origin, Method::POST, "/api/v1/users", Some(&body))
                .await?;
            // The id alone on stdout, so `U=$(llmgw users add …)` holds it.
            match added.user_id {
                Some(id) => {
                    writeln!(out, "{id}")?;
                    eprintln!("{}", added.message);
                }
                None => writeln!(out, "{}", added.message)?,
            }
            return Ok(Outcome::Ok);
        }
        UsersCommand::ResetPassword { id, password } => {
            let password = match password {
                Some(p) => p,
                None => read_password()?,
            };
            let body = api::ResetPassword { password };
            api.call(
                &origin,
                Method::POST,
                &post(&id, "reset-password"),
                Some(&body),
            )
            .await?
        }
        UsersCommand::Erase { id } => {
            // Read first: the row names the project whose threads and
            // notes the erasure leaves.
            let project = project_of(api, &origin, &id).await;
            let changed: api::Changed = api
                .call(&origin, Method::POST, &post(&id, "erase"), none)
                .await?;
            writeln!(out, "{}", changed.message)?;
            writeln!(out, "{}", not_erased(project.as_deref()))?;
            return Ok(Outcome::Ok);
        }
    };
    writeln!(out, "{}", changed.message)?;
    Ok(Outcome::Ok)
}

/// The project a person was let into, where the server says.
async fn project_of(api: &Api, origin: &Origin, id: &str) -> Option<String> {
    let none: Option<&()> = None;
    let rows: Vec<api::UserRow> = api
        .call(origin, Method::GET, "/api/v1/users", none)
        .await
        .ok()?;
    rows.into_iter().find(|r| r.user_id == id)?.project
}

/// What an erasure leaves: a project's threads and memory notes are the
/// project's, not tied to the person who wrote them, and how an operator
/// deletes them.
fn not_erased(project: Option<&str>) -> String {
    let p = project.unwrap_or("P");
    let whose = project.map_or("their project".to_owned(), |p| format!("project {p}"));
    format!(
        "Not erased: the threads and memory notes kept for {whose}, which belong to the project, \
         not to a person. To delete them, switch them off (the next sweep deletes all the \
         project keeps, and it keeps none until switched on again): \
         llmgw keys threads --project {p} --off; llmgw keys memory --project {p} --off. \
         A client with the project's key deletes one with DELETE /v1/threads/{{id}} or \
         DELETE /v1/memory/{{key}}."
    )
}

/// What the server answers to an added person: the id, which a server
/// older than this command does not send.
#[derive(serde::Deserialize)]
struct Added {
    message: String,
    user_id: Option<String>,
}

/// One line from stdin, without its line ending.
fn read_password() -> anyhow::Result<String> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let password = line.trim_end_matches(['\r', '\n']).to_owned();
    if password.is_empty() {
        anyhow::bail!("no password on stdin (or pass --password)");
    }
    Ok(password)
}

fn print_users(out: &mut impl Write, rows: &[api::UserRow]) -> anyhow::Result<()> {
    let mut t = Table::new(vec![
        "ID",
        "STATUS",
        "PROJECT",
        "ADMIN",
        "EMAIL",
        "SIGNED UP",
        "LAST LOGIN",
        "NAME",
    ]);
    let dash = || "-".to_owned();
    for r in rows {
        t.row(vec![
            r.user_id.clone(),
            r.status.clone(),
            r.project.clone().unwrap_or_else(dash),
            if r.admin { "yes" } else { "no" }.to_owned(),
            Some(r.email.clone())
                .filter(|e| !e.is_empty())
                .unwrap_or_else(dash),
            r.created_at.clone().unwrap_or_else(dash),
            r.last_login.clone().unwrap_or_else(dash),
            r.name.clone(),
        ]);
    }
    t.print(out)
}
