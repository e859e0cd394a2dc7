//! The request as the stages see it: the body read once, only the fields
//! routing and limits need parsed, and the body to forward (with usage
//! asked for in a stream, so that every answer can be counted).

use std::borrow::Cow;

use axum::body::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::content::{Content, Part, Str};
use crate::ApiError;

/// The fields routing reads; everything else is forwarded untouched. Its
/// strings are borrowed from the body where they hold no escapes.
#[derive(Debug, Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    model: Option<Str<'a>>,
    /// Optional, so that an explicit `null` reads as absent (as OpenAI
    /// takes it) rather than failing the body.
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<Value>,
    #[serde(default, borrow)]
    user: Option<Str<'a>>,
    #[serde(default, borrow)]
    messages: Option<Vec<Message<'a>>>,
    #[serde(default, borrow)]
    prompt: Option<Content<'a>>,
    /// Embeddings' text.
    #[serde(default, borrow)]
    input: Option<Content<'a>>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    /// Choices asked for: each may run to the completion limit.
    #[serde(default)]
    n: Option<u64>,
    /// Legacy completions: candidates generated server-side, each to the
    /// limit, before `n` are returned.
    #[serde(default)]
    best_of: Option<u64>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    /// What the engine renders into the prompt beside the messages (the
    /// tools' schemas, a structured answer's): counted by its length, never
    /// read.
    #[serde(default, borrow)]
    tools: Option<&'a RawValue>,
    #[serde(default, borrow)]
    functions: Option<&'a RawValue>,
    #[serde(default, borrow)]
    response_format: Option<&'a RawValue>,
}

#[derive(Debug, Deserialize)]
struct Message<'a> {
    #[serde(default, borrow)]
    role: Option<Str<'a>>,
    #[serde(default, borrow)]
    content: Option<Content<'a>>,
    /// An assistant's calls and the name a message goes by are rendered
    /// too: counted by their length.
    #[serde(default, borrow)]
    tool_calls: Option<&'a RawValue>,
    #[serde(default, borrow)]
    function_call: Option<&'a RawValue>,
    #[serde(default, borrow)]
    name: Option<&'a RawValue>,
}

impl Head<'_> {
    /// The prompt's tokens before the engine counts them: its text at about
    /// three bytes a token, plus what a chat template adds around it (see
    /// [`crate::limits::estimate_tokens`]), so that the estimate is not
    /// below the engine's count however short the messages.
    fn prompt_estimate(&self, text_bytes: usize) -> u64 {
        let raw = |r: Option<&RawValue>| r.map_or(0, |r| r.get().len());
        let mut bytes =
            text_bytes + raw(self.tools) + raw(self.functions) + raw(self.response_format);
        let messages = self.messages.as_deref().unwrap_or_default();
        for m in messages {
            bytes += raw(m.tool_calls) + raw(m.function_call) + raw(m.name);
        }
        let framing = match self.messages {
            Some(_) => crate::limits::chat_framing(messages.len()),
            None => 0,
        };
        crate::limits::estimate_tokens(bytes, None).saturating_add(framing)
    }
}

impl Head<'_> {
    /// The prompt as the sim engine renders it (its tokenizer is the one
    /// the exact index ships): `role: content` lines, then `assistant: `
    /// unless the last message is continued; text parts only; a
    /// completion's prompt as given, strings joined by newlines.
    fn render_sim(&self) -> Vec<u8> {
        let text = |out: &mut Vec<u8>, c: Option<&Content>| match c {
            Some(Content::Text(s)) => out.extend_from_slice(s.as_bytes()),
            Some(Content::Parts(parts)) => {
                for p in parts {
                    if let Part::Object(Some(t)) = p {
                        out.extend_from_slice(t.as_bytes());
                    }
                }
            }
            _ => {}
        };
        let mut out = Vec::new();
        if let Some(messages) = &self.messages {
            let continued = self.continue_final_message == Some(true);
            let (closed, open) = match messages.split_last() {
                Some((last, rest)) if continued => (rest, Some(last)),
                _ => (&messages[..], None),
            };
            for m in closed {
                let role = m.role.as_ref().map_or("", |r| &r.0);
                out.extend_from_slice(role.as_bytes());
                out.extend_from_slice(b": ");
                text(&mut out, m.content.as_ref());
                out.push(b'\n');
            }
            if self.add_generation_prompt.unwrap_or(!continued) || open.is_some() {
                out.extend_from_slice(b"assistant: ");
            }
            if let Some(m) = open {
                text(&mut out, m.content.as_ref());
            }
        } else if let Some(p) = &self.prompt {
            match p {
                Content::Text(s) => out.extend_from_slice(s.as_bytes()),
                Content::Parts(items) => {
                    let strings = items.iter().filter_map(|i| match i {
                        Part::Bare(s) => Some(s),
                        _ => None,
                    });
                    for (i, item) in strings.enumerate() {
                        if i > 0 {
                            out.push(b'\n');
                        }
                        out.extend_from_slice(item.as_bytes());
                    }
                }
                Content::Other => {}
            }
        }
        out
    }
}

/// A parsed request.
#[derive(Debug)]
pub(crate) struct ClientRequest {
    /// The model as the client wrote it (maybe an alias).
    pub(crate) model: String,
    pub(crate) stream: bool,
    pub(crate) user: Option<String>,
    /// The prompt's text, for prefix affinity: message contents in order.
    pub(crate) prompt: Vec<u8>,
    /// The prompt as the sim engine renders it, for the exact index's sim
    /// tokenizer: made when the gateway has an endpoint that publishes KV
    /// events (see [`ClientRequest::rendered`]).
    rendered: Option<Vec<u8>>,
    /// Prompt tokens, estimated before sending (see
    /// [`crate::limits::estimate_tokens`]).
    pub(crate) prompt_estimate: u64,
    /// The completion the request allows itself, if it says: its limit
    /// times the choices (`n`, `best_of`) it asks for, each of which may
    /// run to it.
    pub(crate) max_completion: Option<u64>,
    /// What is forwarded.
    pub(crate) body: Bytes,
    /// The gateway asked for the usage chunk, so it takes it out again.
    pub(crate) strip_usage: bool,
}

/// The fields a refusal may name as its `param`: the request's own.
const FIELDS: [&str; 13] = [
    "model",
    "stream",
    "stream_options",
    "user",
    "messages",
    "prompt",
    "input",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "best_of",
    "add_generation_prompt",
    "continue_final_message",
];

/// Why a body that is JSON (or not) is refused: text that is not JSON is
/// said to be; a field of the wrong type is named, as OpenAI names it in
/// `param` (a string for `max_tokens` read as "not valid JSON"). The path
/// is found only here, on the way out: reading every request with it
/// would cost the path's bookkeeping each time.
fn refusal(body: &[u8], e: &serde_json::Error) -> ApiError {
    if e.classify() != serde_json::error::Category::Data {
        return ApiError::bad_request(format!("the body is not valid JSON: {e}"));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let Err(found) = serde_path_to_error::deserialize::<_, Head>(&mut de) else {
        return ApiError::bad_request(format!("the body does not fit the API: {e}"));
    };
    let path = found.path().to_string();
    let inner = found.into_inner().to_string();
    // serde_json's own position ("at line 1 column 78") says nothing to a
    // client that sent no lines.
    let inner = inner.split(" at line ").next().unwrap_or_default();
    let field = path.split(['.', '[']).next().unwrap_or_default();
    if path == "." || field.is_empty() {
        // Not serde's words for the whole body: they name our own type.
        return ApiError::bad_request(if inner.starts_with("duplicate field") {
            format!("the body names a field twice: {inner}")
        } else {
            "the body must be one JSON object of the request's fields (model, messages, …)".into()
        });
    }
    ApiError {
        param: FIELDS.iter().copied().find(|f| *f == field),
        ..ApiError::bad_request(format!("`{path}`: {inner}"))
    }
}

impl ClientRequest {
    /// Reads the head of `body`; with `render`, the prompt's sim rendering
    /// too (asked for when an endpoint publishes KV events).
    pub(crate) fn parse(body: Bytes, render: bool) -> Result<Self, ApiError> {
        let head: Head = serde_json::from_slice(&body).map_err(|e| refusal(&body, &e))?;
        let model = match head.model.as_ref().map(|m| &*m.0) {
            Some(m) if !m.is_empty() => m.to_owned(),
            found => {
                let said = match found {
                    None => "missing field `model`",
                    Some(_) => "`model` is empty: name a model (GET /v1/models lists them)",
                };
                return Err(ApiError {
                    param: Some("model"),
                    ..ApiError::bad_request(said)
                });
            }
        };
        let asked = head
            .stream_options
            .as_ref()
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool);
        let streamed = head.stream.unwrap_or(false);
        let injected = if streamed && asked != Some(true) {
            with_usage_requested(&body)
        } else {
            None
        };
        let texts = || {
            let contents = head
                .messages
                .iter()
                .flatten()
                .filter_map(|m| m.content.as_ref());
            contents.chain(head.prompt.as_ref())
        };
        // Sized first: grown by appending, it was copied a few times over.
        let mut len = 0;
        texts().for_each(|c| c.each_text(|t| len += t.len()));
        let mut prompt = Vec::with_capacity(len);
        texts().for_each(|c| c.each_text(|t| prompt.extend_from_slice(t.as_bytes())));
        let mut counted = prompt.len();
        if let Some(i) = &head.input {
            i.each_text(|t| counted += t.len());
        }
        let prompt_estimate = head.prompt_estimate(counted);
        let (stream, user) = (streamed, head.user.as_ref().map(|u| u.0.to_string()));
        let choices = head.n.max(head.best_of).unwrap_or(1).max(1);
        let max_completion = head
            .max_completion_tokens
            .or(head.max_tokens)
            .map(|m| m.saturating_mul(choices));
        let rendered = render.then(|| head.render_sim());
        // The head borrows the body it was read from, which moves below.
        drop(head);
        Ok(ClientRequest {
            rendered,
            model,
            stream,
            user,
            prompt,
            prompt_estimate,
            max_completion,
            strip_usage: injected.is_some(),
            body: injected.unwrap_or(body),
        })
    }

    /// The prompt as the sim engine renders it: made when the request was
    /// read if asked, else now from the body (an endpoint that publishes
    /// KV events came in between).
    pub(crate) fn rendered(&self) -> Cow<'_, [u8]> {
        match &self.rendered {
            Some(r) => Cow::Borrowed(r),
            None => Cow::Owned(
                serde_json::from_slice::<Head>(&self.body)
                    .map(|h| h.render_sim())
                    .unwrap_or_default(),
            ),
        }
    }

    /// Tokens charged against tpm at admission.
    /// Saturating: a client may ask for u64::MAX tokens (the engine
    /// refuses it; the estimate must not overflow first).
    pub(crate) fn token_estimate(&self) -> u64 {
        self.prompt_estimate
            .saturating_add(self.max_completion.unwrap_or(0))
    }
}

/// Asks the engine to report usage in a streamed answer; returns the new
/// body, or None when the client already asked (then nothing is stripped).
fn with_usage_requested(body: &Bytes) -> Option<Bytes> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object_mut()?;
    let opts = obj.entry("stream_options").or_insert_with(|| json!({}));
    if opts.is_null() {
        *opts = json!({});
    }
    if opts.get("include_usage").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    opts.as_object_mut()?
        .insert("include_usage".into(), json!(true));
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

/// The body with its `model` replaced.
pub(crate) fn with_model(body: &Bytes, model: &str) -> Option<Bytes> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    v.as_object_mut()?.insert("model".into(), json!(model));
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_of_the_wrong_type_is_named_not_called_bad_json() {
        let refused =
            |body: &str| ClientRequest::parse(Bytes::from(body.to_owned()), false).unwrap_err();
        let e = refused(r#"{"model": "m", "max_tokens": "abc", "messages": []}"#);
        assert_eq!(e.param, Some("max_tokens"));
        assert!(
            e.message
                .starts_with("`max_tokens`: invalid type: string \"abc\"")
                && !e.message.contains("line 1"),
            "{}",
            e.message
        );
        // No model, or an empty name: the field is named, and each is said
        // as what it is.
        let e = refused(r#"{"messages": []}"#);
        assert_eq!(
            (e.param, &*e.message),
            (Some("model"), "missing field `model`")
        );
        let e = refused(r#"{"model": "", "messages": []}"#);
        assert_eq!(e.param, Some("model"));
        assert!(e.message.starts_with("`model` is empty"), "{}", e.message);
        let e = refused(r#"{"model": "m", "messages": "hi"}"#);
        assert_eq!(e.param, Some("messages"));
        assert!(
            e.message.starts_with("`messages`: invalid type"),
            "{}",
            e.message
        );
        let e = refused("[]");
        assert!(
            e.message.starts_with("the body must be one JSON object"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("Head"), "{}", e.message);
        let e = refused("{\"model\": ");
        assert!(
            e.message.starts_with("the body is not valid JSON"),
            "{}",
            e.message
        );
    }

    #[test]
    fn the_estimate_counts_the_whole_prompt_and_the_completion_allowed() {
        let body = json!({
            "model": "m",
            "max_completion_tokens": 10,
            "max_tokens": 99,
            "messages": [
                {"role": "system", "content": "abc"},
                {"role": "user", "content": [{"type": "text", "text": "defg"}]},
            ],
        });
        let r = ClientRequest::parse(Bytes::from(body.to_string()), false).unwrap();
        assert_eq!(r.prompt, b"abcdefg");
        // 7 bytes → 3 tokens, 32 + 2 × 8 for the template's framing, and
        // the newer field wins over max_tokens.
        assert_eq!((r.prompt_estimate, r.token_estimate()), (51, 61));
        let embed = json!({"model": "e", "input": ["hello", "world"]});
        let r = ClientRequest::parse(Bytes::from(embed.to_string()), false).unwrap();
        assert_eq!(r.token_estimate(), 4);
        // Each choice may run to the limit: `n`, or a completion's
        // `best_of` when larger.
        let parse = |v: Value| ClientRequest::parse(Bytes::from(v.to_string()), false).unwrap();
        let chat = |n: Value| {
            parse(json!({"model": "m", "n": n, "max_tokens": 10,
                "messages": [{"role": "user", "content": "abcdefg"}]}))
            .token_estimate()
        };
        assert_eq!(
            (chat(json!(4)), chat(json!(1)), chat(json!(null))),
            (83, 53, 53)
        );
        let legacy = parse(
            json!({"model": "m", "prompt": "abcdefg", "n": 2, "best_of": 5, "max_tokens": 10}),
        );
        assert_eq!(legacy.token_estimate(), 53);
    }

    /// Tools' schemas, a structured answer's schema and an assistant's
    /// calls are rendered into the prompt by the engine: a request with
    /// a large `tools` and one short message is not a few tokens.
    #[test]
    fn the_estimate_counts_tools_schemas_and_calls() {
        let parse = |v: Value| ClientRequest::parse(Bytes::from(v.to_string()), false).unwrap();
        let plain = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let base = parse(plain.clone()).prompt_estimate;
        let schema = json!({"type": "object", "properties": {"city": {"type": "string", "description": "x".repeat(300)}}});
        let mut tools = plain.clone();
        tools["tools"] =
            json!([{"type": "function", "function": {"name": "weather", "parameters": schema}}]);
        let tools_bytes = tools["tools"].to_string().len() as u64;
        assert!(parse(tools).prompt_estimate >= base + tools_bytes / 3);
        let mut format = plain.clone();
        format["response_format"] =
            json!({"type": "json_schema", "json_schema": {"schema": schema}});
        assert!(parse(format).prompt_estimate > base + 100);
        let call = json!({"model": "m", "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "weather", "arguments": "x".repeat(300)}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]});
        assert!(parse(call).prompt_estimate > base + 2 * 8 + 100);
    }

    /// An explicit `null` is read as the field left out, as OpenAI reads
    /// it: the body is taken, and a stream still asks the engine for usage.
    #[test]
    fn null_fields_read_as_absent() {
        let parse = |v: Value| ClientRequest::parse(Bytes::from(v.to_string()), false).unwrap();
        let r = parse(json!({"model": "m", "stream": null, "prompt": "p"}));
        assert!(!r.stream && !r.strip_usage);
        let r = parse(json!({"model": "m", "stream": true, "stream_options": null, "prompt": "p"}));
        assert!(r.stream && r.strip_usage);
        let sent: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn the_sim_rendering_is_the_sim_engines() {
        // Made when the request is read, and later from its body: the same.
        let rendered = |body: Value| {
            let body = Bytes::from(body.to_string());
            let now = ClientRequest::parse(body.clone(), true).unwrap();
            let later = ClientRequest::parse(body, false).unwrap();
            assert_eq!(now.rendered(), later.rendered());
            String::from_utf8(now.rendered().into_owned()).unwrap()
        };
        let chat = json!({"model": "m", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "image_url"}, {"type": "text", "text": "there"}]},
        ]});
        assert_eq!(
            rendered(chat),
            "system: be brief\nuser: hi there\nassistant: "
        );
        let closed = json!({"model": "m", "add_generation_prompt": false,
            "messages": [{"role": "user", "content": "a"}]});
        assert_eq!(rendered(closed), "user: a\n");
        let continued = json!({"model": "m", "continue_final_message": true,
            "add_generation_prompt": false, "messages": [
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "b c"}]});
        assert_eq!(rendered(continued), "user: a\nassistant: b c");
        let completion = json!({"model": "m", "prompt": ["one", 2, "three"]});
        assert_eq!(rendered(completion), "one\nthree");
        assert_eq!(rendered(json!({"model": "m", "prompt": "p"})), "p");
        assert_eq!(rendered(json!({"model": "e", "input": "x"})), "");
        // Escaped in the body, read as the text it stands for.
        let escaped = r#"{"model":"caf\u00e9","user":"u\"1","messages":[{"role":"us\u0065r","content":"a\tb"}]}"#;
        let r = ClientRequest::parse(Bytes::from(escaped), true).unwrap();
        assert_eq!(
            (r.model.as_str(), r.user.as_deref()),
            ("café", Some("u\"1"))
        );
        assert_eq!(&r.rendered()[..], b"user: a\tb\nassistant: ");
    }

    /// The prompt's text as a parsed document gives it: each message's
    /// content, then the prompt, each a string or an array of strings and
    /// parts with a string `text` (the reading before the head borrowed).
    fn prompt_of_document(body: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        let mut push = |v: &Value| match v {
            Value::String(s) => out.extend_from_slice(s.as_bytes()),
            Value::Array(parts) => {
                for p in parts {
                    if let Some(t) = p.get("text").and_then(Value::as_str).or(p.as_str()) {
                        out.extend_from_slice(t.as_bytes());
                    }
                }
            }
            _ => {}
        };
        for m in body["messages"].as_array().into_iter().flatten() {
            if let Some(c) = m.get("content") {
                push(c);
            }
        }
        if let Some(p) = body.get("prompt") {
            push(p);
        }
        out
    }

    #[test]
    fn odd_contents_read_as_their_parsed_document_does() {
        let bodies = [
            r#"{"model":"m","messages":[{"role":"user","content":"caf\u00e9 \"quoted\"\n"}]}"#,
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"text":7},{"text":"b","text":"c"},{"text":["x"]},{"text":{"y":1}},"bare",3,null,[["z"]]]}]}"#,
            r#"{"model":"m","messages":[{"role":"user","content":{"text":"not a list"}},{"role":"user","content":null},{"role":"user"},{"role":"user","content":12.5},{"role":"user","content":true}]}"#,
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,x","detail":["a",{"b":null}]}},{"te\u0078t":"escaped key"}]}]}"#,
            r#"{"model":"m","prompt":["one",[1,2,3],"two",{"text":"three"},null]}"#,
            r#"{"model":"m","prompt":[[1,2],[3]]}"#,
            r#"{"model":"m","prompt":42}"#,
            r#"{"model":"m","messages":[{"role":"a\tb","content":"x"}],"prompt":"and a prompt"}"#,
            r#"{"model":"m","messages":[]}"#,
            r#"{"model":"m"}"#,
        ];
        for body in bodies {
            let document: Value = serde_json::from_str(body).unwrap();
            let r = ClientRequest::parse(Bytes::from(body), true)
                .unwrap_or_else(|e| panic!("{body}: {e:?}"));
            assert_eq!(
                String::from_utf8_lossy(&r.prompt),
                String::from_utf8_lossy(&prompt_of_document(&document)),
                "{body}"
            );
        }
        // A role that is not a string is refused, as before.
        let refused = r#"{"model":"m","messages":[{"role":1,"content":"x"}]}"#;
        assert!(ClientRequest::parse(Bytes::from(refused), false).is_err());
    }
}
