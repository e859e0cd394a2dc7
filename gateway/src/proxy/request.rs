//! The request as the stages see it: the body read once, only the fields
//! routing and limits need parsed, and the body to forward (with usage
//! asked for in a stream, so that every answer can be counted).

use axum::body::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::ApiError;

/// The fields routing reads; everything else is forwarded untouched.
#[derive(Debug, Deserialize)]
struct Head {
    model: Option<String>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<Value>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    prompt: Option<Value>,
    /// Embeddings' text.
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct Message {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<Value>,
}

/// What the sim engine's rendering of the prompt is made from, kept so
/// that it is rendered only for a model whose endpoints publish KV events
/// (the exact index alone reads it).
#[derive(Debug, Default)]
pub(crate) struct SimPrompt {
    messages: Option<Vec<Message>>,
    prompt: Option<Value>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
}

impl SimPrompt {
    /// The prompt as the sim engine renders it (its tokenizer is the one
    /// the exact index ships): `role: content` lines, then `assistant: `
    /// unless the last message is continued; text parts only; a
    /// completion's prompt as given, strings joined by newlines.
    pub(crate) fn render(&self) -> Vec<u8> {
        let text = |out: &mut Vec<u8>, c: Option<&Value>| match c {
            Some(Value::String(s)) => out.extend_from_slice(s.as_bytes()),
            Some(Value::Array(parts)) => {
                for t in parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                {
                    out.extend_from_slice(t.as_bytes());
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
                out.extend_from_slice(m.role.as_deref().unwrap_or_default().as_bytes());
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
                Value::String(s) => out.extend_from_slice(s.as_bytes()),
                Value::Array(items) => {
                    for (i, item) in items.iter().filter_map(Value::as_str).enumerate() {
                        if i > 0 {
                            out.push(b'\n');
                        }
                        out.extend_from_slice(item.as_bytes());
                    }
                }
                _ => {}
            }
        }
        out
    }
}

/// Each text of a content value: a string, or the text parts of an array
/// of parts (or strings).
fn each_text<'a>(v: &'a Value, mut f: impl FnMut(&'a str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(parts) => {
            for p in parts {
                if let Some(t) = p.get("text").and_then(Value::as_str).or(p.as_str()) {
                    f(t);
                }
            }
        }
        _ => {}
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
    /// What the prompt as the sim engine renders it is made from, for the
    /// exact index's sim tokenizer.
    pub(crate) sim: SimPrompt,
    /// Prompt tokens, estimated before sending (see
    /// [`crate::limits::estimate_tokens`]).
    pub(crate) prompt_estimate: u64,
    /// The completion the request allows itself, if it says.
    pub(crate) max_completion: Option<u64>,
    /// What is forwarded.
    pub(crate) body: Bytes,
    /// The gateway asked for the usage chunk, so it takes it out again.
    pub(crate) strip_usage: bool,
}

impl ClientRequest {
    pub(crate) fn parse(body: Bytes) -> Result<Self, ApiError> {
        let mut head: Head = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
        let model = head
            .model
            .take()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| ApiError::bad_request("missing field `model`"))?;
        let asked = head
            .stream_options
            .as_ref()
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool);
        let injected = if head.stream && asked != Some(true) {
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
        texts().for_each(|c| each_text(c, |t| len += t.len()));
        let mut prompt = Vec::with_capacity(len);
        texts().for_each(|c| each_text(c, |t| prompt.extend_from_slice(t.as_bytes())));
        let mut counted = prompt.len();
        if let Some(i) = &head.input {
            each_text(i, |t| counted += t.len());
        }
        Ok(ClientRequest {
            sim: SimPrompt {
                messages: head.messages,
                prompt: head.prompt,
                add_generation_prompt: head.add_generation_prompt,
                continue_final_message: head.continue_final_message,
            },
            model,
            stream: head.stream,
            user: head.user,
            prompt,
            prompt_estimate: crate::limits::estimate_tokens(counted, None),
            max_completion: head.max_completion_tokens.or(head.max_tokens),
            strip_usage: injected.is_some(),
            body: injected.unwrap_or(body),
        })
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
        let r = ClientRequest::parse(Bytes::from(body.to_string())).unwrap();
        assert_eq!(r.prompt, b"abcdefg");
        // 7 bytes → 3 tokens, and the newer field wins over max_tokens.
        assert_eq!((r.prompt_estimate, r.token_estimate()), (3, 13));
        let embed = json!({"model": "e", "input": ["hello", "world"]});
        let r = ClientRequest::parse(Bytes::from(embed.to_string())).unwrap();
        assert_eq!(r.token_estimate(), 4);
    }

    #[test]
    fn the_sim_rendering_is_the_sim_engines() {
        let rendered = |body: Value| {
            let r = ClientRequest::parse(Bytes::from(body.to_string())).unwrap();
            String::from_utf8(r.sim.render()).unwrap()
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
    }
}
