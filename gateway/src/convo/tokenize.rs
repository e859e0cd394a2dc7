//! A thread's history counted by the engine's own tokenizer, so that it is
//! trimmed to what the model really holds rather than to an estimate that
//! must overcount to be safe. vLLM and the sim engine count a chat as it
//! will be rendered (`POST /tokenize` with the messages and the generation
//! prompt); llama.cpp's server renders it (`POST /apply-template`) and then
//! tokenizes the text (`POST /tokenize`). SGLang's tokenizer takes text
//! only, without its chat template, so its models keep the estimate, as
//! does any request whose engine does not answer in time.

use std::time::Duration;

use serde_json::{Value, json};

use crate::Gateway;
use crate::scrape::EngineKind;

/// A count that takes longer than this is not worth waiting for: the
/// estimate answers at once.
const WAIT: Duration = Duration::from_secs(2);

/// An engine that counts a chat's tokens for one model.
#[derive(Debug)]
pub(crate) struct Tokenizer {
    client: reqwest::Client,
    url: String,
    engine: EngineKind,
    model: String,
    key: Option<String>,
}

impl Tokenizer {
    /// The first endpoint serving `model` whose engine can count a chat.
    pub(crate) fn for_model(gw: &Gateway, model: &str) -> Option<Self> {
        let (endpoint, _) = gw
            .endpoints
            .candidates(model, &[])
            .into_iter()
            .find(|(e, _)| {
                matches!(
                    e.spec.engine,
                    EngineKind::Vllm | EngineKind::Sim | EngineKind::Llamacpp
                )
            })?;
        Some(Tokenizer {
            client: gw.client.clone(),
            url: endpoint.spec.url.clone(),
            engine: endpoint.spec.engine,
            model: model.to_owned(),
            key: endpoint
                .spec
                .api_key
                .as_ref()
                .map(|k| k.expose().to_owned()),
        })
    }

    /// The prompt tokens of `messages` with the generation prompt; None
    /// when the engine cannot say (the caller estimates instead).
    pub(crate) async fn count(&self, messages: &[Value]) -> Option<u64> {
        let counted = match self.engine {
            EngineKind::Llamacpp => self.count_llamacpp(messages).await,
            _ => {
                let v = self
                    .post(
                        "/tokenize",
                        json!({"model": self.model, "messages": messages,
                               "add_generation_prompt": true}),
                    )
                    .await?;
                v.get("count").and_then(Value::as_u64).or_else(|| {
                    v.get("tokens")
                        .and_then(Value::as_array)
                        .map(|t| t.len() as u64)
                })
            }
        };
        if counted.is_none() {
            tracing::debug!(url = %self.url, "the engine did not count the thread; estimating");
        }
        counted
    }

    async fn count_llamacpp(&self, messages: &[Value]) -> Option<u64> {
        let rendered = self
            .post("/apply-template", json!({"messages": messages}))
            .await?;
        let prompt = rendered.get("prompt").and_then(Value::as_str)?;
        let v = self
            .post("/tokenize", json!({"content": prompt, "add_special": true}))
            .await?;
        v.get("tokens")
            .and_then(Value::as_array)
            .map(|t| t.len() as u64)
    }

    async fn post(&self, path: &str, body: Value) -> Option<Value> {
        let mut r = self
            .client
            .post(format!("{}{path}", self.url))
            .timeout(WAIT)
            .json(&body);
        if let Some(k) = &self.key {
            r = r.bearer_auth(k);
        }
        let answer = r.send().await.ok()?;
        if !answer.status().is_success() {
            return None;
        }
        answer.json().await.ok()
    }
}

/// What `trim` decides with exact counts: the fewest oldest turns dropped
/// (never a system message) for the history and `new` to fit `budget`,
/// found by bisection (fewer messages never count more), or everything
/// droppable when nothing fits. None when the engine could not count.
pub(crate) async fn trim_counted(
    history: &[Value],
    new: &[Value],
    budget: u64,
    tokenizer: &Tokenizer,
) -> Option<(Vec<Value>, usize)> {
    let droppable = super::threads::droppable(history, new);
    // Whole turns only: what is left starts with a person's message, and
    // keeps the turn `new` goes on with.
    let keep = |k: usize| -> Vec<Value> {
        super::threads::drop_oldest(history, super::threads::whole_turns(history, new, k))
    };
    let prompt = |k: usize| {
        let mut all = keep(k);
        all.extend_from_slice(new);
        all
    };
    if tokenizer.count(&prompt(0)).await? <= budget || droppable == 0 {
        return Some((history.to_vec(), 0));
    }
    // The answer lies in lo..=hi; dropping all is the last resort.
    let (mut lo, mut hi) = (1, droppable);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if tokenizer.count(&prompt(mid)).await? <= budget {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some((keep(lo), super::threads::whole_turns(history, new, lo)))
}
