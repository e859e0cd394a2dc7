//! `mirror:<model>/<version>/<file>` sources: the file as the fleet's
//! mirror holds it. The control plane says where the mirror's byte path
//! is; the version's manifest there (`GET <base>/<model>/<version>`) gives
//! the file's size and sha256, which the download must match, so a file
//! corrupted on the mirror (or on the way) is refused rather than
//! copied to the node.

use super::FetchError;

/// What a download must come to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expect {
    pub size: Option<u64>,
    /// Lowercase hex.
    pub sha256: Option<String>,
    /// Who said so, for the error: "the catalog", "the mirror's manifest".
    pub from: &'static str,
}

/// The three names of a `mirror:` source.
pub fn parse(source: &str) -> Result<(&str, &str, &str), FetchError> {
    let bad = |why: &str| FetchError::BadSource {
        src: source.to_owned(),
        why: why.to_owned(),
    };
    let rest = source
        .strip_prefix("mirror:")
        .ok_or_else(|| bad("not a mirror: source"))?;
    let parts: Vec<&str> = rest.split('/').collect();
    let ok = |s: &str| {
        !s.is_empty()
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    match parts.as_slice() {
        [m, v, f] if ok(m) && ok(v) && ok(f) => Ok((m, v, f)),
        _ => Err(bad(
            "a mirror source is mirror:<model>/<version>/<file>, each a name of letters, digits and . _ -",
        )),
    }
}

/// The file's URL on the mirror and what it must come to: the manifest's
/// size and sha256, and the catalog's checksum, which must agree with it.
pub(super) async fn locate(
    client: &reqwest::Client,
    base: Option<&str>,
    source: &str,
    checksum: Option<&str>,
) -> Result<(String, Expect), FetchError> {
    let (m, v, f) = parse(source)?;
    let err = |why: String| FetchError::Fetch {
        src: source.to_owned(),
        why,
    };
    let base = base
        .filter(|b| !b.is_empty())
        .ok_or_else(|| {
            err("the control plane names no mirror (mirror.url in server.yaml), so a mirror: source cannot be fetched".into())
        })?
        .trim_end_matches('/');
    let manifest_url = format!("{base}/{m}/{v}");
    let resp = client
        .get(&manifest_url)
        .send()
        .await
        .map_err(|e| err(format!("{manifest_url}: {e}")))?;
    if resp.status() == reqwest::StatusCode::NOT_FOUND {
        return Err(err(format!("the mirror at {base} holds no {m}/{v}")));
    }
    if !resp.status().is_success() {
        return Err(err(format!("{manifest_url} answered {}", resp.status())));
    }
    let manifest: serde_json::Value = resp
        .json()
        .await
        .map_err(|e| err(format!("{manifest_url}: not a manifest: {e}")))?;
    let entry = manifest["files"]
        .as_array()
        .and_then(|files| files.iter().find(|e| e["name"] == f))
        .ok_or_else(|| err(format!("the mirror's {m}/{v} has no file {f}")))?;
    let listed = entry["sha256"].as_str().map(str::to_lowercase);
    let wanted = checksum.map(|c| c.strip_prefix("sha256:").unwrap_or(c).to_lowercase());
    if let (Some(l), Some(w)) = (&listed, &wanted)
        && l != w
    {
        return Err(FetchError::Checksum {
            src: source.to_owned(),
            wanted: format!("sha256:{w} (the catalog)"),
            found: format!("sha256:{l} (the mirror's manifest)"),
        });
    }
    let expect = Expect {
        size: entry["size"].as_u64(),
        from: if wanted.is_some() {
            "the catalog"
        } else {
            "the mirror's manifest"
        },
        sha256: wanted.or(listed),
    };
    Ok((format!("{base}/{m}/{v}/{f}"), expect))
}
