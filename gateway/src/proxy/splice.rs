//! A streamed answer as the client sees it, event by event: one answer
//! however many engines it took. Pure (bytes in, bytes out), so every
//! rule here is tested without a socket.
//!
//! - Events pass through as soon as they are complete; the usage event the
//!   gateway asked for on the client's behalf is taken out again.
//! - What the client has been sent is kept (the text and about one token
//!   an event), so that a broken answer can be continued elsewhere.
//! - After a migration, the continuing engine's events are made the
//!   original's: its id, `created`, model and fingerprint replaced by the
//!   first ones, its second role event dropped, and its usage turned into
//!   the whole answer's: the continuation's prompt held the text already
//!   sent, so that many tokens move from its prompt to the completion.

use std::borrow::Cow;

use axum::body::Bytes;
use serde_json::{Map, Value, json};

use crate::usage::Tokens;

/// Where an answer's text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// `choices[0].delta.content`.
    Chat,
    /// `choices[0].text`.
    Text,
}

/// The fields that name an answer: the client sees the first engine's.
const IDENTITY: [&str; 4] = ["id", "created", "model", "system_fingerprint"];

#[derive(Debug)]
pub(crate) struct Splice {
    form: Form,
    partial: Vec<u8>,
    strip_usage: bool,
    prompt_estimate: u64,
    /// The identity of the answer, from the first event the client got.
    head: Option<Map<String, Value>>,
    /// The text the client has been sent.
    pub(crate) text: String,
    /// Events with text the client has been sent: engines stream about one
    /// token an event, so this stands for the completion so far.
    pub(crate) sent_tokens: u64,
    /// `sent_tokens` when the current engine took over (0: the first).
    base: u64,
    /// The text a continuing engine is expected to repeat before its new
    /// tokens (llama.cpp's server answers a prefilled assistant message
    /// with the message first), until its first text shows whether it did.
    echo: Option<String>,
    continued: bool,
    role_sent: bool,
    /// A finish reason reached the client: the answer is whole.
    pub(crate) finished: bool,
    /// `[DONE]` reached the client.
    pub(crate) done: bool,
    /// Why this answer cannot be continued elsewhere, once it cannot.
    pub(crate) unresumable: Option<&'static str>,
    /// The engine sent an error event: its stream ends there.
    engine_error: bool,
    /// The whole answer's usage, once an engine reported it.
    usage: Option<Tokens>,
    pub(crate) saw_content: bool,
}

impl Splice {
    /// The engine sent an error event (its `[DONE]` may follow).
    pub(crate) fn engine_errored(&self) -> bool {
        self.engine_error
    }

    pub(crate) fn new(form: Form, strip_usage: bool, prompt_estimate: u64) -> Self {
        Splice {
            form,
            partial: Vec::new(),
            strip_usage,
            prompt_estimate,
            head: None,
            text: String::new(),
            sent_tokens: 0,
            base: 0,
            echo: None,
            continued: false,
            role_sent: false,
            finished: false,
            done: false,
            unresumable: None,
            engine_error: false,
            usage: None,
            saw_content: false,
        }
    }

    /// The bytes to forward for this chunk (possibly none yet).
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Bytes {
        let mut buf = std::mem::take(&mut self.partial);
        buf.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(buf.len());
        let mut start = 0;
        while let Some(end) = find(&buf[start..], b"\n\n") {
            if let Some(event) = self.event(&buf[start..start + end + 2]) {
                out.extend_from_slice(&event);
            }
            start += end + 2;
        }
        buf.drain(..start);
        self.partial = buf;
        Bytes::from(out)
    }

    /// Whatever is left when the upstream ends cleanly (a last event
    /// without its blank line).
    pub(crate) fn finish(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.partial))
    }

    /// Another engine takes over from here: a half-received event of the
    /// broken one is dropped (the continuation produces it again).
    /// `echoes`: the engine may repeat the text sent so far first.
    pub(crate) fn continue_elsewhere(&mut self, echoes: bool) {
        self.partial.clear();
        self.base = self.sent_tokens;
        self.continued = true;
        self.echo = (echoes && !self.text.is_empty()).then(|| self.text.clone());
    }

    /// Whether a stream that ended here ended before its answer: it had
    /// begun (an answer's event came), and neither finished, said done
    /// nor reported an error.
    pub(crate) fn broken_off(&self) -> bool {
        self.head.is_some() && !self.finished && !self.done && !self.engine_error
    }

    /// Tokens so far: the engines' report once there is one, else the
    /// prompt's estimate and the events sent.
    pub(crate) fn tokens(&self) -> Tokens {
        self.usage.unwrap_or(Tokens {
            prompt: self.prompt_estimate,
            completion: self.sent_tokens,
        })
    }

    /// The end of an answer that broke after it was whole (a finish reason
    /// sent, `[DONE]` not yet): only `[DONE]` is missing.
    pub(crate) fn tail(&self) -> Bytes {
        if self.done {
            Bytes::new()
        } else {
            Bytes::from_static(b"data: [DONE]\n\n")
        }
    }

    /// The end of an answer that reached its length exactly as the engine
    /// broke: the finish event an engine would have sent, usage if the
    /// client asked for it, and `[DONE]`.
    pub(crate) fn length_reached(&mut self) -> Bytes {
        let choice = match self.form {
            Form::Chat => json!({"index": 0, "delta": {}, "finish_reason": "length"}),
            Form::Text => json!({"index": 0, "text": "", "finish_reason": "length"}),
        };
        let mut out = self.frame(json!([choice]), None);
        if !self.strip_usage {
            let t = self.tokens();
            out.extend(self.frame(json!([]), Some(usage_value(t, None))));
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        self.finished = true;
        self.done = true;
        Bytes::from(out)
    }

    /// The event that tells the client its answer could not be finished
    /// (OpenAI's form of an error mid-stream), in place of a body cut off
    /// without a word. No `[DONE]` follows: the answer is not complete.
    pub(crate) fn error_event(message: &str) -> Bytes {
        let e =
            json!({"error": {"message": message, "type": "server_error", "code": "upstream_lost"}});
        Bytes::from(format!("data: {e}\n\n"))
    }

    fn frame(&self, choices: Value, usage: Option<Value>) -> Vec<u8> {
        let mut v = self.head.clone().unwrap_or_default();
        v.insert(
            "object".into(),
            json!(match self.form {
                Form::Chat => "chat.completion.chunk",
                Form::Text => "text_completion",
            }),
        );
        v.insert("choices".into(), choices);
        if let Some(u) = usage {
            v.insert("usage".into(), u);
        }
        format!("data: {}\n\n", Value::Object(v)).into_bytes()
    }

    /// One whole event: forwarded as it is, rewritten, or dropped.
    fn event<'a>(&mut self, raw: &'a [u8]) -> Option<Cow<'a, [u8]>> {
        let Some(data) = raw.strip_prefix(b"data: ") else {
            return Some(Cow::Borrowed(raw));
        };
        let data = data.trim_ascii_end();
        if data == b"[DONE]" {
            self.done = true;
            return Some(Cow::Borrowed(raw));
        }
        let Ok(mut v) = serde_json::from_slice::<Value>(data) else {
            return Some(Cow::Borrowed(raw));
        };
        if v.get("error").is_some() {
            // The engine's own verdict: passed on, never retried.
            self.unresumable = Some("the engine reported an error");
            self.engine_error = true;
            return Some(Cow::Borrowed(raw));
        }
        let mut changed = self.identity(&mut v);
        match self.choices(&mut v) {
            Verdict::Drop => return None,
            Verdict::Changed => changed = true,
            Verdict::Keep => {}
        }
        if let Some(t) = Tokens::from_usage(&v) {
            let whole = Tokens {
                prompt: t.prompt.saturating_sub(self.base),
                completion: t.completion.saturating_add(self.base),
            };
            self.usage = Some(whole);
            let usage_only = v["choices"].as_array().is_some_and(|c| c.is_empty());
            if usage_only && self.strip_usage {
                return None;
            }
            if self.continued {
                let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
                v["usage"] = usage_value(whole, cached);
                changed = true;
            }
        }
        if changed {
            Some(Cow::Owned(format!("data: {v}\n\n").into_bytes()))
        } else {
            Some(Cow::Borrowed(raw))
        }
    }

    /// Notes the first identity, or puts it in place of a continuation's.
    fn identity(&mut self, v: &mut Value) -> bool {
        let Some(obj) = v.as_object_mut() else {
            return false;
        };
        match &self.head {
            None => {
                let head = IDENTITY
                    .iter()
                    .filter_map(|k| Some(((*k).to_owned(), obj.get(*k)?.clone())))
                    .collect();
                self.head = Some(head);
                false
            }
            Some(head) if self.continued => {
                for k in IDENTITY {
                    match head.get(k) {
                        Some(v) => obj.insert(k.to_owned(), v.clone()),
                        None => obj.remove(k),
                    };
                }
                true
            }
            Some(_) => false,
        }
    }

    /// Reads the choices: text sent, the finish, what rules a continuation
    /// out; takes a continuing engine's repeat of the text sent out.
    fn choices(&mut self, v: &mut Value) -> Verdict {
        let verdict = self.unecho(v);
        let Some(choices) = v["choices"].as_array() else {
            return verdict;
        };
        if choices.len() > 1
            || choices
                .iter()
                .any(|c| c["index"].as_u64().unwrap_or(0) != 0)
        {
            self.unresumable = Some("an answer with several choices cannot be continued");
        }
        let Some(c) = choices.first() else {
            return verdict;
        };
        let text = match self.form {
            Form::Chat => {
                let d = &c["delta"];
                if d["tool_calls"].as_array().is_some_and(|t| !t.is_empty()) {
                    self.unresumable = Some("an answer with tool calls cannot be continued");
                }
                let reasoning = ["reasoning_content", "reasoning"]
                    .iter()
                    .any(|k| d[*k].as_str().is_some_and(|r| !r.is_empty()));
                if reasoning {
                    self.unresumable = Some("an answer with reasoning cannot be continued");
                }
                let content = d["content"].as_str().unwrap_or_default();
                let nothing = content.is_empty() && c["finish_reason"].is_null();
                if verdict == Verdict::Changed && nothing {
                    // Only the repeat was in it.
                    return Verdict::Drop;
                }
                if d.get("role").is_some() && nothing {
                    // The client has its role event already.
                    if self.role_sent {
                        return Verdict::Drop;
                    }
                    self.role_sent = true;
                }
                content
            }
            Form::Text => c["text"].as_str().unwrap_or_default(),
        };
        if !text.is_empty() {
            self.text.push_str(text);
            self.sent_tokens += 1;
            self.saw_content = true;
        }
        if !c["finish_reason"].is_null() {
            self.finished = true;
        }
        verdict
    }

    /// A continuing engine's first text starts with the text already sent
    /// when it repeats it: that part goes. Any other first text means it
    /// does not repeat, and nothing is taken.
    fn unecho(&mut self, v: &mut Value) -> Verdict {
        let Some(echo) = &self.echo else {
            return Verdict::Keep;
        };
        let Some(content) = v["choices"][0]["delta"]["content"].as_str() else {
            return Verdict::Keep;
        };
        if content.is_empty() {
            return Verdict::Keep;
        }
        let rest = content.strip_prefix(echo.as_str()).map(str::to_owned);
        self.echo = None;
        match rest {
            Some(rest) => {
                v["choices"][0]["delta"]["content"] = Value::String(rest);
                Verdict::Changed
            }
            None => Verdict::Keep,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Keep,
    /// Kept, with its text changed.
    Changed,
    Drop,
}

fn usage_value(t: Tokens, cached: Option<u64>) -> Value {
    let mut u = json!({
        "prompt_tokens": t.prompt,
        "completion_tokens": t.completion,
        "total_tokens": t.prompt + t.completion,
    });
    if let Some(c) = cached {
        u["prompt_tokens_details"] = json!({"cached_tokens": c.min(t.prompt)});
    }
    u
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
#[path = "splice_tests.rs"]
mod tests;
