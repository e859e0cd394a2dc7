//! A simulated KV cache with prefix caching: the prompt in fixed-size
//! blocks, each identified by a hash of everything up to and including it,
//! kept in an LRU of bounded size. A request whose leading blocks are cached
//! skips their prefill, as vLLM's automatic prefix caching does.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

#[derive(Debug)]
pub(crate) struct PrefixCache {
    capacity: usize,
    block_bytes: usize,
    /// Block hash → the generation it was last used in.
    used: HashMap<u64, u64>,
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
    /// blocks as most recently used.
    pub(crate) fn admit(&mut self, prompt: &[u8]) -> Lookup {
        let hashes = self.block_hashes(prompt);
        let hits = hashes
            .iter()
            .take_while(|h| self.used.contains_key(h))
            .count();
        for h in &hashes {
            self.generation += 1;
            self.used.insert(*h, self.generation);
            self.order.push_back((self.generation, *h));
        }
        self.evict();
        Lookup {
            blocks: hashes.len(),
            hits,
        }
    }

    fn evict(&mut self) {
        while self.used.len() > self.capacity {
            let Some((generation, h)) = self.order.pop_front() else {
                break;
            };
            if self.used.get(&h) == Some(&generation) {
                self.used.remove(&h);
            }
        }
        // Keep the queue from growing with stale entries.
        if self.order.len() > 4 * self.capacity.max(16) {
            let used = &self.used;
            self.order.retain(|(g, h)| used.get(h) == Some(g));
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.used.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_prefix_hits_and_a_new_suffix_misses() {
        let mut c = PrefixCache::new(100, 4);
        assert_eq!(
            c.admit(b"system: be brief. user: hi"),
            Lookup { blocks: 7, hits: 0 }
        );
        assert_eq!(
            c.admit(b"system: be brief. user: bye"),
            Lookup { blocks: 7, hits: 6 }
        );
        // The same bytes later in the prompt are a different block: the hash
        // covers everything before them.
        assert_eq!(c.admit(b"XXXXsystem: be brief.").hits, 0);
    }

    #[test]
    fn the_least_recently_used_blocks_are_evicted_first() {
        let mut c = PrefixCache::new(4, 4);
        c.admit(b"aaaabbbb");
        c.admit(b"ccccdddd");
        assert_eq!(c.len(), 4);
        c.admit(b"aaaa"); // touch: now most recent
        c.admit(b"eeee"); // evicts the oldest: bbbb's block
        assert_eq!(c.admit(b"aaaa").hits, 1);
        assert_eq!(c.admit(b"aaaabbbb").hits, 1, "bbbb was evicted");
        assert!(c.len() <= 4);
    }
}
