//! Which engines a node reports (`engines-provision.md` §5, the probe
//! rows), and how the agent reads its `--server` list.

use std::path::Path;
use std::time::Duration;

use llmgw_agent::engines::probe::{Found, Probe, first_version, look};
use llmgw_agent::engines::{LlamaCpp, Registry, Sglang, Sim, Vllm};
use llmgw_agent::session::server_urls;

use super::executable;
use super::supervisor::gone;

fn registry(vllm: &Path, python: &Path, llama: &Path) -> Registry {
    Registry::new(
        Vllm {
            bin: Some(vllm.into()),
            ..Vllm::default()
        },
        Sglang {
            python: Some(python.into()),
        },
        LlamaCpp::new(Some(llama.into()), 0),
        Sim::default(),
    )
}

const T: Duration = Duration::from_secs(8);

#[tokio::test]
async fn an_engine_that_is_not_installed_is_absent_from_the_report() {
    let absent = Path::new("/nonexistent/engine");
    assert!(registry(absent, absent, absent).probe(T).await.is_empty());
    // A file that cannot be executed is not an engine either.
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("vllm");
    std::fs::write(&plain, "not a program").unwrap();
    assert_eq!(look(&Probe::Binary(plain), T).await, Found::Absent);
}

#[tokio::test]
async fn probing_never_runs_an_engine_binary() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let vllm = executable(dir.path(), "vllm", &format!("touch {}\n", marker.display()));
    let llama = executable(
        dir.path(),
        "llama-server",
        &format!("touch {}\n", marker.display()),
    );
    let found = registry(&vllm, Path::new("/nonexistent/python"), &llama)
        .probe(T)
        .await;
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        [
            ("llamacpp".to_string(), "unknown".to_string()),
            ("vllm".to_string(), "unknown".to_string())
        ]
    );
    assert!(!marker.exists(), "a wrapper script must not be started");
}

#[tokio::test]
async fn sglang_is_there_when_its_module_imports() {
    let dir = tempfile::tempdir().unwrap();
    let absent = Path::new("/nonexistent/engine");
    let broken = executable(dir.path(), "python-without", "exit 1\n");
    assert!(registry(absent, &broken, absent).probe(T).await.is_empty());
    // The probe asks the module itself, in the configured Python.
    let python = executable(
        dir.path(),
        "python-with",
        "case \"$2\" in *'import sglang'*) printf 0.4.1 ;; *) exit 3 ;; esac\n",
    );
    let found = registry(absent, &python, absent).probe(T).await;
    assert_eq!(found.get("sglang").map(String::as_str), Some("0.4.1"));
    let silent = executable(dir.path(), "python-silent", "exit 0\n");
    let found = registry(absent, &silent, absent).probe(T).await;
    assert_eq!(found.get("sglang").map(String::as_str), Some("unknown"));
}

#[tokio::test]
async fn a_probe_that_hangs_is_given_up_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let slow = executable(dir.path(), "python", "exec sleep 60\n");
    let probe = Probe::Run {
        program: slow,
        args: vec![],
    };
    let began = tokio::time::Instant::now();
    assert_eq!(
        look(&probe, Duration::from_millis(200)).await,
        Found::TimedOut
    );
    assert!(began.elapsed() < Duration::from_secs(30));
    // The hung probe is killed, not left behind.
    let pidfile = dir.path().join("pid");
    let slow = executable(
        dir.path(),
        "python-slow",
        &format!("echo $$ > {}; exec sleep 60\n", pidfile.display()),
    );
    let probe = Probe::Run {
        program: slow.clone(),
        args: vec![],
    };
    assert_eq!(
        look(&probe, Duration::from_millis(300)).await,
        Found::TimedOut
    );
    let pid = std::fs::read_to_string(&pidfile).unwrap();
    let pid: u32 = pid.trim().parse().unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !gone(pid) {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the hung probe was killed");
    // A probe that times out keeps what was known: a slow import is not
    // an engine gone.
    let r = registry(
        Path::new("/nonexistent/v"),
        &slow,
        Path::new("/nonexistent/l"),
    );
    let known: std::collections::BTreeMap<String, String> =
        [("sglang".to_string(), "0.4.1".to_string())].into();
    let again = r.reprobe(Duration::from_millis(200), &known).await;
    assert_eq!(again, known);
    assert!(r.probe(Duration::from_millis(200)).await.is_empty());
}

#[test]
fn a_version_is_picked_out_of_whatever_is_printed() {
    for (text, want) in [
        ("0.4.1", "0.4.1"),
        ("sglang 0.4.post1", "0.4.post1"),
        ("warning: noise\n0.4.1", "0.4.1"),
        ("vllm version 0.6.3, built today", "0.6.3"),
        ("(0.5.2)", "0.5.2"),
        ("", "unknown"),
        ("no numbers here", "unknown"),
        ("just 4123", "unknown"),
    ] {
        assert_eq!(first_version(text), want, "{text:?}");
    }
}

#[test]
fn server_addresses_gain_a_scheme_and_are_tried_once_each() {
    let s = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        server_urls(&s(&["10.0.0.140:7443"]), false).unwrap(),
        ["http://10.0.0.140:7443"]
    );
    assert_eq!(
        server_urls(&s(&["10.0.0.140:9443"]), true).unwrap(),
        ["https://10.0.0.140:9443"]
    );
    assert_eq!(
        server_urls(
            &s(&["first:7443", "http://second:7443", "third:7443"]),
            false
        )
        .unwrap(),
        [
            "http://first:7443",
            "http://second:7443",
            "http://third:7443"
        ],
        "the order given is the order tried"
    );
    assert_eq!(
        server_urls(&s(&["a:7443", "http://a:7443", "b:7443"]), false).unwrap(),
        ["http://a:7443", "http://b:7443"]
    );
    let e = server_urls(&s(&["https://a:7443", "http://b:7443"]), true).unwrap_err();
    assert!(e.to_string().contains("b:7443"), "{e}");
    assert!(server_urls(&s(&["ftp://a:7443"]), false).is_err());
    assert!(server_urls(&s(&[]), false).is_err());
    assert!(server_urls(&s(&[" "]), false).is_err());
}

#[tokio::test]
async fn a_stop_is_not_held_up_by_the_first_probe() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let python = executable(
        dir.path(),
        "python",
        &format!("touch {}; exec sleep 60\n", started.display()),
    );
    let mut config = llmgw_agent::session::SessionConfig::new(
        vec!["http://127.0.0.1:1".into()],
        "slow-probe".into(),
    );
    config.discovery.skip_gpus = true;
    let absent = Path::new("/nonexistent/engine");
    let agent = llmgw_agent::session::Agent::new(config, registry(absent, &python, absent));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(agent.run(stopped));
    tokio::time::timeout(Duration::from_secs(10), async {
        while !started.exists() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the probe started");
    stop.send(true).unwrap();
    // The probe alone would hold it for its whole timeout (8 s).
    tokio::time::timeout(Duration::from_secs(4), run)
        .await
        .expect("the agent stopped while its probe hung")
        .unwrap();
}

/// Without a configured binary, llama-server is also found under
/// /opt/llama.cpp in any of the layouts llama.cpp's release archives and
/// builds leave there; a non-executable file does not count.
#[test]
fn llama_server_is_found_in_the_layouts_under_opt() {
    use llmgw_agent::engines::llamacpp::binary_under;
    for rel in ["llama-server", "bin/llama-server", "build/bin/llama-server"] {
        let opt = tempfile::tempdir().unwrap();
        let path = opt.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        executable(path.parent().unwrap(), "llama-server", "exit 0\n");
        assert_eq!(binary_under(opt.path()), Some(path), "{rel}");
    }
    let opt = tempfile::tempdir().unwrap();
    std::fs::write(opt.path().join("llama-server"), "not a program").unwrap();
    assert_eq!(binary_under(opt.path()), None);
}

#[tokio::test]
async fn a_binary_merely_found_counts_only_once_it_runs() {
    use llmgw_agent::engines::Engine;
    // Nothing configured: the binary on PATH is asked, bounded.
    for probe in [LlamaCpp::new(None, 0).probe(), Vllm::default().probe()] {
        match probe {
            Some(Probe::Run { args, .. }) => assert_eq!(args, ["--version"]),
            other => panic!("{other:?}"),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let run = |program| Probe::Run {
        program,
        args: vec!["--version".into()],
    };
    let broken = executable(
        dir.path(),
        "llama-server",
        "echo 'error while loading shared libraries' >&2\nexit 127\n",
    );
    assert_eq!(look(&run(broken), T).await, Found::Absent);
    let works = executable(dir.path(), "vllm", "echo 0.6.3\n");
    assert_eq!(look(&run(works), T).await, Found::Version("0.6.3".into()));
}
