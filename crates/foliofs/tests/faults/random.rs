//! Random workloads against a model: rules fail data writes, metadata
//! writes, reads, flushes or a mix, from a seed, while every answer is
//! checked against what the model says must hold.

use super::*;

// ---------------------------------------------------------------------------
// Random workloads against a model
// ---------------------------------------------------------------------------

/// Which requests a workload's rules fail.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Plan {
    DataWrites,
    MetadataWrites,
    Reads,
    Flushes,
    Mixed,
}

pub(crate) struct ModelFile {
    pub(crate) name: String,
    pub(crate) ino: u64,
    /// What reads must return now.
    pub(crate) live: Vec<u8>,
    /// The content at the last successful fsync (or syncfs), if nothing
    /// changed the file since.
    pub(crate) durable: Option<Vec<u8>>,
    /// Some fsync succeeded: its name must survive.
    pub(crate) named_durably: bool,
    pub(crate) buffered: File,
    pub(crate) direct: File,
    /// Another handle's fsync reported a writeback failure this one has
    /// not: its next fsync must fail.
    pub(crate) owed: [bool; 2],
}

pub(crate) struct Workload {
    pub(crate) rng: ChaCha8Rng,
    pub(crate) raw: Arc<FaultDev>,
    pub(crate) volume: Volume,
    pub(crate) areas: Areas,
    pub(crate) block: u64,
    pub(crate) plan: Plan,
    pub(crate) rules_seed: u64,
    pub(crate) armed: bool,
    pub(crate) files: Vec<ModelFile>,
    /// Why the volume refuses changes, once it does.
    pub(crate) read_only: Option<String>,
    pub(crate) log: Vec<String>,
    pub(crate) next_name: u64,
}

pub(crate) const FILE_BYTES_MAX: u64 = 300 << 10;

impl Workload {
    pub(crate) fn new(block_bytes: u32, plan: Plan, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let journal = if rng.random_bool(0.5) { Some(64 << 10) } else { None };
        let (raw, volume) = new_volume_with_options(32 << 20, block_bytes, journal, &options());
        let areas = areas(&volume);
        let mut workload = Self {
            rng,
            raw,
            volume,
            areas,
            block: u64::from(block_bytes),
            plan,
            rules_seed: seed,
            armed: false,
            files: Vec::new(),
            read_only: None,
            log: Vec::new(),
            next_name: 0,
        };
        for _ in 0..3 {
            workload.create_file();
        }
        for index in 0..workload.files.len() {
            workload.files[index].buffered.sync_all().unwrap();
            workload.files[index].durable = Some(Vec::new());
            workload.files[index].named_durably = true;
        }
        workload
    }

    pub(crate) fn rules(&mut self) -> Vec<FaultRule> {
        self.rules_seed = self.rules_seed.wrapping_add(1);
        let seed = self.rules_seed;
        let areas = &self.areas;
        let metadata = areas.superblocks.start..areas.data.start;
        let random = self.rng.random_bool(0.5);
        let every = self.rng.random_range(2..12);
        let probability = self.rng.random_range(0.02..0.3);
        let rule = |op: FaultOp, range: Option<Range<u64>>, salt: u64| {
            let rule = if random {
                FaultRule::random(op, probability, seed.wrapping_mul(31).wrapping_add(salt))
            } else {
                FaultRule::every_nth(op, every)
            };
            match range {
                Some(range) => rule.in_range(range),
                None => rule,
            }
        };
        match self.plan {
            Plan::DataWrites => vec![rule(FaultOp::Write, Some(areas.data.clone()), 1)],
            Plan::MetadataWrites => {
                let range = match self.rng.random_range(0..3) {
                    0 => areas.journal.clone(),
                    1 => areas.checkpoints.clone(),
                    _ => metadata,
                };
                vec![rule(FaultOp::Write, Some(range), 2)]
            }
            Plan::Reads => vec![rule(FaultOp::Read, None, 3)],
            Plan::Flushes => vec![rule(FaultOp::Flush, None, 4)],
            Plan::Mixed => vec![
                rule(FaultOp::Write, Some(areas.data.clone()), 5),
                rule(FaultOp::Read, None, 6),
                FaultRule::random(FaultOp::Any, 0.01, seed ^ 0x5EED),
            ],
        }
    }

    pub(crate) fn arm(&mut self) {
        if !self.armed {
            for rule in self.rules() {
                self.raw.add_rule(rule);
            }
            self.armed = true;
            self.log.push("arm".into());
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.raw.clear_rules();
        if self.armed {
            self.log.push("disarm".into());
        }
        self.armed = false;
    }

    pub(crate) fn context(&self) -> String {
        let tail: Vec<&String> = self.log.iter().rev().take(12).collect();
        format!("{:?} seed {}; last ops (newest first): {tail:?}", self.plan, self.rules_seed)
    }

    /// Classifies a failed call: EIO, or EROFS from a read-only volume
    /// whose message names the cause. Notes when the volume turns
    /// read-only.
    pub(crate) fn check_error(&mut self, what: &str, error: &Error) {
        let errno = error.errno();
        let message = error.to_string();
        self.log.push(format!("-> {what} failed: {message}"));
        let context = self.context();
        assert!(
            errno == libc::EIO || errno == libc::EROFS,
            "{what}: unexpected errno {errno}: {message} ({context})"
        );
        if message.contains("read-only") {
            assert_names_the_cause(error);
            if self.read_only.is_none() {
                WENT_READ_ONLY.fetch_add(1, Ordering::Relaxed);
                self.read_only = Some(message.clone());
            }
        }
        if errno == libc::EROFS {
            assert!(self.read_only.is_some(), "{what}: EROFS from a writable volume ({context})");
        }
        // With no fault armed a call fails only to report an earlier
        // writeback failure (fsync) or because the volume is read-only.
        let stale_report = what == "fsync" && message.contains("writeback");
        if !self.armed && self.read_only.is_none() && !stale_report {
            panic!("{what} failed with no fault armed: {message} ({context})");
        }
    }

    /// A change succeeded: the volume must not be read-only.
    pub(crate) fn check_change_allowed(&self, what: &str) {
        assert!(
            self.read_only.is_none(),
            "{what} succeeded on a read-only volume ({:?}; {})",
            self.read_only,
            self.context()
        );
    }

    /// The file's content read with the rules cleared.
    pub(crate) fn read_back(&mut self, index: usize) -> Vec<u8> {
        let armed = self.armed;
        self.disarm();
        let content = read_all(&self.volume, self.files[index].ino);
        if armed {
            self.arm();
        }
        content
    }

    /// After a failed change: the content is, byte by byte, what it was or
    /// what the change would have made; the model adopts it.
    pub(crate) fn settle_after_failure(&mut self, index: usize, intended: &[u8], what: &str) {
        let now = self.read_back(index);
        let old = &self.files[index].live;
        let long = old.len().max(intended.len());
        assert!(
            now.len() == old.len()
                || now.len() == intended.len()
                || (now.len() >= old.len().min(intended.len()) && now.len() <= long),
            "{what}: size {} after a failure (was {}, intended {}) ({})",
            now.len(),
            old.len(),
            intended.len(),
            self.context()
        );
        for (offset, &byte) in now.iter().enumerate() {
            let was = old.get(offset).copied().unwrap_or(0);
            let would = intended.get(offset).copied().unwrap_or(0);
            assert!(
                byte == was || byte == would,
                "{what}: byte {offset} is {byte} after a failure, neither {was} nor {would} ({})",
                self.context()
            );
        }
        let file = &mut self.files[index];
        file.live = now;
        file.durable = None;
    }

    pub(crate) fn changed(&mut self, index: usize, content: Vec<u8>) {
        let file = &mut self.files[index];
        file.live = content;
        file.durable = None;
    }

    pub(crate) fn create_file(&mut self) {
        let name = format!("file{}", self.next_name);
        self.next_name += 1;
        let result = self.volume.inodes().create(ROOT, name.as_bytes(), 0o644, owner());
        self.log.push(format!("create {name}"));
        let ino = match result {
            Ok(attr) => {
                self.check_change_allowed("create");
                attr.ino
            }
            Err(error) => {
                self.check_error("create", &error);
                // The record may have been applied before its commit failed.
                match self.volume.inodes().lookup(ROOT, name.as_bytes()) {
                    Ok(attr) => attr.ino,
                    Err(_) => return,
                }
            }
        };
        let open = |flags| self.volume.inodes().open_file(ino, flags);
        let (Ok(buffered), Ok(direct)) =
            (open(OpenFlags::READ_WRITE), open(OpenFlags::READ_WRITE.with_direct()))
        else {
            assert!(self.read_only.is_some(), "opening a new file failed on a writable volume");
            return;
        };
        self.files.push(ModelFile {
            name,
            ino,
            live: Vec::new(),
            durable: None,
            named_durably: false,
            buffered,
            direct,
            owed: [false; 2],
        });
    }

    pub(crate) fn step(&mut self) {
        OPS_RUN.fetch_add(1, Ordering::Relaxed);
        let toggle = self.rng.random_bool(0.08);
        if toggle {
            if self.armed {
                self.disarm();
            } else {
                self.arm();
            }
        }
        let index = self.rng.random_range(0..self.files.len());
        match self.rng.random_range(0..100) {
            0..=29 => self.write(index),
            30..=44 => self.read(index),
            45..=59 => self.fsync(index),
            60..=67 => self.truncate(index),
            68..=75 => self.fallocate(index),
            76..=79 => self.syncfs(),
            80..=82 => {
                if self.files.len() < 6 {
                    self.create_file();
                }
            }
            83..=85 => {
                let result = self.volume.checkpoint();
                self.log.push("checkpoint".into());
                if let Err(error) = result {
                    self.check_error("checkpoint", &error);
                }
            }
            _ => self.verify_live(index),
        }
    }

    pub(crate) fn write(&mut self, index: usize) {
        let direct = self.rng.random_bool(0.4);
        let unit = if direct { 512 } else { 1 };
        let end_max = FILE_BYTES_MAX / unit;
        let start = self.rng.random_range(0..end_max - 1);
        let length = self.rng.random_range(1..=(end_max - start).min(3 * self.block / unit + 2));
        let (pos, length) = ((start * unit) as usize, (length * unit) as usize);
        let data = pattern(self.rng.random(), length);
        let mut intended = self.files[index].live.clone();
        if intended.len() < pos + length {
            intended.resize(pos + length, 0);
        }
        intended[pos..pos + length].copy_from_slice(&data);
        self.log.push(format!("write {} {pos}+{length} direct={direct}", self.files[index].name));
        let file = &self.files[index];
        let injected_before = self.raw.failures_injected();
        let result = if direct {
            file.direct.write_at(&direct_buffer(&data), pos as u64)
        } else {
            file.buffered.write_at(&data, pos as u64)
        };
        match result {
            Ok(count) if count == length => {
                self.check_change_allowed("write");
                self.changed(index, intended);
            }
            Ok(count) => {
                // A short write: what it counts is written; the rest failed.
                self.log.push(format!("-> short write of {count}"));
                self.check_change_allowed("write");
                self.settle_after_failure(index, &intended, "short write");
                let live = &self.files[index].live;
                assert!(live[pos..pos + count] == data[..count], "short write's bytes");
            }
            Err(error) => {
                self.check_error("write", &error);
                self.note_writeback_report(index, None, &error, injected_before);
                self.settle_after_failure(index, &intended, "write");
            }
        }
    }

    pub(crate) fn read(&mut self, index: usize) {
        let direct = self.rng.random_bool(0.4);
        let unit = if direct { 512 } else { 1 };
        let start = self.rng.random_range(0..FILE_BYTES_MAX / unit);
        let length = self.rng.random_range(1..=4 * self.block / unit);
        let (pos, length) = ((start * unit) as usize, (length * unit) as usize);
        self.log.push(format!("read {} {pos}+{length} direct={direct}", self.files[index].name));
        let file = &self.files[index];
        let mut plain = vec![0u8; length];
        let mut aligned = AlignedBuf::zeroed(length);
        let injected_before = self.raw.failures_injected();
        let result = if direct {
            file.direct.read_at(&mut aligned, pos as u64)
        } else {
            file.buffered.read_at(&mut plain, pos as u64)
        };
        let got: &[u8] = if direct { &aligned } else { &plain };
        match result {
            Ok(count) => {
                let live = &self.files[index].live;
                let expected = &live[pos.min(live.len())..(pos + length).min(live.len())];
                assert!(
                    &got[..count] == expected,
                    "read of {pos}+{length} returned other bytes ({})",
                    self.context()
                );
            }
            Err(error) => {
                self.check_error("read", &error);
                self.note_writeback_report(index, None, &error, injected_before);
                // Nothing the failure left in the cache may show.
                self.verify_live(index);
            }
        }
    }

    /// A writeback failure that happened during the call (the device failed
    /// a request meanwhile: `injected_before` tells) advanced the file's
    /// error sequence: every handle but `reporter` owes a report. (A report
    /// of an older failure owes nobody anything new.)
    pub(crate) fn note_writeback_report(
        &mut self,
        index: usize,
        reporter: Option<usize>,
        error: &Error,
        injected_before: u64,
    ) {
        let new_failure = self.raw.failures_injected() > injected_before;
        if new_failure && error.to_string().contains("writeback") {
            for (handle, owed) in self.files[index].owed.iter_mut().enumerate() {
                if Some(handle) != reporter {
                    *owed = true;
                }
            }
        }
    }

    pub(crate) fn fsync(&mut self, index: usize) {
        let handle = self.rng.random_range(0..2);
        let data_only = self.rng.random_bool(0.3);
        self.log.push(format!(
            "fsync {} handle {handle} data_only={data_only}",
            self.files[index].name
        ));
        let file = &self.files[index];
        let target = if handle == 0 { &file.buffered } else { &file.direct };
        let injected_before = self.raw.failures_injected();
        let result = if data_only { target.sync_data() } else { target.sync_all() };
        let owed = std::mem::replace(&mut self.files[index].owed[handle], false);
        match result {
            Ok(()) => {
                assert!(
                    !owed,
                    "fsync succeeded on a handle that had not heard of a writeback failure ({})",
                    self.context()
                );
                self.check_change_allowed("fsync");
                let file = &mut self.files[index];
                file.durable = Some(file.live.clone());
                file.named_durably = true;
            }
            Err(error) => {
                self.check_error("fsync", &error);
                self.note_writeback_report(index, Some(handle), &error, injected_before);
            }
        }
    }

    pub(crate) fn truncate(&mut self, index: usize) {
        let size = self.rng.random_range(0..FILE_BYTES_MAX);
        let mut intended = self.files[index].live.clone();
        intended.resize(size as usize, 0);
        self.log.push(format!("truncate {} to {size}", self.files[index].name));
        let injected_before = self.raw.failures_injected();
        match self.files[index].buffered.set_len(size) {
            Ok(()) => {
                self.check_change_allowed("truncate");
                self.changed(index, intended);
            }
            Err(error) => {
                self.check_error("truncate", &error);
                self.note_writeback_report(index, None, &error, injected_before);
                self.settle_after_failure(index, &intended, "truncate");
            }
        }
    }

    pub(crate) fn fallocate(&mut self, index: usize) {
        let modes = [
            FallocateMode::PunchHole,
            FallocateMode::ZeroRange { keep_size: true },
            FallocateMode::ZeroRange { keep_size: false },
            FallocateMode::Allocate { keep_size: false },
        ];
        let mode = modes[self.rng.random_range(0..modes.len())];
        let offset = self.rng.random_range(0..FILE_BYTES_MAX - 1);
        let length = self.rng.random_range(1..=(FILE_BYTES_MAX - offset).min(4 * self.block));
        let mut intended = self.files[index].live.clone();
        common::apply_fallocate_to_model(&mut intended, mode, offset as usize, length as usize);
        self.log.push(format!("fallocate {} {mode:?} {offset}+{length}", self.files[index].name));
        let injected_before = self.raw.failures_injected();
        match self.files[index].buffered.fallocate(mode, offset, length) {
            Ok(()) => {
                self.check_change_allowed("fallocate");
                self.changed(index, intended);
            }
            Err(error) => {
                self.check_error("fallocate", &error);
                self.note_writeback_report(index, None, &error, injected_before);
                self.settle_after_failure(index, &intended, "fallocate");
            }
        }
    }

    pub(crate) fn syncfs(&mut self) {
        self.log.push("syncfs".into());
        match self.volume.sync() {
            Ok(()) => {
                self.check_change_allowed("syncfs");
                for file in &mut self.files {
                    file.durable = Some(file.live.clone());
                    file.named_durably = true;
                }
            }
            Err(error) => self.check_error("syncfs", &error),
        }
    }

    pub(crate) fn verify_live(&mut self, index: usize) {
        let now = self.read_back(index);
        assert!(
            now == self.files[index].live,
            "{} differs from what was written (size {} vs {}) ({})",
            self.files[index].name,
            now.len(),
            self.files[index].live.len(),
            self.context()
        );
    }

    /// Clears the rules, checks the live state, then remounts the image as
    /// a power cut at the last flush leaves it, and as it is: fsynced files
    /// hold their fsynced content, every fsynced name is there, fsck is
    /// clean. A writable volume then closes cleanly with everything.
    pub(crate) fn finish(mut self) {
        self.disarm();
        FAULTS_INJECTED.fetch_add(self.raw.failures_injected(), Ordering::Relaxed);
        for index in 0..self.files.len() {
            self.verify_live(index);
        }
        let images = [
            ("power cut", self.raw.crash_image(self.raw.log_len(), &|_| Keep::Nothing)),
            ("as written", self.raw.image()),
        ];
        for (what, image) in images {
            let (_, volume) = open_image(image).unwrap_or_else(|error| {
                panic!("{what}: mount fails: {error} ({})", self.context())
            });
            for file in &self.files {
                if !file.named_durably {
                    continue;
                }
                let ino =
                    volume.inodes().lookup(ROOT, file.name.as_bytes()).unwrap_or_else(|error| {
                        panic!(
                            "{what}: fsynced {} is gone: {error} ({})",
                            file.name,
                            self.context()
                        )
                    });
                assert_eq!(ino.ino, file.ino);
                if let Some(durable) = &file.durable {
                    let content = read_all(&volume, file.ino);
                    assert!(
                        &content == durable,
                        "{what}: {} lost fsynced data (size {} vs {}) ({})",
                        file.name,
                        content.len(),
                        durable.len(),
                        self.context()
                    );
                }
            }
            fsck_clean(volume.device(), what);
            REMOUNTS_CHECKED.fetch_add(1, Ordering::Relaxed);
        }
        let Workload { raw, volume, files, read_only, .. } = self;
        let expected: Vec<(u64, Vec<u8>)> =
            files.iter().map(|file| (file.ino, file.live.clone())).collect();
        drop(files);
        let closed = volume.close();
        match &read_only {
            Some(_) => {
                assert_eq!(closed.expect_err("close of a read-only volume").errno(), libc::EROFS)
            }
            None => {
                closed.expect("close without faults");
                let (_, volume) = open_image(raw.image()).unwrap();
                for (ino, content) in expected {
                    assert_eq!(read_all(&volume, ino), content, "after a clean close");
                }
                REMOUNTS_CHECKED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Far above what a workload takes in a debug build on a loaded machine.
pub(crate) const WORKLOAD_SECONDS_MAX: u64 = 300;

pub(crate) fn run_random(block_bytes: u32, plan: Plan, salt: u64) {
    let workloads = env_u64("FOLIOFS_FAULT_WORKLOADS", 3);
    let ops = env_u64("FOLIOFS_FAULT_OPS", 150);
    let base = env_u64("FOLIOFS_FAULT_SEED", 0xFA17) ^ (salt << 32) ^ u64::from(block_bytes);
    // FOLIOFS_FAULT_FIRST: start at a later workload (to replay one).
    for number in env_u64("FOLIOFS_FAULT_FIRST", 0)..workloads {
        let seed = base.wrapping_add(number * 7919);
        // On a thread of its own, so that a hang fails the test (naming the
        // workload) instead of stalling it.
        let (done, finished) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            let mut workload = Workload::new(block_bytes, plan, seed);
            for _ in 0..ops {
                workload.step();
            }
            workload.finish();
            let _ = done.send(());
        });
        match finished.recv_timeout(std::time::Duration::from_secs(WORKLOAD_SECONDS_MAX)) {
            Ok(()) => worker.join().unwrap(),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                // The workload panicked: pass its message on.
                if let Err(panic) = worker.join() {
                    std::panic::resume_unwind(panic);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!(
                "{plan:?} workload {number} (FOLIOFS_FAULT_FIRST={number}) on {block_bytes} B \
                 blocks still runs after {WORKLOAD_SECONDS_MAX} s: a hang"
            ),
        }
    }
    report(&format!("{plan:?}"), block_bytes);
}

pub(crate) fn random_data_write_faults(block_bytes: u32) {
    run_random(block_bytes, Plan::DataWrites, 1);
}

pub(crate) fn random_metadata_write_faults(block_bytes: u32) {
    run_random(block_bytes, Plan::MetadataWrites, 2);
}

pub(crate) fn random_read_faults(block_bytes: u32) {
    run_random(block_bytes, Plan::Reads, 3);
}

pub(crate) fn random_flush_faults(block_bytes: u32) {
    run_random(block_bytes, Plan::Flushes, 4);
}

pub(crate) fn random_mixed_faults(block_bytes: u32) {
    run_random(block_bytes, Plan::Mixed, 5);
}
