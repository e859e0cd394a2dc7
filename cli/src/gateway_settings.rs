//! The gateway's settings from the `router:` and `admission:` sections,
//! checked whole: a value out of range is refused with the key that holds
//! it, before anything binds.

use llmgw_gateway::GatewayConfig;

use crate::config::{AdmissionSection, ConfigError, ConnectionsSection, RouterSection, duration};

fn ratio(key: &str, v: f64) -> Result<f64, ConfigError> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(ConfigError(format!("{key}: {v} must be from 0 to 1")))
    }
}

fn positive(key: &str, v: f64) -> Result<f64, ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(ConfigError(format!("{key}: {v} must be above 0")))
    }
}

fn nonzero(key: &str, v: usize) -> Result<usize, ConfigError> {
    if v == 0 {
        Err(ConfigError(format!("{key} must be at least 1")))
    } else {
        Ok(v)
    }
}

fn interval(key: &str, v: &str) -> Result<std::time::Duration, ConfigError> {
    let d = duration(key, v)?;
    if d.is_zero() {
        return Err(ConfigError(format!("{key} must be above 0")));
    }
    Ok(d)
}

/// An origin as browsers send it: `scheme://host[:port]`, no path, no
/// trailing slash (a browser's `Origin` never has one, so such an entry
/// would match nothing); or `*`.
fn cors_origin(o: &str) -> Result<(), &'static str> {
    if o == "*" {
        return Ok(());
    }
    let Some((scheme, rest)) = o.split_once("://") else {
        return Err("is not an origin: give scheme://host[:port], e.g. https://app.example.com");
    };
    if !matches!(scheme, "http" | "https") {
        return Err("is not an http or https origin");
    }
    if rest.is_empty() || rest.contains(['/', '?', '#', ' ']) {
        return Err(
            "has a path or nothing after the scheme: an origin is scheme://host[:port] alone",
        );
    }
    Ok(())
}

/// Defaults, then whatever the sections set.
pub(crate) fn gateway_config(
    router: &RouterSection,
    admission: &AdmissionSection,
) -> Result<GatewayConfig, ConfigError> {
    let mut g = GatewayConfig::default();
    if let Some(n) = router.retries {
        g.retries = n;
    }
    if let Some(n) = router.migration_limit {
        g.migration_limit = n;
    }
    if let Some(h) = &router.session_header {
        let valid = !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid {
            return Err(ConfigError(format!(
                "router.session_header: {h:?} is not a header name"
            )));
        }
        g.session_header = h.to_ascii_lowercase();
    }
    if let Some(origins) = &router.cors_origins {
        for o in origins {
            cors_origin(o)
                .map_err(|why| ConfigError(format!("router.cors_origins: {o:?} {why}")))?;
        }
        if origins.len() > 1 && origins.iter().any(|o| o == "*") {
            return Err(ConfigError(
                "router.cors_origins: `*` allows every origin; give it alone or list origins"
                    .into(),
            ));
        }
        g.cors_origins = origins.clone();
    }
    if let Some(n) = router.body_limit {
        g.body_limit = nonzero("router.body_limit", n)?;
    }
    if let Some(v) = &router.scrape_interval {
        g.scrape_interval = interval("router.scrape_interval", v)?;
    }
    if let Some(v) = &router.connect_timeout {
        g.connect_timeout = interval("router.connect_timeout", v)?;
    }
    if let Some(v) = &router.response_timeout {
        g.response_timeout = interval("router.response_timeout", v)?;
    }
    if let Some(v) = &router.stream_idle_timeout {
        g.stream_idle_timeout = interval("router.stream_idle_timeout", v)?;
    }
    if let Some(v) = &router.on_demand_wait {
        g.on_demand_wait = duration("router.on_demand_wait", v)?;
    }
    if let Some(b) = &router.breaker {
        if let Some(n) = b.threshold {
            g.breaker.threshold = nonzero("router.breaker.threshold", n as usize)? as u32;
        }
        if let Some(v) = &b.cool_down {
            g.breaker.cool_down = interval("router.breaker.cool_down", v)?;
        }
    }
    if let Some(p) = &router.prefix
        && p.enabled == Some(false)
    {
        // With prefix routing off the least loaded endpoint is taken and
        // nothing else is read: its settings would do nothing.
        let set = [
            (p.min_match.is_some(), "router.prefix.min_match"),
            (p.match_ratio.is_some(), "router.prefix.match_ratio"),
            (p.balance_abs.is_some(), "router.prefix.balance_abs"),
            (p.balance_rel.is_some(), "router.prefix.balance_rel"),
            (p.ttl.is_some(), "router.prefix.ttl"),
            (p.max_nodes.is_some(), "router.prefix.max_nodes"),
            (router.session_header.is_some(), "router.session_header"),
        ];
        if let Some((_, what)) = set.iter().find(|(s, _)| *s) {
            return Err(ConfigError(format!(
                "{what} applies only with prefix routing on, which router.prefix.enabled: false turns off: remove one"
            )));
        }
    }
    if let Some(p) = &router.prefix {
        let a = &mut g.affinity;
        if let Some(on) = p.enabled {
            a.enabled = on;
        }
        if let Some(n) = p.min_match {
            // Prompts are matched in whole blocks: less than one block
            // would read as one block, silently.
            let block = llmgw_gateway::affinity::AffinityConfig::default().block_bytes;
            if n < block {
                return Err(ConfigError(format!(
                    "router.prefix.min_match: {n} is below {block}: prompts are matched in whole blocks of {block} bytes, so give at least {block}"
                )));
            }
            a.min_match = n;
        }
        if let Some(r) = p.match_ratio {
            a.match_ratio = ratio("router.prefix.match_ratio", r)?;
        }
        if let Some(v) = p.balance_abs {
            a.balance_abs = positive("router.prefix.balance_abs", v)?;
        }
        if let Some(v) = p.balance_rel {
            // At 1 or below it never decides: balance_abs already asks
            // that the preferred endpoint hold more than the least loaded.
            if !(v.is_finite() && v > 1.0) {
                return Err(ConfigError(format!(
                    "router.prefix.balance_rel: {v} must be above 1 (the preferred endpoint's load as a multiple of the least loaded's, beyond which affinity gives way)"
                )));
            }
            a.balance_rel = v;
        }
        if let Some(v) = &p.ttl {
            a.ttl = interval("router.prefix.ttl", v)?;
        }
        if let Some(n) = p.max_nodes {
            a.max_entries = nonzero("router.prefix.max_nodes", n)?;
        }
    }
    let ad = &mut g.admission;
    if let Some(on) = admission.enabled {
        ad.enabled = on;
    }
    // Off, nothing is held: the ceilings still say when a pool is full
    // (pool_saturation), but the holding bounds would do nothing.
    if !ad.enabled {
        let set = [
            (admission.max_wait.is_some(), "admission.max_wait"),
            (admission.max_waiting.is_some(), "admission.max_waiting"),
        ];
        if let Some((_, what)) = set.iter().find(|(s, _)| *s) {
            return Err(ConfigError(format!(
                "{what} applies only with admission on, which admission.enabled: false turns off: remove one"
            )));
        }
    }
    if let Some(b) = &admission.default_band {
        ad.default_band = llmgw_domain::tenancy::Band::parse(b).ok_or_else(|| {
            ConfigError(format!(
                "admission.default_band: {b:?} is not bronze, silver, gold or platinum"
            ))
        })?;
    }
    if let Some(v) = admission.kv_ceiling {
        // 0 made any KV use count as full: every engine, always.
        if v == 0.0 {
            return Err(ConfigError(
                "admission.kv_ceiling: 0 would count every engine as full at its first token; give the occupancy (above 0, at most 1) at which an engine is full".into(),
            ));
        }
        ad.kv_ceiling = ratio("admission.kv_ceiling", v)?;
    }
    if let Some(v) = admission.waiting_ceiling {
        ad.waiting_ceiling = positive("admission.waiting_ceiling", v)?;
    }
    if let Some(v) = &admission.max_wait {
        ad.max_wait = duration("admission.max_wait", v)?;
    }
    if let Some(n) = admission.max_waiting {
        ad.max_waiting = nonzero("admission.max_waiting", n)?;
    }
    Ok(g)
}

/// The `connections.max.*` keys the section sets.
pub(crate) fn caps_set(c: &ConnectionsSection) -> Vec<&'static str> {
    let Some(m) = &c.max else { return Vec::new() };
    [
        (m.client, "connections.max.client"),
        (m.admin, "connections.max.admin"),
        (m.metrics, "connections.max.metrics"),
        (m.agent, "connections.max.agent"),
    ]
    .into_iter()
    .filter_map(|(v, key)| v.map(|_| key))
    .collect()
}

/// The listeners' caps and timeouts: defaults, then the section.
pub(crate) fn connection_limits(
    c: &ConnectionsSection,
) -> Result<llmgw_gateway::ConnectionLimits, ConfigError> {
    let mut l = llmgw_gateway::ConnectionLimits::default();
    if let Some(v) = &c.idle_timeout {
        l.idle_timeout = interval("connections.idle_timeout", v)?;
    }
    if let Some(v) = &c.body_timeout {
        l.body_timeout = interval("connections.body_timeout", v)?;
    }
    if let Some(m) = &c.max {
        for (v, key, at) in [
            (m.client, "connections.max.client", &mut l.max_client),
            (m.admin, "connections.max.admin", &mut l.max_admin),
            (m.metrics, "connections.max.metrics", &mut l.max_metrics),
            (m.agent, "connections.max.agent", &mut l.max_agent),
        ] {
            if let Some(n) = v {
                *at = nonzero(key, n)?;
            }
        }
    }
    Ok(l)
}
