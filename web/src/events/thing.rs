//! One thing's history: which streams tell what happened to a node, a
//! model, a key or a person.
//!
//! A history is the thing's stream, its refusals (`audit-<stream>`), and
//! the streams of what hangs off it: a node's replicas, a model's replicas
//! and the demand for it, a person's own keys. The page finds those in the
//! server's views; the CLI's `events log --node/--model/--key/--user`
//! finds them in the log itself. A key's usage
//! records of older logs (`usage-<key>`, one per request) are left out:
//! they would bury the decisions; the page links to them as a stream filter
//! instead. Usage is now one batch per gateway flush
//! (`usage-batches-<gateway>`), many keys' rows together, so it belongs to
//! no one thing.

use std::collections::BTreeSet;

use llmgw_projections::Projections;

use crate::WebError;

/// What `?thing=` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Thing {
    Node(String),
    Model(String),
    Key(String),
    User(String),
}

/// The most related streams one history reads, so that a thing with a long
/// past cannot make the query unbounded; the newest replicas are kept.
const MAX_STREAMS: usize = 400;

impl Thing {
    /// `node:N`, `model:M`, `key:K` or `user:U`.
    pub(crate) fn parse(text: &str) -> Result<Thing, WebError> {
        let bad = || {
            WebError::Bad(format!(
                "{text:?} is not a thing: say node:NAME, model:NAME, key:ID or user:ID"
            ))
        };
        let (kind, id) = text.trim().split_once(':').ok_or_else(bad)?;
        let id = id.trim();
        if id.is_empty() {
            return Err(bad());
        }
        let id = id.to_owned();
        Ok(match kind.trim() {
            "node" => Thing::Node(id),
            "model" => Thing::Model(id),
            "key" => Thing::Key(id),
            "user" => Thing::User(id),
            _ => return Err(bad()),
        })
    }

    /// The thing a stream belongs to, for linking a row to its history.
    pub(crate) fn of_stream(stream: &str) -> Option<Thing> {
        // A gateway's usage batches hold many keys' rows: no one thing.
        if stream.starts_with(llmgw_domain::event::USAGE_BATCHES_PREFIX) {
            return None;
        }
        let stream = stream.strip_prefix("audit-").unwrap_or(stream);
        let (kind, id) = stream.split_once('-')?;
        let id = id.to_owned();
        match kind {
            "node" => Some(Thing::Node(id)),
            "model" | "demand" => Some(Thing::Model(id)),
            "key" | "usage" => Some(Thing::Key(id)),
            "user" => Some(Thing::User(id)),
            _ => None,
        }
    }

    /// As `?thing=` takes it.
    pub(crate) fn param(&self) -> String {
        let (kind, id) = self.parts();
        format!("{kind}:{id}")
    }

    /// How the page names it.
    pub(crate) fn title(&self) -> String {
        let (kind, id) = self.parts();
        format!("{kind} {id}")
    }

    fn parts(&self) -> (&'static str, &str) {
        match self {
            Thing::Node(id) => ("node", id),
            Thing::Model(id) => ("model", id),
            Thing::Key(id) => ("key", id),
            Thing::User(id) => ("user", id),
        }
    }

    /// The thing's own stream.
    pub(crate) fn stream(&self) -> String {
        let (kind, id) = self.parts();
        format!("{kind}-{id}")
    }

    /// Every stream of its history: its own, what hangs off it in the
    /// views, and the refusals about each.
    pub(crate) fn streams(&self, views: &Projections) -> Vec<String> {
        let mut related: Vec<String> = match self {
            Thing::Node(node) => views
                .cluster
                .replicas
                .replicas
                .values()
                .filter(|r| r.placement.shards.iter().any(|s| s.node_id == *node))
                .map(|r| format!("replica-{}", r.placement.replica_id))
                .collect(),
            Thing::Model(model) => views
                .cluster
                .replicas
                .replicas
                .values()
                .filter(|r| r.placement.model == *model)
                .map(|r| format!("replica-{}", r.placement.replica_id))
                .chain(std::iter::once(format!("demand-{model}")))
                .collect(),
            Thing::Key(_) => Vec::new(),
            Thing::User(user) => views
                .tenancy
                .tenancy
                .keys
                .values()
                .filter(|k| k.owner.as_deref() == Some(user.as_str()))
                .map(|k| format!("key-{}", k.key_id))
                .collect(),
        };
        // The control plane names replicas `r-<UUID v7>`, which sort by
        // time: the last ones are the newest; keep those when there are
        // too many.
        let keep = MAX_STREAMS / 2 - 1;
        if related.len() > keep {
            related.drain(..related.len() - keep);
        }
        let mut out = BTreeSet::new();
        for s in std::iter::once(self.stream()).chain(related) {
            out.insert(format!("audit-{s}"));
            out.insert(s);
        }
        out.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn things_parse_and_come_back_from_their_streams() {
        assert_eq!(
            Thing::parse("node:gpu-a-01").expect("node"),
            Thing::Node("gpu-a-01".into())
        );
        assert!(Thing::parse("node:").is_err());
        assert!(Thing::parse("replica:r1").is_err());
        assert!(Thing::parse("gpu-a-01").is_err());
        assert_eq!(
            Thing::of_stream("audit-key-k1"),
            Some(Thing::Key("k1".into()))
        );
        assert_eq!(
            Thing::of_stream("model-llama-3"),
            Some(Thing::Model("llama-3".into()))
        );
        assert_eq!(Thing::of_stream("leadership"), None);
        // An older log's usage of one key is the key's; a gateway's batches
        // are no one thing's.
        assert_eq!(Thing::of_stream("usage-k1"), Some(Thing::Key("k1".into())));
        assert_eq!(Thing::of_stream("usage-batches-gateway-cp-1"), None);
        assert_eq!(
            Thing::Key("k1".into()).streams(&Projections::default()),
            vec!["audit-key-k1".to_owned(), "key-k1".to_owned()]
        );
    }
}
