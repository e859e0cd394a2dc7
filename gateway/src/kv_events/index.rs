//! The exact index: which blocks each engine says it holds, keyed the way
//! the gateway can compute from a request. Engines name blocks by opaque
//! hashes; a stored block also carries its tokens and its parent, so its
//! key here is the hash of its parent's key and its tokens (as llm-d's
//! indexer recomputes its own), and a request's blocks get the same keys
//! from its tokens. An engine's removal names its own hash, hence the map
//! from engine hashes to keys.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::wire::{EngineHash, Event};

/// The key of the block before a prompt's first.
const ROOT: u64 = 0x6c6c_6d67_772d_6b76;

/// The key of a block from its parent's key and its tokens.
pub(crate) fn chain(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    (parent, tokens).hash(&mut h);
    h.finish()
}

/// The keys of a prompt's full blocks, in order.
pub(crate) fn block_keys(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut parent = ROOT;
    tokens
        .chunks_exact(block_size.max(1))
        .map(|block| {
            parent = chain(parent, block);
            parent
        })
        .collect()
}

/// An engine's blocks, as far as its events tell.
#[derive(Debug, Default)]
pub(crate) struct Blocks {
    by_engine: HashMap<EngineHash, u64>,
    /// Key → how many engine blocks have it (two engine hashes may share
    /// a key when the engine hashes something the router does not see).
    held: HashMap<u64, u32>,
    pub(crate) block_size: Option<usize>,
    /// Stored blocks whose parent was unknown (stored before the gateway
    /// listened, or lost in a gap): they cannot be keyed.
    pub(crate) unchained: u64,
}

/// More blocks than any engine holds: past it, removals were missed.
const MAX_BLOCKS: usize = 4_000_000;

impl Blocks {
    pub(crate) fn len(&self) -> usize {
        self.by_engine.len()
    }

    pub(crate) fn clear(&mut self) {
        self.by_engine.clear();
        self.held.clear();
    }

    pub(crate) fn apply(&mut self, event: &Event) {
        match event {
            Event::Stored {
                hashes,
                parent,
                tokens,
                block_size,
                other,
            } => {
                if *other || tokens.len() != hashes.len() * block_size {
                    return;
                }
                let Some(mut key) = (match parent {
                    None => Some(ROOT),
                    Some(p) => self.by_engine.get(p).copied(),
                }) else {
                    self.unchained += hashes.len() as u64;
                    return;
                };
                self.block_size = Some(*block_size);
                for (h, block) in hashes.iter().zip(tokens.chunks_exact(*block_size)) {
                    key = chain(key, block);
                    if let Some(old) = self.by_engine.insert(*h, key) {
                        self.release(old);
                    }
                    *self.held.entry(key).or_default() += 1;
                }
                if self.by_engine.len() > MAX_BLOCKS {
                    self.clear();
                }
            }
            Event::Removed { hashes, other } => {
                if *other {
                    return;
                }
                for h in hashes {
                    if let Some(key) = self.by_engine.remove(h) {
                        self.release(key);
                    }
                }
            }
            Event::Cleared => self.clear(),
        }
    }

    fn release(&mut self, key: u64) {
        if let Some(n) = self.held.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&key);
            }
        }
    }

    /// Leading blocks of `keys` held.
    pub(crate) fn prefix(&self, keys: &[u64]) -> usize {
        keys.iter()
            .take_while(|k| self.held.contains_key(k))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>) -> Event {
        Event::Stored {
            hashes,
            parent,
            tokens,
            block_size: 2,
            other: false,
        }
    }

    #[test]
    fn blocks_stored_in_pieces_key_as_the_whole_prompt_does() {
        let prompt = [1, 2, 3, 4, 5, 6, 7];
        let keys = block_keys(&prompt, 2);
        assert_eq!(keys.len(), 3, "the partial block has no key");
        let mut b = Blocks::default();
        b.apply(&stored(vec![10], None, vec![1, 2]));
        b.apply(&stored(vec![11, 12], Some(10), vec![3, 4, 5, 6]));
        assert_eq!(b.prefix(&keys), 3);
        // Another prompt sharing only the first block.
        assert_eq!(b.prefix(&block_keys(&[1, 2, 9, 9], 2)), 1);
        b.apply(&Event::Removed {
            hashes: vec![11],
            other: false,
        });
        assert_eq!(b.prefix(&keys), 1, "a removed block ends the prefix");
        // A parent never seen: the blocks cannot be keyed.
        b.apply(&stored(vec![21], Some(99), vec![1, 1]));
        assert_eq!((b.len(), b.unchained), (2, 1));
        b.apply(&Event::Cleared);
        assert_eq!(b.prefix(&keys), 0);
    }
}
