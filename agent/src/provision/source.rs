//! Where an engine's archives and their checksums come from: the
//! publisher's GitHub releases (checksums from GitHub's API), or an
//! `http(s)://` URL template (an operator's own copy, checksums given with
//! it), which is also how the server hands on a `mirror:<name>` source:
//! the mirror's byte path as the template, and its manifest for the
//! checksums.

use std::collections::BTreeMap;
use std::path::Path;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// What a URL template may say.
pub const PLACEHOLDERS: [&str; 4] = ["{version}", "{asset}", "{variant}", "{arch}"];

/// Where archives come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The recipe's repository's releases.
    GitHub,
    /// `https://host/llama/{version}/{asset}`.
    Template(String),
}

/// The origin a source names: empty or `github`, or a URL template with
/// `{asset}` in it (a CUDA build is two archives) and no other braces
/// than the placeholders.
pub fn origin(source: &str) -> Result<Origin, String> {
    let s = source.trim();
    if s.is_empty() || s == "github" {
        return Ok(Origin::GitHub);
    }
    if s.starts_with("mirror:") {
        // The server turns mirror:<name> into the mirror's URL template
        // and manifest before an agent sees it.
        return Err(format!(
            "{s}: a mirror: source is resolved by the server (mirror.url); an agent takes a URL template or github"
        ));
    }
    if !(s.starts_with("http://") || s.starts_with("https://")) {
        return Err(format!(
            "{s:?} is not a source: give github, or an http(s) URL template with {{asset}}"
        ));
    }
    if !s.contains("{asset}") {
        return Err(format!(
            "{s}: the URL template must contain {{asset}} (a CUDA build is two archives)"
        ));
    }
    let stripped = PLACEHOLDERS
        .iter()
        .fold(s.to_owned(), |acc, p| acc.replace(p, ""));
    if let Some(i) = stripped.find('{') {
        return Err(format!(
            "{s}: unknown placeholder at {:?}; use {}",
            stripped[i..].chars().take(12).collect::<String>(),
            PLACEHOLDERS.join(", ")
        ));
    }
    if stripped.contains('}') {
        return Err(format!("{s}: a stray }} in the URL template"));
    }
    reqwest::Url::parse(&expand(s, "a.tar.gz", "v", "cpu", "x64"))
        .map_err(|e| format!("{s}: not a URL: {e}"))?;
    Ok(Origin::Template(s.to_owned()))
}

/// Whether `hex` is a SHA-256 in hex (either case).
pub fn valid_sha256(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The template with its placeholders filled in.
pub fn expand(template: &str, asset: &str, version: &str, variant: &str, arch: &str) -> String {
    template
        .replace("{version}", version)
        .replace("{asset}", asset)
        .replace("{variant}", variant)
        .replace("{arch}", arch)
}

/// The SHA-256 of each asset of `repo`'s release `tag`, as GitHub states
/// it (`digest: sha256:<hex>`); assets without one are left out.
pub async fn github_checksums(
    http: &reqwest::Client,
    api: &str,
    repo: &str,
    tag: &str,
) -> Result<BTreeMap<String, String>, String> {
    #[derive(serde::Deserialize)]
    struct Release {
        #[serde(default)]
        assets: Vec<Asset>,
    }
    #[derive(serde::Deserialize)]
    struct Asset {
        name: String,
        #[serde(default)]
        digest: Option<String>,
    }
    let url = format!(
        "{}/repos/{repo}/releases/tags/{tag}",
        api.trim_end_matches('/')
    );
    let resp = http
        .get(&url)
        .header("Accept", "application/vnd.github+json")
        .header(
            "User-Agent",
            concat!("llmgw-agent/", env!("CARGO_PKG_VERSION")),
        )
        .send()
        .await
        .map_err(|e| format!("reaching GitHub for {repo} {tag}: {e}"))?;
    match resp.status().as_u16() {
        200 => {}
        404 => return Err(format!("{repo} has no release {tag}")),
        s @ (403 | 429) => {
            return Err(format!(
                "GitHub is rate-limiting this address ({s}); it retries later"
            ));
        }
        s => return Err(format!("GitHub answered {s} for {repo} {tag}")),
    }
    let release: Release = resp
        .json()
        .await
        .map_err(|e| format!("reading {repo} {tag} from GitHub: {e}"))?;
    Ok(release
        .assets
        .into_iter()
        .filter_map(|a| {
            let hex = a.digest?.strip_prefix("sha256:")?.to_owned();
            valid_sha256(&hex).then(|| (a.name, hex.to_ascii_lowercase()))
        })
        .collect())
}

/// The SHA-256 of each file an llmgw mirror's manifest lists
/// (`{"files": [{"name", "size", "sha256"}]}`).
pub async fn manifest_checksums(
    http: &reqwest::Client,
    url: &str,
) -> Result<BTreeMap<String, String>, String> {
    #[derive(serde::Deserialize)]
    struct Manifest {
        files: Vec<File>,
    }
    #[derive(serde::Deserialize)]
    struct File {
        name: String,
        sha256: String,
    }
    let resp = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("reaching the mirror for {url}: {e}"))?;
    match resp.status().as_u16() {
        200 => {}
        404 => return Err(format!("the mirror holds no such version ({url})")),
        s => return Err(format!("the mirror answered {s} for {url}")),
    }
    let m: Manifest = resp
        .json()
        .await
        .map_err(|e| format!("{url}: not a mirror's manifest: {e}"))?;
    Ok(m.files
        .into_iter()
        .filter(|f| valid_sha256(&f.sha256))
        .map(|f| (f.name, f.sha256.to_ascii_lowercase()))
        .collect())
}

/// Downloads `url` to `dest`, hashing as it streams, and refuses a file
/// whose SHA-256 is not `sha256`.
pub async fn download(
    http: &reqwest::Client,
    url: &str,
    asset: &str,
    dest: &Path,
    sha256: &str,
    progress: &(dyn Fn(String) + Sync),
) -> Result<(), String> {
    let failed = |why: String| format!("downloading {asset}: {why}");
    let resp = http
        .get(url)
        .send()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(failed(format!("{url} answered {}", resp.status())));
    }
    match resp.content_length().filter(|n| *n > 0) {
        Some(n) => progress(format!("downloading {asset} ({} MB)", n >> 20)),
        None => progress(format!("downloading {asset}")),
    }
    let mut file = tokio::fs::File::create(dest)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let mut hash = Sha256::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| failed(e.to_string()))?;
        hash.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| failed(e.to_string()))?;
    }
    file.flush().await.map_err(|e| failed(e.to_string()))?;
    let got: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let want = sha256.to_ascii_lowercase();
    if got != want {
        return Err(format!(
            "{asset} does not match the checksum its publisher gave (got {}, expected {})",
            &got[..12],
            &want[..12.min(want.len())]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_github_or_a_template_with_known_placeholders() {
        assert_eq!(origin("").unwrap(), Origin::GitHub);
        assert_eq!(origin("github").unwrap(), Origin::GitHub);
        let t = "https://files.example/llama/{version}/{asset}";
        assert_eq!(origin(t).unwrap(), Origin::Template(t.into()));
        assert_eq!(
            expand(t, "llama-b1-bin-ubuntu-x64.tar.gz", "b1", "cpu", "x64"),
            "https://files.example/llama/b1/llama-b1-bin-ubuntu-x64.tar.gz"
        );
        for (bad, why) in [
            ("https://x/{version}.tar.gz", "{asset}"),
            ("https://x/{asset}/{os}", "unknown placeholder"),
            ("https://x/{asset}}", "stray"),
            ("ftp://x/{asset}", "not a source"),
            ("mirror:llama/b1", "mirror"),
        ] {
            let e = origin(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(valid_sha256(&"aB".repeat(32)) && !valid_sha256("abc"));
    }
}
