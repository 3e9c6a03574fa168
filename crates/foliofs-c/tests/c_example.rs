//! The C ABI from C: examples/example.c, compiled against the committed
//! header and the cdylib cargo built, then run. Where cbindgen is installed,
//! the committed header must be what it generates now.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding libfoliofs_c.so: the test binary's deps/ or its
/// parent (cargo puts the cdylib in both).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    let profile = deps.parent().unwrap().to_path_buf();
    [deps, profile]
        .into_iter()
        .find(|dir| dir.join("libfoliofs_c.so").exists())
        .expect("libfoliofs_c.so next to the test binary")
}

#[test]
fn c_example_compiles_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("example");
    let libraries = library_dir();
    let compiled = Command::new("cc")
        .arg(crate_dir().join("examples/example.c"))
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg("-L")
        .arg(&libraries)
        .arg("-lfoliofs_c")
        .arg("-o")
        .arg(&program)
        .output()
        .expect("run cc");
    assert!(compiled.status.success(), "cc: {}", String::from_utf8_lossy(&compiled.stderr));
    let ran = Command::new(&program)
        .arg(dir.path().join("c.img"))
        .env("LD_LIBRARY_PATH", &libraries)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&ran.stderr));
    assert!(stdout.contains("read 12 bytes: hello from C"), "{stdout}");
    assert!(stdout.contains("missing: -2 (/nope: no such file or directory)"), "{stdout}");
    assert!(stdout.ends_with("ok\n"), "{stdout}");
}

#[test]
fn committed_header_is_what_cbindgen_generates() {
    let generated = Command::new("cbindgen")
        .current_dir(crate_dir())
        .args(["--config", "cbindgen.toml", "--quiet"])
        .output();
    let Ok(generated) = generated else {
        eprintln!("cbindgen is not installed: the header is not compared");
        return;
    };
    assert!(generated.status.success(), "{}", String::from_utf8_lossy(&generated.stderr));
    let committed = std::fs::read(crate_dir().join("include/foliofs.h")).unwrap();
    assert!(
        generated.stdout == committed,
        "include/foliofs.h is stale: run `cbindgen --config cbindgen.toml --output \
         include/foliofs.h` in crates/foliofs-c"
    );
}
