//! An in-memory device that records every write and flush, builds the images
//! a power cut could leave behind, and fails chosen requests with EIO.
//!
//! The model of durability: a write is volatile until a flush completes after
//! it, except a FUA write, which is durable on completion. A crash image is
//! therefore: every write before the last flush, every FUA write, and any
//! chosen subset (possibly torn at sector granularity) of the writes after
//! the last flush, applied in the order they completed.
//!
//! A discard is recorded as a plain write: of zeros for a zeroing, and for
//! TRIM of [`TRIMMED_BYTE`], the strictest reading of TRIM (the spec lets
//! the blocks read as anything until rewritten). So a trim of blocks that a
//! live file still maps, at any crash point, shows as bytes the file never
//! held.

use std::io::{self, IoSlice, IoSliceMut};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use super::cow_image::CowImage;
use super::{run_blocking, DevCallback, DevRequest, DiscardMode, RawDev};

/// What trimmed blocks read as: no file ever holds it by accident.
pub const TRIMMED_BYTE: u8 = 0xD7;

/// Bytes of the unit that a torn write keeps or loses as a whole.
pub const TEAR_SECTOR_BYTES: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEntry {
    Write { offset: u64, data: Arc<[u8]>, fua: bool },
    Flush,
}

/// What a crash keeps of one unflushed write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keep {
    All,
    Nothing,
    /// Torn: sector `i` of the write (512 B units) is kept iff `sectors[i]`.
    Sectors(Vec<bool>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    Read,
    Write,
    Flush,
    Any,
}

/// Fails matching requests with EIO. Matching requests are numbered from 0;
/// number `k` fails when `k >= after`, `(k - after) % every == 0`, and fewer
/// than `times` have failed.
#[derive(Debug, Clone)]
pub struct FaultRule {
    pub op: FaultOp,
    /// Only requests overlapping these device bytes match (flushes never do).
    pub byte_range: Option<Range<u64>>,
    pub after: u64,
    pub every: u64,
    pub times: u64,
    /// Instead of the `after`/`every` pattern: each matching request fails
    /// with this probability (parts per million), drawn from a seeded
    /// generator so a run can be repeated.
    random: Option<RandomFaults>,
    matched: u64,
    failed: u64,
}

#[derive(Debug, Clone, Copy)]
struct RandomFaults {
    per_million: u32,
    state: u64,
}

impl RandomFaults {
    /// splitmix64: a stateless-enough generator needing no dependency.
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl FaultRule {
    /// Fails the next `times` requests of kind `op`.
    pub fn next(op: FaultOp, times: u64) -> Self {
        Self {
            op,
            byte_range: None,
            after: 0,
            every: 1,
            times,
            random: None,
            matched: 0,
            failed: 0,
        }
    }

    /// Fails every `every`-th request of kind `op`, forever.
    pub fn every_nth(op: FaultOp, every: u64) -> Self {
        assert!(every > 0);
        Self {
            op,
            byte_range: None,
            after: every - 1,
            every,
            times: u64::MAX,
            random: None,
            matched: 0,
            failed: 0,
        }
    }

    /// Fails each request of kind `op` with `probability`, forever; `seed`
    /// makes the choice repeatable.
    pub fn random(op: FaultOp, probability: f64, seed: u64) -> Self {
        let per_million = (probability.clamp(0.0, 1.0) * 1e6) as u32;
        Self { random: Some(RandomFaults { per_million, state: seed }), ..Self::every_nth(op, 1) }
    }

    /// At most `times` failures from now on.
    pub fn times(mut self, times: u64) -> Self {
        self.times = times;
        self
    }

    pub fn in_range(mut self, byte_range: Range<u64>) -> Self {
        self.byte_range = Some(byte_range);
        self
    }

    fn matches(&mut self, op: FaultOp, bytes: Option<Range<u64>>) -> bool {
        if self.op != FaultOp::Any && self.op != op {
            return false;
        }
        if let Some(wanted) = &self.byte_range {
            match &bytes {
                Some(bytes) if bytes.start < wanted.end && wanted.start < bytes.end => {}
                _ => return false,
            }
        }
        let index = self.matched;
        self.matched += 1;
        let chosen = match &mut self.random {
            Some(random) => random.next() % 1_000_000 < u64::from(random.per_million),
            None => index >= self.after && (index - self.after).is_multiple_of(self.every),
        };
        let fail = chosen && self.failed < self.times;
        if fail {
            self.failed += 1;
        }
        debug_assert!(self.failed <= self.times && self.failed <= self.matched);
        fail
    }
}

struct State {
    /// The image when recording started.
    base: CowImage,
    /// What reads see now. Shares its chunks with `base` (and with other
    /// devices made from the same image) until writes copy them: the crash
    /// checker opens several devices on every crash image, most of them
    /// only to read.
    current: CowImage,
    log: Vec<LogEntry>,
    rules: Vec<FaultRule>,
    /// Every request fails once the device is marked dead (after a simulated crash).
    dead: bool,
    failures_injected: u64,
    /// A failed flush loses the volatile cache (see
    /// [`FaultDev::drop_cache_on_failed_flush`]).
    drop_cache_on_failed_flush: bool,
    /// Plain writes lost that way.
    writes_dropped: u64,
    discard_requests: u64,
    /// Writes take at least their bytes at this rate, one after another
    /// (see [`FaultDev::limit_write_bandwidth`]).
    write_bytes_per_s: Option<u64>,
    /// When the writes reserved so far are done at that rate.
    writes_busy_until: Option<Instant>,
}

pub struct FaultDev {
    state: Mutex<State>,
    logical_block_bytes: u32,
}

impl FaultDev {
    /// A zeroed device of `size_bytes`.
    pub fn new(size_bytes: u64, logical_block_bytes: u32) -> Self {
        Self::from_image(vec![0u8; size_bytes as usize], logical_block_bytes)
    }

    /// A device holding `image`; recording starts from it.
    pub fn from_image(image: Vec<u8>, logical_block_bytes: u32) -> Self {
        Self::from_cow_image(CowImage::from_bytes(&image), logical_block_bytes)
    }

    /// A device holding `image`, sharing its chunks until it writes them.
    pub fn from_cow_image(image: CowImage, logical_block_bytes: u32) -> Self {
        assert!(logical_block_bytes.is_power_of_two());
        assert_eq!(image.len() % logical_block_bytes as usize, 0);
        let state = State {
            base: image.clone(),
            current: image,
            log: Vec::new(),
            rules: Vec::new(),
            dead: false,
            failures_injected: 0,
            drop_cache_on_failed_flush: false,
            writes_dropped: 0,
            discard_requests: 0,
            write_bytes_per_s: None,
            writes_busy_until: None,
        };
        Self { state: Mutex::new(state), logical_block_bytes }
    }

    pub fn add_rule(&self, rule: FaultRule) {
        self.state.lock().rules.push(rule);
    }

    pub fn clear_rules(&self) {
        self.state.lock().rules.clear();
    }

    pub fn failures_injected(&self) -> u64 {
        self.state.lock().failures_injected
    }

    /// From now on a flush that fails loses every plain write not yet
    /// durable, as a disk whose volatile cache is lost with the failed
    /// flush: they vanish from what reads see and from the log (no later
    /// flush or crash image brings them back). Off by default: then a
    /// failed flush leaves them volatile, and a later flush makes them
    /// durable.
    pub fn drop_cache_on_failed_flush(&self, enabled: bool) {
        self.state.lock().drop_cache_on_failed_flush = enabled;
    }

    /// From now on writes complete no faster than `bytes_per_s` together
    /// (None: at memory speed), as a disk of that bandwidth: each write
    /// reserves its bytes' time after the writes before it, however many
    /// are in flight, and returns when that time is over.
    pub fn limit_write_bandwidth(&self, bytes_per_s: Option<u64>) {
        let mut state = self.state.lock();
        state.write_bytes_per_s = bytes_per_s.filter(|&rate| rate > 0);
        state.writes_busy_until = None;
    }

    /// Loses every plain write not yet durable (issued after the last
    /// completed flush), as a server or disk restarting without its
    /// volatile write cache: reads see the durable image again, and the
    /// lost writes leave the log as they do after a failed flush with
    /// [`Self::drop_cache_on_failed_flush`]. Returns how many were lost.
    pub fn lose_unflushed(&self) -> u64 {
        let mut state = self.state.lock();
        let before = state.writes_dropped;
        drop_volatile_writes(&mut state);
        state.writes_dropped - before
    }

    /// Plain writes lost by failed flushes and [`Self::lose_unflushed`].
    pub fn writes_dropped(&self) -> u64 {
        self.state.lock().writes_dropped
    }

    /// Discards carried out (each also in the log as a write of zeros).
    pub fn discard_requests(&self) -> u64 {
        self.state.lock().discard_requests
    }

    /// From now on every request fails: the machine "lost power".
    pub fn kill(&self) {
        self.state.lock().dead = true;
    }

    /// The current contents (what a read returns).
    pub fn image(&self) -> Vec<u8> {
        self.state.lock().current.to_vec()
    }

    /// The current contents, sharing their chunks with the device.
    pub fn cow_image(&self) -> CowImage {
        self.state.lock().current.clone()
    }

    pub fn log(&self) -> Vec<LogEntry> {
        self.state.lock().log.clone()
    }

    pub fn log_len(&self) -> usize {
        self.state.lock().log.len()
    }

    /// Drops the history: the current image becomes the base.
    pub fn reset_log(&self) {
        let mut state = self.state.lock();
        state.base = state.current.clone();
        state.log.clear();
    }

    /// Crash points worth testing: every `cut` (number of log entries issued)
    /// right after something became durable (a flush or a FUA write), plus
    /// 0 and the end of the log.
    pub fn durability_points(&self) -> Vec<usize> {
        let state = self.state.lock();
        let mut cuts = vec![0];
        for (index, entry) in state.log.iter().enumerate() {
            if matches!(entry, LogEntry::Flush | LogEntry::Write { fua: true, .. }) {
                cuts.push(index + 1);
            }
        }
        if *cuts.last().expect("non-empty") != state.log.len() {
            cuts.push(state.log.len());
        }
        debug_assert!(cuts.windows(2).all(|pair| pair[0] < pair[1]), "cuts out of order");
        cuts
    }

    /// Indices of the plain writes among the first `cut` entries that are not
    /// yet durable at that point (issued after the last flush).
    pub fn unflushed_writes(&self, cut: usize) -> Vec<usize> {
        let state = self.state.lock();
        let entries = &state.log[..cut.min(state.log.len())];
        let last_flush = entries.iter().rposition(|entry| *entry == LogEntry::Flush);
        let start = last_flush.map_or(0, |index| index + 1);
        (start..entries.len())
            .filter(|&index| matches!(entries[index], LogEntry::Write { fua: false, .. }))
            .collect()
    }

    /// The image a power cut leaves after the first `cut` log entries, keeping
    /// of each unflushed plain write what `keep` says (durable writes are
    /// always kept).
    pub fn crash_image(&self, cut: usize, keep: &dyn Fn(usize) -> Keep) -> Vec<u8> {
        self.crash_cow_image(cut, keep).to_vec()
    }

    /// `crash_image`, sharing the chunks no write after the base touched.
    pub fn crash_cow_image(&self, cut: usize, keep: &dyn Fn(usize) -> Keep) -> CowImage {
        let state = self.state.lock();
        let entries = &state.log[..cut.min(state.log.len())];
        let durable_end =
            entries.iter().rposition(|entry| *entry == LogEntry::Flush).map_or(0, |i| i + 1);
        let mut image = state.base.clone();
        for (index, entry) in entries.iter().enumerate() {
            let LogEntry::Write { offset, data, fua } = entry else {
                continue;
            };
            let decision = if index < durable_end || *fua { Keep::All } else { keep(index) };
            apply_write(&mut image, *offset, data, &decision);
        }
        image
    }

    fn check_fault(
        &self,
        state: &mut State,
        op: FaultOp,
        bytes: Option<Range<u64>>,
    ) -> io::Result<()> {
        if state.dead {
            return Err(io::Error::other("device is dead (simulated power cut)"));
        }
        let mut fail = false;
        for rule in &mut state.rules {
            fail |= rule.matches(op, bytes.clone());
        }
        if fail {
            state.failures_injected += 1;
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

/// Under a bandwidth limit: when a write of `bytes` issued now completes.
fn reserve_write_time(state: &mut State, bytes: usize) -> Option<Instant> {
    let rate = state.write_bytes_per_s?;
    let now = Instant::now();
    let start = state.writes_busy_until.filter(|&until| until > now).unwrap_or(now);
    let done_at = start + Duration::from_secs_f64(bytes as f64 / rate as f64);
    debug_assert!(done_at >= now, "a write done before it began");
    state.writes_busy_until = Some(done_at);
    Some(done_at)
}

/// Forgets the plain writes since the last flush: the image is rebuilt from
/// the base with the durable ones only.
fn drop_volatile_writes(state: &mut State) {
    let durable_end =
        state.log.iter().rposition(|entry| *entry == LogEntry::Flush).map_or(0, |i| i + 1);
    let before = state.log.len();
    let mut index = 0;
    state.log.retain(|entry| {
        let keep = index < durable_end || !matches!(entry, LogEntry::Write { fua: false, .. });
        index += 1;
        keep
    });
    // The durable prefix stays as it was; after it, only FUA writes and flushes.
    debug_assert!(state.log.len() >= durable_end);
    debug_assert!(state.log[durable_end..]
        .iter()
        .all(|entry| !matches!(entry, LogEntry::Write { fua: false, .. })));
    state.writes_dropped += (before - state.log.len()) as u64;
    let mut image = state.base.clone();
    for entry in &state.log {
        if let LogEntry::Write { offset, data, .. } = entry {
            apply_write(&mut image, *offset, data, &Keep::All);
        }
    }
    state.current = image;
}

fn apply_write(image: &mut CowImage, offset: u64, data: &[u8], keep: &Keep) {
    let start = offset as usize;
    match keep {
        Keep::All => image.write(start, data),
        Keep::Nothing => {}
        Keep::Sectors(sectors) => {
            for (index, chunk) in data.chunks(TEAR_SECTOR_BYTES).enumerate() {
                if sectors.get(index).copied().unwrap_or(false) {
                    image.write(start + index * TEAR_SECTOR_BYTES, chunk);
                }
            }
        }
    }
}

impl RawDev for FaultDev {
    fn read_at(&self, offset: u64, buffers: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        let mut state = self.state.lock();
        let length: usize = buffers.iter().map(|buffer| buffer.len()).sum();
        self.check_fault(&mut state, FaultOp::Read, Some(offset..offset + length as u64))?;
        let mut position = offset as usize;
        if position + length > state.current.len() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"));
        }
        for buffer in buffers.iter_mut() {
            state.current.read(position, buffer);
            position += buffer.len();
        }
        debug_assert_eq!(position, offset as usize + length);
        Ok(())
    }

    fn write_at(&self, offset: u64, buffers: &[IoSlice<'_>], fua: bool) -> io::Result<()> {
        let mut state = self.state.lock();
        let data: Vec<u8> = buffers.iter().flat_map(|buffer| buffer.iter().copied()).collect();
        self.check_fault(&mut state, FaultOp::Write, Some(offset..offset + data.len() as u64))?;
        if offset as usize + data.len() > state.current.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "write past the end"));
        }
        let done_at = reserve_write_time(&mut state, data.len());
        apply_write(&mut state.current, offset, &data, &Keep::All);
        state.log.push(LogEntry::Write { offset, data: data.into(), fua });
        drop(state);
        if let Some(done_at) = done_at {
            std::thread::sleep(done_at.saturating_duration_since(Instant::now()));
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut state = self.state.lock();
        if let Err(error) = self.check_fault(&mut state, FaultOp::Flush, None) {
            if state.drop_cache_on_failed_flush && !state.dead {
                drop_volatile_writes(&mut state);
            }
            return Err(error);
        }
        state.log.push(LogEntry::Flush);
        Ok(())
    }

    fn submit(&self, request: DevRequest, done: DevCallback) {
        done(run_blocking(self, request))
    }

    fn discard(&self, offset: u64, length: u64, mode: DiscardMode) -> io::Result<()> {
        let mut state = self.state.lock();
        self.check_fault(&mut state, FaultOp::Write, Some(offset..offset.saturating_add(length)))?;
        if offset.saturating_add(length) > state.current.len() as u64 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "discard past the end"));
        }
        let fill = if mode == DiscardMode::Zero { 0 } else { TRIMMED_BYTE };
        let data = vec![fill; length as usize];
        apply_write(&mut state.current, offset, &data, &Keep::All);
        state.log.push(LogEntry::Write { offset, data: data.into(), fua: false });
        state.discard_requests += 1;
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.state.lock().current.len() as u64
    }

    fn logical_block_bytes(&self) -> u32 {
        self.logical_block_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(device: &FaultDev, offset: u64, byte: u8, length: usize, fua: bool) {
        device.write_at(offset, &[IoSlice::new(&vec![byte; length])], fua).unwrap();
    }

    #[test]
    fn devices_share_an_image_until_they_write() {
        let image = CowImage::from_bytes(&[7u8; 4096]);
        let reader = FaultDev::from_cow_image(image.clone(), 512);
        let writer = FaultDev::from_cow_image(image.clone(), 512);
        let mut buffer = [0u8; 512];
        reader.read_at(0, &mut [IoSliceMut::new(&mut buffer)]).unwrap();
        assert!(reader.cow_image().shares_all_chunks_with(&image), "reading copies nothing");
        write(&writer, 512, 9, 512, false);
        assert!(!writer.cow_image().shares_all_chunks_with(&image), "a write copies");
        assert_eq!((writer.image()[512], image.to_vec()[512], reader.image()[512]), (9, 7, 7));
        let crashed = writer.crash_cow_image(writer.log_len(), &|_| Keep::Nothing);
        assert!(crashed.shares_all_chunks_with(&image), "nothing kept: the base as it was");
        assert_eq!(writer.crash_image(writer.log_len(), &|_| Keep::All)[512], 9);
    }

    #[test]
    fn crash_keeps_flushed_and_fua_writes_only() {
        let device = FaultDev::new(8192, 512);
        write(&device, 0, 1, 512, false);
        device.flush().unwrap();
        write(&device, 512, 2, 512, false);
        write(&device, 1024, 3, 512, true);
        write(&device, 1536, 4, 1024, false);
        let cut = device.log_len();
        assert_eq!(device.unflushed_writes(cut), vec![2, 4]);
        assert_eq!(device.durability_points(), vec![0, 2, 4, cut]);
        let image = device.crash_image(cut, &|_| Keep::Nothing);
        assert_eq!(image[0], 1);
        assert_eq!(image[512], 0, "unflushed write must be droppable");
        assert_eq!(image[1024], 3, "FUA write is durable");
        let torn = device.crash_image(cut, &|index| {
            if index == 4 {
                Keep::Sectors(vec![false, true])
            } else {
                Keep::All
            }
        });
        assert_eq!((torn[512], torn[1536], torn[2048]), (2, 0, 4));
        assert_eq!(device.crash_image(1, &|_| Keep::Nothing), vec![0u8; 8192]);
        assert_eq!(device.crash_image(1, &|_| Keep::All)[0], 1);
    }

    #[test]
    fn a_failed_flush_can_drop_the_volatile_cache() {
        let device = FaultDev::new(8192, 512);
        write(&device, 0, 1, 512, false);
        device.flush().unwrap();
        write(&device, 0, 2, 512, false);
        write(&device, 512, 3, 512, true);
        write(&device, 1024, 4, 512, false);
        device.drop_cache_on_failed_flush(true);
        device.add_rule(FaultRule::next(FaultOp::Flush, 1));
        device.flush().unwrap_err();
        assert_eq!(device.writes_dropped(), 2);
        let image = device.image();
        assert_eq!((image[0], image[512], image[1024]), (1, 3, 0), "durable and FUA writes stay");
        device.flush().unwrap();
        let after = device.crash_image(device.log_len(), &|_| Keep::All);
        assert_eq!(
            (after[0], after[512], after[1024]),
            (1, 3, 0),
            "a later flush brings nothing back"
        );
    }

    #[test]
    fn losing_unflushed_writes_keeps_the_durable_image() {
        let device = FaultDev::new(8192, 512);
        write(&device, 0, 1, 512, false);
        device.flush().unwrap();
        write(&device, 0, 2, 512, false);
        write(&device, 512, 3, 512, true);
        write(&device, 1024, 4, 512, false);
        assert_eq!(device.lose_unflushed(), 2);
        let image = device.image();
        assert_eq!((image[0], image[512], image[1024]), (1, 3, 0), "flushed and FUA writes stay");
        assert_eq!(device.unflushed_writes(device.log_len()), Vec::<usize>::new());
        assert_eq!(device.lose_unflushed(), 0, "nothing volatile is left to lose");
        write(&device, 1536, 5, 512, false);
        device.flush().unwrap();
        assert_eq!(device.lose_unflushed(), 0, "a flushed write survives");
        assert_eq!(device.image()[1536], 5);
        assert_eq!(device.writes_dropped(), 2);
    }

    #[test]
    fn rules_fail_chosen_requests() {
        let device = FaultDev::new(8192, 512);
        device.add_rule(FaultRule::every_nth(FaultOp::Write, 3));
        let results: Vec<bool> = (0..6)
            .map(|index| device.write_at(index * 512, &[IoSlice::new(&[7u8; 512])], false).is_ok())
            .collect();
        assert_eq!(results, vec![true, true, false, true, true, false]);
        assert_eq!(device.failures_injected(), 2);
        assert_eq!(device.image()[1024], 0, "a failed write changes nothing");
        device.clear_rules();
        device.add_rule(FaultRule::next(FaultOp::Any, 1).in_range(4096..4608));
        assert!(device.flush().is_ok(), "flush has no byte range");
        let mut buffer = [0u8; 512];
        assert!(device.read_at(4096, &mut [IoSliceMut::new(&mut buffer)]).is_err());
        assert!(device.read_at(4096, &mut [IoSliceMut::new(&mut buffer)]).is_ok());
        device.kill();
        assert!(device.flush().is_err());
    }

    #[test]
    fn random_rules_repeat_with_their_seed() {
        let outcomes = |seed| {
            let device = FaultDev::new(8192, 512);
            device.add_rule(FaultRule::random(FaultOp::Flush, 0.3, seed).times(5));
            (0..100).map(|_| device.flush().is_ok()).collect::<Vec<bool>>()
        };
        let first = outcomes(1);
        assert_eq!(first, outcomes(1));
        assert_ne!(first, outcomes(2));
        assert_eq!(first.iter().filter(|ok| !**ok).count(), 5, "capped by times");
    }
}
