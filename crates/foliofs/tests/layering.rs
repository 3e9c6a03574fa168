//! The layers of ARCHITECTURE.md, enforced: each module of the library may name
//! only the modules listed for it (calls go top to bottom). A new dependency
//! between modules is a design change; make it here, on purpose.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module -> the crate modules it may use.
const ALLOWED: &[(&str, &[&str])] = &[
    ("format", &[]),
    ("dev", &["completion"]),
    ("error", &["format"]),
    ("options", &["dev", "error"]),
    ("alloc", &["format"]),
    ("extent", &["format"]),
    ("refcount", &["alloc"]),
    ("layout", &["dev", "error", "format"]),
    ("journal", &["dev", "error", "format", "lock_order"]),
    ("meta", &["alloc", "dev", "error", "extent", "format", "journal", "lock_order", "refcount"]),
    ("iomap", &["alloc", "error", "extent", "format", "meta"]),
    ("completion", &[]),
    ("io_lock", &["lock_order"]),
    ("lock_order", &[]),
    // The folio cache is memory only: no device I/O, no metadata.
    ("cache", &["dev", "io_lock", "lock_order", "options"]),
    ("engine", &["cache", "dev", "error", "format", "meta", "options"]),
    ("passthru", &["dev", "engine", "error", "format", "iomap", "meta"]),
    ("writeback", &["cache", "engine", "error", "format", "iomap", "meta"]),
    ("buffered", &["cache", "engine", "error", "iomap", "options", "passthru", "writeback"]),
    (
        "space",
        &[
            "alloc",
            "cache",
            "engine",
            "error",
            "extent",
            "format",
            "iomap",
            "meta",
            "passthru",
            "writeback",
        ],
    ),
    (
        "direct",
        &[
            "cache",
            "completion",
            "dev",
            "engine",
            "error",
            "iomap",
            "options",
            "passthru",
            "writeback",
        ],
    ),
    ("trim", &["alloc", "dev", "error", "format", "meta"]),
    ("reflink", &["cache", "engine", "error", "extent", "format", "iomap", "meta", "writeback"]),
    // vfs holds the Device only to hand out statistics; it does no I/O.
    (
        "vfs",
        &[
            "buffered",
            "cache",
            "completion",
            "dev",
            "direct",
            "engine",
            "error",
            "format",
            "iomap",
            "journal",
            "layout",
            "lock_order",
            "meta",
            "options",
            "reflink",
            "space",
            "trim",
            "writeback",
        ],
    ),
    ("fsck", &["dev", "format", "layout", "meta", "options", "vfs"]),
];

fn module_of(relative: &Path) -> String {
    let first = relative.components().next().expect("non-empty path");
    first.as_os_str().to_string_lossy().trim_end_matches(".rs").to_string()
}

/// Every `crate::name` mentioned in `source`.
fn crate_references(source: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (index, _) in source.match_indices("crate::") {
        let rest = &source[index + "crate::".len()..];
        let name: String =
            rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if !name.is_empty() {
            found.insert(name);
        }
    }
    found
}

#[test]
fn modules_only_use_the_layers_below_them() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let source_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut stack = vec![source_root.clone()];
    let mut violations = Vec::new();
    let mut modules_seen = BTreeSet::new();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let relative = path.strip_prefix(&source_root).unwrap();
            let module = module_of(relative);
            if module == "lib" {
                continue;
            }
            modules_seen.insert(module.clone());
            let Some(permitted) = allowed.get(module.as_str()) else {
                violations.push(format!(
                    "{}: module {module} is missing from ALLOWED",
                    relative.display()
                ));
                continue;
            };
            let source = std::fs::read_to_string(&path).unwrap();
            // A grouped import would hide its modules from crate_references.
            if source.contains("crate::{") {
                violations.push(format!(
                    "{}: `crate::{{` groups imports this test cannot read; name each module",
                    relative.display()
                ));
            }
            for used in crate_references(&source) {
                if used != module && !permitted.contains(&used.as_str()) {
                    violations.push(format!(
                        "{}: {module} may not use crate::{used}",
                        relative.display()
                    ));
                }
            }
        }
    }
    assert!(violations.is_empty(), "layering violations:\n{}", violations.join("\n"));
    for (module, _) in ALLOWED {
        assert!(modules_seen.contains(*module), "ALLOWED names {module}, which no longer exists");
    }
}
