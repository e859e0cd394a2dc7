//! `llmgw ctl bench M` through a real gateway to a sim engine with two
//! slots: the third concurrent request waits a whole request for a slot,
//! so the TTFT SLO holds at concurrency 2 and breaks at 4.

use serde_json::{Value, json};

use super::Child;

/// A sim engine whose request takes about 20 ms to the first token and
/// 30 tokens at 20 tokens/s after it: a request waiting for a slot waits
/// at least the 1.5 s a request holds its slot (the engine's own clock, so
/// load can only lengthen it), past the 1 s SLO, while one that gets a
/// slot at once sees its first token after about 20 ms, and tokens come
/// every 50 ms against a 1 s ITL SLO. The margins are wide both ways
/// because a loaded machine moves the unqueued figures: at load 25 a CI
/// run saw a TTFT p99 of 256 ms and an ITL p99 of 108 ms for 20 ms
/// nominal.
fn engine(model: &str, ttft_ms: &str) -> (Child, String) {
    let e = Child::spawn(&[
        "sim-engine",
        "--listen",
        "127.0.0.1:0",
        "--model",
        model,
        "--slots",
        "2",
        "--ttft-ms",
        ttft_ms,
        "--tps",
        "20",
    ]);
    let addr = e.addr_after("listening on ");
    (e, format!("{model}=http://{addr}={model}"))
}

fn bench(base: &str, model: &str, requests: &str, json: bool) -> (Option<i32>, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"));
    cmd.args([
        "ctl",
        "bench",
        model,
        "--url",
        base,
        "--slo-ttft-p99",
        "1000",
        "--slo-itl-p99",
        "1000",
        "--requests",
        requests,
        "--max-tokens",
        "30",
        "--max-concurrency",
        "16",
    ]);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_reports_the_last_level_before_requests_queue_for_a_slot() {
    let (_a, steady) = engine("steady", "20");
    let (_b, slow) = engine("slow", "2500");
    let server = Child::spawn(&[
        "server",
        "--endpoint",
        &steady,
        "--endpoint",
        &slow,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let base = format!("http://{}", server.addr_after("client listening on "));
    let http = reqwest::Client::new();
    super::until("the gateway serving both", || async {
        for m in ["steady", "slow"] {
            let r = http
                .post(format!("{base}/v1/chat/completions"))
                .json(&json!({"model": m, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())?;
        }
        Some(())
    })
    .await;

    let (code, out, err) = bench(&base, "steady", "6", true);
    assert_eq!(code, Some(0), "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let levels = v["levels"].as_array().unwrap();
    let tried: Vec<u64> = levels
        .iter()
        .map(|l| l["concurrency"].as_u64().unwrap())
        .collect();
    assert_eq!(
        tried,
        [1, 2, 4],
        "it stops at the first level that breaks: {v}"
    );
    assert_eq!(v["last_passing"]["concurrency"], 2, "{v}");
    assert_eq!(v["suggested_weight"], 2, "{v}");
    assert_eq!(v["slo_broke"], true, "{v}");
    assert!(
        levels[2]["broke"].as_str().unwrap().starts_with("TTFT p99"),
        "queueing shows in the time to first token: {v}"
    );
    for l in levels {
        assert_eq!(l["errors"], 0, "{v}");
        assert!(l["requests"].as_u64().unwrap() >= 6, "{v}");
        assert!(l["tokens_per_s"].as_f64().unwrap() > 0.0, "{v}");
    }

    // The table says the same, and offers the weight.
    let (code, out, err) = bench(&base, "steady", "4", false);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("steady: last passing level: concurrency 2"),
        "{out}"
    );
    assert!(out.contains("weight: 2"), "{out}");

    // A model too slow for the SLO even alone: no weight, exit 1.
    let (code, out, err) = bench(&base, "slow", "1", false);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("even concurrency 1 breaks the SLO"), "{out}");

    // A model the gateway does not serve fails every request, with why.
    let (code, out, _) = bench(&base, "nope", "1", true);
    assert_eq!(code, Some(1), "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["levels"][0]["broke"]
            .as_str()
            .unwrap()
            .contains("the gateway answered 404"),
        "{v}"
    );
    // Each client stops at its first failure (one client at level 1).
    assert_eq!(v["levels"][0]["requests"], 1, "{v}");

    // Nothing listening, for a level's whole time: it breaks, no weight.
    let closed = format!("http://127.0.0.1:{}", super::cluster::free_port());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args([
            "ctl",
            "bench",
            "m",
            "--url",
            &closed,
            "--duration",
            "200ms",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["suggested_weight"].is_null(), "{v}");
    assert!(
        v["levels"][0]["broke"]
            .as_str()
            .unwrap()
            .contains("cannot reach the gateway"),
        "{v}"
    );
    // A malformed address is a usage error.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["ctl", "bench", "m", "--url", "notaurl"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
