//! The simulated engine as a client sees it. Timing on paused tokio time:
//! the engine's sleeps advance a virtual clock, so the offsets are exact.

#![allow(clippy::unwrap_used, reason = "in tests an unwrap is an assertion")]

mod kv_events;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use llmgw_sim::{SimConfig, SimState, Vocabulary, app};
use serde_json::{Value, json};
use tokio::time::Instant;
use tower::ServiceExt;

/// Tokio's timer has millisecond ticks and rounds a deadline up to the next
/// one, so a virtual duration may read up to 1 ms long.
fn about(ms: u128, want: u128) -> bool {
    (want..=want + 2).contains(&ms)
}

fn config() -> SimConfig {
    SimConfig {
        models: vec!["m".into(), "m2".into()],
        ttft: Duration::from_millis(100),
        // Prefill fast enough to vanish unless a test wants it.
        prefill_tokens_per_s: u32::MAX,
        tokens_per_s: 10,
        ..SimConfig::default()
    }
}

fn engine(config: SimConfig) -> (axum::Router, Arc<SimState>) {
    let state = Arc::new(SimState::new(config));
    (app(state.clone()), state)
}

fn post(path: &str, body: Value) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn chat(stream: bool, max_tokens: u32, content: &str) -> Value {
    json!({"model": "m", "stream": stream, "max_tokens": max_tokens,
           "stream_options": {"include_usage": true},
           "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}]})
}

async fn json_of(resp: axum::response::Response) -> (StatusCode, Value) {
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// Each SSE event with the virtual time it arrived at.
async fn events(resp: axum::response::Response, start: Instant) -> Vec<(Duration, String)> {
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let data = frame.unwrap().into_data().unwrap();
        let text = String::from_utf8(data.to_vec()).unwrap();
        for event in text.split("\n\n").filter(|e| !e.is_empty()) {
            out.push((
                start.elapsed(),
                event.trim_start_matches("data: ").to_owned(),
            ));
        }
    }
    out
}

#[tokio::test(start_paused = true)]
async fn tokens_stream_at_the_simulated_pace_with_usage_last() {
    let (app, _) = engine(config());
    let start = Instant::now();
    let resp = app
        .oneshot(post("/v1/chat/completions", chat(true, 3, "hi")))
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let evs = events(resp, start).await;
    let at: Vec<u128> = evs.iter().map(|(t, _)| t.as_millis()).collect();
    // Role after the time to first token, then one token every 100 ms, and
    // the end right after the last token.
    assert!(about(at[0], 100), "{at:?}");
    let gaps: Vec<u128> = at.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps, vec![100, 100, 100, 0, 0, 0], "{at:?}");
    let parsed: Vec<Value> = evs[..6]
        .iter()
        .map(|(_, e)| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(parsed[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = parsed[1..4]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    // Three tokens of four bytes each (a word and a space).
    assert_eq!(text.len(), 12, "{text}");
    assert!(text.split_inclusive(' ').all(|w| w.len() == 4), "{text}");
    assert_eq!(parsed[4]["choices"][0]["finish_reason"], "length");
    assert_eq!(parsed[5]["choices"], json!([]));
    assert_eq!(parsed[5]["usage"]["completion_tokens"], 3);
    assert_eq!(evs[6].1, "[DONE]");
}

#[tokio::test(start_paused = true)]
async fn without_include_usage_there_is_no_usage_chunk_and_a_plain_reply_has_usage() {
    let (app, _) = engine(config());
    let mut body = chat(true, 2, "hi");
    body.as_object_mut().unwrap().remove("stream_options");
    let evs = events(
        app.clone()
            .oneshot(post("/v1/chat/completions", body))
            .await
            .unwrap(),
        Instant::now(),
    )
    .await;
    assert!(evs.iter().all(|(_, e)| !e.contains("\"usage\"")));
    assert_eq!(evs.last().unwrap().1, "[DONE]");

    let start = Instant::now();
    let (status, reply) = json_of(
        app.clone()
            .oneshot(post("/v1/chat/completions", chat(false, 2, "hi")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        about(start.elapsed().as_millis(), 300),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        reply["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .len(),
        8
    );
    assert_eq!(
        reply["usage"]["total_tokens"],
        reply["usage"]["prompt_tokens"].as_u64().unwrap() + 2
    );

    let (status, text) = json_of(
        app.oneshot(post(
            "/v1/completions",
            json!({"model": "m2", "prompt": "once upon", "max_tokens": 1}),
        ))
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        (
            status,
            text["object"].as_str(),
            text["choices"][0]["text"].as_str().map(str::len)
        ),
        (StatusCode::OK, Some("text_completion"), Some(4))
    );
}

/// Two engines' answers have different ids, and one engine's answers
/// too: a client behind a gateway saw one id for two answers.
#[tokio::test(start_paused = true)]
async fn every_answer_has_its_own_id_across_engines() {
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (app, _) = engine(config());
        for _ in 0..2 {
            let request = post("/v1/chat/completions", chat(false, 1, "hi"));
            let (_, reply) = json_of(app.clone().oneshot(request).await.unwrap()).await;
            ids.push(reply["id"].as_str().unwrap().to_owned());
        }
    }
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "{ids:?}");
}

/// The text of a chat answer, streamed or not.
async fn answer(app: &axum::Router, body: Value) -> (String, Value) {
    let stream = body["stream"].as_bool().unwrap_or(false);
    let resp = app
        .clone()
        .oneshot(post("/v1/chat/completions", body))
        .await
        .unwrap();
    if !stream {
        let (status, v) = json_of(resp).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        let text = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        return (text, v["usage"].clone());
    }
    let evs = events(resp, Instant::now()).await;
    let parsed: Vec<Value> = evs
        .iter()
        .filter(|(_, e)| e != "[DONE]")
        .map(|(_, e)| serde_json::from_str(e).unwrap())
        .collect();
    let text = parsed
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let usage = parsed
        .iter()
        .find_map(|c| c.get("usage"))
        .cloned()
        .unwrap_or_default();
    (text, usage)
}

/// Each choice's text and finish reason, by index, and the usage: from a
/// whole answer or from a stream's chunks, chat or completions.
async fn choices_of(app: &axum::Router, path: &str, body: Value) -> (Vec<(String, String)>, Value) {
    fn put(out: &mut Vec<(String, String)>, c: &Value, text: &str) {
        let i = usize::try_from(c["index"].as_u64().unwrap()).unwrap();
        if out.len() <= i {
            out.resize(i + 1, Default::default());
        }
        out[i].0.push_str(text);
        if let Some(f) = c["finish_reason"].as_str() {
            assert!(out[i].1.is_empty(), "one finish a choice: {c}");
            out[i].1 = f.to_owned();
        }
    }
    let stream = body["stream"].as_bool().unwrap_or(false);
    let resp = app.clone().oneshot(post(path, body)).await.unwrap();
    let mut out = Vec::new();
    if !stream {
        let (status, v) = json_of(resp).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        for c in v["choices"].as_array().unwrap() {
            let text = c["message"]["content"].as_str().or(c["text"].as_str());
            put(&mut out, c, text.unwrap());
        }
        return (out, v["usage"].clone());
    }
    let mut usage = Value::Null;
    for (_, e) in events(resp, Instant::now()).await {
        if e == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&e).unwrap();
        if let Some(u) = v.get("usage") {
            usage = u.clone();
        }
        for c in v["choices"].as_array().unwrap() {
            let text = c["delta"]["content"].as_str().or(c["text"].as_str());
            put(&mut out, c, text.unwrap_or_default());
        }
    }
    (out, usage)
}

/// The same ask on chat or on completions.
fn ask(path: &str, extra: Value) -> Value {
    let mut body = if path.ends_with("chat/completions") {
        json!({"model": "m", "max_tokens": 12, "stream_options": {"include_usage": true},
               "messages": [{"role": "user", "content": "tell me"}]})
    } else {
        json!({"model": "m", "max_tokens": 12, "stream_options": {"include_usage": true},
               "prompt": "tell me"})
    };
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// `stop` ends the answer before the first stop sequence, as OpenAI's
/// does (finish reason `stop`, the sequence not in the text), streamed or
/// not: the sim ignored it, and "sun" came after `stop: ["sun"]`.
#[tokio::test(start_paused = true)]
async fn a_stop_sequence_ends_the_answer_before_it() {
    let (app, _) = engine(config());
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let (whole, _) = choices_of(&app, path, ask(path, json!({}))).await;
        let whole = &whole[0];
        assert_eq!((whole.0.len(), whole.1.as_str()), (48, "length"));
        // The fourth token's word, without its space: met first there or before.
        let stop = whole.0[12..15].to_owned();
        let at = whole.0.find(&stop).unwrap();
        // Tokens up to the one that completes it.
        let generated = (at as u64 + 3).div_ceil(4);
        for stream in [false, true] {
            for stops in [json!(stop), json!(["zzz", stop])] {
                let body = ask(path, json!({"stop": stops, "stream": stream}));
                let start = Instant::now();
                let (got, usage) = choices_of(&app, path, body).await;
                assert_eq!(
                    got,
                    vec![(whole.0[..at].to_owned(), "stop".to_owned())],
                    "{path} stream {stream}, stop {stop:?}"
                );
                assert_eq!(usage["completion_tokens"], generated, "{usage}");
                // It ends there, sooner.
                let ms = start.elapsed().as_millis();
                assert!(about(ms, 100 + 100 * u128::from(generated)), "{ms}");
            }
        }
        // A stop sequence never met changes nothing.
        let (got, _) = choices_of(&app, path, ask(path, json!({"stop": ["zzz"]}))).await;
        assert_eq!(&got[0], whole);
        let (status, err) = json_of(
            app.clone()
                .oneshot(post(path, ask(path, json!({"stop": 3}))))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (status, &err["error"]["param"]),
            (StatusCode::BAD_REQUEST, &json!("stop"))
        );
    }
}

/// `n` asks for that many choices, each with its own index, the first
/// the answer `n` = 1 gives, the others different, as sampled ones are;
/// the usage counts the prompt once and every choice's tokens. The sim
/// gave one choice whatever `n` said.
#[tokio::test(start_paused = true)]
async fn n_gives_that_many_choices_and_usage_counts_them_all() {
    let (app, _) = engine(config());
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let (one, one_usage) = choices_of(&app, path, ask(path, json!({}))).await;
        let mut seen = Vec::new();
        for stream in [false, true] {
            let start = Instant::now();
            let (three, usage) =
                choices_of(&app, path, ask(path, json!({"n": 3, "stream": stream}))).await;
            assert_eq!(three.len(), 3, "{three:?}");
            assert_eq!(three[0], one[0], "{path}: the first choice is the answer");
            assert!(three.iter().all(|(t, f)| t.len() == 48 && f == "length"));
            assert!(
                three[1].0 != three[0].0 && three[2].0 != three[1].0,
                "{three:?}"
            );
            assert_eq!(usage["prompt_tokens"], one_usage["prompt_tokens"]);
            assert_eq!(usage["completion_tokens"], 36, "{usage}");
            assert_eq!(
                usage["total_tokens"],
                one_usage["prompt_tokens"].as_u64().unwrap() + 36
            );
            // Generated side by side, as one batch: as long as one choice.
            let ms = start.elapsed().as_millis();
            assert!(about(ms, 100 + 1200), "{ms}");
            seen.push(three);
        }
        assert_eq!(seen[0], seen[1], "{path}: streamed, the same choices");
        for bad in [json!(0), json!(1.5), json!("2"), json!(1000)] {
            let (status, err) = json_of(
                app.clone()
                    .oneshot(post(path, ask(path, json!({"n": bad}))))
                    .await
                    .unwrap(),
            )
            .await;
            assert_eq!(
                (status, &err["error"]["param"]),
                (StatusCode::BAD_REQUEST, &json!("n"))
            );
        }
    }
    // A tool call, once a choice.
    let tools = json!([{"type": "function", "function": {"name": "weather", "parameters": {}}}]);
    let body = ask("/v1/chat/completions", json!({"n": 2, "tools": tools}));
    let (_, reply) = json_of(
        app.clone()
            .oneshot(post("/v1/chat/completions", body))
            .await
            .unwrap(),
    )
    .await;
    let calls: Vec<&Value> = reply["choices"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            assert_eq!(c["index"], i);
            &c["message"]["tool_calls"][0]["id"]
        })
        .collect();
    assert!(calls.len() == 2 && calls[0] != calls[1], "{reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 24, "{reply}");
}

/// A list of prompts is answered prompt by prompt, each with its `n`
/// choices (numbered prompt after prompt, as OpenAI does), and `echo`
/// repeats each choice's prompt before its text: the sim joined the list
/// into one prompt and one choice, and ignored `echo`.
#[tokio::test(start_paused = true)]
async fn each_prompt_of_a_list_has_its_choices_and_echo_repeats_it() {
    let (app, _) = engine(config());
    let path = "/v1/completions";
    let alone = |prompt: &str, extra: Value| {
        let mut body = ask(path, extra);
        body["prompt"] = json!(prompt);
        body
    };
    let (tell, tell_usage) = choices_of(&app, path, alone("tell me", json!({"n": 2}))).await;
    let (once, once_usage) = choices_of(&app, path, alone("once upon", json!({}))).await;
    for stream in [false, true] {
        let both = ask(
            path,
            json!({"prompt": ["tell me", "once upon"], "stream": stream}),
        );
        let (got, usage) = choices_of(&app, path, both).await;
        assert_eq!(
            got,
            vec![tell[0].clone(), once[0].clone()],
            "stream {stream}"
        );
        let prompt_tokens = tell_usage["prompt_tokens"].as_u64().unwrap()
            + once_usage["prompt_tokens"].as_u64().unwrap();
        assert_eq!(usage["prompt_tokens"], prompt_tokens, "{usage}");
        assert_eq!(usage["completion_tokens"], 24, "{usage}");

        let twice = ask(
            path,
            json!({"prompt": ["tell me", "once upon"], "n": 2, "stream": stream}),
        );
        let (got, _) = choices_of(&app, path, twice).await;
        assert_eq!(got.len(), 4);
        assert_eq!(got[..2], tell[..], "the first prompt's choices first");
        assert_eq!(got[2], once[0]);

        // Echoed: the prompt, then the same answer; the usage unchanged.
        let echoed = ask(
            path,
            json!({"prompt": ["tell me", "once upon"], "echo": true, "stream": stream}),
        );
        let (got, echo_usage) = choices_of(&app, path, echoed).await;
        assert_eq!(got[0].0, format!("tell me{}", tell[0].0));
        assert_eq!(got[1].0, format!("once upon{}", once[0].0));
        assert_eq!(echo_usage, usage);
        // With no tokens to generate, the prompt alone.
        let nothing = alone(
            "tell me",
            json!({"echo": true, "max_tokens": 0, "stream": stream}),
        );
        let (got, _) = choices_of(&app, path, nothing).await;
        assert_eq!(got, vec![("tell me".to_owned(), "length".to_owned())]);
    }
    for (field, bad) in [
        ("prompt", json!([])),
        ("prompt", json!([1, 2])),
        ("prompt", json!([["a"]])),
        ("echo", json!("yes")),
    ] {
        let mut body = ask(path, json!({}));
        body[field] = bad;
        let (status, err) = json_of(app.clone().oneshot(post(path, body)).await.unwrap()).await;
        assert_eq!(
            (status, &err["error"]["param"]),
            (StatusCode::BAD_REQUEST, &json!(field))
        );
    }
}

/// Each choice's `logprobs`, from a whole answer or gathered from a
/// stream's chunks (lists joined; the role's and the finish's null).
async fn logprobs_of(app: &axum::Router, path: &str, body: Value) -> (Vec<Value>, Vec<String>) {
    let stream = body["stream"].as_bool().unwrap_or(false);
    let resp = app.clone().oneshot(post(path, body)).await.unwrap();
    if !stream {
        let (status, v) = json_of(resp).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        let choices = v["choices"].as_array().unwrap();
        let texts = choices
            .iter()
            .map(|c| {
                c["message"]["content"]
                    .as_str()
                    .or(c["text"].as_str())
                    .unwrap()
                    .to_owned()
            })
            .collect();
        return (
            choices.iter().map(|c| c["logprobs"].clone()).collect(),
            texts,
        );
    }
    let (mut out, mut texts): (Vec<Value>, Vec<String>) = (Vec::new(), Vec::new());
    for (_, e) in events(resp, Instant::now()).await {
        let Ok(v) = serde_json::from_str::<Value>(&e) else {
            continue;
        };
        for c in v["choices"].as_array().unwrap() {
            let i = usize::try_from(c["index"].as_u64().unwrap()).unwrap();
            if out.len() <= i {
                out.resize(i + 1, Value::Null);
                texts.resize(i + 1, String::new());
            }
            let text = c["delta"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .unwrap_or_default();
            texts[i].push_str(text);
            let lp = c
                .get("logprobs")
                .expect("asked for, every chunk has logprobs");
            if text.is_empty() {
                assert!(lp.is_null(), "{c}");
                continue;
            }
            let lp = lp.as_object().unwrap();
            if out[i].is_null() {
                out[i] = Value::Object(lp.clone());
                continue;
            }
            for (k, v) in lp {
                if let Some(list) = v.as_array() {
                    out[i][k]
                        .as_array_mut()
                        .unwrap()
                        .extend(list.iter().cloned());
                }
            }
        }
    }
    (out, texts)
}

/// Log probabilities come in OpenAI's shape when asked for, the same on
/// every ask and streamed or not, the token chosen the likeliest (as at
/// temperature 0): the sim answered `logprobs` with none.
#[tokio::test(start_paused = true)]
async fn logprobs_come_as_openai_gives_them() {
    let (app, _) = engine(config());
    let path = "/v1/chat/completions";
    let (plain, _) = choices_of(&app, path, ask(path, json!({}))).await;
    let mut seen = Vec::new();
    for stream in [false, true] {
        let body = ask(
            path,
            json!({"logprobs": true, "top_logprobs": 3, "stream": stream}),
        );
        let (lps, texts) = logprobs_of(&app, path, body).await;
        assert_eq!(texts[0], plain[0].0, "the same answer");
        let content = lps[0]["content"].as_array().unwrap();
        assert_eq!(content.len(), 12);
        let mut joined = String::new();
        for e in content {
            let token = e["token"].as_str().unwrap();
            joined.push_str(token);
            assert_eq!(e["bytes"], json!(token.as_bytes()));
            let lp = e["logprob"].as_f64().unwrap();
            assert!(lp < 0.0, "{e}");
            let top = e["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 3, "{e}");
            assert_eq!(
                (&top[0]["token"], &top[0]["logprob"]),
                (&e["token"], &e["logprob"])
            );
            assert!(
                top.windows(2)
                    .all(|w| w[0]["logprob"].as_f64() > w[1]["logprob"].as_f64())
            );
            assert!(top.iter().all(|t| t["bytes"].is_array()));
        }
        assert_eq!(joined, texts[0]);
        seen.push(lps[0].clone());
    }
    assert_eq!(seen[0], seen[1], "streamed, the same log probabilities");
    let (lps, _) = logprobs_of(&app, path, ask(path, json!({"logprobs": true}))).await;
    assert_eq!(lps[0], {
        let mut bare = seen[0].clone();
        for e in bare["content"].as_array_mut().unwrap() {
            e["top_logprobs"] = json!([]);
        }
        bare
    });

    let path = "/v1/completions";
    let (plain, _) = choices_of(&app, path, ask(path, json!({}))).await;
    let mut seen = Vec::new();
    for stream in [false, true] {
        let body = ask(path, json!({"logprobs": 2, "stream": stream}));
        let (lps, texts) = logprobs_of(&app, path, body).await;
        assert_eq!(texts[0], plain[0].0);
        let lp = &lps[0];
        let tokens = lp["tokens"].as_array().unwrap();
        assert_eq!(tokens.len(), 12, "{lp}");
        for (i, token) in tokens.iter().enumerate() {
            let token = token.as_str().unwrap();
            let at = usize::try_from(lp["text_offset"][i].as_u64().unwrap()).unwrap();
            assert_eq!(&texts[0][at..at + token.len()], token);
            let top = lp["top_logprobs"][i].as_object().unwrap();
            assert_eq!(top.len(), 2, "{lp}");
            assert_eq!(top[token], lp["token_logprobs"][i]);
            assert!(
                top.values()
                    .all(|v| v.as_f64() <= lp["token_logprobs"][i].as_f64())
            );
        }
        seen.push(lp.clone());
    }
    assert_eq!(seen[0], seen[1], "streamed, the same log probabilities");
    // Echoed, the prompt's tokens come first, the first without one.
    for stream in [false, true] {
        let body = ask(
            path,
            json!({"logprobs": 0, "echo": true, "max_tokens": 2, "stream": stream}),
        );
        let (lps, texts) = logprobs_of(&app, path, body).await;
        let lp = &lps[0];
        let tokens: Vec<&str> = lp["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(tokens.concat(), texts[0]);
        assert!(texts[0].starts_with("tell me"));
        assert_eq!(
            (&lp["token_logprobs"][0], &lp["top_logprobs"][0]),
            (&Value::Null, &Value::Null)
        );
        assert!(
            lp["token_logprobs"][1].as_f64().is_some_and(|l| l < 0.0),
            "{lp}"
        );
        assert_eq!(lp["text_offset"][1], tokens[0].len());
        assert_eq!(
            lp["top_logprobs"][tokens.len() - 1]
                .as_object()
                .unwrap()
                .len(),
            1
        );
    }

    for (path, field, bad) in [
        ("/v1/chat/completions", "logprobs", json!({"logprobs": 3})),
        (
            "/v1/chat/completions",
            "top_logprobs",
            json!({"logprobs": true, "top_logprobs": 21}),
        ),
        (
            "/v1/chat/completions",
            "top_logprobs",
            json!({"top_logprobs": 2}),
        ),
        ("/v1/completions", "logprobs", json!({"logprobs": true})),
        ("/v1/completions", "logprobs", json!({"logprobs": 21})),
    ] {
        let (status, err) = json_of(
            app.clone()
                .oneshot(post(path, ask(path, bad)))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (status, &err["error"]["param"]),
            (StatusCode::BAD_REQUEST, &json!(field))
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_answer_cut_and_continued_from_its_text_is_the_uninterrupted_one() {
    let (app, _) = engine(config());
    let (whole, usage) = answer(&app, chat(true, 12, "tell me")).await;
    let (plain, _) = answer(&app, chat(false, 12, "tell me")).await;
    assert_eq!(plain, whole, "the same context, the same answer");
    let (other, _) = answer(&app, chat(false, 12, "tell you")).await;
    assert_ne!(other, whole, "another prompt, another answer");

    // Cut after five tokens; continued as vLLM is asked to.
    let mut rest = chat(true, 7, "tell me");
    rest["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": &whole[..20]}));
    rest["continue_final_message"] = json!(true);
    rest["add_generation_prompt"] = json!(false);
    let (tail, tail_usage) = answer(&app, rest.clone()).await;
    assert_eq!(format!("{}{tail}", &whole[..20]), whole);
    // The text sent is five tokens of the continuation's prompt.
    assert_eq!(
        tail_usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + 5
    );

    // Without a limit the answer ends where it would have: the text
    // already there counts toward its natural length (16 tokens).
    let mut natural = chat(false, 0, "tell me");
    natural.as_object_mut().unwrap().remove("max_tokens");
    let (full, _) = answer(&app, natural.clone()).await;
    assert_eq!(full.len(), 64);
    natural["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": &full[..20]}));
    natural["continue_final_message"] = json!(true);
    natural["add_generation_prompt"] = json!(false);
    let (tail, _) = answer(&app, natural).await;
    assert_eq!(format!("{}{tail}", &full[..20]), full);

    // vLLM's rule: asking to continue needs the generation prompt off.
    rest.as_object_mut()
        .unwrap()
        .remove("add_generation_prompt");
    let (status, err) = json_of(
        app.clone()
            .oneshot(post("/v1/chat/completions", rest))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_cached_prefix_shortens_the_time_to_first_token() {
    let (app, state) = engine(SimConfig {
        ttft: Duration::from_millis(10),
        prefill_tokens_per_s: 1000,
        ..config()
    });
    // A 4,000-byte system prompt is 1,000 tokens: a second of prefill.
    let long = "x".repeat(4000);
    let ask = |user: &str| json!({"model": "m", "max_tokens": 0, "messages": [{"role": "system", "content": long}, {"role": "user", "content": user}]});
    let timed = |body: Value| {
        let app = app.clone();
        async move {
            let start = Instant::now();
            let (status, reply) = json_of(
                app.oneshot(post("/v1/chat/completions", body))
                    .await
                    .unwrap(),
            )
            .await;
            assert_eq!(status, StatusCode::OK);
            (start.elapsed(), reply)
        }
    };
    let (cold, _) = timed(ask("first question")).await;
    let (warm, reply) = timed(ask("second question")).await;
    assert!(cold >= Duration::from_millis(1000), "{cold:?}");
    assert!(warm < Duration::from_millis(40), "{warm:?}");
    assert!(
        reply["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 990
    );
    let metrics = metrics_of(&app).await;
    assert!(
        metrics.contains("vllm:prefix_cache_hits_total{model_name=\"m\"} 62"),
        "{metrics}"
    );
    drop(state);
}

/// Waits, without letting virtual time pass, until the metrics show `line`.
async fn until_metric(app: &axum::Router, line: &str) {
    while !metrics_of(app).await.contains(line) {
        tokio::task::yield_now().await;
    }
}

async fn metrics_of(app: &axum::Router) -> String {
    let resp = app
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn slots_fill_then_the_queue_then_requests_are_refused() {
    let (app, _) = engine(SimConfig {
        slots: 1,
        queue: 1,
        ..config()
    });
    let first = tokio::spawn(
        app.clone()
            .oneshot(post("/v1/chat/completions", chat(false, 10, "a"))),
    );
    until_metric(&app, "vllm:num_requests_running{model_name=\"m\"} 1").await;
    let second = tokio::spawn(
        app.clone()
            .oneshot(post("/v1/chat/completions", chat(false, 1, "b"))),
    );
    until_metric(&app, "vllm:num_requests_waiting{model_name=\"m\"} 1").await;
    let metrics = metrics_of(&app).await;
    assert!(
        metrics.contains("vllm:num_requests_running{model_name=\"m\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("vllm:num_requests_waiting{model_name=\"m\"} 1"),
        "{metrics}"
    );
    let (status, err) = json_of(
        app.clone()
            .oneshot(post("/v1/chat/completions", chat(false, 1, "c")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("queue_full"))
    );
    // The waiting request starts when the first finishes (1.1 s of work).
    let start = Instant::now();
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    let (status, _) = json_of(second.await.unwrap().unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    // Queued behind the first request's 1.1 s, then its own 200 ms.
    assert!(
        about(start.elapsed().as_millis(), 1300),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_that_goes_away_frees_its_slot() {
    let (app, _) = engine(SimConfig {
        slots: 1,
        ..config()
    });
    let resp = app
        .clone()
        .oneshot(post("/v1/chat/completions", chat(true, 100, "long")))
        .await
        .unwrap();
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body);
    let start = Instant::now();
    let (status, _) = json_of(
        app.clone()
            .oneshot(post("/v1/chat/completions", chat(false, 1, "next")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        about(start.elapsed().as_millis(), 200),
        "waited for the abandoned stream: {:?}",
        start.elapsed()
    );
}

/// A client that goes away while its request waits for a slot is no
/// longer counted waiting (the gauge stayed one up, and a control plane
/// reading it saw a busy model that served nothing).
#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_the_queue_is_no_longer_counted_waiting() {
    let (app, _) = engine(SimConfig {
        slots: 1,
        ..config()
    });
    let first = tokio::spawn(
        app.clone()
            .oneshot(post("/v1/chat/completions", chat(false, 10, "a"))),
    );
    until_metric(&app, "vllm:num_requests_running{model_name=\"m\"} 1").await;
    let queued = tokio::spawn(
        app.clone()
            .oneshot(post("/v1/chat/completions", chat(false, 1, "b"))),
    );
    until_metric(&app, "vllm:num_requests_waiting{model_name=\"m\"} 1").await;
    queued.abort();
    // A few turns of the scheduler for the abort to land; no time passes.
    let mut metrics = String::new();
    for _ in 0..1000 {
        metrics = metrics_of(&app).await;
        if metrics.contains("vllm:num_requests_waiting{model_name=\"m\"} 0") {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(
        metrics.contains("vllm:num_requests_waiting{model_name=\"m\"} 0"),
        "{metrics}"
    );
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    until_metric(&app, "vllm:num_requests_running{model_name=\"m\"} 0").await;
}

#[tokio::test(start_paused = true)]
async fn bad_requests_get_the_openai_error_envelope() {
    let (app, _) = engine(config());
    let raw = Request::post("/v1/chat/completions")
        .body(Body::from("{not json"))
        .unwrap();
    let cases = vec![
        (raw, StatusCode::BAD_REQUEST, "invalid_request"),
        (
            post("/v1/chat/completions", json!({"messages": []})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            post(
                "/v1/chat/completions",
                json!({"model": "m", "messages": "hi"}),
            ),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            post(
                "/v1/chat/completions",
                json!({"model": "nope", "messages": []}),
            ),
            StatusCode::NOT_FOUND,
            "model_not_found",
        ),
        (
            post("/v1/embeddings", json!({"model": "nope", "input": "x"})),
            StatusCode::NOT_FOUND,
            "model_not_found",
        ),
        (
            post("/v1/embeddings", json!({"model": "m", "input": 3})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
    ];
    for (req, want, code) in cases {
        let (status, body) = json_of(app.clone().oneshot(req).await.unwrap()).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (want, Some(code)),
            "{body}"
        );
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        assert!(body["error"]["type"].is_string());
    }
}

/// A request OpenAI refuses is refused here too, naming the field in
/// `param`: an empty chat and a made-up role were answered, and the
/// errors left `param` out, so a client could not say what was wrong.
#[tokio::test(start_paused = true)]
async fn a_refused_field_is_named_in_param() {
    let (app, _) = engine(config());
    let chat_with = |messages: Value| json!({"model": "m", "messages": messages});
    let cases = vec![
        (
            "/v1/chat/completions",
            chat_with(json!([])),
            StatusCode::BAD_REQUEST,
            json!("messages"),
        ),
        (
            "/v1/chat/completions",
            chat_with(json!([{"role": "bogus", "content": "x"}])),
            StatusCode::BAD_REQUEST,
            json!("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            chat_with(json!([{"role": "user", "content": "x"}, {"content": "y"}])),
            StatusCode::BAD_REQUEST,
            json!("messages[1].role"),
        ),
        (
            "/v1/chat/completions",
            chat_with(json!([{"role": "user", "content": 3}])),
            StatusCode::BAD_REQUEST,
            json!("messages[0].content"),
        ),
        (
            "/v1/chat/completions",
            chat_with(json!("hi")),
            StatusCode::BAD_REQUEST,
            json!("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}]}),
            StatusCode::BAD_REQUEST,
            json!("model"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
            StatusCode::NOT_FOUND,
            json!("model"),
        ),
        (
            "/v1/completions",
            json!({"model": "m", "prompt": 3}),
            StatusCode::BAD_REQUEST,
            json!("prompt"),
        ),
        (
            "/v1/embeddings",
            json!({"model": "m", "input": 3}),
            StatusCode::BAD_REQUEST,
            json!("input"),
        ),
        (
            "/tokenize",
            chat_with(json!([{"role": "bogus", "content": "x"}])),
            StatusCode::BAD_REQUEST,
            json!("messages[0].role"),
        ),
    ];
    for (path, body, status, param) in cases {
        let (got, reply) = json_of(app.clone().oneshot(post(path, body)).await.unwrap()).await;
        assert_eq!((got, &reply["error"]["param"]), (status, &param), "{reply}");
        assert!(reply["error"]["message"].is_string(), "{reply}");
    }
    // Every role OpenAI knows is served.
    let roles = json!([{"role": "developer", "content": "a"}, {"role": "system", "content": "b"},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"},
        {"role": "tool", "content": "e", "tool_call_id": "1"}, {"role": "function", "content": "f", "name": "g"},
        {"role": "user", "content": "h"}]);
    let (status, reply) = json_of(
        app.clone()
            .oneshot(post("/v1/chat/completions", chat_with(roles)))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    // An error with no field to blame still has `param`, as null.
    let raw = Request::post("/v1/chat/completions")
        .body(Body::from("{not json"))
        .unwrap();
    let (_, reply) = json_of(app.oneshot(raw).await.unwrap()).await;
    assert_eq!(reply["error"].get("param"), Some(&Value::Null), "{reply}");
}

#[tokio::test(start_paused = true)]
async fn embeddings_models_and_health() {
    let (app, _) = engine(config());
    let (_, e) = json_of(
        app.clone()
            .oneshot(post(
                "/v1/embeddings",
                json!({"model": "m", "input": ["a", "b"]}),
            ))
            .await
            .unwrap(),
    )
    .await;
    let vecs: Vec<Vec<f64>> = e["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| serde_json::from_value(d["embedding"].clone()).unwrap())
        .collect();
    assert_eq!(vecs.len(), 2);
    assert!(
        (vecs[0].iter().map(|x| x * x).sum::<f64>() - 1.0).abs() < 1e-4,
        "unit length"
    );
    assert_ne!(vecs[0], vecs[1]);
    let (_, again) = json_of(
        app.clone()
            .oneshot(post("/v1/embeddings", json!({"model": "m", "input": "a"})))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        again["data"][0]["embedding"], e["data"][0]["embedding"],
        "deterministic"
    );
    let (_, models) = json_of(
        app.clone()
            .oneshot(Request::get("/v1/models").body(Body::empty()).unwrap())
            .await
            .unwrap(),
    )
    .await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["m", "m2"]);
    let health = app
        .oneshot(Request::get("/health").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn metrics_use_the_vocabulary_of_the_engine_imitated() {
    for (vocabulary, present, absent) in [
        (
            Vocabulary::Vllm,
            vec![
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc",
            ],
            "sglang:",
        ),
        (
            Vocabulary::Sglang,
            vec![
                "sglang:num_running_reqs",
                "sglang:num_queue_reqs",
                "sglang:token_usage",
            ],
            "vllm:",
        ),
        (
            Vocabulary::Llamacpp,
            vec!["llamacpp:requests_processing", "llamacpp:requests_deferred"],
            "kv_cache",
        ),
        (
            Vocabulary::Sim,
            vec![
                "llmgw_sim_running",
                "llmgw_sim_waiting",
                "llmgw_sim_kv_cache_usage",
            ],
            "vllm:",
        ),
    ] {
        let (app, _) = engine(SimConfig {
            vocabulary,
            ..config()
        });
        let page = metrics_of(&app).await;
        for name in present {
            assert!(
                page.contains(name),
                "{vocabulary:?}: {name} missing from\n{page}"
            );
        }
        assert!(
            !page.contains(absent),
            "{vocabulary:?}: {absent} present in\n{page}"
        );
    }
}

/// A chat offering tools is answered by the engine's `--tools` mode: a
/// `tool_calls` message (plain and streamed), the call as `<tool_call>`
/// text, or a plain answer; `tool_choice: none` is a plain answer always.
#[tokio::test(start_paused = true)]
async fn tools_are_called_as_the_mode_says() {
    let with_tools = |stream: bool, choice: &str| {
        let mut body = chat(stream, 4, "weather in Paris?");
        body["tools"] = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
        body["tool_choice"] = json!(choice);
        body
    };
    let (app, _) = engine(config());
    let (_, v) = json_of(
        app.clone()
            .oneshot(post("/v1/chat/completions", with_tools(false, "auto")))
            .await
            .unwrap(),
    )
    .await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["arguments"],
        "{}"
    );
    assert_eq!(choice["message"]["content"], Value::Null);

    let resp = app
        .clone()
        .oneshot(post("/v1/chat/completions", with_tools(true, "auto")))
        .await
        .unwrap();
    let evs = events(resp, Instant::now()).await;
    let first: Value = serde_json::from_str(&evs[0].1).unwrap();
    let call = &first["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(
        (call["index"].as_u64(), call["function"]["name"].as_str()),
        (Some(0), Some("get_weather"))
    );
    let finish: Value = serde_json::from_str(&evs[1].1).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(evs.last().unwrap().1, "[DONE]");

    let (_, v) = json_of(
        app.oneshot(post("/v1/chat/completions", with_tools(false, "none")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");

    let (text, _) = engine(SimConfig {
        tools: llmgw_sim::ToolCalls::Text,
        ..config()
    });
    let (_, v) = json_of(
        text.oneshot(post("/v1/chat/completions", with_tools(false, "auto")))
            .await
            .unwrap(),
    )
    .await;
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        content.starts_with("<tool_call>\n{") && content.contains("\"get_weather\""),
        "{content}"
    );
    assert_eq!(v["choices"][0]["message"]["tool_calls"], Value::Null);

    let (deaf, _) = engine(SimConfig {
        tools: llmgw_sim::ToolCalls::Ignore,
        ..config()
    });
    let (_, v) = json_of(
        deaf.oneshot(post("/v1/chat/completions", with_tools(false, "auto")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(
        !v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("<tool_call>")
    );
}

/// With the model's context set (as the agent starts it from the
/// catalog's `context_length`), a prompt and completion that do not fit
/// are refused as vLLM refuses them, and /v1/models says the length.
#[tokio::test(start_paused = true)]
async fn a_request_past_the_models_context_is_refused_as_vllm_refuses_it() {
    let (app, _) = engine(SimConfig {
        max_model_len: Some(64),
        ..config()
    });
    // "be brief" and 20 bytes of question: well under 64 tokens with 8 more.
    let (status, _) = json_of(
        app.clone()
            .oneshot(post(
                "/v1/chat/completions",
                chat(false, 8, "what is the time now"),
            ))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let long = "word ".repeat(60);
    let (status, err) = json_of(
        app.clone()
            .oneshot(post("/v1/chat/completions", chat(false, 8, &long)))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    assert_eq!(
        (&err["error"]["code"], &err["error"]["param"]),
        (&json!("context_length_exceeded"), &json!("messages"))
    );
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "This model's maximum context length is 64 tokens. However, you requested"
        ),
        "{message}"
    );
    // The completion counts too: a short prompt asking for too much.
    let (status, _) = json_of(
        app.clone()
            .oneshot(post("/v1/chat/completions", chat(false, 100, "hi")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let models = app
        .oneshot(Request::get("/v1/models").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (_, models) = json_of(models).await;
    assert_eq!(models["data"][0]["max_model_len"], 64, "{models}");
}
