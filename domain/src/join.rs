//! Joining: single-use join tokens an operator issues, a node's use of one
//! (it gets a certificate naming it, signed by the cluster's authority),
//! and the certificates refused once a node is removed.
//!
//! A token's secret never enters an event: only its SHA-256 does, and a
//! short id (the hash's first characters) that names its stream. A token
//! is looked up by the hash of what a node presents, so a guess learns
//! nothing about the tokens that exist: every unknown secret gets the
//! same answer.
//!
//! The deny list is part of the log: removing a node (`NodeRemoved`)
//! refuses every certificate naming it until it joins again with a new
//! token, and the certificates it got by joining for ever.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::NodeId;
use crate::nodes::{NodeEvent, Nodes};
use crate::{Event, Millis, Rejection, UnixMillis};

/// The longest a token may stay valid: a token is a credential lying
/// about, and joining is something an operator does now.
pub const MAX_TTL_MS: Millis = 7 * 24 * 3600 * 1000;

/// How many characters of the hash name a token.
pub const TOKEN_ID_LEN: usize = 12;

/// A token as the log knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    pub id: String,
    /// The node it may join as; None lets the node name itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<NodeId>,
    pub expires_at: UnixMillis,
    /// The node that used it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_by: Option<NodeId>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Joining {
    /// Token hash (hex SHA-256 of the secret) → the token.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tokens: BTreeMap<String, Token>,
    /// Node → the fingerprints (hex SHA-256 of the DER) of the
    /// certificates it got by joining.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub certificates: BTreeMap<NodeId, Vec<String>>,
    /// Nodes removed and not joined since: every certificate naming one
    /// is refused.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub removed: BTreeSet<NodeId>,
    /// Fingerprint → the node it was issued to, for certificates of nodes
    /// that were removed: refused for ever, a later join included.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub revoked: BTreeMap<String, NodeId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinCommand {
    IssueToken {
        token_hash: String,
        node_id: Option<NodeId>,
        expires_at: UnixMillis,
        now: UnixMillis,
    },
    /// A node presents a token and gets `certificate` (its fingerprint).
    Redeem {
        token_hash: String,
        node_id: NodeId,
        certificate: String,
        now: UnixMillis,
    },
    /// The node leaves the cluster and its certificates are refused.
    RemoveNode { node_id: NodeId },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum JoinEvent {
    JoinTokenIssued {
        token_id: String,
        token_hash: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node_id: Option<NodeId>,
        expires_at: UnixMillis,
    },
    /// The token was used: single use, so this is its last event.
    NodeJoined {
        token_id: String,
        node_id: NodeId,
        /// The fingerprint of the certificate the node got.
        certificate: String,
    },
}

impl JoinEvent {
    /// `jointoken-<id>`: a token's issue and its use, so that two nodes
    /// presenting one token conflict on its stream's version.
    pub fn stream_id(&self) -> String {
        match self {
            JoinEvent::JoinTokenIssued { token_id, .. }
            | JoinEvent::NodeJoined { token_id, .. } => {
                format!("jointoken-{token_id}")
            }
        }
    }
}

/// The id a token's hash is shown and streamed under.
pub fn token_id(token_hash: &str) -> String {
    token_hash.chars().take(TOKEN_ID_LEN).collect()
}

/// "5 s", "3 min", "2 h", "4 d".
fn span(ms: Millis) -> String {
    let s = (ms / 1000).max(0);
    match s {
        0..120 => format!("{s} s"),
        120..7200 => format!("{} min", s / 60),
        7200..172_800 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

pub(crate) fn valid_node_id(node_id: &str) -> Result<(), Rejection> {
    if node_id.is_empty() || node_id.len() > 128 || node_id.chars().any(char::is_whitespace) {
        return Err(Rejection::invalid(
            "a node id must be 1 to 128 characters without spaces",
        ));
    }
    Ok(())
}

fn is_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Joining {
    pub fn is_empty(&self) -> bool {
        self == &Joining::default()
    }

    /// The token whose hash this is.
    pub fn token(&self, token_hash: &str) -> Option<&Token> {
        self.tokens.get(token_hash)
    }

    /// Why a token cannot be used now by `node_id`, or None when it can.
    /// An unknown hash gets the one answer any guess gets.
    pub fn check(
        &self,
        token_hash: &str,
        node_id: &NodeId,
        now: UnixMillis,
    ) -> Result<&Token, Rejection> {
        let Some(t) = self.token(token_hash) else {
            return Err(Rejection::not_found(
                "not a valid join token: issue one with `llmgw ctl node token`",
            ));
        };
        if let Some(by) = &t.used_by {
            return Err(Rejection::conflict(format!(
                "join token {} was already used (by node {by}): a token joins one node once; issue a new one with `llmgw ctl node token`",
                t.id
            )));
        }
        if now >= t.expires_at {
            return Err(Rejection::conflict(format!(
                "join token {} expired {} ago: issue a new one with `llmgw ctl node token`",
                t.id,
                span(now - t.expires_at)
            )));
        }
        if let Some(n) = t.node_id.as_ref().filter(|n| *n != node_id) {
            return Err(Rejection::invalid(format!(
                "join token {} is for node {n}, not {node_id}: run the agent with --node-id {n}, or issue a token for {node_id}",
                t.id
            )));
        }
        Ok(t)
    }

    /// Why a stream from `node_id` presenting the certificate with this
    /// fingerprint is refused, or None.
    pub fn refusal(&self, node_id: &NodeId, fingerprint: &str) -> Option<String> {
        if let Some(n) = self.revoked.get(fingerprint) {
            return Some(format!(
                "this certificate was revoked when node {n} was removed from the cluster: join again with a new token (`llmgw ctl node token --node {n}`, then `LLMGW_AGENT_JOIN=TOKEN llmgw agent run …` on the node)"
            ));
        }
        self.removed.contains(node_id).then(|| {
            format!(
                "node {node_id} was removed from the cluster: its certificates are refused until it joins again with a new token (`llmgw ctl node token --node {node_id}`, then `LLMGW_AGENT_JOIN=TOKEN llmgw agent run …` on the node)"
            )
        })
    }

    pub fn decide(&self, nodes: &Nodes, command: JoinCommand) -> Result<Vec<Event>, Rejection> {
        Ok(match command {
            JoinCommand::IssueToken {
                token_hash,
                node_id,
                expires_at,
                now,
            } => {
                if !is_hash(&token_hash) {
                    return Err(Rejection::invalid("a token hash is 64 hex characters"));
                }
                if let Some(n) = &node_id {
                    valid_node_id(n)?;
                }
                if expires_at <= now || expires_at - now > MAX_TTL_MS {
                    return Err(Rejection::invalid(format!(
                        "a join token lasts more than 0 s and at most {}",
                        span(MAX_TTL_MS)
                    )));
                }
                let id = token_id(&token_hash);
                if self.tokens.contains_key(&token_hash) || self.tokens.values().any(|t| t.id == id)
                {
                    return Err(Rejection::conflict(format!(
                        "a token with id {id} exists: issue another"
                    )));
                }
                vec![Event::Join(JoinEvent::JoinTokenIssued {
                    token_id: id,
                    token_hash,
                    node_id,
                    expires_at,
                })]
            }
            JoinCommand::Redeem {
                token_hash,
                node_id,
                certificate,
                now,
            } => {
                valid_node_id(&node_id)?;
                if !is_hash(&certificate) {
                    return Err(Rejection::invalid(
                        "a certificate fingerprint is 64 hex characters",
                    ));
                }
                let t = self.check(&token_hash, &node_id, now)?;
                vec![Event::Join(JoinEvent::NodeJoined {
                    token_id: t.id.clone(),
                    node_id,
                    certificate,
                })]
            }
            JoinCommand::RemoveNode { node_id } => {
                let registered = nodes.nodes.contains_key(&node_id);
                let joined = self.certificates.contains_key(&node_id);
                if !registered && !joined {
                    if self.removed.contains(&node_id) {
                        return Ok(vec![]);
                    }
                    return Err(Rejection::not_found(format!(
                        "no node {node_id} has registered or joined"
                    )));
                }
                vec![Event::Node(NodeEvent::NodeRemoved {
                    certificates: self.certificates.get(&node_id).cloned().unwrap_or_default(),
                    node_id,
                })]
            }
        })
    }

    pub fn evolve(&mut self, event: &JoinEvent) {
        match event {
            JoinEvent::JoinTokenIssued {
                token_id,
                token_hash,
                node_id,
                expires_at,
            } => {
                self.tokens.insert(
                    token_hash.clone(),
                    Token {
                        id: token_id.clone(),
                        node_id: node_id.clone(),
                        expires_at: *expires_at,
                        used_by: None,
                    },
                );
            }
            JoinEvent::NodeJoined {
                token_id,
                node_id,
                certificate,
            } => {
                if let Some(t) = self.tokens.values_mut().find(|t| &t.id == token_id) {
                    t.used_by = Some(node_id.clone());
                }
                self.certificates
                    .entry(node_id.clone())
                    .or_default()
                    .push(certificate.clone());
                self.removed.remove(node_id);
            }
        }
    }

    /// A removal: the node's certificates join the deny list.
    pub fn evolve_node(&mut self, event: &NodeEvent) {
        if let NodeEvent::NodeRemoved {
            node_id,
            certificates,
        } = event
        {
            self.removed.insert(node_id.clone());
            self.certificates.remove(node_id);
            for c in certificates {
                self.revoked.insert(c.clone(), node_id.clone());
            }
        }
    }
}
