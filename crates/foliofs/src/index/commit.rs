//! A commit in three steps, so that writers go on while its pages are
//! written: `Tree::seal` (short, under the owner's lock) freezes this
//! generation's changed nodes and hands them over with the allocator;
//! `SealedCommit::write` (long, outside the lock) places and writes them,
//! the free list and the root record; `Tree::finish` (short, under the
//! lock) takes the result back.
//!
//! Between seal and finish a change copies the frozen nodes it meets into
//! the next generation, as it copies pages, and the frozen ones are written
//! as they were at the seal. Pointers by number to frozen nodes are kept in
//! `Tree::written` after the finish, until the next commit has written
//! every node that holds one.

use std::sync::Arc;
use std::time::Instant;

use super::alloc::PageAlloc;
use super::page::{self, Child, Node, PageRef, PAGE_BYTES};
use super::root::{self, RootRecord, ATTACHED_BYTES, FREE_LIST_BIT, FREE_PER_PAGE};
use super::tree::{io_error, slot_offsets, CommitReport, Tree};
use super::NumberMap;
use crate::dev::{AlignedBuf, Device};
use crate::error::{Error, Result};

/// A generation frozen for writing, owning what writing it needs.
pub struct SealedCommit {
    device: Arc<Device>,
    owner: u32,
    slot_offsets: [u64; 2],
    generation: u64,
    root: Child,
    root_level: u8,
    entries: u64,
    frozen: Arc<NumberMap<Arc<Node>>>,
    /// The commit before's placements, for frozen pointers to its nodes.
    earlier: Arc<NumberMap<PageRef>>,
    alloc: PageAlloc,
    attached: [u8; ATTACHED_BYTES],
    started: Instant,
}

/// A written commit, for `Tree::finish`.
pub struct WrittenCommit {
    generation: u64,
    root: PageRef,
    placed: NumberMap<PageRef>,
    /// The nodes written, pointers resolved, for the cache.
    clean: Vec<(PageRef, Arc<Node>)>,
    list_pages: Vec<u64>,
    alloc: PageAlloc,
    report: CommitReport,
}

impl Tree {
    /// Freezes what changed since the last seal. One commit at a time: a
    /// seal before the last one's `finish` is refused.
    pub fn seal(&mut self) -> Result<SealedCommit> {
        self.check_usable()?;
        let Some(mut alloc) = self.alloc.take() else {
            return Err(Error::invalid("an index commit is already being written"));
        };
        for address in self.freed.drain(..).chain(self.free_list_pages.drain(..)) {
            alloc.free_after_commit(address);
        }
        debug_assert!(self.frozen.is_empty() && self.frozen_copied.is_empty());
        self.frozen = Arc::new(std::mem::take(&mut self.dirty));
        self.frozen_bytes = std::mem::take(&mut self.dirty_bytes);
        self.used_pages = alloc.used_pages();
        let sealed = SealedCommit {
            device: self.device.clone(),
            owner: self.options.owner,
            slot_offsets: slot_offsets(&self.options.region),
            generation: self.generation,
            root: self.root,
            root_level: self.root_level,
            entries: self.entries,
            frozen: self.frozen.clone(),
            earlier: self.written.clone(),
            alloc,
            attached: self.attached,
            started: Instant::now(),
        };
        self.generation += 1;
        Ok(sealed)
    }

    /// Takes back a written commit: its pages join the cache, and what the
    /// durable root no longer reaches waits for the next.
    pub fn finish(&mut self, written: Result<WrittenCommit>) -> Result<CommitReport> {
        let written = written.inspect_err(|_| self.failed = true)?;
        debug_assert_eq!(written.generation + 1, self.generation);
        self.written = Arc::new(written.placed);
        for (page, node) in written.clean {
            self.cache.insert(page.address, node);
        }
        for id in std::mem::take(&mut self.frozen_copied) {
            let page = self.written[&id];
            self.cache.remove(page.address);
            self.freed.push(page.address);
        }
        self.frozen = Arc::default();
        self.frozen_bytes = 0;
        self.root = self.resolve(self.root);
        debug_assert!(
            self.dirty.contains_key(&written_root_id(self.root))
                || self.root == Child::OnDisk(written.root),
            "the root is neither changed since the seal nor the one written"
        );
        self.free_list_pages = written.list_pages;
        self.used_pages = written.alloc.used_pages();
        self.alloc = Some(written.alloc);
        self.durable_generation = written.generation;
        let report = written.report;
        self.stats.commits += 1;
        self.stats.pages_written += report.pages_written;
        self.stats.bytes_written += report.bytes_written;
        Ok(report)
    }

    /// Writes what changed since the last commit, then the new root record:
    /// durable when this returns. The pages the last root reached and the
    /// new one does not are free from then on.
    pub fn commit(&mut self) -> Result<CommitReport> {
        let sealed = self.seal()?;
        let written = sealed.write();
        self.finish(written)
    }
}

impl SealedCommit {
    /// Places the frozen nodes children first on pages free in the durable
    /// root, writes them and the free list, flushes, then writes the root
    /// record with FUA.
    pub fn write(mut self) -> Result<WrittenCommit> {
        let (mut placed, mut clean) = (NumberMap::default(), Vec::new());
        let root = self.place(self.root, &mut placed, &mut clean)?;
        // The list's own pages come from pages free now, so the list shrinks
        // as they are taken.
        let mut list_pages = Vec::new();
        while self.alloc.list_for_root().len() > list_pages.len() * FREE_PER_PAGE {
            list_pages
                .push(PageRef { address: self.alloc.allocate()?, generation: self.generation });
        }
        let free = self.alloc.list_for_root();
        let list_nodes = root::free_list_nodes(&free, &list_pages);
        let list_owner = self.owner | FREE_LIST_BIT;
        let mut pages: Vec<(PageRef, &Node, u32)> =
            clean.iter().map(|(page, node)| (*page, &**node, self.owner)).collect();
        pages.extend(
            list_pages.iter().zip(&list_nodes).map(|(page, node)| (*page, node, list_owner)),
        );
        let bytes = write_pages(&self.device, &mut pages)?;
        let pages_written = pages.len() as u64 + 1;
        self.device.flush().map_err(io_error("index commit"))?;
        let record = RootRecord {
            generation: self.generation,
            owner: self.owner,
            root_level: self.root_level,
            root,
            entries: self.entries,
            high_water: self.alloc.high_water(),
            free_list: list_pages.first().copied(),
            free_listed: free.len() as u64,
            free_list_pages: list_pages.len() as u64,
            attached: self.attached,
        };
        let mut slot = AlignedBuf::zeroed(PAGE_BYTES);
        record.encode(&mut slot);
        let slot_offset = self.slot_offsets[(self.generation % 2) as usize];
        self.device.write(slot_offset, &slot, true).map_err(io_error("index root record"))?;
        self.alloc.root_durable();
        let report = CommitReport {
            generation: self.generation,
            pages_written,
            bytes_written: bytes + PAGE_BYTES as u64,
            duration_ns: self.started.elapsed().as_nanos() as u64,
        };
        Ok(WrittenCommit {
            generation: self.generation,
            root,
            placed,
            clean,
            list_pages: list_pages.iter().map(|page| page.address).collect(),
            alloc: self.alloc,
            report,
        })
    }

    /// Places frozen node `child` and its frozen descendants on pages,
    /// children first.
    fn place(
        &mut self,
        child: Child,
        placed: &mut NumberMap<PageRef>,
        clean: &mut Vec<(PageRef, Arc<Node>)>,
    ) -> Result<PageRef> {
        let id = match child {
            Child::OnDisk(page) => return Ok(page),
            Child::Dirty(id) => id,
        };
        if let Some(page) = self.earlier.get(&id) {
            return Ok(*page);
        }
        let frozen = self.frozen.get(&id).expect("a frozen node its parent names").clone();
        let node = match &*frozen {
            Node::Leaf(_) => frozen,
            Node::Branch { level, keys, children } => {
                let mut resolved = Vec::with_capacity(children.len());
                for child in children {
                    resolved.push(Child::OnDisk(self.place(*child, placed, clean)?));
                }
                Arc::new(Node::Branch { level: *level, keys: keys.clone(), children: resolved })
            }
        };
        let page = PageRef { address: self.alloc.allocate()?, generation: self.generation };
        placed.insert(id, page);
        clean.push((page, node));
        Ok(page)
    }
}

/// The number of a root changed since the seal (0 for one on disk, which
/// no node has).
fn written_root_id(root: Child) -> u64 {
    match root {
        Child::Dirty(id) => id,
        Child::OnDisk(_) => 0,
    }
}

/// Encodes `pages` in address order into one buffer (one allocation, not
/// one per page) and writes it, one request per run of adjacent pages;
/// returns the bytes written.
fn write_pages(device: &Device, pages: &mut [(PageRef, &Node, u32)]) -> Result<u64> {
    const RUN_PAGES_MAX: usize = 256;
    pages.sort_unstable_by_key(|(page, ..)| page.address);
    let mut buffer = AlignedBuf::zeroed(pages.len() * PAGE_BYTES);
    for (slot, (page, node, owner)) in buffer.chunks_mut(PAGE_BYTES).zip(pages.iter()) {
        page::encode(node, *page, *owner, slot);
    }
    let addresses: Vec<u64> = pages.iter().map(|(page, ..)| page.address).collect();
    for run in page::adjacent_runs(&addresses, RUN_PAGES_MAX) {
        let bytes = &buffer[run.start * PAGE_BYTES..run.end * PAGE_BYTES];
        device.write(addresses[run.start], bytes, false).map_err(io_error("index pages"))?;
    }
    Ok((pages.len() * PAGE_BYTES) as u64)
}
