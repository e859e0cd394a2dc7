//! A chat completion's answer as a Responses API response object, whole
//! or (for a stream's lifecycle events) as it stands.

use serde_json::{Map, Value, json};

use super::request::Asked;

/// The ids a response and its items are known by, from the chat
/// completion's own id so that one answer keeps one name in the logs.
#[derive(Debug, Clone)]
pub(crate) struct Ids {
    pub(crate) response: String,
    stem: String,
}

impl Ids {
    pub(crate) fn from_chat(chat_id: Option<&str>) -> Ids {
        let stem = chat_id
            .map(|id| id.trim_start_matches("chatcmpl-").to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(fresh);
        Ids {
            response: format!("resp_{stem}"),
            stem,
        }
    }

    pub(crate) fn item(&self, prefix: &str, n: usize) -> String {
        format!("{prefix}_{}_{n}", self.stem)
    }
}

/// An id for an answer that came without one: the time and a count,
/// unique within this process's life.
fn fresh() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{:x}{n:x}", crate::proxy::now_ms())
}

/// How a response stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    InProgress,
    Completed,
    /// Cut by its token limit or a content filter.
    Incomplete(&'static str),
    Failed,
}

/// What names a response: its ids, when it was made, the model that
/// answered.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub(crate) ids: Ids,
    pub(crate) created: i64,
    pub(crate) model: String,
}

impl Head {
    /// From a chat completion or its first chunk.
    pub(crate) fn of(chat: &Value) -> Head {
        Head {
            ids: Ids::from_chat(chat.get("id").and_then(Value::as_str)),
            created: chat.get("created").and_then(Value::as_i64).unwrap_or(0),
            model: chat
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        }
    }
}

/// The response object: the request's settings repeated, the output
/// and usage so far.
pub(crate) fn response(
    asked: &Asked,
    head: &Head,
    status: Status,
    output: Vec<Value>,
    usage: Option<Value>,
    error: Option<Value>,
) -> Value {
    let echo = |k: &str, default: Value| asked.echo.get(k).cloned().unwrap_or(default);
    let (status, incomplete) = match status {
        Status::InProgress => ("in_progress", Value::Null),
        Status::Completed => ("completed", Value::Null),
        Status::Incomplete(why) => ("incomplete", json!({"reason": why})),
        Status::Failed => ("failed", Value::Null),
    };
    let mut reasoning = json!({"effort": null, "summary": null});
    if let Some(Value::Object(r)) = asked.echo.get("reasoning") {
        for (k, v) in r {
            reasoning[k] = v.clone();
        }
    }
    json!({
        "id": head.ids.response,
        "object": "response",
        "created_at": head.created,
        "status": status,
        "background": false,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": echo("instructions", Value::Null),
        "max_output_tokens": echo("max_output_tokens", Value::Null),
        "max_tool_calls": null,
        "metadata": echo("metadata", json!({})),
        "model": head.model,
        "output": output,
        "parallel_tool_calls": echo("parallel_tool_calls", json!(true)),
        "previous_response_id": null,
        "prompt_cache_key": echo("prompt_cache_key", Value::Null),
        "reasoning": reasoning,
        "safety_identifier": echo("safety_identifier", Value::Null),
        "service_tier": "default",
        "store": false,
        "temperature": echo("temperature", json!(1.0)),
        "text": echo("text", json!({"format": {"type": "text"}})),
        "tool_choice": echo("tool_choice", json!("auto")),
        "tools": echo("tools", json!([])),
        "top_logprobs": echo("top_logprobs", json!(0)),
        "top_p": echo("top_p", json!(1.0)),
        "truncation": echo("truncation", json!("disabled")),
        "usage": usage,
        "user": echo("user", Value::Null),
    })
}

/// A chat completion's usage in the Responses API's names.
pub(crate) fn usage(chat: &Value) -> Option<Value> {
    let u = chat.as_object()?;
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let cached = chat
        .pointer("/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let reasoning = chat
        .pointer("/completion_tokens_details/reasoning_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let (input, output) = (n("prompt_tokens"), n("completion_tokens"));
    Some(json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": u.get("total_tokens").and_then(Value::as_u64)
            .unwrap_or_else(|| input.saturating_add(output)),
    }))
}

/// What a finish reason makes of the response.
pub(crate) fn status_of(finish: Option<&str>) -> Status {
    match finish {
        Some("length") => Status::Incomplete("max_output_tokens"),
        Some("content_filter") => Status::Incomplete("content_filter"),
        // vLLM's for an aborted request or one its engine failed.
        Some("abort" | "error") => Status::Failed,
        _ => Status::Completed,
    }
}

/// An item's own status once the answer ends: cut short with it.
pub(crate) fn item_status(status: Status) -> &'static str {
    match status {
        Status::Completed | Status::InProgress => "completed",
        Status::Incomplete(_) | Status::Failed => "incomplete",
    }
}

/// The error a response failed with when its engine said no more than
/// its finish reason.
pub(crate) fn finish_error(finish: Option<&str>) -> Value {
    json!({"code": "server_error",
        "message": format!("the engine ended the answer ({})", finish.unwrap_or("no finish reason"))})
}

pub(crate) fn message_item(id: &str, text: &str, logprobs: &[Value], status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
        "content": [text_part(text, logprobs)]})
}

/// The text and its tokens' log probabilities: chat's `logprobs.content`
/// entries (token, logprob, bytes, top_logprobs) are the Responses API's
/// in the same shape.
pub(crate) fn text_part(text: &str, logprobs: &[Value]) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
}

/// A choice's (or a chunk's choice's) log probabilities, if it has any.
pub(crate) fn logprobs_of(choice: &Value) -> &[Value] {
    choice
        .pointer("/logprobs/content")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

pub(crate) fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [],
        "content": [{"type": "reasoning_text", "text": text}]})
}

pub(crate) fn call_item(
    id: &str,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
        "arguments": arguments, "status": status})
}

/// The reasoning text an engine put beside the answer (vLLM and SGLang
/// say `reasoning_content`, newer vLLM `reasoning`).
pub(crate) fn reasoning_of(m: &Map<String, Value>) -> Option<&str> {
    m.get("reasoning_content")
        .or(m.get("reasoning"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// A whole chat completion as a response; None when it is not one.
pub(crate) fn from_chat(asked: &Asked, chat: &Value) -> Option<Value> {
    let head = Head::of(chat);
    let ids = &head.ids;
    let choice = chat.get("choices")?.get(0)?;
    let message = choice.get("message")?.as_object()?;
    let mut output = Vec::new();
    if let Some(r) = reasoning_of(message) {
        output.push(reasoning_item(&ids.item("rs", 0), r));
    }
    let calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let finish = choice.get("finish_reason").and_then(Value::as_str);
    let status = status_of(finish);
    let state = item_status(status);
    let text = message.get("content").and_then(Value::as_str).unwrap_or("");
    if !text.trim().is_empty() || calls.is_empty() {
        let logprobs = logprobs_of(choice);
        output.push(message_item(
            &ids.item("msg", output.len()),
            text,
            logprobs,
            state,
        ));
    }
    for (k, call) in calls.iter().enumerate() {
        let f = &call["function"];
        let n = output.len();
        let call_id = call["id"]
            .as_str()
            .filter(|c| !c.is_empty())
            .map_or_else(|| ids.item("call", k), str::to_owned);
        output.push(call_item(
            &ids.item("fc", n),
            &call_id,
            f["name"].as_str().unwrap_or_default(),
            f["arguments"].as_str().unwrap_or("{}"),
            state,
        ));
    }
    let error = (status == Status::Failed).then(|| finish_error(finish));
    Some(response(
        asked,
        &head,
        status,
        output,
        chat.get("usage").and_then(usage),
        error,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_answer_with_reasoning_and_calls_is_one_response() {
        let asked = Asked {
            echo: json!({"instructions": "be brief", "metadata": {"k": "v"}})
                .as_object()
                .cloned()
                .unwrap(),
        };
        let chat = json!({"id": "chatcmpl-abc", "created": 7, "model": "m", "choices": [{
            "index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
            "content": null, "reasoning_content": "think",
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\":1}"}}]}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}});
        let r = from_chat(&asked, &chat).unwrap();
        assert_eq!(r["id"], "resp_abc");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["instructions"], "be brief");
        assert_eq!(r["metadata"], json!({"k": "v"}));
        assert_eq!(
            r["output"],
            json!([
                {"type": "reasoning", "id": "rs_abc_0", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "think"}]},
                {"type": "function_call", "id": "fc_abc_1", "call_id": "call_1", "name": "f",
                 "arguments": "{\"a\":1}", "status": "completed"},
            ])
        );
        assert_eq!(r["usage"]["input_tokens"], 5);
        assert_eq!(r["usage"]["output_tokens"], 3);
        assert_eq!(r["usage"]["total_tokens"], 8);
    }

    #[test]
    fn an_answer_cut_at_its_limit_is_incomplete() {
        let chat = json!({"id": "x", "choices": [{"finish_reason": "length",
            "message": {"role": "assistant", "content": "a b"}}]});
        let r = from_chat(&Asked::default(), &chat).unwrap();
        assert_eq!(r["status"], "incomplete");
        assert_eq!(
            r["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
        assert_eq!(r["output"][0]["content"][0]["text"], "a b");
        assert_eq!(r["output"][0]["status"], "incomplete");
        assert_eq!(from_chat(&Asked::default(), &json!({"error": {}})), None);
    }
}
