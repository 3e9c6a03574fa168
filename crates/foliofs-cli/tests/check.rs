//! `foliofs crashtest` and `foliofs fsx` run, report their figures, and
//! exit 0 when nothing is wrong.

use std::process::Command;

fn foliofs(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_foliofs")).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "foliofs {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn crashtest_reports_its_figures() {
    let out =
        foliofs(&["crashtest", "--seed", "3", "--workloads", "2", "--ops", "12", "--threads", "2"]);
    assert!(out.contains("crashtest total: 2 workloads, 48 ops"), "{out}");
    assert!(out.contains("0 violations"), "{out}");
}

#[test]
fn fsx_reports_its_figures() {
    let out = foliofs(&["fsx", "--seed", "3", "--ops", "3000", "--block-size", "1k,64k"]);
    assert!(out.contains("block size 1024: 3000 ops"), "{out}");
    assert!(out.contains("block size 65536: 3000 ops"), "{out}");
}
