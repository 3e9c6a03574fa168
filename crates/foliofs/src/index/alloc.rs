//! Where an index's pages go: a region of the device, pages reused from a
//! free list first, then taken from the region's never-used end.
//!
//! Copy-on-write decides when a page may be reused. A page the last durable
//! root reaches is never overwritten: when the tree copies it to change it,
//! the old address waits in `freed_pending` until the next root is durable.
//! Only pages free in the durable root (`free`, and everything past
//! `high_water`) are handed out, so a crash at any point leaves the durable
//! tree whole.
//!
//! An index inside a volume has no region of its own: its owner gives it
//! pages before each commit (`Tree::give_pages`, from the volume's free
//! space), and the count of pages given stands where the high-water mark
//! would.

use std::ops::Range;

use super::page::PAGE_BYTES;
use crate::error::{Error, Result};

pub struct PageAlloc {
    /// Pages are given by the owner (`give`) instead of taken from a region.
    given: bool,
    region: Range<u64>,
    /// The first address never handed out.
    high_water: u64,
    /// Free in the durable root, reusable now; kept in descending order so
    /// that pops come out ascending and a commit's pages form runs.
    free: Vec<u64>,
    /// Reached by the durable root but no longer by the tree in memory:
    /// free once the next root is durable.
    freed_pending: Vec<u64>,
}

impl PageAlloc {
    pub fn new(region: Range<u64>, high_water: u64, mut free: Vec<u64>) -> Result<Self> {
        let page = PAGE_BYTES as u64;
        let aligned = |address: u64| address.is_multiple_of(page);
        let inside = |address: u64| region.contains(&address) && address < high_water;
        if !aligned(region.start) || !(region.start..=region.end).contains(&high_water) {
            return Err(Error::Corrupt(format!(
                "index region {region:?} with its high-water mark at {high_water}"
            )));
        }
        if let Some(bad) = free.iter().find(|&&address| !aligned(address) || !inside(address)) {
            return Err(Error::Corrupt(format!(
                "the index's free list names byte {bad}, outside its region {region:?} or \
                 past its high-water mark {high_water}"
            )));
        }
        free.sort_unstable_by(|a, b| b.cmp(a));
        free.dedup();
        Ok(Self { given: false, region, high_water, free, freed_pending: Vec::new() })
    }

    /// Pages its owner gives: `given` pages were given before, `free` of
    /// them are free in the durable root.
    pub fn given(given: u64, mut free: Vec<u64>) -> Result<Self> {
        let page = PAGE_BYTES as u64;
        free.sort_unstable_by(|a, b| b.cmp(a));
        free.dedup();
        if let Some(bad) = free.iter().find(|&&address| !address.is_multiple_of(page)) {
            return Err(Error::Corrupt(format!("the index's free list names byte {bad}")));
        }
        if free.len() as u64 > given {
            return Err(Error::Corrupt(format!(
                "the index's free list holds {} pages of the {given} it was given",
                free.len()
            )));
        }
        let region = 0..given * page;
        Ok(Self { given: true, region, high_water: given * page, free, freed_pending: Vec::new() })
    }

    pub fn allocate(&mut self) -> Result<u64> {
        if let Some(address) = self.free.pop() {
            return Ok(address);
        }
        if self.given {
            return Err(Error::NoSpace(format!(
                "the index ran out of the {} pages it was given",
                self.high_water / PAGE_BYTES as u64
            )));
        }
        let page = PAGE_BYTES as u64;
        if self.high_water + page > self.region.end {
            return Err(Error::NoSpace(format!(
                "the index's region of {} bytes is full",
                self.region.end - self.region.start
            )));
        }
        self.high_water += page;
        Ok(self.high_water - page)
    }

    /// `address`, reached by the durable root, is no longer reached by the
    /// tree in memory.
    pub fn free_after_commit(&mut self, address: u64) {
        self.freed_pending.push(address);
    }

    /// The free list the next root records: pages free now, and those the
    /// new root no longer reaches. The pages that will hold this list are
    /// taken first (`take_for_list`), from pages free now.
    pub fn list_for_root(&self) -> Vec<u64> {
        let mut list = self.free.clone();
        list.extend_from_slice(&self.freed_pending);
        list
    }

    /// Once the new root is durable, what waited is free.
    pub fn root_durable(&mut self) {
        self.free.append(&mut self.freed_pending);
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    pub fn high_water(&self) -> u64 {
        self.high_water
    }

    pub fn free_pages(&self) -> usize {
        self.free.len() + self.freed_pending.len()
    }

    /// The owner gives `pages` (free, page-aligned byte addresses).
    pub fn give(&mut self, pages: &[u64]) {
        assert!(self.given, "pages given to an index with a region of its own");
        debug_assert!(pages.iter().all(|page| page.is_multiple_of(PAGE_BYTES as u64)));
        // The count, not the addresses, stands for the high-water mark.
        self.high_water += pages.len() as u64 * PAGE_BYTES as u64;
        self.region.end = self.high_water;
        self.free.extend_from_slice(pages);
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Pages free now (taken first by a commit).
    pub fn free_now(&self) -> usize {
        self.free.len()
    }

    /// The pages free now and waiting, for the owner's accounting.
    pub fn free_and_pending(&self) -> impl Iterator<Item = u64> + '_ {
        self.free.iter().chain(&self.freed_pending).copied()
    }

    /// Pages in use: handed out and not free.
    pub fn used_pages(&self) -> u64 {
        (self.high_water - self.region.start) / PAGE_BYTES as u64 - self.free_pages() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = PAGE_BYTES as u64;

    #[test]
    fn pages_freed_are_reused_only_after_the_root_is_durable() {
        let mut alloc = PageAlloc::new(0..4 * PAGE, 0, vec![]).unwrap();
        let (a, b) = (alloc.allocate().unwrap(), alloc.allocate().unwrap());
        assert_eq!((a, b), (0, PAGE));
        alloc.free_after_commit(a);
        assert_eq!(alloc.allocate().unwrap(), 2 * PAGE, "a page the durable root reaches");
        assert_eq!(alloc.list_for_root(), vec![a]);
        alloc.root_durable();
        assert_eq!(alloc.allocate().unwrap(), a);
        assert_eq!(alloc.allocate().unwrap(), 3 * PAGE);
        assert!(matches!(alloc.allocate(), Err(Error::NoSpace(_))));
    }

    #[test]
    fn a_free_list_outside_the_region_is_corruption() {
        assert!(PageAlloc::new(0..4 * PAGE, 2 * PAGE, vec![3 * PAGE]).is_err());
        assert!(PageAlloc::new(0..4 * PAGE, 2 * PAGE, vec![7]).is_err());
        assert!(PageAlloc::new(0..4 * PAGE, 5 * PAGE, vec![]).is_err());
        let alloc = PageAlloc::new(0..4 * PAGE, 2 * PAGE, vec![0, PAGE, 0]).unwrap();
        assert_eq!((alloc.free_pages(), alloc.used_pages()), (2, 0));
    }
}
