//! Threads: a chat completion with `x-llmgw-thread: ID` carries only the
//! client's new turn. [`open_turn`] prepends the thread's history, trimmed to
//! the model's context (oldest turns first, never a system message or the
//! new turn); [`Turn::close`] says how many turns were dropped
//! (`x-llmgw-thread-trimmed`) and, once the answer has been sent whole,
//! keeps the new turn and, when the project captures, the reply (capped).
//! A failed answer keeps nothing, so a retry does not repeat the turn.

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use llmgw_projections::KeyEntry;
use serde_json::{Value, json};

use super::{Keeper, Use, convo_error, keeper, threads_for, threads_of};
use crate::{ApiError, Gateway};

const THREAD_HEADER: &str = "x-llmgw-thread";
const TRIMMED_HEADER: HeaderName = HeaderName::from_static("x-llmgw-thread-trimmed");

/// The largest whole (not streamed) answer whose reply a thread keeps.
const WHOLE_ANSWER_MAX: usize = 4 * 1024 * 1024;

/// The bytes of an answer read for its reply, `cap` being what is kept of
/// its text. A whole answer is read only once it is all here: held up to
/// 4 MiB (a 208 KB answer, past the 192 KiB a stream's calls are bounded
/// by, kept nothing of its reply); a stream keeps its capped text as it
/// goes.
fn raw_cap(stream: bool, cap: usize) -> usize {
    if stream {
        cap.saturating_mul(8).saturating_add(64 * 1024)
    } else {
        cap.saturating_mul(8).max(WHOLE_ANSWER_MAX)
    }
}

/// The thread a request names, checked; None when it names none.
pub(crate) fn thread_header(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get(THREAD_HEADER) else {
        return Ok(None);
    };
    // Not ASCII: named as its bytes read, not as "?".
    let id = String::from_utf8_lossy(v.as_bytes()).trim().to_owned();
    llmgw_convo::limits::check_name("thread", &id).map_err(convo_error)?;
    Ok(Some(id))
}

/// A request's turn in a thread, between sending and keeping.
#[derive(Debug)]
pub(crate) struct Turn {
    keeper: Arc<Keeper>,
    project: String,
    thread: String,
    /// The thread as the turn read it: its closing write goes there or
    /// nowhere (a delete while the turn is answered wins).
    seen: llmgw_convo::Seen,
    /// What is kept once the answer completes.
    keep: Vec<Value>,
    capture: bool,
    trimmed: usize,
    /// The body to send: the history, then the new turn.
    pub(crate) body: Bytes,
}

/// The tokens a message may take, never fewer than it does: its whole JSON
/// at the gateway's estimate of about three bytes a token, plus a few for
/// the chat template's framing.
pub(crate) fn cost(m: &Value) -> u64 {
    crate::limits::estimate_tokens(m.to_string().len(), None) + 4
}

pub(super) fn is_system(m: &Value) -> bool {
    matches!(
        m.get("role").and_then(Value::as_str),
        Some("system" | "developer")
    )
}

/// The history to send within `budget` tokens (with `new`), and how many
/// turns were dropped: the oldest first, never a system message. When even
/// that is not enough, everything droppable is dropped and the rest sent.
pub(crate) fn trim(history: Vec<Value>, new: &[Value], budget: u64) -> (Vec<Value>, usize) {
    let mut total: u64 = history.iter().chain(new).map(cost).sum();
    let mut k = 0;
    for m in history.iter().filter(|m| !is_system(m)) {
        if total <= budget {
            break;
        }
        total -= cost(m);
        k += 1;
    }
    let k = whole_turns(&history, new, k);
    (drop_oldest(&history, k), k)
}

fn role(m: &Value) -> Option<&str> {
    m.get("role").and_then(Value::as_str)
}

/// How many messages (not system ones) may go, oldest first, with `new`
/// after them: all of them, unless the new turn goes on with an open one
/// (it starts with a tool's result or an assistant's message): then the
/// open turn, from the history's last person's message on, stays, or a
/// tool's result was sent without the call it answers and the question
/// before it. Beyond that the engine says the prompt does not fit.
pub(crate) fn droppable(history: &[Value], new: &[Value]) -> usize {
    let turns: Vec<&Value> = history.iter().filter(|m| !is_system(m)).collect();
    let goes_on = new
        .iter()
        .find(|m| !is_system(m))
        .is_some_and(|m| role(m) != Some("user"));
    if !goes_on {
        return turns.len();
    }
    turns
        .iter()
        .rposition(|m| role(m) == Some("user"))
        .unwrap_or(0)
}

/// `k` messages dropped, oldest first, rounded up to whole turns: what is
/// left starts with a person's message, and the turn `new` goes on with
/// stays ([`droppable`]). A reply left without its question, or a tool's
/// result without the call it answers, is refused by the engines' chat
/// templates (vLLM's among them).
pub(crate) fn whole_turns(history: &[Value], new: &[Value], k: usize) -> usize {
    whole(history, k).min(droppable(history, new))
}

fn whole(history: &[Value], k: usize) -> usize {
    if k == 0 {
        return 0;
    }
    let mut rest = history.iter().filter(|m| !is_system(m)).skip(k);
    let mut k = k;
    while rest
        .next()
        .is_some_and(|m| m.get("role").and_then(Value::as_str) != Some("user"))
    {
        k += 1;
    }
    k
}

/// The history without its `k` oldest messages that are not system ones.
pub(crate) fn drop_oldest(history: &[Value], k: usize) -> Vec<Value> {
    let mut dropped = 0;
    history
        .iter()
        .filter(|m| {
            if dropped < k && !is_system(m) {
                dropped += 1;
                false
            } else {
                true
            }
        })
        .cloned()
        .collect()
}

/// Reads the thread, trims it to the model's context and builds the body.
pub(crate) async fn open_turn(
    gw: &Gateway,
    key: Option<&KeyEntry>,
    thread: String,
    body: Bytes,
) -> Result<Turn, ApiError> {
    let (project, setting) = threads_of(gw, key)?;
    let keeper = keeper(gw)?;
    let mut request: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let new: Vec<Value> = match request.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m.clone(),
        _ => {
            return Err(ApiError::bad_request(
                "a thread's request carries its new turn in `messages`",
            ));
        }
    };
    let (canonical, context) = {
        let routes = gw.routes.load();
        let asked = request.get("model").and_then(Value::as_str).unwrap_or("");
        let canonical = routes.canonical(asked).to_owned();
        // Any of the models may serve it: fit the smallest.
        let context = std::iter::once(&canonical)
            .chain(routes.fallbacks(&canonical))
            .filter_map(|m| routes.context(m))
            .min()
            .unwrap_or(keeper.settings.default_context);
        (canonical, context)
    };
    let reserve = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|f| request.get(*f).and_then(Value::as_u64))
        .unwrap_or(0);
    let llmgw_convo::Thread {
        messages: mut history,
        seen,
    } = keeper
        .store
        .thread(&project, &thread)
        .await
        .map_err(convo_error)?;
    // A system message the client sends each turn (a Responses client's
    // instructions) is kept once, and sent once, first, where the history
    // has it: templates refuse a second one.
    let keep: Vec<Value> = new
        .iter()
        .filter(|m| !(is_system(m) && history.contains(m)))
        .cloned()
        .collect();
    // One set of instructions is sent, first: those the turn opens with,
    // else the thread's newest (every one stays kept in the thread).
    let opening = keep.iter().take_while(|m| is_system(m)).count();
    let newest: Vec<Value> = if opening > 0 {
        keep[..opening].to_vec()
    } else {
        history
            .iter()
            .rev()
            .find(|m| is_system(m))
            .cloned()
            .into_iter()
            .collect()
    };
    history.retain(|m| !is_system(m));
    let history: Vec<Value> = newest.into_iter().chain(history).collect();
    let sent = keep[opening..].to_vec();
    let budget = u64::from(context).saturating_sub(reserve);
    // The asked model's engine counts when it can (a fallback's tokenizer
    // may differ, but its context is within the budget too); else the
    // estimate, which never undercounts.
    let counted = match super::tokenize::Tokenizer::for_model(gw, &canonical) {
        Some(t) => super::tokenize::trim_counted(&history, &sent, budget, &t).await,
        None => None,
    };
    let (mut messages, trimmed) = match counted {
        Some(done) => done,
        None => trim(history, &sent, budget),
    };
    messages.extend(sent);
    if let Some(obj) = request.as_object_mut() {
        obj.insert("messages".into(), Value::Array(messages));
    }
    let body = serde_json::to_vec(&request)
        .map(Bytes::from)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(Turn {
        keeper,
        project,
        thread,
        seen,
        keep,
        capture: setting.capture,
        trimmed,
        body,
    })
}

/// The reply's text, scanned from the answer as it passes, capped, and
/// the tools it called: the next turn answers them, and a `tool` message
/// with no call before it is refused by the engines.
#[derive(Debug, Default)]
struct Reply {
    stream: bool,
    /// Keep the reply's text and calls (the project captures); without,
    /// a stream is still read for how it ended.
    capture: bool,
    /// A stream said it was done: a finish reason, or `[DONE]`.
    finished: bool,
    /// The answer carried an error (an engine's, or the gateway's word
    /// that the engine broke off), or a piece of it failed to arrive.
    failed: bool,
    /// A streamed answer's unfinished line; a whole answer's bytes.
    pending: Vec<u8>,
    text: String,
    /// The calls made so far (id, name, arguments), grown by a stream's
    /// pieces.
    calls: Vec<(String, String, String)>,
    /// Which call each stream index last started.
    started: Vec<(u64, usize)>,
    /// The streamed calls' argument bytes so far.
    call_bytes: usize,
    /// The answer's id, which names a call the engine gave no id.
    chat_id: Option<String>,
    cap: usize,
    /// A whole answer larger than this is not parsed (its text is lost).
    raw_cap: usize,
    overflow: bool,
}

impl Reply {
    fn push_text(&mut self, t: &str) {
        let room = self.cap.saturating_sub(self.text.len());
        let mut end = t.len().min(room);
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        self.text.push_str(&t[..end]);
    }

    fn feed(&mut self, chunk: &[u8]) {
        if self.overflow || (!self.stream && !self.capture) {
            return;
        }
        self.pending.extend_from_slice(chunk);
        if !self.stream {
            self.overflow = self.pending.len() > self.raw_cap;
            return;
        }
        while let Some(nl) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                self.finished = true;
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if v.get("error").is_some() {
                self.failed = true;
            }
            if v["choices"][0]["finish_reason"].is_string() {
                self.finished = true;
            }
            if !self.capture {
                continue;
            }
            if self.chat_id.is_none() {
                self.chat_id = v["id"].as_str().map(str::to_owned);
            }
            let delta = &v["choices"][0]["delta"];
            if let Some(t) = delta["content"].as_str() {
                self.push_text(t);
            }
            for piece in delta["tool_calls"].as_array().into_iter().flatten() {
                self.call_piece(piece);
            }
        }
    }

    /// A streamed call's piece: a new index, or a new id on one, starts a
    /// call (engines that number every call 0 tell them apart by id); the
    /// rest add to the arguments of the newest call at their index. A call
    /// without an id is named as the Responses API names it to its client.
    fn call_piece(&mut self, piece: &Value) {
        let f = &piece["function"];
        let index = piece["index"].as_u64().unwrap_or(0);
        let id = piece["id"].as_str().filter(|i| !i.is_empty());
        let newest = self
            .started
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, at)| *at);
        let at = match newest {
            Some(at) if id.is_none_or(|id| self.calls[at].0 == id) => at,
            _ => {
                let k = self.calls.len();
                let id = id.map_or_else(
                    || crate::responses::call_id(self.chat_id.as_deref(), k),
                    str::to_owned,
                );
                let name = f["name"].as_str().unwrap_or_default().to_owned();
                self.calls.push((id, name, String::new()));
                self.started.retain(|(i, _)| *i != index);
                self.started.push((index, k));
                k
            }
        };
        if let Some(args) = f["arguments"].as_str() {
            // Bounded as a whole answer is: past it the calls are not kept.
            self.call_bytes = self.call_bytes.saturating_add(args.len());
            if self.call_bytes <= self.raw_cap {
                self.calls[at].2.push_str(args);
            }
        }
    }

    /// The assistant's message as the thread keeps it: its text, its
    /// calls; None for an answer of neither.
    fn finish(&mut self) -> Option<Value> {
        if self.overflow {
            tracing::warn!(
                bytes = self.raw_cap,
                "a whole answer too large to read: its reply is not kept in its thread"
            );
        }
        if !self.stream && !self.overflow {
            let v: Value = serde_json::from_slice(&self.pending).ok()?;
            let m = &v["choices"][0]["message"];
            if let Some(t) = m["content"].as_str() {
                self.push_text(t);
            }
            let chat_id = v["id"].as_str();
            for (k, c) in m["tool_calls"].as_array().into_iter().flatten().enumerate() {
                let f = &c["function"];
                self.calls.push((
                    c["id"]
                        .as_str()
                        .filter(|i| !i.is_empty())
                        .map_or_else(|| crate::responses::call_id(chat_id, k), str::to_owned),
                    f["name"].as_str().unwrap_or_default().to_owned(),
                    f["arguments"].as_str().unwrap_or("{}").to_owned(),
                ));
            }
        }
        if self.call_bytes > self.raw_cap {
            tracing::warn!(
                bytes = self.call_bytes,
                "a reply's tool calls are too large to keep in its thread"
            );
            self.calls.clear();
        }
        if self.calls.is_empty() {
            return (!self.text.is_empty())
                .then(|| json!({"role": "assistant", "content": std::mem::take(&mut self.text)}));
        }
        let calls: Vec<Value> = self
            .calls
            .drain(..)
            .map(|(id, name, arguments)| {
                json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": arguments}})
            })
            .collect();
        let text = std::mem::take(&mut self.text);
        let content = if text.is_empty() {
            Value::Null
        } else {
            json!(text)
        };
        Some(json!({"role": "assistant", "content": content, "tool_calls": calls}))
    }
}

impl Turn {
    /// See [`open_turn`].
    pub(crate) async fn open(
        gw: &Gateway,
        key: Option<&KeyEntry>,
        thread: String,
        body: Bytes,
    ) -> Result<Turn, ApiError> {
        open_turn(gw, key, thread, body).await
    }

    /// The answer with the trimmed count; the turn (and the reply) kept
    /// once the whole answer has been sent, before the body ends, so the
    /// client's next turn finds it.
    pub(crate) fn close(self, mut response: Response) -> Response {
        response
            .headers_mut()
            .insert(TRIMMED_HEADER, HeaderValue::from(self.trimmed));
        if !response.status().is_success() {
            return response;
        }
        let stream = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let cap = self.keeper.settings.capture_max_bytes;
        let reply = Arc::new(Mutex::new(Reply {
            stream,
            capture: self.capture,
            cap,
            raw_cap: raw_cap(stream, cap),
            ..Reply::default()
        }));
        let (parts, body) = response.into_parts();
        let scanning = {
            let reply = reply.clone();
            body.into_data_stream().map(move |chunk| {
                let mut r = reply.lock().unwrap_or_else(|p| p.into_inner());
                match &chunk {
                    Ok(bytes) => r.feed(bytes),
                    Err(_) => r.failed = true,
                }
                chunk
            })
        };
        let keep = futures_util::stream::once(async move {
            let mut messages = self.keep;
            {
                let mut r = reply.lock().unwrap_or_else(|p| p.into_inner());
                // An answer that broke off, or ended in an error, keeps
                // nothing: a retry would repeat the turn (and a partial
                // reply, or none, was kept with it).
                if r.failed || (r.stream && !r.finished) {
                    tracing::debug!(thread = %self.thread, "an answer that did not finish: its turn is not kept");
                    return None;
                }
                if self.capture {
                    messages.extend(r.finish());
                }
            }
            match self
                .keeper
                .store
                .append_seen(
                    &self.project,
                    &self.thread,
                    self.seen,
                    &messages,
                    chrono::Utc::now(),
                )
                .await
            {
                Ok(llmgw_convo::Appended::Kept) => None,
                Ok(llmgw_convo::Appended::Deleted) => {
                    tracing::debug!(thread = %self.thread, "the thread was deleted while its turn was answered: the turn is not kept");
                    None
                }
                // The answer's end waits for this: a client told nothing
                // read a whole 200 and went on with a thread that lacked
                // the turn. The body ends in an error instead, so the
                // client sees the turn fail and sends it again (nothing
                // of it was kept).
                Err(e) => {
                    tracing::error!(error = %e, thread = %self.thread, "a thread's turn could not be kept; the answer is cut so that its client sends it again");
                    Some(Err(axum::Error::new(std::io::Error::other(
                        "the thread's turn could not be kept",
                    ))))
                }
            }
        })
        .filter_map(std::future::ready);
        Response::from_parts(parts, Body::from_stream(scanning.chain(keep)))
    }
}

/// The project whose threads the caller's key reaches, and the keeper.
fn callers_threads(
    gw: &Gateway,
    headers: &HeaderMap,
) -> Result<(String, Arc<super::Keeper>), ApiError> {
    let caller = crate::proxy::identify(gw, headers)?;
    // Also once the project switched threads off, until the sweep: a
    // client can always read and delete its own.
    let (project, _) = threads_for(gw, caller.key.as_deref(), Use::Reach)?;
    Ok((project, keeper(gw)?))
}

/// `GET /v1/threads/{id}`: what the gateway keeps of a thread, its
/// messages oldest first (`{"id", "messages"}`), so that a client that
/// resumes, or a person asking what was kept, can read it; 404 for a
/// thread this caller's project does not have (another project's reads
/// the same).
pub(crate) async fn read(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    thread: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    let thread = match super::memory::path_key(thread) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let kept = async {
        let (project, keeper) = callers_threads(&gw, &headers)?;
        keeper
            .store
            .history(&project, &thread)
            .await
            .map_err(convo_error)
    };
    match kept.await {
        Ok(messages) if messages.is_empty() => {
            ApiError::not_found(format!("no thread {thread:?}")).into_response()
        }
        Ok(messages) => axum::Json(json!({"id": thread, "messages": messages})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /v1/threads/{id}`: 204, or 404 for a thread this caller's
/// project does not have (another project's reads the same).
pub(crate) async fn delete(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    thread: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    let thread = match super::memory::path_key(thread) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let gone = async {
        let (project, keeper) = callers_threads(&gw, &headers)?;
        keeper
            .store
            .delete_thread(&project, &thread)
            .await
            .map_err(convo_error)
    };
    match gone.await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => ApiError::not_found(format!("no thread {thread:?}")).into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_drops_the_oldest_turns_never_a_system_message_or_the_new_turn() {
        let sys = json!({"role": "system", "content": "be brief"});
        let turns: Vec<Value> = (0..6)
            .map(|i| json!({"role": "user", "content": format!("turn {i} {}", "x".repeat(60))}))
            .collect();
        let mut history = vec![sys.clone()];
        history.extend(turns.clone());
        let new = [json!({"role": "user", "content": "now"})];
        let all: u64 = history.iter().chain(&new).map(cost).sum();
        // Room for everything: nothing dropped.
        let (kept, dropped) = trim(history.clone(), &new, all);
        assert_eq!((kept.len(), dropped), (7, 0));
        // Room for all but two turns: the two oldest go, the system stays.
        let (kept, dropped) = trim(history.clone(), &new, all - 2 * cost(&turns[0]));
        assert_eq!(dropped, 2);
        assert_eq!(kept[0], sys);
        assert_eq!(kept[1], turns[2]);
        // No room at all: every turn goes, the system message stays.
        let (kept, dropped) = trim(history, &new, 0);
        assert_eq!((kept, dropped), (vec![sys], 6));
    }

    /// Dropped whole: what is sent starts with a person's message, never a
    /// reply without its question or a tool's result without its call.
    #[test]
    fn trimming_drops_whole_turns() {
        let user = |i: u32| json!({"role": "user", "content": format!("q{i}")});
        let calls = json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
        let result = json!({"role": "tool", "tool_call_id": "c", "content": "42"});
        let answer = json!({"role": "assistant", "content": "it is 42"});
        let history = vec![
            user(1),
            calls,
            result,
            answer,
            user(2),
            json!({"role": "assistant", "content": "ok"}),
        ];
        // One message too many: the whole first turn goes, four messages.
        let new = [user(3)];
        assert_eq!(whole_turns(&history, &new, 1), 4);
        assert_eq!(whole_turns(&history, &new, 4), 4);
        assert_eq!(
            whole_turns(&history, &new, 5),
            6,
            "no person's message left"
        );
        assert_eq!(drop_oldest(&history, 4)[0], user(2));
        let all: u64 = history.iter().chain(&new).map(cost).sum();
        let (kept, dropped) = trim(history.clone(), &new, all - 1);
        assert_eq!((kept[0].clone(), dropped), (user(2), 4));
    }

    /// A turn that goes on with an open one (a tool's result for the call
    /// the history ends with) keeps that turn whatever the budget: its
    /// question and the call stay before the result.
    #[test]
    fn trimming_keeps_the_turn_a_tool_result_answers() {
        let user = |i: u32| json!({"role": "user", "content": format!("q{i} {}", "x".repeat(80))});
        let calls = json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
        let history = vec![
            user(1),
            json!({"role": "assistant", "content": "a1"}),
            user(2),
            calls.clone(),
        ];
        let result = [json!({"role": "tool", "tool_call_id": "c", "content": "12:00"})];
        assert_eq!(droppable(&history, &result), 2);
        let (kept, dropped) = trim(history.clone(), &result, 0);
        assert_eq!((kept, dropped), (vec![user(2), calls.clone()], 2));
        // A new question may drop it all.
        let (kept, dropped) = trim(history.clone(), &[user(3)], 0);
        assert_eq!((kept.len(), dropped), (0, 4));
        // No person's message in the history: nothing goes.
        let only = vec![calls.clone()];
        assert_eq!(trim(only.clone(), &result, 0), (only, 0));
    }

    /// A stream that broke off, or carried an error, is not kept; one
    /// that finished is, captured or not.
    #[test]
    fn an_unfinished_or_failed_stream_is_told_apart() {
        let stream = |capture| Reply {
            stream: true,
            capture,
            cap: 100,
            raw_cap: 1 << 20,
            ..Reply::default()
        };
        let delta = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        for capture in [true, false] {
            let mut cut = stream(capture);
            cut.feed(delta);
            assert!(!cut.finished && !cut.failed);
            let mut erred = stream(capture);
            erred.feed(delta);
            erred.feed(b"data: {\"error\":{\"code\":\"upstream_lost\"}}\n\n");
            assert!(erred.failed);
            let mut done = stream(capture);
            done.feed(delta);
            done.feed(b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
            assert!(done.finished && !done.failed);
        }
    }

    /// A long whole answer keeps its reply, capped, as a streamed one
    /// does (one of 208 KB kept nothing).
    #[test]
    fn a_long_whole_answer_keeps_its_reply_capped() {
        let cap = 16 * 1024;
        let mut r = Reply {
            capture: true,
            cap,
            raw_cap: raw_cap(false, cap),
            ..Reply::default()
        };
        let long = "word ".repeat(60_000);
        let answer = json!({"choices": [{"message": {"role": "assistant", "content": long}}]});
        r.feed(answer.to_string().as_bytes());
        let kept = r.finish().unwrap();
        assert_eq!(kept["content"].as_str().unwrap().len(), cap);
    }

    #[test]
    fn a_reply_is_read_from_a_stream_or_a_whole_answer_and_capped() {
        let mut r = Reply {
            capture: true,
            stream: true,
            cap: 8,
            raw_cap: 1 << 20,
            ..Reply::default()
        };
        r.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"hel\"}}]}\n\ndata: {\"choi");
        r.feed(b"ces\":[{\"delta\":{\"content\":\"lo w\xc3\xb6rld\"}}]}\n\ndata: [DONE]\n\n");
        // Capped at 8 bytes, on a character boundary.
        assert_eq!(r.finish().unwrap()["content"], "hello w");
        let mut r = Reply {
            capture: true,
            cap: 100,
            raw_cap: 1 << 20,
            ..Reply::default()
        };
        r.feed(br#"{"choices":[{"message":{"role":"assistant","content":"hi"}}]}"#);
        assert_eq!(r.finish().unwrap()["content"], "hi");
    }

    /// The calls a reply made are kept with it: the next turn's tool
    /// messages answer them.
    #[test]
    fn a_replys_tool_calls_are_kept_streamed_or_whole() {
        let mut r = Reply {
            capture: true,
            stream: true,
            cap: 100,
            raw_cap: 1 << 20,
            ..Reply::default()
        };
        let piece = |p: Value| {
            format!(
                "data: {}\n\n",
                json!({"choices": [{"delta": {"tool_calls": [p]}}]})
            )
        };
        r.feed(
            piece(json!({"index": 0, "id": "a", "function": {"name": "f", "arguments": "{\"x\""}}))
                .as_bytes(),
        );
        r.feed(piece(json!({"index": 0, "function": {"arguments": ":1}"}})).as_bytes());
        r.feed(
            piece(json!({"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}}))
                .as_bytes(),
        );
        let m = r.finish().unwrap();
        assert_eq!(
            m,
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]})
        );
        let mut r = Reply {
            capture: true,
            cap: 100,
            raw_cap: 1 << 20,
            ..Reply::default()
        };
        r.feed(br#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"h","arguments":"{}"}}]}}]}"#);
        assert_eq!(r.finish().unwrap()["tool_calls"][0]["id"], "c");
    }
}
