//! Nodes that join with a token, and nodes that are removed.
//!
//! An operator asks the leader's admin API for a token (`POST
//! /api/v1/join-tokens`); the leader decides `IssueToken` with the
//! secret's SHA-256 only and answers the secret once. A node presents it
//! on the agent listener (`JoinService.Join`, which needs no client
//! certificate: the node has none yet) with a certificate signing request;
//! the leader checks the token against its views (so a token that cannot
//! be used costs no signature), signs, and decides `Redeem`, which the log
//! makes single use (two nodes racing with one token conflict on its
//! stream, and the second is refused). Removal (`POST
//! /api/v1/nodes/{node}/remove`) appends `NodeRemoved`, whose deny list
//! the agent service checks when a stream opens, and ends the node's
//! stream at once.
//!
//! The join request travels over the agent listener rather than an HTTPS
//! route: it is the one address every node can reach (the admin API stays
//! on loopback, the client listener may face the internet with another
//! certificate), it is already TLS with the authority's server
//! certificate, and a standby refuses it the way it refuses a stream,
//! naming the leader.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use llmgw_api::admin as api;
use llmgw_api::v1::{JoinReply, JoinRequest};
use llmgw_domain::ids::NodeId;
use llmgw_domain::join::{JoinCommand, token_id};
use llmgw_domain::{Command, Rejection, RejectionCode};
use sha2::Digest;
use tonic::{Request, Response, Status};

use crate::admin::{AdminError, Result};
use crate::{ControlError, ControlPlane};

fn sha256_hex(s: &str) -> String {
    sha2::Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn rfc3339(at: llmgw_domain::UnixMillis) -> String {
    chrono::DateTime::from_timestamp_millis(at.0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// What the admin API answers when this server cannot sign.
const CANNOT_SIGN: &str = "this server cannot sign nodes' certificates: give the leader's tls: section a ca_key (the authority's private key) to let nodes join with a token (docs/install.md, \"3. The nodes\")";

pub(crate) async fn issue_token(
    State(cp): State<Arc<ControlPlane>>,
    headers: axum::http::HeaderMap,
    Json(req): Json<api::JoinTokenRequest>,
) -> Result<api::JoinToken> {
    let origin = crate::tenancy_api::origin(&headers);
    let Some(authority) = cp.authority.get() else {
        return Err(AdminError(StatusCode::CONFLICT, CANNOT_SIGN.into()));
    };
    let secret = crate::tenancy_api::random_hex(48);
    let token_hash = sha256_hex(&secret);
    let now = llmgw_domain::UnixMillis::now();
    let ttl_ms = i64::try_from(req.ttl_ms).unwrap_or(i64::MAX);
    let expires_at = now + ttl_ms;
    let decided = cp
        .execute(
            &origin,
            vec![Command::Join(JoinCommand::IssueToken {
                token_hash: token_hash.clone(),
                node_id: req.node.as_deref().map(NodeId::from),
                expires_at,
                now,
            })],
        )
        .await?;
    cp.views_reach(decided.position).await;
    let id = token_id(&token_hash);
    tracing::info!(token = %id, node = req.node.as_deref().unwrap_or("any"), expires_at = %rfc3339(expires_at), "join token issued");
    Ok(Json(api::JoinToken {
        token: llmgw_api::join_token::format(&secret, authority.pin()),
        id,
        node: req.node,
        expires_at: rfc3339(expires_at),
        agent_url: cp
            .agent_url
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
    }))
}

pub(crate) async fn remove_node(
    State(cp): State<Arc<ControlPlane>>,
    headers: axum::http::HeaderMap,
    Path(node): Path<NodeId>,
) -> Result<api::Changed> {
    let origin = crate::tenancy_api::origin(&headers);
    let decided = cp
        .execute(
            &origin,
            vec![Command::Join(JoinCommand::RemoveNode {
                node_id: node.clone(),
            })],
        )
        .await?;
    cp.views_reach(decided.position).await;
    // Its stream ends now: the agent dials again and is refused, unless
    // it came without a certificate, when nothing tells it from a new node.
    let certified = cp.agents.disconnect(&node);
    if certified.is_some() {
        tracing::info!(node = %node, "removed: its stream is closed");
    }
    let done = match certified {
        Some(false) => format!(
            "node {node} removed: its replicas are rebuilt elsewhere. Its agent connected without a client certificate, so nothing refuses it: while it runs it registers again as a new node. Stop it on the machine, or have agents join with certificates (`llmgw ctl node token`)"
        ),
        Some(true) => format!(
            "node {node} removed: its replicas are rebuilt elsewhere and its certificates are refused until it joins again with a new token"
        ),
        // Not connected here: how it connects is not known, so both are
        // said (a plaintext agent was told its certificates were refused).
        None => format!(
            "node {node} removed: its replicas are rebuilt elsewhere. Its agent is not connected: if it connects with a client certificate, that is refused until it joins again with a new token; if it connects without one, nothing refuses it and it registers again as a new node once it runs, so stop it on the machine"
        ),
    };
    Ok(Json(crate::admin::changed(&decided, &done)))
}

/// A refusal of a join, as the agent reads it.
fn refused(r: Rejection) -> Status {
    match r.code {
        // One answer for every unknown token: nothing to enumerate.
        RejectionCode::NotFound => Status::unauthenticated(r.reason),
        RejectionCode::Conflict => Status::permission_denied(r.reason),
        RejectionCode::Invalid => Status::invalid_argument(r.reason),
    }
}

/// The join service on the agent listener.
#[derive(Debug, Clone)]
pub struct JoinSvc(pub Arc<ControlPlane>);

#[tonic::async_trait]
impl llmgw_api::JoinService for JoinSvc {
    async fn join(
        &self,
        request: Request<JoinRequest>,
    ) -> std::result::Result<Response<JoinReply>, Status> {
        let cp = &self.0;
        let peer = request
            .remote_addr()
            .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
        // Only the leader signs: a standby sends the node to it.
        cp.admit().await?;
        let Some(authority) = cp.authority.get() else {
            tracing::warn!(%peer, "a node asked to join, but this server has no tls.ca_key to sign with");
            return Err(Status::failed_precondition(
                "this server does not sign nodes' certificates: its tls: section has no ca_key",
            ));
        };
        let JoinRequest {
            token,
            node_id,
            csr_pem,
        } = request.into_inner();
        // Typed here, at the edge: the domain names nodes by NodeId.
        let node_id = NodeId::from(node_id);
        let refuse = |status: Status| {
            tracing::warn!(%peer, node = %node_id, reason = %status.message(), "refused a node's join");
            status
        };
        let Some((secret, pin)) = llmgw_api::join_token::split(&token) else {
            return Err(refuse(Status::unauthenticated(
                "not a join token: tokens look like llmgw-join-….… as `llmgw ctl node token` prints them",
            )));
        };
        if !pin.eq_ignore_ascii_case(authority.pin()) {
            return Err(refuse(Status::failed_precondition(
                "this token names another authority than this server's (tls.ca): it was issued by another cluster",
            )));
        }
        let token_hash = sha256_hex(secret);
        let now = llmgw_domain::UnixMillis::now();
        // The views first: a token that cannot be used costs no signature.
        {
            let views = cp.views.read().unwrap_or_else(|p| p.into_inner());
            views
                .cluster
                .joining
                .check(&token_hash, &node_id, now)
                .map_err(|r| refuse(refused(r)))?;
        }
        let (certificate_pem, fingerprint) = authority
            .sign(&csr_pem, &node_id)
            .map_err(|e| refuse(Status::invalid_argument(e.to_string())))?;
        let decided = cp
            .execute(
                &cp.own(),
                vec![Command::Join(JoinCommand::Redeem {
                    token_hash: token_hash.clone(),
                    node_id: node_id.clone(),
                    certificate: fingerprint.clone(),
                    now,
                })],
            )
            .await
            .map_err(|e| {
                refuse(match e {
                    ControlError::Rejected(r) => refused(r),
                    other => Status::unavailable(other.to_string()),
                })
            })?;
        cp.views_reach(decided.position).await;
        let id = token_id(&token_hash);
        tracing::info!(%peer, node = %node_id, token = %id, certificate = %fingerprint, "a node joined");
        Ok(Response::new(JoinReply {
            certificate_pem,
            ca_pem: authority.ca_pem().to_owned(),
            token_id: id,
        }))
    }
}
