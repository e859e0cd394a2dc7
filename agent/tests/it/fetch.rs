//! Weights: sources, the cache, fetching over real HTTP, and deletion that
//! only ever touches the cache's own files. The cases of the original
//! agent's tests, plus the cache-name vectors.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use llmgw_agent::fetch::{
    FetchError, Fetcher, Progress, Source, cache_path_for, classify, orphans, owned, partial,
    remove_weights, resolve_url,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the test server does with a request: the body, and how much of it
/// to send before hanging up (None: all of it).
#[derive(Clone)]
struct Serve {
    body: Vec<u8>,
    cut_after: Option<usize>,
}

/// An HTTP/1.1 server on a real socket that honours `Range`, counts
/// requests and records their Range headers.
async fn server(serve: Serve) -> (String, Arc<AtomicUsize>, Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let ranges = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (h, r) = (hits.clone(), ranges.clone());
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            let (serve, h, r) = (serve.clone(), h.clone(), r.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = sock.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                h.fetch_add(1, Ordering::SeqCst);
                let head = String::from_utf8_lossy(&buf).to_lowercase();
                let from = head
                    .lines()
                    .find_map(|l| l.strip_prefix("range: bytes="))
                    .and_then(|v| v.trim().trim_end_matches('-').parse::<usize>().ok());
                if let Some(f) = from {
                    r.lock().unwrap().push(format!("bytes={f}-"));
                }
                let (status, start) = match from {
                    Some(f) => ("206 Partial Content", f),
                    None => ("200 OK", 0),
                };
                let rest = &serve.body[start..];
                let mut head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
                    rest.len()
                );
                if from.is_some() {
                    head.push_str(&format!(
                        "Content-Range: bytes {start}-{}/{}\r\n",
                        serve.body.len() - 1,
                        serve.body.len()
                    ));
                }
                head.push_str("\r\n");
                sock.write_all(head.as_bytes()).await.unwrap();
                let send = serve.cut_after.map_or(rest.len(), |c| c.min(rest.len()));
                let _ = sock.write_all(&rest[..send]).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    (format!("http://{addr}"), hits, ranges)
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test]
async fn a_local_path_is_used_where_it_is_and_a_missing_one_says_so() {
    let cache = tempfile::tempdir().unwrap();
    let models = tempfile::tempdir().unwrap();
    let file = models.path().join("m.gguf");
    std::fs::write(&file, b"").unwrap();
    let f = Fetcher::new(Some(cache.path().to_owned()));
    let src = file.display().to_string();
    assert_eq!(f.ensure(&src, None).await.unwrap(), src);
    assert!(files(cache.path()).is_empty(), "never copied");
    let absent = models.path().join("absent.gguf").display().to_string();
    let e = f.ensure(&absent, None).await.unwrap_err();
    assert!(matches!(e, FetchError::NotLocal(_)));
    assert!(e.to_string().contains("absent.gguf"), "{e}");
    let e = f
        .ensure("/models/definitely-not-here.gguf", None)
        .await
        .unwrap_err();
    assert!(matches!(e, FetchError::NotLocal(_)));
    assert_eq!(f.ensure("", None).await.unwrap_err(), FetchError::NoSource);
}

#[tokio::test]
async fn a_bare_model_id_is_left_to_the_engine() {
    let f = Fetcher::new(None);
    for id in [
        "Qwen/Qwen2.5-7B-Instruct",
        "meta-llama/Llama-3.3-70B-Instruct",
    ] {
        assert_eq!(f.ensure(id, None).await.unwrap(), id);
    }
    assert_eq!(
        classify("s3://bucket/x").unwrap(),
        Source::ModelId("s3://bucket/x".into())
    );
    let e = f
        .ensure("https://example.com/m.gguf", None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cache directory"), "{e}");
}

#[tokio::test]
async fn a_remote_file_is_fetched_once_even_for_many_callers_and_reused() {
    let cache = tempfile::tempdir().unwrap();
    let (base, hits, _) = server(Serve {
        body: b"the weights".to_vec(),
        cut_after: None,
    })
    .await;
    let f = Fetcher::new(Some(cache.path().to_owned()));
    let src = format!("{base}/model.gguf");
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let (f, src) = (f.clone(), src.clone());
            tokio::spawn(async move { f.ensure(&src, None).await })
        })
        .collect();
    let mut paths = Vec::new();
    for c in calls {
        paths.push(c.await.unwrap().unwrap());
    }
    assert!(paths.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(std::fs::read(&paths[0]).unwrap(), b"the weights");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "one download for eight callers"
    );
    assert_eq!(f.ensure(&src, None).await.unwrap(), paths[0]);
    assert_eq!(hits.load(Ordering::SeqCst), 1, "present means no request");
    assert_eq!(PathBuf::from(&paths[0]), cache_path_for(cache.path(), &src));
}

#[tokio::test]
async fn a_partial_download_is_never_visible_as_the_model_and_resumes_later() {
    let cache = tempfile::tempdir().unwrap();
    let body: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    let (base, _, _) = server(Serve {
        body: body.clone(),
        cut_after: Some(1000),
    })
    .await;
    let src = format!("{base}/big.bin");
    let f = Fetcher::new(Some(cache.path().to_owned()));
    let e = f.ensure(&src, None).await.unwrap_err();
    assert!(matches!(e, FetchError::Fetch { .. }), "{e}");
    let left = files(cache.path());
    assert_eq!(left.len(), 1);
    assert!(
        left[0].ends_with(".part"),
        "only the part is there: {left:?}"
    );

    // A second server that sends everything; the part is resumed.
    let (base2, _, ranges) = server(Serve {
        body: body.clone(),
        cut_after: None,
    })
    .await;
    let part = PathBuf::from(format!(
        "{}.part",
        cache_path_for(cache.path(), &src).display()
    ));
    let src2 = format!("{base2}/big.bin");
    let part2 = PathBuf::from(format!(
        "{}.part",
        cache_path_for(cache.path(), &src2).display()
    ));
    std::fs::rename(&part, &part2).unwrap();
    let got = f.ensure(&src2, None).await.unwrap();
    assert_eq!(std::fs::read(got).unwrap(), body);
    assert_eq!(ranges.lock().unwrap().as_slice(), ["bytes=1000-"]);
}

#[tokio::test]
async fn progress_is_reported_with_a_percentage_and_a_checksum_is_verified() {
    let cache = tempfile::tempdir().unwrap();
    let body = vec![7u8; 8192];
    let (base, _, _) = server(Serve {
        body: body.clone(),
        cut_after: None,
    })
    .await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::<Progress>::new()));
    let s = seen.clone();
    let f =
        Fetcher::new(Some(cache.path().to_owned())).on_progress(move |p| s.lock().unwrap().push(p));
    let wrong = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let e = f
        .ensure(&format!("{base}/a.bin"), Some(wrong))
        .await
        .unwrap_err();
    assert!(matches!(e, FetchError::Checksum { .. }), "{e}");
    assert!(
        files(cache.path()).is_empty(),
        "a bad download is discarded"
    );
    let right = {
        use sha2::Digest;
        let d = sha2::Sha256::digest(&body);
        format!(
            "sha256:{}",
            d.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )
    };
    f.ensure(&format!("{base}/a.bin"), Some(&right))
        .await
        .unwrap();
    let last = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last.percent(), Some(100));
    assert_eq!(last.bytes_total, 8192);
    let unknown = Progress {
        source: "x".into(),
        bytes_done: 500,
        bytes_total: 0,
    };
    assert_eq!(unknown.percent(), None, "unknown rather than zero");
}

/// A pre-signed URL's query (its signature) stays out of the cache's file
/// name, which is scanned and reported as weights, and out of the error a
/// failed fetch gives (it becomes the replica's reason, in the log).
#[tokio::test]
async fn a_sources_query_reaches_no_file_name_and_no_error() {
    let cache = tempfile::tempdir().unwrap();
    let (base, _, _) = server(Serve {
        body: vec![1u8; 64],
        cut_after: None,
    })
    .await;
    let f = Fetcher::new(Some(cache.path().to_owned()));
    let signed = format!("{base}/w.gguf?X-Amz-Signature=SECRET123");
    f.ensure(&signed, None).await.unwrap();
    let names = files(cache.path());
    assert!(
        names.len() == 1 && names[0].ends_with("-w.gguf"),
        "{names:?}"
    );
    let wrong = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let other = format!("{base}/v.gguf?X-Amz-Signature=SECRET123");
    let e = f.ensure(&other, Some(wrong)).await.unwrap_err().to_string();
    assert!(e.contains("/v.gguf?…") && !e.contains("SECRET"), "{e}");
    let closed = "http://127.0.0.1:9/x.gguf?token=SECRET123";
    let e = f.ensure(closed, None).await.unwrap_err().to_string();
    assert!(!e.contains("SECRET"), "{e}");
    // A URL's user and password, and a fragment, likewise.
    let with_user = "http://me:SECRET123@127.0.0.1:9/x.gguf#SECRET123";
    let e = f.ensure(with_user, None).await.unwrap_err().to_string();
    assert!(
        !e.contains("SECRET") && e.contains("http://…@127.0.0.1:9/x.gguf?…"),
        "{e}"
    );
}

#[test]
fn hf_sources_resolve_to_their_download_url_or_explain_themselves() {
    assert_eq!(
        resolve_url("hf:Qwen/Qwen2.5-Coder-3B-Instruct-GGUF/qwen2.5-coder-3b-instruct-q4_k_m.gguf")
            .unwrap(),
        "https://huggingface.co/Qwen/Qwen2.5-Coder-3B-Instruct-GGUF/resolve/main/qwen2.5-coder-3b-instruct-q4_k_m.gguf"
    );
    let e = resolve_url("hf:Qwen/Qwen2.5-Coder-32B-Instruct")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.gguf") && e.contains("let the engine"),
        "{e}"
    );
}

#[test]
fn cache_names_hash_the_source_and_only_generated_names_are_owned() {
    let dir = Path::new("/cache");
    assert_eq!(
        cache_path_for(dir, "https://one.example/model.gguf"),
        dir.join("56682ad3639faabd-model.gguf")
    );
    assert_eq!(
        cache_path_for(dir, "https://two.example/model.gguf"),
        dir.join("2684e6a67d978bee-model.gguf")
    );
    assert_eq!(
        cache_path_for(dir, "https://x.example/")
            .file_name()
            .unwrap()
            .to_string_lossy()[17..],
        *"x.example",
        "a trailing slash is dropped"
    );
    assert!(owned(Path::new("/cache/56682ad3639faabd-model.gguf")));
    assert!(!owned(Path::new("/cache/model.gguf")));
    assert!(!owned(Path::new("/cache/56682AD3639FAABD-model.gguf")));
    assert!(partial(Path::new(
        "/cache/56682ad3639faabd-model.gguf.part"
    )));
    let have: Vec<PathBuf> = [
        "/cache/56682ad3639faabd-model.gguf",
        "/cache/2684e6a67d978bee-model.gguf",
        "/cache/2684e6a67d978bee-model.gguf.part",
        "/cache/operators-own.gguf",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let wanted = vec![
        "https://one.example/model.gguf".to_string(),
        "/cache/operators-own.gguf".into(),
    ];
    assert_eq!(
        orphans(&have, &wanted),
        vec![PathBuf::from("/cache/2684e6a67d978bee-model.gguf")]
    );
}

#[test]
fn remove_weights_deletes_only_generated_names_inside_the_cache() {
    let cache = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let mine = cache_path_for(cache.path(), "https://one.example/model.gguf");
    std::fs::write(&mine, b"x").unwrap();
    let operators = cache.path().join("copied-by-hand.gguf");
    std::fs::write(&operators, b"x").unwrap();
    let escape = outside.path().join("56682ad3639faabd-model.gguf");
    std::fs::write(&escape, b"x").unwrap();
    let sneaky = format!(
        "{}/../{}/56682ad3639faabd-model.gguf",
        cache.path().display(),
        outside.path().file_name().unwrap().to_string_lossy()
    );
    let gone = cache_path_for(cache.path(), "https://gone.example/m.gguf");
    let refused = remove_weights(
        Some(cache.path()),
        &[
            mine.display().to_string(),
            operators.display().to_string(),
            escape.display().to_string(),
            sneaky,
            gone.display().to_string(),
        ],
    );
    assert!(!mine.exists(), "its own file is deleted");
    assert!(operators.exists() && escape.exists(), "nothing else is");
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert!(refused[0].1.contains("not a name llmgw generated"));
    assert!(refused[1].1.contains("not inside"));
    let none = remove_weights(None, &[escape.display().to_string()]);
    assert!(none[0].1.contains("no cache directory"));
    assert!(escape.exists());
}

#[tokio::test]
async fn a_mirror_source_needs_the_mirror_and_names_model_version_and_file() {
    let cache = tempfile::tempdir().unwrap();
    let f = Fetcher::new(Some(cache.path().to_owned()));
    assert_eq!(
        classify("mirror:qwen/2026-03/q4.gguf").unwrap(),
        Source::Mirror("mirror:qwen/2026-03/q4.gguf".into())
    );
    let e = f
        .ensure_from("mirror:qwen/2026-03/q4.gguf", None, None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("names no mirror"), "{e}");
    for bad in ["mirror:qwen/q4.gguf", "mirror:qwen/../x/q4.gguf"] {
        let e = f
            .ensure_from(bad, None, Some("http://127.0.0.1:1"))
            .await
            .unwrap_err();
        assert!(matches!(e, FetchError::BadSource { .. }), "{bad}: {e}");
    }
    assert!(files(cache.path()).is_empty(), "nothing was fetched");
    // A cached mirror file is kept while the catalog names it.
    let src = "mirror:qwen/2026-03/q4.gguf".to_owned();
    let have = vec![cache_path_for(cache.path(), &src)];
    assert!(orphans(&have, std::slice::from_ref(&src)).is_empty());
    assert_eq!(orphans(&have, &[]), have);
}
