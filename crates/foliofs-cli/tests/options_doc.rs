//! docs/options.md is what `foliofs options --markdown` prints from the
//! code's option tables: an option added or changed without the document
//! fails here. `FOLIOFS_BLESS=1` rewrites the document instead.

use std::path::Path;
use std::process::Command;

const REGENERATE: &str = "FOLIOFS_BLESS=1 cargo test -p foliofs-cli --test options_doc";

#[test]
fn docs_options_md_is_what_the_code_generates() {
    let output = Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .args(["options", "--markdown"])
        .output()
        .expect("run foliofs options --markdown");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let generated = String::from_utf8(output.stdout).expect("the document is UTF-8");
    let document = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/options.md");
    if std::env::var_os("FOLIOFS_BLESS").is_some_and(|bless| bless == "1") {
        std::fs::write(&document, &generated).expect("write docs/options.md");
        return;
    }
    let checked_in = std::fs::read_to_string(&document).unwrap_or_default();
    if checked_in != generated {
        let first_difference = checked_in
            .lines()
            .zip(generated.lines())
            .position(|(old, new)| old != new)
            .unwrap_or_else(|| checked_in.lines().count().min(generated.lines().count()));
        panic!(
            "docs/options.md differs from what the code generates (first at line {}); \
             regenerate it with:\n    {REGENERATE}",
            first_difference + 1
        );
    }
}
