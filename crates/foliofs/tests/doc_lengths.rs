//! Keeps the four long documents current pages rather than diaries: each
//! stays within its number of lines. Dated narratives, superseded figures
//! and run logs belong in docs/history/, which the pages link.

use std::path::Path;

/// Each document (from the repository root) and the most lines it may have.
const LIMITS: &[(&str, usize)] = &[
    ("README.md", 200),
    ("ARCHITECTURE.md", 350),
    ("docs/BENCHMARKS.md", 400),
    ("docs/RELIABILITY.md", 600),
];

#[test]
fn each_document_stays_within_its_line_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut over = Vec::new();
    for &(document, limit) in LIMITS {
        let path = root.join(document);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        let lines = text.lines().count();
        if lines > limit {
            over.push(format!("{document}: {lines} lines, more than its limit of {limit}"));
        }
    }
    assert!(
        over.is_empty(),
        "documents over their limits (keep one current table per topic; move dated \
         narratives, superseded figures and run logs to docs/history/):\n{}",
        over.join("\n")
    );
}
