//! The clean pages of an index, decoded, under a memory budget: the least
//! recently used go first. Dirty nodes are not here; the tree holds them
//! until its next commit writes them.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::page::Node;
use super::NumberMap;

pub struct PageCache {
    budget_bytes: usize,
    held_bytes: usize,
    /// address -> (node, its last use)
    pages: NumberMap<(Arc<Node>, u64)>,
    /// last use -> address, oldest first
    by_use: BTreeMap<u64, u64>,
    clock: u64,
}

impl PageCache {
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            budget_bytes,
            held_bytes: 0,
            pages: NumberMap::default(),
            by_use: BTreeMap::new(),
            clock: 0,
        }
    }

    pub fn get(&mut self, address: u64) -> Option<Arc<Node>> {
        let (node, used) = self.pages.get_mut(&address)?;
        self.by_use.remove(used);
        self.clock += 1;
        *used = self.clock;
        self.by_use.insert(self.clock, address);
        Some(node.clone())
    }

    /// Caches `node` as the page at `address`, evicting the least recently
    /// used pages past the budget (never the one just added).
    pub fn insert(&mut self, address: u64, node: Arc<Node>) {
        self.remove(address);
        self.clock += 1;
        self.held_bytes += node.memory_bytes();
        self.pages.insert(address, (node, self.clock));
        self.by_use.insert(self.clock, address);
        while self.held_bytes > self.budget_bytes && self.pages.len() > 1 {
            let (_, oldest) = self.by_use.pop_first().expect("a page past the budget");
            let (node, _) = self.pages.remove(&oldest).expect("indexed by use");
            self.held_bytes -= node.memory_bytes();
        }
    }

    /// Forgets the page at `address` (it was copied to be changed, or freed).
    pub fn remove(&mut self, address: u64) {
        if let Some((node, used)) = self.pages.remove(&address) {
            self.by_use.remove(&used);
            self.held_bytes -= node.memory_bytes();
        }
    }

    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    #[cfg(test)]
    pub fn pages(&self) -> usize {
        self.pages.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(value_bytes: usize) -> Arc<Node> {
        Arc::new(Node::Leaf(super::super::page::Leaf::from_entries(&[(
            b"k".to_vec(),
            vec![0; value_bytes],
        )])))
    }

    #[test]
    fn the_least_recently_used_page_is_evicted_first_and_the_budget_holds() {
        let one = leaf(1000).memory_bytes();
        let mut cache = PageCache::new(3 * one);
        for address in 0..3 {
            cache.insert(address, leaf(1000));
        }
        assert!(cache.get(0).is_some()); // 1 is now the oldest
        cache.insert(3, leaf(1000));
        assert!(cache.get(1).is_none(), "the least recently used page stayed");
        for address in [0, 2, 3] {
            assert!(cache.get(address).is_some(), "page {address} was evicted");
        }
        assert_eq!(cache.held_bytes(), 3 * one);
        cache.remove(2);
        assert_eq!((cache.held_bytes(), cache.pages()), (2 * one, 2));
    }
}
