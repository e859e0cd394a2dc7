//! `llmgw events verify --file X.jsonl [--against STORE | --anchor
//! HASH@POSITION]`: whether an export is a faithful part of a log.
//!
//! On its own a file can only show that it is consistent in itself (each
//! hash over its content and the hash before it, and its trailer over its
//! end): an edit whose later hashes were recomputed passes that. Proof
//! needs something the editor could not change: the source store itself
//! (`--against`), an anchor held from it (`--anchor`), or the server's
//! signature over the trailer checked with its public key (`--public-key`).

use std::io::Write;
use std::path::Path;

use llmgw_eventstore::signing::{Checked, PublicKey};
use llmgw_eventstore::{AnyStore, EventStore, StoreAddress, hash};
use serde_json::json;

use super::file::{Anchor, ExportFile};
use super::filter::when;
use crate::Outcome;
use crate::output::json_line;

fn short(h: &[u8; 32]) -> String {
    hash::to_hex(&h[..6])
}

/// The first position in `a..=b` whose hash the store does not share with
/// the file, `b`'s being known to differ. A chain parts once: equal at a
/// position, equal before it; different, different after. So a bisection
/// finds it, where the last position alone sent an incident engineer to
/// the file's end rather than to the edit.
async fn first_parting(store: &AnyStore, file: &ExportFile, a: u64, b: u64) -> anyhow::Result<u64> {
    let (mut lo, mut hi) = (a, b);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let theirs = file.hashes.get((mid - a) as usize).copied();
        let stored = store.hash_at(mid).await?;
        if stored.is_some() && stored == theirs {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// Whether the store holds the file's events exactly: what was proven, or
/// why not.
async fn compare(store: &AnyStore, file: &ExportFile) -> anyhow::Result<Result<String, String>> {
    let (Some((a, b)), Some((_, last_hash)), Some(first)) =
        (file.check.range(), file.check.head(), file.first.as_ref())
    else {
        return Ok(Err("the file holds no events to compare".into()));
    };
    let (head, _) = store.head().await?;
    if b > head {
        return Ok(Err(format!(
            "the store's log ends at {head}, before the file's last position {b}: it cannot vouch for the rest"
        )));
    }
    match store.hash_at(b).await? {
        None => {
            return Ok(Err(format!(
                "the store holds no event at {b}: its log begins later"
            )));
        }
        Some(h) if h != last_hash => {
            let p = first_parting(store, file, a, b).await?;
            return Ok(Err(format!(
                "position {p} is the first that differs from the store's (at {b}, the file's last, hash {} there, {} in the file): from there the file and the store part, and either may be the one altered (`events verify` on the store checks its own chain), or the file comes from another log",
                short(&h),
                short(&last_hash)
            )));
        }
        Some(_) => {}
    }
    // Equal hashes at the end prove every later link; the first event's own
    // content is proven by its link to the store's event before it.
    if a > 1 {
        match store.hash_at(a - 1).await? {
            Some(prev) if hash::chain(&prev, first) == first.hash => {}
            Some(_) => {
                return Ok(Err(format!(
                    "position {a} does not follow the store's event at {}: the file's first event, or the store's event before it, was altered",
                    a - 1
                )));
            }
            None => {
                return Ok(Err(format!(
                    "the store holds no event at {}, where the file joins",
                    a - 1
                )));
            }
        }
    }
    if let Some(t) = &file.trailer
        && t.head <= head
        && t.head > 0
        && store.hash_at(t.head).await? != t.head_hash
    {
        return Ok(Err(format!(
            "the trailer names a head at {} that the store does not have: the trailer or the store's log was altered since the export, or the file comes from another log",
            t.head
        )));
    }
    Ok(Ok(format!(
        "positions {a}..={b} are the store's, event for event (hash {} at {b})",
        short(&last_hash)
    )))
}

pub(super) async fn run(
    input: &Path,
    against: Option<&str>,
    anchors: &[Anchor],
    key: Option<PublicKey>,
    json: bool,
) -> anyhow::Result<Outcome> {
    let mut file = ExportFile::open(input, anchors, key)?;
    let mut problem = loop {
        match file.next_event() {
            Ok(Some(_)) => {}
            Ok(None) => break None,
            Err(r) => break Some(r),
        }
    };
    let mut proven = None;
    if problem.is_none()
        && let Some(address) = against
    {
        let store = crate::store::open_reading(address).await?;
        match compare(&store, &file).await? {
            Ok(p) => proven = Some(p),
            Err(p) => problem = Some(p),
        }
    }
    let range = file.check.range();
    let mut out = std::io::stdout().lock();
    if json {
        json_line(
            &mut out,
            &json!({
                "ok": problem.is_none(),
                "problem": problem,
                "from": range.map(|r| r.0),
                "to": range.map(|r| r.1),
                "first_linked": file.check.first_linked(),
                "trailer": file.trailer,
                "anchors": anchors.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "signature": file.signature.as_ref().map(|c| match c {
                    Checked::Proven(k) => json!({"key": k.to_string(), "proven": true}),
                    Checked::SelfConsistent(k) => json!({"key": k.to_string(), "proven": false}),
                }),
                "against": proven,
                "last_anchor": file.last_anchor.as_ref().map(|a| json!({
                    "anchor": a.anchor.to_string(),
                    "event": a.event,
                    "recorded_at": when(a.recorded_at),
                    "checked": a.checked,
                })),
            }),
        )?;
    } else if let Some(p) = &problem {
        writeln!(out, "TAMPERED: {p}")?;
    } else {
        match range {
            Some((a, b)) => {
                let link = if file.check.first_linked() {
                    String::new()
                } else {
                    format!(" (the link into {a} is not checked: the file names no hash before it)")
                };
                writeln!(
                    out,
                    "ok: {} events in {a}..={b} chain correctly{link}",
                    b - a + 1
                )?;
            }
            None => writeln!(out, "ok: the file holds no events")?,
        }
        match &file.trailer {
            Some(t) => writeln!(
                out,
                "trailer: written on {} at {}; the source's head was {}{}",
                t.host,
                when(t.exported_at),
                t.head,
                t.head_hash
                    .map_or(String::new(), |h| format!(" (hash {})", short(&h)))
            )?,
            None => writeln!(
                out,
                "no trailer: a file cut at a line boundary cannot be told from a whole one"
            )?,
        }
        match &file.signature {
            Some(Checked::Proven(k)) => writeln!(
                out,
                "signature: good, by the key given ({}): the server that holds it wrote this export",
                k.short()
            )?,
            Some(Checked::SelfConsistent(k)) => writeln!(
                out,
                "signature: good by the key the trailer names ({}); give --public-key with the server's key to prove who signed",
                k.short()
            )?,
            None if file.trailer.is_some() => {
                writeln!(out, "signature: none (the exporter had no signing key)")?
            }
            None => {}
        }
        for a in anchors {
            writeln!(out, "anchor {a}: matches")?;
        }
        if let Some(a) = &file.last_anchor {
            writeln!(out, "{}", super::log_anchor_line(a))?;
        }
        if let (Some(p), Some(address)) = (&proven, against) {
            let shown = StoreAddress::parse(address).map_or(address.to_owned(), |a| a.redacted());
            writeln!(out, "against {shown}: {p}")?;
        }
        let signed = matches!(file.signature, Some(Checked::Proven(_)));
        if anchors.is_empty() && against.is_none() && !signed {
            writeln!(
                out,
                "not proven: nothing outside the file anchors it, so an edit with its later hashes recomputed would pass; give --against STORE, --anchor HASH@POSITION or --public-key KEY"
            )?;
        }
    }
    out.flush()?;
    Ok(if problem.is_none() {
        Outcome::Ok
    } else {
        Outcome::Failed
    })
}
