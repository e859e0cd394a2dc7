//! `llmgw ctl tool-check M` through a real gateway to sim engines that
//! answer tools in each of the three ways a real deployment can: lifted
//! out as `tool_calls`, written as `<tool_call>` text, or ignored.

use serde_json::{Value, json};

use super::Child;

fn engine(model: &str, tools: &str) -> (Child, String) {
    let e = Child::spawn(&[
        "sim-engine",
        "--listen",
        "127.0.0.1:0",
        "--model",
        model,
        "--tools",
        tools,
        "--ttft-ms",
        "1",
        "--tps",
        "1000",
    ]);
    let addr = e.addr_after("listening on ");
    (e, format!("{model}=http://{addr}={model}"))
}

fn tool_check(base: &str, model: &str, json: bool) -> (Option<i32>, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_llmgw"));
    cmd.args(["ctl", "tool-check", model, "--url", base]);
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
async fn tool_check_tells_a_parsed_call_from_a_textual_one_and_from_none() {
    let (_a, native) = engine("native", "native");
    let (_b, text) = engine("textual", "text");
    let (_c, ignore) = engine("deaf", "ignore");
    let server = Child::spawn(&[
        "server",
        "--endpoint",
        &native,
        "--endpoint",
        &text,
        "--endpoint",
        &ignore,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let base = format!("http://{}", server.addr_after("client listening on "));
    let http = reqwest::Client::new();
    super::until("the gateway serving all three", || async {
        for m in ["native", "textual", "deaf"] {
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

    let (code, out, err) = tool_check(&base, "native", false);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("ok: called get_weather({})"), "{out}");
    assert!(out.contains("native: tool calling works"), "{out}");

    let (code, out, _) = tool_check(&base, "textual", true);
    assert_eq!(code, Some(1), "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], false);
    for mode in ["plain", "streamed"] {
        assert_eq!(v[mode]["verdict"], "text", "{v}");
        assert!(
            v[mode]["content"].as_str().unwrap().contains("<tool_call>"),
            "{v}"
        );
    }
    assert!(
        v["plain_advice"]
            .as_str()
            .unwrap()
            .contains("--tool-call-parser"),
        "{v}"
    );

    let (code, out, _) = tool_check(&base, "deaf", false);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("ignored the tool") && out.contains("does not do tool calling"),
        "{out}"
    );
    assert!(out.contains("deaf: tool calling does NOT work"), "{out}");

    // A model the gateway does not serve is an error, not a verdict.
    let (code, _, err) = tool_check(&base, "nope", false);
    assert_eq!(code, Some(1));
    assert!(err.contains("the gateway answered 404"), "{err}");

    // A gateway with keys on: the check says how to give it one.
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("keys.db").display());
    let gateway = Child::spawn(&[
        "--store",
        &store,
        "server",
        "--endpoint",
        &native,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--auth",
    ]);
    let keyed = format!("http://{}", gateway.addr_after("client listening on "));
    let (code, _, err) = tool_check(&keyed, "native", false);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("the gateway answered 401")
            && err.contains("give --api-key (or LLMGW_API_KEY)"),
        "{err}"
    );
}
