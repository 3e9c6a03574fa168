//! The `foliofs` binary end to end: round trips through an image and the
//! errors a user can cause.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod scale;
use scale::check_scale_target;

fn foliofs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_foliofs")).args(args).output().expect("run foliofs")
}

fn ok(args: &[&str]) -> String {
    let output = foliofs(args);
    assert!(
        output.status.success(),
        "foliofs {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

/// Runs a command that must fail; returns its stderr.
fn fails(args: &[&str]) -> String {
    let output = foliofs(args);
    assert!(!output.status.success(), "foliofs {args:?} should fail");
    String::from_utf8(output.stderr).expect("utf-8 output")
}

fn source_tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../foliofs/src")
}

/// Every file under `root` with its bytes, by relative path.
fn snapshot(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push((
                    path.strip_prefix(root).unwrap().to_path_buf(),
                    std::fs::read(&path).unwrap(),
                ));
            }
        }
    }
    files.sort();
    files
}

#[test]
fn round_trip_a_source_tree() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = dir.path().join("vol.img");
    let image = image.to_str().unwrap();
    ok(&["mkfs", image, "--size", "64M", "--block-size", "1024"]);
    ok(&["mkdir", &format!("{image}:/copy")]);
    ok(&["cp", "-r", source_tree().to_str().unwrap(), &format!("{image}:/copy")]);
    let listing = ok(&["ls", &format!("{image}:/copy/src")]);
    assert!(listing.lines().any(|line| line == "lib.rs"), "{listing}");
    let cat = Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .args(["cat", &format!("{image}:/copy/src/lib.rs")])
        .output()
        .unwrap();
    assert_eq!(cat.stdout, std::fs::read(source_tree().join("lib.rs")).unwrap());
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    ok(&["cp", "-r", &format!("{image}:/copy/src"), out.to_str().unwrap()]);
    assert_eq!(snapshot(&out.join("src")), snapshot(&source_tree()));
    let fsck = ok(&["fsck", image]);
    assert!(fsck.contains("clean"), "{fsck}");
    let fiemap = ok(&["fiemap", &format!("{image}:/copy/src/journal/mod.rs")]);
    assert!(fiemap.contains("1 extent found"), "{fiemap}");
    ok(&["rm", "-r", &format!("{image}:/copy")]);
    assert_eq!(ok(&["ls", &format!("{image}:/")]), "");
    assert!(ok(&["fsck", image]).contains("clean"));
}

#[test]
fn convert_moves_a_volume_to_format_3_and_keeps_its_files() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = dir.path().join("vol.img");
    let image = image.to_str().unwrap();
    ok(&["mkfs", image, "--size", "64M"]);
    ok(&["mkdir", &format!("{image}:/copy")]);
    ok(&["cp", "-r", source_tree().to_str().unwrap(), &format!("{image}:/copy")]);
    assert!(ok(&["info", image]).contains("format version:   2"));
    let converted = ok(&["convert", image]);
    assert!(converted.contains("format 3"), "{converted}");
    let info = ok(&["info", image]);
    assert!(info.contains("format version:   3") && info.contains("index root A"), "{info}");
    assert!(ok(&["fsck", image]).contains("clean"));
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    ok(&["cp", "-r", &format!("{image}:/copy/src"), out.to_str().unwrap()]);
    assert_eq!(snapshot(&out.join("src")), snapshot(&source_tree()));
    let again = fails(&["convert", image]);
    assert!(again.contains("in an index already"), "{again}");
    let made = ok(&["mkfs", image, "--size", "64M", "--metadata-index"]);
    assert!(made.contains("metadata in an index"), "{made}");
    let both =
        fails(&["mkfs", image, "--size", "64M", "--metadata-index", "--metadata-size", "2M"]);
    assert!(both.contains("--metadata-size"), "{both}");
}

#[test]
fn mkfs_rejects_bad_sizes_with_clear_messages() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = dir.path().join("vol.img");
    let image = image.to_str().unwrap();
    assert!(fails(&["mkfs", image, "--size", "1M"]).contains("too small"));
    assert!(
        fails(&["mkfs", image, "--size", "64M", "--block-size", "3000"]).contains("power of two")
    );
    assert!(
        fails(&["mkfs", image, "--size", "64M", "--block-size", "128k"]).contains("power of two")
    );
    assert!(fails(&["mkfs", image, "--size", "lots"]).contains("bad size"));
    assert!(fails(&["mkfs", &format!("{image}.missing")]).contains("--size"));
    let tiny = fails(&["mkfs", image, "--size", "64M", "--metadata-size", "64k"]);
    assert!(tiny.contains("metadata size") && tiny.contains("outside"), "{tiny}");
    let made = ok(&["mkfs", image, "--size", "64M", "--metadata-size", "3M"]);
    assert!(made.contains("two checkpoint slots of 3072 KiB"), "{made}");
}

#[test]
fn non_volumes_and_bad_options_are_refused_without_changes() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let stranger = dir.path().join("stranger.bin");
    let bytes: Vec<u8> = (0..(16u32 << 20)).map(|index| (index % 251) as u8).collect();
    std::fs::write(&stranger, &bytes).unwrap();
    let stranger = stranger.to_str().unwrap();
    assert!(fails(&["info", stranger]).contains("not a foliofs volume"));
    assert!(fails(&["ls", &format!("{stranger}:/")]).contains("not a foliofs volume"));
    let fsck = foliofs(&["fsck", stranger]);
    assert_eq!(fsck.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&fsck.stdout).contains("no valid superblock"));
    assert_eq!(std::fs::read(stranger).unwrap(), bytes, "nothing was written");

    let image = dir.path().join("vol.img");
    let image = image.to_str().unwrap();
    ok(&["mkfs", image, "--size", "32M"]);
    let before = std::fs::read(image).unwrap();
    let error = fails(&["-o", "engine=sync,turbo=on", "ls", &format!("{image}:/")]);
    assert!(error.contains("unknown option \"turbo\"") && error.contains("engine"), "{error}");
    assert!(fails(&["-o", "fua=maybe", "info", image]).contains("fua"));
    assert!(fails(&["ls", &format!("{image}:/missing")]).contains("no such file"));
    assert!(fails(&["cat", &format!("{image}:/")]).contains("is a directory"));
    assert_eq!(std::fs::read(image).unwrap(), before, "failed commands change nothing");
}

#[test]
fn copying_into_a_full_volume_fails_with_enospc_and_keeps_earlier_files() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = dir.path().join("vol.img");
    let image = image.to_str().unwrap();
    ok(&["mkfs", image, "--size", "16M"]);
    let small = dir.path().join("small.txt");
    std::fs::write(&small, b"keep me\n").unwrap();
    ok(&["cp", small.to_str().unwrap(), &format!("{image}:/small.txt")]);
    let big = dir.path().join("big.bin");
    std::fs::write(&big, vec![7u8; 32 << 20]).unwrap();
    let error = fails(&["cp", big.to_str().unwrap(), &format!("{image}:/big.bin")]);
    assert!(error.contains("no space left"), "{error}");
    let cat = foliofs(&["cat", &format!("{image}:/small.txt")]);
    assert_eq!(cat.stdout, b"keep me\n");
    assert!(ok(&["fsck", image]).contains("clean"));
}

#[test]
fn fsck_reports_a_damaged_superblock_and_the_volume_still_opens() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = dir.path().join("vol.img");
    let image_str = image.to_str().unwrap();
    ok(&["mkfs", image_str, "--size", "32M"]);
    let mut bytes = std::fs::read(&image).unwrap();
    bytes[100] ^= 0xFF;
    std::fs::write(&image, &bytes).unwrap();
    let fsck = foliofs(&["fsck", image_str]);
    assert_eq!(fsck.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&fsck.stdout).contains("superblock copy A"));
    assert!(ok(&["info", image_str]).contains("block size:       4096"));
}

/// A volume a newer build made is refused as such (EOPNOTSUPP, naming the
/// version), not called damaged, and left as it was.
#[test]
fn a_newer_format_version_is_named_not_called_damage() {
    use foliofs::format::Superblock;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = dir.path().join("vol.img");
    let image_str = image.to_str().unwrap();
    ok(&["mkfs", image_str, "--size", "32M"]);
    let mut bytes = std::fs::read(&image).unwrap();
    let mut superblock = Superblock::decode(&bytes[..4096]).unwrap();
    superblock.version = 99;
    for copy in 0..2 {
        let offset = Superblock::copy_offset(superblock.block_bytes, copy) as usize;
        let encoded = superblock.encode();
        bytes[offset..offset + encoded.len()].copy_from_slice(&encoded);
    }
    std::fs::write(&image, &bytes).unwrap();
    let message = fails(&["info", image_str]);
    assert!(message.contains("unsupported format version 99"), "{message}");
    assert!(message.contains("a newer build made it"), "{message}");
    assert!(!message.contains("damaged"), "{message}");
    assert_eq!(std::fs::read(&image).unwrap(), bytes, "the image changed");
}

/// `-o`'s help is made from the option tables: every key is in it.
#[test]
fn options_help_lists_every_key() {
    let help = ok(&["--help"]);
    let keys = foliofs::options::OPTION_KEYS.iter().chain(foliofs_fuse::MOUNT_OPTION_KEYS);
    for (key, description) in keys {
        let line = format!("{key}: ");
        assert!(help.contains(&line), "-o help lacks {key:?} ({description}):\n{help}");
    }
    assert!(ok(&["-h"]).contains("--help lists every key"));
}

/// `foliofs info` on an image another process holds (as a mount does) says
/// so once, not once per level of the error chain.
#[test]
fn info_on_an_image_in_use_says_so_once() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("held.img");
    let image = image.to_str().unwrap();
    ok(&["mkfs", image, "--size", "64M"]);
    let foliofs = env!("CARGO_BIN_EXE_foliofs");
    let output = Command::new("flock").args([image, foliofs, "info", image]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.matches("is in use by another process").count(), 1, "{stderr}");
}

/// `foliofs bench` with fio's own options: the JSON output is fio's shape.
#[test]
fn bench_runs_fio_options_and_prints_fio_json() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("bench.img");
    let image = image.to_str().unwrap();
    let output = ok(&[
        "-o",
        "engine=sync",
        "bench",
        "--output-format",
        "json",
        "--image",
        image,
        "--image-size",
        "128M",
        "--name=mix",
        "--rw=randrw",
        "--bs=4k",
        "--size=8M",
        "--ioengine=io_uring",
        "--direct=1",
        "--iodepth=8",
        "--verify=crc32c",
    ]);
    let json: serde_json::Value = serde_json::from_str(&output).expect("valid JSON");
    let job = &json["jobs"][0];
    assert_eq!(job["jobname"], "mix");
    let bytes =
        job["read"]["io_bytes"].as_u64().unwrap() + job["write"]["io_bytes"].as_u64().unwrap();
    assert_eq!(bytes, 8 << 20);
    assert!(job["verified_blocks"].as_u64().unwrap() > 0);
    assert!(job["write"]["clat_ns"]["percentile"]["99.000000"].as_u64().unwrap() > 0);
    // fio takes its own options anywhere, also after the job options.
    let output =
        ok(&["bench", "--image", image, "--name=late", "--size=1M", "--output-format=json"]);
    let json: serde_json::Value = serde_json::from_str(&output).expect("valid JSON");
    assert_eq!(json["jobs"][0]["jobname"], "late");
    let error =
        fails(&["bench", "--image", image, "--name=x", "--size=1M", "--rw=read", "--bogus=1"]);
    assert!(
        error.contains("unknown fio option \"bogus\"") && error.contains("supported:"),
        "{error}"
    );
    let error = fails(&["bench", "/nonexistent/job.fio"]);
    assert!(error.contains("read job file /nonexistent/job.fio"), "{error}");
}

/// A bench ended by SIGTERM (a user giving up on a stuck run) removes the
/// temporary image it made in the working directory.
#[test]
fn bench_killed_by_sigterm_removes_its_temporary_image() {
    let dir = tempfile::tempdir().unwrap();
    let bench = Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .current_dir(dir.path())
        .args(["bench", "--name=long", "--size=1M", "--time_based", "--runtime=120"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let image = dir.path().join(format!("foliofs-bench-{}.img", bench.id()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !image.exists() {
        assert!(std::time::Instant::now() < deadline, "the bench never created {image:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let killed = Command::new("kill").arg("-TERM").arg(bench.id().to_string()).status().unwrap();
    assert!(killed.success());
    let output = bench.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(128 + 15), "{output:?}");
    assert!(!image.exists(), "{image:?} left behind");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("removed foliofs-bench-"), "{stderr}");
}

/// `foliofs bench metadata --no-fsync`: small files stay in the cache, one
/// 4 KiB folio each, and the report says how much memory they took.
#[test]
fn bench_metadata_reports_folio_memory_of_small_files() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("metadata.img");
    let image = image.to_str().unwrap();
    let bench = |files: &str, file_size: &str| {
        let fixed = ["bench", "metadata", "--image", image, "--image-size", "64M", "--no-fsync"];
        let mut args: Vec<&str> = fixed.to_vec();
        args.extend(["--files", files, "--file-size", file_size]);
        ok(&args)
    };
    let output = bench("512", "4k");
    assert!(output.contains("create + write 4k + close, 512 files"), "{output}");
    assert!(output.contains("ops per CPU second"), "{output}");
    // The job's own CPU apart from the engine threads' beside it.
    assert!(output.contains("CPU per op (us): jobs "), "{output}");
    assert!(output.contains(" CPUs busy"), "{output}");
    // 512 folios of 4 KiB fill one 2 MiB slab exactly.
    assert!(
        output.contains(
            "folio cache: 2.0 MiB in 512 folios for 2.0 MiB written (2.0 MiB dirty); \
                         folio memory 2.0 MiB (1.00x the data)"
        ),
        "{output}"
    );
    assert!(output.contains("resident memory grew"), "{output}");
    // Files of 1 KiB on 4 KiB blocks take 1 KiB of memory each: 2,048 of
    // them fill one slab (a block each took four).
    let output = bench("2048", "1024");
    assert!(
        output.contains(
            "folio cache: 8.0 MiB in 2048 folios for 2.0 MiB written (8.0 MiB dirty); \
                         folio memory 2.0 MiB (1.00x the data)"
        ),
        "{output}"
    );
}

/// `bench metadata --jobs 1,2 --reps 2`: every count runs in every run,
/// each on a fresh volume, and the summary gives each count's median rate
/// and the median of each run's own 2 / 1 factor, inside its range.
#[test]
fn bench_metadata_runs_each_count_of_jobs_and_prints_how_it_scaled() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("metadata.img");
    let output = ok(&[
        "bench",
        "metadata",
        "--image",
        image.to_str().unwrap(),
        "--image-size",
        "64M",
        "--no-fsync",
        "--files",
        "300",
        "--jobs",
        "1,2",
        "--reps",
        "2",
    ]);
    assert_eq!(output.matches("300 files x 1 job,").count(), 2, "{output}");
    assert_eq!(output.matches("300 files x 2 jobs,").count(), 2, "{output}");
    // Each run starts from an empty volume: a second run's mkdir of job0
    // would fail on the first run's.
    assert!(output.contains("creates/s, median of 2 runs;"), "{output}");
    assert!(output.contains("| | 1 job | 2 jobs | 2 / 1 |"), "{output}");
    let row = output.lines().find(|line| line.starts_with("| in process |")).expect(&output);
    let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
    let one: f64 = cells[1].parse().unwrap();
    let two: f64 = cells[2].parse().unwrap();
    assert!(one > 0.0 && two > 0.0, "{row}");
    let (median, range) = cells[3].split_once(" (").expect(row);
    let (low, high) = range.trim_end_matches(')').split_once('-').expect(row);
    let [median, low, high]: [f64; 3] =
        [median, low, high].map(|value| value.parse().unwrap_or_else(|_| panic!("{row}")));
    assert!(low <= median && median <= high, "{row}");
    for bad in [["--jobs", "1,0"], ["--reps", "0"]] {
        let error =
            fails(&["bench", "metadata", "--image", image.to_str().unwrap(), bad[0], bad[1]]);
        assert!(error.contains(bad[0]), "{error}");
    }
}

/// `bench scale` in process, on a 64 MiB volume with a 256 KiB journal,
/// which the creates fill several times over while its checkpoint slot
/// still holds the files (about 9,000): each target's numbers are there and
/// sane, every checkpoint is reported, and the run leaves nothing behind.
#[test]
fn bench_scale_in_process_measures_every_phase() {
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("scale.json");
    let output = Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .args(["bench", "scale", "--files", "6000", "--per-dir", "500", "--targets"])
        .args(["in-process", "--volume-size", "64M", "--journal-size", "256k", "--json"])
        .arg(&json_path)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("## bench scale: 6000 empty files, 500 per directory"), "{stdout}");
    assert!(stdout.contains("| in-process | 6000 | "), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    check_scale_target(&json, "in-process", 6000);
    let checkpoints = json["targets"][0]["checkpoints"].as_array().unwrap();
    // 6,000 creates' records are several times 256 KiB, however they are
    // grouped: a 64 MiB volume's default journal (1 MiB) filled in some runs
    // and not in others, as the creates' timing grouped them.
    assert!(!checkpoints.is_empty(), "a 256 KiB journal fills: {json}");
    assert!(checkpoints.iter().all(|point| point["bytes"].as_u64().unwrap() > 0), "{json}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(left, [json_path], "the image is removed");
    let error = fails(&["bench", "scale", "--targets", "btrfs"]);
    assert!(error.contains("no target \"btrfs\" (known: in-process"), "{error}");
}

/// A quick seed run without peers writes its table, JSON and goals.
#[test]
fn bench_seeds_quick_writes_results() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("results");
    let output = Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .args(["bench", "seeds", "--quick", "--peers", "none", "--only", "001", "--out"])
        .arg(&out)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("### Seed 001") && stdout.contains("| dirty=folio |"), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("seed-001.json")).unwrap()).unwrap();
    let rows = &json["groups"][0]["rows"];
    let amplification = |index: usize| rows[index]["write_amplification"].as_f64().unwrap();
    assert!(amplification(0) < 1.1, "dirty=block writes what was written: {}", amplification(0));
    assert!(
        amplification(1) > 15.0,
        "dirty=folio writes whole 64 KiB folios: {}",
        amplification(1)
    );
    assert!(json["goals"].as_array().unwrap().iter().all(|goal| goal["met"] == true), "{json}");
    if Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() {
        let png = std::fs::read(out.join("seed-001.png")).expect("a chart when a font exists");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .filter(|name| name.to_string_lossy().ends_with(".img"))
        .collect();
    assert!(leftovers.is_empty(), "scratch images removed: {leftovers:?}");
    let error = fails(&["bench", "seeds", "--only", "007"]);
    assert!(error.contains("the seeds are 000, 001, 002, 003, 004"), "{error}");
}

/// The extents `foliofs fiemap` prints: (first block, last block, flags).
fn fiemap_extents(output: &str) -> Vec<(u64, u64, String)> {
    output
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').map(str::trim).collect();
            fields[0].parse::<u64>().ok()?;
            let (first, last) = fields[1].split_once("..")?;
            let flags = fields.get(4).copied().unwrap_or("").replace(",last", "");
            Some((first.trim().parse().ok()?, last.trim().parse().ok()?, flags))
        })
        .collect()
}

/// Each fallocate mode shows in fiemap and the size; a bad mode and a
/// misaligned or too long collapse fail with a clear message, a nonzero
/// exit and nothing changed.
#[test]
fn fallocate_shows_in_fiemap_and_bad_ranges_are_refused() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = dir.path().join("vol.img");
    let image = image.to_str().unwrap();
    ok(&["mkfs", image, "--size", "32M", "--block-size", "4096"]);
    let file = format!("{image}:/f");
    let unwritten = |first: u64, last: u64| (first, last, "unwritten".to_string());

    let out = ok(&["fallocate", &file, "--length", "1M"]);
    assert_eq!(out, "/f: size 1048576 bytes, 1048576 bytes allocated\n");
    let fiemap = ok(&["fiemap", &file]);
    assert!(fiemap.starts_with("File size of /f is 1048576 (256 blocks of 4096 bytes)"));
    assert_eq!(fiemap_extents(&fiemap), [unwritten(0, 255)], "{fiemap}");

    ok(&["fallocate", &file, "--mode", "punch-hole", "--offset", "64k", "--length", "128k"]);
    assert_eq!(fiemap_extents(&ok(&["fiemap", &file])), [unwritten(0, 15), unwritten(48, 255)]);
    // Blocks 16.. move down by 16: the hole comes first.
    let out = ok(&["fallocate", &file, "--mode", "collapse-range", "--length", "64k"]);
    assert!(out.contains("size 983040 bytes"), "{out}");
    assert_eq!(fiemap_extents(&ok(&["fiemap", &file])), [unwritten(32, 239)]);
    ok(&["fallocate", &file, "--mode", "insert-range", "--offset", "4k", "--length", "8k"]);
    assert_eq!(fiemap_extents(&ok(&["fiemap", &file])), [unwritten(34, 241)]);
    let out = ok(&["fallocate", &file, "--mode", "keep-size", "--offset", "2M", "--length", "4k"]);
    assert!(out.contains("size 991232 bytes"), "{out}");
    let fiemap = ok(&["fiemap", &file]);
    assert_eq!(fiemap_extents(&fiemap), [unwritten(34, 241), unwritten(512, 512)]);
    // zero-range past the end grows the file; with --keep-size it would not.
    ok(&["fallocate", &file, "--mode", "zero-range", "--offset", "1M", "--length", "4k"]);
    assert!(ok(&["fiemap", &file]).starts_with("File size of /f is 1052672 "));

    let before = ok(&["fiemap", &file]);
    let error = fails(&["fallocate", &file, "--mode", "sideways", "--length", "4k"]);
    assert!(
        error.contains("invalid value 'sideways' for '--mode <MODE>'")
            && error.contains("collapse-range"),
        "{error}"
    );
    let error = fails(&[
        "fallocate",
        &file,
        "--mode",
        "collapse-range",
        "--offset",
        "1000",
        "--length",
        "4k",
    ]);
    assert!(
        error.contains("collapse-range of 1000+4096 on /f")
            && error.contains("multiples of the block size (4096 B)"),
        "{error}"
    );
    let error = fails(&["fallocate", &file, "--mode", "collapse-range", "--length", "2M"]);
    assert!(error.contains("must end before the end of file"), "{error}");
    let error =
        fails(&["fallocate", &file, "--mode", "insert-range", "--keep-size", "--length", "4k"]);
    assert!(error.contains("--keep-size does not apply to --mode insert-range"), "{error}");
    assert!(fails(&["fallocate", &file, "--length", "lots"]).contains("--length: "));
    assert_eq!(ok(&["fiemap", &file]), before, "failed commands change nothing");
    assert!(ok(&["fsck", image]).contains("clean"));
}
