//! The server's configuration file: YAML (`server.yaml`), or TOML for a
//! `.toml` file, with `LLMGW_…` variables over it (`__` nests:
//! `LLMGW_CONTROL__LOST_AFTER=30s`). The whole file is validated, models
//! included, before anything binds; any problem is one [`ConfigError`],
//! which the binary turns into exit code 2.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use llmgw_domain::catalog::{Catalog, CatalogCommand, Model};
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ConfigError(pub(crate) String);

/// The file's shape. Unknown keys are refused, so that a typo is an error
/// rather than a silently ignored setting.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    pub metrics_listen: Option<String>,
    pub agent_listen: Option<String>,
    /// Agents on other machines may dial a listener without `tls:`.
    pub agent_plaintext: Option<bool>,
    /// The admin listener may be off loopback (it has no authentication).
    pub admin_open: Option<bool>,
    /// The token every admin request must carry: the token, or `@FILE`.
    pub admin_token: Option<String>,
    /// The event log's address (as `--store`).
    pub store: Option<String>,
    #[serde(default)]
    pub endpoints: Vec<String>,
    #[serde(default)]
    pub fallbacks: HashMap<String, Vec<String>>,
    /// Unset is off; `false` with keys on is refused, as the flag is.
    pub record_usage: Option<bool>,
    /// `auth: true`, or the section; `true` is `{enabled: true}`.
    #[serde(default)]
    pub auth: AuthSection,
    #[serde(default)]
    pub router: RouterSection,
    #[serde(default)]
    pub admission: AdmissionSection,
    #[serde(default)]
    pub landing: LandingSection,
    /// Caps and timeouts of the listeners' connections.
    #[serde(default)]
    pub connections: ConnectionsSection,
    #[serde(default)]
    pub control: ControlSection,
    /// The catalog: these models win over the store's.
    #[serde(default)]
    pub models: Vec<Model>,
    /// Engines every node installs itself (llama.cpp).
    #[serde(default)]
    pub engines: crate::engines_config::EnginesSection,
    /// Mutual TLS on the agent listener (`llmgw ctl cert` makes the files).
    pub tls: Option<TlsSection>,
    /// HTTPS on the client listener.
    pub client_tls: Option<ClientTlsSection>,
    /// How long requests in flight get to finish on SIGTERM (as
    /// `--shutdown-grace`).
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub shutdown_grace: Option<String>,
    /// Threads' trimming and capture, and the conversation sweep.
    #[serde(default)]
    pub conversations: crate::convo_settings::ConversationsSection,
    /// Without keys: one shared pool of threads.
    pub threads: Option<crate::convo_settings::ThreadsSection>,
    /// The fleet's model mirror (`llmgw mirror serve`).
    pub mirror: Option<MirrorSection>,
}

/// Where `mirror:<model>/<version>/<file>` sources are fetched from.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MirrorSection {
    /// The mirror's byte path as nodes reach it (its `--base`).
    pub url: String,
}

/// The mirror's byte path, checked: an http(s) URL, no trailing `/`.
pub(crate) fn mirror_url(m: Option<&MirrorSection>) -> Result<Option<String>, ConfigError> {
    let Some(m) = m else { return Ok(None) };
    match reqwest::Url::parse(&m.url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.query().is_none() => {
            Ok(Some(m.url.trim_end_matches('/').to_owned()))
        }
        _ => Err(ConfigError(format!(
            "mirror.url: {:?} is not an http:// or https:// URL (the mirror's --base)",
            m.url
        ))),
    }
}

/// API keys, pricing and the usage batcher.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuthSection {
    #[serde(default)]
    pub enabled: bool,
    /// The price of a model the catalog does not price.
    pub default_price: Option<llmgw_domain::catalog::Price>,
    /// How often queued usage is appended.
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub flush_interval: Option<String>,
    /// Usage records appended at most per append.
    pub batch_size: Option<usize>,
    /// Usage records held before new ones are dropped (and counted).
    pub buffer_size: Option<usize>,
    /// Anyone may sign up on `/signup` (a pending, powerless account until
    /// an operator approves it). Default true.
    pub signup_open: Option<bool>,
    /// Sign-up pauses while this many accounts wait for approval
    /// (default 1,000): a flood of sign-ups cannot grow the log and the
    /// admin's list without end.
    pub signup_pending_max: Option<usize>,
    /// A browser session unused this long ends (default 8h).
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub session_idle: Option<String>,
    /// A browser session ends this long after sign-in however busy
    /// (default 7d).
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub session_max: Option<String>,
    /// Wrong passwords allowed for one email within `sign_in_window`
    /// before sign-in is refused for the rest of it (default 10).
    pub sign_in_attempts: Option<u32>,
    /// The window `sign_in_attempts` counts in (default 15m).
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub sign_in_window: Option<String>,
}

/// What `/` tells people.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LandingSection {
    /// Whom to ask: an email (a mailto link), an http(s) address (a link),
    /// or plain text.
    pub contact: Option<String>,
    /// A line shown on the start page.
    pub notice: Option<String>,
    /// The address clients use (http:// or https://), shown in examples
    /// and claim pages; https makes the cookies Secure.
    pub base_url: Option<String>,
}

/// How the gateway routes.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RouterSection {
    /// Other endpoints tried after a failure before the first byte.
    pub retries: Option<u32>,
    /// Continuations of a stream on other replicas after its engine broke
    /// mid-answer (0: none).
    pub migration_limit: Option<u32>,
    /// The request header that pins a conversation to one endpoint.
    pub session_header: Option<String>,
    /// Web pages on these origins may call the API from a browser (CORS);
    /// `*` for any.
    pub cors_origins: Option<Vec<String>>,
    /// The largest request body, in bytes.
    pub body_limit: Option<usize>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub scrape_interval: Option<String>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub connect_timeout: Option<String>,
    /// The most an engine may take to start its answer (a plain one: to
    /// finish it).
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub response_timeout: Option<String>,
    /// The most a streamed answer may go without a byte from its engine.
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub stream_idle_timeout: Option<String>,
    /// How long a request for an on-demand model waits for a replica.
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub on_demand_wait: Option<String>,
    pub breaker: Option<BreakerSection>,
    pub prefix: Option<PrefixSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BreakerSection {
    /// Failures in a row that open an endpoint's breaker.
    pub threshold: Option<u32>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub cool_down: Option<String>,
}

/// Prefix (and session) affinity.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PrefixSection {
    pub enabled: Option<bool>,
    /// Bytes of prompt that must match before a prefix counts.
    pub min_match: Option<usize>,
    /// Share of the prompt that must match, 0 to 1.
    pub match_ratio: Option<f64>,
    /// Load difference (requests) that overrides affinity.
    pub balance_abs: Option<f64>,
    /// Load ratio that overrides affinity.
    pub balance_rel: Option<f64>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub ttl: Option<String>,
    /// Entries kept at most (prefix blocks and sessions each).
    pub max_nodes: Option<usize>,
}

/// The listeners' connections: how long one may idle or take to send a
/// body, and how many each listener holds at once.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConnectionsSection {
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub idle_timeout: Option<String>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub body_timeout: Option<String>,
    pub max: Option<MaxConnectionsSection>,
}

/// Open connections at most, per listener.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MaxConnectionsSection {
    pub client: Option<usize>,
    pub admin: Option<usize>,
    pub metrics: Option<usize>,
    pub agent: Option<usize>,
}

/// Priority bands.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdmissionSection {
    pub enabled: Option<bool>,
    /// The band of a request that names none (auth off).
    pub default_band: Option<String>,
    /// KV-cache occupancy at which an endpoint counts as full, 0 to 1.
    pub kv_ceiling: Option<f64>,
    /// Requests waiting in an engine at which it counts as full.
    pub waiting_ceiling: Option<f64>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub max_wait: Option<String>,
    pub max_waiting: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsSection {
    /// The authority agents' certificates must be signed by.
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// The authority's private key: with it the leader signs the
    /// certificates of nodes that join with a token.
    pub ca_key: Option<std::path::PathBuf>,
}

/// HTTPS on the client listener: a server certificate (its chain may
/// follow it in the file) and its key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClientTlsSection {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

/// The PEM files of a TLS section, read (and so checked) before anything
/// binds.
#[derive(Debug, Clone)]
pub(crate) struct TlsPems {
    pub ca: String,
    pub cert: String,
    pub key: String,
    /// Nodes may join with a token: certificates are signed with this key.
    pub ca_key: Option<String>,
}

impl TlsPems {
    /// What the leader signs joining nodes' certificates with, when
    /// `tls.ca_key` is given.
    pub(crate) fn authority(
        &self,
    ) -> Option<Result<llmgw_control::authority::Authority, ConfigError>> {
        let key = self.ca_key.as_deref()?;
        Some(
            llmgw_control::authority::Authority::from_pem(&self.ca, key, &self.cert)
                .map_err(|e| ConfigError(e.to_string())),
        )
    }
}

impl TlsSection {
    pub(crate) fn read(&self) -> Result<TlsPems, ConfigError> {
        let read = |what: &str, p: &std::path::Path| {
            let text = std::fs::read_to_string(p).map_err(|e| {
                ConfigError(format!("tls.{what}: cannot read {}: {e}", p.display()))
            })?;
            if !text.contains("-----BEGIN") {
                return Err(ConfigError(format!(
                    "tls.{what}: {} is not PEM",
                    p.display()
                )));
            }
            Ok(text)
        };
        let pems = TlsPems {
            ca: read("ca", &self.ca)?,
            cert: read("cert", &self.cert)?,
            key: read("key", &self.key)?,
            ca_key: self
                .ca_key
                .as_deref()
                .map(|p| read("ca_key", p))
                .transpose()?,
        };
        // Joining is honoured whole or refused at start: the key must be
        // the authority's, and the server's certificate signed by it (the
        // one authority joined nodes trust).
        pems.authority().transpose()?;
        Ok(pems)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ControlSection {
    /// Run the control plane even with no models in this file; `false`
    /// with models is refused (a catalog needs it), not overridden.
    pub enabled: Option<bool>,
    pub instance: Option<String>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub interval: Option<String>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub lease_ttl: Option<String>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub unreachable_after: Option<String>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub lost_after: Option<String>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub base_backoff: Option<String>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub max_backoff: Option<String>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub drain_grace: Option<String>,
    /// Eviction guards: how young a replica is never evicted for an
    /// on-demand model, and how recently asked for.
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub min_lifetime: Option<String>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub evict_idle: Option<String>,
    pub port_range: Option<[u16; 2]>,
    pub mgmt_interface: Option<String>,
    /// The admin URL other servers forward operators' commands to while
    /// this one leads (default: http:// and admin_listen).
    pub advertise_admin: Option<String>,
    /// The agent URL standbys name to agents while this one leads (default:
    /// http(s):// and agent_listen).
    pub advertise_agent: Option<String>,
    /// The server's Ed25519 private key (PEM): signs the anchors the
    /// sinks get.
    pub signing_key: Option<std::path::PathBuf>,
    /// Periodic anchors of the log's chain head.
    pub anchors: Option<AnchorSection>,
}

/// `control.anchors`: an `AnchorRecorded` event every `every_events`
/// events or `every` (whichever comes first), each also handed to `file`
/// and/or `command`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AnchorSection {
    pub every_events: Option<u64>,
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub every: Option<String>,
    /// A file each anchor is appended to, one JSON line each.
    pub file: Option<std::path::PathBuf>,
    /// A command run (`sh -c`) for each anchor, the line on its stdin and
    /// `LLMGW_ANCHOR=HASH@POSITION` in its environment.
    pub command: Option<String>,
}

impl ControlSection {
    /// The first setting besides `enabled` that is given, by its name: a
    /// refusal names the key, not the section (`control.*`).
    pub(crate) fn first_set(&self) -> Option<&'static str> {
        let ControlSection {
            enabled: _,
            instance,
            interval,
            lease_ttl,
            unreachable_after,
            lost_after,
            base_backoff,
            max_backoff,
            drain_grace,
            min_lifetime,
            evict_idle,
            port_range,
            mgmt_interface,
            advertise_admin,
            advertise_agent,
            signing_key,
            anchors,
        } = self;
        [
            (instance.is_some(), "control.instance"),
            (interval.is_some(), "control.interval"),
            (lease_ttl.is_some(), "control.lease_ttl"),
            (unreachable_after.is_some(), "control.unreachable_after"),
            (lost_after.is_some(), "control.lost_after"),
            (base_backoff.is_some(), "control.base_backoff"),
            (max_backoff.is_some(), "control.max_backoff"),
            (drain_grace.is_some(), "control.drain_grace"),
            (min_lifetime.is_some(), "control.min_lifetime"),
            (evict_idle.is_some(), "control.evict_idle"),
            (port_range.is_some(), "control.port_range"),
            (mgmt_interface.is_some(), "control.mgmt_interface"),
            (advertise_admin.is_some(), "control.advertise_admin"),
            (advertise_agent.is_some(), "control.advertise_agent"),
            (signing_key.is_some(), "control.signing_key"),
            (anchors.is_some(), "control.anchors"),
        ]
        .into_iter()
        .find_map(|(set, name)| set.then_some(name))
    }
}

/// A value written as text or as a bare number (`shutdown_grace: 30`, or
/// `LLMGW_SHUTDOWN_GRACE=30`, which is read as YAML), as text: a duration's
/// bare number is its seconds, a version's its name.
pub(crate) fn number_or_text<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    struct Text;
    impl<'de> serde::de::Visitor<'de> for Text {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("text or a number")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_owned()))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    }
    d.deserialize_option(Text)
}

/// `500ms`, `5s`, `10m`, `1h`, `7d`, or a bare number of seconds.
pub(crate) fn duration(key: &str, s: &str) -> Result<Duration, ConfigError> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| (&s[..i], &s[i..]));
    let n: f64 = num.parse().map_err(|_| {
        ConfigError(format!(
            "{key}: {s:?} is not a duration like 500ms, 5s, 10m, 1h or 7d"
        ))
    })?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86_400.0,
        _ => {
            return Err(ConfigError(format!(
                "{key}: unknown unit {unit:?} in {s:?}; use ms, s, m, h or d"
            )));
        }
    };
    // A number too large for a duration is an error, not a panic.
    Duration::try_from_secs_f64(secs)
        .map_err(|_| ConfigError(format!("{key}: {s:?} is too long a duration")))
}

/// Parses a file (or nothing), lays the environment over it and checks
/// the catalog.
pub(crate) fn load(
    path: Option<&Path>,
    env: &[(String, String)],
) -> Result<FileConfig, ConfigError> {
    let name = path.map_or_else(|| "the environment".to_owned(), |p| p.display().to_string());
    let invalid = |e: &dyn std::fmt::Display| {
        ConfigError(format!("{name} is not a valid configuration: {e}"))
    };
    let mut yaml = None;
    let mut tree: serde_json::Value = match path {
        None => serde_json::json!({}),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
            if path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("toml"))
            {
                let tree: toml::Value = toml::from_str(&text).map_err(|e| invalid(&e))?;
                finite_toml(&tree, "").map_err(|e| invalid(&e))?;
                serde_json::to_value(tree).map_err(|e| invalid(&e))?
            } else {
                let tree = yaml_tree(&text).map_err(|e| invalid(&e))?;
                yaml = Some(text);
                tree
            }
        }
    };
    if tree.is_null() {
        tree = serde_json::json!({});
    }
    // `auth: true` is shorthand for the section, so that
    // `LLMGW_AUTH__ENABLED` and the other `auth.*` variables still apply.
    if let Some(on) = tree.get("auth").and_then(serde_json::Value::as_bool) {
        tree["auth"] = serde_json::json!({ "enabled": on });
    }
    // Named as a person writes it, not as the type it fails to be ("expected
    // struct AuthSection").
    if let Some(v) = tree.get("auth").filter(|v| !(v.is_object() || v.is_null())) {
        return Err(invalid(&format!(
            "auth is true, false or a section (auth: {{enabled: true, …}}), not {v}"
        )));
    }
    if !(tree.is_object()) {
        return Err(invalid(
            &"the file is a mapping of settings (listen: …, auth: …), not a list or a value",
        ));
    }
    let file_tree = tree.clone();
    // A variable that makes a good file bad is named, not the file.
    let invalid = |e: &dyn std::fmt::Display| match culprit(&file_tree, env) {
        Some(var) => ConfigError(format!("{var} is not a valid setting: {e}")),
        None => invalid(e),
    };
    overlay(&mut tree, env).map_err(|e| invalid(&e))?;
    // Sections refuse unknown keys themselves; the catalog's types are also
    // read from events, where a newer writer's field must be skipped, so
    // here a key they would skip is caught on the way through.
    let mut ignored = Vec::new();
    let mut skipped = |path: serde_ignored::Path<'_>| ignored.push(path.to_string());
    let config: FileConfig =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(tree, &mut skipped))
            .map_err(|e| {
                let e = keyed(e);
                // The merged tree has no lines; the file itself says where,
                // when reading it alone fails the same way.
                let located = yaml
                    .as_deref()
                    .and_then(|text| serde_norway::from_str::<FileConfig>(text).err())
                    .filter(|direct| direct.location().is_some())
                    .filter(|direct| direct.to_string().contains(&e));
                let said = match located {
                    Some(direct) => invalid(&direct),
                    None => invalid(&e),
                };
                // `completion_per_1K` fails as the right name missing: the
                // unknown key met first is the likelier mistake.
                match ignored.first() {
                    // `?` marks an optional value on the path: not a key.
                    Some(k) => ConfigError(format!(
                        "{} (`{}` is a key llmgw does not know: misspelt?)",
                        said.0,
                        k.replace(".?", "")
                    )),
                    None => said,
                }
            })?;
    if let Some(path) = ignored.first() {
        let (at, key) = path.rsplit_once('.').unwrap_or(("", path));
        let whence = if at.is_empty() {
            String::new()
        } else {
            format!(" in {at}")
        };
        return Err(invalid(&format!("unknown field `{key}`{whence}")));
    }
    check_catalog(&config.models).map_err(|e| invalid(&e))?;
    Ok(config)
}

/// The error with the key that holds the bad value (`router.retries:
/// invalid value: integer \`-1\`, expected u32`), unless it names the key
/// itself (an unknown field).
fn keyed(e: serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = e.path().to_string();
    let inner = e.into_inner().to_string();
    let last = path.rsplit('.').next().unwrap_or_default();
    if path == "." || inner.contains(&format!("`{last}`")) {
        inner
    } else {
        format!("{path}: {inner}")
    }
}

/// The `LLMGW_A__B` variable that, laid over a file that reads well
/// alone, makes it read badly.
fn culprit(file_tree: &serde_json::Value, env: &[(String, String)]) -> Option<String> {
    let reads = |tree: serde_json::Value| {
        let mut skipped = false;
        serde_ignored::deserialize::<_, _, FileConfig>(tree, |_| skipped = true).is_ok() && !skipped
    };
    if !reads(file_tree.clone()) {
        return None;
    }
    env.iter()
        .filter(|(k, _)| k.starts_with("LLMGW_") && k.contains("__"))
        .find(|(k, v)| {
            let mut tree = file_tree.clone();
            overlay(&mut tree, &[(k.clone(), v.clone())]).is_err() || !reads(tree)
        })
        .map(|(k, _)| k.clone())
}

/// YAML as the tree the settings are read from. Read through YAML's own
/// values first: a key given twice is refused (a later `router:` dropped
/// the whole earlier section unsaid), and so is `.inf` or `.nan`, which
/// the tree cannot hold (they read as unset, and the default applied).
fn yaml_tree(text: &str) -> Result<serde_json::Value, String> {
    let tree: serde_norway::Value = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    finite_yaml(&tree, "")?;
    serde_json::to_value(tree).map_err(|e| e.to_string())
}

fn finite_yaml(v: &serde_norway::Value, at: &str) -> Result<(), String> {
    use serde_norway::Value;
    match v {
        Value::Number(n) if n.as_f64().is_some_and(|f| !f.is_finite()) => Err(not_finite(at, n)),
        Value::Sequence(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| finite_yaml(item, &child(at, &i.to_string()))),
        Value::Mapping(m) => m.iter().try_for_each(|(k, item)| {
            let key = match k {
                Value::String(s) => s.clone(),
                other => serde_norway::to_string(other)
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
            };
            finite_yaml(item, &child(at, &key))
        }),
        Value::Tagged(t) => finite_yaml(&t.value, at),
        _ => Ok(()),
    }
}

fn finite_toml(v: &toml::Value, at: &str) -> Result<(), String> {
    match v {
        toml::Value::Float(f) if !f.is_finite() => Err(not_finite(at, f)),
        toml::Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| finite_toml(item, &child(at, &i.to_string()))),
        toml::Value::Table(t) => t
            .iter()
            .try_for_each(|(k, item)| finite_toml(item, &child(at, k))),
        _ => Ok(()),
    }
}

fn child(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    }
}

fn not_finite(at: &str, n: impl std::fmt::Display) -> String {
    let at = if at.is_empty() { "the value" } else { at };
    format!("{at}: {n} is not a finite number")
}

/// `LLMGW_A__B=v` sets `a.b` to `v` (read as YAML, so numbers stay numbers).
/// Only nested keys: top-level settings have their own variables.
fn overlay(tree: &mut serde_json::Value, env: &[(String, String)]) -> Result<(), String> {
    for (k, v) in env {
        let Some(rest) = k.strip_prefix("LLMGW_") else {
            continue;
        };
        if !rest.contains("__") {
            continue;
        }
        let path: Vec<String> = rest.split("__").map(str::to_lowercase).collect();
        // Empty read as unset, and erased the file's value unsaid.
        if v.trim().is_empty() {
            return Err(format!("{k} is empty: give it a value, or unset it"));
        }
        // The parser's own words ("while scanning an alias" for `*`) do
        // not say that the value is YAML, nor how to write it.
        let value = yaml_tree(v).map_err(|e| {
            format!(
                "{k}: {e} (the value is read as YAML: write a list as '[\"a\", \"b\"]', and quote text that begins with *, &, !, |, > or %)"
            )
        })?;
        let mut at = &mut *tree;
        for (i, key) in path.iter().enumerate() {
            let obj = at
                .as_object_mut()
                .ok_or_else(|| format!("{k}: {} is not a section", path[..i].join(".")))?;
            if i + 1 == path.len() {
                obj.insert(key.clone(), value.clone());
                break;
            }
            at = obj
                .entry(key.clone())
                .or_insert_with(|| serde_json::json!({}));
        }
    }
    Ok(())
}

/// Refuses an `LLMGW_…` variable that no command reads but that names a
/// key of the file once its underscores are read as section breaks
/// (`LLMGW_AUTH_ENABLED` for `auth.enabled`), or a key with no variable of
/// its own (`LLMGW_MODELS`): such a typo would otherwise be dropped without
/// a word, and a setting like `auth.enabled` silently left off. Variables
/// that name no key (a shell's own, a test's) are left alone.
pub(crate) fn stray_variables(
    env: &[(String, String)],
    known: &std::collections::HashSet<String>,
) -> Result<(), ConfigError> {
    for (name, _) in env {
        let Some(rest) = name.strip_prefix("LLMGW_") else {
            continue;
        };
        if rest.contains("__") || known.contains(name) || rest.is_empty() {
            continue;
        }
        misspelt(name, known)?;
        let words: Vec<String> = rest.split('_').map(str::to_lowercase).collect();
        if let Some(path) = key_path(&words) {
            return Err(ConfigError(if path.len() == 1 {
                format!(
                    "{name} is not a variable of llmgw: `{}` has none of its own; set it in the configuration file (--config)",
                    path[0]
                )
            } else {
                format!(
                    "{name} is not a variable of llmgw: the key `{}` is set by LLMGW_{} (two underscores between a section and its key)",
                    path.join("."),
                    path.join("__").to_uppercase()
                )
            }));
        }
    }
    Ok(())
}

/// Refuses every `LLMGW_…` variable a letter or two off one some command
/// reads: a typo of it (LLMGW_ADMIN_LISTN), which would be passed over.
pub(crate) fn misspelt_variables(
    env: &[(String, String)],
    known: &std::collections::HashSet<String>,
) -> Result<(), ConfigError> {
    env.iter()
        .filter(|(name, _)| name.starts_with("LLMGW_") && !known.contains(name))
        .try_for_each(|(name, _)| misspelt(name, known))
}

fn misspelt(name: &str, known: &std::collections::HashSet<String>) -> Result<(), ConfigError> {
    let rest = |n: &str| n.strip_prefix("LLMGW_").unwrap_or(n).to_owned();
    let (typed, near) = (rest(name), |len: usize| if len < 8 { 1 } else { 2 });
    // Counted after the prefix, and closer for short names: LLMGW_PATH is
    // not a typo of LLMGW_AUTH, LLMGW_ADMIN_LISTN is one of
    // LLMGW_ADMIN_LISTEN.
    let distance = |k: &String| edits(&rest(k), &typed);
    match known
        .iter()
        .filter(|k| rest(k).len() >= 4 && distance(k) <= near(rest(k).len()))
        .min_by_key(|k| (distance(k), k.as_str()))
    {
        Some(meant) => Err(ConfigError(format!(
            "{name} is not a variable of llmgw; did you mean {meant}?"
        ))),
        None => Ok(()),
    }
}

/// How many letters inserted, removed or changed make `a` into `b`.
pub(crate) fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The first reading of `words` (joined by `_` or split between sections)
/// that is a key of the file, if any; a key is one that reading a value
/// there does not call unknown.
fn key_path(words: &[String]) -> Option<Vec<String>> {
    let breaks = words.len().saturating_sub(1).min(8);
    for mask in 0u32..(1 << breaks) {
        let mut path = vec![words[0].clone()];
        for (i, w) in words[1..].iter().enumerate() {
            if mask & (1 << i) != 0 {
                path.push(w.clone());
            } else if let Some(last) = path.last_mut() {
                last.push('_');
                last.push_str(w);
            }
        }
        let mut tree = serde_json::Value::Null;
        for key in path.iter().rev() {
            tree = serde_json::json!({ key.clone(): tree });
        }
        let mut ignored = false;
        let unknown = match serde_ignored::deserialize::<_, _, FileConfig>(tree, |_| ignored = true)
        {
            Ok(_) => false,
            // A section given where a value goes (`store.password`) is no
            // key either.
            Err(e) => {
                let e = e.to_string();
                e.contains("unknown field") || e.contains("invalid type: map")
            }
        };
        if !unknown && !ignored {
            return Some(path);
        }
    }
    None
}

fn check_catalog(models: &[Model]) -> Result<(), String> {
    Catalog::default()
        .decide(CatalogCommand::ApplyModels(models.to_vec()))
        .map(|_| ())
        .map_err(|r| r.reason)
}

/// A secret given as itself or as `@FILE` holding it (kept off command
/// lines and out of the configuration file), checked to be one: at least
/// 16 visible ASCII characters, which a header can carry.
pub(crate) fn secret_value(name: &str, given: &str) -> Result<String, ConfigError> {
    let value = match given.trim().strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| ConfigError(format!("{name}: cannot read {file}: {e}")))?
            .trim()
            .to_owned(),
        None => given.trim().to_owned(),
    };
    if value.len() < 16 || !value.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(ConfigError(format!(
            "{name} must be at least 16 visible ASCII characters, without spaces (`openssl rand -hex 32` makes one)"
        )));
    }
    Ok(value)
}

#[cfg(test)]
#[path = "config_docs.rs"]
mod docs;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_their_unit_and_refuse_what_is_no_duration() {
        let d = |s: &str| duration("k", s).map_err(|e| e.0);
        assert_eq!(d("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(d("90"), Ok(Duration::from_secs(90)));
        assert_eq!(d("2d"), Ok(Duration::from_secs(2 * 86_400)));
        assert!(d("99999999999999999999d").unwrap_err().contains("too long"));
        assert!(d("-5s").unwrap_err().contains("not a duration"));
        assert!(d("5w").unwrap_err().contains("unknown unit"));
    }

    /// A secret is itself or @FILE's content, trimmed, and long enough to
    /// be one; what is refused says how to make one.
    #[test]
    fn a_secret_is_given_or_read_and_refused_when_short_or_spaced() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t");
        std::fs::write(&file, "0123456789abcdef0123\n").unwrap();
        let at = format!("@{}", file.display());
        assert_eq!(
            secret_value("t", &at).map_err(|e| e.0),
            Ok("0123456789abcdef0123".to_owned())
        );
        assert_eq!(
            secret_value("t", " 0123456789abcdef ").map_err(|e| e.0),
            Ok("0123456789abcdef".to_owned())
        );
        for bad in ["short", "0123456789 abcdef0", "@/no/such/file"] {
            let e = secret_value("admin_token", bad).unwrap_err().0;
            assert!(e.starts_with("admin_token"), "{e}");
        }
        assert!(
            secret_value("t", "short")
                .unwrap_err()
                .0
                .contains("openssl rand")
        );
    }
}
