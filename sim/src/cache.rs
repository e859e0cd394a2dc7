//! A simulated KV cache with prefix caching: the prompt in fixed-size
//! blocks, each identified by a hash of everything up to and including it,
//! kept in an LRU of bounded size. A request whose leading blocks are cached
//! skips their prefill, as vLLM's automatic prefix caching does.
//!
//! Each admission also says what changed, as vLLM's KV-cache events do:
//! the full blocks newly stored (a last, partial block is cached but, as
//! in vLLM, never announced) and the full blocks evicted.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::kv_events::KvEvent;

#[derive(Debug)]
pub(crate) struct PrefixCache {
    capacity: usize,
    block_bytes: usize,
    /// Block hash → the generation it was last used in, and whether the
    /// block is full (announced in events).
    used: HashMap<u64, (u64, bool)>,
    /// (generation, hash), oldest first; stale entries are skipped lazily.
    order: VecDeque<(u64, u64)>,
    generation: u64,
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lookup {
    pub(crate) blocks: usize,
    pub(crate) hits: usize,
}

impl PrefixCache {
    pub(crate) fn new(capacity: usize, block_bytes: usize) -> Self {
        PrefixCache {
            capacity,
            block_bytes: block_bytes.max(1),
            used: HashMap::new(),
            order: VecDeque::new(),
            generation: 0,
        }
    }

    fn block_hashes(&self, prompt: &[u8]) -> Vec<u64> {
        let mut h = DefaultHasher::new();
        prompt
            .chunks(self.block_bytes)
            .map(|chunk| {
                chunk.hash(&mut h);
                h.finish()
            })
            .collect()
    }

    /// Counts the cached leading blocks of `prompt`, then caches all of its
    /// blocks as most recently used. `events` gets what changed, in order:
    /// each run of newly stored full blocks (with the block before it as
    /// parent), then the full blocks evicted.
    pub(crate) fn admit(&mut self, prompt: &[u8], events: &mut Vec<KvEvent>) -> Lookup {
        let hashes = self.block_hashes(prompt);
        let hits = hashes
            .iter()
            .take_while(|h| self.used.contains_key(h))
            .count();
        let mut run: Option<KvEvent> = None;
        for (i, (h, chunk)) in hashes
            .iter()
            .zip(prompt.chunks(self.block_bytes))
            .enumerate()
        {
            let full = chunk.len() == self.block_bytes;
            let new = !self.used.contains_key(h);
            match &mut run {
                Some(KvEvent::Stored { hashes, tokens, .. }) if new && full => {
                    hashes.push(*h);
                    tokens.extend(token_ids(chunk));
                }
                _ if new && full => {
                    events.extend(run.take());
                    run = Some(KvEvent::Stored {
                        hashes: vec![*h],
                        parent: i.checked_sub(1).map(|p| hashes[p]),
                        tokens: token_ids(chunk).collect(),
                        block_size: self.block_bytes / 4,
                    });
                }
                _ => events.extend(run.take()),
            }
        }
        // Used last to first, so that the tail is the least recent: vLLM
        // frees a finished request's blocks tail first, and under pressure
        // evicts a prompt's tail before its head, keeping prefixes whole.
        for (h, chunk) in hashes.iter().zip(prompt.chunks(self.block_bytes)).rev() {
            self.generation += 1;
            let full = chunk.len() == self.block_bytes;
            self.used.insert(*h, (self.generation, full));
            self.order.push_back((self.generation, *h));
        }
        events.extend(run);
        let removed = self.evict();
        if !removed.is_empty() {
            events.push(KvEvent::Removed { hashes: removed });
        }
        Lookup {
            blocks: hashes.len(),
            hits,
        }
    }

    /// Drops every block (vLLM's `/reset_prefix_cache`).
    pub(crate) fn clear(&mut self) {
        self.used.clear();
        self.order.clear();
    }

    /// Evicts down to capacity; returns the full blocks evicted.
    fn evict(&mut self) -> Vec<u64> {
        let mut removed = Vec::new();
        while self.used.len() > self.capacity {
            let Some((generation, h)) = self.order.pop_front() else {
                break;
            };
            if let Some((g, full)) = self.used.get(&h).copied()
                && g == generation
            {
                self.used.remove(&h);
                if full {
                    removed.push(h);
                }
            }
        }
        // Keep the queue from growing with stale entries.
        if self.order.len() > 4 * self.capacity.max(16) {
            let used = &self.used;
            self.order
                .retain(|(g, h)| used.get(h).is_some_and(|(u, _)| u == g));
        }
        removed
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.used.len()
    }
}

/// The sim's tokens: four bytes a token, read as a little-endian number,
/// so that a router can turn a prompt's text into the same ids.
fn token_ids(chunk: &[u8]) -> impl Iterator<Item = u32> + '_ {
    chunk.chunks(4).map(|t| {
        let mut b = [0u8; 4];
        b[..t.len()].copy_from_slice(t);
        u32::from_le_bytes(b)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(c: &mut PrefixCache, prompt: &[u8]) -> Lookup {
        c.admit(prompt, &mut Vec::new())
    }

    #[test]
    fn a_repeated_prefix_hits_and_a_new_suffix_misses() {
        let mut c = PrefixCache::new(100, 4);
        assert_eq!(
            admit(&mut c, b"system: be brief. user: hi"),
            Lookup { blocks: 7, hits: 0 }
        );
        assert_eq!(
            admit(&mut c, b"system: be brief. user: bye"),
            Lookup { blocks: 7, hits: 6 }
        );
        // The same bytes later in the prompt are a different block: the hash
        // covers everything before them.
        assert_eq!(admit(&mut c, b"XXXXsystem: be brief.").hits, 0);
    }

    #[test]
    fn the_least_recently_used_blocks_are_evicted_first() {
        let mut c = PrefixCache::new(4, 4);
        admit(&mut c, b"aaaabbbb");
        admit(&mut c, b"ccccdddd");
        assert_eq!(c.len(), 4);
        admit(&mut c, b"aaaa"); // touch: now most recent
        admit(&mut c, b"eeee"); // evicts the oldest: bbbb's block
        assert_eq!(admit(&mut c, b"aaaa").hits, 1);
        assert_eq!(admit(&mut c, b"aaaabbbb").hits, 1, "bbbb was evicted");
        assert!(c.len() <= 4);
    }

    #[test]
    fn a_prompt_is_evicted_tail_first_so_its_prefix_still_hits() {
        let mut c = PrefixCache::new(3, 4);
        admit(&mut c, b"aaaabbbbcccc");
        admit(&mut c, b"dddd"); // one block must go: cccc's, the tail
        assert_eq!(admit(&mut c, b"aaaabbbbxxxx").hits, 2);
    }

    #[test]
    fn changes_are_announced_as_vllm_does_full_blocks_only() {
        let mut c = PrefixCache::new(2, 4);
        let mut ev = Vec::new();
        c.admit(b"aaaabbbb", &mut ev);
        let [
            KvEvent::Stored {
                hashes,
                parent: None,
                tokens,
                block_size: 1,
            },
        ] = &ev[..]
        else {
            panic!("{ev:?}");
        };
        assert_eq!(
            tokens,
            &[u32::from_le_bytes(*b"aaaa"), u32::from_le_bytes(*b"bbbb")]
        );
        let (a, b) = (hashes[0], hashes[1]);
        ev.clear();
        // A hit announces nothing; the new block names its parent; the
        // least recently used block is evicted to make room.
        c.admit(b"aaaacccc", &mut ev);
        let [
            KvEvent::Stored {
                hashes,
                parent: Some(p),
                ..
            },
            KvEvent::Removed { hashes: gone },
        ] = &ev[..]
        else {
            panic!("{ev:?}");
        };
        assert_eq!((hashes.len(), *p, &gone[..]), (1, a, &[b][..]));
        // A partial last block is cached, never announced.
        let mut c = PrefixCache::new(10, 4);
        ev.clear();
        c.admit(b"aaaabbbbcc", &mut ev);
        assert!(matches!(&ev[..], [KvEvent::Stored { hashes, .. }] if hashes.len() == 2));
    }
}
