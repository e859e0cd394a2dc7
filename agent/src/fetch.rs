//! Model weights: where a source's files are, fetching them into the
//! agent's cache, and removing cache files nobody wants.
//!
//! A source is a path (used where it is, never copied), a URL, `hf:` file
//! or `mirror:` file (fetched into the cache; see [`mirror`]), or anything
//! else: a model id the engine resolves itself. Fetches are single-flight
//! per source, go to a `.part` name and are renamed only when complete
//! (and verified, when a checksum or the mirror's manifest gives one), so
//! an interrupted download is resumed with `Range` and never looks like
//! weights. The cache name is a hash of the source, so two
//! sources with one file name do not collide, and only such generated names
//! are ever deleted.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::sync::OnceCell;

pub mod mirror;
pub use mirror::Expect;

/// How far a download has got; `bytes_total` is 0 when unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub source: String,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

impl Progress {
    /// None when the size is unknown: no percentage is invented.
    pub fn percent(&self) -> Option<u64> {
        (self.bytes_total > 0).then(|| self.bytes_done * 100 / self.bytes_total)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("no source given")]
    NoSource,
    #[error(
        "the weights are not on this node and the source says nothing about where to get them: {0}"
    )]
    NotLocal(String),
    #[error("no cache directory configured, so {0} cannot be fetched")]
    NoCache(String),
    #[error(
        "{0} names a repository, not a file; give the file as hf:org/repo/model.gguf, or use the repository id directly and let the engine download it"
    )]
    Repository(String),
    #[error("{src} is not a usable source: {why}")]
    BadSource { src: String, why: String },
    #[error("fetching {src}: {why}")]
    Fetch { src: String, why: String },
    #[error("{src}: the checksum is {found}, not {wanted}; the download was discarded")]
    Checksum {
        src: String,
        wanted: String,
        found: String,
    },
}

/// What a source is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Path(PathBuf),
    Remote(String),
    /// `mirror:<model>/<version>/<file>`: fetched from the fleet's mirror.
    Mirror(String),
    /// Left to the engine (`Qwen/Qwen2.5-7B-Instruct`).
    ModelId(String),
}

pub fn classify(source: &str) -> Result<Source, FetchError> {
    if source.is_empty() {
        return Err(FetchError::NoSource);
    }
    if source.starts_with("mirror:") {
        return Ok(Source::Mirror(source.to_owned()));
    }
    if ["hf:", "http://", "https://"]
        .iter()
        .any(|p| source.starts_with(p))
    {
        return Ok(Source::Remote(source.to_owned()));
    }
    if ["/", "./", "../"].iter().any(|p| source.starts_with(p)) {
        return Ok(Source::Path(PathBuf::from(source)));
    }
    Ok(Source::ModelId(source.to_owned()))
}

/// The download URL of a remote source.
pub fn resolve_url(source: &str) -> Result<String, FetchError> {
    if let Some(rest) = source.strip_prefix("hf:") {
        let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
        if parts.len() < 3 {
            return Err(FetchError::Repository(source.to_owned()));
        }
        return Ok(format!(
            "https://huggingface.co/{}/{}/resolve/main/{}",
            parts[0],
            parts[1],
            parts[2..].join("/")
        ));
    }
    reqwest::Url::parse(source)
        .map(|u| u.to_string())
        .map_err(|e| FetchError::BadSource {
            src: shown(source).into_owned(),
            why: e.to_string(),
        })
}

/// A source as logs, errors and replica reasons show it: its credentials
/// (a URL's user and password, a pre-signed URL's query, a fragment) left
/// out as `…`, since those reach the journal, the event log and the
/// operator's terminal.
pub fn shown(source: &str) -> std::borrow::Cow<'_, str> {
    let (path, tail) = match source.find(['?', '#']) {
        Some(i) => (&source[..i], true),
        None => (source, false),
    };
    let (scheme, rest) = match path.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, path),
    };
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let user = scheme.and(authority.rfind('@'));
    if !tail && user.is_none() {
        return source.into();
    }
    let mut out = String::with_capacity(source.len());
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    match user {
        Some(at) => {
            out.push_str("…@");
            out.push_str(&rest[at + 1..]);
        }
        None => out.push_str(rest),
    }
    if tail {
        out.push_str("?…");
    }
    out.into()
}

fn base_name(source: &str) -> &str {
    // Without the query: a file name is scanned as weights and reported,
    // and a signature would make it longer than a name may be.
    let path = source.split(['?', '#']).next().unwrap_or(source);
    let trimmed = path.trim_end_matches('/');
    let base = trimmed.rsplit('/').next().unwrap_or("");
    if base.is_empty() || base == "." {
        "weights"
    } else {
        base
    }
}

/// `dir/<16 hex of sha256(source)>-<base name>`: the cache name.
pub fn cache_path_for(dir: &Path, source: &str) -> PathBuf {
    let digest = Sha256::digest(source.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{hex}-{}", base_name(source)))
}

/// Whether a file name is one the cache generated (and so may be deleted).
pub fn owned(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let b = name.as_bytes();
    b.len() > 17
        && b[..16]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        && b[16] == b'-'
}

pub fn partial(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "part")
}

/// Cache files no wanted source needs: owned, complete, not wanted.
pub fn orphans(have: &[PathBuf], wanted: &[String]) -> Vec<PathBuf> {
    let keep: std::collections::BTreeSet<PathBuf> = wanted
        .iter()
        .filter(|w| matches!(classify(w), Ok(Source::Remote(_) | Source::Mirror(_))))
        .filter_map(|w| {
            cache_path_for(Path::new(""), w)
                .file_name()
                .map(PathBuf::from)
        })
        .collect();
    let mut out: Vec<PathBuf> = have
        .iter()
        .filter(|p| owned(p) && !partial(p))
        .filter(|p| p.file_name().is_none_or(|n| !keep.contains(Path::new(n))))
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Deletes cache files, checked again here whatever the control plane
/// asked: only generated names directly inside `cache_dir`. A missing file
/// counts as deleted. Returns each path with why it was not deleted.
pub fn remove_weights(cache_dir: Option<&Path>, paths: &[String]) -> Vec<(String, String)> {
    let mut refused = Vec::new();
    let Some(dir) = cache_dir.and_then(|d| d.canonicalize().ok()) else {
        return paths
            .iter()
            .map(|p| (p.clone(), "no cache directory is configured".into()))
            .collect();
    };
    for p in paths {
        let path = Path::new(p);
        let parent = path.parent().and_then(|d| d.canonicalize().ok());
        if parent.as_deref() != Some(dir.as_path()) {
            refused.push((p.clone(), format!("not inside {}", dir.display())));
            continue;
        }
        if !owned(path) || path.file_name().is_some_and(|n| n == "..") {
            refused.push((p.clone(), "not a name llmgw generated".into()));
            continue;
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => refused.push((p.clone(), e.to_string())),
        }
    }
    refused
}

type OnProgress = Arc<dyn Fn(Progress) + Send + Sync>;

/// The one download of a source, awaited by everyone who wants it.
type Flight = Arc<OnceCell<Result<PathBuf, FetchError>>>;

/// Fetches remote sources into one cache directory.
#[derive(Clone)]
pub struct Fetcher {
    cache_dir: Option<PathBuf>,
    client: reqwest::Client,
    inflight: Arc<Mutex<HashMap<String, Flight>>>,
    on_progress: Option<OnProgress>,
    report_every: Duration,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("cache_dir", &self.cache_dir)
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    pub fn new(cache_dir: Option<PathBuf>) -> Self {
        Fetcher {
            cache_dir,
            client: reqwest::Client::new(),
            inflight: Arc::default(),
            on_progress: None,
            report_every: Duration::from_secs(2),
        }
    }

    pub fn on_progress(mut self, f: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        self.on_progress = Some(Arc::new(f));
        self
    }

    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    /// Where the engine finds the weights of `source`, fetching them first
    /// when they are remote and not yet cached. `checksum` is
    /// `sha256:<hex>`.
    pub async fn ensure(&self, source: &str, checksum: Option<&str>) -> Result<String, FetchError> {
        self.ensure_from(source, checksum, None).await
    }

    /// As [`Fetcher::ensure`], with the mirror's byte path for `mirror:`
    /// sources (the control plane's `mirror.url`).
    pub async fn ensure_from(
        &self,
        source: &str,
        checksum: Option<&str>,
        mirror: Option<&str>,
    ) -> Result<String, FetchError> {
        match classify(source)? {
            Source::ModelId(id) => Ok(id),
            Source::Path(p) => match std::fs::metadata(&p) {
                Ok(_) => Ok(source.to_owned()),
                Err(_) => Err(FetchError::NotLocal(source.to_owned())),
            },
            Source::Remote(_) | Source::Mirror(_) => {
                let dir = self
                    .cache_dir
                    .clone()
                    .ok_or_else(|| FetchError::NoCache(source.to_owned()))?;
                let target = cache_path_for(&dir, source);
                if target.exists() {
                    return Ok(target.display().to_string());
                }
                // One download per source, however many shards want it.
                let cell = {
                    let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
                    inflight.entry(source.to_owned()).or_default().clone()
                };
                let result = cell
                    .get_or_init(|| async {
                        if target.exists() {
                            return Ok(target.clone());
                        }
                        let (url, expect) = match classify(source)? {
                            Source::Mirror(_) => {
                                mirror::locate(&self.client, mirror, source, checksum).await?
                            }
                            _ => (
                                resolve_url(source)?,
                                Expect {
                                    size: None,
                                    sha256: checksum.map(|c| {
                                        c.strip_prefix("sha256:").unwrap_or(c).to_lowercase()
                                    }),
                                    from: "the catalog",
                                },
                            ),
                        };
                        self.download(source, &url, &target, &expect)
                            .await
                            .map(|()| target.clone())
                    })
                    .await
                    .clone();
                self.inflight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(source);
                result.map(|p| p.display().to_string())
            }
        }
    }

    async fn download(
        &self,
        source: &str,
        url: &str,
        target: &Path,
        expect: &Expect,
    ) -> Result<(), FetchError> {
        let err = |why: String| FetchError::Fetch {
            src: shown(source).into_owned(),
            why,
        };
        if let Some(dir) = target.parent() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| err(format!("creating {}: {e}", dir.display())))?;
        }
        let part = PathBuf::from(format!("{}.part", target.display()));
        let mut existing = tokio::fs::metadata(&part).await.map_or(0, |m| m.len());
        let mut request = self.client.get(url);
        if existing > 0 {
            request = request.header(reqwest::header::RANGE, format!("bytes={existing}-"));
        }
        // reqwest's errors name the URL, query and all.
        let mut resp = request
            .send()
            .await
            .map_err(|e| err(e.without_url().to_string()))?;
        if resp.status() == reqwest::StatusCode::RANGE_NOT_SATISFIABLE {
            // The part is no prefix of what the server has: start over.
            let _ = tokio::fs::remove_file(&part).await;
            existing = 0;
            resp = self
                .client
                .get(url)
                .send()
                .await
                .map_err(|e| err(e.without_url().to_string()))?;
        }
        let append = match resp.status() {
            reqwest::StatusCode::OK => {
                existing = 0;
                false
            }
            reqwest::StatusCode::PARTIAL_CONTENT => {
                let starts = resp
                    .headers()
                    .get(reqwest::header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("bytes "))
                    .and_then(|v| v.split('-').next())
                    .and_then(|v| v.parse::<u64>().ok());
                if starts != Some(existing) {
                    return Err(err(format!(
                        "resumed at {starts:?}, not at byte {existing}"
                    )));
                }
                true
            }
            s => return Err(err(format!("answered {s}"))),
        };
        let length = resp.content_length();
        let total = length.map_or(0, |l| existing + l);
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&part)
            .await
            .map_err(|e| err(format!("opening {}: {e}", part.display())))?;
        let report = |done: u64| {
            if let Some(f) = &self.on_progress {
                f(Progress {
                    source: source.to_owned(),
                    bytes_done: done,
                    bytes_total: total,
                });
            }
        };
        let mut done = existing;
        report(done);
        let mut last = tokio::time::Instant::now();
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk =
                chunk.map_err(|e| err(format!("after {done} bytes: {}", e.without_url())))?;
            file.write_all(&chunk)
                .await
                .map_err(|e| err(format!("after {done} bytes: {e}")))?;
            done += chunk.len() as u64;
            if last.elapsed() >= self.report_every {
                report(done);
                last = tokio::time::Instant::now();
            }
        }
        file.flush().await.map_err(|e| err(e.to_string()))?;
        drop(file);
        if let Some(l) = length
            && done != existing + l
        {
            return Err(err(format!(
                "the body ended after {done} of {} bytes",
                existing + l
            )));
        }
        report(done);
        if let Some(size) = expect.size
            && size != done
        {
            // Longer than it should be, or a part that was no prefix of
            // this file: start again next time rather than resume.
            let _ = tokio::fs::remove_file(&part).await;
            return Err(err(format!(
                "{done} bytes arrived where {} says {size}; the download was discarded",
                expect.from
            )));
        }
        if let Some(want_hex) = &expect.sha256 {
            let found = sha256_file(&part)
                .await
                .map_err(|e| err(format!("reading {}: {e}", part.display())))?;
            if found != *want_hex {
                let _ = tokio::fs::remove_file(&part).await;
                return Err(FetchError::Checksum {
                    src: shown(source).into_owned(),
                    wanted: format!("sha256:{want_hex} ({})", expect.from),
                    found: format!("sha256:{found}"),
                });
            }
        }
        tokio::fs::rename(&part, target)
            .await
            .map_err(|e| err(format!("renaming into place: {e}")))?;
        tracing::info!(source = %shown(source), path = %target.display(), bytes = done, "weights fetched");
        Ok(())
    }
}

async fn sha256_file(path: &Path) -> std::io::Result<String> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut f = std::fs::File::open(path)?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 4 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
    })
    .await
    .map_err(std::io::Error::other)?
}
