//! The request that continues a broken answer on another engine: the
//! original request with what the client has already been sent as the
//! start of the answer. Pure, over the JSON of the forwarded body.
//!
//! - Chat: the text becomes a last assistant message. vLLM and SGLang are
//!   told to continue it rather than answer it (`continue_final_message:
//!   true`, `add_generation_prompt: false`, as the sim engine is);
//!   llama.cpp's server continues a last assistant message by itself (its
//!   assistant prefill), so it is sent no extra field.
//! - Completions: the text is appended to the prompt.
//! - A length limit (`max_tokens`, `max_completion_tokens`, `min_tokens`)
//!   shrinks by the tokens already sent.

use axum::body::Bytes;
use serde_json::{Value, json};

use super::splice::Form;
use crate::scrape::EngineKind;

/// Why an answer cannot be continued, or that it needs no continuation.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NoContinuation {
    /// The answer reached its length limit exactly as the engine broke.
    LengthReached,
    Unresumable(&'static str),
}

/// The body that continues `body` after `text` (`sent` tokens) was sent.
pub(crate) fn continuation(
    body: &[u8],
    form: Form,
    text: &str,
    sent: u64,
    engine: EngineKind,
) -> Result<Bytes, NoContinuation> {
    let bad = NoContinuation::Unresumable;
    let mut v: Value = serde_json::from_slice(body).map_err(|_| bad("the body is not JSON"))?;
    let obj = v.as_object_mut().ok_or(bad("the body is not an object"))?;
    if obj.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1)
        || obj
            .get("best_of")
            .and_then(Value::as_u64)
            .is_some_and(|n| n > 1)
    {
        return Err(bad("an answer with several choices cannot be continued"));
    }
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(n) = obj.get(key).and_then(Value::as_u64) {
            if n <= sent {
                return Err(NoContinuation::LengthReached);
            }
            obj.insert(key.into(), json!(n - sent));
        }
    }
    if let Some(n) = obj.get("min_tokens").and_then(Value::as_u64) {
        obj.insert("min_tokens".into(), json!(n.saturating_sub(sent)));
    }
    if text.is_empty() {
        // Nothing was sent: the request as it was.
        return serde_json::to_vec(&v)
            .map(Bytes::from)
            .map_err(|_| bad("the body cannot be written"));
    }
    // An engine holds only what it generates to a grammar: continued, it
    // starts the structure again after the text sent, and the client's
    // JSON comes out as two halves.
    if constrained(obj) {
        return Err(bad(
            "an answer held to a schema or grammar cannot be continued",
        ));
    }
    match form {
        Form::Chat => chat(obj, text, engine)?,
        Form::Text => completion(obj, text)?,
    }
    serde_json::to_vec(&v)
        .map(Bytes::from)
        .map_err(|_| bad("the body cannot be written"))
}

/// Whether the request holds its answer to a structure: OpenAI's
/// `response_format` (other than text), vLLM's `guided_*` and
/// `structured_outputs`, llama.cpp's `grammar` and `json_schema`.
fn constrained(obj: &serde_json::Map<String, Value>) -> bool {
    let format = obj
        .get("response_format")
        .is_some_and(|f| !f.is_null() && f["type"] != "text");
    let named = [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
        "grammar",
        "json_schema",
    ]
    .iter()
    .any(|k| obj.get(*k).is_some_and(|v| !v.is_null()));
    format || named
}

fn chat(
    obj: &mut serde_json::Map<String, Value>,
    text: &str,
    engine: EngineKind,
) -> Result<(), NoContinuation> {
    let continuing = obj.get("continue_final_message").and_then(Value::as_bool) == Some(true);
    let messages = obj
        .get_mut("messages")
        .and_then(Value::as_array_mut)
        .ok_or(NoContinuation::Unresumable("the request has no messages"))?;
    // A client already continuing its own assistant message: the text
    // sent goes on after it.
    let own = messages
        .last_mut()
        .filter(|m| continuing && m["role"] == "assistant");
    match own {
        Some(m) => {
            let Some(start) = m["content"].as_str() else {
                return Err(NoContinuation::Unresumable(
                    "the assistant message being continued is not text",
                ));
            };
            m["content"] = json!(format!("{start}{text}"));
        }
        None => messages.push(json!({"role": "assistant", "content": text})),
    }
    if engine != EngineKind::Llamacpp {
        obj.insert("continue_final_message".into(), json!(true));
        obj.insert("add_generation_prompt".into(), json!(false));
    }
    Ok(())
}

fn completion(obj: &mut serde_json::Map<String, Value>, text: &str) -> Result<(), NoContinuation> {
    if obj.get("echo").and_then(Value::as_bool) == Some(true) {
        return Err(NoContinuation::Unresumable(
            "an echoed completion cannot be continued",
        ));
    }
    let prompt = match obj.get("prompt") {
        Some(Value::String(p)) => p.clone(),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or_default().to_owned()
        }
        _ => {
            return Err(NoContinuation::Unresumable(
                "only a prompt of one string can be continued",
            ));
        }
    };
    obj.insert("prompt".into(), json!(format!("{prompt}{text}")));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cont(body: Value, form: Form, engine: EngineKind) -> Result<Value, NoContinuation> {
        continuation(body.to_string().as_bytes(), form, "the old ", 2, engine)
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    #[test]
    fn a_chat_continues_from_a_last_assistant_message_in_each_engines_form() {
        let ask = json!({"model": "m", "stream": true, "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}]});
        let v = cont(ask.clone(), Form::Chat, EngineKind::Vllm).unwrap();
        assert_eq!(
            v["messages"][1],
            json!({"role": "assistant", "content": "the old "})
        );
        assert_eq!(
            (&v["continue_final_message"], &v["add_generation_prompt"]),
            (&json!(true), &json!(false))
        );
        assert_eq!(v["max_tokens"], 8);
        let l = cont(ask, Form::Chat, EngineKind::Llamacpp).unwrap();
        assert_eq!(l["messages"][1]["content"], "the old ");
        assert!(l.get("continue_final_message").is_none(), "{l}");
    }

    #[test]
    fn an_answer_held_to_a_schema_or_grammar_is_not_continued() {
        let ask = |extra: Value| {
            let mut v = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            cont(v, Form::Chat, EngineKind::Vllm)
        };
        for held in [
            json!({"response_format": {"type": "json_object"}}),
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "w"}}}),
            json!({"guided_json": {"type": "object"}}),
            json!({"guided_choice": ["a", "b"]}),
            json!({"grammar": "root ::= \"x\""}),
        ] {
            assert!(
                matches!(ask(held.clone()), Err(NoContinuation::Unresumable(_))),
                "{held}"
            );
        }
        // Plain text is no structure.
        assert!(ask(json!({"response_format": {"type": "text"}})).is_ok());
        // Nothing sent yet: the request is sent again as it was.
        let fresh = continuation(
            json!({"model": "m", "response_format": {"type": "json_object"}, "messages": []})
                .to_string()
                .as_bytes(),
            Form::Chat,
            "",
            0,
            EngineKind::Vllm,
        );
        assert!(fresh.is_ok());
    }

    #[test]
    fn a_client_continuing_its_own_message_has_the_text_appended_to_it() {
        let ask = json!({"model": "m", "continue_final_message": true, "add_generation_prompt": false,
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once "}]});
        let v = cont(ask, Form::Chat, EngineKind::Sglang).unwrap();
        assert_eq!(v["messages"].as_array().unwrap().len(), 2);
        assert_eq!(v["messages"][1]["content"], "Once the old ");
    }

    #[test]
    fn a_completion_continues_from_its_prompt_and_the_text() {
        let v = cont(
            json!({"model": "m", "prompt": ["once "], "max_completion_tokens": 3, "min_tokens": 1}),
            Form::Text,
            EngineKind::Vllm,
        )
        .unwrap();
        assert_eq!(
            (&v["prompt"], &v["max_completion_tokens"], &v["min_tokens"]),
            (&json!("once the old "), &json!(1), &json!(0))
        );
    }

    #[test]
    fn what_cannot_be_continued_says_why() {
        let refused = [
            json!({"prompt": [1, 2, 3]}),
            json!({"prompt": ["a", "b"]}),
            json!({"prompt": "a", "echo": true}),
            json!({"prompt": "a", "n": 2}),
        ];
        for r in refused {
            assert!(
                matches!(
                    cont(r.clone(), Form::Text, EngineKind::Vllm),
                    Err(NoContinuation::Unresumable(_))
                ),
                "{r}"
            );
        }
        assert_eq!(
            cont(
                json!({"prompt": "a", "max_tokens": 2}),
                Form::Text,
                EngineKind::Vllm
            ),
            Err(NoContinuation::LengthReached)
        );
        // Nothing sent yet: the request goes again as it was.
        let same = continuation(br#"{"prompt":"a"}"#, Form::Text, "", 0, EngineKind::Vllm).unwrap();
        assert_eq!(&same[..], br#"{"prompt":"a"}"#);
    }
}
