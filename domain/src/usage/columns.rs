//! How a usage batch is stored (schema version 2): column by column, each
//! key, project and model name written once. As a list of objects (version
//! 1, still read) every row repeated every field name and every name, ~300
//! bytes of payload a request; in columns a request is its id and a few
//! numbers, ~90 (`usage_bytes` bench). The batcher's event, its canonical text, the stored row
//! and the views' reading of it all shrink with it.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{UsageBatchRecorded, UsageRecorded};
use crate::UnixMillis;
use crate::tenancy::Band;

/// The most bytes of names a batch's rows may name between them: the
/// largest batch a gateway flushes, with four names of 640 bytes each.
/// The rows share their names, but a reader that prints or exports rows
/// one by one (version 1's shape, a table) writes each name again.
const MAX_COPIED: usize = super::MAX_BATCH_ROWS * 4 * 640;

/// The stored shape: written from the rows with borrowed names
/// (`Columns<&str>`), read back owning them (`Columns<String>`). Every
/// column holds one entry per request, in the rows' order.
#[derive(Serialize, Deserialize)]
pub(crate) struct Columns<S> {
    gateway: S,
    /// Every distinct key id, project id and model name of the batch,
    /// first seen first: `key`, `project`, `asked` and `served` are
    /// indexes into it.
    names: Vec<S>,
    key: Vec<u32>,
    project: Vec<u32>,
    asked: Vec<u32>,
    served: Vec<u32>,
    request_id: Vec<S>,
    prompt_tokens: Vec<u64>,
    completion_tokens: Vec<u64>,
    cost_micros: Vec<u64>,
    status: Vec<u16>,
    latency_ms: Vec<u32>,
    ttft_ms: Vec<Option<u32>>,
    band: Vec<Band>,
    at: Vec<UnixMillis>,
}

/// Version 1: a list of rows, each a [`UsageRecorded`].
#[derive(Deserialize)]
pub(crate) struct Rows {
    gateway: String,
    rows: Vec<UsageRecorded>,
}

impl From<Rows> for UsageBatchRecorded {
    fn from(v1: Rows) -> Self {
        UsageBatchRecorded {
            gateway: v1.gateway,
            rows: v1.rows,
        }
    }
}

/// Names as indexes, each name given one the first time it is seen.
#[derive(Default)]
struct Names<'a> {
    list: Vec<&'a str>,
    index: HashMap<&'a str, u32>,
}

impl<'a> Names<'a> {
    fn of(&mut self, name: &'a str) -> u32 {
        *self.index.entry(name).or_insert_with(|| {
            self.list.push(name);
            u32::try_from(self.list.len() - 1).expect("a batch has fewer than 2^32 names")
        })
    }
}

impl Serialize for UsageBatchRecorded {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let rows = &self.rows;
        let column = |f: fn(&'_ UsageRecorded) -> u64| rows.iter().map(f).collect::<Vec<_>>();
        let mut names = Names::default();
        let mut index = |f: for<'r> fn(&'r UsageRecorded) -> &'r str| {
            rows.iter().map(|u| names.of(f(u))).collect::<Vec<_>>()
        };
        let key = index(|u| &u.key_id);
        let project = index(|u| &u.project_id);
        let asked = index(|u| &u.model_asked);
        let served = index(|u| &u.model_served);
        Columns {
            gateway: self.gateway.as_str(),
            names: names.list,
            key,
            project,
            asked,
            served,
            request_id: rows.iter().map(|u| u.request_id.as_str()).collect(),
            prompt_tokens: column(|u| u.prompt_tokens),
            completion_tokens: column(|u| u.completion_tokens),
            cost_micros: column(|u| u.cost_micros),
            status: rows.iter().map(|u| u.status).collect(),
            latency_ms: rows.iter().map(|u| u.latency_ms).collect(),
            ttft_ms: rows.iter().map(|u| u.ttft_ms).collect(),
            band: rows.iter().map(|u| u.band).collect(),
            at: rows.iter().map(|u| u.at).collect(),
        }
        .serialize(s)
    }
}

impl TryFrom<Columns<String>> for UsageBatchRecorded {
    type Error = String;

    fn try_from(c: Columns<String>) -> Result<Self, String> {
        let n = c.request_id.len();
        let lengths = [
            ("key", c.key.len()),
            ("project", c.project.len()),
            ("asked", c.asked.len()),
            ("served", c.served.len()),
            ("prompt_tokens", c.prompt_tokens.len()),
            ("completion_tokens", c.completion_tokens.len()),
            ("cost_micros", c.cost_micros.len()),
            ("status", c.status.len()),
            ("latency_ms", c.latency_ms.len()),
            ("ttft_ms", c.ttft_ms.len()),
            ("band", c.band.len()),
            ("at", c.at.len()),
        ];
        if let Some((column, len)) = lengths.into_iter().find(|(_, len)| *len != n) {
            return Err(format!(
                "usage columns of different lengths: request_id has {n} entries, {column} {len}"
            ));
        }
        // Every index names a name, and the names the rows hold stay
        // within bounds: a name is written once and named by any number of
        // rows, so a small payload could ask for any amount once the rows
        // are written out one by one.
        let mut copied: usize = 0;
        for &i in [&c.key, &c.project, &c.asked, &c.served]
            .into_iter()
            .flatten()
        {
            let Some(name) = c.names.get(i as usize) else {
                return Err(format!(
                    "name {i} is not among the batch's {} names",
                    c.names.len()
                ));
            };
            copied = copied.saturating_add(name.len());
        }
        if copied > MAX_COPIED {
            return Err(format!(
                "the batch's rows name {copied} bytes of names in all, over {MAX_COPIED}"
            ));
        }
        // Each distinct name made once, and shared by the rows naming it.
        let names: Vec<Arc<str>> = c.names.into_iter().map(Arc::from).collect();
        let name = |i: u32| names[i as usize].clone();
        let mut rows = Vec::with_capacity(n);
        for (i, request_id) in c.request_id.into_iter().enumerate() {
            rows.push(UsageRecorded {
                request_id,
                key_id: name(c.key[i]),
                project_id: name(c.project[i]),
                model_asked: name(c.asked[i]),
                model_served: name(c.served[i]),
                prompt_tokens: c.prompt_tokens[i],
                completion_tokens: c.completion_tokens[i],
                cost_micros: c.cost_micros[i],
                status: c.status[i],
                latency_ms: c.latency_ms[i],
                ttft_ms: c.ttft_ms[i],
                band: c.band[i],
                at: c.at[i],
            });
        }
        Ok(UsageBatchRecorded {
            gateway: c.gateway,
            rows,
        })
    }
}
