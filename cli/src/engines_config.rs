//! `engines:` in the server's file: the engines every node installs
//! itself (only llama.cpp; vLLM and SGLang are installed by hand and named
//! in each agent's configuration). Checked whole at start; the leader
//! sends the list to every agent when its stream opens.

use std::collections::BTreeMap;

use llmgw_agent::provision::{recipe, source};
use llmgw_api::v1::EngineWant;
use serde::Deserialize;

use crate::config::ConfigError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnginesSection {
    /// llama.cpp's `llama-server`, from its release archives.
    pub llamacpp: Option<EngineSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EngineSection {
    /// The release tag (`b6000`).
    #[serde(default, deserialize_with = "crate::config::number_or_text")]
    pub version: Option<String>,
    /// `github` (the default), an http(s) URL template with `{asset}`
    /// (and `{version}`, `{variant}`, `{arch}` where wanted), or
    /// `mirror:<name>`: the archives in the mirror's `<name>/<version>/`.
    pub source: Option<String>,
    /// Archive file name → SHA-256 hex. Required with a URL template for
    /// every archive a node may fetch; with GitHub, they replace the
    /// checksums GitHub states.
    #[serde(default)]
    pub sha256: BTreeMap<String, String>,
}

impl EnginesSection {
    pub(crate) fn is_set(&self) -> bool {
        self.llamacpp.is_some()
    }
}

/// What the leader asks every node to install, or why the section is
/// wrong; `mirror` is `mirror.url`, which `mirror:` sources need.
pub(crate) fn wants(
    s: &EnginesSection,
    mirror: Option<&str>,
) -> Result<Vec<EngineWant>, ConfigError> {
    let mut out = Vec::new();
    if let Some(e) = &s.llamacpp {
        out.push(want("llamacpp", e, mirror)?);
    }
    Ok(out)
}

/// A mirror's name: letters, digits and `. _ -`, starting with a letter
/// or digit (the mirror's own rule).
fn mirror_name(n: &str) -> bool {
    n.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn want(engine: &str, e: &EngineSection, mirror: Option<&str>) -> Result<EngineWant, ConfigError> {
    let key = |k: &str| format!("engines.{engine}.{k}");
    let err = |m: String| Err(ConfigError(m));
    let Some(version) = e.version.clone() else {
        return err(format!(
            "{} is required: the release to install (b6000)",
            key("version")
        ));
    };
    if !recipe::valid_version(&version) {
        return err(format!(
            "{}: {version:?} is not a release tag (letters, digits, . _ + -)",
            key("version")
        ));
    }
    let mut src = e.source.clone().unwrap_or_default();
    let mut manifest = String::new();
    if let Some(name) = src.trim().strip_prefix("mirror:") {
        if !mirror_name(name) {
            return err(format!(
                "{}: {src:?}: a mirror source is mirror:<name>, a name of letters, digits and . _ - (the archives are in <name>/<version>/ on the mirror)",
                key("source")
            ));
        }
        let Some(base) = mirror else {
            return err(format!(
                "{}: {src} needs mirror.url: where the mirror's byte path is",
                key("source")
            ));
        };
        // The agents are given the byte path as a template and the
        // version's manifest for the checksums.
        manifest = format!("{base}/{name}/{version}");
        src = format!("{base}/{name}/{{version}}/{{asset}}");
    }
    let origin =
        source::origin(&src).map_err(|m| ConfigError(format!("{}: {m}", key("source"))))?;
    for (asset, hex) in &e.sha256 {
        if !source::valid_sha256(hex) {
            return err(format!(
                "{}: {hex:?} for {asset} is not a SHA-256 (64 hex digits)",
                key("sha256")
            ));
        }
        if asset.is_empty() || asset.contains('/') {
            return err(format!(
                "{}: {asset:?} is not an archive's file name",
                key("sha256")
            ));
        }
    }
    if matches!(origin, source::Origin::Template(_)) && e.sha256.is_empty() && manifest.is_empty() {
        return err(format!(
            "{} is required with a URL template: the SHA-256 of each archive by file name (llama-{version}-bin-ubuntu-x64.tar.gz …); a node refuses an archive it cannot check",
            key("sha256")
        ));
    }
    Ok(EngineWant {
        engine: engine.into(),
        version,
        source: src,
        sha256: e.sha256.clone().into_iter().collect(),
        manifest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(version: Option<&str>, src: Option<&str>, sums: &[(&str, &str)]) -> EnginesSection {
        EnginesSection {
            llamacpp: Some(EngineSection {
                version: version.map(str::to_owned),
                source: src.map(str::to_owned),
                sha256: sums
                    .iter()
                    .map(|(a, h)| ((*a).to_owned(), (*h).to_owned()))
                    .collect(),
            }),
        }
    }

    #[test]
    fn bad_engine_settings_are_refused_with_the_key() {
        let hex = "ab".repeat(32);
        let t = "https://files.example/{version}/{asset}";
        let ok = wants(
            &section(
                Some("b1"),
                Some(t),
                &[("llama-b1-bin-ubuntu-x64.tar.gz", &hex)],
            ),
            None,
        )
        .unwrap();
        assert_eq!(
            (ok[0].engine.as_str(), ok[0].version.as_str()),
            ("llamacpp", "b1")
        );
        assert_eq!(
            wants(&section(Some("b1"), None, &[]), None).unwrap()[0].source,
            ""
        );
        // From the mirror: its byte path and the version's manifest.
        let m = wants(
            &section(Some("b1"), Some("mirror:llama.cpp"), &[]),
            Some("http://models.internal:8081"),
        )
        .unwrap();
        assert_eq!(
            (m[0].source.as_str(), m[0].manifest.as_str()),
            (
                "http://models.internal:8081/llama.cpp/{version}/{asset}",
                "http://models.internal:8081/llama.cpp/b1"
            )
        );
        for (s, why) in [
            (
                section(None, None, &[]),
                "engines.llamacpp.version is required",
            ),
            (section(Some("../b1"), None, &[]), "not a release tag"),
            (
                section(Some("b1"), Some("https://x/{nope}/{asset}"), &[]),
                "engines.llamacpp.source",
            ),
            (
                section(Some("b1"), Some("mirror:llama"), &[]),
                "needs mirror.url",
            ),
            (
                section(Some("b1"), Some("mirror:a/b"), &[]),
                "mirror:<name>",
            ),
            (
                section(Some("b1"), Some(t), &[]),
                "engines.llamacpp.sha256 is required",
            ),
            (
                section(Some("b1"), None, &[("a.tar.gz", "xyz")]),
                "not a SHA-256",
            ),
        ] {
            let e = wants(&s, None).unwrap_err().0;
            assert!(e.contains(why), "{why}: {e}");
        }
        assert!(wants(&EnginesSection::default(), None).unwrap().is_empty());
    }
}
