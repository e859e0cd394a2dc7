//! The tenancy tree (org → team → project → key), keys, limits and the
//! people who may sign in. Keys are only ever held as a SHA-256 hash and a
//! display prefix. People are events without personal data: an email or
//! name lives outside the log, so erasing a person never rewrites it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Rejection;
use crate::conversations::{MemorySetting, ThreadsSetting, check_retention};
use crate::time::UnixMillis;

/// Where a limit is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Org,
    Team,
    Project,
    Key,
}

impl Scope {
    /// `org`, `team`, `project` or `key`.
    pub fn parse(s: &str) -> Option<Scope> {
        [Scope::Org, Scope::Team, Scope::Project, Scope::Key]
            .into_iter()
            .find(|v| v.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            Scope::Org => "org",
            Scope::Team => "team",
            Scope::Project => "project",
            Scope::Key => "key",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    Day,
    Month,
}

impl Period {
    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }

    /// `day` or `month`.
    pub fn parse(s: &str) -> Option<Period> {
        [Period::Day, Period::Month]
            .into_iter()
            .find(|v| v.name() == s)
    }
}

/// Limits at one level. `None` means "not set here". An empty `models`
/// list allows no model (it suspends the scope); an absent one allows all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<u32>,
    /// Micro-units per `period`; 0 is spent from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_micros: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Period>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
}

impl Limits {
    fn check(&self) -> Result<(), Rejection> {
        // Zero would be ambiguous (unlimited or nothing?); to stop a scope,
        // give it an empty model list.
        if self.rpm == Some(0) || self.tpm == Some(0) {
            return Err(Rejection::invalid(
                "rpm and tpm must be positive; leave them unset for no limit, \
                 or set an empty model list to suspend",
            ));
        }
        if self.budget_micros.is_some() != self.period.is_some() {
            return Err(Rejection::invalid(
                "a budget needs a period (day or month), and a period a budget",
            ));
        }
        Ok(())
    }
}

/// The models a composed allowlist permits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "models")]
pub enum Allowed {
    All,
    Only(BTreeSet<String>),
}

impl Allowed {
    pub fn permits(&self, canonical_model: &str) -> bool {
        match self {
            Allowed::All => true,
            Allowed::Only(set) => set.contains(canonical_model),
        }
    }
}

/// One level's budget, kept apart: every level is checked against its own
/// pool, in its own period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetLevel {
    pub scope: Scope,
    pub scope_id: String,
    pub micros: u64,
    pub period: Period,
}

/// One level's rates, kept apart: rpm and tpm set on a team or project
/// count every key under it together, so each level has its own window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLevel {
    pub scope: Scope,
    pub scope_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<u32>,
}

/// The limits that bind a key: every rate and budget on the way up, each
/// counted at its own level, and the intersection of allowlists. `rpm` and
/// `tpm` are the tightest values on the way (what one key alone can reach),
/// for display.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effective {
    pub rpm: Option<u32>,
    pub tpm: Option<u32>,
    /// Levels with a rate set, org first.
    #[serde(default)]
    pub rates: Vec<RateLevel>,
    pub budgets: Vec<BudgetLevel>,
    pub models: Allowed,
}

/// Composes limits from the org down to the key. `canonical` maps a model
/// name or alias to its canonical name, so that an alias and its model are
/// the same entry; names it does not know are kept as written.
pub fn compose<'a>(
    chain: impl IntoIterator<Item = (Scope, &'a str, &'a Limits)>,
    canonical: impl Fn(&str) -> String,
) -> Effective {
    let mut eff = Effective {
        rpm: None,
        tpm: None,
        rates: Vec::new(),
        budgets: Vec::new(),
        models: Allowed::All,
    };
    let tighter = |a: Option<u32>, b: Option<u32>| match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    };
    for (scope, id, l) in chain {
        eff.rpm = tighter(eff.rpm, l.rpm);
        eff.tpm = tighter(eff.tpm, l.tpm);
        if l.rpm.is_some() || l.tpm.is_some() {
            eff.rates.push(RateLevel {
                scope,
                scope_id: id.to_owned(),
                rpm: l.rpm,
                tpm: l.tpm,
            });
        }
        if let (Some(micros), Some(period)) = (l.budget_micros, l.period) {
            eff.budgets.push(BudgetLevel {
                scope,
                scope_id: id.to_owned(),
                micros,
                period,
            });
        }
        if let Some(models) = &l.models {
            let here: BTreeSet<String> = models.iter().map(|m| canonical(m)).collect();
            eff.models = match eff.models {
                Allowed::All => Allowed::Only(here),
                Allowed::Only(prev) => Allowed::Only(prev.intersection(&here).cloned().collect()),
            };
        }
    }
    eff
}

/// Priority bands for admission, lowest first to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Band {
    Bronze,
    Silver,
    Gold,
    Platinum,
}

impl Band {
    pub fn name(self) -> &'static str {
        match self {
            Band::Bronze => "bronze",
            Band::Silver => "silver",
            Band::Gold => "gold",
            Band::Platinum => "platinum",
        }
    }

    /// `bronze`, `silver`, `gold` or `platinum`, in any case.
    pub fn parse(s: &str) -> Option<Band> {
        let s = s.to_ascii_lowercase();
        [Band::Bronze, Band::Silver, Band::Gold, Band::Platinum]
            .into_iter()
            .find(|v| v.name() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    pub key_id: String,
    pub project_id: String,
    pub name: String,
    /// Hex SHA-256 of the secret; the secret itself is never stored.
    pub hash: String,
    /// The first characters, so a person can tell keys apart.
    pub prefix: String,
    pub band: Band,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_profile: Option<String>,
    #[serde(default)]
    pub revoked: bool,
    /// The person whose key it is, so their use counts as theirs: one who
    /// made it on their profile page, or one an operator made it for
    /// (`keys create --owner`); None for an operator's own key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// While its claim link is unused: when the link ends. An unclaimed
    /// key opens nothing from then on, so a link nobody opened does not
    /// leave a live key whose secret no one holds (or someone found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_by: Option<UnixMillis>,
    /// When it stops opening anything, for a key made to end
    /// (`keys create --valid-for`): a key handed to a contractor or a demo
    /// should not outlive the need by being forgotten.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<UnixMillis>,
    /// After a rotation that gave the old secret time to be replaced
    /// where it is deployed: that secret, until its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<PreviousSecret>,
}

/// A rotated key's old secret while it still works.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousSecret {
    /// Hex SHA-256, as the key's own.
    pub hash: String,
    pub prefix: String,
    pub until: UnixMillis,
}

impl Key {
    /// Whether its claim link ended before anyone used it.
    pub fn claim_lapsed(&self, now: UnixMillis) -> bool {
        self.claim_by.is_some_and(|end| now >= end)
    }

    /// Whether it ended: its claim link lapsed, or its own end came.
    pub fn ended(&self, now: UnixMillis) -> bool {
        self.claim_lapsed(now) || self.expires_at.is_some_and(|end| now >= end)
    }

    /// A key whose own end came is refused a change as a revoked one is
    /// (limits, a new secret): it opens nothing, and no command revives
    /// it. The decision has no clock to tell.
    pub fn ended_refusal(&self, now: UnixMillis) -> Result<(), Rejection> {
        match self.expires_at {
            Some(end) if !self.revoked && now >= end => Err(Rejection::conflict(format!(
                "key {} has expired: it opens nothing; make a new key",
                self.key_id
            ))),
            _ => Ok(()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserStatus {
    Pending,
    Active,
    Suspended,
    /// Personal data removed; the id stays in the log, powerless.
    Erased,
}

impl UserStatus {
    /// `pending`, `active`, `suspended` or `erased`.
    pub fn name(self) -> &'static str {
        match self {
            UserStatus::Pending => "pending",
            UserStatus::Active => "active",
            UserStatus::Suspended => "suspended",
            UserStatus::Erased => "erased",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub user_id: String,
    pub status: UserStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    pub admin: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TenancyCommand {
    CreateOrg {
        org_id: String,
        name: String,
    },
    CreateTeam {
        team_id: String,
        org_id: String,
        name: String,
    },
    CreateProject {
        project_id: String,
        team_id: String,
        name: String,
    },
    SetLimits {
        scope: Scope,
        scope_id: String,
        limits: Limits,
    },
    IssueKey(Key),
    RevokeKey {
        key_id: String,
        by: String,
    },
    /// A new secret for the key, which keeps its id, limits, owner and
    /// history; the old one works until `previous_until` (None: no more).
    RotateKey {
        key_id: String,
        /// The hash of the secret being replaced, as the one asking saw
        /// it: two rotations at once both printed a secret, and the one
        /// decided first opened nothing. None: whatever it is now.
        replaces: Option<String>,
        hash: String,
        prefix: String,
        previous_until: Option<UnixMillis>,
        by: String,
    },
    SignUp {
        user_id: String,
    },
    Approve {
        user_id: String,
        project_id: String,
        by: String,
    },
    Suspend {
        user_id: String,
        by: String,
    },
    Promote {
        user_id: String,
        by: String,
    },
    ChangePassword {
        user_id: String,
    },
    /// An operator set a new password (the hash lives outside the log).
    ResetPassword {
        user_id: String,
        by: String,
    },
    /// The person's personal data is gone; the id stays, powerless.
    Erase {
        user_id: String,
        by: String,
    },
    /// The key's secret waits, sealed, behind a claim link that works
    /// until `until` (None: as links made before links had an end in the
    /// log, the key is not held to it).
    OfferClaim {
        key_id: String,
        by: String,
        until: Option<UnixMillis>,
    },
    /// The claim link was used; the sealed copy is gone.
    Claim {
        key_id: String,
    },
    /// Threads kept for a project (None: no more; the sweep deletes them).
    SetThreads {
        project_id: String,
        setting: Option<ThreadsSetting>,
        by: String,
    },
    /// Memory notes kept for a project (None: no more).
    SetMemory {
        project_id: String,
        setting: Option<MemorySetting>,
        by: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum TenancyEvent {
    OrgCreated {
        org_id: String,
        name: String,
    },
    TeamCreated {
        team_id: String,
        org_id: String,
        name: String,
    },
    ProjectCreated {
        project_id: String,
        team_id: String,
        name: String,
    },
    LimitsSet {
        scope: Scope,
        scope_id: String,
        limits: Limits,
    },
    KeyIssued(Key),
    KeyRevoked {
        key_id: String,
        by: String,
    },
    KeyRotated {
        key_id: String,
        /// The new secret's hash and display prefix.
        hash: String,
        prefix: String,
        /// Until when the old secret still works; absent: it stopped.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous_until: Option<UnixMillis>,
        by: String,
    },
    UserSignedUp {
        user_id: String,
    },
    UserApproved {
        user_id: String,
        project_id: String,
        by: String,
    },
    UserSuspended {
        user_id: String,
        by: String,
    },
    UserPromoted {
        user_id: String,
        by: String,
    },
    /// The hash lives outside the log; the event says that sessions end.
    PasswordChanged {
        user_id: String,
    },
    PasswordReset {
        user_id: String,
        by: String,
    },
    UserErased {
        user_id: String,
        by: String,
    },
    KeyClaimOffered {
        key_id: String,
        by: String,
        /// When the link ends; absent in events from before it was kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<UnixMillis>,
    },
    KeyClaimed {
        key_id: String,
    },
    ThreadsSet {
        project_id: String,
        setting: Option<ThreadsSetting>,
        by: String,
    },
    MemorySet {
        project_id: String,
        setting: Option<MemorySetting>,
        by: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Named {
    pub name: String,
    /// The parent: the org of a team, the team of a project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenancy {
    pub orgs: BTreeMap<String, Named>,
    pub teams: BTreeMap<String, Named>,
    pub projects: BTreeMap<String, Named>,
    pub keys: BTreeMap<String, Key>,
    /// Limits per scope and id (nested so that it serialises as JSON).
    pub limits: BTreeMap<Scope, BTreeMap<String, Limits>>,
    pub users: BTreeMap<String, User>,
    /// Projects that keep threads; absent means off.
    #[serde(default)]
    pub threads: BTreeMap<String, ThreadsSetting>,
    /// Projects that keep memory notes; absent means off.
    #[serde(default)]
    pub memory: BTreeMap<String, MemorySetting>,
}

/// The longest name a key may have, in characters.
pub const MAX_NAME: usize = 100;

/// Live keys one person may hold (their own, made on their profile or for
/// them by an operator).
pub const MAX_KEYS_PER_PERSON: usize = 25;

/// A character a name may not hold: a control character, or one that is
/// invisible or reorders what follows (U+202E before `gpj.exe` shows it as
/// `exe.jpg`), so that a name reads as it was written wherever shown.
pub fn hidden_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
        )
}

/// Why creating `kind id` again is refused: what differs from the one
/// made (its parent, its name), as it stands, so the operator can give
/// that or choose another id.
fn clash(kind: &str, id: &str, made: &Named, name: &str, parent: Option<&str>) -> String {
    let moved = made.parent.as_deref() != parent;
    let renamed = made.name != name;
    let mut said = format!("{kind} {id} already exists");
    if let (true, Some(held)) = (moved, &made.parent) {
        let above = if kind == "project" { "team" } else { "org" };
        said.push_str(&format!(" in {above} {held}"));
    }
    if renamed {
        said.push_str(&format!(" named {:?}", made.name));
    }
    let cannot = match (moved, renamed) {
        (true, true) => "move or rename",
        (true, false) => "move",
        _ => "rename",
    };
    said.push_str(&format!("; creating it again cannot {cannot} it"));
    said
}

fn check_hash(hash: &str) -> Result<(), Rejection> {
    if hash.len() != 64 || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(Rejection::invalid(
            "a key is stored as its hex SHA-256 hash, never in full",
        ));
    }
    Ok(())
}

fn check_prefix(prefix: &str) -> Result<(), Rejection> {
    if prefix.len() > 12 {
        return Err(Rejection::invalid(
            "a key's display prefix is at most 12 characters",
        ));
    }
    Ok(())
}

fn check_id(kind: &str, id: &str) -> Result<(), Rejection> {
    if id.is_empty()
        || id.len() > 128
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(Rejection::invalid(format!(
            "{kind} id {id:?} must be 1 to 128 of letters, digits and - _ ."
        )));
    }
    Ok(())
}

impl Tenancy {
    /// Whether `key` opens the gateway at `now`: not revoked, not a
    /// person's own key whose person was erased (the id stays, powerless;
    /// a suspension keeps it working, as the keys are the project's until
    /// revoked), and not one whose claim link ended unused or whose own
    /// end came.
    pub fn key_works(&self, key: &Key, now: UnixMillis) -> bool {
        self.key_stands(key) && !key.ended(now)
    }

    /// The half of [`Tenancy::key_works`] no clock changes: what a view
    /// can hold; the gateway checks a claim's end as a request comes.
    pub fn key_stands(&self, key: &Key) -> bool {
        !key.revoked
            && key.owner.as_ref().is_none_or(|o| {
                self.users
                    .get(o)
                    .is_some_and(|u| u.status != UserStatus::Erased)
            })
    }

    /// What [`decide`](Tenancy::decide) cannot see of setting limits, as
    /// it has no clock: a key whose claim link ended unused opens nothing
    /// again (as a revoked one), so limits set on it would be recorded as
    /// a change that changes nothing. The caller checks it with the time it
    /// read before it sends `SetLimits`.
    pub fn limits_refusal_at(
        &self,
        scope: Scope,
        scope_id: &str,
        now: UnixMillis,
    ) -> Result<(), Rejection> {
        match self.keys.get(scope_id) {
            Some(k) if scope == Scope::Key && !k.revoked && k.claim_lapsed(now) => {
                Err(Rejection::conflict(format!(
                    "key {scope_id}'s claim link expired unclaimed: it opens nothing; make a new key for whoever missed the link"
                )))
            }
            Some(k) if scope == Scope::Key => k.ended_refusal(now),
            _ => Ok(()),
        }
    }

    fn exists(&self, scope: Scope, id: &str) -> bool {
        match scope {
            Scope::Org => self.orgs.contains_key(id),
            Scope::Team => self.teams.contains_key(id),
            Scope::Project => self.projects.contains_key(id),
            Scope::Key => self.keys.contains_key(id),
        }
    }

    pub fn limits_at(&self, scope: Scope, id: &str) -> Option<&Limits> {
        self.limits.get(&scope).and_then(|m| m.get(id))
    }

    /// The levels above and at a key, org first.
    pub fn chain(&self, key_id: &str) -> Vec<(Scope, String)> {
        let Some(key) = self.keys.get(key_id) else {
            return Vec::new();
        };
        let mut chain = self.project_chain(&key.project_id);
        chain.push((Scope::Key, key_id.to_owned()));
        chain
    }

    /// The levels above and at a project, org first.
    pub fn project_chain(&self, project_id: &str) -> Vec<(Scope, String)> {
        let team = self.projects.get(project_id).and_then(|p| p.parent.clone());
        let org = team
            .as_ref()
            .and_then(|t| self.teams.get(t))
            .and_then(|t| t.parent.clone());
        let mut chain = Vec::new();
        if let Some(o) = org {
            chain.push((Scope::Org, o));
        }
        if let Some(t) = team {
            chain.push((Scope::Team, t));
        }
        chain.push((Scope::Project, project_id.to_owned()));
        chain
    }

    /// A project's composed limits: what a person signed in to it may do.
    pub fn project_effective(
        &self,
        project_id: &str,
        canonical: impl Fn(&str) -> String,
    ) -> Effective {
        self.compose_chain(&self.project_chain(project_id), canonical)
    }

    /// A key's composed limits.
    pub fn effective(&self, key_id: &str, canonical: impl Fn(&str) -> String) -> Effective {
        self.compose_chain(&self.chain(key_id), canonical)
    }

    fn compose_chain(
        &self,
        chain: &[(Scope, String)],
        canonical: impl Fn(&str) -> String,
    ) -> Effective {
        let empty = Limits::default();
        compose(
            chain
                .iter()
                .map(|(s, id)| (*s, id.as_str(), self.limits_at(*s, id).unwrap_or(&empty))),
            canonical,
        )
    }

    pub fn decide(&self, command: TenancyCommand) -> Result<Vec<TenancyEvent>, Rejection> {
        use TenancyCommand as C;
        use TenancyEvent as E;
        let same_or_conflict =
            |kind: &str, id: &str, existing: Option<&Named>, name: &str, parent: Option<&str>| {
                match existing {
                    None => Ok(true),
                    Some(n) if n.name == name && n.parent.as_deref() == parent => Ok(false),
                    Some(n) => Err(Rejection::conflict(clash(kind, id, n, name, parent))),
                }
            };
        Ok(match command {
            C::CreateOrg { org_id, name } => {
                check_id("org", &org_id)?;
                if same_or_conflict("org", &org_id, self.orgs.get(&org_id), &name, None)? {
                    vec![E::OrgCreated { org_id, name }]
                } else {
                    vec![]
                }
            }
            C::CreateTeam {
                team_id,
                org_id,
                name,
            } => {
                check_id("team", &team_id)?;
                if !self.orgs.contains_key(&org_id) {
                    return Err(Rejection::not_found(format!("no org {org_id}")));
                }
                if same_or_conflict(
                    "team",
                    &team_id,
                    self.teams.get(&team_id),
                    &name,
                    Some(&org_id),
                )? {
                    vec![E::TeamCreated {
                        team_id,
                        org_id,
                        name,
                    }]
                } else {
                    vec![]
                }
            }
            C::CreateProject {
                project_id,
                team_id,
                name,
            } => {
                check_id("project", &project_id)?;
                if !self.teams.contains_key(&team_id) {
                    return Err(Rejection::not_found(format!("no team {team_id}")));
                }
                if same_or_conflict(
                    "project",
                    &project_id,
                    self.projects.get(&project_id),
                    &name,
                    Some(&team_id),
                )? {
                    vec![E::ProjectCreated {
                        project_id,
                        team_id,
                        name,
                    }]
                } else {
                    vec![]
                }
            }
            C::SetLimits {
                scope,
                scope_id,
                limits,
            } => {
                if !self.exists(scope, &scope_id) {
                    return Err(Rejection::not_found(format!(
                        "no {} {scope_id}",
                        scope.name()
                    )));
                }
                // A revoked key opens nothing again: limits set on it would
                // be a change that changes nothing, recorded as if it did.
                if scope == Scope::Key && self.keys.get(&scope_id).is_some_and(|k| k.revoked) {
                    return Err(Rejection::conflict(format!("key {scope_id} is revoked")));
                }
                // Nor does one whose person was erased.
                if scope == Scope::Key
                    && self
                        .keys
                        .get(&scope_id)
                        .is_some_and(|k| !self.key_stands(k))
                {
                    return Err(Rejection::conflict(format!(
                        "key {scope_id} belonged to a person who was erased: it opens nothing"
                    )));
                }
                limits.check()?;
                if self.limits_at(scope, &scope_id) == Some(&limits) {
                    vec![]
                } else {
                    vec![E::LimitsSet {
                        scope,
                        scope_id,
                        limits,
                    }]
                }
            }
            C::IssueKey(key) => {
                check_id("key", &key.key_id)?;
                if self.keys.contains_key(&key.key_id) {
                    return Err(Rejection::conflict(format!(
                        "key id {} is taken",
                        key.key_id
                    )));
                }
                if !self.projects.contains_key(&key.project_id) {
                    return Err(Rejection::not_found(format!(
                        "no project {}",
                        key.project_id
                    )));
                }
                check_hash(&key.hash)?;
                check_prefix(&key.prefix)?;
                if key.revoked || key.previous.is_some() {
                    return Err(Rejection::invalid(
                        "a key is issued unrevoked, with one secret",
                    ));
                }
                // A name is shown in lists and pages, and kept in the log
                // for ever: a line's worth of text.
                if key.name.chars().count() > MAX_NAME || key.name.chars().any(hidden_char) {
                    return Err(Rejection::invalid(format!(
                        "a key's name is at most {MAX_NAME} characters, none of them control, invisible or direction characters"
                    )));
                }
                // It tells the keys of a project apart in every list.
                if key.name.trim().is_empty() {
                    return Err(Rejection::invalid(
                        "a key needs a name: what uses it (--name backend)",
                    ));
                }
                // A key for a person shows on their profile and counts as
                // theirs: the person must exist.
                if let Some(owner) = &key.owner {
                    match self.users.get(owner) {
                        None => return Err(Rejection::not_found(format!("no person {owner}"))),
                        // Its key would never open anything.
                        Some(u) if u.status == UserStatus::Erased => {
                            return Err(Rejection::conflict(format!(
                                "{owner} was erased: a key for them would never work"
                            )));
                        }
                        Some(_) => {}
                    }
                }
                // A name is how a holder tells their keys apart (and
                // revokes the right one), so one holder's live names in a
                // project do not repeat: a person's own keys among theirs,
                // the operators' among theirs (lists show the owner). Not
                // across holders: a person making a key on their profile
                // would learn the names of colleagues' keys by trying.
                if self.keys.values().any(|k| {
                    !k.revoked
                        && k.project_id == key.project_id
                        && k.owner == key.owner
                        && k.name == key.name
                }) {
                    return Err(Rejection::conflict(match &key.owner {
                        Some(owner) => format!(
                            "{owner} already has a key named {} in project {}: choose another name",
                            key.name, key.project_id
                        ),
                        None => format!(
                            "project {} already has a key named {}: choose another name",
                            key.project_id, key.name
                        ),
                    }));
                }
                // A person's own keys are bounded: each is in the log for
                // good, and a profile's button made them without end.
                if let Some(owner) = &key.owner {
                    let held = self
                        .keys
                        .values()
                        .filter(|k| !k.revoked && k.owner.as_ref() == Some(owner))
                        .count();
                    if held >= MAX_KEYS_PER_PERSON {
                        return Err(Rejection::conflict(format!(
                            "{owner} already has {held} live keys, the most one person may hold: revoke one first"
                        )));
                    }
                }
                vec![E::KeyIssued(key)]
            }
            C::RevokeKey { key_id, by } => match self.keys.get(&key_id) {
                None => return Err(Rejection::not_found(format!("no key {key_id}"))),
                Some(k) if k.revoked => vec![],
                Some(_) => vec![E::KeyRevoked { key_id, by }],
            },
            C::RotateKey {
                key_id,
                replaces,
                hash,
                prefix,
                previous_until,
                by,
            } => {
                let key = match self.keys.get(&key_id) {
                    None => return Err(Rejection::not_found(format!("no key {key_id}"))),
                    Some(k) => k,
                };
                if key.revoked {
                    return Err(Rejection::conflict(format!(
                        "{key_id} is revoked: make a new key"
                    )));
                }
                // A new secret would open nothing.
                if !self.key_stands(key) {
                    return Err(Rejection::conflict(format!(
                        "{key_id} belonged to a person who was erased: it opens nothing; make a new key"
                    )));
                }
                if replaces.as_ref().is_some_and(|r| *r != key.hash) {
                    return Err(Rejection::conflict(format!(
                        "{key_id} was rotated meanwhile, by another command: the secret it printed is the key's now; rotate again to replace that one"
                    )));
                }
                // The sealed secret behind the link would be the old one.
                if key.claim_by.is_some() {
                    return Err(Rejection::conflict(format!(
                        "{key_id}'s claim link is unused: revoke the key and make another"
                    )));
                }
                check_hash(&hash)?;
                check_prefix(&prefix)?;
                if self
                    .keys
                    .values()
                    .any(|k| k.hash == hash || k.previous.as_ref().is_some_and(|p| p.hash == hash))
                {
                    return Err(Rejection::conflict("that secret is already in use"));
                }
                vec![E::KeyRotated {
                    key_id,
                    hash,
                    prefix,
                    previous_until,
                    by,
                }]
            }
            C::SignUp { user_id } => {
                check_id("user", &user_id)?;
                if self.users.contains_key(&user_id) {
                    vec![]
                } else {
                    vec![E::UserSignedUp { user_id }]
                }
            }
            C::Approve {
                user_id,
                project_id,
                by,
            } => {
                let user = self.live_user(&user_id)?;
                if !self.projects.contains_key(&project_id) {
                    return Err(Rejection::not_found(format!("no project {project_id}")));
                }
                if user.status == UserStatus::Active
                    && user.project_id.as_deref() == Some(&project_id)
                {
                    vec![]
                } else {
                    // Moved out of a project, a person's own keys there (made
                    // by or for them) go with them: they kept opening it,
                    // counted against it, while every page said they were
                    // elsewhere. Their keys in other projects stay.
                    let left = user.project_id.as_ref().filter(|p| **p != project_id);
                    let revoked = (self.keys.values())
                        .filter(|k| {
                            !k.revoked
                                && k.owner.as_ref() == Some(&user_id)
                                && Some(&k.project_id) == left
                        })
                        .map(|k| E::KeyRevoked {
                            key_id: k.key_id.clone(),
                            by: by.clone(),
                        })
                        .collect::<Vec<_>>();
                    let mut events = vec![E::UserApproved {
                        user_id,
                        project_id,
                        by,
                    }];
                    events.extend(revoked);
                    events
                }
            }
            C::Suspend { user_id, by } => match self.live_user(&user_id)?.status {
                UserStatus::Suspended => vec![],
                _ => {
                    self.not_the_last_admin(&user_id)?;
                    vec![E::UserSuspended { user_id, by }]
                }
            },
            C::Promote { user_id, by } => {
                let user = self.user(&user_id)?;
                if user.status != UserStatus::Active {
                    return Err(Rejection::conflict(format!("user {user_id} is not active")));
                }
                if user.admin {
                    vec![]
                } else {
                    vec![E::UserPromoted { user_id, by }]
                }
            }
            C::ChangePassword { user_id } => {
                self.live_user(&user_id)?;
                vec![E::PasswordChanged { user_id }]
            }
            C::ResetPassword { user_id, by } => {
                self.live_user(&user_id)?;
                vec![E::PasswordReset { user_id, by }]
            }
            C::Erase { user_id, by } => match self.user(&user_id)?.status {
                UserStatus::Erased => vec![],
                _ => {
                    self.not_the_last_admin(&user_id)?;
                    vec![E::UserErased { user_id, by }]
                }
            },
            C::OfferClaim { key_id, by, until } => match self.keys.get(&key_id) {
                None => return Err(Rejection::not_found(format!("no key {key_id}"))),
                Some(k) if k.revoked => {
                    return Err(Rejection::conflict(format!("key {key_id} is revoked")));
                }
                Some(_) => vec![E::KeyClaimOffered { key_id, by, until }],
            },
            C::Claim { key_id } => match self.keys.get(&key_id) {
                None => return Err(Rejection::not_found(format!("no key {key_id}"))),
                Some(k) if k.revoked => {
                    return Err(Rejection::conflict(format!("key {key_id} is revoked")));
                }
                Some(_) => vec![E::KeyClaimed { key_id }],
            },
            C::SetThreads {
                project_id,
                setting,
                by,
            } => {
                self.project(&project_id)?;
                if let Some(s) = &setting {
                    check_retention(s.retain_hours)?;
                }
                if self.threads.get(&project_id) == setting.as_ref() {
                    vec![]
                } else {
                    vec![E::ThreadsSet {
                        project_id,
                        setting,
                        by,
                    }]
                }
            }
            C::SetMemory {
                project_id,
                setting,
                by,
            } => {
                self.project(&project_id)?;
                if let Some(s) = &setting {
                    check_retention(s.retain_hours)?;
                }
                if self.memory.get(&project_id) == setting.as_ref() {
                    vec![]
                } else {
                    vec![E::MemorySet {
                        project_id,
                        setting,
                        by,
                    }]
                }
            }
        })
    }

    fn project(&self, project_id: &str) -> Result<&Named, Rejection> {
        self.projects
            .get(project_id)
            .ok_or_else(|| Rejection::not_found(format!("no project {project_id}")))
    }

    fn user(&self, user_id: &str) -> Result<&User, Rejection> {
        self.users
            .get(user_id)
            .ok_or_else(|| Rejection::not_found(format!("no user {user_id}")))
    }

    /// Refuses to take away the last active admin: the admin pages would
    /// answer no one, and only the command line could mend it.
    fn not_the_last_admin(&self, user_id: &str) -> Result<(), Rejection> {
        let active_admin = |u: &User| u.admin && u.status == UserStatus::Active;
        let last = self.users.get(user_id).is_some_and(active_admin)
            && !self
                .users
                .iter()
                .any(|(id, u)| id != user_id && active_admin(u));
        if last {
            return Err(Rejection::conflict(format!(
                "user {user_id} is the last active admin: promote another person first (llmgw users promote)"
            )));
        }
        Ok(())
    }

    /// A user whose personal data has not been erased.
    fn live_user(&self, user_id: &str) -> Result<&User, Rejection> {
        match self.user(user_id)? {
            u if u.status == UserStatus::Erased => {
                Err(Rejection::conflict(format!("user {user_id} was erased")))
            }
            u => Ok(u),
        }
    }

    pub fn evolve(&mut self, event: &TenancyEvent) {
        use TenancyEvent as E;
        match event {
            E::OrgCreated { org_id, name } => {
                self.orgs.insert(
                    org_id.clone(),
                    Named {
                        name: name.clone(),
                        parent: None,
                    },
                );
            }
            E::TeamCreated {
                team_id,
                org_id,
                name,
            } => {
                self.teams.insert(
                    team_id.clone(),
                    Named {
                        name: name.clone(),
                        parent: Some(org_id.clone()),
                    },
                );
            }
            E::ProjectCreated {
                project_id,
                team_id,
                name,
            } => {
                self.projects.insert(
                    project_id.clone(),
                    Named {
                        name: name.clone(),
                        parent: Some(team_id.clone()),
                    },
                );
            }
            E::LimitsSet {
                scope,
                scope_id,
                limits,
            } => {
                self.limits
                    .entry(*scope)
                    .or_default()
                    .insert(scope_id.clone(), limits.clone());
            }
            E::KeyIssued(key) => {
                self.keys.insert(key.key_id.clone(), key.clone());
            }
            E::KeyRevoked { key_id, .. } => {
                if let Some(k) = self.keys.get_mut(key_id) {
                    k.revoked = true;
                    k.previous = None;
                }
            }
            E::KeyRotated {
                key_id,
                hash,
                prefix,
                previous_until,
                ..
            } => {
                if let Some(k) = self.keys.get_mut(key_id) {
                    let old_hash = std::mem::replace(&mut k.hash, hash.clone());
                    let old_prefix = std::mem::replace(&mut k.prefix, prefix.clone());
                    // One old secret at most: a second rotation ends the
                    // first one's grace.
                    k.previous = previous_until.map(|until| PreviousSecret {
                        hash: old_hash,
                        prefix: old_prefix,
                        until,
                    });
                }
            }
            E::UserSignedUp { user_id } => {
                self.users.insert(
                    user_id.clone(),
                    User {
                        user_id: user_id.clone(),
                        status: UserStatus::Pending,
                        project_id: None,
                        admin: false,
                    },
                );
            }
            E::UserApproved {
                user_id,
                project_id,
                ..
            } => {
                if let Some(u) = self.users.get_mut(user_id) {
                    u.status = UserStatus::Active;
                    u.project_id = Some(project_id.clone());
                }
            }
            E::UserSuspended { user_id, .. } => {
                if let Some(u) = self.users.get_mut(user_id) {
                    u.status = UserStatus::Suspended;
                }
            }
            E::UserPromoted { user_id, .. } => {
                if let Some(u) = self.users.get_mut(user_id) {
                    u.admin = true;
                }
            }
            E::UserErased { user_id, .. } => {
                if let Some(u) = self.users.get_mut(user_id) {
                    u.status = UserStatus::Erased;
                    u.admin = false;
                }
            }
            E::ThreadsSet {
                project_id,
                setting,
                ..
            } => match setting {
                Some(s) => {
                    self.threads.insert(project_id.clone(), *s);
                }
                None => {
                    self.threads.remove(project_id);
                }
            },
            E::MemorySet {
                project_id,
                setting,
                ..
            } => match setting {
                Some(s) => {
                    self.memory.insert(project_id.clone(), *s);
                }
                None => {
                    self.memory.remove(project_id);
                }
            },
            E::KeyClaimOffered { key_id, until, .. } => {
                if let Some(k) = self.keys.get_mut(key_id) {
                    k.claim_by = *until;
                }
            }
            E::KeyClaimed { key_id } => {
                if let Some(k) = self.keys.get_mut(key_id) {
                    k.claim_by = None;
                }
            }
            E::PasswordChanged { .. } | E::PasswordReset { .. } => {}
        }
    }
}
