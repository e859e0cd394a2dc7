//! The control plane's timings and ranges. Defaults are the documented ones;
//! tests shrink them.

use std::time::Duration;

use llmgw_domain::catalog::Model;

#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// This server's name in the lease and in events' metadata.
    pub instance: String,
    /// How long the append lease lasts without a renewal.
    pub lease_ttl: Duration,
    /// How often a standby tries to take the lease.
    pub lease_poll: Duration,
    /// A reconciler pass at least this often (new events wake it sooner).
    pub interval: Duration,
    /// No heartbeat for this long: no new placement on the node.
    pub unreachable_after: Duration,
    /// No heartbeat for this long: the node's work is rebuilt elsewhere.
    pub lost_after: Duration,
    pub base_backoff: Duration,
    pub max_backoff: Duration,
    pub drain_grace: Duration,
    /// A replica younger than this is never evicted to make room for an
    /// on-demand model.
    pub min_lifetime: Duration,
    /// Nor one whose model was asked for less than this long ago.
    pub evict_idle: Duration,
    /// Engine ports, inclusive.
    pub port_range: (u16, u16),
    /// The interface engines bootstrap NCCL over.
    pub mgmt_interface: String,
    /// Models from the configuration file: they win over the store.
    pub models: Vec<Model>,
    /// The admin address standbys forward commands to while this server
    /// leads (default: `http://` and the admin listener's address).
    pub advertise_admin: Option<String>,
    /// The admin API's token (`admin_token`), which this server sends with
    /// a command it forwards to the leader's admin API.
    pub admin_token: Option<AdminSecret>,
    /// The agent address standbys name to agents while this server leads
    /// (default: the agent listener's address, the host's name when it
    /// listens on every interface).
    pub advertise_agent: Option<String>,
    /// How long a new agent stream may take to send its Register before
    /// it is refused (a stream that never says who it is would otherwise
    /// hold a task and a connection for ever).
    pub register_within: Duration,
    /// Periodic anchors of the chain head, and their sinks.
    pub anchors: crate::anchor::AnchorConfig,
    /// The fleet's mirror (its byte path): agents fetch `mirror:` sources
    /// from it.
    pub mirror_url: Option<String>,
    /// The engines every node should install (`engines:`), sent to each
    /// agent when its stream opens. Configuration, not events: what the
    /// agents report of them is observed state.
    pub engines: Vec<llmgw_api::v1::EngineWant>,
}

impl ControlConfig {
    /// The timings as the log records them when this server takes office.
    pub fn settings(&self) -> llmgw_domain::event::ControlSettings {
        let ms = |d: Duration| d.as_millis() as u64;
        llmgw_domain::event::ControlSettings {
            lease_ttl_ms: ms(self.lease_ttl),
            reconcile_interval_ms: ms(self.interval),
            unreachable_after_ms: ms(self.unreachable_after),
            lost_after_ms: ms(self.lost_after),
            base_backoff_ms: ms(self.base_backoff),
            max_backoff_ms: ms(self.max_backoff),
            drain_grace_ms: ms(self.drain_grace),
            anchor_every_events: self.anchors.every_events,
            anchor_every_ms: self.anchors.every.map(ms),
            // Addresses without the credentials one may carry: the log
            // keeps them for good, and exports and `events tail` show it.
            engines: self
                .engines
                .iter()
                .map(|e| {
                    let source = if e.source.is_empty() {
                        "github".to_owned()
                    } else {
                        without_credentials(&e.source)
                    };
                    format!("{}@{} ({source})", e.engine, e.version)
                })
                .collect(),
            mirror_url: self.mirror_url.as_deref().map(without_credentials),
        }
    }
}

/// `scheme://user:password@host/…` as `scheme://host/…`; other text as is.
fn without_credentials(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            instance: format!("llmgw-{}", std::process::id()),
            advertise_admin: None,
            admin_token: None,
            advertise_agent: None,
            lease_ttl: Duration::from_secs(10),
            lease_poll: Duration::from_millis(500),
            interval: Duration::from_secs(5),
            unreachable_after: Duration::from_secs(15),
            lost_after: Duration::from_secs(60),
            base_backoff: Duration::from_secs(10),
            max_backoff: Duration::from_secs(600),
            drain_grace: Duration::from_secs(30),
            min_lifetime: Duration::from_secs(300),
            evict_idle: Duration::from_secs(60),
            port_range: (20000, 20999),
            mgmt_interface: "eth0".into(),
            models: Vec::new(),
            register_within: Duration::from_secs(30),
            anchors: crate::anchor::AnchorConfig::default(),
            mirror_url: None,
            engines: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_address_is_recorded_without_its_credentials() {
        let cut = super::without_credentials;
        assert_eq!(cut("http://u:p@mirror:8090/x"), "http://mirror:8090/x");
        assert_eq!(cut("https://mirror/a@b"), "https://mirror/a@b");
        assert_eq!(cut("github"), "github");
    }
}

/// A token kept out of what is printed: `{:?}` of a configuration shows
/// that one is set, never what it is.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminSecret(pub String);

impl std::fmt::Debug for AdminSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminSecret(…)")
    }
}
