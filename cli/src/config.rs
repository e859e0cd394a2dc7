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
    /// The event log's address (as `--store`).
    pub store: Option<String>,
    #[serde(default)]
    pub endpoints: Vec<String>,
    #[serde(default)]
    pub fallbacks: HashMap<String, Vec<String>>,
    #[serde(default)]
    pub record_usage: bool,
    #[serde(default)]
    pub auth: bool,
    #[serde(default)]
    pub control: ControlSection,
    /// The catalog: these models win over the store's.
    #[serde(default)]
    pub models: Vec<Model>,
    /// Mutual TLS on the agent listener (`llmgw ctl cert` makes the files).
    pub tls: Option<TlsSection>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsSection {
    /// The authority agents' certificates must be signed by.
    pub ca: std::path::PathBuf,
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
        Ok(TlsPems {
            ca: read("ca", &self.ca)?,
            cert: read("cert", &self.cert)?,
            key: read("key", &self.key)?,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ControlSection {
    /// Run the control plane even with no models in this file.
    #[serde(default)]
    pub enabled: bool,
    pub instance: Option<String>,
    pub interval: Option<String>,
    pub lease_ttl: Option<String>,
    pub unreachable_after: Option<String>,
    pub lost_after: Option<String>,
    pub base_backoff: Option<String>,
    pub max_backoff: Option<String>,
    pub drain_grace: Option<String>,
    pub port_range: Option<[u16; 2]>,
    pub mgmt_interface: Option<String>,
}

/// `500ms`, `5s`, `10m`, `1h`, or a bare number of seconds.
pub(crate) fn duration(key: &str, s: &str) -> Result<Duration, ConfigError> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| (&s[..i], &s[i..]));
    let n: f64 = num.parse().map_err(|_| {
        ConfigError(format!(
            "{key}: {s:?} is not a duration like 500ms, 5s, 10m or 1h"
        ))
    })?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(ConfigError(format!(
                "{key}: unknown unit {unit:?} in {s:?}; use ms, s, m or h"
            )));
        }
    };
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a file, lays the environment over it and checks the catalog.
pub(crate) fn load(path: &Path, env: &[(String, String)]) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
    let invalid = |e: &dyn std::fmt::Display| {
        ConfigError(format!(
            "{} is not a valid configuration: {e}",
            path.display()
        ))
    };
    let mut tree: serde_json::Value = if path.extension().is_some_and(|e| e == "toml") {
        toml::from_str(&text).map_err(|e| invalid(&e))?
    } else {
        serde_norway::from_str(&text).map_err(|e| invalid(&e))?
    };
    if tree.is_null() {
        tree = serde_json::json!({});
    }
    overlay(&mut tree, env).map_err(|e| invalid(&e))?;
    let config: FileConfig = serde_json::from_value(tree).map_err(|e| invalid(&e))?;
    check_catalog(&config.models).map_err(|e| invalid(&e))?;
    Ok(config)
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
        let value: serde_json::Value =
            serde_norway::from_str(v).map_err(|e| format!("{k}: {e}"))?;
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

fn check_catalog(models: &[Model]) -> Result<(), String> {
    Catalog::default()
        .decide(CatalogCommand::ApplyModels(models.to_vec()))
        .map(|_| ())
        .map_err(|r| r.reason)
}
