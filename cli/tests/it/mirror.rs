//! `llmgw mirror`: the byte path, the management API, the operator's
//! commands, and agents fetching `mirror:` sources from it. Upstreams are
//! HTTP servers in the test (a Hugging Face-shaped one publishes sizes
//! and sha256 the way the Hub's tree API does); nothing reaches the
//! internet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Child;
use super::cluster::{
    EngineSweeper, ctl, free_port, get, ready_replicas, server_yaml, start_server, until,
};

fn sha(b: &[u8]) -> String {
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i % 251) as u8 ^ seed.wrapping_mul(31))
        .collect()
}

/// A file the upstream serves; `gated` ones send their first half, then
/// wait for the gate to open before the rest.
#[derive(Clone)]
struct Upstream {
    files: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    /// What the tree API publishes: path → (size, sha256).
    published: Arc<Mutex<HashMap<String, Value>>>,
    gate: Arc<tokio::sync::watch::Sender<bool>>,
    gated: Arc<Mutex<Vec<String>>>,
    /// Paths whose next answer stops halfway through the body.
    cut_once: Arc<Mutex<Vec<String>>>,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    /// Each request's path and Range header, in order.
    asked: Arc<Mutex<Vec<String>>>,
    base: String,
}

impl Upstream {
    async fn start() -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let up = Upstream {
            files: Arc::default(),
            published: Arc::default(),
            gate: Arc::new(tokio::sync::watch::channel(false).0),
            gated: Arc::default(),
            cut_once: Arc::default(),
            hits: Arc::default(),
            asked: Arc::default(),
            base,
        };
        let me = up.clone();
        tokio::spawn(async move {
            loop {
                let (sock, _) = listener.accept().await.unwrap();
                tokio::spawn(me.clone().answer(sock));
            }
        });
        up
    }

    /// A file under an HF-shaped URL (`/org/repo/resolve/rev/NAME`); with
    /// `publish`, the tree API lists it with the given sha256.
    fn hf(&self, name: &str, body: &[u8], publish: Option<&str>) -> String {
        let path = format!("/org/repo/resolve/rev1/{name}");
        self.files
            .lock()
            .unwrap()
            .insert(path.clone(), body.to_vec());
        if let Some(sum) = publish {
            self.published.lock().unwrap().insert(
                name.to_owned(),
                json!({"type": "file", "path": name, "size": body.len(),
                       "lfs": {"oid": sum, "size": body.len()}}),
            );
        }
        format!("{}{path}", self.base)
    }

    fn gate(&self, url: &str) {
        let path = url.trim_start_matches(&self.base).to_owned();
        self.gated.lock().unwrap().push(path);
    }

    fn cut_once(&self, url: &str) {
        let path = url.trim_start_matches(&self.base).to_owned();
        self.cut_once.lock().unwrap().push(path);
    }

    fn asked(&self, url: &str) -> Vec<String> {
        let path = url.trim_start_matches(&self.base);
        let asked = self.asked.lock().unwrap();
        asked
            .iter()
            .filter_map(|a| a.strip_prefix(path).map(|r| r.trim().to_owned()))
            .collect()
    }

    fn open(&self) {
        self.gate.send_replace(true);
    }

    fn hits(&self, url: &str) -> usize {
        let path = url.trim_start_matches(&self.base);
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    async fn answer(self, mut sock: tokio::net::TcpStream) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let head = String::from_utf8_lossy(&buf).into_owned();
        let path = head
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        *self.hits.lock().unwrap().entry(path.clone()).or_default() += 1;
        let from = head
            .lines()
            .find_map(|l| {
                l.to_lowercase()
                    .strip_prefix("range: bytes=")
                    .map(str::to_owned)
            })
            .and_then(|r| r.trim().trim_end_matches('-').parse::<usize>().ok());
        self.asked.lock().unwrap().push(format!(
            "{path} {}",
            from.map(|f| format!("bytes={f}-")).unwrap_or_default()
        ));
        let send = |status: &str, body: &[u8]| {
            format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
        };
        if path == "/api/models/org/repo/tree/rev1" {
            let listed: Vec<Value> = self.published.lock().unwrap().values().cloned().collect();
            let body = serde_json::to_vec(&listed).unwrap();
            let _ = sock.write_all(send("200 OK", &body).as_bytes()).await;
            let _ = sock.write_all(&body).await;
            return;
        }
        let body = self.files.lock().unwrap().get(&path).cloned();
        let Some(body) = body else {
            let _ = sock.write_all(send("404 Not Found", b"").as_bytes()).await;
            return;
        };
        if let Some(f) = from.filter(|f| *f < body.len()) {
            let rest = &body[f..];
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {f}-{}/{}\r\nConnection: close\r\n\r\n",
                rest.len(),
                body.len() - 1,
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(rest).await;
            let _ = sock.shutdown().await;
            return;
        }
        let _ = sock.write_all(send("200 OK", &body).as_bytes()).await;
        let cut = {
            let mut once = self.cut_once.lock().unwrap();
            let at = once.iter().position(|p| *p == path);
            at.map(|i| once.remove(i)).is_some()
        };
        if cut {
            let _ = sock.write_all(&body[..body.len() / 2]).await;
            let _ = sock.shutdown().await;
            return;
        }
        if self.gated.lock().unwrap().contains(&path) {
            let half = body.len() / 2;
            let _ = sock.write_all(&body[..half]).await;
            let _ = sock.flush().await;
            let mut open = self.gate.subscribe();
            let _ = open.wait_for(|o| *o).await;
            let _ = sock.write_all(&body[half..]).await;
        } else {
            let _ = sock.write_all(&body).await;
        }
        let _ = sock.shutdown().await;
    }
}

pub(crate) struct Mirror {
    pub(crate) _child: Child,
    /// The byte path (also its --base).
    pub(crate) bytes: String,
    pub(crate) api: String,
}

pub(crate) fn start_mirror(dir: &std::path::Path, extra: &[&str]) -> Mirror {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec![
        "mirror",
        "serve",
        "--dir",
        dir.to_str().unwrap(),
        "--base",
        &base,
        "--listen",
        &listen,
        "--api-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let child = Child::spawn(&args);
    let bytes = format!("http://{}", child.addr_after("mirror listening on "));
    let api = child.addr_after("mirror api listening on ");
    assert_eq!(bytes, base);
    Mirror {
        _child: child,
        bytes,
        api: format!("http://{api}"),
    }
}

async fn post(url: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn state(api: &str, m: &str, v: &str) -> (u16, Value) {
    let r = reqwest::get(format!("{api}/v1/models/{m}/{v}"))
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Sends `request` as raw bytes (so no client tidies the path) and
/// returns the whole answer.
async fn raw(addr: &str, request: &str) -> String {
    let mut sock = tokio::net::TcpStream::connect(addr.trim_start_matches("http://"))
        .await
        .unwrap();
    sock.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = sock.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_path_serves_ranges_and_nothing_outside_its_tree() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("models");
    let version = dir.join("m").join("v1");
    std::fs::create_dir_all(&version).unwrap();
    let body = pattern(1000, 1);
    std::fs::write(version.join("f.bin"), &body).unwrap();
    std::fs::write(root.path().join("secret.txt"), "the-secret-outside").unwrap();
    std::os::unix::fs::symlink(root.path().join("secret.txt"), version.join("link")).unwrap();
    let mirror = start_mirror(&dir, &[]);
    let url = format!("{}/m/v1/f.bin", mirror.bytes);
    let client = reqwest::Client::new();
    let whole = client.get(&url).send().await.unwrap();
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.headers()["accept-ranges"], "bytes");
    assert_eq!(whole.bytes().await.unwrap().as_ref(), body.as_slice());
    for (range, from, to) in [
        ("bytes=100-199", 100, 199),
        ("bytes=900-", 900, 999),
        ("bytes=-10", 990, 999),
        ("bytes=990-5000", 990, 999),
    ] {
        let r = client
            .get(&url)
            .header("range", range)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 206, "{range}");
        assert_eq!(
            r.headers()["content-range"],
            format!("bytes {from}-{to}/1000").as_str()
        );
        assert_eq!(r.bytes().await.unwrap().as_ref(), &body[from..=to]);
    }
    let beyond = client
        .get(&url)
        .header("range", "bytes=1000-")
        .send()
        .await
        .unwrap();
    assert_eq!(beyond.status(), 416);
    assert_eq!(beyond.headers()["content-range"], "bytes */1000");
    // The version's manifest: what a node checks its copy against.
    let manifest = get(format!("{}/m/v1", mirror.bytes)).await;
    assert_eq!(manifest["files"], json!([{"name": "f.bin", "size": 1000}]));

    // Nothing outside the tree, no link followed, no other version or
    // file in place of the one asked for, and nothing written.
    let addr = mirror.bytes.clone();
    for path in [
        "/../secret.txt",
        "/m/../../secret.txt",
        "/%2e%2e/%2e%2e/secret.txt",
        "/m/v1/..%2f..%2f..%2fsecret.txt",
        "/m/%2e%2e/..%2fsecret.txt",
        "/m/v1/link",
        "/m/v2/f.bin",
        "/m/v1/F.BIN",
        "/m/v1/.llmgw-manifest.json",
    ] {
        let answer = raw(
            &addr,
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
        .await;
        let status = answer.split_whitespace().nth(1).unwrap_or_default();
        assert!(
            status == "404" || status == "400",
            "{path}: {}",
            answer.lines().next().unwrap_or_default()
        );
        assert!(!answer.contains("the-secret-outside"), "{path}");
    }
    for method in ["PUT", "POST", "DELETE"] {
        let r = client
            .request(method.parse().unwrap(), &url)
            .body("other weights")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "{method}");
    }
    assert_eq!(std::fs::read(version.join("f.bin")).unwrap(), body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_is_listed_arriving_with_its_progress_then_held() {
    let up = Upstream::start().await;
    let body = pattern(256 * 1024, 2);
    let source = up.hf("model.gguf", &body, Some(&sha(&body)));
    up.gate(&source);
    let dir = tempfile::tempdir().unwrap();
    let mirror = start_mirror(dir.path(), &[]);
    let (status, answer) = post(
        &format!("{}/v1/models", mirror.api),
        json!({"source": source, "model": "qwen", "version": "2026-03"}),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        answer["url"],
        format!("{}/qwen/2026-03/model.gguf", mirror.bytes)
    );
    assert_eq!(answer["source"], "mirror:qwen/2026-03/model.gguf");
    let arriving = until("half the file has arrived", || async {
        let (_, s) = state(&mirror.api, "qwen", "2026-03").await;
        (s["state"] == "fetching" && s["bytes_done"].as_u64() >= Some(128 * 1024)).then_some(s)
    })
    .await;
    assert_eq!(
        arriving["bytes_total"],
        256 * 1024,
        "from the upstream's index"
    );
    let listed = get(format!("{}/v1/models", mirror.api)).await;
    assert_eq!(listed["base"], mirror.bytes);
    assert_eq!(listed["models"][0]["state"], "fetching");
    // Not served until whole.
    let early = reqwest::get(format!("{}/qwen/2026-03/model.gguf", mirror.bytes))
        .await
        .unwrap();
    assert_eq!(early.status(), 404);

    up.open();
    let held = until("the version is held", || async {
        let (_, s) = state(&mirror.api, "qwen", "2026-03").await;
        (s["state"] == "present").then_some(s)
    })
    .await;
    assert_eq!(held["files"][0]["sha256"], sha(&body));
    assert_eq!(held["files"][0]["size"], body.len());
    assert_eq!(held["files"][0]["source"], "mirror:qwen/2026-03/model.gguf");
    let served = reqwest::get(format!("{}/qwen/2026-03/model.gguf", mirror.bytes))
        .await
        .unwrap();
    assert_eq!(served.headers()["x-llmgw-sha256"], sha(&body).as_str());
    assert_eq!(served.bytes().await.unwrap().as_ref(), body.as_slice());
    // A held version is never overwritten.
    let (again, why) = post(
        &format!("{}/v1/models", mirror.api),
        json!({"source": source, "model": "qwen", "version": "2026-03"}),
    )
    .await;
    assert_eq!(again, 409, "{why}");
    assert!(why["error"].as_str().unwrap().contains("never overwritten"));
    let health = get(format!("{}/v1/health", mirror.api)).await;
    assert_eq!(health["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_request_for_a_version_joins_the_fetch_under_way() {
    let up = Upstream::start().await;
    let body = pattern(64 * 1024, 3);
    let source = up.hf("w.safetensors", &body, None);
    up.gate(&source);
    let dir = tempfile::tempdir().unwrap();
    let mirror = start_mirror(dir.path(), &[]);
    let ask = json!({"source": source, "model": "emb", "version": "v1"});
    let models = format!("{}/v1/models", mirror.api);
    let (first, a) = post(&models, ask.clone()).await;
    assert_eq!((first, a["joined"].clone()), (202, json!(false)));
    until("the fetch is under way", || async {
        (up.hits(&source) == 1).then_some(())
    })
    .await;
    let (second, b) = post(&models, ask.clone()).await;
    assert_eq!((second, b["joined"].clone()), (202, json!(true)), "{b}");
    assert_eq!(a["url"], b["url"]);
    // Another source for the same version is a rival writer: refused.
    let other = up.hf("other.safetensors", &body, None);
    let (rival, why) = post(
        &models,
        json!({"source": other, "model": "emb", "version": "v1"}),
    )
    .await;
    assert_eq!(rival, 409, "{why}");
    // Requests that could never be fetched are refused at once.
    for bad in [
        json!({"sources": [&source, &source], "model": "x", "version": "v1"}),
        json!({"source": "ftp://example/x.gguf", "model": "x", "version": "v1"}),
        json!({"source": &source, "model": "../x", "version": "v1"}),
        json!({"source": "hf:org/repo", "model": "x", "version": "v1"}),
    ] {
        let (status, why) = post(&models, bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {why}");
    }
    up.open();
    until("the version is held", || async {
        let (_, s) = state(&mirror.api, "emb", "v1").await;
        (s["state"] == "present").then_some(())
    })
    .await;
    assert_eq!(up.hits(&source), 1, "one download for both requests");
    assert_eq!(up.hits(&other), 0);
    assert_eq!(
        std::fs::read(dir.path().join("emb/v1/w.safetensors")).unwrap(),
        body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fetch_keeps_its_reason_until_fetched_again() {
    let up = Upstream::start().await;
    let body = pattern(32 * 1024, 4);
    // The upstream publishes a sha256 the bytes do not have.
    let lying = up.hf("bad.gguf", &body, Some(&"0".repeat(64)));
    let missing = format!("{}/org/repo/resolve/rev1/absent.gguf", up.base);
    let dir = tempfile::tempdir().unwrap();
    let mirror = start_mirror(dir.path(), &[]);
    let models = format!("{}/v1/models", mirror.api);
    post(
        &models,
        json!({"source": missing, "model": "a", "version": "v1"}),
    )
    .await;
    post(
        &models,
        json!({"source": lying, "model": "b", "version": "v1"}),
    )
    .await;
    let failed = |m: &'static str| {
        let api = mirror.api.clone();
        async move {
            until("the fetch fails", || async {
                let (_, s) = state(&api, m, "v1").await;
                (s["state"] == "failed").then(|| s["reason"].as_str().unwrap().to_owned())
            })
            .await
        }
    };
    let a = failed("a").await;
    assert!(a.contains("404"), "{a}");
    let b = failed("b").await;
    assert!(b.contains("sha256") && b.contains("discarded"), "{b}");
    assert!(!dir.path().join("b/v1/bad.gguf").exists());
    // Still there for whoever looks later, a restarted mirror included.
    drop(mirror);
    let mirror = start_mirror(dir.path(), &[]);
    let listed = get(format!("{}/v1/models", mirror.api)).await;
    let reasons: Vec<(&str, &str)> = listed["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["state"].as_str().unwrap_or_default(),
                e["reason"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        vec![("failed", a.as_str()), ("failed", b.as_str())]
    );
    // Fetched again from a good source, the reason goes.
    let good = up.hf("good.gguf", &body, Some(&sha(&body)));
    let (status, _) = post(
        &format!("{}/v1/models", mirror.api),
        json!({"source": good, "model": "a", "version": "v1"}),
    )
    .await;
    assert_eq!(status, 202);
    let held = until("the retry is held", || async {
        let (_, s) = state(&mirror.api, "a", "v1").await;
        (s["state"] == "present").then_some(s)
    })
    .await;
    assert!(held.get("reason").is_none(), "{held}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_fetch_resumes_when_asked_again_and_another_source_starts_over() {
    let up = Upstream::start().await;
    let body = pattern(128 * 1024, 9);
    let source = up.hf("big.gguf", &body, Some(&sha(&body)));
    up.cut_once(&source);
    let dir = tempfile::tempdir().unwrap();
    let mirror = start_mirror(dir.path(), &[]);
    let models = format!("{}/v1/models", mirror.api);
    let ask = json!({"source": source, "model": "m", "version": "v1"});
    let wait = |state: &'static str| {
        let api = mirror.api.clone();
        async move {
            until(state, || async {
                let (_, s) = self::state(&api, "m", "v1").await;
                (s["state"] == state).then_some(s)
            })
            .await
        }
    };
    assert_eq!(post(&models, ask.clone()).await.0, 202);
    let failed = wait("failed").await;
    let kept = failed["bytes_done"].as_u64().unwrap();
    assert!(kept > 0 && kept < body.len() as u64, "{failed}");
    // The host's own view says the same, read from the directory.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["mirror", "list", "--dir", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("m "))
        .unwrap_or_default();
    assert!(
        row.contains("failed") && row.contains(&format!(" {kept} ")) && row.contains("big.gguf"),
        "{table}"
    );
    assert_eq!(post(&models, ask.clone()).await.0, 202);
    let held = wait("present").await;
    assert_eq!(held["files"][0]["sha256"], sha(&body));
    assert_eq!(
        up.asked(&source),
        vec![String::new(), format!("bytes={kept}-")]
    );

    // The partial file of one source is never continued from another.
    let other = pattern(128 * 1024, 10);
    let (a, b) = (
        up.hf("same.gguf", &body, Some(&sha(&body))),
        format!("{}/org/repo/resolve/rev2/same.gguf", up.base),
    );
    up.files
        .lock()
        .unwrap()
        .insert("/org/repo/resolve/rev2/same.gguf".into(), other.clone());
    up.cut_once(&a);
    let ask = |src: &str| json!({"source": src, "model": "n", "version": "v1"});
    assert_eq!(post(&models, ask(&a)).await.0, 202);
    until("the cut fetch fails", || async {
        let (_, s) = state(&mirror.api, "n", "v1").await;
        (s["state"] == "failed").then_some(())
    })
    .await;
    assert_eq!(post(&models, ask(&b)).await.0, 202);
    until("the other source is held", || async {
        let (_, s) = state(&mirror.api, "n", "v1").await;
        (s["state"] == "present").then_some(())
    })
    .await;
    assert_eq!(up.asked(&b), vec![String::new()], "from the start");
    assert_eq!(
        std::fs::read(dir.path().join("n/v1/same.gguf")).unwrap(),
        other
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_being_fetched_cannot_be_deleted() {
    let up = Upstream::start().await;
    let body = pattern(64 * 1024, 5);
    let source = up.hf("m.gguf", &body, None);
    up.gate(&source);
    let dir = tempfile::tempdir().unwrap();
    let mirror = start_mirror(dir.path(), &[]);
    post(
        &format!("{}/v1/models", mirror.api),
        json!({"source": source, "model": "m", "version": "v1"}),
    )
    .await;
    until("the fetch is under way", || async {
        (up.hits(&source) == 1).then_some(())
    })
    .await;
    let client = reqwest::Client::new();
    let version = format!("{}/v1/models/m/v1", mirror.api);
    let refused = client.delete(&version).send().await.unwrap();
    assert_eq!(refused.status(), 409);
    let why: Value = refused.json().await.unwrap();
    assert!(why["error"].as_str().unwrap().contains("being fetched"));
    up.open();
    until("the version is held", || async {
        let (_, s) = state(&mirror.api, "m", "v1").await;
        (s["state"] == "present").then_some(())
    })
    .await;
    let removed = client.delete(&version).send().await.unwrap();
    assert_eq!(removed.status(), 200);
    assert_eq!(state(&mirror.api, "m", "v1").await.0, 404);
    let gone = reqwest::get(format!("{}/m/v1/m.gguf", mirror.bytes))
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);
    assert_eq!(client.delete(&version).send().await.unwrap().status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_requires_a_client_certificate_from_the_ca_when_given_one() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let rogue = dir.path().join("rogue");
    let llmgw = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (p, r) = (pki.to_str().unwrap(), rogue.to_str().unwrap());
    llmgw(&["ctl", "cert", "init-ca", "--dir", p]);
    llmgw(&[
        "ctl",
        "cert",
        "issue-server",
        "mirror",
        "--host",
        "127.0.0.1",
        "--dir",
        p,
    ]);
    llmgw(&["ctl", "cert", "issue-client", "control-plane", "--dir", p]);
    llmgw(&["ctl", "cert", "init-ca", "--dir", r]);
    llmgw(&["ctl", "cert", "issue-client", "control-plane", "--dir", r]);
    let models = dir.path().join("models");
    let (ca, cert, key) = (
        pki.join("ca.pem"),
        pki.join("mirror.pem"),
        pki.join("mirror-key.pem"),
    );
    let mirror = start_mirror(
        &models,
        &[
            "--tls-ca",
            ca.to_str().unwrap(),
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let api = mirror.api.replace("http://", "https://");
    let ca_cert = reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap();
    let client = |identity: Option<&std::path::Path>| {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .add_root_certificate(ca_cert.clone());
        if let Some(d) = identity {
            let mut pem = std::fs::read(d.join("control-plane.pem")).unwrap();
            pem.extend(std::fs::read(d.join("control-plane-key.pem")).unwrap());
            b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        b.build().unwrap()
    };
    let none = client(None).get(format!("{api}/v1/models")).send().await;
    assert!(none.is_err(), "no certificate, no answer: {none:?}");
    let wrong = client(Some(&rogue))
        .get(format!("{api}/v1/models"))
        .send()
        .await;
    assert!(wrong.is_err(), "another CA's certificate: {wrong:?}");
    let plain = reqwest::get(format!("{}/v1/models", mirror.api)).await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
    let ok = client(Some(&pki))
        .get(format!("{api}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    // The byte path stays plain and open: agents fetch without a
    // certificate.
    let bytes = reqwest::get(format!("{}/nothing/here/x", mirror.bytes))
        .await
        .unwrap();
    assert_eq!(bytes.status(), 404);
}

/// A proxy in front of the mirror's byte path that cuts the first answer
/// for `cut` halfway through its body; records each request's path and
/// Range header.
async fn cutting_proxy(target: String, cut: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let cuts = Arc::new(AtomicUsize::new(0));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            let (target, log, cuts) = (target.clone(), log.clone(), cuts.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).into_owned();
                let path = head
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
                let range = head
                    .lines()
                    .find_map(|l| {
                        l.to_lowercase()
                            .strip_prefix("range:")
                            .map(|v| v.trim().to_owned())
                    })
                    .unwrap_or_default();
                log.lock()
                    .unwrap()
                    .push(format!("{path} {range}").trim().to_owned());
                // One request per connection, each way.
                let forwarded: String = head
                    .trim_end()
                    .lines()
                    .filter(|l| !l.to_lowercase().starts_with("connection:"))
                    .map(|l| format!("{l}\r\n"))
                    .collect::<String>()
                    + "Connection: close\r\n\r\n";
                let mut up = tokio::net::TcpStream::connect(target.trim_start_matches("http://"))
                    .await
                    .unwrap();
                up.write_all(forwarded.as_bytes()).await.unwrap();
                let mut answer = Vec::new();
                up.read_to_end(&mut answer).await.unwrap();
                let split = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                let (head, body) = answer.split_at(split);
                let head =
                    String::from_utf8_lossy(head).replacen("\r\n", "\r\nConnection: close\r\n", 1);
                let cut_now =
                    path == cut && range.is_empty() && cuts.fetch_add(1, Ordering::SeqCst) == 0;
                let _ = sock.write_all(head.as_bytes()).await;
                let send = if cut_now { body.len() / 2 } else { body.len() };
                let _ = sock.write_all(&body[..send]).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_fetches_a_mirror_source_resuming_and_refusing_a_corrupt_copy() {
    let sweep = EngineSweeper("127.0.61.".into());
    let up = Upstream::start().await;
    let body = pattern(512 * 1024, 6);
    let source = up.hf("tiny.gguf", &body, Some(&sha(&body)));
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let add = |version: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args([
                "mirror",
                "add",
                "--dir",
                models.to_str().unwrap(),
                "--model",
                "tiny",
                "--version",
                version,
                &source,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let printed = add("v1");
    assert!(printed.contains(&sha(&body)), "{printed}");
    assert!(printed.contains("mirror:tiny/v1/tiny.gguf"), "{printed}");
    add("v2");
    let mirror = start_mirror(&models, &[]);
    let (proxy, seen) = cutting_proxy(mirror.bytes.clone(), "/tiny/v1/tiny.gguf").await;

    let cache = dir.path().join("cache");
    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let port = free_port();
    let config = server_yaml(dir.path(), "mirrored", &store, port, 0);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("mirror:\n  url: {proxy}\n"));
    std::fs::write(&config, text).unwrap();
    let server = start_server(&config);
    let _agent = Child::spawn(&[
        "agent",
        "run",
        "--server",
        &format!("http://127.0.0.1:{port}"),
        "--node-id",
        "a",
        "--mgmt-addr",
        "127.0.61.2",
        "--engine-bind",
        "127.0.61.2",
        "--heartbeat-s",
        "0.2",
        "--skip-gpus",
        "--work-dir",
        dir.path().join("work").to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    until("the node", || async {
        let nodes = get(format!("{}/api/v1/nodes", server.admin)).await;
        (nodes.as_array().unwrap().len() == 1).then_some(())
    })
    .await;
    let model = dir.path().join("m.json");
    let add_model = |name: &str, source: &str| {
        std::fs::write(
            &model,
            json!({"name": name, "source": source, "scaling": {"min": 1, "max": 1},
                   "profiles": [{"name": "sim", "engine": "sim"}]})
            .to_string(),
        )
        .unwrap();
        let (ok, _, err) = ctl(&server.admin, &["model", "add", model.to_str().unwrap()]);
        assert!(ok, "{err}");
    };
    add_model("good", "mirror:tiny/v1/tiny.gguf");
    until("the replica is ready once its weights are in", || async {
        let rows = get(format!("{}/api/v1/replicas", server.admin)).await;
        ready_replicas(&rows)
            .iter()
            .any(|r| r["model"] == "good")
            .then_some(())
    })
    .await;
    let asked: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("/tiny/v1/tiny.gguf"))
        .cloned()
        .collect();
    assert_eq!(asked.len(), 2, "cut once, then resumed: {asked:?}");
    let resumed_at: u64 = asked[1]
        .strip_prefix("/tiny/v1/tiny.gguf bytes=")
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the second request resumes: {asked:?}"));
    assert!(
        resumed_at > 0 && resumed_at < body.len() as u64,
        "{asked:?}"
    );
    let cached = cache.join(llmgw_domain::placement::cache_name(
        "mirror:tiny/v1/tiny.gguf",
    ));
    assert_eq!(std::fs::read(&cached).unwrap(), body);

    // A copy corrupted on the mirror is refused by the node.
    let mut bad = body.clone();
    bad[1000] ^= 0xff;
    std::fs::write(models.join("tiny/v2/tiny.gguf"), &bad).unwrap();
    add_model("bad", "mirror:tiny/v2/tiny.gguf");
    let err = until("the corrupt copy is refused", || async {
        let rows = get(format!("{}/api/v1/replicas?all=true", server.admin)).await;
        rows.as_array().unwrap().iter().find_map(|r| {
            (r["model"] == "bad")
                .then(|| r["shards"][0]["error"].as_str().map(str::to_owned))
                .flatten()
        })
    })
    .await;
    assert!(err.contains("checksum") && err.contains("mirror"), "{err}");
    let bad_cached = cache.join(llmgw_domain::placement::cache_name(
        "mirror:tiny/v2/tiny.gguf",
    ));
    assert!(!bad_cached.exists());
    drop(sweep);
}

/// A server whose catalog may name mirror: sources (a mirror.url is set;
/// nothing is fetched from it here).
fn mirrored_yaml(dir: &std::path::Path, store: &str) -> String {
    let config = server_yaml(dir, "catalog", store, free_port(), 0);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("mirror:\n  url: http://127.0.0.1:1\n");
    std::fs::write(&config, text).unwrap();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_and_remove_go_by_the_catalog_and_refuse_without_it() {
    let up = Upstream::start().await;
    let (a, b) = (pattern(4096, 7), pattern(4096, 8));
    let sa = up.hf("a.gguf", &a, Some(&sha(&a)));
    let sb = up.hf("b.gguf", &b, Some(&sha(&b)));
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let d = models.to_str().unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, _, err) = run(&[
        "mirror",
        "add",
        "--dir",
        d,
        "--model",
        "a",
        "--version",
        "v1",
        &sa,
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = run(&[
        "mirror",
        "add",
        "--dir",
        d,
        "--model",
        "b",
        "--version",
        "v1",
        &sb,
    ]);
    assert!(ok, "{err}");
    let (again, _, err) = run(&[
        "mirror",
        "add",
        "--dir",
        d,
        "--model",
        "b",
        "--version",
        "v1",
        &sb,
    ]);
    assert!(!again && err.contains("never overwritten"), "{err}");
    // What the directory holds, from the host: both versions, each file
    // with its size and checksum.
    let (ok, listed, err) = run(&["mirror", "list", "--dir", d, "--json"]);
    assert!(ok, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let held: Vec<(&str, &str)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["model"].as_str().unwrap(), e["state"].as_str().unwrap()))
        .collect();
    assert_eq!(held, [("a", "present"), ("b", "present")], "{listed}");
    assert!(
        listed[0]["files"][0]["sha256"]
            .as_str()
            .is_some_and(|h| h.len() == 64),
        "{listed}"
    );
    let (ok, table, _) = run(&["mirror", "list", "--dir", d]);
    assert!(
        ok && table.starts_with("MODEL") && table.contains("present"),
        "{table}"
    );

    // No control plane: no list, and no removal without --force.
    let nobody = "http://127.0.0.1:1";
    let (ok, _, err) = run(&["mirror", "unused", "--dir", d, "--admin", nobody]);
    assert!(
        !ok && err.contains("cannot reach the control plane"),
        "{err}"
    );
    let remove = |m: &str, f: &str, admin: &str, force: bool| {
        let mut args = vec![
            "mirror",
            "remove",
            "--dir",
            d,
            "--model",
            m,
            "--version",
            "v1",
            "--file",
            f,
            "--admin",
            admin,
        ];
        if force {
            args.push("--force");
        }
        run(&args)
    };
    let (ok, _, err) = remove("b", "b.gguf", nobody, false);
    assert!(!ok && err.contains("--force"), "{err}");

    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let server = start_server(&mirrored_yaml(dir.path(), &store));
    let model = dir.path().join("m.json");
    std::fs::write(
        &model,
        json!({"name": "uses-a", "source": "mirror:a/v1/a.gguf", "profiles": []}).to_string(),
    )
    .unwrap();
    let (ok, _, err) = ctl(&server.admin, &["model", "add", model.to_str().unwrap()]);
    assert!(ok, "{err}");
    let (ok, out, err) = run(&[
        "mirror",
        "unused",
        "--dir",
        d,
        "--admin",
        &server.admin,
        "--json",
    ]);
    assert!(ok, "{err}");
    let unused: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        unused,
        json!([{"model": "b", "version": "v1", "file": "b.gguf", "size": 4096}])
    );
    let (ok, _, err) = remove("a", "a.gguf", &server.admin, false);
    assert!(!ok && err.contains("in use"), "{err}");
    assert!(models.join("a/v1/a.gguf").exists());
    let (ok, out, err) = remove("b", "b.gguf", &server.admin, false);
    assert!(ok && out.contains("removed b/v1/b.gguf"), "{err}");
    assert!(!models.join("b").exists(), "an emptied version goes whole");
    let (ok, table, _) = run(&["mirror", "unused", "--dir", d, "--admin", &server.admin]);
    assert!(ok && !table.contains("a.gguf"), "{table}");
}

/// A version's config.json and weight index are what `ctl plan --mirror`
/// sizes the model from: while the catalog names any file of the version,
/// `unused` does not list them and `remove` refuses them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_versions_config_and_index_are_in_use_with_its_weights() {
    let up = Upstream::start().await;
    let files = [
        ("model.safetensors", pattern(4096, 1)),
        ("config.json", br#"{"hidden_size": 64}"#.to_vec()),
        (
            "model.safetensors.index.json",
            br#"{"weight_map": {}}"#.to_vec(),
        ),
        ("README.md", b"notes".to_vec()),
    ];
    let sources: Vec<String> = files
        .iter()
        .map(|(name, body)| up.hf(name, body, Some(&sha(body))))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let d = models.to_str().unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let mut add = vec![
        "mirror",
        "add",
        "--dir",
        d,
        "--model",
        "llama8b",
        "--version",
        "v1",
    ];
    add.extend(sources.iter().map(String::as_str));
    let (ok, _, err) = run(&add);
    assert!(ok, "{err}");

    let store = format!("sqlite://{}", dir.path().join("llmgw.db").display());
    let server = start_server(&mirrored_yaml(dir.path(), &store));
    let model = dir.path().join("m.json");
    std::fs::write(
        &model,
        json!({"name": "llama8b", "source": "mirror:llama8b/v1/model.safetensors", "profiles": []})
            .to_string(),
    )
    .unwrap();
    let (ok, _, err) = ctl(&server.admin, &["model", "add", model.to_str().unwrap()]);
    assert!(ok, "{err}");
    let (ok, out, err) = run(&[
        "mirror",
        "unused",
        "--dir",
        d,
        "--admin",
        &server.admin,
        "--json",
    ]);
    assert!(ok, "{err}");
    let unused: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        unused,
        json!([{"model": "llama8b", "version": "v1", "file": "README.md", "size": 5}])
    );
    for file in ["config.json", "model.safetensors.index.json"] {
        let (ok, _, err) = run(&[
            "mirror",
            "remove",
            "--dir",
            d,
            "--model",
            "llama8b",
            "--version",
            "v1",
            "--file",
            file,
            "--admin",
            &server.admin,
        ]);
        assert!(
            !ok && err.contains("in use") && err.contains("ctl plan"),
            "{err}"
        );
        assert!(models.join("llama8b/v1").join(file).exists());
    }
}

/// The management API starts downloads and deletes versions: without the
/// fleet's CA it serves on loopback only, and another address is refused
/// at start, saying what to give.
#[test]
fn an_api_without_client_certificates_off_loopback_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["mirror", "serve", "--dir", dir.path().to_str().unwrap()])
        .args(["--base", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"])
        .args(["--api-listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--api-listen 0.0.0.0:0") && err.contains("--tls-ca"),
        "{err}"
    );
}
