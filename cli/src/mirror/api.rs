//! The management API: what the mirror holds, is fetching and failed to
//! fetch, fetching a version from its upstream, and deleting one. A second
//! request for a version being fetched joins that fetch (never a rival
//! writer on the same files); a failure's reason stays until the version
//! is fetched again or deleted; a version being fetched cannot be deleted.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::json;

use super::fetch::{Progress, fetch_version, file_name, locked_elsewhere, resolve};
use super::store::{Entry, Store, check_segments};

/// A fetch under way in this process.
#[derive(Debug)]
struct Job {
    sources: Vec<String>,
    progress: Arc<Progress>,
}

#[derive(Debug)]
pub(crate) struct Mirror {
    pub store: Arc<Store>,
    /// The byte path's address as nodes reach it.
    pub base: String,
    http: reqwest::Client,
    jobs: Mutex<HashMap<(String, String), Job>>,
}

impl Mirror {
    pub(crate) fn new(store: Arc<Store>, base: String) -> Self {
        Mirror {
            store,
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
            jobs: Mutex::default(),
        }
    }

    fn running(&self, m: &str, v: &str) -> Option<Entry> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let job = jobs.get(&(m.to_owned(), v.to_owned()))?;
        Some(Entry {
            model: m.to_owned(),
            version: v.to_owned(),
            state: "fetching",
            files: Vec::new(),
            sources: job.sources.clone(),
            bytes_done: Some(job.progress.done.load(Ordering::Relaxed)),
            bytes_total: Some(job.progress.total.load(Ordering::Relaxed)),
            reason: None,
        })
    }

    /// An entry with the URLs (and `mirror:` sources) of its files.
    fn view(&self, e: Entry) -> serde_json::Value {
        let mut v = serde_json::to_value(&e).unwrap_or_default();
        if let Some(files) = v.get_mut("files").and_then(|f| f.as_array_mut()) {
            for f in files {
                let name = f["name"].as_str().unwrap_or_default().to_owned();
                f["url"] = json!(format!("{}/{}/{}/{name}", self.base, e.model, e.version));
                f["source"] = json!(format!("mirror:{}/{}/{name}", e.model, e.version));
            }
        }
        v
    }

    fn entry(&self, m: &str, v: &str) -> Option<Entry> {
        if let Some(files) = self.store.held(m, v) {
            return Some(Entry {
                model: m.to_owned(),
                version: v.to_owned(),
                state: "present",
                sources: self
                    .store
                    .manifest(m, v)
                    .map(|mf| mf.sources)
                    .unwrap_or_default(),
                files,
                bytes_done: None,
                bytes_total: None,
                reason: None,
            });
        }
        self.store.arriving(m, v, &|m, v| self.running(m, v))
    }
}

pub(crate) fn router(mirror: Arc<Mirror>) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/models", get(list).post(add))
        .route("/v1/models/{m}/{v}", get(one).delete(remove))
        .with_state(mirror)
}

fn refuse(status: StatusCode, why: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": why.into()}))).into_response()
}

async fn health(State(mirror): State<Arc<Mirror>>) -> Response {
    match std::fs::read_dir(mirror.store.dir()) {
        Ok(_) => axum::Json(json!({"status": "ok"})).into_response(),
        Err(e) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot read {}: {e}", mirror.store.dir().display()),
        ),
    }
}

async fn list(State(mirror): State<Arc<Mirror>>) -> Response {
    let entries = mirror.store.list(&|m, v| mirror.running(m, v));
    let mut models: Vec<serde_json::Value> = Vec::new();
    for e in entries {
        models.push(mirror.view(e));
    }
    // Fetches of this process whose directory is not made yet.
    let jobs: Vec<(String, String)> = mirror
        .jobs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .keys()
        .cloned()
        .collect();
    for (m, v) in jobs {
        if !models.iter().any(|x| x["model"] == m && x["version"] == v)
            && let Some(e) = mirror.running(&m, &v)
        {
            models.push(mirror.view(e));
        }
    }
    axum::Json(json!({"base": mirror.base, "models": models})).into_response()
}

async fn one(State(mirror): State<Arc<Mirror>>, Path((m, v)): Path<(String, String)>) -> Response {
    if let Err(e) = check_segments(&[m.as_str(), v.as_str()]) {
        return refuse(StatusCode::BAD_REQUEST, e);
    }
    match mirror.entry(&m, &v) {
        Some(e) => axum::Json(mirror.view(e)).into_response(),
        None => refuse(StatusCode::NOT_FOUND, format!("the mirror has no {m}/{v}")),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddBody {
    /// One file, or `sources` for a version of several files.
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    sources: Vec<String>,
    model: String,
    version: String,
}

async fn add(State(mirror): State<Arc<Mirror>>, body: axum::extract::Json<AddBody>) -> Response {
    let AddBody {
        source,
        mut sources,
        model: m,
        version: v,
    } = body.0;
    sources.extend(source);
    if sources.is_empty() {
        return refuse(StatusCode::BAD_REQUEST, "give source (or sources)");
    }
    if let Err(e) = check_segments(&[m.as_str(), v.as_str()]) {
        return refuse(StatusCode::BAD_REQUEST, e);
    }
    let mut names = Vec::new();
    for s in &sources {
        match resolve(s).and_then(|u| file_name(&u)) {
            Ok(n) if names.contains(&n) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    format!("two sources are both named {n}"),
                );
            }
            Ok(n) => names.push(n),
            Err(e) => return refuse(StatusCode::BAD_REQUEST, e),
        }
    }
    let urls: Vec<String> = names
        .iter()
        .map(|n| format!("{}/{m}/{v}/{n}", mirror.base))
        .collect();
    let answer = |joined: bool| {
        (
            StatusCode::ACCEPTED,
            axum::Json(json!({
                "model": m,
                "version": v,
                "state": "fetching",
                "joined": joined,
                "url": urls[0],
                "urls": urls,
                "source": format!("mirror:{m}/{v}/{}", names[0]),
            })),
        )
            .into_response()
    };
    let progress = {
        let mut jobs = mirror.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let key = (m.clone(), v.clone());
        if let Some(job) = jobs.get(&key) {
            return if job.sources == sources {
                answer(true)
            } else {
                refuse(
                    StatusCode::CONFLICT,
                    format!(
                        "{m}/{v} is being fetched from {}; wait for it, or use another version",
                        job.sources.join(", ")
                    ),
                )
            };
        }
        if mirror.store.held(&m, &v).is_some() {
            return refuse(
                StatusCode::CONFLICT,
                format!(
                    "{m}/{v} is already held and is never overwritten: add a new version beside it"
                ),
            );
        }
        if locked_elsewhere(&mirror.store.lock_path(&m, &v)) {
            return refuse(
                StatusCode::CONFLICT,
                format!("{m}/{v} is being fetched by another process"),
            );
        }
        let progress = Arc::new(Progress::default());
        jobs.insert(
            key,
            Job {
                sources: sources.clone(),
                progress: progress.clone(),
            },
        );
        progress
    };
    let worker = mirror.clone();
    let (wm, wv, ws) = (m.clone(), v.clone(), sources.clone());
    tokio::spawn(async move {
        let _ = fetch_version(&worker.store, &worker.http, &wm, &wv, &ws, &progress).await;
        // The disk now says present or failed.
        worker
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(wm, wv));
    });
    answer(false)
}

async fn remove(
    State(mirror): State<Arc<Mirror>>,
    Path((m, v)): Path<(String, String)>,
) -> Response {
    if let Err(e) = check_segments(&[m.as_str(), v.as_str()]) {
        return refuse(StatusCode::BAD_REQUEST, e);
    }
    // Held under the jobs lock, so no fetch of it starts meanwhile.
    let jobs = mirror.jobs.lock().unwrap_or_else(|p| p.into_inner());
    if jobs.contains_key(&(m.clone(), v.clone()))
        || locked_elsewhere(&mirror.store.lock_path(&m, &v))
    {
        return refuse(
            StatusCode::CONFLICT,
            format!("{m}/{v} is being fetched; delete it once the fetch has ended"),
        );
    }
    match mirror.store.remove_version(&m, &v) {
        Ok(true) => {
            tracing::info!(model = %m, version = %v, "mirror version deleted");
            axum::Json(json!({"removed": format!("{m}/{v}")})).into_response()
        }
        Ok(false) => refuse(StatusCode::NOT_FOUND, format!("the mirror has no {m}/{v}")),
        Err(e) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("removing {m}/{v}: {e}"),
        ),
    }
}
