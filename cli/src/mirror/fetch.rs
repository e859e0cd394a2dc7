//! Fetching a version from its upstream into the mirror: each source to
//! the version's incoming directory (resumed with `Range` when a partial
//! file is there from an earlier try), hashed as it arrives, checked
//! against the size and sha256 the upstream publishes when it publishes
//! them (a Hugging Face `resolve` URL: the repository's tree API, whose
//! `lfs.oid` is the sha256), then the whole directory renamed into place
//! with its manifest. One process fetches a version at a time (a lock
//! file), so `mirror add` and `mirror serve` never write the same file.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::store::{FileEntry, Manifest, Store, check_segments};

/// The sources an incoming directory's files come from.
const SOURCES: &str = ".llmgw-sources.json";

/// How far a fetch has got, shared with whoever lists it.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    pub done: AtomicU64,
    /// 0 while unknown.
    pub total: AtomicU64,
}

/// The URL a source is fetched from: an `http(s)://` URL, or
/// `hf:org/repo/path` (at `main`) or `hf:org/repo@revision/path`.
pub(crate) fn resolve(source: &str) -> Result<reqwest::Url, String> {
    if let Some(rest) = source.strip_prefix("hf:") {
        let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
        if parts.len() < 3 {
            return Err(format!(
                "{source} names a repository, not a file: give hf:org/repo/file (or hf:org/repo@revision/file)"
            ));
        }
        let (repo, rev) = parts[1].split_once('@').unwrap_or((parts[1], "main"));
        let url = format!(
            "https://huggingface.co/{}/{repo}/resolve/{rev}/{}",
            parts[0],
            parts[2..].join("/")
        );
        return reqwest::Url::parse(&url).map_err(|e| format!("{source}: {e}"));
    }
    let url = reqwest::Url::parse(source)
        .map_err(|e| format!("{source} is not a URL or hf:org/repo/file: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{source}: only http(s) URLs and hf: are fetched"));
    }
    Ok(url)
}

/// The file name a source is kept under: the last segment of its path.
pub(crate) fn file_name(url: &reqwest::Url) -> Result<String, String> {
    let name = url
        .path_segments()
        .and_then(|mut s| s.next_back())
        .unwrap_or_default()
        .to_owned();
    check_segments(&[name.as_str()]).map(|()| name)
}

/// What the upstream says a file is: its size and sha256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Published {
    pub size: u64,
    pub sha256: String,
}

/// For a Hugging Face-shaped URL (`…/<org>/<repo>/resolve/<rev>/<path>`),
/// the tree API of the same host lists every file with its LFS sha256. A
/// host that answers nothing useful publishes nothing; the fetch goes on
/// unverified against upstream (its own sha256 is still recorded).
async fn published(http: &reqwest::Client, url: &reqwest::Url) -> Option<Published> {
    let segs: Vec<&str> = url.path_segments()?.collect();
    let at = segs.iter().position(|s| *s == "resolve")?;
    if at != 2 || segs.len() < 5 {
        return None;
    }
    let (org, repo, rev) = (segs[0], segs[1], segs[3]);
    let path = segs[4..].join("/");
    let dir = segs[4..segs.len() - 1].join("/");
    let mut tree = url.clone();
    tree.set_query(None);
    let under = if dir.is_empty() {
        String::new()
    } else {
        format!("/{dir}")
    };
    tree.set_path(&format!("/api/models/{org}/{repo}/tree/{rev}{under}"));
    let listed: serde_json::Value = http
        .get(tree)
        .send()
        .await
        .ok()?
        .error_for_status()
        .ok()?
        .json()
        .await
        .ok()?;
    let entry = listed.as_array()?.iter().find(|e| e["path"] == path)?;
    let lfs = &entry["lfs"];
    Some(Published {
        size: lfs["size"].as_u64().or(entry["size"].as_u64())?,
        sha256: lfs["oid"].as_str()?.to_lowercase(),
    })
}

/// Whether another process holds a version's lock (it is fetching it).
pub(crate) fn locked_elsewhere(lock: &Path) -> bool {
    let Ok(file) = std::fs::File::open(lock) else {
        return false;
    };
    match rustix::fs::flock(
        file.as_fd(),
        rustix::fs::FlockOperation::NonBlockingLockShared,
    ) {
        Ok(()) => false,
        Err(_) => true,
    }
}

/// Holds a version's lock for as long as it lives.
#[derive(Debug)]
pub(crate) struct Lock(#[allow(dead_code, reason = "held for its flock")] std::fs::File);

pub(crate) fn lock(store: &Store, m: &str, v: &str) -> Result<Lock, String> {
    let path = store.lock_path(m, v);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    rustix::fs::flock(
        file.as_fd(),
        rustix::fs::FlockOperation::NonBlockingLockExclusive,
    )
    .map_err(|_| format!("{m}/{v} is being fetched by another process"))?;
    Ok(Lock(file))
}

fn hex(d: impl AsRef<[u8]>) -> String {
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Fetches every source of a version and puts the version in place. On
/// failure the reason is recorded and the partial files are kept, so that
/// the next try resumes.
pub(crate) async fn fetch_version(
    store: &Store,
    http: &reqwest::Client,
    m: &str,
    v: &str,
    sources: &[String],
    progress: &Arc<Progress>,
) -> Result<Manifest, String> {
    let _lock = lock(store, m, v)?;
    let result = fetch_locked(store, http, m, v, sources, progress).await;
    match &result {
        Ok(_) => store.clear_failure(m, v),
        Err(reason) => {
            tracing::warn!(model = m, version = v, %reason, "mirror fetch failed");
            let failure = super::store::Failure {
                sources: sources.to_vec(),
                reason: reason.clone(),
                at: super::store::now(),
            };
            if let Err(e) = store.record_failure(m, v, &failure) {
                tracing::error!(error = %e, "cannot record why the fetch failed");
            }
        }
    }
    result
}

async fn fetch_locked(
    store: &Store,
    http: &reqwest::Client,
    m: &str,
    v: &str,
    sources: &[String],
    progress: &Arc<Progress>,
) -> Result<Manifest, String> {
    check_segments(&[m, v])?;
    if store.held(m, v).is_some() {
        return Err(format!(
            "{m}/{v} is already held, and a version is never overwritten: add a new version beside it"
        ));
    }
    let incoming = store.incoming_dir(m, v);
    // What an earlier try left is resumed only if it came from the same
    // sources: bytes of another file under the same name would be
    // continued into a corrupt one.
    let said = incoming.join(SOURCES);
    let earlier: Option<Vec<String>> = tokio::fs::read(&said)
        .await
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    if earlier.as_deref() != Some(sources) && incoming.exists() {
        tokio::fs::remove_dir_all(&incoming)
            .await
            .map_err(|e| format!("clearing {}: {e}", incoming.display()))?;
    }
    tokio::fs::create_dir_all(&incoming)
        .await
        .map_err(|e| format!("creating {}: {e}", incoming.display()))?;
    tokio::fs::write(&said, serde_json::to_vec(sources).unwrap_or_default())
        .await
        .map_err(|e| format!("writing {}: {e}", said.display()))?;
    let mut plan = Vec::new();
    for s in sources {
        let url = resolve(s)?;
        let name = file_name(&url)?;
        if plan.iter().any(|(_, n, _)| *n == name) {
            return Err(format!("two sources are both named {name}"));
        }
        let published = published(http, &url).await;
        plan.push((url, name, published));
    }
    let total: u64 = plan
        .iter()
        .map(|p| p.2.as_ref().map_or(0, |p| p.size))
        .sum();
    let all_published = plan.iter().all(|p| p.2.is_some());
    progress
        .total
        .store(if all_published { total } else { 0 }, Ordering::Relaxed);
    let mut files = Vec::new();
    for (url, name, published) in &plan {
        let path = incoming.join(name);
        let (size, sha256) = download(http, url, &path, progress).await?;
        if let Some(p) = published
            && (p.size != size || p.sha256 != sha256)
        {
            let _ = tokio::fs::remove_file(&path).await;
            return Err(format!(
                "{name}: {size} bytes with sha256 {sha256}, but the upstream publishes {} bytes with sha256 {}; the download was discarded",
                p.size, p.sha256
            ));
        }
        files.push(FileEntry {
            name: name.clone(),
            size,
            sha256: Some(sha256),
        });
    }
    let manifest = Manifest {
        model: m.to_owned(),
        version: v.to_owned(),
        sources: sources.to_vec(),
        files,
        fetched_at: super::store::now(),
        upstream_verified: all_published,
    };
    let _ = tokio::fs::remove_file(&said).await;
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| e.to_string())?;
    tokio::fs::write(incoming.join(super::store::MANIFEST), text)
        .await
        .map_err(|e| format!("writing the manifest: {e}"))?;
    let held = store.version_dir(m, v);
    if let Some(parent) = held.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    // One rename: the version appears whole or not at all.
    tokio::fs::rename(&incoming, &held)
        .await
        .map_err(|e| format!("moving {m}/{v} into place: {e}"))?;
    tracing::info!(model = m, version = v, "mirror holds a new version");
    Ok(manifest)
}

/// One file into `path`, resuming from what is already there; returns its
/// size and sha256.
async fn download(
    http: &reqwest::Client,
    url: &reqwest::Url,
    path: &Path,
    progress: &Progress,
) -> Result<(u64, String), String> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut hasher = Sha256::new();
    let mut existing = 0u64;
    // What an earlier try left is hashed again rather than trusted.
    if let Ok(mut f) = tokio::fs::File::open(path).await {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).await.map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            existing += n as u64;
        }
    }
    let mut request = http.get(url.clone());
    if existing > 0 {
        request = request.header(reqwest::header::RANGE, format!("bytes={existing}-"));
    }
    let resp = request
        .send()
        .await
        .map_err(|e| format!("fetching {url}: {e}"))?;
    let append = match resp.status() {
        reqwest::StatusCode::OK => false,
        reqwest::StatusCode::PARTIAL_CONTENT => {
            let starts = resp
                .headers()
                .get(reqwest::header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("bytes "))
                .and_then(|v| v.split('-').next())
                .and_then(|v| v.parse::<u64>().ok());
            if starts != Some(existing) {
                return Err(format!(
                    "{url} resumed at {starts:?}, not at byte {existing}"
                ));
            }
            true
        }
        reqwest::StatusCode::RANGE_NOT_SATISFIABLE => {
            // What is here is no prefix of what upstream has: start over.
            let _ = tokio::fs::remove_file(path).await;
            return Box::pin(download(http, url, path, progress)).await;
        }
        s => return Err(format!("fetching {url}: the upstream answered {s}")),
    };
    if !append {
        hasher = Sha256::new();
        existing = 0;
    }
    let length = resp.content_length();
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .await
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    progress.done.fetch_add(existing, Ordering::Relaxed);
    let mut done = existing;
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("{name}: after {done} bytes: {e}"))?;
        file.write_all(&chunk)
            .await
            .map_err(|e| format!("{name}: after {done} bytes: {e}"))?;
        hasher.update(&chunk);
        done += chunk.len() as u64;
        progress
            .done
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
    file.flush().await.map_err(|e| e.to_string())?;
    if let Some(l) = length
        && done != existing + l
    {
        return Err(format!(
            "{name}: the body ended after {done} of {} bytes",
            existing + l
        ));
    }
    Ok((done, hex(hasher.finalize())))
}
