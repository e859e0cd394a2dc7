//! What an auditor needs beyond the changes themselves: the operator
//! commands that were refused, with who asked and why.
//!
//! Also the pure naming of a command (the stream it is about and a one-line
//! description), so that every writer records a refusal the same way.

use serde::{Deserialize, Serialize};

use crate::Command;
use crate::catalog::CatalogCommand;
use crate::ids::{NodeId, ReplicaId};
use crate::join::JoinCommand;
use crate::nodes::NodeCommand;
use crate::replicas::ReplicaCommand;
use crate::tenancy::{Scope, TenancyCommand};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum AuditEvent {
    /// An operator's command that the domain rejected; nothing else was
    /// written for it.
    CommandRefused {
        /// Who asked (the operator's name).
        actor: String,
        /// The command in one line, e.g. `RevokeKey key-123`.
        command: String,
        /// The stream the command was about, e.g. `key-key-123`.
        target: String,
        reason: String,
    },
}

impl AuditEvent {
    /// `audit-<target>`: the refusals about one thing, next to its stream.
    pub fn stream_id(&self) -> String {
        match self {
            AuditEvent::CommandRefused { target, .. } => format!("audit-{target}"),
        }
    }
}

/// How every API key begins. A key is never an id and never goes into
/// the log: a command that names one where an id goes (a key pasted for
/// its id) is refused, and a refusal records it cut to this and three
/// characters more, as `keys list` shows a key.
pub const SECRET_PREFIX: &str = "llmgw-sk-";

/// Whether a tenancy command holds an API key where an id or a name goes
/// (pasted for a key's id, or as a name): the log would keep it for good.
pub fn names_a_key(c: &TenancyCommand) -> bool {
    use TenancyCommand as T;
    let named = match c {
        T::CreateOrg { name, .. } | T::CreateTeam { name, .. } | T::CreateProject { name, .. } => {
            name.contains(SECRET_PREFIX)
        }
        T::IssueKey(k) => k.name.contains(SECRET_PREFIX),
        _ => false,
    };
    named || tenancy_target(c).contains(SECRET_PREFIX)
}

/// A tenancy command's stream, as [`Command::target`] names it.
fn tenancy_target(c: &TenancyCommand) -> String {
    use TenancyCommand as T;
    match c {
        T::CreateOrg { org_id, .. } => scoped(Scope::Org, org_id),
        T::CreateTeam { team_id, .. } => scoped(Scope::Team, team_id),
        T::CreateProject { project_id, .. }
        | T::SetThreads { project_id, .. }
        | T::SetMemory { project_id, .. } => scoped(Scope::Project, project_id),
        T::SetLimits {
            scope, scope_id, ..
        } => scoped(*scope, scope_id),
        T::IssueKey(k) => scoped(Scope::Key, &k.key_id),
        T::RevokeKey { key_id, .. }
        | T::RotateKey { key_id, .. }
        | T::OfferClaim { key_id, .. }
        | T::Claim { key_id } => scoped(Scope::Key, key_id),
        T::SignUp { user_id }
        | T::Approve { user_id, .. }
        | T::Suspend { user_id, .. }
        | T::Promote { user_id, .. }
        | T::ChangePassword { user_id }
        | T::ResetPassword { user_id, .. }
        | T::Erase { user_id, .. } => format!("user-{user_id}"),
    }
}

/// `text` with every API key in it cut to the prefix `keys list` shows.
pub fn redact_secrets(text: &str) -> String {
    let shown = SECRET_PREFIX.len() + 3;
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(SECRET_PREFIX) {
        out.push_str(&rest[..at]);
        let key = &rest[at..];
        let end = key[SECRET_PREFIX.len()..]
            .find(|c: char| !c.is_ascii_alphanumeric())
            .map_or(key.len(), |e| e + SECRET_PREFIX.len());
        let cut = key[..end].char_indices().nth(shown).map_or(end, |(i, _)| i);
        out.push_str(&key[..cut]);
        if cut < end {
            out.push('…');
        }
        rest = &key[end..];
    }
    out.push_str(rest);
    out
}

fn scoped(scope: Scope, id: &str) -> String {
    format!("{}-{id}", scope.name())
}

impl Command {
    /// The stream this command is about: where its events would go (the
    /// first of them, for a command that writes several), named as
    /// [`crate::Event::stream_id`] names it. `catalog` for a whole-catalog
    /// command.
    pub fn target(&self) -> String {
        match self {
            Command::Catalog(c) => match c {
                CatalogCommand::AddModel(m) | CatalogCommand::UpdateModel(m) => {
                    format!("model-{}", m.name)
                }
                CatalogCommand::RemoveModel { name } => format!("model-{name}"),
                CatalogCommand::ApplyModels(_) => "catalog".to_owned(),
            },
            Command::Node(c) => format!("node-{}", node_id(c)),
            Command::Replica(c) => format!("replica-{}", replica_id(c)),
            Command::Join(c) => match c {
                JoinCommand::IssueToken { token_hash, .. }
                | JoinCommand::Redeem { token_hash, .. } => {
                    format!("jointoken-{}", crate::join::token_id(token_hash))
                }
                JoinCommand::RemoveNode { node_id } => format!("node-{node_id}"),
            },
            Command::Tenancy(c) => tenancy_target(c),
        }
    }

    /// The command in one line for people: its name and what it names,
    /// never a secret (a key shows its id, project and name, not its hash).
    pub fn describe(&self) -> String {
        use TenancyCommand as T;
        match self {
            Command::Catalog(c) => match c {
                CatalogCommand::AddModel(m) => format!("AddModel {}", m.name),
                CatalogCommand::UpdateModel(m) => format!("UpdateModel {}", m.name),
                CatalogCommand::RemoveModel { name } => format!("RemoveModel {name}"),
                CatalogCommand::ApplyModels(ms) => format!("ApplyModels ({} models)", ms.len()),
            },
            Command::Node(c) => {
                let verb = match c {
                    NodeCommand::Register { .. } => "Register",
                    NodeCommand::ReportInventory { .. } => "ReportInventory",
                    NodeCommand::Heartbeat { .. } => "Heartbeat",
                    NodeCommand::MarkUnreachable { .. } => "MarkUnreachable",
                    NodeCommand::MarkLost { .. } => "MarkLost",
                    NodeCommand::Cordon { .. } => "Cordon",
                    NodeCommand::Uncordon { .. } => "Uncordon",
                    NodeCommand::Drain { .. } => "Drain",
                    NodeCommand::FinishDrain { .. } => "FinishDrain",
                };
                format!("{verb} {}", node_id(c))
            }
            Command::Replica(c) => {
                let verb = match c {
                    ReplicaCommand::Place(_) => "Place",
                    ReplicaCommand::Adopt(_) => "Adopt",
                    ReplicaCommand::ReportShard { .. } => "ReportShard",
                    ReplicaCommand::Fail { .. } => "Fail",
                    ReplicaCommand::Drain { .. } => "Drain",
                    ReplicaCommand::Stop { .. } => "Stop",
                };
                format!("{verb} {}", replica_id(c))
            }
            Command::Join(c) => match c {
                JoinCommand::IssueToken {
                    token_hash,
                    node_id,
                    ..
                } => match node_id {
                    Some(n) => format!(
                        "IssueToken {} for node {n}",
                        crate::join::token_id(token_hash)
                    ),
                    None => format!("IssueToken {}", crate::join::token_id(token_hash)),
                },
                JoinCommand::Redeem {
                    token_hash,
                    node_id,
                    ..
                } => format!(
                    "Redeem {} as node {node_id}",
                    crate::join::token_id(token_hash)
                ),
                JoinCommand::RemoveNode { node_id } => format!("RemoveNode {node_id}"),
            },
            Command::Tenancy(c) => match c {
                T::CreateOrg { org_id, .. } => format!("CreateOrg {org_id}"),
                T::CreateTeam {
                    team_id, org_id, ..
                } => format!("CreateTeam {team_id} in org {org_id}"),
                T::CreateProject {
                    project_id,
                    team_id,
                    ..
                } => format!("CreateProject {project_id} in team {team_id}"),
                T::SetLimits {
                    scope, scope_id, ..
                } => format!("SetLimits {} {scope_id}", scope.name()),
                T::IssueKey(k) => format!(
                    "IssueKey {} named {:?} in project {}",
                    k.key_id, k.name, k.project_id
                ),
                T::RevokeKey { key_id, .. } => format!("RevokeKey {key_id}"),
                T::RotateKey { key_id, .. } => format!("RotateKey {key_id}"),
                T::SignUp { user_id } => format!("SignUp {user_id}"),
                T::Approve {
                    user_id,
                    project_id,
                    ..
                } => format!("Approve {user_id} for project {project_id}"),
                T::Suspend { user_id, .. } => format!("Suspend {user_id}"),
                T::Promote { user_id, .. } => format!("Promote {user_id}"),
                T::ChangePassword { user_id } => format!("ChangePassword {user_id}"),
                T::ResetPassword { user_id, .. } => format!("ResetPassword {user_id}"),
                T::Erase { user_id, .. } => format!("Erase {user_id}"),
                T::OfferClaim { key_id, .. } => format!("OfferClaim {key_id}"),
                T::Claim { key_id } => format!("Claim {key_id}"),
                T::SetThreads {
                    project_id,
                    setting,
                    ..
                } => match setting {
                    Some(s) => format!(
                        "SetThreads {project_id} on (capture {}, {} h)",
                        s.capture, s.retain_hours
                    ),
                    None => format!("SetThreads {project_id} off"),
                },
                T::SetMemory {
                    project_id,
                    setting,
                    ..
                } => match setting {
                    Some(s) => format!("SetMemory {project_id} on ({} h)", s.retain_hours),
                    None => format!("SetMemory {project_id} off"),
                },
            },
        }
    }
}

fn node_id(c: &NodeCommand) -> &NodeId {
    match c {
        NodeCommand::Register { node_id, .. }
        | NodeCommand::ReportInventory { node_id, .. }
        | NodeCommand::Heartbeat { node_id }
        | NodeCommand::MarkUnreachable { node_id }
        | NodeCommand::MarkLost { node_id }
        | NodeCommand::Cordon { node_id, .. }
        | NodeCommand::Uncordon { node_id, .. }
        | NodeCommand::Drain { node_id, .. }
        | NodeCommand::FinishDrain { node_id } => node_id,
    }
}

fn replica_id(c: &ReplicaCommand) -> &ReplicaId {
    match c {
        ReplicaCommand::Place(p) | ReplicaCommand::Adopt(p) => &p.replica_id,
        ReplicaCommand::ReportShard { replica_id, .. }
        | ReplicaCommand::Fail { replica_id, .. }
        | ReplicaCommand::Drain { replica_id, .. }
        | ReplicaCommand::Stop { replica_id, .. } => replica_id,
    }
}
