//! Names to canonical models, their fallbacks, prices and descriptions:
//! from configuration in router-only mode, from the router view with the
//! control plane. The table is an immutable value, built whole from the
//! view and swapped in one step, so a request reads one consistent table
//! from start to end. An update from the view also replaces the endpoint
//! set but keeps the live state (in-flight counts, breakers) of endpoints
//! that survive it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use llmgw_domain::catalog::{Engine, Price};
use llmgw_projections::RouterView;

use crate::scrape::EngineKind;
use crate::{EndpointSpec, Gateway};

/// One routing table; never changed once built.
#[derive(Debug, Default, Clone)]
pub(crate) struct Routes {
    /// Alias → canonical model.
    aliases: HashMap<String, String>,
    /// Canonical model → fallbacks, canonical too.
    fallbacks: HashMap<String, Vec<String>>,
    /// Models in the catalog (with the control plane): known even while
    /// nothing serves them, so a request gets 503 or waits, never 404.
    catalog: HashSet<String>,
    /// Catalogued models started by requests.
    on_demand: HashSet<String>,
    /// The catalog's price of a model, where it has one.
    prices: HashMap<String, Price>,
    descriptions: HashMap<String, String>,
    /// When the catalog added each model, in seconds since the epoch.
    created: HashMap<String, i64>,
    /// The catalog's context length of a model, where it gives one.
    contexts: HashMap<String, u32>,
}

impl Routes {
    fn configured(fallbacks: HashMap<String, Vec<String>>) -> Self {
        Routes {
            fallbacks,
            ..Routes::default()
        }
    }

    /// The table the router view describes. A model's fallbacks in this
    /// server's configuration win over the catalog's: they are the more
    /// particular setting, and a setting given is never dropped.
    fn from_view(view: &RouterView, configured: &Configured) -> Self {
        // A name a configured endpoint serves is that endpoint's, even
        // where the catalog made it another model's alias: taken as the
        // alias, every request for it went to the other model (or, with
        // no replica of that, failed) while the endpoint sat unused.
        let aliases: HashMap<String, String> = view
            .aliases
            .iter()
            .filter(|(alias, _)| !configured.served.contains(*alias))
            .map(|(a, m)| (a.clone(), m.clone()))
            .collect();
        let configured = &configured.fallbacks;
        let canonical = |n: &String| aliases.get(n).cloned().unwrap_or_else(|| n.clone());
        let mut fallbacks: HashMap<String, Vec<String>> = view
            .models
            .values()
            .filter(|m| !m.fallbacks.is_empty())
            .map(|m| (m.name.clone(), m.fallbacks.iter().map(canonical).collect()))
            .collect();
        for (model, to) in configured {
            fallbacks.insert(canonical(model), to.iter().map(canonical).collect());
        }
        Routes {
            catalog: view.models.keys().cloned().collect(),
            on_demand: view
                .models
                .values()
                .filter(|m| m.on_demand)
                .map(|m| m.name.clone())
                .collect(),
            prices: view
                .models
                .values()
                .filter_map(|m| Some((m.name.clone(), m.price?)))
                .collect(),
            descriptions: view
                .models
                .values()
                .filter(|m| !m.description.is_empty())
                .map(|m| (m.name.clone(), m.description.clone()))
                .collect(),
            created: view
                .models
                .values()
                .filter(|m| m.added_ms > 0)
                .map(|m| (m.name.clone(), m.added_ms / 1000))
                .collect(),
            contexts: view
                .models
                .values()
                .filter_map(|m| Some((m.name.clone(), m.context_length?)))
                .collect(),
            fallbacks,
            aliases,
        }
    }

    /// The canonical model a name asks for (itself if not an alias).
    pub(crate) fn canonical<'a>(&'a self, name: &'a str) -> &'a str {
        self.aliases.get(name).map_or(name, String::as_str)
    }

    pub(crate) fn catalogued(&self, model: &str) -> bool {
        self.catalog.contains(model)
    }

    /// The catalog's models this server routes (with a store but no
    /// control plane, only those its endpoints serve); the on-demand ones
    /// among them.
    pub(crate) fn catalog_models(&self) -> impl Iterator<Item = &str> {
        self.catalog.iter().map(String::as_str)
    }

    pub(crate) fn on_demand(&self, model: &str) -> bool {
        self.on_demand.contains(model)
    }

    pub(crate) fn fallbacks(&self, model: &str) -> &[String] {
        self.fallbacks.get(model).map_or(&[], Vec::as_slice)
    }

    pub(crate) fn price(&self, model: &str) -> Option<Price> {
        self.prices.get(model).copied()
    }

    /// The catalog's context length of `model` (canonical), in tokens.
    pub(crate) fn context(&self, model: &str) -> Option<u32> {
        self.contexts.get(model).copied()
    }

    /// When the catalog added `model` (seconds since the epoch).
    pub(crate) fn created(&self, model: &str) -> Option<i64> {
        self.created.get(model).copied()
    }

    pub(crate) fn description(&self, model: &str) -> Option<&str> {
        self.descriptions.get(model).map(String::as_str)
    }
}

/// What this server's configuration says of names, whatever the view.
#[derive(Debug, Default)]
struct Configured {
    fallbacks: HashMap<String, Vec<String>>,
    /// The models its configured endpoints serve.
    served: HashSet<String>,
    /// The catalog's aliases last found naming one of them, so that each
    /// is said once, not at every update of the view.
    shadowed: std::sync::Mutex<Vec<String>>,
}

/// The current table, replaced whole.
#[derive(Debug, Default)]
pub(crate) struct RouteTable {
    current: RwLock<Arc<Routes>>,
    configured: Configured,
}

impl RouteTable {
    pub(crate) fn new(fallbacks: HashMap<String, Vec<String>>, served: HashSet<String>) -> Self {
        RouteTable {
            current: RwLock::new(Arc::new(Routes::configured(fallbacks.clone()))),
            configured: Configured {
                fallbacks,
                served,
                shadowed: Default::default(),
            },
        }
    }

    /// Says, once each, which of the catalog's aliases are names this
    /// server's endpoints serve (they are routed to the endpoints).
    fn say_shadowed(&self, view: &RouterView) {
        let served = &self.configured.served;
        let now: Vec<String> = (view.aliases.iter())
            .filter(|(alias, _)| served.contains(*alias))
            .map(|(alias, model)| format!("{alias} (an alias of {model})"))
            .collect();
        let mut said = (self.configured.shadowed.lock()).unwrap_or_else(|p| p.into_inner());
        if *said != now && !now.is_empty() {
            tracing::warn!(
                names = now.join(", "),
                "the catalog names as an alias a model this server's endpoints serve: requests for it go to the endpoints; rename the alias to route it to the catalog's model"
            );
        }
        *said = now;
    }

    /// The table as of now; a request keeps it for its whole way.
    pub(crate) fn load(&self) -> Arc<Routes> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn swap(&self, routes: Routes) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(routes);
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
    /// aliases, fallbacks and prices.
    pub fn apply_router_view(&self, view: &RouterView) {
        // Configured endpoints serve beside the control plane's replicas.
        let specs = self
            .config
            .endpoints
            .iter()
            .cloned()
            .chain(view.endpoints.values().map(|e| EndpointSpec {
                id: e.replica_id.to_string(),
                url: e.url.clone(),
                models: vec![e.model.clone()],
                pool: e.pool.clone(),
                weight: e.weight.max(1),
                // A profile's priority chooses where to place, not where
                // to route: every serving replica of a model shares its
                // requests by weight (a replica placed on a lower profile
                // got none while a higher one lived).
                priority: 0,
                engine: engine_kind(e.engine),
                node: view.node_of(&e.replica_id).map(ToString::to_string),
                api_key: None,
                kv_events: None,
            }))
            .collect();
        self.endpoints.update(specs);
        self.routes.say_shadowed(view);
        self.routes
            .swap(Routes::from_view(view, &self.routes.configured));
        self.routes_changed.notify_waiters();
    }

    /// Takes only the catalog from the router view (names, aliases,
    /// fallbacks, prices, descriptions) and keeps the configured endpoints:
    /// for a gateway with a store but no control plane, where nothing keeps
    /// the view's endpoints true and nothing starts a model on demand.
    pub fn apply_catalog(&self, view: &RouterView) {
        self.routes.say_shadowed(view);
        let mut routes = Routes::from_view(view, &self.routes.configured);
        routes.on_demand.clear();
        // Nothing here starts a catalog model: one no endpoint of this
        // server serves is unknown here (404, as /v1/models leaves it
        // out), not "no capacity right now" for ever.
        let served = &self.routes.configured.served;
        routes.catalog.retain(|m| served.contains(m));
        self.routes.swap(routes);
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
    fn the_view_gives_canonical_fallbacks_prices_and_descriptions() {
        let mut view = RouterView::default();
        let mut small = Model::named("small");
        small.aliases = vec!["small-latest".into()];
        small.description = "a small model".into();
        let mut big = Model::named("big");
        big.fallbacks = vec!["small-latest".into()];
        big.price = Some(Price {
            prompt_per_1k: 3,
            completion_per_1k: 4,
        });
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
        let before = gw.routes.load();
        gw.apply_router_view(&view);
        let routes = gw.routes.load();
        assert_eq!(routes.fallbacks("big"), ["small".to_string()]);
        assert_eq!(routes.canonical("small-latest"), "small");
        assert_eq!(routes.canonical("big"), "big");
        assert_eq!(routes.description("small"), Some("a small model"));
        assert_eq!(gw.price_of("big").completion_per_1k, 4);
        assert_eq!(gw.price_of("small"), Price::ZERO, "the default price");
        assert!(
            !before.catalogued("big"),
            "a table already taken is never changed"
        );
    }

    #[test]
    fn configured_fallbacks_win_over_the_catalogs_and_are_made_canonical() {
        let mut view = RouterView::default();
        let mut small = Model::named("small");
        small.aliases = vec!["small-latest".into()];
        let mut big = Model::named("big");
        big.aliases = vec!["big-latest".into()];
        big.fallbacks = vec!["small".into()];
        let mut mid = Model::named("mid");
        mid.fallbacks = vec!["small".into()];
        for model in [small, big, mid, Model::named("other")] {
            view.apply_event(
                Stamp {
                    position: 0,
                    recorded_at_ms: 0,
                },
                &Event::Catalog(CatalogEvent::ModelAdded { model }),
            );
        }
        let configured = HashMap::from([(
            "big-latest".to_string(),
            vec!["other".to_string(), "small-latest".to_string()],
        )]);
        let gw = Gateway::new(
            crate::GatewayConfig {
                fallbacks: configured,
                ..crate::GatewayConfig::default()
            },
            None,
        )
        .unwrap();
        gw.apply_router_view(&view);
        let routes = gw.routes.load();
        assert_eq!(routes.fallbacks("big"), ["other", "small"]);
        assert_eq!(routes.fallbacks("mid"), ["small"], "the catalog's stay");
    }

    /// A configured endpoint's model is its own even where the catalog
    /// makes the name another model's alias: the alias took every request
    /// for it away from the endpoint.
    #[test]
    fn a_name_a_configured_endpoint_serves_is_no_alias() {
        let mut view = RouterView::default();
        let mut b = Model::named("b");
        b.aliases = vec!["m1".into(), "b-latest".into()];
        view.apply_event(
            Stamp {
                position: 0,
                recorded_at_ms: 0,
            },
            &Event::Catalog(CatalogEvent::ModelAdded { model: b }),
        );
        let gw = Gateway::new(
            crate::GatewayConfig {
                endpoints: vec!["e1=http://127.0.0.1:9=m1".parse().unwrap()],
                ..crate::GatewayConfig::default()
            },
            None,
        )
        .unwrap();
        for apply in [Gateway::apply_router_view, Gateway::apply_catalog] {
            apply(&gw, &view);
            let routes = gw.routes.load();
            assert_eq!(routes.canonical("m1"), "m1", "the endpoint's");
            assert_eq!(routes.canonical("b-latest"), "b");
        }
    }

    /// Replicas of a model placed on profiles of different priority share
    /// its requests by weight: the priority chose where to place them.
    #[test]
    fn replicas_of_every_profile_share_a_models_requests() {
        let mut view = RouterView::default();
        for (id, priority, weight) in [("r-hi", 10, 1), ("r-lo", 0, 3)] {
            view.endpoints.insert(
                id.into(),
                llmgw_projections::Endpoint {
                    replica_id: id.into(),
                    model: "m".into(),
                    url: format!("http://{id}:8000"),
                    pool: "p".into(),
                    weight,
                    priority,
                    engine: llmgw_domain::catalog::Engine::Sim,
                    profile: id.into(),
                    profile_fp: String::new(),
                    current: true,
                },
            );
        }
        let gw = Gateway::new(crate::GatewayConfig::default(), None).unwrap();
        gw.apply_router_view(&view);
        let first = gw.endpoints.pick("m", &[]).unwrap();
        assert_eq!(
            first.endpoint().spec.id,
            "r-lo",
            "weight 3 of the lower profile's"
        );
        let second = gw.endpoints.pick("m", &["r-lo".into()]).unwrap();
        assert_eq!(second.endpoint().spec.id, "r-hi");
    }

    #[test]
    fn the_catalog_alone_keeps_the_configured_endpoints_and_starts_nothing() {
        let mut view = RouterView::default();
        let mut model = Model::named("m");
        model.profiles = vec![
            serde_json::from_value(serde_json::json!({
                "name": "p", "engine": "sim"
            }))
            .unwrap(),
        ];
        model.price = Some(Price {
            prompt_per_1k: 1,
            completion_per_1k: 1,
        });
        view.apply_event(
            Stamp {
                position: 0,
                recorded_at_ms: 0,
            },
            &Event::Catalog(CatalogEvent::ModelAdded { model }),
        );
        assert!(view.models["m"].on_demand);
        let gw = Gateway::new(
            crate::GatewayConfig {
                endpoints: vec!["a=http://127.0.0.1:1=m".parse().unwrap()],
                ..crate::GatewayConfig::default()
            },
            None,
        )
        .unwrap();
        let mut elsewhere = Model::named("elsewhere");
        elsewhere.scaling.min = 1;
        view.apply_event(
            Stamp {
                position: 1,
                recorded_at_ms: 0,
            },
            &Event::Catalog(CatalogEvent::ModelAdded { model: elsewhere }),
        );
        gw.apply_catalog(&view);
        assert_eq!(gw.endpoints.snapshot().len(), 1);
        let routes = gw.routes.load();
        assert!(routes.catalogued("m") && !routes.on_demand("m"));
        assert!(
            !routes.catalogued("elsewhere"),
            "nothing here serves or starts it"
        );
        assert_eq!(gw.price_of("m").prompt_per_1k, 1);
    }
}
