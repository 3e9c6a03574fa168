//! Mounting mutated images: open, walk, read every file, change
//! everything, fsck; bounded in time and memory.

use super::*;

/// What a case did, for the totals.
#[derive(Default, Debug, Clone, Copy)]
pub(crate) struct CaseOutcome {
    pub(crate) mounted: bool,
    pub(crate) files_read: u64,
    pub(crate) fsck_problems: u64,
}

pub(crate) fn options_for(read_only: bool) -> VolumeOptions {
    VolumeOptions { read_only, cache_bytes: 16 << 20, ..common::options() }
}

/// Mounts `image`, walks and reads everything, runs fsck. Panics (caught by
/// the caller) are the failures; errors are fine.
pub(crate) fn exercise_image(image: Vec<u8>, read_only: bool, must_be_clean: bool) -> CaseOutcome {
    let mut outcome = CaseOutcome::default();
    if image.is_empty() || !image.len().is_multiple_of(512) {
        return outcome;
    }
    let image_bytes = image.len();
    let raw = Arc::new(FaultDev::from_image(image, 512));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    let Ok(volume) = Volume::open_device(device.clone(), &options_for(read_only)) else {
        let report = foliofs::fsck::check(device);
        assert!(!report.is_clean() || read_only, "fsck calls clean what would not mount");
        return outcome;
    };
    outcome.mounted = true;
    let (files, dirs) = walk(&volume, image_bytes);
    outcome.files_read = files.len() as u64;
    let _ = volume.statfs();
    let report = foliofs::fsck::check(device.clone());
    outcome.fsck_problems = report.problems.len() as u64;
    if must_be_clean {
        let load_problems: Vec<&String> =
            report.problems.iter().filter(|problem| !problem.contains("superblock")).collect();
        assert!(load_problems.is_empty(), "raw damage mounted but fsck finds {load_problems:?}");
    }
    if !read_only && live_changes() {
        change_everything(&volume, &files, &dirs);
        let _ = volume.close();
        // What the library wrote over the loaded state mounts again or is
        // refused cleanly.
        if let Ok(volume) = Volume::open_device(device, &options_for(true)) {
            walk(&volume, image_bytes);
        }
        return outcome;
    }
    let _ = volume.close();
    outcome
}

/// Changes on a mutated image that mounted (FOLIOFS_FUZZ_LIVE=0 skips
/// them): the live paths must not panic on any state mount accepts.
pub(crate) fn live_changes() -> bool {
    std::env::var("FOLIOFS_FUZZ_LIVE").map_or(true, |value| value != "0")
}

/// A bit of every kind of change on the files and directories found.
pub(crate) fn change_everything(volume: &Volume, files: &[FoundFile], dirs: &[u64]) {
    let owner = owner();
    let _ = volume.inodes().create(ROOT, b"fuzz-new", 0o644, owner).and_then(|attr| {
        let file = volume.inodes().open_file(attr.ino, OpenFlags::READ_WRITE)?;
        file.write_at(&pattern(1, 10_000), 0)?;
        file.sync_all()
    });
    for &dir in dirs.iter().take(3) {
        let _ = volume.inodes().mkdir(dir, b"fuzz-dir", 0o755, owner);
        let _ = volume.inodes().symlink(dir, b"fuzz-link", b"target", owner);
        let _ = volume.inodes().rmdir(dir, b"fuzz-dir");
    }
    for (index, (parent, ino, name)) in files.iter().take(4).enumerate() {
        let Ok(file) = volume.inodes().open_file(*ino, OpenFlags::READ_WRITE) else { continue };
        let size = file.attr().map_or(0, |attr| attr.size);
        let _ = file.write_at(b"overwrite", 0);
        let _ = file.write_at(&pattern(2, 5000), size.min(1 << 20));
        let _ = file.fallocate(FallocateMode::PunchHole, 100, 5000);
        let _ = file.fallocate(FallocateMode::ZeroRange { keep_size: false }, 0, 3000);
        let _ = file.set_len(size / 2);
        let _ = file.sync_all();
        if let Ok(direct) = volume.inodes().open_file(*ino, OpenFlags::READ_WRITE.with_direct()) {
            let _ = direct.write_at(&AlignedBuf::zeroed(4096), 0);
            let _ = direct.sync_data();
        }
        drop(file);
        let _ = volume.inodes().link(*ino, ROOT, format!("fuzz-hard{index}").as_bytes());
        let _ = volume.inodes().rename(
            *parent,
            name,
            ROOT,
            format!("fuzz-moved{index}").as_bytes(),
            foliofs::RenameFlags::default(),
        );
        if index % 2 == 0 {
            let _ = volume.inodes().unlink(ROOT, format!("fuzz-moved{index}").as_bytes());
        }
    }
    for &dir in dirs.iter().skip(1).take(2) {
        if let Ok(parent) = volume.inodes().parent_of(dir) {
            let name = volume
                .inodes()
                .readdir(parent)
                .ok()
                .and_then(|entries| entries.into_iter().find(|entry| entry.ino == dir))
                .map(|entry| entry.name);
            if let Some(name) = name {
                let _ = volume.inodes().rename(
                    parent,
                    &name,
                    ROOT,
                    b"fuzz-dir-moved",
                    Default::default(),
                );
                let _ = volume.inodes().rmdir(ROOT, b"fuzz-dir-moved");
            }
        }
    }
    let _ = volume.sync();
    let _ = volume.checkpoint();
}

/// Every directory (each once: a hostile image may hold cycles), every
/// symlink and every file, read in bounded pieces. Returns the files (parent,
/// inode, name) and the directories.
/// A file the walk found: its directory, inode and name.
pub(crate) type FoundFile = (u64, u64, Vec<u8>);

pub(crate) fn walk(volume: &Volume, image_bytes: usize) -> (Vec<FoundFile>, Vec<u64>) {
    let mut files = Vec::new();
    let mut dirs = vec![ROOT];
    let mut seen = HashSet::from([ROOT]);
    let mut stack = vec![ROOT];
    let _ = volume.inodes().resolve("/dir/sub/../link");
    while let Some(dir) = stack.pop() {
        let _ = volume.inodes().parent_of(dir);
        let Ok(entries) = volume.inodes().readdir(dir) else { continue };
        for entry in entries {
            let _ = volume.inodes().lookup(dir, &entry.name);
            let _ = volume.inodes().getattr(entry.ino);
            for name in
                volume.inodes().list_xattr(entry.ino, Privilege::SysAdmin).unwrap_or_default()
            {
                let _ = volume.inodes().get_xattr(entry.ino, &name, Privilege::SysAdmin);
            }
            match entry.kind {
                InodeKind::Dir => {
                    if seen.insert(entry.ino) && seen.len() < 100_000 {
                        stack.push(entry.ino);
                        dirs.push(entry.ino);
                    }
                }
                InodeKind::Symlink => {
                    let _ = volume.inodes().readlink(entry.ino);
                }
                InodeKind::Fifo
                | InodeKind::Socket
                | InodeKind::CharDevice
                | InodeKind::BlockDevice => {
                    let _ = volume.inodes().open_file(entry.ino, OpenFlags::READ);
                }
                InodeKind::File => {
                    if seen.insert(entry.ino) {
                        read_file(volume, entry.ino, image_bytes);
                        files.push((dir, entry.ino, entry.name.clone()));
                    }
                }
            }
        }
    }
    (files, dirs)
}

pub(crate) fn read_file(volume: &Volume, ino: u64, image_bytes: usize) {
    let Ok(attr) = volume.inodes().getattr(ino) else { return };
    let size = attr.size;
    let _ = volume.inodes().fiemap(ino);
    if let Ok(file) = volume.inodes().open_file(ino, OpenFlags::READ) {
        // All of a small file; of a large (or hostile) one the start, a
        // piece in the middle and the end.
        let head = size.min(256 << 10).min(image_bytes as u64) as usize;
        let mut buffer = vec![0u8; head.max(1)];
        let _ = file.read_at(&mut buffer, 0);
        for pos in [size / 2, size.saturating_sub(4096), size.saturating_sub(1), size, u64::MAX - 1]
        {
            let mut piece = vec![0u8; 8192];
            let _ = file.read_at(&mut piece, pos);
        }
        let _ = file.seek_data(0);
        let _ = file.seek_hole(0);
        let _ = file.seek_data(size / 2);
        let _ = file.attr();
    }
    if let Ok(file) = volume.inodes().open_file(ino, OpenFlags::READ.with_direct()) {
        let mut buffer = AlignedBuf::zeroed(8192);
        let _ = file.read_at(&mut buffer, 0);
        let _ = file.read_at(&mut buffer, size & !4095);
    }
}

/// Runs `work` on its own thread; a panic or a run past `CASE_SECONDS` is
/// a failure naming `what`.
pub(crate) fn bounded<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (sender, receiver) = std::sync::mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("fuzz-case".into())
        .spawn(move || {
            let _ = sender.send(work());
        })
        .unwrap();
    match receiver.recv_timeout(Duration::from_secs(CASE_SECONDS)) {
        Ok(value) => {
            let _ = worker.join();
            value
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still running after {CASE_SECONDS} s (a hang)")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            let panic = worker.join().err().map(|payload| {
                payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|text| text.to_string()))
                    .unwrap_or_default()
            });
            panic!("{what}: panicked: {}", panic.unwrap_or_default())
        }
    }
}

/// One mount case from a seed number: which seed image, how many and which
/// mutations, read-only or not.
pub(crate) fn build_case(seeds: &[SeedImage], case: u64) -> (String, Vec<u8>, bool, bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(case);
    let seed = &seeds[rng.random_range(0..seeds.len())];
    let donor = &seeds[rng.random_range(0..seeds.len())].image;
    let mut image = seed.image.clone();
    let mut steps = Vec::new();
    let mut structured = false;
    for _ in 0..rng.random_range(1..=3) {
        if rng.random_bool(0.25) {
            if let Some(what) = mutate_data(&mut rng, &mut image) {
                steps.push(what);
                continue;
            }
        }
        if rng.random_bool(0.6) {
            if let Some(what) = mutate_structured(&mut rng, &mut image) {
                structured = true;
                steps.push(what);
                continue;
            }
        }
        steps.push(mutate_raw(&mut rng, &mut image, donor));
    }
    let read_only = rng.random_bool(0.3);
    let description = format!("case {case} on {}: {}", seed.name, steps.join("; "));
    (description, image, read_only, !structured)
}

pub(crate) fn run_case(
    description: &str,
    image: Vec<u8>,
    read_only: bool,
    clean: bool,
) -> CaseOutcome {
    let bound = allocation_bound(image.len());
    LARGEST_ALLOCATION.store(0, Ordering::Relaxed);
    let outcome = bounded(description, move || exercise_image(image, read_only, clean));
    let largest = LARGEST_ALLOCATION.load(Ordering::Relaxed);
    assert!(largest <= bound, "{description}: one allocation of {largest} bytes (bound {bound})");
    outcome
}

#[test]
pub(crate) fn seed_images_mount_clean() {
    let seeds = load_seeds();
    for seed in &seeds {
        let outcome = run_case(&seed.name, seed.image.clone(), false, true);
        assert!(outcome.mounted && outcome.files_read >= 5, "{}: {outcome:?}", seed.name);
    }
}

#[test]
pub(crate) fn regressions_stay_fixed() {
    let seeds = load_seeds();
    let regressions = corpus_dir().join("regressions");
    let entries = std::fs::read_dir(&regressions)
        .unwrap_or_else(|error| panic!("the regression corpus {}: {error}", regressions.display()));
    let mut paths: Vec<PathBuf> = entries
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "patch"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no .patch case in the regression corpus {}", regressions.display());
    for path in &paths {
        let (_, image) = patch_apply(&std::fs::read(path).unwrap(), &seeds);
        for read_only in [false, true] {
            run_case(&path.display().to_string(), image.clone(), read_only, false);
        }
    }
}

#[test]
pub(crate) fn mounting_mutated_images_never_panics_hangs_or_overallocates() {
    let seeds = load_seeds();
    if let Some(case) = env_u64("FOLIOFS_FUZZ_CASE") {
        let (description, image, read_only, clean) = build_case(&seeds, case);
        eprintln!("{description}");
        if std::env::var_os("FOLIOFS_FUZZ_SAVE").is_some() {
            let (name, original) = seeds
                .iter()
                .map(|seed| (&seed.name, &seed.image))
                .find(|(name, _)| description.contains(&format!(" on {name}:")))
                .unwrap();
            let path = corpus_dir().join(format!("regressions/case-{case}.patch"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, patch_encode(name, original, &image)).unwrap();
            eprintln!("saved {}", path.display());
        }
        run_case(&description, image, read_only, clean);
        return;
    }
    let budget = Budget::new(3_000, 25);
    let first = base_seed() << 20;
    let (mut executions, mut mounted, mut files, mut fsck_problems) = (0u64, 0u64, 0u64, 0u64);
    let mut data_mutated = 0u64;
    // FOLIOFS_FUZZ_KEEP_GOING: collect every failing case instead of
    // stopping at the first (for long runs).
    let keep_going = std::env::var_os("FOLIOFS_FUZZ_KEEP_GOING").is_some();
    let mut failures = Vec::new();
    while budget.allows(executions) {
        let case = first + executions;
        let (description, image, read_only, clean) = build_case(&seeds, case);
        executions += 1;
        data_mutated += u64::from(description.contains("data: "));
        let outcome = if keep_going {
            let run = || run_case(&description, image, read_only, clean);
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
                Ok(outcome) => outcome,
                Err(_) => {
                    failures.push(case);
                    continue;
                }
            }
        } else {
            run_case(&description, image, read_only, clean)
        };
        mounted += u64::from(outcome.mounted);
        files += outcome.files_read;
        fsck_problems += outcome.fsck_problems;
    }
    eprintln!(
        "mount fuzz: {executions} executions from case {first} ({data_mutated} with file data \
         mutated), {mounted} mounted, {files} files read, {fsck_problems} fsck problems \
         reported, {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "failing cases (FOLIOFS_FUZZ_CASE replays one): {failures:?}");
    assert!(executions > 0);
}

#[test]
pub(crate) fn sparse_and_patch_formats_round_trip() {
    let mut image = vec![0u8; 4096];
    image[5] = 1;
    image[1500..1600].fill(7);
    assert_eq!(sparse_decode(&sparse_encode(&image)), image);
    let seeds = vec![SeedImage { name: "s".into(), image: image.clone() }];
    let mut mutated = image.clone();
    mutated[3000] = 9;
    mutated.truncate(3584);
    assert_eq!(patch_apply(&patch_encode("s", &image, &mutated), &seeds).1, mutated);
}
