//! `llmgw ctl tool-check M`: one tool-calling request through the
//! gateway, plain and streamed, and what came back: `tool_calls` (the
//! engine's tool parser lifted the call out), the call written as
//! `<tool_call>` text (the model calls tools but the engine's parser is
//! off or wrong for it), or an answer that ignored the tool.

use std::io::Write;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::Outcome;
use crate::output::{Table, json_line};

#[derive(Debug, clap::Args)]
pub(crate) struct ToolCheckArgs {
    /// The model to ask (a name or alias the gateway serves).
    model: String,
    /// The gateway's client (OpenAI) API.
    #[arg(long, env = "LLMGW_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// An API key, when the gateway requires one.
    #[arg(long, env = "LLMGW_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
}

/// The tool offered: one function with one required argument.
const TOOL: &str = "get_weather";

fn request(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "You can call tools. Call one whenever it answers the question."},
            {"role": "user", "content": "What is the weather in Paris right now? Use the get_weather tool."},
        ],
        "tools": [{"type": "function", "function": {
            "name": TOOL,
            "description": "The current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }}],
        "tool_choice": "auto",
        "max_tokens": 256,
        "temperature": 0,
        "stream": stream,
    })
}

/// What one answer did with the tool.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Verdict {
    /// `tool_calls` came back.
    ToolCalls,
    /// No `tool_calls`, but `<tool_call>` in the text.
    Text,
    /// Neither.
    Ignored,
}

#[derive(Debug, serde::Serialize)]
pub(crate) struct Answer {
    pub verdict: Verdict,
    /// The functions called, with their arguments as sent.
    pub calls: Vec<(String, String)>,
    pub content: String,
    pub finish_reason: Option<String>,
}

/// Reads a whole (non-streamed) chat completion.
pub(crate) fn from_body(body: &Value) -> Answer {
    let choice = &body["choices"][0];
    let m = &choice["message"];
    let calls = m["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                c["function"]["arguments"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    let content = m["content"].as_str().unwrap_or_default().to_owned();
    answer(calls, content, choice["finish_reason"].as_str())
}

/// Reads a streamed one: `tool_calls` deltas are joined by their index
/// (the name comes once, the arguments in pieces).
pub(crate) fn from_stream(text: &str) -> Answer {
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut content = String::new();
    let mut finish = None;
    for data in text.lines().filter_map(|l| l.strip_prefix("data:")) {
        let Ok(chunk) = serde_json::from_str::<Value>(data.trim()) else {
            continue;
        };
        let choice = &chunk["choices"][0];
        let d = &choice["delta"];
        content.push_str(d["content"].as_str().unwrap_or_default());
        for c in d["tool_calls"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap_or(0) as usize;
            if calls.len() <= i {
                calls.resize(i + 1, Default::default());
            }
            calls[i]
                .0
                .push_str(c["function"]["name"].as_str().unwrap_or_default());
            calls[i]
                .1
                .push_str(c["function"]["arguments"].as_str().unwrap_or_default());
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
    }
    answer(calls, content, finish.as_deref())
}

fn answer(calls: Vec<(String, String)>, content: String, finish: Option<&str>) -> Answer {
    let verdict = if !calls.is_empty() {
        Verdict::ToolCalls
    } else if content.contains("<tool_call>") {
        Verdict::Text
    } else {
        Verdict::Ignored
    };
    Answer {
        verdict,
        calls,
        content,
        finish_reason: finish.map(str::to_owned),
    }
}

/// What a person should do about an answer.
fn advice(a: &Answer) -> String {
    match a.verdict {
        Verdict::ToolCalls => {
            let (name, args) = &a.calls[0];
            let parsed = serde_json::from_str::<Value>(if args.is_empty() { "{}" } else { args });
            match (name.as_str(), parsed) {
                (TOOL, Ok(_)) => format!("ok: called {name}({args})"),
                (TOOL, Err(_)) => format!("tool_calls came back, but its arguments are not JSON: {args}"),
                (other, _) => format!("tool_calls came back, but for {other:?}, which was not offered"),
            }
        }
        Verdict::Text => "the model wrote the call as <tool_call> text: it calls tools, but the engine did not parse it out (vLLM: --enable-auto-tool-choice and the --tool-call-parser for this model, e.g. hermes; SGLang: --tool-call-parser; llama.cpp: --jinja)".into(),
        Verdict::Ignored => "the model answered without calling the tool: it (or its chat template) does not do tool calling".into(),
    }
}

async fn ask(http: &reqwest::Client, args: &ToolCheckArgs, stream: bool) -> anyhow::Result<Answer> {
    let url = format!("{}/v1/chat/completions", args.url.trim_end_matches('/'));
    let mut r = http.post(&url).json(&request(&args.model, stream));
    if let Some(k) = &args.api_key {
        r = r.bearer_auth(k);
    }
    let resp = r.send().await.with_context(|| {
        format!(
            "cannot reach the gateway at {}; --url sets its address",
            args.url
        )
    })?;
    let status = resp.status();
    let text = resp.text().await?;
    if !status.is_success() {
        let why = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or(text);
        // A server with keys on: the check is a client like any other.
        let hint = match (status.as_u16(), &args.api_key) {
            (401, None) => "; it wants an API key: give --api-key (or LLMGW_API_KEY)",
            (401, Some(_)) => "; the key given (--api-key or LLMGW_API_KEY) is not one it knows",
            _ => "",
        };
        bail!("the gateway answered {status}: {why}{hint}");
    }
    if stream {
        Ok(from_stream(&text))
    } else {
        let body: Value = serde_json::from_str(&text)
            .with_context(|| format!("{url} answered something that is not JSON"))?;
        Ok(from_body(&body))
    }
}

pub(crate) async fn run(json_out: bool, args: ToolCheckArgs) -> anyhow::Result<Outcome> {
    let http = reqwest::Client::new();
    let plain = ask(&http, &args, false).await?;
    let streamed = ask(&http, &args, true).await?;
    let passed = [&plain, &streamed]
        .iter()
        .all(|a| a.verdict == Verdict::ToolCalls && advice(a).starts_with("ok"));
    let mut out = std::io::stdout().lock();
    if json_out {
        json_line(
            &mut out,
            &json!({"model": args.model, "ok": passed,
                    "plain": plain, "streamed": streamed,
                    "plain_advice": advice(&plain), "streamed_advice": advice(&streamed)}),
        )?;
    } else {
        let mut t = Table::new(vec!["REQUEST", "VERDICT", "FINISH", "WHAT IT MEANS"]);
        for (name, a) in [("plain", &plain), ("streamed", &streamed)] {
            let verdict = match a.verdict {
                Verdict::ToolCalls => "tool_calls",
                Verdict::Text => "<tool_call> text",
                Verdict::Ignored => "ignored the tool",
            };
            t.row(vec![
                name.into(),
                verdict.into(),
                a.finish_reason.clone().unwrap_or_else(|| "-".into()),
                advice(a),
            ]);
        }
        t.print(&mut out)?;
        writeln!(
            out,
            "{}: tool calling {}",
            args.model,
            if passed { "works" } else { "does NOT work" }
        )?;
    }
    Ok(if passed { Outcome::Ok } else { Outcome::Failed })
}
