//! The inodes, split into shards by inode number, each shard under its own
//! lock: operations on unrelated inodes take different locks and do not
//! wait on each other (the kernel's per-inode locks, at the granularity of
//! a hash bucket).
//!
//! Rules (ARCHITECTURE.md, "Locks"):
//! - a thread takes shard locks in ascending shard index and never one it
//!   holds; a transaction names its inodes first and takes their shards in
//!   that order ([`MetaState::lock`]), so two transactions never deadlock;
//! - a reader holds one shard at a time ([`super::MetaStore::inode`]), or a
//!   named set taken in the same order ([`MetaView`]);
//! - every change of an inode happens under its shard's write lock, and
//!   bumps the inode's view generation (`Inode::note_changed`).
//!
//! [`MetaState`] is the write-locked side, the one through which records
//! apply (`state.rs`); [`MetaView`] the read-locked one. Both answer
//! [`InodeTable::inode`] for their shards only: asking for an inode of
//! another shard is a bug, which abandons a transaction (EIO, in every
//! build: [`UndeclaredShard`]) and panics a view, where it happens.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::format::{Record, Region};
use crate::lock_order::{Contention, Level, Ordered};

use super::checkpoint::ShardPart;
use super::indexed::{changed_inode, changes_at_cut, Changed, IndexChange};
use super::inode::Inode;

/// log2 of the number of shards.
pub const SHARD_BITS: u32 = 12;
/// Shards of the inode table, half for directories and half for the rest
/// ([`shard_of`]): enough that threads working on unrelated files rarely
/// meet on one (each transaction takes one to four). Two jobs creating
/// files in their own directories on 2 CPUs met once in about 400 creates
/// with 256 shards, and a meeting costs the waiter half a millisecond where
/// the holder was preempted; 16 jobs on 16 CPUs would meet 15 times as
/// often. A shard costs 128 bytes while empty.
pub const SHARD_COUNT: usize = 1 << SHARD_BITS;

/// Directories take the inode numbers that are multiples of this
/// ([`super::MetaStore::take_ino`]), so that they live in shards of their
/// own ([`shard_of`]).
pub const DIRECTORY_INO_STRIDE: u64 = 8;

/// One shard at a checkpoint's cut: all its records (checkpoint slots,
/// format 2) or what changed since the last cut (a metadata index, 3).
#[derive(Debug, Clone)]
pub enum CutPart {
    Records(ShardPart),
    Changes(Vec<IndexChange>),
}

/// No shard encoded yet: what a checkpoint starts from.
pub fn no_parts() -> Vec<Option<CutPart>> {
    vec![None; SHARD_COUNT]
}

/// The shard that holds inode `ino`: directories (numbered in multiples of
/// [`DIRECTORY_INO_STRIDE`]) in the lower half, the rest in
/// the upper, each by Fibonacci hashing, so that the consecutive numbers of
/// one thread's batch spread over every shard of their half.
///
/// Why halves: every create in a directory takes the directory's shard, so
/// a directory's shard is busy; with one table for all, the files of one
/// job landed in the shard of another job's directory one create in 256
/// and waited for it, milliseconds at a time on 2 CPUs (a holder preempted).
/// A directory now shares its shard only with directories. An image made
/// before this rule works the same, only without the separation.
pub fn shard_of(ino: u64) -> usize {
    let half = SHARD_COUNT / 2;
    let hashed = (ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - (SHARD_BITS - 1))) as usize;
    if ino.is_multiple_of(DIRECTORY_INO_STRIDE) {
        hashed
    } else {
        half + hashed
    }
}

/// A set of shards: every one, or a few, sorted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardSet {
    All,
    Some(SmallVec<[u16; 6]>),
}

impl ShardSet {
    /// The shards of `inos`.
    pub fn of(inos: &[u64]) -> Self {
        let mut shards: SmallVec<[u16; 6]> = inos.iter().map(|&ino| shard_of(ino) as u16).collect();
        shards.sort_unstable();
        shards.dedup();
        Self::Some(shards)
    }

    pub fn is_all(&self) -> bool {
        matches!(self, Self::All)
    }

    pub fn len(&self) -> usize {
        match self {
            Self::All => SHARD_COUNT,
            Self::Some(shards) => shards.len(),
        }
    }

    /// The shards, in ascending index: the order they are locked in.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let (all, some) = match self {
            Self::All => (Some(0..SHARD_COUNT), None),
            Self::Some(shards) => (None, Some(shards.iter().map(|&shard| usize::from(shard)))),
        };
        all.into_iter().flatten().chain(some.into_iter().flatten())
    }
}

/// What one shard's lock guards.
#[derive(Default)]
pub struct ShardInodes {
    /// By inode number, hashed with FxHash: looked up on every operation,
    /// and the numbers are ours, not an attacker's.
    pub(super) inodes: FxHashMap<u64, Inode>,
    /// What changed since the last cut, where the checkpoint keeps only
    /// that (`super::indexed`). Written under the shard's write lock (no
    /// wait: `get_mut`), taken at the cut under its read lock.
    pub(super) changed: Mutex<Changed>,
    /// Inodes freed before the cut of the checkpoint being written: the
    /// index holds them until it commits, and they must not be read back
    /// from it meanwhile (`meta/on_demand.rs`). Cleared after the commit.
    pub(super) freed_in_cut: Mutex<Vec<u64>>,
}

/// One shard, on cache lines of its own: a shard's lock word is written by
/// every thread that takes it, and must not share its line with another's.
#[repr(align(128))]
#[derive(Default)]
pub struct Shard {
    pub(super) lock: RwLock<ShardInodes>,
    /// The checkpoint being written still needs this shard as it was at
    /// its cut: whoever takes the shard's lock next encodes it first
    /// (`super::checkpoint`).
    pub(super) checkpoint_owed: AtomicBool,
}

/// The inode table and what every transaction shares.
pub struct MetaCore {
    pub(super) shards: Box<[Shard]>,
    pub(super) data_region: Region,
    /// The first inode number never handed out (`MetaStore::take_ino`).
    pub(super) next_ino: AtomicU64,
    /// Upper bound of the checkpoint payload the state encodes to; each
    /// transaction adds its change once, at its end.
    pub(super) persisted_bytes_estimate: AtomicI64,
    /// Inodes in the table, kept as the estimate is.
    pub(super) inode_count: AtomicI64,
    /// Inodes that exist but are not in memory (format 3): counted at
    /// open, less each read from the index, plus each evicted.
    pub(super) not_resident: AtomicI64,
    /// The shards a checkpoint in progress has encoded so far.
    pub(super) checkpoint_parts: Mutex<Vec<Option<CutPart>>>,
    /// Checkpoints go to a metadata index: shards note what changes.
    pub(super) indexed: bool,
    /// Waits for shard locks, every shard together.
    pub(super) contention: Contention,
}

impl MetaCore {
    pub(super) fn new(data_region: Region, next_ino: u64, indexed: bool) -> Self {
        Self {
            shards: (0..SHARD_COUNT).map(|_| Shard::default()).collect(),
            data_region,
            next_ino: AtomicU64::new(next_ino),
            persisted_bytes_estimate: AtomicI64::new(0),
            inode_count: AtomicI64::new(0),
            not_resident: AtomicI64::new(0),
            checkpoint_parts: Mutex::new(no_parts()),
            indexed,
            contention: Contention::default(),
        }
    }

    pub(super) fn shard(&self, index: usize) -> &Shard {
        &self.shards[index]
    }

    /// Encodes `shard` for the checkpoint in progress if it still owes it.
    /// The caller holds the shard's lock (read or write), so nothing
    /// changes it meanwhile, and the flag's swap lets only one encode it.
    pub(super) fn pay_checkpoint(&self, index: usize, inodes: &ShardInodes) {
        let shard = self.shard(index);
        if shard.checkpoint_owed.load(Ordering::Acquire)
            && shard.checkpoint_owed.swap(false, Ordering::AcqRel)
        {
            let part = if self.indexed {
                let changed = std::mem::take(&mut *inodes.changed.lock());
                let changes = changes_at_cut(&inodes.inodes, changed);
                let freed = changes.iter().filter_map(|change| match change {
                    IndexChange::Inode { ino, records: None, .. } => Some(*ino),
                    _ => None,
                });
                inodes.freed_in_cut.lock().extend(freed);
                CutPart::Changes(changes)
            } else {
                CutPart::Records(ShardPart::encode(&inodes.inodes))
            };
            self.checkpoint_parts.lock()[index] = Some(part);
        }
    }

    pub(super) fn read_shard(&self, index: usize) -> Ordered<RwLockReadGuard<'_, ShardInodes>> {
        let lock = &self.shard(index).lock;
        Ordered::lock_at(Level::Metadata, index, || {
            self.contention.lock(|| lock.try_read(), || lock.read())
        })
    }

    pub(super) fn write_shard(&self, index: usize) -> Ordered<RwLockWriteGuard<'_, ShardInodes>> {
        let lock = &self.shard(index).lock;
        let guard = Ordered::lock_at(Level::Metadata, index, || {
            self.contention.lock(|| lock.try_write(), || lock.write())
        });
        self.pay_checkpoint(index, &guard);
        guard
    }

    pub fn persisted_bytes_estimate(&self) -> u64 {
        self.persisted_bytes_estimate.load(Ordering::Relaxed).max(0) as u64
    }

    /// Counts what open read without applying records (`super::load`),
    /// of which `kept` inodes it keeps in memory.
    pub(super) fn add_loaded(&self, inode_count: u64, kept: u64, estimate_bytes: u64) {
        self.inode_count.fetch_add(inode_count as i64, Ordering::Relaxed);
        self.not_resident.fetch_add(inode_count as i64 - kept as i64, Ordering::Relaxed);
        self.persisted_bytes_estimate.fetch_add(estimate_bytes as i64, Ordering::Relaxed);
    }

    pub fn inode_count(&self) -> u64 {
        self.inode_count.load(Ordering::Relaxed).max(0) as u64
    }

    /// Inodes in memory, as the counts have it (no lock taken).
    pub fn resident_count(&self) -> u64 {
        let not_resident = self.not_resident.load(Ordering::Relaxed);
        (self.inode_count.load(Ordering::Relaxed) - not_resident).max(0) as u64
    }
}

/// Inodes looked up by number in whatever a holder has locked.
pub trait InodeTable {
    fn inode(&self, ino: u64) -> Option<&Inode>;
}

type WriteGuard<'a> = Ordered<RwLockWriteGuard<'a, ShardInodes>>;
type ReadGuard<'a> = Ordered<RwLockReadGuard<'a, ShardInodes>>;

/// A transaction reached an inode whose shard it did not name. Taking that
/// shard could break the ascending order (a thread holding it may be
/// waiting for one this transaction holds, and neither would move), so it
/// is never taken, in any build: the access unwinds with this payload to
/// [`super::MetaStore::transact`], which abandons the transaction with EIO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct UndeclaredShard {
    pub ino: u64,
    pub shard: usize,
}

/// Runs `body`, turning an unwind from [`UndeclaredShard`] into an error
/// value; any other panic goes on unwinding.
pub(super) fn catch_undeclared<T>(body: impl FnOnce() -> T) -> Result<T, UndeclaredShard> {
    // AssertUnwindSafe: what `body` changed before the unwind is the
    // caller's to judge (`MetaStore::transact` shuts the volume down when
    // records were applied), and no lock is left held: the guards drop.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).map_err(|payload| {
        match payload.downcast::<UndeclaredShard>() {
            Ok(undeclared) => *undeclared,
            Err(other) => std::panic::resume_unwind(other),
        }
    })
}

/// Write guards of the shards a transaction (or mount's replay) changes:
/// one per named shard, in ascending shard order (with every shard named,
/// index = shard). Nothing else is ever locked through it.
pub struct LockedShards<'a> {
    guards: SmallVec<[WriteGuard<'a>; 6]>,
    declared: ShardSet,
}

impl<'a> LockedShards<'a> {
    /// Write-locks the shards of `set`, in ascending index.
    fn lock(core: &'a MetaCore, set: ShardSet) -> Self {
        let guards: SmallVec<[WriteGuard<'a>; 6]> =
            set.iter().map(|shard| core.write_shard(shard)).collect();
        assert_eq!(guards.len(), set.len(), "one guard per named shard");
        Self { guards, declared: set }
    }

    /// The index of `shard`'s guard, if the transaction named it.
    fn slot_of(&self, shard: usize) -> Option<usize> {
        debug_assert!(shard < SHARD_COUNT);
        match &self.declared {
            ShardSet::All => Some(shard),
            ShardSet::Some(shards) => shards.iter().position(|&named| usize::from(named) == shard),
        }
    }

    /// The slot of the shard holding `ino`; unwinds with [`UndeclaredShard`]
    /// when the transaction did not name it.
    fn slot_for(&self, ino: u64) -> usize {
        let shard = shard_of(ino);
        match self.slot_of(shard) {
            Some(slot) => slot,
            None => std::panic::resume_unwind(Box::new(UndeclaredShard { ino, shard })),
        }
    }

    /// The inodes of the shard holding `ino`, for a change.
    pub(super) fn shard_mut(&mut self, ino: u64) -> &mut ShardInodes {
        let slot = self.slot_for(ino);
        &mut self.guards[slot]
    }

    pub fn inode(&self, ino: u64) -> Option<&Inode> {
        self.guards[self.slot_for(ino)].inodes.get(&ino)
    }

    /// Inode `ino` for a change: counts as one for the handles' copies.
    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Inode> {
        let inode = self.shard_mut(ino).inodes.get_mut(&ino)?;
        inode.note_changed();
        Some(inode)
    }

    /// The guards, when every shard is locked.
    fn all(&self) -> impl Iterator<Item = &ShardInodes> + use<'_, 'a> {
        assert!(self.declared.is_all(), "listing inodes needs every shard");
        self.guards.iter().map(|guard| &**guard)
    }

    fn all_mut(&mut self) -> impl Iterator<Item = &mut ShardInodes> + use<'_, 'a> {
        assert!(self.declared.is_all(), "listing inodes needs every shard");
        self.guards.iter_mut().map(|guard| &mut **guard)
    }
}

/// The shards a transaction (or mount's replay) changes, write-locked.
pub struct MetaState<'a> {
    pub(super) core: &'a MetaCore,
    pub(super) locked: LockedShards<'a>,
    /// What the changes so far add to `MetaCore::persisted_bytes_estimate`.
    pub(super) estimate_delta: i64,
    /// Inodes made less inodes freed so far.
    pub(super) inode_delta: i64,
    /// Whether `apply` notes what changes for the next cut: where the
    /// checkpoint is an index, but for records loaded from it.
    pub(super) note_changes: bool,
}

impl<'a> MetaState<'a> {
    /// Write-locks the shards of `set`, in ascending index.
    pub(super) fn lock(core: &'a MetaCore, set: ShardSet) -> Self {
        let locked = LockedShards::lock(core, set);
        Self { core, locked, estimate_delta: 0, inode_delta: 0, note_changes: core.indexed }
    }

    pub fn declared(&self) -> &ShardSet {
        &self.locked.declared
    }

    pub fn data_region(&self) -> Region {
        self.core.data_region
    }

    /// Memory-only fields (size, open handles); persistent ones change
    /// through `apply`. Counts as a change for the handles' copies.
    pub fn inode_mut(&mut self, ino: u64) -> Option<&mut Inode> {
        self.locked.get_mut(ino)
    }

    /// Every inode, when every shard is locked (mount, fsck): by shard,
    /// then by number.
    pub fn inodes(&self) -> impl Iterator<Item = (u64, &Inode)> + use<'_, 'a> {
        sorted_inodes(self.locked.all())
    }

    /// Every inode for a change, when every shard is locked (mount).
    pub(super) fn inodes_mut(&mut self) -> impl Iterator<Item = (u64, &mut Inode)> + use<'_, 'a> {
        self.locked
            .all_mut()
            .flat_map(|shard| shard.inodes.iter_mut().map(|(&ino, inode)| (ino, inode)))
    }

    /// Notes what `record` changes for the next cut, where checkpoints keep
    /// only that.
    pub(super) fn note_change(&mut self, record: &Record) {
        if !self.note_changes {
            return;
        }
        let Some(ino) = changed_inode(record) else { return };
        self.locked.shard_mut(ino).changed.get_mut().note(record);
    }

    /// Notes that inode `ino`'s persisted fields changed without a record
    /// (times advanced in memory), for the next cut.
    pub(super) fn note_inode_change(&mut self, ino: u64) {
        if self.core.indexed {
            self.locked.shard_mut(ino).changed.get_mut().inodes.insert(ino);
        }
    }

    /// Each shard's checkpoint part, when every shard is locked.
    pub(super) fn shard_parts(&self) -> Vec<ShardPart> {
        self.locked.all().map(|shard| ShardPart::encode(&shard.inodes)).collect()
    }

    /// The upper bound of the checkpoint payload, with this transaction's
    /// changes so far.
    pub fn persisted_bytes_estimate(&self) -> u64 {
        let total = self.core.persisted_bytes_estimate.load(Ordering::Relaxed);
        (total + self.estimate_delta).max(0) as u64
    }

    /// Adds this state's estimate and inode count changes to the shared
    /// totals.
    pub(super) fn publish_estimate(&mut self) {
        let delta = std::mem::take(&mut self.estimate_delta);
        if delta != 0 {
            self.core.persisted_bytes_estimate.fetch_add(delta, Ordering::Relaxed);
        }
        let inodes = std::mem::take(&mut self.inode_delta);
        if inodes != 0 {
            self.core.inode_count.fetch_add(inodes, Ordering::Relaxed);
        }
    }
}

impl InodeTable for MetaState<'_> {
    fn inode(&self, ino: u64) -> Option<&Inode> {
        self.locked.inode(ino)
    }
}

impl MetaState<'_> {
    /// As [`InodeTable::inode`], without importing the trait.
    pub fn inode(&self, ino: u64) -> Option<&Inode> {
        self.locked.inode(ino)
    }
}

/// Named shards, read-locked: a consistent look at a few inodes (a
/// directory and an entry's inode), or at all of them (fsck).
pub struct MetaView<'a> {
    guards: SmallVec<[(usize, ReadGuard<'a>); 4]>,
    declared: ShardSet,
}

impl<'a> MetaView<'a> {
    pub(super) fn lock(core: &'a MetaCore, set: ShardSet) -> Self {
        let guards = set.iter().map(|shard| (shard, core.read_shard(shard))).collect();
        Self { guards, declared: set }
    }

    /// Every inode, when every shard is locked: by shard, then by number.
    pub fn inodes(&self) -> impl Iterator<Item = (u64, &Inode)> + '_ {
        assert!(self.declared.is_all(), "listing inodes needs every shard");
        sorted_inodes(self.guards.iter().map(|(_, guard)| &**guard))
    }

    pub fn inode_count(&self) -> usize {
        self.guards.iter().map(|(_, guard)| guard.inodes.len()).sum()
    }

    /// The read guards, by shard index.
    pub(super) fn shards(&self) -> impl Iterator<Item = (usize, &ShardInodes)> + '_ {
        self.guards.iter().map(|(shard, guard)| (*shard, &**guard))
    }
}

impl InodeTable for MetaView<'_> {
    fn inode(&self, ino: u64) -> Option<&Inode> {
        let shard = shard_of(ino);
        let found = if self.declared.is_all() {
            self.guards.get(shard)
        } else {
            self.guards.iter().find(|(index, _)| *index == shard)
        };
        let Some((_, guard)) = found else {
            panic!("inode {ino} (shard {shard}) is not among the inodes the view named");
        };
        guard.inodes.get(&ino)
    }
}

impl MetaView<'_> {
    /// As [`InodeTable::inode`], without importing the trait.
    pub fn inode(&self, ino: u64) -> Option<&Inode> {
        InodeTable::inode(self, ino)
    }
}

/// The inodes of `shards`, shard by shard, each shard's by number.
fn sorted_inodes<'s>(
    shards: impl Iterator<Item = &'s ShardInodes> + 's,
) -> impl Iterator<Item = (u64, &'s Inode)> + 's {
    shards.flat_map(|shard| {
        let mut inodes: Vec<(u64, &Inode)> =
            shard.inodes.iter().map(|(&ino, inode)| (ino, inode)).collect();
        inodes.sort_unstable_by_key(|(ino, _)| *ino);
        inodes
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_numbers_spread_over_every_shard_of_their_half() {
        let stride = DIRECTORY_INO_STRIDE;
        let mut seen = vec![false; SHARD_COUNT];
        for ino in 1000..1000 + 4 * stride * SHARD_COUNT as u64 {
            seen[shard_of(ino)] = true;
            let directory_shard = shard_of(ino) < SHARD_COUNT / 2;
            assert_eq!(directory_shard, ino.is_multiple_of(stride), "inode {ino}");
        }
        assert!(seen.iter().all(|&seen| seen));
    }

    #[test]
    fn a_set_lists_its_shards_in_ascending_order_once() {
        let set = ShardSet::of(&[5, 1, 99, 5, 4096 * 7 + 5]);
        let listed: Vec<usize> = set.iter().collect();
        let mut sorted = listed.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(listed, sorted);
        assert!(listed.contains(&shard_of(99)));
        assert_eq!(ShardSet::All.iter().count(), SHARD_COUNT);
        assert_eq!(ShardSet::All.iter().collect::<Vec<_>>(), (0..SHARD_COUNT).collect::<Vec<_>>());
    }
}
