//! Provisioning with real archives over real HTTP: the real llama-server
//! that `scripts/real-engine` builds, packed in the test, installed,
//! checked and run with the tiny model; archives that are tampered with,
//! climb out of their directory or need a library the node lacks are each
//! refused with the reason. The node's package manager is played by small
//! scripts first on the installer's PATH (nothing is installed here).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llmgw_agent::discovery::host::{Host, debian_arch};
use llmgw_agent::engines::{LlamaCpp, Profile, Registry, Sglang, ShardSpec, Sim, Vllm};
use llmgw_agent::provision::{
    Installer, MARKER, Provisioner, Schedule, State, Status, System, Want,
};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::executable;

/// llama.cpp's server and the tiny model, built once into a cache by
/// `scripts/real-engine` (minutes the first time, then instant).
pub(crate) fn real_engine() -> (PathBuf, PathBuf) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/real-engine");
    let out = std::process::Command::new(script).output().unwrap();
    assert!(
        out.status.success(),
        "scripts/real-engine failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    (lines.next().unwrap().into(), lines.next().unwrap().into())
}

/// What an archive holds.
pub(crate) enum Entry<'a> {
    File(&'a str, Vec<u8>, u32),
    Link(&'a str, &'a str),
    /// A name written into the header as is, past the tar writer's checks.
    Raw(&'a str, Vec<u8>),
}

pub(crate) fn tar_gz(entries: &[Entry]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for e in entries {
        let mut h = tar::Header::new_gnu();
        match e {
            Entry::File(name, data, mode) => {
                h.set_size(data.len() as u64);
                h.set_mode(*mode);
                h.set_entry_type(tar::EntryType::Regular);
                b.append_data(&mut h, name, data.as_slice()).unwrap();
            }
            Entry::Link(name, target) => {
                h.set_size(0);
                h.set_mode(0o777);
                h.set_entry_type(tar::EntryType::Symlink);
                b.append_link(&mut h, name, target).unwrap();
            }
            Entry::Raw(name, data) => {
                let field = &mut h.as_old_mut().name;
                field[..name.len()].copy_from_slice(name.as_bytes());
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_entry_type(tar::EntryType::Regular);
                h.set_cksum();
                b.append(&h, data.as_slice()).unwrap();
            }
        }
    }
    b.into_inner().unwrap().finish().unwrap()
}

pub(crate) fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Files by path on a real socket; 404 for anything else; requests counted.
#[derive(Clone, Default)]
pub(crate) struct Files {
    pub files: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    pub hits: Arc<AtomicUsize>,
}

impl Files {
    pub(crate) fn put(&self, path: &str, body: Vec<u8>) {
        self.files.lock().unwrap().insert(path.into(), body);
    }

    /// Serves until the test ends; the base URL.
    pub(crate) async fn serve(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let me = me.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    me.hits.fetch_add(1, Ordering::SeqCst);
                    let head = String::from_utf8_lossy(&buf).into_owned();
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                    let body = me.files.lock().unwrap().get(&path).cloned();
                    let (status, body) = match body {
                        Some(b) => ("200 OK", b),
                        None => ("404 Not Found", b"not here".to_vec()),
                    };
                    let head = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = sock.write_all(head.as_bytes()).await;
                    let _ = sock.write_all(&body).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        format!("http://{addr}")
    }
}

/// A Debian-family node with nothing installed, whose package manager
/// (scripts in `dir/bin`) is busy `locked` times before it answers.
struct FakeSystem {
    bin: PathBuf,
    installed: PathBuf,
}

impl FakeSystem {
    fn new(dir: &Path, locked: u32) -> FakeSystem {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let installed = dir.join("installed");
        let lock = dir.join("locked");
        std::fs::write(&installed, "").unwrap();
        std::fs::write(&lock, locked.to_string()).unwrap();
        // `dpkg-query -W -f=... PKG`: "ii " for what was installed.
        executable(
            &bin,
            "dpkg-query",
            &format!(
                "for p; do :; done\ngrep -qx \"$p\" {} && printf 'ii ' || exit 1\n",
                installed.display()
            ),
        );
        executable(
            &bin,
            "apt-get",
            &format!(
                r#"n=$(cat {lock})
if [ "$n" -gt 0 ]; then echo $((n-1)) > {lock}; echo 'E: Unable to lock directory /var/lib/apt/lists/' >&2; exit 100; fi
[ "$DEBIAN_FRONTEND" = noninteractive ] || exit 7
seen=
for a; do
  if [ -n "$seen" ]; then case "$a" in -*) ;; *) echo "$a" >> {installed} ;; esac; fi
  [ "$a" = install ] && seen=1
done
exit 0
"#,
                lock = lock.display(),
                installed = installed.display()
            ),
        );
        FakeSystem { bin, installed }
    }

    fn system(&self) -> System {
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        System {
            path: Some(path.into()),
            lock_retry: Duration::from_millis(1),
            ..System::default()
        }
    }

    fn installed(&self) -> String {
        std::fs::read_to_string(&self.installed).unwrap()
    }
}

fn host() -> Host {
    Host {
        os_id: "ubuntu".into(),
        os_version: "24.04".into(),
        os_like: vec!["debian".into()],
        arch: debian_arch(std::env::consts::ARCH).into(),
        cpu_flags: vec!["avx2".into()],
        ..Host::default()
    }
}

/// The CPU build's archive name for this machine.
fn asset(version: &str) -> String {
    let arch = match debian_arch(std::env::consts::ARCH) {
        "amd64" => "x64",
        a => a,
    };
    format!("llama-{version}-bin-ubuntu-{arch}.tar.gz")
}

/// An installer over `root` that hears every status into `heard`.
fn installer(root: &Path, system: System, heard: &Arc<Mutex<Vec<Status>>>) -> Installer {
    let mut i = Installer::new(root.into(), host());
    i.system = system;
    let h = heard.clone();
    i.on_status = Some(Arc::new(move |s: &Status| {
        h.lock().unwrap().push(s.clone())
    }));
    i
}

fn want(base: &str, version: &str, sum: &str) -> Want {
    Want {
        engine: "llamacpp".into(),
        version: version.into(),
        source: format!("{base}/{{version}}/{{asset}}"),
        sha256: BTreeMap::from([(asset(version), sum.to_owned())]),
        manifest: String::new(),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_is_installed_from_nothing_checked_not_fetched_again_and_serves() {
    let (real, model) = real_engine();
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSystem::new(dir.path(), 2);
    let archive = tar_gz(&[
        Entry::File(
            "llama-b1/llama-server",
            std::fs::read(&real).unwrap(),
            0o4755,
        ),
        Entry::File("llama-b1/libextra.so.0", b"not really".to_vec(), 0o666),
        Entry::Link("llama-b1/libextra.so", "libextra.so.0"),
    ]);
    let files = Files::default();
    files.put(&format!("/b1/{}", asset("b1")), archive.clone());
    let base = files.serve().await;
    let heard = Arc::new(Mutex::new(Vec::new()));
    let root = dir.path().join("engines");
    let inst = installer(&root, fake.system(), &heard);
    let w = want(&base, "b1", &sha256(&archive));

    let st = inst.converge(std::slice::from_ref(&w)).await;
    assert_eq!(st.len(), 1);
    let st = &st[0];
    assert_eq!(
        (st.state, st.variant.as_str()),
        (State::Ready, "cpu"),
        "{st:?}"
    );
    assert!(
        st.detail.starts_with("llama-server version"),
        "{}",
        st.detail
    );
    let bin = st.binary.clone().unwrap();
    assert_eq!(bin, root.join("llamacpp/b1-cpu/llama-b1/llama-server"));
    assert!(root.join("llamacpp/b1-cpu").join(MARKER).exists());
    assert!(!root.join("llamacpp/b1-cpu.partial").exists());
    assert_eq!(fake.installed(), "libgomp1\n", "the missing package, only");
    let link = root.join("llamacpp/b1-cpu/llama-b1/libextra.so");
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new("libextra.so.0")
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&bin), 0o755, "no setuid from an archive");
    assert_eq!(mode(&link.with_extension("so.0")), 0o644, "no world write");
    let details: Vec<String> = heard
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.detail.clone())
        .collect();
    for step in [
        "installing libgomp1 with apt-get",
        "waiting for another apt-get to finish",
        "downloading llama-b1-bin-ubuntu",
        "unpacking llama-b1-bin-ubuntu",
        "checking that llama-server runs",
    ] {
        assert!(
            details.iter().any(|d| d.starts_with(step)),
            "{step}: {details:?}"
        );
    }

    // Installed: checked again, not fetched again.
    let hits = files.hits.load(Ordering::SeqCst);
    let again = inst.converge(std::slice::from_ref(&w)).await;
    assert_eq!(again[0].state, State::Ready, "{:?}", again[0]);
    assert_eq!(files.hits.load(Ordering::SeqCst), hits);

    // A replica of the tiny model on the provisioned build, through the
    // engine's own command line and the supervisor.
    let registry = Registry::new(
        Vllm::default(),
        Sglang::default(),
        LlamaCpp::new(None, 1),
        Sim::default(),
    );
    assert!(registry.use_installed("llamacpp", Some((bin.clone(), "b1".into()))));
    assert_eq!(
        registry.probe(Duration::from_secs(8)).await["llamacpp"],
        "b1"
    );
    let port = free_port();
    let spec = ShardSpec {
        replica_id: "r1".into(),
        shard_id: "r1-0".into(),
        nnodes: 1,
        http_port: port,
        bind_addr: "127.0.0.1".into(),
        profile: Profile {
            name: "cpu".into(),
            engine: "llamacpp".into(),
            tp: 1,
            model_path: model.display().to_string(),
            served_model_name: "tiny".into(),
            args: vec!["--ctx-size".into(), "256".into()],
            ..Profile::default()
        },
        ..ShardSpec::default()
    };
    let commands = registry.get("llamacpp").unwrap().commands(&spec).unwrap();
    assert_eq!(commands[0].path, bin);
    let shard = llmgw_agent::supervisor::start(
        commands,
        llmgw_agent::supervisor::SupervisorOptions {
            http_port: Some(port),
            served_model: Some("tiny".into()),
            probe_interval: Duration::from_millis(100),
            startup_timeout: Some(Duration::from_secs(120)),
            stop_timeout: Duration::from_secs(5),
            ..Default::default()
        },
    );
    let mut status = shard.status();
    let ready = tokio::time::timeout(
        Duration::from_secs(150),
        status.wait_for(|s| s.state.terminal() || s.state == llmgw_agent::supervisor::State::Ready),
    )
    .await
    .expect("ready in time")
    .unwrap()
    .clone();
    assert_eq!(
        ready.state,
        llmgw_agent::supervisor::State::Ready,
        "{}",
        shard.log_tail()
    );
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .json(&serde_json::json!({"model": "tiny", "max_tokens": 3,
            "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    shard.stop().await;
}

/// Installs `entries` as llamacpp `version` and returns the one status.
async fn install(
    entries: &[Entry<'_>],
    version: &str,
    sum: Option<&str>,
) -> (Status, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSystem::new(dir.path(), 0);
    let archive = tar_gz(entries);
    let files = Files::default();
    files.put(&format!("/{version}/{}", asset(version)), archive.clone());
    let base = files.serve().await;
    let heard = Arc::new(Mutex::new(Vec::new()));
    let inst = installer(&dir.path().join("engines"), fake.system(), &heard);
    let w = want(&base, version, sum.unwrap_or(&sha256(&archive)));
    let st = inst.converge(&[w]).await.remove(0);
    (st, dir)
}

#[tokio::test]
async fn an_archive_that_does_not_match_its_checksum_is_refused() {
    let script = b"#!/bin/sh\necho 'version: 1 (abc)'\n".to_vec();
    let (st, dir) = install(
        &[Entry::File("llama-b2/llama-server", script, 0o755)],
        "b2",
        Some(&"0".repeat(64)),
    )
    .await;
    assert_eq!(st.state, State::Failed);
    assert!(
        st.detail
            .contains("does not match the checksum its publisher gave"),
        "{}",
        st.detail
    );
    let installs = dir.path().join("engines/llamacpp");
    assert!(!installs.join("b2-cpu").exists() && !installs.join("b2-cpu.partial").exists());
}

#[tokio::test]
async fn an_archive_cannot_write_outside_its_directory() {
    let (st, dir) = install(&[Entry::Raw("../../escaped", b"boo".to_vec())], "b3", None).await;
    assert_eq!(st.state, State::Failed);
    assert!(
        st.detail
            .contains("../../escaped would unpack outside the install directory"),
        "{}",
        st.detail
    );
    assert!(!dir.path().join("escaped").exists());
    assert!(!dir.path().join("engines/escaped").exists());
    // Nor through a link of its own: by its name…
    let (st, _dir) = install(
        &[
            Entry::Link("llama-b4/up", "../.."),
            Entry::File("llama-b4/llama-server", b"#!/bin/sh\n".to_vec(), 0o755),
        ],
        "b4",
        None,
    )
    .await;
    assert!(
        st.detail.contains("llama-b4/up links outside the archive"),
        "{}",
        st.detail
    );
    // …or through a chain whose names each look inside (`here/..` is the
    // directory's parent once `here` is the directory itself).
    let (st, _dir) = install(
        &[Entry::Link("here", "."), Entry::Link("out", "here/..")],
        "b4",
        None,
    )
    .await;
    assert!(
        st.detail.contains("out links outside the archive"),
        "{}",
        st.detail
    );
    let (st, _dir) = install(&[Entry::Link("llama-b5/etc", "/etc")], "b5", None).await;
    assert!(
        st.detail.contains("links outside the archive"),
        "{}",
        st.detail
    );
}

#[tokio::test]
async fn a_binary_that_needs_a_library_the_node_lacks_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("gone.c"), "int gone(void) { return 0; }\n").unwrap();
    std::fs::write(
        d.join("main.c"),
        "#include <stdio.h>\nint gone(void);\nint main(void) { puts(\"version: 1\"); return gone(); }\n",
    )
    .unwrap();
    let gcc = |args: &[&str]| {
        let s = std::process::Command::new("gcc")
            .current_dir(d)
            .args(args)
            .status()
            .unwrap();
        assert!(s.success(), "gcc {args:?}");
    };
    gcc(&["-shared", "-fPIC", "-o", "libgone.so", "gone.c"]);
    gcc(&["-o", "llama-server", "main.c", "-L.", "-lgone"]);
    std::fs::remove_file(d.join("libgone.so")).unwrap();
    let bin = std::fs::read(d.join("llama-server")).unwrap();
    let (st, out) = install(
        &[Entry::File("llama-b6/llama-server", bin, 0o755)],
        "b6",
        None,
    )
    .await;
    assert_eq!(st.state, State::Failed, "{st:?}");
    assert_eq!(
        st.detail,
        "llama-server cannot run on this system: libgone.so is not installed"
    );
    assert!(!out.path().join("engines/llamacpp/b6-cpu").exists());
}

#[tokio::test]
async fn a_binary_that_does_not_run_is_not_ready() {
    let script = b"#!/bin/sh\necho 'segfault, say' >&2\nexit 139\n".to_vec();
    let (st, _dir) = install(
        &[Entry::File("llama-b7/llama-server", script, 0o755)],
        "b7",
        None,
    )
    .await;
    assert_eq!(st.state, State::Failed);
    assert!(
        st.detail.starts_with("llama-server --version failed")
            && st.detail.contains("segfault, say"),
        "{}",
        st.detail
    );
    let (st, _dir) = install(
        &[Entry::File("llama-b8/other", b"x".to_vec(), 0o755)],
        "b8",
        None,
    )
    .await;
    assert_eq!(st.detail, "the build has no llama-server in it");
}

#[tokio::test]
async fn what_the_agent_cannot_install_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let mut inst = installer(dir.path(), System::default(), &heard);
    let vllm = Want {
        engine: "vllm".into(),
        version: "0.29.0".into(),
        ..Want::default()
    };
    let st = inst.converge(std::slice::from_ref(&vllm)).await.remove(0);
    assert_eq!(st.state, State::Unsupported);
    assert!(st.detail.contains("install it by hand"), "{}", st.detail);
    inst.host.arch = "riscv64".into();
    let st = inst.converge(&[want("http://x", "b1", "")]).await.remove(0);
    assert_eq!(
        (st.state, st.detail.as_str()),
        (
            State::Unsupported,
            "llama.cpp publishes no Linux build for riscv64"
        )
    );
    // A source without a checksum for the archive cannot be verified.
    inst.host = host();
    let mut w = want("http://127.0.0.1:1", "b9", "");
    w.sha256.clear();
    let st = inst.converge(&[w]).await.remove(0);
    assert_eq!(st.state, State::Failed);
    assert!(
        st.detail.contains("publishes no checksum for llama-b9"),
        "{}",
        st.detail
    );
}

#[tokio::test]
async fn a_red_hat_node_installs_with_its_own_package_manager() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let installed = dir.path().join("installed");
    std::fs::write(&installed, "").unwrap();
    let i = installed.display();
    executable(&bin, "rpm", &format!("grep -qx \"$2\" {i}\n"));
    executable(
        &bin,
        "dnf",
        &format!(
            "[ \"$1 $2\" = 'install -y' ] || exit 3\nshift 2\nfor p; do echo $p >> {i}; done\n"
        ),
    );
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let system = System {
        path: Some(path.into()),
        ..System::default()
    };
    let progress = Mutex::new(Vec::new());
    system
        .packages("rpm", &["libgomp"], &|d| progress.lock().unwrap().push(d))
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&installed).unwrap(), "libgomp\n");
    assert_eq!(*progress.lock().unwrap(), ["installing libgomp with dnf"]);
    // Installed now: nothing runs.
    system
        .packages("rpm", &["libgomp"], &|_| panic!("nothing to do"))
        .await
        .unwrap();
    // Switched off: a missing package is left to the operator (ldd names
    // the library it lacks).
    let off = System {
        install_packages: false,
        ..system.clone()
    };
    off.packages("rpm", &["libfoo"], &|_| panic!("nothing runs"))
        .await
        .unwrap();
    assert!(
        !std::fs::read_to_string(&installed)
            .unwrap()
            .contains("libfoo")
    );
}

#[tokio::test]
async fn a_package_manager_locked_too_long_is_a_failure_with_its_words() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSystem::new(dir.path(), 1000);
    let system = System {
        lock_wait: Duration::from_millis(50),
        ..fake.system()
    };
    let err = system
        .packages("deb", &["libgomp1"], &|_| {})
        .await
        .unwrap_err();
    assert!(
        err.starts_with("apt-get -o=DPkg::Lock::Timeout=600 update: failed: E: Unable to lock"),
        "{err}"
    );
}

#[tokio::test]
async fn a_failure_is_retried_and_a_ready_build_handed_to_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSystem::new(dir.path(), 0);
    let script = b"#!/bin/sh\necho 'version: 7 (loop)'\n".to_vec();
    let good = tar_gz(&[Entry::File("llama-b10/llama-server", script, 0o755)]);
    let files = Files::default();
    let path = format!("/b10/{}", asset("b10"));
    files.put(&path, b"a page that is not the archive".to_vec());
    let base = files.serve().await;
    let heard = Arc::new(Mutex::new(Vec::new()));
    let inst = installer(&dir.path().join("engines"), fake.system(), &heard);
    // What the engine is handed, in order: awaited, never polled; with
    // whether the build was already reported ready at that moment.
    let (h, mut handed) = tokio::sync::mpsc::unbounded_channel::<(Option<PathBuf>, bool)>();
    let reported = Arc::new(std::sync::OnceLock::<
        tokio::sync::watch::Receiver<Vec<Status>>,
    >::new());
    let seen = reported.clone();
    let p = Provisioner::spawn(
        inst,
        Schedule {
            recheck: Duration::from_secs(3600),
            retry: Duration::from_millis(200),
        },
        Arc::new(move |engine: &str, built: Option<(PathBuf, String)>| {
            assert_eq!(engine, "llamacpp");
            let ready = seen
                .get()
                .is_some_and(|w| w.borrow().first().is_some_and(|s| s.state == State::Ready));
            h.send((built.map(|(b, _)| b), ready)).unwrap();
        }),
    );
    reported.set(p.watch()).unwrap();
    p.want(vec![want(&base, "b10", &sha256(&good))]);
    let mut watch = p.watch();
    let failed = tokio::time::timeout(
        Duration::from_secs(20),
        watch.wait_for(|s| s.first().is_some_and(|s| s.state == State::Failed)),
    )
    .await
    .expect("failed in time")
    .unwrap()
    .clone();
    assert!(failed[0].detail.contains("checksum"), "{:?}", failed[0]);
    // The publisher's file is fixed: the next try (a retry, not the hour's
    // re-check) installs it.
    files.put(&path, good);
    tokio::time::timeout(
        Duration::from_secs(20),
        watch.wait_for(|s| s.first().is_some_and(|s| s.state == State::Ready)),
    )
    .await
    .expect("ready after a retry")
    .unwrap();
    assert_eq!(p.statuses()[0].detail, "llama-server version: 7 (loop)");
    // Handed over before it was reported ready (a restarted agent
    // registers once it reads "ready", and its registration must carry the
    // engine), and only once.
    let (first, already_reported) = handed.try_recv().expect("handed to the engine");
    assert!(
        first
            .as_ref()
            .unwrap()
            .ends_with("b10-cpu/llama-b10/llama-server")
    );
    assert!(!already_reported, "reported ready before the engine had it");
    assert!(handed.try_recv().is_err(), "handed over once");
    // No longer wanted: no longer reported, and taken back from the engine.
    p.want(vec![]);
    tokio::time::timeout(Duration::from_secs(20), watch.wait_for(|s| s.is_empty()))
        .await
        .expect("forgotten")
        .unwrap();
    let taken_back = tokio::time::timeout(Duration::from_secs(20), handed.recv())
        .await
        .expect("taken back");
    assert_eq!(taken_back.map(|(b, _)| b), Some(None));
}

#[tokio::test]
async fn a_mirrors_manifest_gives_the_checksums_and_a_missing_one_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSystem::new(dir.path(), 0);
    let script = b"#!/bin/sh\necho 'version: 11 (mirror)'\n".to_vec();
    let archive = tar_gz(&[Entry::File("llama-b11/llama-server", script, 0o755)]);
    let files = Files::default();
    files.put(&format!("/llama.cpp/b11/{}", asset("b11")), archive.clone());
    let manifest = |sum: &str| {
        serde_json::json!({"files": [{"name": asset("b11"), "size": archive.len(), "sha256": sum}]})
            .to_string()
            .into_bytes()
    };
    files.put("/llama.cpp/b11", manifest(&sha256(&archive)));
    let base = files.serve().await;
    let heard = Arc::new(Mutex::new(Vec::new()));
    let inst = installer(&dir.path().join("engines"), fake.system(), &heard);
    let from_mirror = |version: &str| Want {
        engine: "llamacpp".into(),
        version: version.into(),
        source: format!("{base}/llama.cpp/{{version}}/{{asset}}"),
        manifest: format!("{base}/llama.cpp/{version}"),
        ..Want::default()
    };
    let st = inst.converge(&[from_mirror("b11")]).await.remove(0);
    assert_eq!(st.state, State::Ready, "{st:?}");
    assert!(
        heard
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.detail == "asking the mirror for the checksums of llamacpp b11")
    );
    let st = inst.converge(&[from_mirror("b12")]).await.remove(0);
    assert_eq!(st.state, State::Failed);
    assert!(
        st.detail.contains("the mirror holds no such version"),
        "{}",
        st.detail
    );
    // A manifest that disagrees with the bytes: refused.
    std::fs::remove_dir_all(dir.path().join("engines/llamacpp/b11-cpu")).unwrap();
    files.put("/llama.cpp/b11", manifest(&"1".repeat(64)));
    let st = inst.converge(&[from_mirror("b11")]).await.remove(0);
    assert!(
        st.detail.contains("does not match the checksum"),
        "{}",
        st.detail
    );
}

/// The loop's clock, on paused time (these passes touch no process, file
/// or socket): a failure is tried again after a minute, a settled engine
/// looked at again after ten.
#[tokio::test(start_paused = true)]
async fn a_failure_is_tried_again_after_a_minute_and_anything_else_after_ten() {
    use tokio::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    // No OS family: no package to look for.
    let bare = Host {
        arch: "amd64".into(),
        ..Host::default()
    };
    let p = Provisioner::spawn(
        Installer::new(dir.path().into(), bare),
        Schedule::default(),
        Arc::new(|_: &str, _| {}),
    );
    let mut watch = p.watch();
    let settled = |state: State| move |s: &Vec<Status>| s.first().is_some_and(|s| s.state == state);
    let unreadable = Want {
        engine: "llamacpp".into(),
        version: "b1".into(),
        source: "ftp://files.example/{asset}".into(),
        ..Want::default()
    };
    p.want(vec![unreadable]);
    watch.wait_for(settled(State::Failed)).await.unwrap();
    let failed = Instant::now();
    // The next pass begins (and says so) a minute later.
    watch.changed().await.unwrap();
    assert_eq!(failed.elapsed(), Duration::from_secs(60));
    let vllm = Want {
        engine: "vllm".into(),
        version: "0.29.0".into(),
        ..Want::default()
    };
    p.want(vec![vllm]);
    watch.wait_for(settled(State::Unsupported)).await.unwrap();
    let settled_at = Instant::now();
    watch.changed().await.unwrap();
    assert_eq!(settled_at.elapsed(), Duration::from_secs(600));
}
