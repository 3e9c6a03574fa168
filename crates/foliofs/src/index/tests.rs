//! The index against a `BTreeMap`: random changes, commits, reopenings and
//! power cuts, with a cache small enough that every read path is taken.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::{IndexOptions, Tree, PAGE_BYTES};
use crate::dev::fault::{Keep, LogEntry};
use crate::dev::{Device, FaultDev, FuaMode};
use crate::error::Error;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

const REGION_BYTES: u64 = 16 << 20;

fn options(cache_bytes: usize) -> IndexOptions {
    IndexOptions { owner: 7, region: 0..REGION_BYTES, cache_bytes, pages_given: false }
}

fn device(fault: &Arc<FaultDev>) -> Arc<Device> {
    Arc::new(Device::new(fault.clone(), FuaMode::Native))
}

fn key(number: u32) -> Vec<u8> {
    // Lengths vary, and keys sharing a prefix sort apart.
    let mut key = format!("k{:06}", number % 1_000_000).into_bytes();
    key.extend(std::iter::repeat_n(b'.', (number % 13) as usize));
    key
}

fn value(number: u32, bytes: usize) -> Vec<u8> {
    (0..bytes).map(|index| (number as usize + index) as u8).collect()
}

/// Every entry, by a scan and by a walk (`for_each`), which must agree.
fn contents(tree: &mut Tree) -> Model {
    let scanned = tree.scan(&[], usize::MAX).unwrap();
    let mut walked = Vec::new();
    tree.for_each(|key, value| {
        walked.push((key.to_vec(), value.to_vec()));
        Ok(())
    })
    .unwrap();
    assert_eq!(walked, scanned, "a walk and a scan of the same tree differ");
    scanned.into_iter().collect()
}

/// Random inserts (mostly) and removes, applied to the tree and the model.
fn churn(tree: &mut Tree, model: &mut Model, random: &mut StdRng, operations: usize) {
    for _ in 0..operations {
        let number = random.random_range(0..4_000u32);
        if random.random_range(0..4) == 0 {
            assert_eq!(tree.remove(&key(number)).unwrap(), model.remove(&key(number)));
        } else {
            let bytes = random.random_range(0..300);
            let replaced = tree.insert(&key(number), &value(number, bytes)).unwrap();
            assert_eq!(replaced, model.insert(key(number), value(number, bytes)));
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Insert(u32, usize),
    Remove(u32),
    Get(u32),
    Scan(u32, usize),
    Commit,
    /// Reopen without committing: what was not committed is gone, as after
    /// a crash.
    Crash,
    CommitAndReopen,
    /// The three steps of a commit, apart, with changes between.
    Seal,
    WriteSealed,
    Finish,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => (0..3_000u32, 0..ENTRY_VALUE_MAX).prop_map(|(key, bytes)| Op::Insert(key, bytes)),
        15 => (0..3_000u32).prop_map(Op::Remove),
        10 => (0..3_000u32).prop_map(Op::Get),
        4 => (0..3_000u32, 0..50usize).prop_map(|(key, limit)| Op::Scan(key, limit)),
        3 => Just(Op::Commit),
        1 => Just(Op::Crash),
        1 => Just(Op::CommitAndReopen),
        3 => Just(Op::Seal),
        3 => Just(Op::WriteSealed),
        3 => Just(Op::Finish),
    ]
}

const ENTRY_VALUE_MAX: usize = 600;

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn the_index_matches_a_map_through_commits_crashes_and_a_tiny_cache(
        ops in prop::collection::vec(op(), 1..2_500)
    ) {
        let fault = Arc::new(FaultDev::new(REGION_BYTES, 512));
        // Eight pages of cache: nearly every step below the root reads.
        let cache_bytes = 8 * PAGE_BYTES;
        let mut tree = Tree::create(device(&fault), options(cache_bytes)).unwrap();
        let (mut model, mut committed) = (Model::new(), Model::new());
        let mut in_flight = InFlight::None;
        for op in ops {
            if matches!(op, Op::Commit | Op::CommitAndReopen) {
                in_flight.complete(&mut tree, &mut committed);
            }
            match op {
                Op::Insert(number, bytes) => {
                    let replaced = tree.insert(&key(number), &value(number, bytes)).unwrap();
                    prop_assert_eq!(replaced, model.insert(key(number), value(number, bytes)));
                }
                Op::Remove(number) => {
                    prop_assert_eq!(tree.remove(&key(number)).unwrap(), model.remove(&key(number)));
                }
                Op::Get(number) => {
                    prop_assert_eq!(tree.get(&key(number)).unwrap(), model.get(&key(number)).cloned());
                }
                Op::Scan(number, limit) => {
                    let found = tree.scan(&key(number), limit).unwrap();
                    let wanted: Vec<_> = model
                        .range(key(number)..)
                        .take(limit)
                        .map(|(key, value)| (key.clone(), value.clone()))
                        .collect();
                    prop_assert_eq!(found, wanted);
                }
                Op::Commit => {
                    tree.commit().unwrap();
                    committed = model.clone();
                }
                Op::Crash => {
                    if let InFlight::Written(_, sealed_model) = in_flight {
                        committed = sealed_model; // its root is durable
                    }
                    in_flight = InFlight::None;
                    tree = Tree::open(device(&fault), options(cache_bytes)).unwrap();
                    model = committed.clone();
                }
                Op::Seal => {
                    if matches!(in_flight, InFlight::None) {
                        in_flight = InFlight::Sealed(tree.seal().unwrap(), model.clone());
                    } else {
                        prop_assert!(tree.seal().is_err(), "a second seal was taken");
                    }
                }
                Op::WriteSealed => {
                    if let InFlight::Sealed(sealed, sealed_model) = in_flight {
                        in_flight = InFlight::Written(sealed.write(), sealed_model);
                    } else {
                        in_flight = std::mem::replace(&mut in_flight, InFlight::None);
                    }
                }
                Op::Finish => {
                    if let InFlight::Written(written, sealed_model) = in_flight {
                        tree.finish(written).unwrap();
                        committed = sealed_model;
                        in_flight = InFlight::None;
                    } else {
                        in_flight = std::mem::replace(&mut in_flight, InFlight::None);
                    }
                }
                Op::CommitAndReopen => {
                    tree.commit().unwrap();
                    committed = model.clone();
                    tree = Tree::open(device(&fault), options(cache_bytes)).unwrap();
                }
            }
            prop_assert_eq!(tree.len(), model.len() as u64);
        }
        prop_assert_eq!(tree.check().unwrap(), model.len() as u64);
        prop_assert_eq!(contents(&mut tree), model.clone());
        in_flight.complete(&mut tree, &mut committed);
        tree.commit().unwrap();
        let mut reopened = Tree::open(device(&fault), options(cache_bytes)).unwrap();
        prop_assert_eq!(reopened.check().unwrap(), model.len() as u64);
        prop_assert_eq!(contents(&mut reopened), model);
    }
}

/// A commit taken apart: sealed (with the state it froze), or written.
enum InFlight {
    None,
    Sealed(super::SealedCommit, Model),
    Written(crate::error::Result<super::WrittenCommit>, Model),
}

impl InFlight {
    fn complete(&mut self, tree: &mut Tree, committed: &mut Model) {
        let (written, sealed_model) = match std::mem::replace(self, InFlight::None) {
            InFlight::None => return,
            InFlight::Sealed(sealed, model) => (sealed.write(), model),
            InFlight::Written(written, model) => (written, model),
        };
        tree.finish(written).unwrap();
        *committed = sealed_model;
    }
}

#[test]
fn removing_everything_shrinks_the_tree_and_frees_its_pages_for_reuse() {
    let fault = Arc::new(FaultDev::new(REGION_BYTES, 512));
    let mut tree = Tree::create(device(&fault), options(1 << 20)).unwrap();
    for number in 0..20_000 {
        tree.insert(&key(number), &value(number, 40)).unwrap();
    }
    tree.commit().unwrap();
    let (height, pages) = (tree.height(), tree.used_pages());
    assert!(height >= 3, "20,000 entries in a tree of height {height}");
    for number in 0..20_000 {
        assert!(tree.remove(&key(number)).unwrap().is_some(), "entry {number}");
    }
    tree.commit().unwrap();
    tree.commit().unwrap(); // the pages the last root reached are free after the next
    assert_eq!((tree.height(), tree.len()), (1, 0));
    assert!(tree.used_pages() <= 3, "{} pages in use of {pages}", tree.used_pages());
    let mut tree = Tree::open(device(&fault), options(1 << 20)).unwrap();
    assert_eq!(tree.check().unwrap(), 0);
    // Filling it again takes freed pages, not new ones.
    for number in 0..20_000 {
        tree.insert(&key(number), &value(number, 40)).unwrap();
    }
    tree.commit().unwrap();
    assert!(
        tree.used_pages() <= pages + 2,
        "{} pages where {pages} held as much",
        tree.used_pages()
    );
}

#[test]
fn a_commit_writes_only_the_pages_a_change_reached() {
    let fault = Arc::new(FaultDev::new(REGION_BYTES, 512));
    let mut tree = Tree::create(device(&fault), options(1 << 20)).unwrap();
    for number in 0..30_000 {
        tree.insert(&key(number), &value(number, 100)).unwrap();
    }
    let full = tree.commit().unwrap();
    tree.insert(&key(77), b"changed").unwrap();
    let one = tree.commit().unwrap();
    // The path from the root to one leaf, the root record, a free-list page.
    assert!(full.pages_written > 800, "{full:?}");
    assert!(one.pages_written <= u64::from(tree.height()) + 3, "{one:?}");
}

#[test]
fn entries_over_the_limits_are_refused_and_change_nothing() {
    let fault = Arc::new(FaultDev::new(REGION_BYTES, 512));
    let mut tree = Tree::create(device(&fault), options(1 << 20)).unwrap();
    let long_key = vec![1u8; super::KEY_BYTES_MAX + 1];
    let long_value = vec![1u8; super::ENTRY_BYTES_MAX];
    assert!(matches!(tree.insert(&long_key, b""), Err(Error::Invalid(_))));
    assert!(matches!(tree.insert(b"k", &long_value), Err(Error::Invalid(_))));
    assert_eq!((tree.len(), tree.dirty_bytes()), (0, 0));
    // At the limit, three to a page, splits hold.
    for number in 0..50 {
        tree.insert(&key(number), &vec![9u8; super::ENTRY_BYTES_MAX - key(number).len()]).unwrap();
    }
    tree.commit().unwrap();
    assert_eq!(Tree::open(device(&fault), options(1 << 20)).unwrap().check().unwrap(), 50);
}

/// Commits `rounds` times after random changes, remembering each committed
/// state and the device log's length when each commit returned.
fn committed_history(fault: &Arc<FaultDev>, seed: u64, rounds: usize) -> (Vec<Model>, Vec<usize>) {
    let mut random = StdRng::seed_from_u64(seed);
    let mut tree = Tree::create(device(fault), options(16 * PAGE_BYTES)).unwrap();
    fault.reset_log();
    let (mut model, mut states, mut returned_at) = (Model::new(), vec![Model::new()], vec![0]);
    for _ in 0..rounds {
        churn(&mut tree, &mut model, &mut random, 400);
        tree.commit().unwrap();
        states.push(model.clone());
        returned_at.push(fault.log_len());
    }
    (states, returned_at)
}

#[test]
fn a_power_cut_anywhere_leaves_a_committed_state_no_older_than_the_last_commit_returned() {
    let fault = Arc::new(FaultDev::new(REGION_BYTES, 512));
    let (states, returned_at) = committed_history(&fault, 11, 12);
    let mut random = StdRng::seed_from_u64(12);
    let log_len = fault.log_len();
    let mut cuts = fault.durability_points();
    cuts.extend((0..60).map(|_| random.random_range(0..=log_len)));
    for cut in cuts {
        let tear_seed: u64 = random.random();
        let keep = move |index: usize| {
            let mut random = StdRng::seed_from_u64(tear_seed ^ index as u64);
            match random.random_range(0..3) {
                0 => Keep::All,
                1 => Keep::Nothing,
                _ => Keep::Sectors((0..64).map(|_| random.random()).collect()),
            }
        };
        let image = fault.crash_image(cut, &keep);
        let crashed = Arc::new(FaultDev::from_image(image, 512));
        let mut tree = Tree::open(device(&crashed), options(16 * PAGE_BYTES))
            .unwrap_or_else(|error| panic!("cut {cut}: {error}"));
        let generation = tree.committed_generation() as usize;
        let newest_returned = returned_at.iter().rposition(|&at| at <= cut).unwrap();
        assert!(generation > newest_returned, "cut {cut}: generation {generation} is older");
        assert_eq!(contents(&mut tree), states[generation - 1], "cut {cut}");
        // The tree goes on from there: its free list is right.
        let mut model = states[generation - 1].clone();
        churn(&mut tree, &mut model, &mut random, 200);
        tree.commit().unwrap();
        let mut reopened = Tree::open(device(&crashed), options(16 * PAGE_BYTES)).unwrap();
        assert_eq!(contents(&mut reopened), model, "cut {cut}, after going on");
    }
}

/// Pages the last commit wrote: every node it changed and the free list.
fn pages_written_after(fault: &FaultDev, from: usize) -> Vec<u64> {
    let log = fault.log();
    let mut pages = Vec::new();
    for entry in &log[from..] {
        if let LogEntry::Write { offset, data, fua: false } = entry {
            let count = data.len() / PAGE_BYTES;
            pages.extend((0..count).map(|index| offset + (index * PAGE_BYTES) as u64));
        }
    }
    pages
}

#[test]
fn a_lost_write_or_a_flipped_bit_is_refused_naming_the_page_never_followed() {
    let fault = Arc::new(FaultDev::new(REGION_BYTES, 512));
    let (states, returned_at) = committed_history(&fault, 21, 6);
    let before_last = returned_at[returned_at.len() - 2];
    let base = fault.crash_image(before_last, &|_| Keep::All);
    let written = pages_written_after(&fault, before_last);
    let final_image = fault.image();
    assert!(written.len() > 10, "the last commit wrote {} pages", written.len());
    for (index, &address) in written.iter().enumerate() {
        let at = address as usize;
        let mut image = final_image.clone();
        if index % 2 == 0 {
            // The write never reached the disk: the older page, or zeros.
            image[at..at + PAGE_BYTES].copy_from_slice(&base[at..at + PAGE_BYTES]);
        } else {
            image[at + 100 + index % 3000] ^= 0x10;
        }
        let damaged = Arc::new(FaultDev::from_image(image, 512));
        let checked = Tree::open(device(&damaged), options(4 * PAGE_BYTES))
            .and_then(|mut tree| tree.check().map(|_| contents(&mut tree)));
        match checked {
            Err(Error::Corrupt(message)) => {
                assert!(message.contains(&format!("byte {address}")), "{message}")
            }
            Ok(found) => panic!("page at {address} damaged, yet read: {}", found == states[6]),
            Err(other) => panic!("page at {address}: {other}"),
        }
    }
}

#[test]
fn keys_arriving_in_order_fill_their_pages() {
    let fault = Arc::new(FaultDev::new(REGION_BYTES, 512));
    let mut tree = Tree::create(device(&fault), options(1 << 20)).unwrap();
    let entry_bytes: usize = 4 + 8 + 101;
    for number in 0..20_000u64 {
        tree.insert(&number.to_be_bytes(), &[1u8; 101][..]).unwrap();
    }
    tree.commit().unwrap();
    let leaves_min = (20_000 * entry_bytes).div_ceil(PAGE_BYTES - super::page::HEADER_BYTES);
    // Leaves nearly full, a few branches, the free list.
    let pages = tree.used_pages() as usize;
    assert!(pages <= leaves_min * 21 / 20 + 8, "{pages} pages for {leaves_min} pages of entries");
}

#[test]
fn writers_go_on_while_a_commit_is_written_on_another_thread() {
    use parking_lot::Mutex;
    let fault = Arc::new(FaultDev::new(REGION_BYTES, 512));
    let tree =
        Arc::new(Mutex::new(Tree::create(device(&fault), options(64 * PAGE_BYTES)).unwrap()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let committer = {
        let (tree, done) = (tree.clone(), done.clone());
        std::thread::spawn(move || {
            let mut commits = 0;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let sealed = tree.lock().seal().unwrap();
                let written = sealed.write(); // the lock is not held here
                tree.lock().finish(written).unwrap();
                commits += 1;
            }
            commits
        })
    };
    let mut model = Model::new();
    let mut random = StdRng::seed_from_u64(31);
    // Until enough changes were made while a commit was being written.
    let (mut rounds, mut rounds_during_a_commit) = (0, 0);
    while rounds < 40 || rounds_during_a_commit < 5 {
        let mut tree = tree.lock();
        rounds_during_a_commit += u32::from(tree.commit_in_flight());
        churn(&mut tree, &mut model, &mut random, 200);
        rounds += 1;
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let commits = committer.join().unwrap();
    assert!(commits >= 1, "{commits} commits");
    let mut tree = Arc::into_inner(tree).unwrap().into_inner();
    tree.commit().unwrap();
    assert_eq!(contents(&mut tree), model);
    let mut reopened = Tree::open(device(&fault), options(64 * PAGE_BYTES)).unwrap();
    assert_eq!(reopened.check().unwrap(), model.len() as u64);
    assert_eq!(contents(&mut reopened), model);
}
