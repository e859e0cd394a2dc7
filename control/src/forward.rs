//! A standby's admin API forwards writes to the leader, so an operator may
//! talk to any server: the caller gets the leader's answer, unchanged. The
//! leader's admin address is what it recorded on taking office
//! (`LeadershipAcquired.admin`), read from the log's `leadership` stream;
//! its agent address (`LeadershipAcquired.agent`) is what a standby names
//! when it refuses an agent.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use llmgw_api::admin as api;
use llmgw_domain::Event;
use llmgw_domain::event::LeadershipEvent;
use llmgw_eventstore::EventStore;

use crate::ControlPlane;
use crate::admin::AdminError;

/// The largest command body forwarded (a model file is the largest).
const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// What this server knows of leaders' addresses.
#[derive(Debug, Default)]
pub(crate) struct Leaders {
    /// The `leadership` stream's version read so far.
    version: u64,
    /// Epoch → the addresses its leader recorded.
    addresses: std::collections::BTreeMap<u64, Addresses>,
    /// The last look at the lease, reused for a moment by agents' streams.
    last: Option<Office>,
}

#[derive(Debug, Clone, Default)]
struct Addresses {
    admin: Option<String>,
    agent: Option<String>,
}

/// Who holds the lease, until when, and where it answers, as read at one
/// moment.
#[derive(Debug, Clone)]
pub(crate) struct Office {
    /// The holder while the lease is held; None once it ran out or was
    /// released.
    pub(crate) holder: Option<String>,
    /// When the lease runs out (by this server's clock); None when free.
    pub(crate) until: Option<tokio::time::Instant>,
    /// The holder's admin and agent addresses, if it recorded them.
    pub(crate) admin: Option<String>,
    pub(crate) agent: Option<String>,
    /// The lease's epoch, held or not: a leader under a lower one is
    /// deposed.
    pub(crate) epoch: u64,
    /// When the read began: it saw everything committed before then.
    read: tokio::time::Instant,
}

impl Office {
    /// How long until the lease may be taken: zero when it is free.
    pub(crate) fn until_free(&self) -> std::time::Duration {
        match (&self.holder, self.until) {
            (Some(_), Some(t)) => t.saturating_duration_since(tokio::time::Instant::now()),
            _ => std::time::Duration::ZERO,
        }
    }
}

impl ControlPlane {
    /// The admin address of the server that leads now, if it recorded one.
    pub(crate) async fn leader_admin(&self) -> Result<Option<(String, String)>, AdminError> {
        let office = self
            .office(tokio::time::Instant::now())
            .await
            .map_err(crate::ControlError::from)?;
        Ok(office.holder.zip(office.admin))
    }

    /// Who leads now, as read at `since` or later: callers that arrive
    /// together share one read (a fleet of agents knocking at once costs
    /// the store a few reads, not one each).
    pub(crate) async fn office(
        &self,
        since: tokio::time::Instant,
    ) -> Result<Office, llmgw_eventstore::StoreError> {
        let mut leaders = self.leaders.lock().await;
        if let Some(last) = &leaders.last
            && last.read >= since
        {
            return Ok(last.clone());
        }
        let read = tokio::time::Instant::now();
        let info = self.store.lease_info().await?;
        loop {
            let page = self
                .store
                .read_stream("leadership", leaders.version, 500)
                .await?;
            let Some(last) = page.last() else { break };
            leaders.version = last.stream_version;
            for r in &page {
                if let Ok(Event::Leadership(LeadershipEvent::LeadershipAcquired {
                    epoch,
                    admin,
                    agent,
                    ..
                })) = Event::decode(&r.event_type, r.schema_version, &r.payload)
                {
                    leaders.addresses.insert(epoch, Addresses { admin, agent });
                }
            }
        }
        let holder = info.holder.filter(|_| info.held);
        // The store's clock says when; this server counts down on its own.
        let until = info.expires_at.filter(|_| holder.is_some()).map(|at| {
            let left = (at - chrono::Utc::now()).to_std().unwrap_or_default();
            tokio::time::Instant::now() + left
        });
        let addresses = leaders
            .addresses
            .get(&info.epoch)
            .cloned()
            .unwrap_or_default();
        let office = Office {
            holder,
            until,
            admin: addresses.admin,
            agent: addresses.agent,
            epoch: info.epoch,
            read,
        };
        leaders.last = Some(office.clone());
        Ok(office)
    }
}

/// Passes reads and a leader's own commands through; a standby sends a
/// command on to the leader once (never a forwarded one again). While no
/// leader is in office (an election, a takeover after a crash) it waits,
/// bounded, for one, rather than failing a command a moment early. The
/// reads only the leader can answer go to it too, and are answered here,
/// from this server's own views, when it cannot be asked.
pub async fn forward_writes(
    State(cp): State<Arc<ControlPlane>>,
    request: Request,
    next: Next,
) -> Response {
    // Reads only the leader can answer: a node's log and its heartbeats
    // come over its agent's stream, which the leader holds, and so do the
    // downloads in progress and the processes that hold GPUs and ports
    // (which explain weighs, and weights collection asks); the engines in
    // use are those of the leader's file; a model held back after its
    // failures, and until when, is the leader's reconciler's (a standby
    // said such a model waited for a place). `status` stays this
    // server's: it says how far this server's views have read.
    let reading = matches!(*request.method(), Method::GET | Method::HEAD);
    let leaders_only = matches!(
        request.uri().path(),
        "/api/v1/logs"
            | "/api/v1/models"
            | "/api/v1/engines"
            | "/api/v1/nodes"
            | "/api/v1/replicas"
            | "/api/v1/explain"
            | "/api/v1/weights"
    );
    let forwarded_by = request.headers().get(api::FORWARDED_HEADER);
    let forwarded = forwarded_by.is_some();
    if forwarded_by.is_some_and(|by| by.as_bytes() == cp.config.instance.as_bytes()) {
        // Sent on by this very server: the leader recorded an admin
        // address (a loopback default, most often) that here reaches this
        // standby. No wait mends that; the sender says so at once.
        return AdminError(
            StatusCode::LOOP_DETECTED,
            format!(
                "{} forwarded a command to the leader's recorded admin address and reached itself",
                cp.config.instance
            ),
        )
        .into_response();
    }
    if forwarded && !cp.is_leader() {
        // Sent here as to the leader, but this server does not lead: it is
        // taking office or stepping down this moment, or the leader
        // recorded an address that reaches another server. 423: nothing
        // was decided, and the sender may try again.
        return AdminError(
            StatusCode::LOCKED,
            format!(
                "{} received a command forwarded to the leader, but does not lead",
                cp.config.instance
            ),
        )
        .into_response();
    }
    if (reading && !leaders_only) || cp.is_leader() || forwarded {
        return next.run(request).await;
    }
    let (parts, body) = match buffered(request).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    let rebuild = || Request::from_parts(parts.clone(), Body::from(body.clone()));
    if reading {
        // One try at the leader; this server's own answer otherwise (and
        // at once should this server take office meanwhile: the leader
        // asked stopped answering).
        let mut silent = None;
        if let Ok(Some((holder, url))) = cp.leader_admin().await
            && holder != cp.config.instance
        {
            let who = (cp.config.instance.as_str(), cp.admin_token());
            let asked = tokio::select! {
                r = forward(&cp.http, who, &url, &parts, body.clone()) => Some(r),
                () = taking_office(&cp) => None,
            };
            match asked {
                Some(Ok(r))
                    if r.status() != StatusCode::LOCKED
                        && r.status() != StatusCode::LOOP_DETECTED =>
                {
                    return token_refused(r, &cp.config.instance, &holder, &url);
                }
                Some(Err(_)) => silent = Some((holder, url)),
                _ => {}
            }
        }
        let answer = next.run(rebuild()).await;
        // What only the leader knows, asked while it does not answer: said
        // so, with when another may take over, rather than "send it to the
        // leader", which is what was tried.
        if let Some((holder, url)) = silent
            && answer.status() == StatusCode::SERVICE_UNAVAILABLE
            && !cp.is_leader()
        {
            let free = cp
                .office(tokio::time::Instant::now())
                .await
                .map(|o| o.until_free().as_secs())
                .unwrap_or_default();
            return AdminError(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "only the leader can answer this, and the leader {holder} does not answer at {url}; its lease runs out in {free} s if it does not renew it, and then a server takes office: try again then"
                ),
            )
            .into_response();
        }
        return answer;
    }
    if let Some((refused, command)) = own_file_model(&cp, &parts, &body) {
        // Recorded as the leader records its own file's refusals: an
        // operator's refused command is in the log whichever server said no.
        if let Some(command) = command {
            let origin = crate::tenancy_api::origin(&parts.headers);
            let rejection = llmgw_domain::Rejection::conflict(refused.1.clone());
            cp.record_refused(&origin, &command, &rejection).await;
        }
        return refused.into_response();
    }
    // Where the log stood before the command was first sent: what any
    // leader decided of it lies after.
    let since = cp.store.head().await.ok().map(|(p, _)| p);
    let deadline = tokio::time::Instant::now() + (cp.config.lease_ttl * 2).min(MAX_WAIT);
    let mut leadership = cp.leadership();
    let mut last_error = None;
    loop {
        if cp.is_leader() {
            return next.run(rebuild()).await;
        }
        match cp.leader_admin().await {
            Ok(Some((holder, url))) if holder != cp.config.instance => {
                let who = (cp.config.instance.as_str(), cp.admin_token());
                let sent = forward(&cp.http, who, &url, &parts, body.clone());
                // A leader that hangs mid-command loses its lease, and this
                // server may take office meanwhile: then the log says
                // whether the command was decided, at once, where the
                // forward waited out its 30 s and said "perhaps".
                let answered = tokio::select! {
                    // An answer that came is the answer, office or not.
                    biased;
                    r = sent => Some(r),
                    () = taking_office(&cp) => None,
                };
                let Some(answered) = answered else {
                    return match decided_since(&cp, &parts, since).await {
                        // Never decided, and never will be there: the old
                        // leader is fenced. This server decides it now.
                        Ok(None) => {
                            tracing::info!(leader = %holder, "the leader stopped answering a command sent on to it, and this server took office: the log shows it undecided, so it is decided here");
                            next.run(rebuild()).await
                        }
                        Ok(Some(at)) => AdminError(
                            StatusCode::BAD_GATEWAY,
                            format!(
                                "the leader {holder} stopped answering and this server took office; {holder} had decided the command (position {at}) before it stopped, but its answer is lost: `llmgw events show {at}` tells what it did; do not send it again"
                            ),
                        )
                        .into_response(),
                        Err(why) => AdminError(
                            StatusCode::BAD_GATEWAY,
                            format!(
                                "the leader {holder} stopped answering and this server took office; whether {holder} decided the command first is not known ({why}): check `llmgw events tail` before sending it again"
                            ),
                        )
                        .into_response(),
                    };
                };
                match answered {
                    // Not decided there: that server does not lead (yet,
                    // or any more). Asked again, until the deadline.
                    Ok(r) if r.status() == StatusCode::LOCKED => {
                        last_error = Some(Unsent::NotLeading(holder, url));
                    }
                    // Either this server's own run before a crash, whose
                    // lease has not run out (one server restarted: nothing
                    // to set), or another server that recorded this one's
                    // address (a setting to mend). Both are said, with
                    // when the lease frees.
                    Ok(r) if r.status() == StatusCode::LOOP_DETECTED => {
                        let free = cp
                            .office(tokio::time::Instant::now())
                            .await
                            .map(|o| o.until_free().as_secs().max(1))
                            .unwrap_or(1);
                        let said = format!(
                            "this server is a standby, and the leader {holder}'s recorded admin address {url} reaches this server itself. If {holder} was this server before a restart (it stopped without giving up its lease), its lease runs out in {free} s and this server takes office: try again then. Otherwise set control.advertise_admin on each server to an address the others reach (the default is its loopback admin_listen)"
                        );
                        return AdminError(StatusCode::SERVICE_UNAVAILABLE, said).into_response();
                    }
                    Ok(r) => return token_refused(r, &cp.config.instance, &holder, &url),
                    // Sent, perhaps decided: never sent again.
                    Err(why) if why.sent => {
                        let said = why.say(&holder, &url, "");
                        return AdminError(StatusCode::BAD_GATEWAY, said).into_response();
                    }
                    Err(why) => last_error = Some(Unsent::Failed(holder, url, why)),
                }
            }
            // No leader yet, or this server is taking office.
            Ok(_) => {}
            Err(e) => return e.into_response(),
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        let _ = tokio::time::timeout(RECHECK, leadership.changed()).await;
    }
    // Nothing was decided: 503, worth trying again (502 is kept for a
    // command that was sent and may have been).
    let said = match last_error {
        Some(Unsent::Failed(holder, url, why)) => format!(
            "this server is a standby: {}",
            why.say(
                &holder,
                &url,
                &format!("if {holder} is up, set its control.advertise_admin to an address this server reaches; if it is down, try again once a new leader is elected")
            )
        ),
        Some(Unsent::NotLeading(holder, url)) => format!(
            "this server is a standby, and what answers at the leader {holder}'s recorded admin address {url} does not lead: set control.advertise_admin on each server to an address the others reach"
        ),
        // The handler refuses with the leader's name (or "not elected yet").
        None => return next.run(rebuild()).await,
    };
    AdminError(StatusCode::SERVICE_UNAVAILABLE, said).into_response()
}

/// The leader's answer to a command this server sent on, except a 401:
/// the leader refused the admin token this server sent with it (its own
/// admin_token), not the operator's, which this server took. Handed back
/// as it was, it told the operator their token was wrong ("check
/// LLMGW_ADMIN_TOKEN") when it is the servers' tokens that differ. Nothing
/// was decided: the leader's guard refuses before anything runs.
pub(crate) fn token_refused(answer: Response, instance: &str, holder: &str, url: &str) -> Response {
    if answer.status() != StatusCode::UNAUTHORIZED {
        return answer;
    }
    AdminError(
        StatusCode::BAD_GATEWAY,
        format!(
            "the leader {holder} at {url} refused the admin token this server ({instance}) sent on with the command: the servers' admin_token settings differ, so nothing was done. Give every server the same admin_token (LLMGW_ADMIN_TOKEN) and restart the one that differs, or send the command to the leader's admin API at {url} with its token"
        ),
    )
    .into_response()
}

/// Until this server leads.
async fn taking_office(cp: &ControlPlane) {
    let mut leadership = cp.leadership();
    while !cp.is_leader() {
        if leadership.changed().await.is_err() {
            // The control plane is going away: no office to take.
            std::future::pending::<()>().await;
        }
    }
}

/// Where the command sent on was decided after `since`, by the events its
/// id marks, if it was: read once this server leads, when the old leader
/// can append nothing more. A command that came without an id cannot be
/// found.
async fn decided_since(
    cp: &ControlPlane,
    parts: &axum::http::request::Parts,
    since: Option<u64>,
) -> Result<Option<u64>, String> {
    // As the leader's `origin()` takes it: an id it would have replaced
    // with its own cannot be found by this one.
    let id = parts
        .headers
        .get(api::COMMAND_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= api::COMMAND_ID_MAX)
        .ok_or("the command came without an id the leader keeps")?;
    let mut after = since.ok_or("the log's head could not be read when it was sent")?;
    loop {
        let page = cp
            .store
            .read_all_raw(after, 1000)
            .await
            .map_err(|e| e.to_string())?;
        let Some(last) = page.last() else {
            return Ok(None);
        };
        after = last.position;
        if let Some(e) = page.iter().find(|e| e.metadata["command_id"] == id) {
            return Ok(Some(e.position));
        }
    }
}

/// Why a command was not sent on (so that nothing was decided).
enum Unsent {
    Failed(String, String, Unanswered),
    NotLeading(String, String),
}

/// A model change sent through this standby for a model its own
/// configuration file defines: the leader checks its own file, but this
/// server applies its file when it takes office, and the change would be
/// undone then.
fn own_file_model(
    cp: &ControlPlane,
    parts: &axum::http::request::Parts,
    body: &[u8],
) -> Option<(AdminError, Option<llmgw_domain::Command>)> {
    use llmgw_domain::Command;
    use llmgw_domain::catalog::CatalogCommand;
    if parts.uri.path() != "/api/v1/models" {
        return None;
    }
    let (name, command) = match parts.method {
        // A whole model is recorded as the change refused; one the leader
        // would refuse anyway is still told apart by its name.
        Method::POST => match crate::admin::model_of(body) {
            Ok(m) => (
                m.name.clone(),
                Some(Command::Catalog(CatalogCommand::UpdateModel(m))),
            ),
            Err(_) => {
                let v: serde_json::Value = serde_json::from_slice(body).ok()?;
                (v.get("name")?.as_str()?.to_owned(), None)
            }
        },
        Method::DELETE => {
            #[derive(serde::Deserialize)]
            struct Named {
                name: String,
            }
            let name = axum::extract::Query::<Named>::try_from_uri(&parts.uri)
                .ok()?
                .0
                .name;
            let remove = Command::Catalog(CatalogCommand::RemoveModel { name: name.clone() });
            (name, Some(remove))
        }
        _ => return None,
    };
    cp.config.models.iter().any(|m| m.name == name).then(|| {
        let refused = AdminError(
            StatusCode::CONFLICT,
            format!(
                "model {name} is defined in this server's configuration file, which is applied whenever this server takes office: it cannot be changed with ctl; edit every server's file and restart them"
            ),
        );
        (refused, command)
    })
}

/// The request's head and its whole body, which a forward sends again.
pub(crate) async fn buffered(
    request: Request,
) -> Result<(axum::http::request::Parts, axum::body::Bytes), Response> {
    let (parts, body) = request.into_parts();
    match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(b) => Ok((parts, b)),
        Err(e) => Err(AdminError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the command's body: {e}"),
        )
        .into_response()),
    }
}

/// How long a standby waits at most for a leader to forward to.
const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(15);
/// How often it looks again while waiting.
const RECHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// Why a forward got no answer to hand back.
#[derive(Debug)]
pub(crate) struct Unanswered {
    /// The request may have reached the leader (it failed after the
    /// connection was made), so the command may have been decided there.
    pub(crate) sent: bool,
    pub(crate) why: String,
}

impl Unanswered {
    /// What the operator is told, naming the leader and where it was sought.
    pub(crate) fn say(&self, holder: &str, url: &str, advice: &str) -> String {
        if self.sent {
            format!(
                "the leader {holder} at {url} did not finish answering ({}): the command may have been decided there; check `llmgw events tail` before sending it again",
                self.why
            )
        } else {
            format!(
                "the leader {holder} does not answer at {url}: {}; {advice}",
                self.why
            )
        }
    }
}

/// The HTTP client that forwards operators' commands: no proxy (the leader
/// is on the operators' own network), a bound on a command's time, and a
/// short one on reaching the leader, so that a page which asks the leader
/// (the dashboard's nodes, through a router-only server) does not hang on
/// an address that drops packets.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(std::time::Duration::from_secs(2))
        .timeout(std::time::Duration::from_secs(30))
        .build()
        // Only a broken TLS backend fails here; the default still works.
        .unwrap_or_default()
}

pub(crate) async fn forward(
    http: &reqwest::Client,
    (instance, token): (&str, Option<&str>),
    leader: &str,
    parts: &axum::http::request::Parts,
    body: axum::body::Bytes,
) -> Result<Response, Unanswered> {
    let failed = |e: reqwest::Error| Unanswered {
        sent: !e.is_connect() && !e.is_builder(),
        why: e.to_string(),
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    let method =
        reqwest::Method::from_bytes(parts.method.as_str().as_bytes()).map_err(|e| Unanswered {
            sent: false,
            why: e.to_string(),
        })?;
    let mut out = http
        .request(method, format!("{}{path}", leader.trim_end_matches('/')))
        .header(api::FORWARDED_HEADER, instance)
        .body(body);
    // The servers share the admin token (admin_token): the leader's admin
    // API wants it of a forward as of an operator.
    if let Some(token) = token {
        out = out.bearer_auth(token);
    }
    for (name, value) in &parts.headers {
        let keep = [
            axum::http::header::CONTENT_TYPE.as_str(),
            api::ACTOR_HEADER,
            api::ACTOR_KIND_HEADER,
            api::COMMAND_HEADER,
        ];
        if keep.contains(&name.as_str()) {
            out = out.header(name.as_str(), value.as_bytes());
        }
    }
    let answer = out.send().await.map_err(failed)?;
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = answer.headers().get(reqwest::header::CONTENT_TYPE).cloned();
    let bytes = answer.bytes().await.map_err(failed)?;
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    if let Some(ct) =
        content_type.and_then(|v| axum::http::HeaderValue::from_bytes(v.as_bytes()).ok())
    {
        response
            .headers_mut()
            .insert(axum::http::header::CONTENT_TYPE, ct);
    }
    Ok(response)
}
