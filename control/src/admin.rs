//! The operators' API under `/api/v1` on the admin listener (loopback by
//! default). Reads come from this server's views, so a standby answers
//! them too; changes go through the leader's decisions and a standby
//! refuses them with the leader's name.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use llmgw_api::admin as api;
use llmgw_decider::Origin;
use llmgw_domain::catalog::{CatalogCommand, Model};
use llmgw_domain::ids::NodeId;
use llmgw_domain::nodes::{NodeCommand, Reachability};
use llmgw_domain::replicas::{ReplicaStatus, ShardState};
use llmgw_domain::{Command, RejectionCode};
use llmgw_eventstore::EventStore;
use serde::Deserialize;

use crate::{ControlError, ControlPlane};

pub fn router(cp: Arc<ControlPlane>) -> Router {
    Router::new()
        .route("/api/v1/nodes", get(nodes))
        .route("/api/v1/nodes/{node}/cordon", post(cordon))
        .route("/api/v1/nodes/{node}/uncordon", post(uncordon))
        .route("/api/v1/nodes/{node}/drain", post(drain))
        .route(
            "/api/v1/nodes/{node}/remove",
            post(crate::join::remove_node),
        )
        .route("/api/v1/join-tokens", post(crate::join::issue_token))
        .route(
            "/api/v1/models",
            get(models).post(add_model).delete(remove_model),
        )
        .route("/api/v1/replicas", get(replicas))
        .route("/api/v1/explain", get(explain))
        .route("/api/v1/status", get(status))
        .route("/api/v1/leader", get(leader))
        .route("/api/v1/logs", get(logs))
        .route("/api/v1/weights", get(weights))
        .route("/api/v1/engines", get(engines))
        .route("/api/v1/weights/collect", post(collect_weights))
        .layer(axum::middleware::from_fn(refuse_unprintable_actor))
        .with_state(cp)
}

/// Answers 400 to a request whose operator name ([`api::ACTOR_HEADER`])
/// could not be recorded as given (see [`api::actor_refusal`]): a newline
/// in `--as` forged a line of `events log`, an escape sequence cleared the
/// auditor's terminal. Refused rather than recorded under another name, so
/// the operator learns why.
pub async fn refuse_unprintable_actor(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(why) = actor_refusal(request.headers()) {
        return AdminError(StatusCode::BAD_REQUEST, why).into_response();
    }
    next.run(request).await
}

/// Why the request's operator name (or its kind) is refused, if it is.
fn actor_refusal(headers: &axum::http::HeaderMap) -> Option<String> {
    if let Some(kind) = headers.get(api::ACTOR_KIND_HEADER)
        && !matches!(kind.to_str(), Ok("operator" | api::ACTOR_KIND_PERSON))
    {
        return Some(format!(
            "the {} header is operator or {}, nothing else",
            api::ACTOR_KIND_HEADER,
            api::ACTOR_KIND_PERSON
        ));
    }
    let value = headers.get(api::ACTOR_HEADER)?;
    match value.to_str() {
        Ok(text) => api::actor_header_refusal(text),
        Err(_) => api::actor_header_refusal("%"),
    }
}

pub(crate) struct AdminError(pub(crate) StatusCode, pub(crate) String);

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        (self.0, Json(api::ErrorBody { error: self.1 })).into_response()
    }
}

impl From<ControlError> for AdminError {
    fn from(e: ControlError) -> Self {
        let code = match &e {
            ControlError::Rejected(r) => match r.code {
                RejectionCode::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
                RejectionCode::NotFound => StatusCode::NOT_FOUND,
                RejectionCode::Conflict => StatusCode::CONFLICT,
            },
            ControlError::Standby { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ControlError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
            ControlError::Conflict { .. } => StatusCode::CONFLICT,
            // The CLI reads this as "a server leads: use its admin API".
            ControlError::Lease(_) => StatusCode::LOCKED,
        };
        if code == StatusCode::SERVICE_UNAVAILABLE {
            tracing::warn!(error = %e, "admin change refused");
        }
        AdminError(code, e.to_string())
    }
}

pub(crate) type Result<T> = std::result::Result<Json<T>, AdminError>;

fn reachability(r: Reachability) -> &'static str {
    match r {
        Reachability::Ready => "ready",
        Reachability::Unreachable => "unreachable",
        Reachability::Lost => "lost",
    }
}

fn lower<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

async fn nodes(State(cp): State<Arc<ControlPlane>>) -> Result<Vec<api::NodeRow>> {
    let views = cp.views.read().unwrap_or_else(|p| p.into_inner());
    let c = &views.cluster;
    let rows = c
        .nodes
        .nodes
        .values()
        .map(|n| {
            let held = c.allocations.get(&n.id).map_or(0, |a| a.len());
            let classes: BTreeSet<&str> =
                n.inventory.gpus.iter().map(|g| g.class.as_str()).collect();
            let replicas = c
                .replicas
                .replicas
                .values()
                .filter(|r| r.is_live() && r.placement.shards.iter().any(|s| s.node_id == n.id))
                .count();
            let healthy = n
                .inventory
                .gpus
                .iter()
                .filter(|g| g.problems.is_empty())
                .count();
            api::NodeRow {
                id: n.id.to_string(),
                hostname: n.inventory.hostname.clone(),
                addr: n.inventory.mgmt_addr.clone(),
                state: reachability(n.reachability).into(),
                cordoned: n.cordoned,
                draining: n.draining,
                gpus: n.inventory.gpus.len(),
                gpus_free: healthy.saturating_sub(held),
                classes: classes.into_iter().collect::<Vec<_>>().join(","),
                fabrics: n
                    .inventory
                    .fabrics
                    .iter()
                    .map(|f| f.fabric.clone())
                    .collect(),
                memory_total_mb: n.inventory.memory_total_mb,
                engines: n.inventory.engines.keys().cloned().collect(),
                replicas,
                connected: cp.agents.connected(&n.id),
                last_heartbeat_s: cp
                    .observed
                    .last_heard(&n.id)
                    .filter(|_| cp.is_leader())
                    .map(|t| t.elapsed().as_secs_f64()),
                gpu_classes: gpu_classes(&n.inventory.gpus),
                provision: if cp.is_leader() {
                    cp.observed.provision_of(&n.id)
                } else {
                    Vec::new()
                },
                gpu_problems: (n.inventory.gpus.iter())
                    .flat_map(|g| {
                        g.problems
                            .iter()
                            .map(move |p| format!("GPU {}: {p}", g.index))
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(Json(rows))
}

/// Why a model's newest replica failed, if it did: "on NODE: why". Only
/// the newest's own (replica ids sort by creation), shown while a retry
/// loads; an older failure said nothing of now, and an on-demand model
/// idle since it served showed one from long ago for ever.
fn last_failure<'a>(
    replicas: impl Iterator<Item = &'a llmgw_domain::replicas::Replica>,
) -> Option<String> {
    let newest = replicas.max_by(|a, b| a.placement.replica_id.cmp(&b.placement.replica_id))?;
    newest.shards.values().find_map(|s| {
        s.error
            .as_ref()
            .map(|e| format!("on {}: {e}", s.placement.node_id))
    })
}

/// Whether every node of a replica answers: one on a node gone quiet is
/// not serving, whatever it last said (the summaries read "all serving"
/// while the gateway had nothing to route to, until the node was lost).
fn answers(nodes: &llmgw_domain::nodes::Nodes, r: &llmgw_domain::replicas::Replica) -> bool {
    r.placement.shards.iter().all(|s| {
        nodes
            .nodes
            .get(&s.node_id)
            .is_some_and(|n| n.reachability == Reachability::Ready)
    })
}

async fn models(State(cp): State<Arc<ControlPlane>>) -> Result<Vec<api::ModelRow>> {
    let views = cp.views.read().unwrap_or_else(|p| p.into_inner());
    let c = &views.cluster;
    let held = cp.observed.held();
    // Asked only of a model short of its floor: what the reconciler finds
    // on its pass, which otherwise only the leader's log would say.
    let unplaced = |m: &llmgw_domain::catalog::Model, live: usize| {
        if live >= m.scaling.min as usize {
            return None;
        }
        if c.nodes.nodes.is_empty() {
            return Some(format!("{} waits for a node: none has registered", m.name));
        }
        let options = llmgw_domain::placement::PlaceOptions {
            port_range: cp.config.port_range,
        };
        let id = "explain".into();
        llmgw_domain::placement::place_quiet(m, &c.nodes, &c.replicas, &held, &id, options)
            .is_none()
            .then(|| {
                llmgw_domain::placement::place(m, &c.nodes, &c.replicas, &held, &id, options)
                    .summary()
            })
    };
    let rows = c
        .catalog
        .models
        .values()
        .map(|m| {
            let of = || {
                c.replicas
                    .replicas
                    .values()
                    .filter(|r| r.placement.model == m.name)
            };
            api::ModelRow {
                name: m.name.clone(),
                aliases: m.aliases.clone(),
                profiles: m.profiles.iter().map(|p| p.name.clone()).collect(),
                min: m.scaling.min,
                max: m.scaling.max,
                on_demand: m.on_demand(),
                replicas: of().filter(|r| r.is_live()).count(),
                ready: of()
                    .filter(|r| r.status == ReplicaStatus::Ready && answers(&c.nodes, r))
                    .count(),
                last_failure: of()
                    .all(|r| r.status != ReplicaStatus::Ready)
                    .then(|| last_failure(of()))
                    .flatten()
                    .map(|e| match cp.next_try_s(&m.name) {
                        Some(s) => {
                            format!("{e}; tried again in {s} s (backing off after failures)")
                        }
                        None => e,
                    }),
                unplaced: unplaced(m, of().filter(|r| r.is_live()).count()),
                source: m.source.clone(),
                shapes: m
                    .profiles
                    .iter()
                    .map(|p| api::ProfileShape {
                        name: p.name.clone(),
                        engine: p.engine.name().into(),
                        gpu_class: p.gpu_class.clone(),
                        tp: p.tp,
                        pp: p.pp,
                        nodes: p.nodes,
                        gpus_per_node: p.gpus_per_node,
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(Json(rows))
}

/// A node's cards grouped by class, each class with its smallest card.
fn gpu_classes(gpus: &[llmgw_domain::nodes::Gpu]) -> Vec<api::GpuClassRow> {
    let mut by_class: std::collections::BTreeMap<&str, (u32, u64)> = Default::default();
    for g in gpus {
        let e = by_class.entry(g.class.as_str()).or_insert((0, u64::MAX));
        e.0 += 1;
        e.1 = e.1.min(g.memory_mb);
    }
    by_class
        .into_iter()
        .map(|(class, (count, memory_mb))| api::GpuClassRow {
            class: class.into(),
            count,
            memory_mb,
        })
        .collect()
}

#[derive(Debug, Deserialize)]
struct ModelQuery {
    model: Option<String>,
    #[serde(default)]
    all: bool,
}

async fn replicas(
    State(cp): State<Arc<ControlPlane>>,
    Query(q): Query<ModelQuery>,
) -> Result<Vec<api::ReplicaRow>> {
    let views = cp.views.read().unwrap_or_else(|p| p.into_inner());
    let c = &views.cluster;
    let wanted = q.model.as_deref().map(|m| {
        c.catalog
            .resolve(m)
            .map_or_else(|| m.to_owned(), |m| m.name.clone())
    });
    // A name that is no model, alias or removed model's replica is a typo,
    // not an empty answer.
    if let Some(m) = &wanted
        && c.catalog.resolve(m).is_none()
        && !c
            .replicas
            .replicas
            .values()
            .any(|r| &r.placement.model == m)
    {
        return Err(AdminError(
            StatusCode::NOT_FOUND,
            format!("no model or alias {m}; `llmgw ctl models` lists them"),
        ));
    }
    let rows = c
        .replicas
        .replicas
        .values()
        .filter(|r| q.all || r.is_live())
        .filter(|r| wanted.as_ref().is_none_or(|m| &r.placement.model == m))
        .map(|r| {
            let current = c.catalog.models.get(&r.placement.model).and_then(|m| {
                (m.profiles.iter())
                    .find(|p| p.name == r.placement.profile)
                    .map(|p| m.profile_fp(p))
            });
            let mut shards: Vec<api::ShardRow> =
                r.shards
                    .values()
                    .map(|s| api::ShardRow {
                        shard_id: s.placement.shard_id.to_string(),
                        rank: s.placement.rank,
                        node: s.placement.node_id.to_string(),
                        gpus: s.placement.gpu_indices.clone(),
                        port: s.placement.port,
                        state: lower::<ShardState>(&shown_state(r.status, s.state)),
                        error: s.error.clone(),
                        fetch: cp.observed.fetch_of(&s.placement.shard_id).map(|(d, t)| {
                            api::Fetch {
                                bytes_done: d,
                                bytes_total: t,
                            }
                        }),
                    })
                    .collect();
            shards.sort_by_key(|s| s.rank);
            api::ReplicaRow {
                id: r.placement.replica_id.to_string(),
                model: r.placement.model.clone(),
                profile: r.placement.profile.clone(),
                status: lower(&r.status),
                adopted: r.adopted,
                // A stopped replica is replaced by nothing: the note
                // read as if its profile edit were under way.
                outdated: r.is_live() && current.is_some_and(|fp| fp != r.placement.profile_fp),
                fabric: r.placement.fabric.clone(),
                shards,
                ended: r.ended.clone(),
            }
        })
        .collect();
    Ok(Json(rows))
}

/// A stopped replica's shards keep the last state they reported
/// ("ready", "draining"); shown as what they are now, stopped, unless a
/// shard failed, which is worth seeing.
fn shown_state(replica: ReplicaStatus, shard: ShardState) -> ShardState {
    match (replica, shard) {
        (ReplicaStatus::Stopped, ShardState::Failed) => ShardState::Failed,
        (ReplicaStatus::Stopped, _) => ShardState::Stopped,
        _ => shard,
    }
}

async fn explain(
    State(cp): State<Arc<ControlPlane>>,
    Query(q): Query<ModelQuery>,
) -> Result<api::Explanation> {
    let name = q.model.ok_or_else(|| {
        AdminError(
            StatusCode::BAD_REQUEST,
            "say which model: ?model=NAME".into(),
        )
    })?;
    let views = cp.views.read().unwrap_or_else(|p| p.into_inner());
    let c = &views.cluster;
    let model = c.catalog.resolve(&name).ok_or_else(|| {
        AdminError(
            StatusCode::NOT_FOUND,
            format!("no model or alias {name}; `llmgw ctl models` lists them"),
        )
    })?;
    let e = llmgw_domain::placement::place(
        model,
        &c.nodes,
        &c.replicas,
        &cp.observed.held(),
        &"explain".into(),
        llmgw_domain::placement::PlaceOptions {
            port_range: cp.config.port_range,
        },
    );
    // What it says is where one more replica would go: of a model that
    // runs already, said as such (a model at its max read "fits nowhere").
    let live = (c.replicas.replicas.values())
        .filter(|r| r.is_live() && r.placement.model == model.name)
        .count();
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let summary = match live {
        0 => e.summary(),
        // At its max no further one is placed: what follows is where one
        // would go were the max higher, said so (it read as a placement
        // to come).
        n if n >= model.scaling.max as usize => format!(
            "{} runs {n} replica{}, its most (scaling.max {}): no further one is placed; with a higher max, one would go: {}",
            model.name,
            plural(n),
            model.scaling.max,
            e.summary()
        ),
        n => format!(
            "{} runs {n} replica{} (at most {}); a further one: {}",
            model.name,
            plural(n),
            model.scaling.max,
            e.summary()
        ),
    };
    Ok(Json(api::Explanation {
        model: e.model.clone(),
        summary,
        profiles: e
            .profiles
            .iter()
            .map(|p| api::ProfileVerdict {
                profile: p.profile.clone(),
                priority: p.priority,
                outcome: p.outcome.clone(),
                candidates: p
                    .candidates
                    .iter()
                    .map(|c| api::Candidate {
                        node: c.node.to_string(),
                        fits: c.fits,
                        reason: c.reason.clone(),
                    })
                    .collect(),
            })
            .collect(),
    }))
}

async fn change(
    cp: &ControlPlane,
    origin: &llmgw_decider::Origin,
    commands: Vec<Command>,
    done: &str,
) -> Result<api::Changed> {
    let decided = cp.execute(origin, commands).await?;
    cp.views_reach(decided.position).await;
    Ok(Json(changed(&decided, done)))
}

/// What a command changed, as the API answers it.
pub(crate) fn changed(decided: &llmgw_decider::Decided, done: &str) -> api::Changed {
    let events: Vec<String> = decided.events.iter().map(|e| e.encode().0).collect();
    let message = if events.is_empty() {
        format!("nothing to change: {done} already")
    } else {
        done.to_owned()
    };
    api::Changed { events, message }
}

async fn cordon(
    State(cp): State<Arc<ControlPlane>>,
    headers: axum::http::HeaderMap,
    Path(node): Path<String>,
) -> Result<api::Changed> {
    let origin = crate::tenancy_api::origin(&headers);
    let done = format!("{node} is cordoned: no new placement, nothing running is touched");
    change(
        &cp,
        &origin,
        vec![Command::Node(NodeCommand::Cordon {
            node_id: node.into(),
            by: origin.actor.name().to_owned(),
            reason: "operator".into(),
        })],
        &done,
    )
    .await
}

async fn uncordon(
    State(cp): State<Arc<ControlPlane>>,
    headers: axum::http::HeaderMap,
    Path(node): Path<String>,
) -> Result<api::Changed> {
    let origin = crate::tenancy_api::origin(&headers);
    let done = format!("{node} is uncordoned");
    change(
        &cp,
        &origin,
        vec![Command::Node(NodeCommand::Uncordon {
            node_id: node.into(),
            by: origin.actor.name().to_owned(),
        })],
        &done,
    )
    .await
}

async fn drain(
    State(cp): State<Arc<ControlPlane>>,
    headers: axum::http::HeaderMap,
    Path(node): Path<String>,
) -> Result<api::Changed> {
    let origin = crate::tenancy_api::origin(&headers);
    let done = format!(
        "{node} is draining: each replica moves once its replacement serves; one with nowhere to go keeps serving here (`llmgw ctl explain-placement MODEL` says why; `llmgw ctl uncordon {node}` ends the drain)"
    );
    change(
        &cp,
        &origin,
        vec![Command::Node(NodeCommand::Drain {
            node_id: node.into(),
            by: origin.actor.name().to_owned(),
        })],
        &done,
    )
    .await
}

async fn add_model(
    State(cp): State<Arc<ControlPlane>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<api::Changed> {
    let origin = crate::tenancy_api::origin(&headers);
    let model = model_of(&body)?;
    // Its every start would fail at the fetch, and requests for it wait
    // out their on-demand wait: refused now, with why.
    if model.source.starts_with("mirror:") && cp.config.mirror_url.is_none() {
        return Err(AdminError(
            StatusCode::BAD_REQUEST,
            format!(
                "model {} has a mirror source ({}), but this server names no mirror (mirror.url in server.yaml): its nodes could not fetch it",
                model.name, model.source
            ),
        ));
    }
    from_config_file(&cp, &origin, &model.name, "changed", || {
        Command::Catalog(CatalogCommand::UpdateModel(model.clone()))
    })
    .await?;
    let exists = cp
        .views
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .cluster
        .catalog
        .models
        .contains_key(&model.name);
    let (command, mut done) = if exists {
        (
            CatalogCommand::UpdateModel(model.clone()),
            format!("model {} updated", model.name),
        )
    } else {
        (
            CatalogCommand::AddModel(model.clone()),
            format!("model {} added", model.name),
        )
    };
    let fits = {
        let views = cp.views.read().unwrap_or_else(|p| p.into_inner());
        cp.fits_on(&model, &views.cluster.nodes)
    };
    if model.profiles.is_empty() {
        done.push_str(&format!(
            "; it has no profiles, so no node starts it until it has one (`llmgw ctl plan {}` suggests some); a static endpoint that names it serves it meanwhile",
            model.name
        ));
    } else if !fits {
        done.push_str(&format!(
            "; but no node of this cluster can take it as it stands, so it does not run (`llmgw ctl explain-placement {}` says why for each node)",
            model.name
        ));
    }
    change(&cp, &origin, vec![Command::Catalog(command)], &done).await
}

/// The model a body describes. A key the model does not have is refused,
/// as the configuration file refuses it: skipped, a misspelt `scaling` or
/// `gpu_class` would leave its default in place and report success.
pub(crate) fn model_of(body: &[u8]) -> std::result::Result<Model, AdminError> {
    let bad = |why: String| AdminError(StatusCode::BAD_REQUEST, why);
    let mut unknown = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    let model: Model = serde_ignored::deserialize(&mut de, |path| unknown.push(path.to_string()))
        .and_then(|m| de.end().map(|()| m))
        .map_err(|e| {
            // `engin: sim` fails as `engine` missing: the unknown key
            // met before the failure is the likelier mistake.
            let typo = unknown
                .first()
                .map(|k| {
                    let k = k.replace(".?", "");
                    format!(" (`{k}` is a key llmgw does not know: misspelt?)")
                })
                .unwrap_or_default();
            bad(format!("the body is not a model: {e}{typo}"))
        })?;
    if let Some(path) = unknown.first() {
        let (at, key) = path.rsplit_once('.').unwrap_or(("", path));
        let whence = if at.is_empty() {
            String::new()
        } else {
            format!(" in {at}")
        };
        return Err(bad(format!(
            "the model has a key llmgw does not know: `{key}`{whence}"
        )));
    }
    Ok(model)
}

/// The configuration file's models are applied again whenever a server
/// takes office, so a change made here would silently last only until
/// then: it is refused, naming where the model is defined, and recorded
/// as every refused operator command is (`command` is what was refused).
async fn from_config_file(
    cp: &ControlPlane,
    origin: &Origin,
    name: &str,
    verb: &str,
    command: impl FnOnce() -> Command,
) -> std::result::Result<(), AdminError> {
    if cp.config.models.iter().any(|m| m.name == name) {
        // A model the file stops naming stays in the catalog (a restart
        // with a shorter list must not take models away unasked): removing
        // one takes both steps.
        let how = if verb == "removed" {
            format!(
                "delete it from the file, restart the server, then run `llmgw ctl model remove {name}`"
            )
        } else {
            "edit the file and restart the server instead".to_owned()
        };
        let why = format!(
            "model {name} is defined in the leader's configuration file, which wins whenever a server takes office: it cannot be {verb} with ctl; {how}"
        );
        let rejection = llmgw_domain::Rejection::conflict(why.clone());
        cp.record_refused(origin, &command(), &rejection).await;
        return Err(AdminError(StatusCode::CONFLICT, why));
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
struct NameQuery {
    name: String,
}

async fn remove_model(
    State(cp): State<Arc<ControlPlane>>,
    headers: axum::http::HeaderMap,
    Query(q): Query<NameQuery>,
) -> Result<api::Changed> {
    let origin = crate::tenancy_api::origin(&headers);
    from_config_file(&cp, &origin, &q.name, "removed", || {
        Command::Catalog(CatalogCommand::RemoveModel {
            name: q.name.clone(),
        })
    })
    .await?;
    let done = format!("model {} removed; its replicas stop", q.name);
    change(
        &cp,
        &origin,
        vec![Command::Catalog(CatalogCommand::RemoveModel {
            name: q.name,
        })],
        &done,
    )
    .await
}

/// Per node, the cached weights no model in the catalog names any more.
fn unwanted(cp: &ControlPlane) -> std::collections::BTreeMap<NodeId, Vec<String>> {
    let views = cp.views.read().unwrap_or_else(|p| p.into_inner());
    let c = &views.cluster;
    c.nodes
        .nodes
        .values()
        .map(|n| {
            (
                n.id.clone(),
                llmgw_domain::placement::unwanted_cached(&n.inventory.weights, &c.catalog),
            )
        })
        .filter(|(_, w)| !w.is_empty())
        .collect()
}

async fn weights(
    State(cp): State<Arc<ControlPlane>>,
) -> Result<std::collections::BTreeMap<NodeId, Vec<String>>> {
    Ok(Json(unwanted(&cp)))
}

/// Asks each node to remove its unwanted cached weights; the agent checks
/// every path again and deletes only files its cache generated.
async fn collect_weights(
    State(cp): State<Arc<ControlPlane>>,
) -> Result<std::collections::BTreeMap<NodeId, Vec<String>>> {
    cp.leader_token().await?;
    let mut asked = std::collections::BTreeMap::new();
    for (node, paths) in unwanted(&cp) {
        let sent = cp.agents.send(
            &node,
            llmgw_api::v1::control_message::Msg::RemoveWeights(llmgw_api::v1::RemoveWeights {
                paths: paths.clone(),
            }),
        );
        if sent {
            asked.insert(node, paths);
        }
    }
    Ok(Json(asked))
}

#[derive(Debug, Deserialize)]
struct LogsQuery {
    node: NodeId,
    #[serde(default)]
    source: String,
    #[serde(default)]
    lines: i32,
}

async fn logs(
    State(cp): State<Arc<ControlPlane>>,
    Query(q): Query<LogsQuery>,
) -> Result<api::Logs> {
    let reply = cp.node_logs(&q.node, &q.source, q.lines).await?;
    if !reply.error.is_empty() {
        return Err(AdminError(StatusCode::NOT_FOUND, reply.error));
    }
    Ok(Json(api::Logs {
        node: q.node.into_string(),
        source: q.source,
        lines: reply.lines,
        sources: reply.sources,
    }))
}

async fn leader_info(cp: &ControlPlane) -> std::result::Result<api::Leader, AdminError> {
    let info = cp.store.lease_info().await.map_err(ControlError::from)?;
    Ok(api::Leader {
        instance: cp.config.instance.clone(),
        is_leader: cp.is_leader(),
        holder: info.holder,
        epoch: info.epoch,
        held: info.held,
        expires_at: info.expires_at.map(|t| t.to_rfc3339()),
    })
}

/// The engine builds the fleet is asked to install: the leader's file's
/// (a standby sends this read on to the leader).
async fn engines(State(cp): State<Arc<ControlPlane>>) -> Result<Vec<api::EngineRow>> {
    Ok(Json(
        cp.config
            .engines
            .iter()
            .map(|w| api::EngineRow {
                engine: w.engine.clone(),
                version: w.version.clone(),
                source: w.source.clone(),
                manifest: w.manifest.clone(),
            })
            .collect(),
    ))
}

async fn leader(State(cp): State<Arc<ControlPlane>>) -> Result<api::Leader> {
    Ok(Json(leader_info(&cp).await?))
}

/// How long `status` waits on the store before it answers from memory: an
/// unreachable store held it for the pool's timeout, then failed it.
const STATUS_STORE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The lease and the log's head, or, when the store does not answer, the
/// lease as this server holds it, no head, and why.
async fn status_from_store(cp: &ControlPlane) -> (api::Leader, Option<u64>, Option<String>) {
    let read = async {
        let leader = leader_info(cp).await.map_err(|e| e.1)?;
        let head = cp.store.head().await.map_err(|e| e.to_string())?.0;
        Ok::<_, String>((leader, head))
    };
    let why = match tokio::time::timeout(STATUS_STORE_WAIT, read).await {
        Ok(Ok((leader, head))) => return (leader, Some(head), None),
        Ok(Err(why)) => why,
        Err(_) => format!("no answer within {} s", STATUS_STORE_WAIT.as_secs()),
    };
    let token = cp.leadership().borrow().clone();
    let leader = api::Leader {
        instance: cp.config.instance.clone(),
        is_leader: token.is_some(),
        holder: token.as_ref().map(|t| t.holder.clone()),
        epoch: token.as_ref().map_or(0, |t| t.epoch),
        held: token.is_some(),
        expires_at: None,
    };
    (leader, None, Some(why))
}

async fn status(State(cp): State<Arc<ControlPlane>>) -> Result<api::Status> {
    // The status is wanted most in an incident: a store that cannot be
    // read leaves the views this server holds, said as such.
    let (leader, head, store_error) = status_from_store(&cp).await;
    let rt = {
        let mut rt = cp.memory().rt.clone();
        rt.now = cp.now();
        rt
    };
    let settings = cp.settings();
    let views = cp.views.read().unwrap_or_else(|p| p.into_inner());
    let c = &views.cluster;
    let live = || c.replicas.replicas.values().filter(|r| r.is_live());
    let mut live_of: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    for r in live() {
        *live_of.entry(r.placement.model.as_str()).or_default() += 1;
    }
    // What the asks for on-demand models and load want is the leader's
    // alone (in its memory): a standby counts a running on-demand replica
    // as wanted, as the leader does while it is asked for, rather than
    // answer that fewer are wanted than run.
    let standing_by = !cp.is_leader();
    let (mut wanted, mut waiting, mut backing_off) = (0u32, 0u32, 0u32);
    for m in c.catalog.models.values() {
        let live = live_of.get(m.name.as_str()).copied().unwrap_or(0);
        let mut desired = llmgw_domain::reconcile::desired(m, &rt, &settings);
        if standing_by && m.on_demand() {
            desired = desired.max(live.min(m.scaling.max));
        }
        wanted += desired;
        // Held back after failures, it has a place: it waits for its time.
        match cp.next_try_s(&m.name) {
            Some(_) => backing_off += desired.saturating_sub(live),
            None => waiting += desired.saturating_sub(live),
        }
    }
    let answers = |r: &llmgw_domain::replicas::Replica| answers(&c.nodes, r);
    let ready = || live().filter(|r| r.status == ReplicaStatus::Ready);
    let ready_models: BTreeSet<&str> = ready()
        .filter(|r| answers(r))
        .map(|r| r.placement.model.as_str())
        .collect();
    let routed_models: BTreeSet<&str> = ready()
        .filter(|r| !answers(r))
        .map(|r| r.placement.model.as_str())
        .filter(|m| !ready_models.contains(m))
        .collect();
    Ok(Json(api::Status {
        leader,
        models: c.catalog.models.len(),
        models_ready: ready_models.len(),
        models_unreachable: routed_models.len(),
        nodes: c.nodes.nodes.len(),
        nodes_ready: c
            .nodes
            .nodes
            .values()
            .filter(|n| n.reachability == Reachability::Ready)
            .count(),
        replicas: live().count(),
        replicas_ready: ready().filter(|r| answers(r)).count(),
        replicas_unreachable: ready().filter(|r| !answers(r)).count(),
        replicas_wanted: wanted as usize,
        replicas_waiting: Some(waiting as usize),
        replicas_backing_off: backing_off as usize,
        nodes_cordoned: (c.nodes.nodes.values())
            .filter(|n| n.cordoned && !n.draining)
            .count(),
        nodes_draining: c.nodes.nodes.values().filter(|n| n.draining).count(),
        log_head: head,
        views_at: views.checkpoint.position,
        store_error,
    }))
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;

    /// The API crate keeps its own copy of the characters a name may not
    /// hold (it has no domain): the same as the domain's, every one.
    #[test]
    fn an_operator_name_refuses_the_characters_names_refuse() {
        for c in (0..=0x10FFFF).filter_map(char::from_u32) {
            let refused = api::actor_refusal(&format!("a{c}b")).is_some();
            assert_eq!(
                refused,
                llmgw_domain::tenancy::hidden_char(c),
                "U+{:04X}",
                u32::from(c)
            );
        }
    }

    #[test]
    fn a_header_that_cannot_be_recorded_is_refused() {
        let with = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(api::ACTOR_HEADER, HeaderValue::from_str(value).unwrap());
            actor_refusal(&h)
        };
        assert_eq!(actor_refusal(&HeaderMap::new()), None);
        assert_eq!(with(&api::actor_to_header("jürgen")), None);
        let forged = with(&api::actor_to_header("bob\nKeyRevoked alice")).unwrap();
        assert!(forged.contains("U+000A"), "{forged}");
        let mut raw = HeaderMap::new();
        raw.insert(
            api::ACTOR_HEADER,
            HeaderValue::from_bytes(b"bob\xff").unwrap(),
        );
        assert!(actor_refusal(&raw).is_some());
    }

    /// Only the newest replica's own failure is said: a replica that
    /// served since (and stopped, as an idle on-demand one does) ends it.
    #[test]
    fn the_last_failure_is_the_newest_replicas_own() {
        use llmgw_domain::replicas::{
            Placement, ReplicaEvent, Replicas, ShardPlacement, ShardState,
        };
        let mut replicas = Replicas::default();
        let place = |replicas: &mut Replicas, id: &str| {
            replicas.evolve(&ReplicaEvent::ReplicaPlaced(Placement {
                replica_id: id.into(),
                model: "m".into(),
                profile: "sim".into(),
                profile_fp: String::new(),
                pool: "cpu".into(),
                fabric: None,
                shards: vec![ShardPlacement {
                    shard_id: format!("{id}-0").into(),
                    rank: 0,
                    node_id: "n1".into(),
                    gpu_indices: vec![],
                    hcas: vec![],
                    port: 20000,
                    memory_mb: 0,
                }],
                why: String::new(),
            }));
        };
        place(&mut replicas, "r1");
        replicas.evolve(&ReplicaEvent::ShardStateChanged {
            replica_id: "r1".into(),
            shard_id: "r1-0".into(),
            state: ShardState::Failed,
            error: Some("port 20000 is not free on this node".into()),
            exit_code: None,
            log_tail: None,
        });
        assert_eq!(
            last_failure(replicas.replicas.values()).as_deref(),
            Some("on n1: port 20000 is not free on this node")
        );
        place(&mut replicas, "r2");
        assert_eq!(last_failure(replicas.replicas.values()), None);
    }

    /// The pages say their caller is a person; an operator may say
    /// operator; nothing else is recorded as a kind.
    #[test]
    fn an_actor_kind_is_operator_or_person() {
        let kind = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(api::ACTOR_HEADER, HeaderValue::from_static("u-1"));
            h.insert(
                api::ACTOR_KIND_HEADER,
                HeaderValue::from_str(value).unwrap(),
            );
            (actor_refusal(&h), crate::tenancy_api::origin(&h).actor)
        };
        use llmgw_decider::Actor;
        assert_eq!(kind("person"), (None, Actor::Person("u-1".into())));
        assert_eq!(kind("operator"), (None, Actor::Operator("u-1".into())));
        let (refused, _) = kind("leader");
        assert!(refused.unwrap().contains("operator or person"));
    }
}
