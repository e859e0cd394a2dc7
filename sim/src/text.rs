//! What the simulated model "says": a deterministic, autoregressive
//! stand-in for a language model. The next token is a function of the
//! whole context so far (the rendered prompt, then every token generated),
//! like a real model's at temperature 0. So a request that carries an
//! interrupted answer as its context (a chat's final assistant message
//! with `continue_final_message`, or a completion's prompt plus the text
//! generated) goes on with exactly the tokens the uninterrupted answer
//! would have had: the property a gateway's request migration is tested
//! against.
//!
//! Every token is four bytes, the same as the prompt's token estimate
//! (four bytes a token), so an interrupted answer put back into the prompt
//! counts as exactly the tokens it was generated as.

use serde_json::Value;

const WORDS: [&str; 16] = [
    "the ", "old ", "fox ", "ran ", "far ", "and ", "sat ", "low ", "sun ", "sky ", "was ", "red ",
    "one ", "day ", "new ", "map ",
];

/// FNV-1a over the context, fed as it grows.
#[derive(Debug, Clone)]
pub(crate) struct Generator(u64);

impl Generator {
    pub(crate) fn new(context: &str) -> Self {
        let mut g = Generator(0xcbf2_9ce4_8422_2325);
        g.feed(context.as_bytes());
        g
    }

    /// The generator of an answer's choice `index` (of `n`): choice 0
    /// is the answer itself, the one `n` = 1 gives; another starts from the
    /// context and a mark of its number, so that the choices differ, as
    /// sampled ones do, and each is the same on every ask.
    pub(crate) fn for_choice(context: &str, index: u32) -> Self {
        let mut g = Generator::new(context);
        if index > 0 {
            g.feed(format!("\0choice {index}").as_bytes());
        }
        g
    }

    fn feed(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// Where in the vocabulary the next token is.
    fn pick(&self) -> usize {
        // The high bits of an FNV hash mix better than its low ones.
        ((self.0 >> 40) ^ (self.0 >> 13)) as usize % WORDS.len()
    }

    /// The next token, which then becomes part of the context.
    pub(crate) fn next_token(&mut self) -> &'static str {
        let word = WORDS[self.pick()];
        self.feed(word.as_bytes());
        word
    }

    /// The next token with its log probability and the vocabulary's
    /// other tokens at its place, likeliest first: the token chosen is the
    /// likeliest, as at temperature 0, at a probability from 0.5 to 0.95,
    /// and each other one half as likely as the one before it, in an order
    /// of the context's choosing.
    pub(crate) fn next_scored(&mut self) -> Scored {
        let h = mix(self.0);
        let at = self.pick();
        let p = 0.5 + 0.45 * unit(h);
        // Odd, so that it steps through the whole vocabulary (16 words).
        let stride = 2 * (h & 7) as usize + 1;
        let mut rest = 1.0 - p;
        let mut top = vec![(WORDS[at], rounded(p.ln()))];
        for k in 1..WORDS.len() {
            rest /= 2.0;
            top.push((WORDS[(at + k * stride) % WORDS.len()], rounded(rest.ln())));
        }
        let token = self.next_token();
        Scored {
            token,
            logprob: top[0].1,
            top,
        }
    }
}

/// SplitMix64's finalizer: every bit of the state in every bit out, so
/// that contexts that differ little (two short prompts) score unalike.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A number in [0, 1) from the high bits.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// A log probability to four decimals.
fn rounded(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// A token generated, scored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Scored {
    pub(crate) token: &'static str,
    pub(crate) logprob: f64,
    /// Every token of the vocabulary at its place, likeliest first (the
    /// token itself).
    pub(crate) top: Vec<(&'static str, f64)>,
}

/// An echoed prompt as tokens of four bytes at most (whole characters),
/// each with where it starts and its log probability: none for the
/// first, as OpenAI's echo gives, then a value of the text before it.
pub(crate) fn prompt_tokens(text: &str) -> Vec<(usize, &str, Option<f64>)> {
    let mut out = Vec::new();
    let mut g = Generator::new("");
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + 4).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if end == start {
            // One character longer than four bytes: whole.
            end = start + text[start..].chars().next().map_or(1, char::len_utf8);
        }
        let piece = &text[start..end];
        let logprob = (start > 0).then(|| {
            let p = 0.05 + 0.9 * unit(mix(g.0));
            rounded(p.ln())
        });
        out.push((start, piece, logprob));
        g.feed(piece.as_bytes());
        start = end;
    }
    out
}

/// One answer as its client receives it: tokens generated up to `max`, or
/// up to the first of the stop sequences, which ends the text and is not
/// part of it (OpenAI's `stop`; finish reason `stop`). Text that may be
/// the start of a stop sequence is held back until it is known not to be,
/// as vLLM does, so a stream never sends what the stop then takes back.
#[derive(Debug, Clone)]
pub(crate) struct Decoder {
    words: Generator,
    stops: Vec<String>,
    max: u32,
    /// Tokens generated so far: what the answer's usage counts.
    pub(crate) generated: u32,
    text: String,
    /// Bytes of `text` handed out.
    released: usize,
    /// Score the tokens (for `logprobs`).
    scored: bool,
    /// Tokens scored and not handed out, with where each starts in `text`.
    unreleased: std::collections::VecDeque<(usize, Scored)>,
    /// Why the answer ends where it does, when not at a stop sequence.
    natural: &'static str,
    finish: Option<&'static str>,
}

/// What one more token gives the client.
#[derive(Debug, PartialEq)]
pub(crate) struct Step {
    /// The text released (empty while it may be a stop sequence's start).
    pub(crate) text: String,
    /// The tokens (when scored) whose text starts in what is released by
    /// now, with where each starts in the answer.
    pub(crate) tokens: Vec<(usize, Scored)>,
    /// The finish reason, when the answer ended with this token.
    pub(crate) finish: Option<&'static str>,
}

impl Decoder {
    /// `stops` must hold no empty string.
    pub(crate) fn new(
        words: Generator,
        stops: Vec<String>,
        max: u32,
        natural: &'static str,
    ) -> Self {
        Decoder {
            words,
            stops,
            max,
            generated: 0,
            text: String::new(),
            released: 0,
            scored: false,
            unreleased: std::collections::VecDeque::new(),
            natural,
            finish: (max == 0).then_some(natural),
        }
    }

    /// Scores the tokens, for `logprobs`.
    pub(crate) fn scored(mut self) -> Self {
        self.scored = true;
        self
    }

    /// The finish reason once the answer has ended.
    pub(crate) fn finish(&self) -> Option<&'static str> {
        self.finish
    }

    /// One more token (the answer must not have ended).
    pub(crate) fn step(&mut self) -> Step {
        let start = self.text.len();
        let word = if self.scored {
            let scored = self.words.next_scored();
            let word = scored.token;
            self.unreleased.push_back((start, scored));
            word
        } else {
            self.words.next_token()
        };
        self.generated += 1;
        self.text.push_str(word);
        // Held-back text is the start of any stop sequence to come, so
        // none can begin before what was released.
        let cut = self
            .stops
            .iter()
            .filter_map(|s| self.text[self.released..].find(s.as_str()))
            .min()
            .map(|at| self.released + at);
        let end = match cut {
            Some(at) => {
                self.text.truncate(at);
                self.finish = Some("stop");
                at
            }
            None if self.generated >= self.max => {
                self.finish = Some(self.natural);
                self.text.len()
            }
            None => self.text.len() - self.held(),
        };
        let text = self.text[self.released..end].to_owned();
        self.released = end;
        let mut tokens = Vec::new();
        while let Some((start, _)) = self.unreleased.front()
            && *start < end
        {
            tokens.extend(self.unreleased.pop_front());
        }
        Step {
            text,
            tokens,
            finish: self.finish,
        }
    }

    /// The longest unreleased tail that a stop sequence starts with. The
    /// generated text is ASCII, so every byte is a boundary.
    fn held(&self) -> usize {
        let pending = &self.text[self.released..];
        (1..=pending.len())
            .rev()
            .find(|&k| {
                let tail = &pending[pending.len() - k..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(0)
    }

    /// The whole answer: its text, its finish reason and its tokens
    /// (when scored).
    pub(crate) fn finish_all(&mut self) -> (String, &'static str, Vec<(usize, Scored)>) {
        let mut text = String::new();
        let mut tokens = Vec::new();
        loop {
            if let Some(finish) = self.finish {
                return (text, finish, tokens);
            }
            let step = self.step();
            text.push_str(&step.text);
            tokens.extend(step.tokens);
        }
    }
}

/// Tokens in a text: roughly four bytes a token, as for English.
pub(crate) fn tokens_of(bytes: usize) -> u64 {
    bytes.div_ceil(4).max(1) as u64
}

/// A prompt as the engine sees it.
#[derive(Debug)]
pub(crate) struct Prompt {
    /// The context generation continues from (and the prefix cache's key).
    pub(crate) context: String,
    pub(crate) tokens: u64,
    /// Tokens of an assistant answer being continued: they count toward
    /// the answer's natural length.
    pub(crate) continued: u64,
    /// Text the answer repeats before its new tokens: a completion's
    /// prompt with `echo`, or, for a chat, as llama.cpp's server
    /// answers a prefilled assistant message with that message's text
    /// first, then what it generated (seen on llama-server b11434).
    pub(crate) echo: Option<String>,
}

/// Why a request cannot be served, and the field to blame (OpenAI's
/// `param`: `messages[1].role`, `prompt`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid {
    pub(crate) param: Option<String>,
    pub(crate) message: String,
}

impl Invalid {
    pub(crate) fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Invalid {
            param: Some(param.into()),
            message: message.into(),
        }
    }
}

/// The roles OpenAI's chat API takes.
const ROLES: [&str; 6] = [
    "system",
    "assistant",
    "user",
    "function",
    "tool",
    "developer",
];

/// Every message is an object with a known `role`, and there is one at
/// least: an engine that rendered `bogus: …` or an empty chat answered a
/// request OpenAI (and vLLM's chat template) refuses.
fn check_messages(messages: &[Value]) -> Result<(), Invalid> {
    if messages.is_empty() {
        return Err(Invalid::new(
            "messages",
            "`messages` must be a non-empty list of messages",
        ));
    }
    for (i, m) in messages.iter().enumerate() {
        let param = format!("messages[{i}].role");
        match m["role"].as_str() {
            Some(role) if ROLES.contains(&role) => {}
            Some(role) => {
                return Err(Invalid::new(
                    param,
                    format!(
                        "Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'."
                    ),
                ));
            }
            None if m["role"].is_null() => {
                return Err(Invalid::new(
                    param.clone(),
                    format!("Missing required parameter: '{param}'."),
                ));
            }
            None => {
                return Err(Invalid::new(param, "a message's `role` must be a string"));
            }
        }
    }
    Ok(())
}

fn text_of(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        // Content parts: the text parts count.
        Value::Array(parts) => Some(parts.iter().filter_map(|p| p["text"].as_str()).collect()),
        _ => None,
    }
}

/// A chat rendered as `role: content` lines, then `assistant: ` to prompt
/// the answer (vLLM's `add_generation_prompt`, on unless turned off). With
/// `continue_final_message` the last message must be the assistant's, and
/// it is left open for the answer to go on from, exactly where the
/// original answer was; as in vLLM, the two options exclude each other.
/// `prefill` continues a last assistant message without being asked, as
/// llama.cpp's server does.
pub(crate) fn chat(v: &Value, prefill: bool) -> Result<Prompt, Invalid> {
    let messages = v["messages"]
        .as_array()
        .ok_or_else(|| Invalid::new("messages", "missing or malformed `messages`"))?;
    check_messages(messages)?;
    let malformed = |i: usize| {
        Invalid::new(
            format!("messages[{i}].content"),
            "malformed `content`: a string or a list of content parts",
        )
    };
    let assistant_last = messages.last().is_some_and(|m| m["role"] == "assistant");
    let asked = v["continue_final_message"].as_bool().unwrap_or(false);
    let prefilled = prefill && assistant_last;
    let continues = asked || prefilled;
    let generation_prompt = !prefilled && v["add_generation_prompt"].as_bool().unwrap_or(true);
    if asked && generation_prompt {
        return Err(Invalid::new(
            "continue_final_message",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        ));
    }
    let (closed, open) = match messages.split_last() {
        Some((last, rest)) if continues => {
            if last["role"] != "assistant" {
                return Err(Invalid::new(
                    "continue_final_message",
                    "`continue_final_message` needs an assistant message last",
                ));
            }
            (
                rest,
                Some(text_of(&last["content"]).ok_or_else(|| malformed(rest.len()))?),
            )
        }
        _ => (&messages[..], None),
    };
    let mut rendered = String::new();
    for (i, m) in closed.iter().enumerate() {
        // Checked above.
        rendered.push_str(m["role"].as_str().unwrap_or_default());
        rendered.push_str(": ");
        // A turn that only called tools has no content, as OpenAI's API
        // and the engines allow.
        let content = if m["content"].is_null() && m["tool_calls"].is_array() {
            String::new()
        } else {
            text_of(&m["content"]).ok_or_else(|| malformed(i))?
        };
        rendered.push_str(&content);
        rendered.push('\n');
    }
    let tokens = tokens_of(rendered.len());
    let continued = open.as_ref().map_or(0, |t| t.len().div_ceil(4) as u64);
    if generation_prompt || open.is_some() {
        rendered.push_str("assistant: ");
    }
    rendered.push_str(open.as_deref().unwrap_or_default());
    Ok(Prompt {
        context: rendered,
        tokens: tokens + continued,
        continued,
        echo: open.filter(|_| prefilled),
    })
}

/// A completion's prompts: a string, or a list of strings, each a prompt
/// of its own (answered with choices of its own, as OpenAI and vLLM do).
/// With `echo`, each answer repeats its prompt first.
pub(crate) fn completion(v: &Value) -> Result<Vec<Prompt>, Invalid> {
    let texts: Vec<&str> = match &v["prompt"] {
        Value::String(s) => vec![s],
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(Value::as_str)
            .collect::<Option<_>>()
            .ok_or_else(|| {
                Invalid::new(
                    "prompt",
                    "`prompt` must be a string or a list of strings (this engine takes no token ids)",
                )
            })?,
        Value::Array(_) => {
            return Err(Invalid::new(
                "prompt",
                "`prompt` must not be an empty list",
            ));
        }
        _ => return Err(Invalid::new("prompt", "missing or malformed `prompt`")),
    };
    let echo = match &v["echo"] {
        Value::Null => false,
        Value::Bool(b) => *b,
        _ => return Err(Invalid::new("echo", "`echo` must be true or false")),
    };
    Ok(texts
        .into_iter()
        .map(|context| Prompt {
            tokens: tokens_of(context.len()),
            context: context.to_owned(),
            continued: 0,
            echo: echo.then(|| context.to_owned()),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn answer(mut g: Generator, n: usize) -> String {
        (0..n).map(|_| g.next_token()).collect()
    }

    #[test]
    fn a_continued_answer_goes_on_exactly_where_it_was_cut() {
        let ask = json!({"messages": [{"role": "user", "content": "tell me"}]});
        let p = chat(&ask, false).unwrap();
        let whole = answer(Generator::new(&p.context), 12);
        assert_eq!(whole.len(), 48);
        let cut = &whole[..20];
        let again = json!({"messages": [{"role": "user", "content": "tell me"},
            {"role": "assistant", "content": cut}],
            "continue_final_message": true, "add_generation_prompt": false});
        let q = chat(&again, false).unwrap();
        assert_eq!((q.tokens, q.continued), (p.tokens + 5, 5));
        assert_eq!(
            format!("{cut}{}", answer(Generator::new(&q.context), 7)),
            whole
        );

        let text = completion(&json!({"prompt": "once upon"}))
            .unwrap()
            .remove(0);
        let whole = answer(Generator::new(&text.context), 6);
        let later = completion(&json!({"prompt": format!("once upon{}", &whole[..8])}))
            .unwrap()
            .remove(0);
        assert_eq!(later.tokens, text.tokens + 2);
        assert_eq!(
            format!(
                "{}{}",
                &whole[..8],
                answer(Generator::new(&later.context), 4)
            ),
            whole
        );
        // Another prompt, another answer.
        let other = chat(
            &json!({"messages": [{"role": "user", "content": "tell you"}]}),
            false,
        )
        .unwrap();
        assert_ne!(
            answer(Generator::new(&other.context), 12),
            answer(Generator::new(&p.context), 12)
        );
    }

    #[test]
    fn a_stop_sequence_ends_the_text_before_it_and_nothing_after_it_is_sent() {
        let g = Generator::new("once upon");
        let whole = answer(g.clone(), 12);
        let plain = Decoder::new(g.clone(), Vec::new(), 12, "length").finish_all();
        assert_eq!(
            plain,
            (whole.clone(), "length", Vec::new()),
            "no stop, the same text"
        );
        // A stop across two tokens: the text before it, then the end.
        let at = 9;
        let stop = whole[at..at + 3].to_owned();
        let first = whole.find(&stop).unwrap();
        let mut d = Decoder::new(g.clone(), vec!["zzz".into(), stop.clone()], 12, "length");
        let mut sent = String::new();
        let mut steps = 0;
        while d.finish().is_none() {
            let step = d.step();
            // Nothing released is ever taken back.
            assert!(!format!("{sent}{}", step.text).contains(&stop));
            sent.push_str(&step.text);
            steps += 1;
        }
        assert_eq!((sent.as_str(), d.finish()), (&whole[..first], Some("stop")));
        assert_eq!(d.generated, steps);
        assert_eq!(u64::from(d.generated), (first as u64 + 3).div_ceil(4));
        // A held-back start that turns out not to be a stop is sent.
        let tail = format!("{}X", &whole[44..]);
        let (text, finish, _) = Decoder::new(g, vec![tail], 12, "length").finish_all();
        assert_eq!((text, finish), (whole, "length"));
    }

    #[test]
    fn scored_tokens_are_the_same_tokens_likeliest_first() {
        let g = Generator::new("once upon");
        let whole = answer(g.clone(), 12);
        let stop = whole[20..23].to_owned();
        let at = whole.find(&stop).unwrap();
        let (text, _, tokens) = Decoder::new(g.clone(), vec![stop], 12, "length")
            .scored()
            .finish_all();
        assert_eq!(text, whole[..at]);
        // The tokens cover the text, each at its place.
        let mut covered = String::new();
        for (start, t) in &tokens {
            assert_eq!(*start, covered.len());
            covered.push_str(t.token);
            assert_eq!((t.top[0].0, t.top[0].1), (t.token, t.logprob));
            assert!(t.logprob < 0.0 && t.logprob >= 0.5f64.ln() - 1e-4, "{t:?}");
            assert!(t.top.windows(2).all(|w| w[0].1 > w[1].1), "{t:?}");
            let mut words: Vec<&str> = t.top.iter().map(|(w, _)| *w).collect();
            words.sort_unstable();
            words.dedup();
            assert_eq!(words.len(), WORDS.len(), "every word once");
            let mass: f64 = t.top.iter().map(|(_, lp)| lp.exp()).sum();
            assert!(mass <= 1.0 + 1e-3, "{mass}");
        }
        assert!(covered.starts_with(&text) && covered.len() - text.len() < 4);
        // Scored or not, the same answer.
        let mut again = Decoder::new(g, vec![], 12, "length").scored();
        assert_eq!(again.finish_all().0, whole);
        let echoed = prompt_tokens("héllo wörld");
        assert_eq!(echoed[0].2, None);
        assert!(
            echoed[1..]
                .iter()
                .all(|(_, _, lp)| lp.is_some_and(|l| l < 0.0))
        );
        let joined: String = echoed.iter().map(|(_, p, _)| *p).collect();
        assert_eq!(joined, "héllo wörld");
    }

    #[test]
    fn continuing_needs_an_assistant_message_last_and_no_generation_prompt() {
        let user_last = json!({"messages": [{"role": "user", "content": "x"}],
            "continue_final_message": true, "add_generation_prompt": false});
        assert!(chat(&user_last, false).is_err());
        let both = json!({"messages": [{"role": "assistant", "content": "x"}],
            "continue_final_message": true});
        assert!(
            chat(&both, false)
                .unwrap_err()
                .message
                .contains("Cannot set both")
        );
        // llama.cpp's way: a last assistant message is continued unasked.
        let prefilled = json!({"messages": [{"role": "user", "content": "x"},
            {"role": "assistant", "content": "the "}]});
        let asked = json!({"messages": [{"role": "user", "content": "x"},
            {"role": "assistant", "content": "the "}],
            "continue_final_message": true, "add_generation_prompt": false});
        let p = chat(&prefilled, true).unwrap();
        assert_eq!(p.context, chat(&asked, false).unwrap().context);
        assert_eq!(
            p.echo.as_deref(),
            Some("the "),
            "answered after its own text"
        );
        assert_eq!(chat(&asked, false).unwrap().echo, None);
        assert_ne!(
            chat(&prefilled, false).unwrap().context,
            chat(&asked, false).unwrap().context
        );
    }
}
