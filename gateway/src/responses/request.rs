//! A Responses API request as the chat completion every engine serves.
//! What has no chat form (stored responses, files, tools with items of
//! their own) is refused by name: a client must not believe it was
//! honoured. Tools the platform would run (web search and the like) are
//! not offered to the model, and the response lists only those that were.

use serde_json::{Map, Value, json};

use super::input::{self, input_item, one_system};
use crate::ApiError;

/// What the answer repeats of the request: OpenAI's response object
/// carries the settings it was made with.
#[derive(Debug, Clone, Default)]
pub(crate) struct Asked {
    /// The settings as the client gave them, by their Responses names.
    pub(crate) echo: Map<String, Value>,
}

/// The fields read, and those accepted as hints the engines have no use
/// for. Any other is passed to the engine as it is, as chat completions
/// pass every field (vLLM's and SGLang's extras, which clients send
/// through `extra_body`: `chat_template_kwargs`, `top_k`, `seed`, …),
/// except chat's own names for what this API names otherwise.
const READ: [&str; 15] = [
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "user",
    "metadata",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "top_logprobs",
];
const HINTS: [&str; 10] = [
    "include",
    "prompt_cache_options",
    "truncation",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "stream_options",
    "store",
    "context_management",
];
/// Chat's fields for what this API names otherwise, or has not: sent
/// here, they would clash with the chat completion made of the request.
const CHAT_OWN: [&str; 11] = [
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "response_format",
    "reasoning_effort",
    "logprobs",
    "n",
    "best_of",
    "functions",
    "function_call",
    "echo",
];
/// Tools the platform runs for the model (search, files, code, images,
/// remote MCP servers): no engine here runs them, so the model is not
/// offered them, as a model without such a tool would not be.
const HOSTED: [&str; 9] = [
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
    "computer_use",
    "tool_search",
    "mcp",
];
/// Fields whose every non-null value asks for what is not here.
const NOT_HERE: [(&str, &str); 5] = [
    (
        "previous_response_id",
        "this gateway keeps no responses, so none can be continued by id: send the conversation so far in `input` (or name a thread with the x-llmgw-thread header)",
    ),
    (
        "conversation",
        "this gateway keeps no conversations by id: send the conversation so far in `input` (or name a thread with the x-llmgw-thread header)",
    ),
    (
        "background",
        "background responses are not served here: ask with stream instead",
    ),
    (
        "prompt",
        "stored prompt templates are not served here: send the instructions and input themselves",
    ),
    (
        "max_tool_calls",
        "max_tool_calls is not served here: the gateway serves function tools, which the client calls",
    ),
];

pub(super) fn refused(param: &'static str, message: impl Into<String>) -> ApiError {
    ApiError {
        param: Some(param),
        ..ApiError::bad_request(message)
    }
}

/// The chat completion's body, and what the answer repeats.
pub(crate) fn to_chat(body: &[u8]) -> Result<(Vec<u8>, Asked), ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(mut fields) = v else {
        return Err(ApiError::bad_request(
            "the body must be one JSON object of the request's fields (model, input, …)",
        ));
    };
    // An explicit null is the field left out, as OpenAI reads it.
    fields.retain(|_, v| !v.is_null());
    for name in fields.keys() {
        if let Some((param, why)) = NOT_HERE.iter().find(|(n, _)| n == name) {
            let asks = name != "background" || fields[name.as_str()].as_bool() == Some(true);
            if asks {
                return Err(refused(param, *why));
            }
        } else if let Some(own) = CHAT_OWN.iter().find(|c| *c == name) {
            return Err(refused(
                own,
                format!(
                    "`{own}` is a chat completions field: the Responses API has its own (max_output_tokens, text.format, reasoning.effort, include for log probabilities; docs/api.md), or ask /v1/chat/completions"
                ),
            ));
        }
    }
    if fields.get("store").and_then(Value::as_bool) == Some(true) {
        return Err(refused(
            "store",
            "this gateway keeps no responses (store: true): leave store out or send false, and carry the conversation in `input`",
        ));
    }
    let model = match fields.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(_) => return Err(refused("model", "`model` must be a model's name")),
        None => return Err(refused("model", "missing field `model`")),
    };
    let mut messages = Vec::new();
    if let Some(i) = fields.get("instructions") {
        let Value::String(text) = i else {
            return Err(refused("instructions", "`instructions` must be a string"));
        };
        messages.push(json!({"role": "system", "content": text}));
    }
    match fields.get("input") {
        Some(Value::String(text)) if !text.trim().is_empty() => {
            messages.push(json!({"role": "user", "content": text}));
        }
        Some(Value::String(_)) => {
            return Err(refused(
                "input",
                "`input` is empty: there is nothing to answer",
            ));
        }
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(refused(
                "input",
                "`input` is empty: there is nothing to answer",
            ));
        }
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                input_item(i, item, &mut messages)?;
            }
        }
        Some(_) => {
            return Err(refused(
                "input",
                "`input` must be a string or a list of input items",
            ));
        }
        None => return Err(refused("input", "missing field `input`")),
    }
    input::without_bare_reasoning(&mut messages);
    let messages = one_system(messages);
    let stream = match fields.get("stream") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(refused("stream", "`stream` must be true or false")),
    };
    let mut chat = Map::new();
    chat.insert("model".into(), json!(model));
    chat.insert("messages".into(), Value::Array(messages));
    if stream {
        chat.insert("stream".into(), json!(true));
        // The usage ends the answer's last event, and the response's.
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(n) = fields.get("max_output_tokens") {
        if n.as_u64().is_none_or(|n| n == 0) {
            return Err(refused(
                "max_output_tokens",
                "`max_output_tokens` must be a whole number above 0",
            ));
        }
        chat.insert("max_tokens".into(), n.clone());
    }
    for (name, param) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("parallel_tool_calls", "parallel_tool_calls"),
    ] {
        if let Some(v) = fields.get(name) {
            let fits = if name == "parallel_tool_calls" {
                v.is_boolean()
            } else {
                v.is_number()
            };
            if !fits {
                return Err(refused(param, format!("`{name}` has the wrong type")));
            }
            chat.insert(name.into(), v.clone());
        }
    }
    // The session the gateway keeps a caller's requests together by: the
    // cache key names it most closely.
    for (name, param) in [("prompt_cache_key", "prompt_cache_key"), ("user", "user")] {
        match fields.get(name) {
            Some(Value::String(u)) => {
                chat.insert("user".into(), json!(u));
                break;
            }
            Some(_) => return Err(refused(param, format!("`{name}` must be a string"))),
            None => {}
        }
    }
    // Log probabilities, asked by `include` (the SDKs add it with
    // `top_logprobs`), in chat's form; they come back on the text.
    let top = match fields.get("top_logprobs") {
        None => 0,
        Some(v) => match v.as_u64() {
            Some(n) if n <= 20 => n,
            _ => {
                return Err(refused(
                    "top_logprobs",
                    "`top_logprobs` is a whole number from 0 to 20",
                ));
            }
        },
    };
    let logprobs = top > 0
        || fields
            .get("include")
            .and_then(Value::as_array)
            .is_some_and(|i| i.iter().any(|i| i == "message.output_text.logprobs"));
    if logprobs {
        chat.insert("logprobs".into(), json!(true));
        chat.insert("top_logprobs".into(), json!(top));
    }
    // Everything else, as it came: the engine's own settings.
    let known =
        |k: &str| READ.contains(&k) || HINTS.contains(&k) || NOT_HERE.iter().any(|(n, _)| *n == k);
    for (name, v) in &fields {
        if !known(name) && !chat.contains_key(name.as_str()) {
            chat.insert(name.clone(), v.clone());
        }
    }
    if let Some(m) = fields.get("metadata")
        && !m.is_object()
    {
        return Err(refused("metadata", "`metadata` must be an object"));
    }
    let offered = match fields.get("tools") {
        Some(t) => tools(t)?,
        None => Vec::new(),
    };
    let choice = match fields.get("tool_choice") {
        Some(c) => Some(tool_choice(c)?),
        None => None,
    };
    // Without a tool to offer, a choice among them means nothing, and
    // vLLM refuses a `tool_choice` without `tools`.
    if offered.is_empty() {
        chat.remove("parallel_tool_calls");
        if choice.as_ref().is_some_and(|c| c != "none" && c != "auto") {
            return Err(refused(
                "tool_choice",
                "`tool_choice` asks for a tool, and no function tool is offered",
            ));
        }
    } else {
        chat.insert("tools".into(), Value::Array(offered));
        if let Some(c) = choice {
            chat.insert("tool_choice".into(), c);
        }
    }
    if let Some(t) = fields.get("text")
        && !t.is_object()
    {
        return Err(refused("text", "`text` must be an object"));
    }
    if let Some(t) = fields.get("text")
        && let Some(format) = text_format(t)?
    {
        chat.insert("response_format".into(), format);
    }
    if let Some(r) = fields.get("reasoning") {
        let Value::Object(r) = r else {
            return Err(refused("reasoning", "`reasoning` must be an object"));
        };
        // The engines know low, medium and high; the platform's finer
        // steps go to the nearest.
        let effort = match r.get("effort").and_then(Value::as_str) {
            Some("minimal" | "low") => Some("low"),
            Some("medium") => Some("medium"),
            Some("high" | "xhigh") => Some("high"),
            Some("none") | None => None,
            Some(other) => {
                return Err(refused(
                    "reasoning",
                    format!("`reasoning.effort` has no step `{other}`"),
                ));
            }
        };
        if let Some(e) = effort {
            chat.insert("reasoning_effort".into(), json!(e));
        }
    }
    let mut echo: Map<String, Value> = fields
        .into_iter()
        .filter(|(k, _)| k != "input" && k != "model" && k != "stream")
        .collect();
    // The response lists the tools the model was offered.
    if let Some(Value::Array(given)) = echo.get_mut("tools") {
        given.retain(|t| t.get("type").and_then(Value::as_str) == Some("function"));
    }
    let body = serde_json::to_vec(&Value::Object(chat)).unwrap_or_default();
    Ok((body, Asked { echo }))
}

/// Function tools in chat's form; hosted tools (web search, files, code)
/// have no engine here to run them and are not offered; tools with item
/// types of their own (custom grammars, a local shell) are refused.
fn tools(t: &Value) -> Result<Vec<Value>, ApiError> {
    let Value::Array(list) = t else {
        return Err(refused("tools", "`tools` must be a list"));
    };
    let mut out = Vec::with_capacity(list.len());
    for tool in list {
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
        if HOSTED.contains(&kind) {
            continue;
        }
        if kind != "function" {
            return Err(refused(
                "tools",
                format!(
                    "tools of type `{kind}` are not served here: the gateway serves function tools, which the client runs"
                ),
            ));
        }
        let Some(name) = tool.get("name").and_then(Value::as_str) else {
            return Err(refused("tools", "a function tool needs its name"));
        };
        let mut function = Map::new();
        function.insert("name".into(), json!(name));
        for key in ["description", "parameters", "strict"] {
            if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
                function.insert(key.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out)
}

fn tool_choice(c: &Value) -> Result<Value, ApiError> {
    match c {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => Ok(c.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").and_then(Value::as_str).ok_or_else(|| {
                refused(
                    "tool_choice",
                    "a function tool_choice needs the function's name",
                )
            })?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(refused(
            "tool_choice",
            "`tool_choice` is auto, none, required or a function by name here",
        )),
    }
}

/// `text.format` as chat's `response_format` (None for plain text).
fn text_format(t: &Value) -> Result<Option<Value>, ApiError> {
    let Some(format) = t.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let (Some(name), Some(schema)) = (
                format.get("name").and_then(Value::as_str),
                format.get("schema"),
            ) else {
                return Err(refused(
                    "text",
                    "a json_schema format needs its name and schema",
                ));
            };
            let mut spec = json!({"name": name, "schema": schema});
            for key in ["strict", "description"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    spec[key] = v.clone();
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": spec})))
        }
        _ => Err(refused(
            "text",
            "`text.format` is text, json_object or json_schema",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(v: Value) -> Value {
        let (body, _) = to_chat(v.to_string().as_bytes()).unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    fn refusal(v: Value) -> ApiError {
        to_chat(v.to_string().as_bytes()).unwrap_err()
    }

    #[test]
    fn a_string_input_with_instructions_is_a_system_and_a_user_message() {
        let c = chat(
            json!({"model": "m", "input": "hi", "instructions": "be brief",
            "max_output_tokens": 5, "temperature": 0.2, "stream": true}),
        );
        assert_eq!(
            c,
            json!({"model": "m", "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"}],
                "stream": true, "stream_options": {"include_usage": true},
                "max_tokens": 5, "temperature": 0.2})
        );
    }

    #[test]
    fn a_turn_of_tool_calls_and_their_outputs_reads_as_chat_does() {
        let c = chat(json!({"model": "m", "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "what is"},
                {"type": "input_text", "text": "the weather"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "look it up"}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": "{\"city\":\"Rome\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
            {"type": "function_call_output", "call_id": "c2", "output": "sun"},
            {"role": "user", "content": [
                {"type": "input_text", "text": "and this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"}]},
        ], "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}, "strict": null}],
           "tool_choice": {"type": "function", "name": "weather"},
           "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}},
           "reasoning": {"effort": "low"}}));
        assert_eq!(
            c["messages"],
            json!([
                {"role": "system", "content": "rules"},
                {"role": "user", "content": "what is\nthe weather"},
                {"role": "assistant", "content": null,
                 "reasoning": "look it up", "reasoning_content": "look it up", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Rome\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "rain"},
                {"role": "tool", "tool_call_id": "c2", "content": "sun"},
                {"role": "user", "content": [
                    {"type": "text", "text": "and this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "low"}}]},
            ])
        );
        assert_eq!(
            c["tools"],
            json!([{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}])
        );
        assert_eq!(
            c["tool_choice"],
            json!({"type": "function", "function": {"name": "weather"}})
        );
        assert_eq!(
            c["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": true}})
        );
        assert_eq!(c["reasoning_effort"], "low");
    }

    /// Earlier reasoning rides on the turn it led to (its summary where
    /// the engine gave no text); reasoning that led to none is dropped.
    #[test]
    fn earlier_reasoning_goes_back_on_its_turn() {
        let c = chat(json!({"model": "m", "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "greet"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
            {"type": "reasoning", "id": "rs_2", "content": [{"type": "reasoning_text", "text": "lost"}]},
            {"role": "user", "content": "again"},
        ]}));
        assert_eq!(
            c["messages"],
            json!([
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello", "reasoning": "greet", "reasoning_content": "greet"},
                {"role": "user", "content": "again"},
            ])
        );
    }

    /// What Codex CLI sends by default: instructions, developer messages
    /// (one mid-conversation), a hosted web search beside its functions, a
    /// reasoning effort of its own, the cache key.
    #[test]
    fn a_codex_shaped_request_reads_as_one_chat() {
        let c = chat(json!({"model": "m", "instructions": "you are a coder",
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: read-only"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: write"}]},
            ],
            "tools": [{"type": "web_search", "external_web_access": false},
                      {"type": "function", "name": "shell", "parameters": {"type": "object"}}],
            "tool_choice": "auto", "parallel_tool_calls": false, "reasoning": {"effort": "xhigh", "summary": "auto"},
            "store": false, "stream": true, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "session-1", "text": {"verbosity": "low"}, "seed": 7}));
        assert_eq!(
            c["messages"],
            json!([
                {"role": "system", "content": "you are a coder\n\nsandbox: read-only"},
                {"role": "user", "content": "fix it"},
                {"role": "user", "content": "sandbox: write"},
            ])
        );
        assert_eq!(c["tools"].as_array().unwrap().len(), 1, "{c}");
        assert_eq!(c["tools"][0]["function"]["name"], "shell");
        assert_eq!(
            (
                &c["reasoning_effort"],
                &c["user"],
                &c["seed"],
                &c["parallel_tool_calls"]
            ),
            (
                &json!("high"),
                &json!("session-1"),
                &json!(7),
                &json!(false)
            )
        );
        // With no function tool, no choice among tools is sent (vLLM
        // refuses one), and naming one is refused.
        let c = chat(
            json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}],
            "tool_choice": "auto", "parallel_tool_calls": true}),
        );
        assert!(
            c.get("tools").is_none() && c.get("tool_choice").is_none(),
            "{c}"
        );
        assert!(c.get("parallel_tool_calls").is_none(), "{c}");
        let e = refusal(json!({"model": "m", "input": "x", "tool_choice": "required"}));
        assert_eq!(e.param, Some("tool_choice"));
    }

    #[test]
    fn what_has_no_chat_form_is_refused_by_name() {
        let base = || json!({"model": "m", "input": "hi"});
        let with = |k: &str, v: Value| {
            let mut b = base();
            b[k] = v;
            refusal(b)
        };
        let e = with("previous_response_id", json!("resp_1"));
        assert_eq!(e.param, Some("previous_response_id"));
        assert!(e.message.contains("keeps no responses"), "{}", e.message);
        assert_eq!(with("store", json!(true)).param, Some("store"));
        assert_eq!(with("background", json!(true)).param, Some("background"));
        let e = with("tools", json!([{"type": "custom", "name": "apply_patch"}]));
        assert!(e.message.contains("`custom`"), "{}", e.message);
        let e = with("input", json!([{"type": "item_reference", "id": "msg_1"}]));
        assert!(e.message.starts_with("`input[0]`"), "{}", e.message);
        let e = with(
            "input",
            json!([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
        );
        assert!(e.message.contains("`input_file`"), "{}", e.message);
        let e = with("messages", json!([]));
        assert_eq!(e.param, Some("messages"), "chat's own field");
        // The engine's own settings pass, as on chat completions.
        let c = chat(json!({"model": "m", "input": "x", "top_k": 5,
            "chat_template_kwargs": {"enable_thinking": false}, "background": false}));
        assert_eq!(c["top_k"], 5);
        assert_eq!(c["chat_template_kwargs"]["enable_thinking"], false);
        assert!(c.get("background").is_none(), "{c}");
        assert_eq!(refusal(json!({"input": "x"})).param, Some("model"));
        assert_eq!(refusal(json!({"model": "m"})).param, Some("input"));
        // Nothing to answer, as a list or as text (docs/api.md).
        for empty in [json!([]), json!(""), json!("  \n")] {
            let e = refusal(json!({"model": "m", "input": empty}));
            assert_eq!(e.param, Some("input"), "{empty}");
            assert!(e.message.contains("is empty"), "{}", e.message);
        }
        assert_eq!(
            with("max_output_tokens", json!(0)).param,
            Some("max_output_tokens")
        );
        // Log probabilities, as the SDKs ask for them.
        let c = chat(json!({"model": "m", "input": "x", "top_logprobs": 0,
            "include": ["message.output_text.logprobs"]}));
        assert_eq!(
            (&c["logprobs"], &c["top_logprobs"]),
            (&json!(true), &json!(0))
        );
        assert_eq!(with("top_logprobs", json!(21)).param, Some("top_logprobs"));
        // Null is absent; false and the defaults ask for nothing missing.
        let c = chat(
            json!({"model": "m", "input": "x", "store": false, "background": false,
            "previous_response_id": null, "top_logprobs": 0, "include": ["reasoning.encrypted_content"]}),
        );
        assert_eq!(c["messages"], json!([{"role": "user", "content": "x"}]));
    }
}
