//! A copy-on-write B+tree of byte keys and values, paged on the device.
//!
//! Between commits, a change copies the nodes on its path from the root
//! (`dirty_child`) into memory and changes the copies; the pages they came
//! from stay as they are, reached by the durable root. A commit writes the
//! dirty nodes children first to pages free in the durable root, flushes,
//! then writes the new root record with FUA (`commit`). So the tree on disk
//! is always the last committed one, whatever was written when a crash came,
//! and a commit writes only what changed since the one before. Every dirty
//! node's parent is dirty too, so a commit finds them all from the root.
//!
//! Clean pages are read through a cache with a byte budget; dirty nodes stay
//! in memory until the next commit, which the owner calls when
//! `dirty_bytes` grows past its share (`needs_commit`).

use std::ops::Range;
use std::sync::Arc;

use super::alloc::PageAlloc;
use super::cache::PageCache;
use super::page::{
    self, Child, Expected, Leaf, Node, PageRef, ENTRY_BYTES_MAX, KEY_BYTES_MAX, PAGE_BYTES,
};
use super::root::{self, RootRecord};
use super::root::{ATTACHED_BYTES, FREE_PER_PAGE};
use super::NumberMap;
use crate::dev::{AlignedBuf, Device};
use crate::error::{Error, Result};

/// How an index is placed and cached.
#[derive(Clone, Debug)]
pub struct IndexOptions {
    /// Which tree this is: every page carries it.
    pub owner: u32,
    /// Bytes of the device the index owns: two root slots, then pages.
    pub region: Range<u64>,
    /// Memory for clean pages, decoded.
    pub cache_bytes: usize,
    /// The region holds only the two root slots, and the owner gives pages
    /// before each commit (`Tree::give_pages`): an index inside a volume
    /// grows from the volume's free space.
    pub pages_given: bool,
}

/// Counts since the index was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    pub page_reads: u64,
    pub cache_hits: u64,
    pub commits: u64,
    pub pages_written: u64,
    pub bytes_written: u64,
}

/// What one commit did.
#[derive(Clone, Copy, Debug, Default)]
pub struct CommitReport {
    pub generation: u64,
    pub pages_written: u64,
    pub bytes_written: u64,
    pub duration_ns: u64,
}

pub struct Tree {
    pub(super) options: IndexOptions,
    pub(super) device: Arc<Device>,
    pub(super) root: Child,
    pub(super) root_level: u8,
    pub(super) entries: u64,
    /// The generation changes made now will be committed in.
    pub(super) generation: u64,
    /// The generation of the last durable root.
    pub(super) durable_generation: u64,
    /// Nodes changed in this generation, by number.
    pub(super) dirty: NumberMap<Arc<Node>>,
    pub(super) dirty_bytes: usize,
    next_dirty_id: u64,
    /// The nodes of the generation being committed (`seal` to `finish`):
    /// read as they are, copied into `dirty` to be changed.
    pub(super) frozen: Arc<NumberMap<Arc<Node>>>,
    pub(super) frozen_bytes: usize,
    /// Frozen nodes copied since the seal: their pages, once written, are
    /// reached only by the root being written, so they go after the next.
    pub(super) frozen_copied: Vec<u64>,
    /// Where the last commit put the nodes it wrote, for the pointers to
    /// them that changed nodes still hold by number.
    pub(super) written: Arc<NumberMap<PageRef>>,
    pub(super) cache: PageCache,
    /// Out with the commit being written, between `seal` and `finish`.
    pub(super) alloc: Option<PageAlloc>,
    pub(super) used_pages: u64,
    /// Pages a durable root reaches that the tree in memory no longer does:
    /// free once the next root is durable.
    pub(super) freed: Vec<u64>,
    /// The pages holding the durable root's free list: free after the next
    /// commit.
    pub(super) free_list_pages: Vec<u64>,
    pub(super) stats: IndexStats,
    /// One page's buffer for reads, kept: a fresh aligned allocation per
    /// read made the allocator consolidate its small chunks each time.
    read_buffer: AlignedBuf,
    /// A commit failed part way: memory no longer matches any tree.
    pub(super) failed: bool,
    /// The owner's bytes in the root record, committed with the tree.
    pub(super) attached: [u8; ATTACHED_BYTES],
}

/// What a changed node is counted as in memory: its page's bytes twice
/// over, a bound on a decoded node's vectors and their headers that costs
/// nothing to keep (measuring each node on each change took a sixth of an
/// insert's time).
const DIRTY_NODE_BYTES: usize = 2 * PAGE_BYTES;

pub(super) fn slot_offsets(region: &Range<u64>) -> [u64; 2] {
    [region.start, region.start + PAGE_BYTES as u64]
}

fn pages_region(region: &Range<u64>) -> Range<u64> {
    region.start + 2 * PAGE_BYTES as u64..region.end
}

pub(super) fn io_error(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |cause| Error::io(what.to_string(), cause)
}

impl Tree {
    /// Makes an empty index in `options.region` and commits it (but for
    /// one whose owner gives pages: there, the owner's first commit).
    pub fn create(device: Arc<Device>, options: IndexOptions) -> Result<Self> {
        let page = PAGE_BYTES as u64;
        let region = &options.region;
        if !region.start.is_multiple_of(page) || region.end < region.start + 2 * page {
            return Err(Error::invalid(format!(
                "an index region {region:?} must start on a page and hold two"
            )));
        }
        let alloc = match options.pages_given {
            true => PageAlloc::given(0, Vec::new())?,
            false => {
                if region.end < region.start + 3 * page {
                    return Err(Error::invalid(format!(
                        "an index region {region:?} must hold two root slots and a page"
                    )));
                }
                let pages = pages_region(region);
                PageAlloc::new(pages.clone(), pages.start, Vec::new())?
            }
        };
        let mut tree = Self::with(device, options, alloc, 1);
        tree.root = Child::Dirty(tree.add_dirty(Node::Leaf(Leaf::default())));
        // A slot that held an older index must not outrank the new one.
        let zero = AlignedBuf::zeroed(2 * PAGE_BYTES);
        tree.device.write(tree.options.region.start, &zero, false).map_err(io_error("index"))?;
        // An owner that gives pages gives them, then commits.
        if !tree.options.pages_given {
            tree.commit()?;
        }
        Ok(tree)
    }

    fn with(device: Arc<Device>, options: IndexOptions, alloc: PageAlloc, generation: u64) -> Self {
        let cache = PageCache::new(options.cache_bytes);
        Self {
            options,
            device,
            root: Child::Dirty(0),
            root_level: 0,
            entries: 0,
            generation,
            durable_generation: generation - 1,
            dirty: NumberMap::default(),
            dirty_bytes: 0,
            next_dirty_id: 1,
            frozen: Arc::default(),
            frozen_bytes: 0,
            frozen_copied: Vec::new(),
            written: Arc::default(),
            cache,
            used_pages: alloc.used_pages(),
            alloc: Some(alloc),
            freed: Vec::new(),
            free_list_pages: Vec::new(),
            stats: IndexStats::default(),
            read_buffer: AlignedBuf::zeroed(PAGE_BYTES),
            failed: false,
            attached: [0; ATTACHED_BYTES],
        }
    }

    /// Opens the index last committed in `options.region`: one root record
    /// and its free list are read, nothing else.
    pub fn open(device: Arc<Device>, options: IndexOptions) -> Result<Self> {
        let record = Self::read_root_record(&device, &options)?;
        let mut free = Vec::with_capacity(record.free_listed as usize);
        let mut list_pages = Vec::new();
        let mut next = record.free_list;
        let mut buffer = AlignedBuf::zeroed(PAGE_BYTES);
        while let Some(page) = next {
            if list_pages.len() as u64 >= record.free_list_pages {
                return Err(Error::Corrupt(format!(
                    "index {}: the free list runs past its {} pages",
                    options.owner, record.free_list_pages
                )));
            }
            device.read(page.address, &mut buffer).map_err(io_error("index free list"))?;
            let (addresses, link) = root::decode_free_list_page(&buffer, page, options.owner)?;
            free.extend(addresses);
            list_pages.push(page.address);
            next = link;
        }
        if free.len() as u64 != record.free_listed {
            return Err(Error::Corrupt(format!(
                "index {}: its free list holds {} pages, its root record says {}",
                options.owner,
                free.len(),
                record.free_listed
            )));
        }
        let alloc = match options.pages_given {
            true => PageAlloc::given(record.high_water / PAGE_BYTES as u64, free)?,
            false => PageAlloc::new(pages_region(&options.region), record.high_water, free)?,
        };
        let mut tree = Self::with(device, options, alloc, record.generation + 1);
        tree.attached = record.attached;
        tree.root = Child::OnDisk(record.root);
        tree.root_level = record.root_level;
        tree.entries = record.entries;
        tree.free_list_pages = list_pages;
        Ok(tree)
    }

    fn read_root_record(device: &Device, options: &IndexOptions) -> Result<RootRecord> {
        let mut buffer = AlignedBuf::zeroed(PAGE_BYTES);
        let mut reasons = Vec::new();
        let mut best: Option<RootRecord> = None;
        for offset in slot_offsets(&options.region) {
            device.read(offset, &mut buffer).map_err(io_error("index root record"))?;
            match RootRecord::decode(&buffer, options.owner) {
                Ok(record) if best.is_none_or(|best| best.generation < record.generation) => {
                    best = Some(record)
                }
                Ok(_) => {}
                Err(reason) => reasons.push(format!("slot at byte {offset}: {reason}")),
            }
        }
        best.ok_or_else(|| {
            Error::Corrupt(format!(
                "index {}: no root record ({})",
                options.owner,
                reasons.join("; ")
            ))
        })
    }

    /// The owner's bytes of the durable root record, or of the next commit
    /// once set.
    pub fn attached(&self) -> [u8; ATTACHED_BYTES] {
        self.attached
    }

    /// Sets the owner's bytes the next commit's root record carries.
    pub fn set_attached(&mut self, attached: [u8; ATTACHED_BYTES]) {
        self.attached = attached;
    }

    /// Pages the next commit may need beyond those it has free: one per
    /// changed node, and those holding the free list (which grows by the
    /// pages the changes freed).
    pub fn pages_wanted(&self) -> usize {
        let Some(alloc) = &self.alloc else { return 0 };
        let listed = alloc.free_pages() + self.freed.len() + self.free_list_pages.len();
        let needed = self.dirty.len() + listed.div_ceil(FREE_PER_PAGE) + 1;
        // Pages given join the free list too, and need list pages of their own.
        let needed = needed + needed.div_ceil(FREE_PER_PAGE);
        needed.saturating_sub(alloc.free_now())
    }

    /// Pages free now, for the next commit to take.
    pub fn free_pages_now(&self) -> usize {
        self.alloc.as_ref().map_or(0, |alloc| alloc.free_now())
    }

    /// The owner gives free pages (`IndexOptions::pages_given`).
    pub fn give_pages(&mut self, pages: &[u64]) -> Result<()> {
        match &mut self.alloc {
            Some(alloc) => {
                alloc.give(pages);
                Ok(())
            }
            None => Err(Error::invalid("pages given while a commit is written")),
        }
    }

    /// Every page the index holds: those its tree reaches, those holding
    /// its free list, and the free ones. For an owner that gave them
    /// (`IndexOptions::grow`) and accounts for them at open; nothing may
    /// be changed or in flight.
    pub fn held_pages(&mut self) -> Result<Vec<u64>> {
        if !self.dirty.is_empty() || self.alloc.is_none() {
            return Err(Error::invalid("the index's pages, asked with changes not committed"));
        }
        let mut pages = Vec::new();
        self.collect_pages(self.root, self.root_level, &mut pages)?;
        pages.extend_from_slice(&self.free_list_pages);
        pages.extend(self.alloc.as_ref().expect("checked").free_and_pending());
        pages.extend_from_slice(&self.freed);
        Ok(pages)
    }

    fn collect_pages(&mut self, child: Child, level: u8, pages: &mut Vec<u64>) -> Result<()> {
        if let Child::OnDisk(page) = self.resolve(child) {
            pages.push(page.address);
        }
        // Leaves hold no pointers: only branches are read to go on.
        if level == 0 {
            return Ok(());
        }
        let node = self.node(child, level)?;
        if let Node::Branch { children, .. } = &*node {
            for child in children {
                self.collect_pages(*child, level - 1, pages)?;
            }
        }
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    pub fn stats(&self) -> IndexStats {
        self.stats
    }

    /// Bytes of changed nodes waiting for a commit, or being written.
    pub fn dirty_bytes(&self) -> usize {
        self.dirty_bytes + self.frozen_bytes
    }

    /// Bytes of clean pages cached.
    pub fn cached_bytes(&self) -> usize {
        self.cache.held_bytes()
    }

    /// Whether a commit is between `seal` and `finish`.
    pub fn commit_in_flight(&self) -> bool {
        self.alloc.is_none()
    }

    /// Whether the changed nodes have grown past a quarter of the cache's
    /// budget, the point where the owner should commit.
    pub fn needs_commit(&self) -> bool {
        self.dirty_bytes > self.options.cache_bytes / 4
    }

    /// Whether changed nodes, written or not, have grown past half the
    /// cache's budget: a writer should wait for the commit being written.
    pub fn needs_throttle(&self) -> bool {
        self.dirty_bytes() > self.options.cache_bytes / 2
    }

    /// Pages the index holds on the device, nodes and free list.
    pub fn used_pages(&self) -> u64 {
        self.alloc.as_ref().map_or(self.used_pages, PageAlloc::used_pages)
    }

    /// The generation of the last commit: the one open found, or the last
    /// this handle made.
    pub fn committed_generation(&self) -> u64 {
        self.durable_generation
    }

    /// The tree's height: 1 for a lone leaf.
    pub fn height(&self) -> u8 {
        self.root_level + 1
    }

    pub(super) fn check_usable(&self) -> Result<()> {
        if self.failed {
            return Err(Error::io(
                format!("index {}", self.options.owner),
                std::io::Error::other("an earlier commit failed; reopen the index"),
            ));
        }
        Ok(())
    }

    fn add_dirty(&mut self, node: Node) -> u64 {
        let id = self.next_dirty_id;
        self.next_dirty_id += 1;
        self.dirty_bytes += DIRTY_NODE_BYTES;
        self.dirty.insert(id, Arc::new(node));
        id
    }

    fn take_dirty(&mut self, id: u64) -> Node {
        let node = self.dirty.remove(&id).expect("a dirty node its parent names");
        self.dirty_bytes -= DIRTY_NODE_BYTES;
        Arc::try_unwrap(node).unwrap_or_else(|shared| (*shared).clone())
    }

    /// The dirty node `id`, to read.
    fn dirty_node(&self, id: u64) -> &Node {
        self.dirty.get(&id).expect("a dirty node its parent names")
    }

    /// Runs `change` on the dirty node `id`.
    fn change<T>(&mut self, id: u64, change: impl FnOnce(&mut Node) -> T) -> T {
        let node = self.dirty.get_mut(&id).expect("a dirty node its parent names");
        // Unshared: only a seal shares this generation's nodes, and it
        // moves them out of `dirty`.
        change(Arc::make_mut(node))
    }

    /// A pointer by number to a node the last commit wrote, as a pointer to
    /// its page.
    pub(super) fn resolve(&self, child: Child) -> Child {
        match child {
            Child::Dirty(id) => self.written.get(&id).map_or(child, |page| Child::OnDisk(*page)),
            Child::OnDisk(_) => child,
        }
    }

    /// The node `child` points to, wherever it is.
    fn node(&mut self, child: Child, level: u8) -> Result<Arc<Node>> {
        match self.resolve(child) {
            Child::Dirty(id) => {
                let node = self.dirty.get(&id).or_else(|| self.frozen.get(&id));
                Ok(node.expect("a changed node its parent names").clone())
            }
            Child::OnDisk(page) => self.load(page, level),
        }
    }

    /// The node a page holds, from the cache or the device.
    fn load(&mut self, page: PageRef, level: u8) -> Result<Arc<Node>> {
        if let Some(node) = self.cache.get(page.address) {
            debug_assert_eq!(node.level(), level);
            self.stats.cache_hits += 1;
            return Ok(node);
        }
        let buffer = &mut self.read_buffer;
        self.device.read(page.address, buffer).map_err(io_error("index page"))?;
        self.stats.page_reads += 1;
        let expected = Expected { page, owner: self.options.owner, level: Some(level) };
        let node = Arc::new(page::decode(buffer, expected)?);
        self.cache.insert(page.address, node.clone());
        Ok(node)
    }

    /// `child` as a dirty node: copied from its page on first change since
    /// the last commit, the page then waiting to be freed.
    fn dirty_child(&mut self, child: Child, level: u8) -> Result<u64> {
        match self.resolve(child) {
            Child::Dirty(id) if self.dirty.contains_key(&id) => Ok(id),
            Child::Dirty(id) => {
                let mut copy = (**self.frozen.get(&id).expect("a frozen node")).clone();
                // Its pointers to what the last commit wrote become pages:
                // that commit's numbers are forgotten when this one ends.
                if let Node::Branch { children, .. } = &mut copy {
                    for child in children.iter_mut() {
                        *child = self.resolve(*child);
                    }
                }
                self.frozen_copied.push(id);
                Ok(self.add_dirty(copy))
            }
            Child::OnDisk(page) => {
                let node = self.load(page, level)?;
                self.cache.remove(page.address);
                self.freed.push(page.address);
                let node = Arc::try_unwrap(node).unwrap_or_else(|shared| (*shared).clone());
                Ok(self.add_dirty(node))
            }
        }
    }

    /// Applies `visit` to the nodes from the root down to the leaf that
    /// would hold `key`, without changing anything.
    fn descend<T>(&mut self, key: &[u8], mut visit: impl FnMut(&Node) -> Option<T>) -> Result<T> {
        let (mut child, mut level) = (self.root, self.root_level);
        loop {
            let node = self.node(child, level)?;
            if let Some(found) = visit(&node) {
                return Ok(found);
            }
            let Node::Branch { keys, children, .. } = &*node else {
                unreachable!("a visit stops at the leaf");
            };
            child = children[child_index(keys, key)];
            level -= 1;
        }
    }

    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_usable()?;
        self.descend(key, |node| match node {
            Node::Leaf(leaf) => Some(leaf.search(key).ok().map(|index| leaf.value(index).to_vec())),
            Node::Branch { .. } => None,
        })
    }

    /// Up to `limit` entries from `start` on, in key order. A listing goes
    /// on from the key after the last it returned, so a change between two
    /// calls never makes it skip or repeat an entry that stayed.
    pub fn scan(&mut self, start: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.check_usable()?;
        let mut found = Vec::new();
        let mut from = start.to_vec();
        while found.len() < limit {
            let mut bound: Option<Vec<u8>> = None;
            let leaf_entries = self.descend(&from, |node| match node {
                Node::Leaf(leaf) => Some(
                    leaf.iter()
                        .skip(leaf.search(&from).unwrap_or_else(|at| at))
                        .take(limit - found.len())
                        .map(|(key, value)| (key.to_vec(), value.to_vec()))
                        .collect::<Vec<_>>(),
                ),
                Node::Branch { keys, .. } => {
                    // The least upper bound on the path ends this leaf.
                    if let Some(next) = keys.get(child_index(keys, &from) + 1) {
                        bound = Some(next.clone());
                    }
                    None
                }
            })?;
            found.extend(leaf_entries);
            match bound {
                Some(next) => from = next,
                None => break,
            }
        }
        Ok(found)
    }

    /// Visits every entry in key order, reading each branch's leaves in
    /// runs of adjacent pages (a commit writes them so) instead of one page
    /// at a time; the leaves read stay out of the cache. What an open that
    /// loads everything wants.
    pub fn for_each(&mut self, mut visit: impl FnMut(&[u8], &[u8]) -> Result<()>) -> Result<()> {
        self.check_usable()?;
        let (root, level) = (self.root, self.root_level);
        self.visit_subtree(root, level, &mut visit)
    }

    fn visit_subtree(
        &mut self,
        child: Child,
        level: u8,
        visit: &mut impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<()> {
        let node = self.node(child, level)?;
        match &*node {
            Node::Leaf(leaf) => leaf.iter().try_for_each(|(key, value)| visit(key, value)),
            Node::Branch { children, .. } if level == 1 => {
                for leaf in self.read_leaves(children)? {
                    let Node::Leaf(leaf) = &*leaf else { unreachable!("level 0 is a leaf") };
                    leaf.iter().try_for_each(|(key, value)| visit(key, value))?;
                }
                Ok(())
            }
            Node::Branch { children, .. } => {
                children.iter().try_for_each(|child| self.visit_subtree(*child, level - 1, visit))
            }
        }
    }

    /// The leaves `children` point to, in their order: those in memory as
    /// they are, the rest read in runs of adjacent pages.
    fn read_leaves(&mut self, children: &[Child]) -> Result<Vec<Arc<Node>>> {
        const RUN_PAGES_MAX: usize = 64;
        let mut leaves: Vec<Option<Arc<Node>>> = vec![None; children.len()];
        let mut wanted: Vec<(PageRef, usize)> = Vec::new();
        for (index, child) in children.iter().enumerate() {
            match self.resolve(*child) {
                Child::OnDisk(page) if self.cache.get(page.address).is_none() => {
                    wanted.push((page, index));
                }
                resolved => leaves[index] = Some(self.node(resolved, 0)?),
            }
        }
        wanted.sort_unstable_by_key(|(page, _)| page.address);
        let addresses: Vec<u64> = wanted.iter().map(|(page, _)| page.address).collect();
        for run in page::adjacent_runs(&addresses, RUN_PAGES_MAX) {
            let (start, end) = (run.start, run.end);
            let mut buffer = AlignedBuf::zeroed((end - start) * PAGE_BYTES);
            self.device
                .read(wanted[start].0.address, &mut buffer)
                .map_err(io_error("index page"))?;
            self.stats.page_reads += (end - start) as u64;
            for ((page, index), bytes) in wanted[start..end].iter().zip(buffer.chunks(PAGE_BYTES)) {
                let expected = Expected { page: *page, owner: self.options.owner, level: Some(0) };
                leaves[*index] = Some(Arc::new(page::decode(bytes, expected)?));
            }
        }
        Ok(leaves.into_iter().map(|leaf| leaf.expect("every leaf found or read")).collect())
    }

    /// Sets `key` to `value`, returning the value it replaced.
    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_usable()?;
        if key.len() > KEY_BYTES_MAX || key.len() + value.len() > ENTRY_BYTES_MAX {
            return Err(Error::invalid(format!(
                "an index entry of a {}-byte key and a {}-byte value is over the limits \
                 ({KEY_BYTES_MAX}-byte keys, {ENTRY_BYTES_MAX} bytes in all)",
                key.len(),
                value.len()
            )));
        }
        let root = self.dirty_child(self.root, self.root_level)?;
        self.root = Child::Dirty(root);
        let (replaced, split) = self.insert_below(root, key, value, true)?;
        if let Some((separator, right)) = split {
            let level = self.root_level + 1;
            let keys = vec![Vec::new(), separator];
            let children = vec![Child::Dirty(root), Child::Dirty(right)];
            self.root = Child::Dirty(self.add_dirty(Node::Branch { level, keys, children }));
            self.root_level = level;
        }
        if replaced.is_none() {
            self.entries += 1;
        }
        Ok(replaced)
    }

    /// Inserts into the subtree of dirty node `id` (`rightmost`: the tree's
    /// right edge); returns the value replaced and, if the node split, its
    /// new right sibling.
    fn insert_below(
        &mut self,
        id: u64,
        key: &[u8],
        value: &[u8],
        rightmost: bool,
    ) -> Result<InsertResult> {
        let (index, child, level, last) = match self.dirty_node(id) {
            Node::Leaf(_) => {
                let (replaced, appended) = self.change(id, |node| {
                    let Node::Leaf(leaf) = node else { unreachable!() };
                    match leaf.search(key) {
                        Ok(at) => (Some(leaf.replace_value(at, value)), false),
                        Err(at) => {
                            leaf.insert(at, key, value);
                            (None, at + 1 == leaf.len())
                        }
                    }
                });
                return Ok((replaced, self.split_if_full(id, rightmost && appended)));
            }
            Node::Branch { level, keys, children } => {
                let index = child_index(keys, key);
                (index, children[index], *level, index + 1 == children.len())
            }
        };
        let child_id = self.dirty_child(child, level - 1)?;
        self.set_child(id, index, Child::Dirty(child_id));
        let (replaced, split) = self.insert_below(child_id, key, value, rightmost && last)?;
        let Some((separator, right)) = split else {
            return Ok((replaced, None)); // this branch is as it was
        };
        self.change(id, |node| {
            let Node::Branch { keys, children, .. } = node else { unreachable!() };
            keys.insert(index + 1, separator);
            children.insert(index + 1, Child::Dirty(right));
        });
        Ok((replaced, self.split_if_full(id, rightmost && last)))
    }

    fn set_child(&mut self, id: u64, index: usize, child: Child) {
        if let Node::Branch { children, .. } = self.dirty_node(id) {
            if children[index] == child {
                return; // the usual case: the child was changed already
            }
        }
        self.change(id, |node| {
            let Node::Branch { children, .. } = node else {
                unreachable!("a branch's child is set")
            };
            children[index] = child;
        });
    }

    /// Splits dirty node `id` in two by bytes if it no longer fits a page.
    /// A node that grew at the tree's right edge (`at_right_edge`: keys
    /// arriving in order, as inode numbers do) keeps all it had and gives
    /// the new sibling only its last entry, so pages filled in order stay
    /// full rather than half full.
    fn split_if_full(&mut self, id: u64, at_right_edge: bool) -> Option<(Vec<u8>, u64)> {
        if self.dirty_node(id).fits() {
            return None;
        }
        let right = self.change(id, |node| {
            let half = if at_right_edge { usize::MAX } else { node.encoded_bytes() / 2 };
            match node {
                Node::Leaf(entries) => {
                    let at = split_point(entries.entry_page_bytes(), half);
                    Node::Leaf(entries.split_off(at))
                }
                Node::Branch { level, keys, children } => {
                    let at = split_point(keys.iter().map(|key| 18 + key.len()), half);
                    let level = *level;
                    Node::Branch {
                        level,
                        keys: keys.split_off(at),
                        children: children.split_off(at),
                    }
                }
            }
        });
        debug_assert!(self.dirty_node(id).fits() && right.fits() && !right.is_empty());
        let separator = match &right {
            Node::Leaf(leaf) => leaf.key(0).to_vec(),
            Node::Branch { keys, .. } => keys[0].clone(),
        };
        Some((separator, self.add_dirty(right)))
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        // Looked up first, so that removing what is not there copies nothing.
        if self.get(key)?.is_none() {
            return Ok(None);
        }
        let root = self.dirty_child(self.root, self.root_level)?;
        self.root = Child::Dirty(root);
        let removed = self.remove_below(root, key)?;
        debug_assert!(removed.is_some(), "a key found was not removed");
        self.entries -= 1;
        self.shrink_root();
        Ok(removed)
    }

    fn remove_below(&mut self, id: u64, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let (index, child, level) = match self.dirty_node(id) {
            Node::Leaf(_) => {
                return Ok(self.change(id, |node| {
                    let Node::Leaf(entries) = node else { unreachable!() };
                    entries.search(key).ok().map(|at| entries.remove(at))
                }));
            }
            Node::Branch { level, keys, children } => {
                let index = child_index(keys, key);
                (index, children[index], *level)
            }
        };
        let child_id = self.dirty_child(child, level - 1)?;
        self.set_child(id, index, Child::Dirty(child_id));
        let removed = self.remove_below(child_id, key)?;
        self.rebalance(id, index, level)?;
        Ok(removed)
    }

    /// After a removal under child `index` of branch `id`: an emptied child
    /// goes, and a child under a quarter full is merged with a sibling when
    /// the two fit three quarters of a page (so the merge is not split again
    /// at once).
    fn rebalance(&mut self, id: u64, index: usize, level: u8) -> Result<()> {
        let Node::Branch { children, .. } = self.dirty_node(id) else { unreachable!() };
        let Child::Dirty(child_id) = children[index] else { unreachable!("the path is dirty") };
        let siblings = children.len();
        let child = self.dirty_node(child_id);
        if child.is_empty() {
            self.take_dirty(child_id);
            self.change(id, |node| {
                let Node::Branch { keys, children, .. } = node else { unreachable!() };
                children.remove(index);
                let lower_bound = keys.remove(index);
                if index == 0 && !keys.is_empty() {
                    keys[0] = lower_bound;
                }
            });
            return Ok(());
        }
        if siblings < 2 || child.encoded_bytes() > PAGE_BYTES / 4 {
            return Ok(());
        }
        let left = if index > 0 { index - 1 } else { index };
        let Node::Branch { children, .. } = self.dirty_node(id) else { unreachable!() };
        let (left_child, right_child) = (children[left], children[left + 1]);
        // Sized before either is copied, so a merge not made copies nothing.
        let merged_bytes = self.node_bytes(left_child, level - 1)?
            + self.node_bytes(right_child, level - 1)?
            - page::HEADER_BYTES;
        if merged_bytes > PAGE_BYTES * 3 / 4 {
            return Ok(());
        }
        let left_id = self.dirty_child(left_child, level - 1)?;
        self.set_child(id, left, Child::Dirty(left_id));
        let right_id = self.dirty_child(right_child, level - 1)?;
        self.set_child(id, left + 1, Child::Dirty(right_id));
        let right = self.take_dirty(right_id);
        let separator = self.change(id, |node| {
            let Node::Branch { keys, children, .. } = node else { unreachable!() };
            children.remove(left + 1);
            keys.remove(left + 1)
        });
        self.change(left_id, |node| match (node, right) {
            (Node::Leaf(entries), Node::Leaf(more)) => entries.append(more),
            (
                Node::Branch { keys, children, .. },
                Node::Branch { keys: mut more, children: theirs, .. },
            ) => {
                more[0] = separator;
                keys.extend(more);
                children.extend(theirs);
            }
            _ => unreachable!("siblings are on one level"),
        });
        Ok(())
    }

    /// The bytes `child`'s page takes or would take.
    fn node_bytes(&mut self, child: Child, level: u8) -> Result<usize> {
        Ok(self.node(child, level)?.encoded_bytes())
    }

    /// A root branch left with one child gives way to it; one left with
    /// none, to an empty leaf.
    fn shrink_root(&mut self) {
        while let Child::Dirty(id) = self.root {
            if !self.dirty.contains_key(&id) {
                return; // not changed since the last seal: left as it is
            }
            let Node::Branch { children, .. } = self.dirty_node(id) else { return };
            match children.len() {
                0 => {
                    self.take_dirty(id);
                    self.root = Child::Dirty(self.add_dirty(Node::Leaf(Leaf::default())));
                    self.root_level = 0;
                }
                1 => {
                    let only = children[0];
                    self.take_dirty(id);
                    self.root = only;
                    self.root_level -= 1;
                }
                _ => return,
            }
        }
    }

    /// Every key in order, checking each page on the way: for tests and
    /// fsck.
    pub fn check(&mut self) -> Result<u64> {
        // In chunks, so that memory stays bounded however many entries.
        const CHUNK_ENTRIES: usize = 4096;
        let (mut counted, mut from) = (0u64, Vec::new());
        loop {
            let chunk = self.scan(&from, CHUNK_ENTRIES)?;
            let Some((last, _)) = chunk.last() else { break };
            debug_assert!(chunk.windows(2).all(|pair| pair[0].0 < pair[1].0));
            counted += chunk.len() as u64;
            from = last.clone();
            from.push(0); // the least key after it
            if chunk.len() < CHUNK_ENTRIES {
                break;
            }
        }
        if counted != self.entries {
            return Err(Error::Corrupt(format!(
                "index {} holds {counted} entries, its root record says {}",
                self.options.owner, self.entries
            )));
        }
        // With nothing changed or in flight, every page in use is reached
        // once: a page leaked or reached twice shows here.
        if self.dirty.is_empty() && self.frozen.is_empty() && self.alloc.is_some() {
            let reached =
                self.count_pages(self.root, self.root_level)? + self.free_list_pages.len() as u64;
            if reached != self.used_pages() {
                return Err(Error::Corrupt(format!(
                    "index {}: {reached} pages reached, its free list leaves {} in use",
                    self.options.owner,
                    self.used_pages()
                )));
            }
        }
        Ok(self.entries)
    }

    fn count_pages(&mut self, child: Child, level: u8) -> Result<u64> {
        let node = self.node(child, level)?;
        let mut pages = 1;
        if let Node::Branch { children, .. } = &*node {
            for child in children {
                pages += self.count_pages(*child, level - 1)?;
            }
        }
        Ok(pages)
    }
}

type InsertResult = (Option<Vec<u8>>, Option<(Vec<u8>, u64)>);

/// The child of a branch whose range holds `key`: `keys[0]` is the
/// branch's lower bound and never compared.
fn child_index(keys: &[Vec<u8>], key: &[u8]) -> usize {
    keys[1..].partition_point(|separator| separator.as_slice() <= key)
}

/// The first index at which the entries before hold at least `half` bytes,
/// kept inside 1..len so both halves hold something.
fn split_point(sizes: impl ExactSizeIterator<Item = usize>, half: usize) -> usize {
    let count = sizes.len();
    let mut bytes = page::HEADER_BYTES;
    for (index, size) in sizes.enumerate() {
        if bytes >= half {
            return index.clamp(1, count - 1);
        }
        bytes += size;
    }
    count - 1
}
