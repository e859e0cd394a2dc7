use serde_json::{Value, json};

use super::*;

fn ev(v: Value) -> String {
    format!("data: {v}\n\n")
}

fn chunk(id: &str, created: u64, content: &str, finish: Value) -> String {
    ev(
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}),
    )
}

fn role(id: &str, created: u64) -> String {
    ev(
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
    )
}

fn usage(id: &str, prompt: u64, completion: u64) -> String {
    ev(
        json!({"id": id, "object": "chat.completion.chunk", "created": 9, "model": "m", "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}),
    )
}

fn events(text: &[u8]) -> Vec<Value> {
    std::str::from_utf8(text)
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

#[test]
fn events_split_across_chunks_pass_whole_and_the_injected_usage_chunk_is_dropped() {
    let mut s = Splice::new(Form::Chat, true, 0);
    let mut out = Vec::new();
    let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
    for piece in stream.as_bytes().chunks(5) {
        out.extend_from_slice(&s.feed(piece));
    }
    out.extend_from_slice(&s.finish());
    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        text,
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
    );
    assert_eq!(
        s.tokens(),
        Tokens {
            prompt: 7,
            completion: 2
        }
    );
    assert!(s.saw_content && s.done);
}

#[test]
fn a_client_that_asked_for_usage_keeps_it() {
    let mut s = Splice::new(Form::Chat, false, 0);
    let chunk =
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n";
    assert_eq!(&s.feed(chunk.as_bytes())[..], chunk.as_bytes());
}

#[test]
fn a_continuation_reads_as_the_first_answer_with_one_usage_for_the_whole() {
    let mut s = Splice::new(Form::Chat, false, 3);
    let mut out = Vec::new();
    let first = format!(
        "{}{}{}",
        role("a", 100),
        chunk("a", 100, "the ", Value::Null),
        chunk("a", 100, "old ", Value::Null)
    );
    out.extend_from_slice(&s.feed(first.as_bytes()));
    // Half an event, then the engine dies.
    out.extend_from_slice(&s.feed(b"data: {\"id\":\"a\",\"cho"));
    assert_eq!((s.text.as_str(), s.sent_tokens), ("the old ", 2));
    assert_eq!(
        s.tokens(),
        Tokens {
            prompt: 3,
            completion: 2
        },
        "the estimate until an engine reports"
    );
    s.continue_elsewhere(false);
    // The continuation's prompt held the 2 tokens sent.
    let second = format!(
        "{}{}{}{}data: [DONE]\n\n",
        role("b", 107),
        chunk("b", 107, "fox ", Value::Null),
        chunk("b", 107, "", json!("length")),
        usage("b", 12, 1)
    );
    out.extend_from_slice(&s.feed(second.as_bytes()));
    let evs = events(&out);
    assert_eq!(evs.len(), 6, "one role event: {evs:?}");
    assert!(
        evs.iter()
            .all(|e| e["id"] == "a" && e["created"] == 100 && e["model"] == "m")
    );
    let text: String = evs
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "the old fox ");
    let u = &evs[5]["usage"];
    assert_eq!(
        (
            &u["prompt_tokens"],
            &u["completion_tokens"],
            &u["total_tokens"]
        ),
        (&json!(10), &json!(3), &json!(13))
    );
    assert_eq!(
        s.tokens(),
        Tokens {
            prompt: 10,
            completion: 3
        }
    );
    assert!(s.finished && s.done && s.unresumable.is_none());
    assert!(
        String::from_utf8(out)
            .unwrap()
            .ends_with("data: [DONE]\n\n")
    );
}

#[test]
fn completions_text_is_kept_and_their_identity_replaced_too() {
    let text = |id: &str, t: &str| {
        ev(
            json!({"id": id, "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": t, "finish_reason": null}]}),
        )
    };
    let mut s = Splice::new(Form::Text, true, 0);
    s.feed(text("a", "once ").as_bytes());
    s.continue_elsewhere(false);
    let out = s.feed(text("b", "more ").as_bytes());
    assert_eq!(events(&out)[0]["id"], "a");
    assert_eq!(s.text, "once more ");
}

#[test]
fn several_choices_tool_calls_reasoning_and_engine_errors_rule_a_continuation_out() {
    let cases = [
        json!({"choices": [{"index": 1, "delta": {"content": "x"}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}),
        json!({"error": {"message": "out of memory"}}),
    ];
    for c in cases {
        let mut s = Splice::new(Form::Chat, true, 0);
        s.feed(ev(c.clone()).as_bytes());
        assert!(s.unresumable.is_some(), "{c}");
    }
    let mut s = Splice::new(Form::Chat, true, 0);
    s.feed(chunk("a", 1, "plain", Value::Null).as_bytes());
    assert!(s.unresumable.is_none());
}

#[test]
fn an_answer_cut_at_its_length_is_closed_as_an_engine_would_have() {
    let mut s = Splice::new(Form::Chat, false, 4);
    s.feed(chunk("a", 5, "the ", Value::Null).as_bytes());
    let out = s.length_reached();
    let evs = events(&out);
    assert_eq!(evs[0]["choices"][0]["finish_reason"], "length");
    assert_eq!(evs[0]["id"], "a");
    assert_eq!(evs[1]["usage"]["completion_tokens"], 1);
    assert!(
        String::from_utf8(out.to_vec())
            .unwrap()
            .ends_with("data: [DONE]\n\n")
    );
    let err = Splice::error_event("no replica left");
    let v: Value = serde_json::from_str(
        std::str::from_utf8(&err)
            .unwrap()
            .trim_start_matches("data: ")
            .trim(),
    )
    .unwrap();
    assert_eq!(v["error"]["message"], "no replica left");
}

#[test]
fn a_continuing_engine_that_repeats_the_text_sent_has_the_repeat_taken_out() {
    let mut s = Splice::new(Form::Chat, true, 0);
    s.feed(
        format!(
            "{}{}",
            role("a", 1),
            chunk("a", 1, "Once upon", Value::Null)
        )
        .as_bytes(),
    );
    s.continue_elsewhere(true);
    // llama.cpp's way: the prefilled text first, with the first new token.
    let out = s.feed(
        format!(
            "{}{}{}",
            role("b", 2),
            chunk("b", 2, "Once upon a", Value::Null),
            chunk("b", 2, " time", Value::Null)
        )
        .as_bytes(),
    );
    let evs = events(&out);
    assert_eq!(evs.len(), 2, "{evs:?}");
    assert_eq!(evs[0]["choices"][0]["delta"]["content"], " a");
    assert_eq!(s.text, "Once upon a time");
    assert_eq!(s.sent_tokens, 3);

    // An engine that does not repeat: its text is left alone.
    let mut s = Splice::new(Form::Chat, true, 0);
    s.feed(chunk("a", 1, "Once upon", Value::Null).as_bytes());
    s.continue_elsewhere(true);
    let out = s.feed(chunk("b", 2, " a", Value::Null).as_bytes());
    assert_eq!(events(&out)[0]["choices"][0]["delta"]["content"], " a");
    // A first event that is only the repeat goes.
    let mut s = Splice::new(Form::Chat, true, 0);
    s.feed(chunk("a", 1, "Once", Value::Null).as_bytes());
    s.continue_elsewhere(true);
    assert!(
        s.feed(chunk("b", 2, "Once", Value::Null).as_bytes())
            .is_empty()
    );
    assert_eq!(s.text, "Once");
}
