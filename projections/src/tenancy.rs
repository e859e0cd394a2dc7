//! What authentication and admission read on every request: a key's hash to
//! its key, project, team and org, band, routing profile, and the limits
//! and allowlist composed down the tree.

use std::collections::BTreeMap;
use std::sync::Arc;

use llmgw_domain::Event;
use llmgw_domain::catalog::CatalogEvent;
use llmgw_domain::tenancy::{Band, Effective, Scope, Tenancy, TenancyEvent, UserStatus};
use llmgw_domain::time::UnixMillis;
use serde::{Deserialize, Serialize};

use crate::{Stamp, View};

/// Everything a request's key decides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyEntry {
    /// Shared with the usage records of the key's requests.
    pub key_id: Arc<str>,
    pub prefix: String,
    pub project_id: Arc<str>,
    pub team_id: Option<String>,
    pub org_id: Option<String>,
    pub band: Band,
    pub routing_profile: Option<String>,
    pub limits: Effective,
    /// While its claim link is unused: when the link ends, from which
    /// moment the key opens nothing (the gateway checks it per request,
    /// as no event marks that moment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_by: Option<UnixMillis>,
    /// When the secret it was found by stops opening anything: the key's
    /// own end, or a rotated key's old secret's end of grace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<UnixMillis>,
}

impl KeyEntry {
    /// Whether the key opens the gateway at `now`, as far as the clock
    /// decides (the rest decided whether the view gave the entry).
    pub fn works_at(&self, now: UnixMillis) -> bool {
        [self.claim_by, self.until]
            .into_iter()
            .flatten()
            .all(|end| now < end)
    }

    /// Whether only the clock can end it, so a request need not read it.
    pub fn ends(&self) -> bool {
        self.claim_by.is_some() || self.until.is_some()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TenancyView {
    pub tenancy: Tenancy,
    /// Hex SHA-256 of a key → its id; revoked keys are not here.
    by_hash: BTreeMap<String, String>,
    /// Alias → canonical model, so allowlists compare canonical names.
    aliases: BTreeMap<String, String>,
    /// How many applied events changed what this view says of a key: a
    /// cache of entries made at one revision is good until it moves.
    /// Counted, not a position, so that it only ever grows as the view
    /// follows the log, whatever positions events are applied with.
    #[serde(default)]
    revision: u64,
}

impl TenancyView {
    /// See the field: it moves with every event that may change an entry
    /// (a key, the tenancy tree, limits, users, a model's aliases) and
    /// with no other.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The live key with this hash and what it may do.
    pub fn lookup(&self, hash: &str) -> Option<KeyEntry> {
        let key_id = self.by_hash.get(hash)?;
        let mut entry = self.entry(key_id)?;
        // The old secret of a rotated key, in its grace.
        if let Some(old) = self.tenancy.keys[key_id.as_str()]
            .previous
            .as_ref()
            .filter(|p| p.hash == hash)
        {
            entry.until = Some(entry.until.map_or(old.until, |u| u.min(old.until)));
            entry.prefix.clone_from(&old.prefix);
        }
        Some(entry)
    }

    /// A live key's entry, by its id (a page showing a key just made).
    pub fn key_entry(&self, key_id: &str) -> Option<KeyEntry> {
        self.tenancy
            .keys
            .get(key_id)
            .filter(|k| !k.revoked)
            .and_then(|_| self.entry(key_id))
    }

    fn entry(&self, key_id: &str) -> Option<KeyEntry> {
        let key = self.tenancy.keys.get(key_id)?;
        // A person's own key goes with them when they are erased
        // (docs/people.md).
        if key.owner.is_some() && !self.tenancy.key_stands(key) {
            return None;
        }
        let (team_id, org_id) = self.team_and_org(&key.project_id);
        Some(KeyEntry {
            key_id: key_id.into(),
            prefix: key.prefix.clone(),
            project_id: key.project_id.as_str().into(),
            team_id,
            org_id,
            band: key.band,
            routing_profile: key.routing_profile.clone(),
            claim_by: key.claim_by,
            until: key.expires_at,
            limits: self.tenancy.effective(key_id, |m| {
                self.aliases.get(m).cloned().unwrap_or_else(|| m.to_owned())
            }),
        })
    }

    /// What a signed-in person may do: an active person stands for their
    /// project (its limits and allowlist, no key level), counted as
    /// `session:<user id>`. None for anyone else.
    pub fn person_entry(&self, user_id: &str) -> Option<KeyEntry> {
        let user = self.tenancy.users.get(user_id)?;
        if user.status != UserStatus::Active {
            return None;
        }
        let project_id = user.project_id.clone()?;
        let (team_id, org_id) = self.team_and_org(&project_id);
        Some(KeyEntry {
            key_id: format!("session:{user_id}").into(),
            prefix: String::new(),
            team_id,
            org_id,
            // As a key made without a band: chat is interactive.
            band: Band::Gold,
            routing_profile: None,
            claim_by: None,
            until: None,
            limits: self.tenancy.project_effective(&project_id, |m| {
                self.aliases.get(m).cloned().unwrap_or_else(|| m.to_owned())
            }),
            project_id: project_id.into(),
        })
    }

    /// The team and org a project belongs to.
    fn team_and_org(&self, project_id: &str) -> (Option<String>, Option<String>) {
        let chain = self.tenancy.project_chain(project_id);
        let find = |scope| {
            chain
                .iter()
                .find(|(s, _)| *s == scope)
                .map(|(_, id)| id.clone())
        };
        (find(Scope::Team), find(Scope::Org))
    }

    /// Live keys by hash, as `events replay --view tenancy` prints them.
    pub fn report(&self) -> BTreeMap<String, KeyEntry> {
        self.by_hash
            .keys()
            .filter_map(|hash| self.lookup(hash).map(|e| (hash.clone(), e)))
            .collect()
    }
}

impl View for TenancyView {
    const NAME: &'static str = "tenancy";

    fn apply_event(&mut self, _stamp: Stamp, event: &Event) {
        match event {
            Event::Tenancy(e) => {
                self.revision += 1;
                self.tenancy.evolve(e);
                match e {
                    TenancyEvent::KeyIssued(k) => {
                        self.by_hash.insert(k.hash.clone(), k.key_id.clone());
                    }
                    TenancyEvent::KeyRevoked { key_id, .. } => {
                        self.by_hash.retain(|_, id| id != key_id)
                    }
                    TenancyEvent::KeyRotated {
                        key_id,
                        hash,
                        previous_until,
                        ..
                    } => {
                        // What evolve kept: the new secret, and the old one
                        // while it has a grace (an older one's ends now).
                        let kept = self
                            .tenancy
                            .keys
                            .get(key_id)
                            .and_then(|k| k.previous.clone());
                        self.by_hash.retain(|h, id| {
                            id != key_id
                                || (previous_until.is_some()
                                    && kept.as_ref().is_some_and(|p| &p.hash == h))
                        });
                        self.by_hash.insert(hash.clone(), key_id.clone());
                    }
                    _ => {}
                }
            }
            Event::Catalog(
                CatalogEvent::ModelAdded { model } | CatalogEvent::ModelUpdated { model },
            ) => {
                self.revision += 1;
                self.aliases.retain(|_, c| *c != model.name);
                for a in &model.aliases {
                    self.aliases.insert(a.clone(), model.name.clone());
                }
            }
            Event::Catalog(CatalogEvent::ModelRemoved { name }) => {
                self.revision += 1;
                self.aliases.retain(|_, c| c != name)
            }
            _ => {}
        }
    }
}
