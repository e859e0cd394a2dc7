//! `events verify --anchors FILE`: the lines a leader handed its anchor
//! sink (`control.anchors`), checked against the store: each line's
//! signature (by `--public-key` when given, which every line must then
//! carry), and the hash the store holds at each anchor's position. A log
//! rewritten after an anchor left the server cannot match it; a line
//! forged by someone without the server's key does not verify.

use std::path::Path;

use llmgw_eventstore::signing::{Checked, PublicKey, Signature};
use llmgw_eventstore::{AnyStore, EventStore, hash};

use super::file::Anchor;

/// What the file's lines came to.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// Lines whose anchor the store matches.
    pub(crate) matched: usize,
    /// Of those, the ones signed by the key given.
    pub(crate) proven: usize,
    /// Whether a key was given to check signatures with.
    pub(crate) keyed: bool,
    /// The first line that does not hold, and why.
    pub(crate) problem: Option<String>,
}

pub(crate) async fn check(
    store: &AnyStore,
    path: &Path,
    key: Option<&PublicKey>,
) -> anyhow::Result<Held> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let mut held = Held {
        keyed: key.is_some(),
        ..Held::default()
    };
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = format!("{} line {}", path.display(), i + 1);
        match line_holds(store, line, key).await? {
            Ok(proven) => {
                held.matched += 1;
                held.proven += usize::from(proven);
            }
            Err(why) => {
                held.problem = Some(format!("{at}: {why}"));
                break;
            }
        }
    }
    // An emptied sink proves nothing: it is no pass.
    if held.matched == 0 && held.problem.is_none() {
        held.problem = Some(format!("{}: no anchor line in it", path.display()));
    }
    Ok(held)
}

/// Whether one line holds (and was proven by the key given), or why not.
async fn line_holds(
    store: &AnyStore,
    line: &str,
    key: Option<&PublicKey>,
) -> anyhow::Result<Result<bool, String>> {
    let Ok(serde_json::Value::Object(mut fields)) = serde_json::from_str(line) else {
        return Ok(Err("not a JSON object".into()));
    };
    let signature = fields.remove("signature");
    let unsigned = serde_json::Value::Object(fields);
    let Some(anchor) = unsigned["anchor"].as_str() else {
        return Ok(Err("no \"anchor\"".into()));
    };
    let anchor: Anchor = match anchor.parse() {
        Ok(a) => a,
        Err(why) => return Ok(Err(why)),
    };
    let proven = match (signature, key) {
        (None, Some(k)) => {
            return Ok(Err(format!(
                "not signed, and --public-key asks for a signature by {}",
                k.short()
            )));
        }
        (None, None) => false,
        (Some(s), key) => {
            let Ok(sig) = serde_json::from_value::<Signature>(s) else {
                return Ok(Err("the signature is not one".into()));
            };
            match sig.check(llmgw_control::anchor::ANCHOR_CONTEXT, &unsigned, key) {
                Ok(Checked::Proven(_)) => true,
                Ok(Checked::SelfConsistent(_)) => false,
                Err(why) => return Ok(Err(why)),
            }
        }
    };
    let event = store.read_all_raw(anchor.position - 1, 1).await?;
    match event.first().filter(|e| e.position == anchor.position) {
        Some(e) if e.hash == anchor.hash => Ok(Ok(proven)),
        Some(e) => Ok(Err(format!(
            "the store's event {} has hash {}, not {}: the log was rewritten after this anchor",
            anchor.position,
            hash::to_hex(&e.hash),
            hash::to_hex(&anchor.hash)
        ))),
        None => Ok(Err(format!(
            "the store has no event {} (it ends before, or begins after it)",
            anchor.position
        ))),
    }
}
