//! The `foliofs` binary end to end: round trips through an image and the
//! errors a user can cause.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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
    let fiemap = ok(&["fiemap", &format!("{image}:/copy/src/journal.rs")]);
    assert!(fiemap.contains("1 extent found"), "{fiemap}");
    ok(&["rm", "-r", &format!("{image}:/copy")]);
    assert_eq!(ok(&["ls", &format!("{image}:/")]), "");
    assert!(ok(&["fsck", image]).contains("clean"));
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
