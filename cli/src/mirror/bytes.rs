//! The byte path: `GET /<model>/<version>/<file>` (with `Range`, so a
//! node's interrupted fetch resumes) and `GET /<model>/<version>`, the
//! version's manifest (every file's size and sha256), which is what a node
//! verifies its copy against. Read-only and unauthenticated by design:
//! nothing here writes, and a name that is not exactly a held file is 404,
//! never another file or another version.

use std::io::SeekFrom;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::store::Store;

pub(crate) fn router(store: Arc<Store>) -> Router {
    Router::new()
        .route("/{m}/{v}", get(manifest))
        .route("/{m}/{v}/", get(manifest))
        .route("/{m}/{v}/{f}", get(file))
        .fallback(|| async { (StatusCode::NOT_FOUND, "no such file\n") })
        .with_state(store)
}

async fn manifest(
    State(store): State<Arc<Store>>,
    Path((m, v)): Path<(String, String)>,
) -> Response {
    match store.held(&m, &v) {
        Some(files) => axum::Json(serde_json::json!({
            "model": m,
            "version": v,
            "files": files,
        }))
        .into_response(),
        None => (StatusCode::NOT_FOUND, "no such version\n").into_response(),
    }
}

/// A `Range` header's one range, as `(first, last)` inclusive; None for
/// no header, several ranges or anything unparsable (the whole file is
/// sent, as RFC 9110 allows), Some(Err) when it lies beyond the end.
fn range(headers: &HeaderMap, len: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = headers
        .get(header::RANGE)?
        .to_str()
        .ok()?
        .trim()
        .strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let r = if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        if n == 0 || len == 0 {
            return Some(Err(()));
        }
        (len.saturating_sub(n), len - 1)
    } else {
        let first: u64 = a.parse().ok()?;
        let last = if b.is_empty() {
            len.saturating_sub(1)
        } else {
            b.parse::<u64>().ok()?.min(len.saturating_sub(1))
        };
        if first >= len || last < first {
            return Some(Err(()));
        }
        (first, last)
    };
    Some(Ok(r))
}

async fn file(
    State(store): State<Arc<Store>>,
    Path((m, v, f)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some((path, len)) = store.held_file(&m, &v, &f) else {
        return (StatusCode::NOT_FOUND, "no such file\n").into_response();
    };
    let sha = store.manifest(&m, &v).and_then(|mf| {
        mf.files
            .into_iter()
            .find(|e| e.name == f && e.size == len)
            .and_then(|e| e.sha256)
    });
    let (status, first, last) = match range(&headers, len) {
        Some(Err(())) => {
            return (
                StatusCode::RANGE_NOT_SATISFIABLE,
                [(header::CONTENT_RANGE, format!("bytes */{len}"))],
            )
                .into_response();
        }
        Some(Ok((a, b))) => (StatusCode::PARTIAL_CONTENT, a, b),
        None => (StatusCode::OK, 0, len.saturating_sub(1)),
    };
    let count = if len == 0 { 0 } else { last - first + 1 };
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(_) => return (StatusCode::NOT_FOUND, "no such file\n").into_response(),
    };
    if first > 0 && file.seek(SeekFrom::Start(first)).await.is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let body = futures_util::stream::unfold((file, count), |(mut file, left)| async move {
        if left == 0 {
            return None;
        }
        let mut buf = vec![0u8; (256 * 1024).min(left as usize)];
        match file.read(&mut buf).await {
            Ok(0) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file shrank while it was read",
                )),
                (file, 0),
            )),
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), (file, left - n as u64)))
            }
            Err(e) => Some((Err(e), (file, 0))),
        }
    });
    let mut resp = Response::new(Body::from_stream(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(count));
    if status == StatusCode::PARTIAL_CONTENT
        && let Ok(v) = HeaderValue::from_str(&format!("bytes {first}-{last}/{len}"))
    {
        h.insert(header::CONTENT_RANGE, v);
    }
    if let Some(sum) = sha.and_then(|s| HeaderValue::from_str(&s).ok()) {
        h.insert("x-llmgw-sha256", sum);
    }
    resp
}
