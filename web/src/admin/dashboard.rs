//! `/admin`: the cluster and who uses it.

use llmgw_eventstore::EventStore;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::Method;
use axum::response::Response;
use serde::Deserialize;

use super::cluster::{self, ModelRow, NodeRow, ReplicaRow, Why};
use super::groups::{self, GroupLine};
use super::spend::{self, UsageRow};
use super::{Pager, page_number, reader};
use crate::{Chrome, Viewer, Web, WebError, admin_api, render};

/// Rows a usage table shows at once.
const PER_PAGE: usize = 50;
/// Groups the dashboard lists; `llmgw keys groups` lists them all.
const MAX_GROUPS: usize = 200;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct DashboardQuery {
    /// The keys table's page.
    page: Option<String>,
    /// The people table's page.
    people: Option<String>,
}

#[derive(askama::Template)]
#[template(path = "admin/dashboard.html")]
struct Dashboard {
    chrome: Chrome,
    position: u64,
    /// No control plane here: the static endpoints are what serves.
    router_only: bool,
    /// The control plane that leads this store from another server, if
    /// one does: then the cluster below is live (else it is as one last
    /// left it).
    led_by: String,
    endpoints: Vec<EndpointRow>,
    nodes: Vec<NodeRow>,
    replicas: Vec<ReplicaRow>,
    models: Vec<ModelRow>,
    why: Vec<Why>,
    keys: Vec<UsageRow>,
    keys_pager: Pager,
    people: Vec<UsageRow>,
    people_pager: Pager,
    model_usage: Vec<UsageRow>,
    groups: Vec<GroupLine>,
    /// There are groups beyond those shown.
    groups_more: bool,
    /// Why the groups could not be read, when they could not.
    groups_error: String,
}

/// A static endpoint, as a router-only server routes to it.
struct EndpointRow {
    id: String,
    url: String,
    models: String,
    /// What [`endpoint_state`] makes of it.
    state: &'static str,
    in_flight: u32,
}

fn endpoints(web: &Web) -> Vec<EndpointRow> {
    let max_age = web.gateway.endpoints.max_age();
    web.gateway
        .endpoints
        .snapshot()
        .iter()
        .map(|e| EndpointRow {
            id: e.spec.id.clone(),
            url: e.spec.url.clone(),
            models: e.spec.models.join(", "),
            state: endpoint_state(e, max_age),
            in_flight: e.in_flight(),
        })
        .collect()
}

/// An endpoint's state as `/metrics` reads it, in a word. The breaker
/// alone said `serving` for a dead engine between its cool-downs, while
/// `llmgw_endpoint_breaker_open` and `llmgw_endpoint_metrics_stale` both
/// said 1: `down` when nothing answers at its address, `open` while the
/// breaker counts as tripped (what the metric shows), `stale` while its
/// figures are too old to route by (it is routed around).
fn endpoint_state(e: &llmgw_gateway::Endpoint, max_age: std::time::Duration) -> &'static str {
    if e.silent(max_age) {
        "down"
    } else if e.breaker_tripped(max_age) {
        "open"
    } else if e.stale(max_age) {
        "stale"
    } else {
        "serving"
    }
}

pub(crate) async fn page(
    State(web): State<Arc<Web>>,
    viewer: Viewer,
    Query(q): Query<DashboardQuery>,
) -> Result<Response, WebError> {
    // Last heartbeats live in the leader's memory, not in the log; where
    // the admin API cannot say (a standby, no control plane), the page
    // shows a dash rather than failing.
    let api_nodes = admin_api::call::<Vec<llmgw_api::admin::NodeRow>>(
        &web,
        Method::GET,
        "/api/v1/nodes",
        reader(&viewer),
        None::<&()>,
    )
    .await
    .unwrap_or_default();
    // Without keys or usage the admin API has no tenancy routes (404): no
    // groups. Any other failure is shown, not taken for "none".
    // One more than shown says whether there are more, without building
    // (and sending through the API) every group of a large tree.
    let (groups, groups_more, groups_error) =
        match admin_api::call::<Vec<llmgw_api::admin::GroupRow>>(
            &web,
            Method::GET,
            &format!("/api/v1/groups?limit={}", MAX_GROUPS + 1),
            reader(&viewer),
            None::<&()>,
        )
        .await
        {
            Ok(mut rows) => {
                let more = rows.len() > MAX_GROUPS;
                rows.truncate(MAX_GROUPS);
                (groups::lines(rows), more, String::new())
            }
            Err(WebError::NotFound) => (Vec::new(), false, String::new()),
            Err(e) => {
                tracing::warn!(error = %e, "the dashboard could not read the groups");
                (Vec::new(), false, e.to_string())
            }
        };
    let (key_page, people_page) = (
        page_number(q.page.as_deref()),
        page_number(q.people.as_deref()),
    );
    let led_by = match (&web.store, web.settings.router_only) {
        (Some(store), true) => store
            .lease_info()
            .await
            .ok()
            .filter(|l| l.held)
            .and_then(|l| l.holder)
            .unwrap_or_default(),
        _ => String::new(),
    };
    let mut page = {
        let views = web.views();
        let c = &views.cluster;
        let (keys, keys_pager) = spend::keys(&views, PER_PAGE, key_page, |n| {
            format!("/admin?page={n}&people={people_page}#keys")
        });
        let (people, people_pager) = spend::people(&views, PER_PAGE, people_page, |n| {
            format!("/admin?page={key_page}&people={n}#people")
        });
        Dashboard {
            chrome: Chrome::for_viewer(&web, &viewer),
            position: views.checkpoint.position,
            router_only: web.settings.router_only,
            led_by,
            endpoints: if web.settings.router_only {
                endpoints(&web)
            } else {
                Vec::new()
            },
            nodes: cluster::nodes(c, &api_nodes),
            replicas: cluster::replicas(c),
            models: cluster::models(c),
            why: cluster::explanations(c, web.settings.place),
            keys,
            keys_pager,
            people,
            people_pager,
            model_usage: spend::models(&views),
            groups,
            groups_more,
            groups_error,
        }
    };
    name_people(&web, &mut page.people).await;
    render(&page)
}

/// Each row's person by name (or email), as `/admin/usage` shows them: ids
/// alone told an admin nothing. Names live in the people tables, outside
/// the log, so only the page's rows are looked up. Without them (no
/// accounts here, a read that fails) the ids stay, and the page still
/// shows.
async fn name_people(web: &Web, rows: &mut [UsageRow]) {
    let Some(people) = &web.people else {
        return;
    };
    for row in rows {
        match people.person(&row.id).await {
            Ok(Some(p)) => row.name = if p.name.is_empty() { p.email } else { p.name },
            // Erased: nothing left to name them by.
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "the dashboard could not read people's names");
                return;
            }
        }
    }
}
