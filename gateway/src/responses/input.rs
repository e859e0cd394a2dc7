//! The items of a Responses request's `input` as chat messages.

use serde_json::{Value, json};

use super::request::refused;
use crate::ApiError;

/// The system messages before the conversation (the instructions, then
/// any the input starts with) as one, and a later one as the user's: chat
/// templates take one system message, first.
pub(super) fn one_system(messages: Vec<Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(messages.len());
    let mut leading = Vec::new();
    for mut m in messages {
        if m["role"] != "system" {
            out.push(m);
            continue;
        }
        if out.is_empty() {
            leading.push(m);
        } else {
            m["role"] = json!("user");
            out.push(m);
        }
    }
    if leading.len() > 1 {
        let texts: Vec<String> = leading
            .iter()
            .map(|m| match &m["content"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        leading = vec![json!({"role": "system", "content": texts.join("\n\n")})];
    }
    leading.extend(out);
    leading
}

/// One item of `input` as chat messages: a message, a function call the
/// model made (its assistant turn), or the call's output (a tool turn).
pub(super) fn input_item(
    i: usize,
    item: &Value,
    messages: &mut Vec<Value>,
) -> Result<(), ApiError> {
    let at = |what: &str| refused("input", format!("`input[{i}]`: {what}"));
    let Value::Object(o) = item else {
        return Err(at("an input item must be an object"));
    };
    let text = |key: &str| o.get(key).and_then(Value::as_str);
    match text("type") {
        None | Some("message") => {
            let role = match text("role") {
                Some("developer") | Some("system") => "system",
                Some(r @ ("user" | "assistant")) => r,
                Some(other) => return Err(at(&format!("no role `{other}`"))),
                None => return Err(at("a message needs a role")),
            };
            let content = match o.get("content") {
                Some(Value::String(s)) => json!(s),
                Some(Value::Array(parts)) => content(i, parts)?,
                _ => {
                    return Err(at(
                        "a message needs its content, a string or a list of parts",
                    ));
                }
            };
            // The turn the reasoning before it was for.
            match messages.last_mut() {
                Some(m) if role == "assistant" && reasoned_only(m) => m["content"] = content,
                _ => messages.push(json!({"role": role, "content": content})),
            }
        }
        Some("function_call") => {
            let (Some(call), Some(name)) = (text("call_id"), text("name")) else {
                return Err(at("a function_call needs its call_id and name"));
            };
            let call = json!({"id": call, "type": "function",
                "function": {"name": name, "arguments": text("arguments").unwrap_or("{}")}});
            // The calls of one turn are one assistant message.
            match messages.last_mut() {
                Some(m) if m["role"] == "assistant" && m.get("tool_calls").is_some() => {
                    if let Some(calls) = m["tool_calls"].as_array_mut() {
                        calls.push(call);
                    }
                }
                Some(m) if m["role"] == "assistant" => {
                    m["tool_calls"] = json!([call]);
                }
                _ => messages
                    .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        Some("function_call_output") => {
            let Some(call) = text("call_id") else {
                return Err(at("a function_call_output needs its call_id"));
            };
            let output = match o.get("output") {
                Some(Value::String(s)) => json!(s),
                Some(Value::Array(parts)) => content(i, parts)?,
                _ => return Err(at("a function_call_output needs its output")),
            };
            messages.push(json!({"role": "tool", "tool_call_id": call, "content": output}));
        }
        // The model's reasoning in an earlier turn, on the assistant turn
        // it led to: vLLM gives gpt-oss it back as `reasoning`, Qwen3's
        // template and llama.cpp read `reasoning_content`; its encrypted
        // form is the platform's alone.
        Some("reasoning") => {
            let texts = |key: &str| {
                o.get(key)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
            };
            let mut said = texts("content");
            if said.is_empty() {
                said = texts("summary");
            }
            if !said.is_empty() {
                let said = said.join("\n");
                messages.push(json!({"role": "assistant", "content": null,
                    "reasoning": said, "reasoning_content": said}));
            }
        }
        Some("item_reference") => {
            return Err(at(
                "this gateway keeps no items, so none can be referenced: send the item itself",
            ));
        }
        Some(other) => {
            return Err(at(&format!(
                "input items of type `{other}` are not served here"
            )));
        }
    }
    Ok(())
}

/// An assistant turn that holds only reasoning so far: the message or
/// the calls that follow it are its.
fn reasoned_only(m: &Value) -> bool {
    m["role"] == "assistant" && m["content"].is_null() && m.get("tool_calls").is_none()
}

/// Reasoning that led to no turn (a client that kept the reasoning and
/// dropped the answer): no chat message is only reasoning.
pub(super) fn without_bare_reasoning(messages: &mut Vec<Value>) {
    messages.retain(|m| !reasoned_only(m));
}

/// A message's parts as chat content: text alone becomes one string (every
/// engine's template reads that), images stay parts.
fn content(i: usize, parts: &[Value]) -> Result<Value, ApiError> {
    let at = |what: String| refused("input", format!("`input[{i}]`: {what}"));
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "input_text" | "output_text" | "text" => {
                let Some(t) = part.get("text").and_then(Value::as_str) else {
                    return Err(at(format!("a part of type `{kind}` needs its text")));
                };
                out.push(json!({"type": "text", "text": t}));
            }
            "refusal" => {
                let t = part.get("refusal").and_then(Value::as_str).unwrap_or("");
                out.push(json!({"type": "text", "text": t}));
            }
            "input_image" => {
                let Some(url) = part.get("image_url").and_then(Value::as_str) else {
                    return Err(at(
                        "an input_image needs an image_url (files are not kept here)".into(),
                    ));
                };
                let mut image = json!({"url": url});
                if let Some(d) = part.get("detail").filter(|d| d.is_string()) {
                    image["detail"] = d.clone();
                }
                out.push(json!({"type": "image_url", "image_url": image}));
            }
            other => {
                return Err(at(format!(
                    "content parts of type `{other}` are not served here"
                )));
            }
        }
    }
    if out.iter().all(|p| p["type"] == "text") {
        let texts: Vec<&str> = out.iter().filter_map(|p| p["text"].as_str()).collect();
        return Ok(json!(texts.join("\n")));
    }
    Ok(Value::Array(out))
}
