//! Who asked for a write, recorded in every event's metadata.

use std::fmt;

/// Who acts. The name is what an auditor reads: an operator's login (or
/// `--as NAME`), a server's instance name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// An operator: the OS user running the CLI, or `--as NAME`, or the
    /// name the admin API was given.
    Operator(String),
    /// A signed-in person acting on the pages (their own keys, password,
    /// or, for an admin, the dashboard's decisions), named by their id.
    Person(String),
    /// Someone not signed in acting through something they hold (a claim
    /// link), named by that thing.
    Visitor(String),
    /// The control plane's own decisions, named by its instance.
    Leader(String),
    /// A gateway's observations (usage, demand), named by its instance.
    Gateway(String),
    /// A scripted writer (the incident recorder, tools).
    Recorder(String),
}

impl Actor {
    /// The kind as stored under `"actor_kind"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Actor::Operator(_) => "operator",
            Actor::Person(_) => "person",
            Actor::Visitor(_) => "visitor",
            Actor::Leader(_) => "leader",
            Actor::Gateway(_) => "gateway",
            Actor::Recorder(_) => "recorder",
        }
    }

    /// The name as stored under `"actor"`.
    pub fn name(&self) -> &str {
        match self {
            Actor::Operator(n)
            | Actor::Person(n)
            | Actor::Visitor(n)
            | Actor::Leader(n)
            | Actor::Gateway(n)
            | Actor::Recorder(n) => n,
        }
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind(), self.name())
    }
}

/// One command's origin: the actor and an id shared by every event the
/// command wrote (and by its refusal, if refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub actor: Actor,
    pub command_id: String,
}

impl Origin {
    /// A fresh command id (UUID v7, so ids sort by time) for `actor`.
    pub fn new(actor: Actor) -> Self {
        Origin {
            actor,
            command_id: uuid::Uuid::now_v7().to_string(),
        }
    }

    /// The operator running this process: `as_name` when given (`--as
    /// NAME`), else `$USER`, else what `id -un` says, else `unknown`.
    pub fn operator_from_env(as_name: Option<String>) -> Self {
        let name = as_name
            .filter(|n| !n.trim().is_empty())
            .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
            .or_else(id_un)
            .unwrap_or_else(|| "unknown".to_owned());
        Origin::new(Actor::Operator(name))
    }

    /// The metadata of each event this origin writes through `instance`.
    pub fn metadata(&self, instance: &str) -> serde_json::Value {
        serde_json::json!({
            "writer": instance,
            "actor": self.actor.name(),
            "actor_kind": self.actor.kind(),
            "command_id": self.command_id,
        })
    }
}

/// `$USER` is unset under some service managers and in containers.
fn id_un() -> Option<String> {
    let out = std::process::Command::new("id").arg("-un").output().ok()?;
    let name = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !name.is_empty()).then_some(name)
}

/// Who acted on a stored event, and as what (`operator`, `leader`, …):
/// the metadata an [`Origin`] wrote. Events older than that name only the
/// writing process under `actor`; the person, where there was one, is the
/// payload's `by`, and the kind is empty.
pub fn actor_of(e: &llmgw_eventstore::RecordedEvent) -> (String, String) {
    let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(str::to_owned);
    match (
        text(e.metadata.get("actor")),
        text(e.metadata.get("actor_kind")),
    ) {
        (Some(a), Some(kind)) => (a, kind),
        (old, _) => (
            text(e.payload.get("by"))
                .or(old)
                .or_else(|| text(e.metadata.get("writer")))
                .unwrap_or_default(),
            String::new(),
        ),
    }
}
