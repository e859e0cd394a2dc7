//! `--answers`: what reading a plain answer's usage costs
//! ([`Tokens::from_answer`], serde with the other fields skipped), against parsing the
//! answer into a `serde_json::Value` and reading its `usage` there (the
//! reference it must agree with), on the bench's own answer and on a
//! longer one (a reply of ~2,000 characters with escapes and non-ASCII
//! text, and log-probabilities). Three rounds.

use std::time::Instant;

use llmgw_gateway::usage::Tokens;
use serde_json::Value;

const READS: u32 = 100_000;

/// A reply of ~2,000 characters, as an engine would write it.
fn long_answer() -> String {
    let sentence = "The answer, \"in short\", is this:\nçà et là, 42 étapes — then the rest. ";
    let content = sentence.repeat(2000 / sentence.len() + 1);
    let logprobs: Vec<Value> = (0..40)
        .map(|i| serde_json::json!({"token": format!("t{i}"), "logprob": -0.0123 * f64::from(i)}))
        .collect();
    serde_json::json!({
        "id": "chatcmpl-123",
        "object": "chat.completion",
        "created": 1_733_400_000,
        "model": "m",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": {"content": logprobs},
            "finish_reason": "stop",
        }],
        "usage": {"prompt_tokens": 120, "completion_tokens": 480, "total_tokens": 600},
    })
    .to_string()
}

fn parsed(body: &[u8]) -> Option<(u64, u64)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let u = v.get("usage")?;
    Some((
        u.get("prompt_tokens")?.as_u64()?,
        u.get("completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
    ))
}

fn time(reads: u32, mut f: impl FnMut() -> Option<(u64, u64)>) -> f64 {
    let started = Instant::now();
    for _ in 0..reads {
        std::hint::black_box(f());
    }
    started.elapsed().as_nanos() as f64 / f64::from(reads)
}

pub fn run() {
    let long = long_answer();
    let answers = [
        ("the bench's", super::REPLY.as_bytes()),
        ("long", long.as_bytes()),
    ];
    println!("a plain answer's usage read (ns an answer, {READS} reads a round):");
    for (name, body) in answers {
        let shipped = || Tokens::from_answer(body).map(|t| (t.prompt, t.completion));
        assert_eq!(shipped(), parsed(body), "the two readings agree");
        for round in 1..=3 {
            let read = time(READS, shipped);
            let value = time(READS, || parsed(body));
            println!(
                "{name} answer ({} bytes), round {round}: from_answer {read:.0} ns; parsed into a Value {value:.0} ns ({:.1}x)",
                body.len(),
                value / read
            );
        }
    }
}
