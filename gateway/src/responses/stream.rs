//! A streamed chat completion as the Responses API's events: the
//! lifecycle (`response.created`, `response.in_progress`, then
//! `response.completed`, `.incomplete` or `.failed`), and each output
//! item opened, grown by deltas and closed in turn. The chat stream's
//! events arrive in any cut of bytes; each whole one is turned as it
//! comes, so the client's first token is not held back.

use serde_json::{Value, json};

use super::answer::{self, Head, Status};
use super::request::Asked;

/// The item being grown.
#[derive(Debug)]
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
        logprobs: Vec<Value>,
    },
    Call {
        index: u64,
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

#[derive(Debug)]
pub(crate) struct Events {
    asked: Asked,
    head: Option<Head>,
    /// Bytes of an event not yet whole.
    partial: Vec<u8>,
    /// The data lines of the event being read.
    data: Vec<u8>,
    seq: u64,
    open: Option<Open>,
    /// Items closed, in order: the response's output.
    output: Vec<Value>,
    finish: Option<String>,
    usage: Option<Value>,
    /// Blank text no message holds yet: sent once words follow it, dropped
    /// when a tool call does (a model's newlines before its call).
    blank: String,
    /// A terminal event was sent: nothing follows it.
    ended: bool,
}

impl Events {
    pub(crate) fn new(asked: Asked) -> Events {
        Events {
            asked,
            head: None,
            partial: Vec::new(),
            data: Vec::new(),
            seq: 0,
            open: None,
            output: Vec::new(),
            finish: None,
            usage: None,
            blank: String::new(),
            ended: false,
        }
    }

    /// The events the chat stream's next bytes make.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        self.partial.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(n) = self.partial[start..].iter().position(|b| *b == b'\n') {
            let line = &self.partial[start..start + n];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                let data = std::mem::take(&mut self.data);
                if !data.is_empty() {
                    self.event(&data, &mut out);
                }
            } else if let Some(d) = line.strip_prefix(b"data:") {
                let d = d.strip_prefix(b" ").unwrap_or(d);
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(d);
            }
            start += n + 1;
        }
        self.partial.drain(..start);
        out
    }

    /// The events the stream's end makes: the terminal one, if the chat
    /// stream ended without its `[DONE]`.
    pub(crate) fn end(&mut self) -> Vec<u8> {
        // A last line without its newline is a line still.
        let mut out = if self.partial.is_empty() {
            Vec::new()
        } else {
            self.feed(b"\n")
        };
        let data = std::mem::take(&mut self.data);
        if !data.is_empty() {
            self.event(&data, &mut out);
        }
        if !self.ended {
            if self.finish.is_some() {
                self.done(&mut out);
            } else {
                let e = json!({"code": "upstream_lost",
                    "message": "the engine's answer ended before its finish"});
                self.fail(&e, &mut out);
            }
        }
        out
    }

    /// The events for a stream that broke off (the gateway could not carry
    /// the answer on): the response failed, said rather than cut.
    pub(crate) fn broke(&mut self, why: &str) -> Vec<u8> {
        let mut out = Vec::new();
        if !self.ended {
            self.fail(&json!({"code": "upstream_lost", "message": why}), &mut out);
        }
        out
    }

    fn event(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        if data == b"[DONE]" {
            self.done(out);
            return;
        }
        let Ok(chunk) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        self.begin(&chunk, out);
        if let Some(e) = chunk.get("error") {
            self.fail(e, out);
            return;
        }
        if let Some(u) = chunk.get("usage").and_then(answer::usage) {
            self.usage = Some(u);
        }
        let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else {
            return;
        };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_owned());
        }
        let Some(delta) = choice.get("delta").and_then(Value::as_object) else {
            return;
        };
        if let Some(r) = answer::reasoning_of(delta) {
            self.reasoning(r, out);
        }
        if let Some(t) = delta.get("content").and_then(Value::as_str)
            && !t.is_empty()
        {
            self.text(t, answer::logprobs_of(choice), out);
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.call(call, out);
        }
    }

    /// The lifecycle's first two events, once, from the first chunk.
    fn begin(&mut self, chunk: &Value, out: &mut Vec<u8>) {
        if self.head.is_some() {
            return;
        }
        self.head = Some(Head::of(chunk));
        let r = self.snapshot(Status::InProgress, None);
        self.send(out, "response.created", json!({"response": r}));
        self.send(out, "response.in_progress", json!({"response": r}));
    }

    fn snapshot(&self, status: Status, error: Option<Value>) -> Value {
        let head = self.head.clone().unwrap_or_else(|| Head::of(&Value::Null));
        let output = if status == Status::InProgress {
            Vec::new()
        } else {
            self.output.clone()
        };
        answer::response(
            &self.asked,
            &head,
            status,
            output,
            self.usage.clone(),
            error,
        )
    }

    fn ids(&self) -> answer::Ids {
        self.head
            .as_ref()
            .map(|h| h.ids.clone())
            .unwrap_or_else(|| answer::Ids::from_chat(None))
    }

    fn reasoning(&mut self, delta: &str, out: &mut Vec<u8>) {
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close(out, "completed");
            let index = self.output.len();
            let id = self.ids().item("rs", index);
            let item = json!({"type": "reasoning", "id": id, "summary": [], "content": []});
            self.added(out, item);
            let part = json!({"type": "reasoning_text", "text": ""});
            let fields =
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part});
            self.send(out, "response.content_part.added", fields);
            self.open = Some(Open::Reasoning {
                id,
                text: String::new(),
            });
        }
        let index = self.output.len();
        if let Some(Open::Reasoning { id, text }) = &mut self.open {
            text.push_str(delta);
            let fields =
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta});
            self.send(out, "response.reasoning_text.delta", fields);
        }
    }

    fn text(&mut self, delta: &str, logprobs: &[Value], out: &mut Vec<u8>) {
        let open = matches!(self.open, Some(Open::Message { .. }));
        // (Tokens with log probabilities are the answer's, blank or not.)
        if !open && delta.trim().is_empty() && logprobs.is_empty() {
            self.blank.push_str(delta);
            return;
        }
        let delta = if self.blank.is_empty() {
            delta.to_owned()
        } else {
            std::mem::take(&mut self.blank) + delta
        };
        if !open {
            self.open_message(out);
        }
        let index = self.output.len();
        if let Some(Open::Message {
            id,
            text,
            logprobs: all,
        }) = &mut self.open
        {
            text.push_str(&delta);
            all.extend_from_slice(logprobs);
            let fields = json!({"item_id": id, "output_index": index, "content_index": 0,
                "delta": delta, "logprobs": logprobs});
            self.send(out, "response.output_text.delta", fields);
        }
    }

    fn open_message(&mut self, out: &mut Vec<u8>) {
        self.close(out, "completed");
        let index = self.output.len();
        let id = self.ids().item("msg", index);
        let item = json!({"type": "message", "id": id, "status": "in_progress",
            "role": "assistant", "content": []});
        self.added(out, item);
        let fields = json!({"item_id": id, "output_index": index,
            "content_index": 0, "part": answer::text_part("", &[])});
        self.send(out, "response.content_part.added", fields);
        self.open = Some(Open::Message {
            id,
            text: String::new(),
            logprobs: Vec::new(),
        });
    }

    /// A tool call's piece: its first names the call (id and function),
    /// the rest carry its arguments.
    fn call(&mut self, call: &Value, out: &mut Vec<u8>) {
        let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        let named = call
            .get("id")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty());
        // A new index, or on the same one a new id (engines that number
        // every call 0), starts another call.
        let same = matches!(&self.open, Some(Open::Call { index: i, call_id, .. })
            if *i == index && named.is_none_or(|n| n == call_id));
        if !same {
            // A model's blank lines before its call are no message.
            self.blank.clear();
            self.close(out, "completed");
            let n = self.output.len();
            let id = self.ids().item("fc", n);
            let k = self
                .output
                .iter()
                .filter(|o| o["type"] == "function_call")
                .count();
            let call_id = named.map_or_else(|| self.ids().item("call", k), str::to_owned);
            let name = call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            self.added(
                out,
                answer::call_item(&id, &call_id, &name, "", "in_progress"),
            );
            self.open = Some(Open::Call {
                index,
                id,
                call_id,
                name,
                arguments: String::new(),
            });
        }
        let piece = call
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let output_index = self.output.len();
        if let Some(Open::Call { id, arguments, .. }) = &mut self.open
            && !piece.is_empty()
        {
            arguments.push_str(piece);
            let fields = json!({"item_id": id, "output_index": output_index, "delta": piece});
            self.send(out, "response.function_call_arguments.delta", fields);
        }
    }

    fn added(&mut self, out: &mut Vec<u8>, item: Value) {
        let fields = json!({"output_index": self.output.len(), "item": item});
        self.send(out, "response.output_item.added", fields);
    }

    /// Closes the item being grown: its done events, and it joins the
    /// output with `state` (`incomplete` when the answer was cut in it).
    fn close(&mut self, out: &mut Vec<u8>, state: &str) {
        let Some(open) = self.open.take() else {
            return;
        };
        let index = self.output.len();
        let item = match open {
            Open::Reasoning { id, text } => {
                let fields =
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text});
                self.send(out, "response.reasoning_text.done", fields);
                let part = json!({"type": "reasoning_text", "text": text});
                let fields =
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part});
                self.send(out, "response.content_part.done", fields);
                answer::reasoning_item(&id, &text)
            }
            Open::Message { id, text, logprobs } => {
                let fields = json!({"item_id": id, "output_index": index, "content_index": 0,
                    "text": text, "logprobs": logprobs});
                self.send(out, "response.output_text.done", fields);
                let fields = json!({"item_id": id, "output_index": index, "content_index": 0,
                    "part": answer::text_part(&text, &logprobs)});
                self.send(out, "response.content_part.done", fields);
                answer::message_item(&id, &text, &logprobs, state)
            }
            Open::Call {
                id,
                call_id,
                name,
                arguments,
                ..
            } => {
                let fields = json!({"item_id": id, "output_index": index, "name": name,
                    "arguments": arguments});
                self.send(out, "response.function_call_arguments.done", fields);
                answer::call_item(&id, &call_id, &name, &arguments, state)
            }
        };
        let fields = json!({"output_index": index, "item": item});
        self.send(out, "response.output_item.done", fields);
        self.output.push(item);
    }

    fn done(&mut self, out: &mut Vec<u8>) {
        self.begin(&Value::Null, out);
        let status = answer::status_of(self.finish.as_deref());
        if status == Status::Failed {
            let e = answer::finish_error(self.finish.as_deref());
            self.fail(&e, out);
            return;
        }
        // An answer of no words and no calls is still one message, as a
        // whole one is.
        let said = |o: &Value| o["type"] == "message" || o["type"] == "function_call";
        let open_says = matches!(self.open, Some(Open::Message { .. } | Open::Call { .. }));
        if !open_says && !self.output.iter().any(said) {
            let blank = std::mem::take(&mut self.blank);
            self.open_message(out);
            if let Some(Open::Message { text, .. }) = &mut self.open {
                text.push_str(&blank);
            }
        }
        self.close(out, answer::item_status(status));
        let kind = match status {
            Status::Incomplete(_) => "response.incomplete",
            _ => "response.completed",
        };
        let r = self.snapshot(status, None);
        self.send(out, kind, json!({"response": r}));
        self.ended = true;
    }

    /// The engine's error (or the gateway's, when no replica could take
    /// the answer over) ends the response as failed.
    fn fail(&mut self, e: &Value, out: &mut Vec<u8>) {
        self.begin(&Value::Null, out);
        self.close(out, "incomplete");
        let error = json!({
            "code": e.get("code").and_then(Value::as_str).unwrap_or("server_error"),
            "message": e.get("message").and_then(Value::as_str).unwrap_or("the engine failed"),
        });
        let r = self.snapshot(Status::Failed, Some(error));
        self.send(out, "response.failed", json!({"response": r}));
        self.ended = true;
    }

    fn send(&mut self, out: &mut Vec<u8>, kind: &str, fields: Value) {
        let mut event = json!({"type": kind, "sequence_number": self.seq});
        if let (Some(e), Value::Object(f)) = (event.as_object_mut(), fields) {
            e.extend(f);
        }
        self.seq += 1;
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        out.extend_from_slice(event.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events' types, and the parsed events, of a chat stream fed in
    /// cuts of `cut` bytes.
    fn events(chat: &str, cut: usize) -> Vec<Value> {
        let mut e = Events::new(Asked::default());
        let mut out = Vec::new();
        for piece in chat.as_bytes().chunks(cut) {
            out.extend(e.feed(piece));
        }
        out.extend(e.end());
        let text = String::from_utf8(out).unwrap();
        text.split("\n\n")
            .filter(|s| !s.is_empty())
            .map(|s| {
                let (kind, data) = s.split_once('\n').unwrap();
                let v: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(kind.strip_prefix("event: ").unwrap(), v["type"]);
                v
            })
            .collect()
    }

    fn kinds(events: &[Value]) -> Vec<&str> {
        events.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    fn sse(chunks: &[Value]) -> String {
        let mut s: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        s.push_str("data: [DONE]\n\n");
        s
    }

    #[test]
    fn a_text_stream_is_one_message_grown_then_completed_with_usage() {
        let chat = sse(&[
            json!({"id": "chatcmpl-1", "created": 5, "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "Hello"}}]}),
            json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": "stop"}]}),
            json!({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}),
        ]);
        // However the bytes are cut, the same events.
        let whole = events(&chat, chat.len());
        for cut in [1, 7, 64] {
            assert_eq!(events(&chat, cut), whole, "cut {cut}");
        }
        assert_eq!(
            kinds(&whole),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let seqs: Vec<u64> = whole
            .iter()
            .map(|e| e["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, (0..10).collect::<Vec<_>>());
        assert_eq!(whole[0]["response"]["id"], "resp_1");
        assert_eq!(whole[0]["response"]["status"], "in_progress");
        let done = &whole[9]["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"][0]["content"][0]["text"], "Hello there");
        assert_eq!(done["output"][0]["id"], whole[2]["item"]["id"]);
        assert_eq!(done["usage"]["output_tokens"], 2);
        assert_eq!(done["model"], "m");
    }

    #[test]
    fn reasoning_then_tool_calls_are_items_in_turn() {
        let chat = sse(&[
            json!({"id": "c", "choices": [{"delta": {"reasoning_content": "hmm"}}]}),
            json!({"id": "c", "choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_a", "function": {"name": "f", "arguments": "{\"x\""}}]}}]}),
            json!({"id": "c", "choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}}]}),
            json!({"id": "c", "choices": [{"delta": {"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "g", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}]}),
        ]);
        let e = events(&chat, 13);
        let done = e.last().unwrap();
        assert_eq!(done["type"], "response.completed");
        let output = &done["response"]["output"];
        assert_eq!(output[0]["type"], "reasoning");
        assert_eq!(output[0]["content"][0]["text"], "hmm");
        assert_eq!(
            (
                &output[1]["call_id"],
                &output[1]["name"],
                &output[1]["arguments"]
            ),
            (&json!("call_a"), &json!("f"), &json!("{\"x\":1}"))
        );
        assert_eq!(
            (&output[2]["call_id"], &output[2]["name"]),
            (&json!("call_b"), &json!("g"))
        );
        let added: Vec<u64> = e
            .iter()
            .filter(|e| e["type"] == "response.output_item.added")
            .map(|e| e["output_index"].as_u64().unwrap())
            .collect();
        assert_eq!(added, [0, 1, 2]);
    }

    #[test]
    fn an_error_event_fails_the_response_and_a_cut_at_the_limit_is_incomplete() {
        let failed = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
                      data: {\"error\":{\"message\":\"no replica left\",\"code\":\"upstream_lost\"}}\n\n";
        let e = events(failed, 5);
        let last = e.last().unwrap();
        assert_eq!(last["type"], "response.failed");
        assert_eq!(last["response"]["error"]["code"], "upstream_lost");
        // The message so far was closed before the failure.
        assert!(kinds(&e).contains(&"response.output_item.done"));
        let cut = sse(&[
            json!({"id": "c", "choices": [{"delta": {"content": "a"}, "finish_reason": "length"}]}),
        ]);
        let e = events(&cut, 100);
        assert_eq!(e.last().unwrap()["type"], "response.incomplete");
        assert_eq!(
            e.last().unwrap()["response"]["incomplete_details"]["reason"],
            "max_output_tokens"
        );
    }

    /// Engines that number every call 0 tell calls apart by their ids;
    /// blank text before a call is no message; reasoning's text is a part.
    #[test]
    fn calls_on_one_index_blank_text_and_reasoning_parts() {
        let chat = sse(&[
            json!({"id": "c", "choices": [{"delta": {"reasoning_content": "hm"}}]}),
            json!({"id": "c", "choices": [{"delta": {"content": "\n\n"}}]}),
            json!({"id": "c", "choices": [{"delta": {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}]}}]}),
            json!({"id": "c", "choices": [{"delta": {"tool_calls": [{"index": 0, "id": "b", "function": {"name": "g", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}]}),
        ]);
        let e = events(&chat, 9);
        let output = &e.last().unwrap()["response"]["output"];
        let types: Vec<&str> = output
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            ["reasoning", "function_call", "function_call"],
            "{output}"
        );
        assert_eq!(
            (&output[1]["name"], &output[2]["name"]),
            (&json!("f"), &json!("g"))
        );
        let parts: Vec<&str> = kinds(&e)
            .into_iter()
            .filter(|k| k.contains("content_part"))
            .collect();
        assert_eq!(
            parts,
            ["response.content_part.added", "response.content_part.done"]
        );
    }

    #[test]
    fn an_empty_answer_is_one_empty_message_and_a_cut_one_fails() {
        let empty = sse(&[json!({"id": "c", "choices": [{"delta": {}, "finish_reason": "stop"}]})]);
        let e = events(&empty, 100);
        let done = &e.last().unwrap()["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"][0]["content"][0]["text"], "");
        // No finish and no [DONE]: the engine's answer broke off.
        let cut = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
        let e = events(cut, 100);
        let last = e.last().unwrap();
        assert_eq!(last["type"], "response.failed");
        assert_eq!(last["response"]["output"][0]["status"], "incomplete");
        // vLLM's finish for an aborted request fails the response.
        let aborted = sse(&[
            json!({"id": "c", "choices": [{"delta": {"content": "a"}, "finish_reason": "abort"}]}),
        ]);
        assert_eq!(
            events(&aborted, 100).last().unwrap()["type"],
            "response.failed"
        );
    }

    /// An engine's log probabilities ride on the text, delta by delta and
    /// whole at the end, in the shape chat gives them.
    #[test]
    fn log_probabilities_ride_on_the_text() {
        let lp = |t: &str| json!({"token": t, "logprob": -0.5, "bytes": [], "top_logprobs": []});
        let chat = sse(&[
            json!({"id": "c", "choices": [{"delta": {"content": "a"}, "logprobs": {"content": [lp("a")]}}]}),
            json!({"id": "c", "choices": [{"delta": {"content": " "}, "logprobs": {"content": [lp(" ")]}, "finish_reason": "stop"}]}),
        ]);
        let e = events(&chat, 100);
        let deltas: Vec<&Value> = e
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .collect();
        assert_eq!(
            deltas.len(),
            2,
            "a blank token with its probability is the answer's"
        );
        assert_eq!(deltas[1]["logprobs"][0]["token"], " ");
        let text = &e.last().unwrap()["response"]["output"][0]["content"][0];
        assert_eq!(text["text"], "a ");
        assert_eq!(text["logprobs"].as_array().unwrap().len(), 2);
    }
}
