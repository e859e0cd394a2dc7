//! Names to canonical models and their fallbacks: from configuration in
//! router-only mode, from the router view with the control plane. An update
//! from the view replaces the endpoint set but keeps the live state
//! (in-flight counts, breakers) of endpoints that survive it.

use std::collections::HashMap;
use std::sync::RwLock;

use llmgw_domain::catalog::Engine;
use llmgw_projections::RouterView;

use crate::scrape::EngineKind;
use crate::{EndpointSpec, Gateway};

#[derive(Debug, Default, Clone)]
pub(crate) struct Routes {
    /// Alias → canonical model.
    aliases: HashMap<String, String>,
    /// Canonical model → fallbacks, canonical too.
    fallbacks: HashMap<String, Vec<String>>,
    /// Models in the catalog (with the control plane): known even while
    /// nothing serves them, so a request gets 503 or waits, never 404.
    catalog: std::collections::HashSet<String>,
    /// Catalogued models started by requests.
    on_demand: std::collections::HashSet<String>,
}

#[derive(Debug, Default)]
pub(crate) struct RouteTable(RwLock<Routes>);

impl RouteTable {
    pub(crate) fn new(fallbacks: HashMap<String, Vec<String>>) -> Self {
        RouteTable(RwLock::new(Routes {
            aliases: HashMap::new(),
            fallbacks,
            ..Routes::default()
        }))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Routes> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The canonical model a name asks for (itself if not an alias).
    pub(crate) fn canonical(&self, name: &str) -> String {
        self.read()
            .aliases
            .get(name)
            .cloned()
            .unwrap_or_else(|| name.to_owned())
    }

    pub(crate) fn catalogued(&self, model: &str) -> bool {
        self.read().catalog.contains(model)
    }

    pub(crate) fn on_demand(&self, model: &str) -> bool {
        self.read().on_demand.contains(model)
    }

    pub(crate) fn fallbacks(&self, model: &str) -> Vec<String> {
        self.read()
            .fallbacks
            .get(model)
            .cloned()
            .unwrap_or_default()
    }
}

fn engine_kind(e: Engine) -> EngineKind {
    match e {
        Engine::Vllm => EngineKind::Vllm,
        Engine::Sglang => EngineKind::Sglang,
        Engine::Llamacpp => EngineKind::Llamacpp,
        Engine::Sim => EngineKind::Sim,
    }
}

impl Gateway {
    /// Routes by the control plane's router view: its ready endpoints,
    /// aliases and fallbacks.
    pub fn apply_router_view(&self, view: &RouterView) {
        let specs = view
            .endpoints
            .values()
            .map(|e| EndpointSpec {
                id: e.replica_id.clone(),
                url: e.url.clone(),
                models: vec![e.model.clone()],
                pool: e.pool.clone(),
                weight: e.weight.max(1),
                priority: e.priority,
                engine: engine_kind(e.engine),
            })
            .collect();
        self.endpoints.update(specs);
        let aliases: HashMap<String, String> = view.aliases.clone().into_iter().collect();
        let canonical = |n: &String| aliases.get(n).cloned().unwrap_or_else(|| n.clone());
        let fallbacks = view
            .models
            .values()
            .filter(|m| !m.fallbacks.is_empty())
            .map(|m| (m.name.clone(), m.fallbacks.iter().map(canonical).collect()))
            .collect();
        let catalog = view.models.keys().cloned().collect();
        let on_demand = view
            .models
            .values()
            .filter(|m| m.on_demand)
            .map(|m| m.name.clone())
            .collect();
        *self.routes.0.write().unwrap_or_else(|p| p.into_inner()) = Routes {
            aliases,
            fallbacks,
            catalog,
            on_demand,
        };
        self.routes_changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use llmgw_domain::Event;
    use llmgw_domain::catalog::{CatalogEvent, Model};
    use llmgw_projections::{Stamp, View};

    use super::*;

    #[test]
    fn fallbacks_from_the_view_are_canonical_names() {
        let mut view = RouterView::default();
        let mut small = Model::named("small");
        small.aliases = vec!["small-latest".into()];
        let mut big = Model::named("big");
        big.fallbacks = vec!["small-latest".into()];
        for model in [small, big] {
            view.apply_event(
                Stamp {
                    position: 0,
                    recorded_at_ms: 0,
                },
                &Event::Catalog(CatalogEvent::ModelAdded { model }),
            );
        }
        let gw = Gateway::new(crate::GatewayConfig::default(), None).unwrap();
        gw.apply_router_view(&view);
        assert_eq!(gw.routes.fallbacks("big"), vec!["small".to_string()]);
        assert_eq!(gw.routes.canonical("small-latest"), "small");
        assert_eq!(gw.routes.canonical("big"), "big");
    }
}
