//! The layers of ARCHITECTURE.md, enforced: each module of the library may name
//! only the modules listed for it (calls go top to bottom). A new dependency
//! between modules is a design change; make it here, on purpose. Inside a
//! directory module (`vfs`, `cache`, `meta`, ...) the files import each
//! other without cycles.

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
    ("index", &["dev", "error"]),
    (
        "meta",
        &[
            "alloc",
            "dev",
            "error",
            "extent",
            "format",
            "index",
            "journal",
            "lock_order",
            "refcount",
        ],
    ),
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

/// Every `.rs` file below `root`.
fn rust_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn modules_only_use_the_layers_below_them() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let source_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut violations = Vec::new();
    let mut modules_seen = BTreeSet::new();
    for path in rust_files(&source_root) {
        let relative = path.strip_prefix(&source_root).unwrap();
        let module = module_of(relative);
        if module == "lib" {
            continue;
        }
        modules_seen.insert(module.clone());
        let Some(permitted) = allowed.get(module.as_str()) else {
            violations
                .push(format!("{}: module {module} is missing from ALLOWED", relative.display()));
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
                violations
                    .push(format!("{}: {module} may not use crate::{used}", relative.display()));
            }
        }
    }
    assert!(violations.is_empty(), "layering violations:\n{}", violations.join("\n"));
    for (module, _) in ALLOWED {
        assert!(modules_seen.contains(*module), "ALLOWED names {module}, which no longer exists");
    }
}

/// Edges between sibling files that close a known cycle, as (directory
/// module, from, to), left out of `sibling_files_import_each_other_without_cycles`
/// until they go. Each entry must still close a cycle, or the test asks for
/// its removal.
const CYCLE_EDGES_ALLOWED: &[(&str, &str, &str)] = &[];

/// `source` with comments, string and character literals blanked (newlines
/// kept, so offsets still give line numbers): doc links and messages name
/// paths that are no imports.
fn code_only(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = bytes.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for byte in &mut out[from..to] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    let is_ident = |byte: u8| byte.is_ascii_alphanumeric() || byte == b'_';
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&byte| byte == b'\n').map_or(bytes.len(), |n| at + n);
            blank(&mut out, at, end);
            at = end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut end) = (0, at);
            while end < bytes.len() {
                if bytes[end..].starts_with(b"/*") {
                    depth += 1;
                    end += 2;
                } else if bytes[end..].starts_with(b"*/") {
                    depth -= 1;
                    end += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    end += 1;
                }
            }
            blank(&mut out, at, end);
            at = end;
        } else if rest[0] == b'"'
            || (rest[0] == b'r'
                && (at == 0 || !is_ident(bytes[at - 1]))
                && rest[1..].iter().take_while(|&&byte| byte == b'#').count() + 1 < rest.len()
                && rest[1 + rest[1..].iter().take_while(|&&byte| byte == b'#').count()] == b'"')
        {
            let end = if rest[0] == b'r' {
                let hashes = rest[1..].iter().take_while(|&&byte| byte == b'#').count();
                let closing: Vec<u8> =
                    std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
                let body = at + 2 + hashes;
                (body..bytes.len())
                    .find(|&n| bytes[n..].starts_with(&closing))
                    .map_or(bytes.len(), |n| n + closing.len())
            } else {
                let mut end = at + 1;
                while end < bytes.len() && bytes[end] != b'"' {
                    end += if bytes[end] == b'\\' { 2 } else { 1 };
                }
                (end + 1).min(bytes.len())
            };
            blank(&mut out, at, end);
            at = end;
        } else if rest[0] == b'\'' {
            // A character literal ('a', '\n', '\u{..}'), not a lifetime.
            let end = if rest.len() > 2 && rest[1] == b'\\' {
                rest[2..].iter().position(|&byte| byte == b'\'').map(|n| at + 3 + n)
            } else if rest.len() > 2 && rest[2] == b'\'' {
                Some(at + 3)
            } else {
                // A multi-byte character, or a lifetime.
                let width = std::str::from_utf8(&rest[1..rest.len().min(5)])
                    .ok()
                    .or_else(|| std::str::from_utf8(&rest[1..rest.len().min(4)]).ok())
                    .or_else(|| std::str::from_utf8(&rest[1..rest.len().min(3)]).ok())
                    .and_then(|text| text.chars().next())
                    .map_or(1, char::len_utf8);
                (rest.get(1 + width) == Some(&b'\'') && width > 1).then_some(at + 2 + width)
            };
            match end {
                Some(end) => {
                    blank(&mut out, at, end);
                    at = end;
                }
                None => at += 1,
            }
        } else {
            at += 1;
        }
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced")
}

/// The inline modules of `code` (`mod name { .. }`): their span, name, and
/// whether `#[cfg(test)]` gates them.
fn inline_modules(code: &str) -> Vec<(std::ops::Range<usize>, String, bool)> {
    let bytes = code.as_bytes();
    let mut modules = Vec::new();
    for (at, _) in code.match_indices("mod ") {
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue;
        }
        let rest = &code[at + 4..];
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let after_name = rest.trim_start()[name.len()..].trim_start();
        if name.is_empty() || !after_name.starts_with('{') {
            continue;
        }
        let open = code.len() - after_name.len();
        let mut depth = 0;
        let mut close = code.len();
        for (offset, byte) in bytes[open..].iter().enumerate() {
            match byte {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + offset + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        // The attributes before it: back to the end of the previous item.
        let item_start = code[..at].rfind([';', '}', '{']).map_or(0, |n| n + 1);
        let is_test = code[item_start..at].contains("#[cfg(test)]");
        modules.push((at..close, name, is_test));
    }
    modules
}

/// A path as written from `at` (`crate::a::{b, c::d}`): every full path it
/// names, as segments, with the name each brings in (`as` renames it).
fn paths_from(code: &str, at: usize) -> Vec<(Vec<String>, String)> {
    fn parse(
        code: &[u8],
        mut at: usize,
        mut segments: Vec<String>,
        out: &mut Vec<(Vec<String>, String)>,
    ) -> usize {
        let skip_space = |at: &mut usize| {
            while *at < code.len() && code[*at].is_ascii_whitespace() {
                *at += 1;
            }
        };
        loop {
            skip_space(&mut at);
            if code.get(at) == Some(&b'{') {
                at += 1;
                loop {
                    skip_space(&mut at);
                    match code.get(at) {
                        None => return at,
                        Some(b'}') => return at + 1,
                        Some(b',') => at += 1,
                        Some(_) => {
                            let before = at;
                            at = parse(code, at, segments.clone(), out);
                            if at == before {
                                at += 1;
                            }
                        }
                    }
                }
            }
            let start = at;
            while at < code.len() && (code[at].is_ascii_alphanumeric() || code[at] == b'_') {
                at += 1;
            }
            if start == at {
                break;
            }
            segments.push(String::from_utf8_lossy(&code[start..at]).into_owned());
            if code[at..].starts_with(b"::") {
                at += 2;
                continue;
            }
            let mut name = segments.last().cloned().unwrap_or_default();
            let mut after = at;
            skip_space(&mut after);
            if code[after..].starts_with(b"as ") {
                after += 3;
                skip_space(&mut after);
                let alias_start = after;
                while after < code.len()
                    && (code[after].is_ascii_alphanumeric() || code[after] == b'_')
                {
                    after += 1;
                }
                name = String::from_utf8_lossy(&code[alias_start..after]).into_owned();
                at = after;
            }
            if segments.last().is_some_and(|last| last == "self") {
                segments.pop();
                name = segments.last().cloned().unwrap_or_default();
            }
            out.push((segments, name));
            return at;
        }
        if !segments.is_empty() {
            let name = segments.last().cloned().unwrap_or_default();
            out.push((segments, name));
        }
        at
    }
    let mut out = Vec::new();
    parse(code.as_bytes(), at, Vec::new(), &mut out);
    out
}

/// A source file as module paths see it.
struct SourceFile {
    /// From `src`, for messages.
    relative: String,
    /// The module it is (`vfs/volume.rs`: `vfs::volume`; a `mod.rs` is its
    /// directory's module).
    module: Vec<String>,
    code: String,
}

/// Every module path `file` names outside its `#[cfg(test)]` modules, made
/// absolute (`crate::` dropped, `super::` resolved), with the line naming it.
fn absolute_references(file: &SourceFile) -> Vec<(Vec<String>, usize)> {
    let code = &file.code;
    let bytes = code.as_bytes();
    let modules = inline_modules(code);
    let mut found = Vec::new();
    for keyword in ["crate::", "super::"] {
        for (at, _) in code.match_indices(keyword) {
            let before = at.checked_sub(1).map(|n| bytes[n]);
            if before
                .is_some_and(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b':')
            {
                continue;
            }
            let enclosing: Vec<_> =
                modules.iter().filter(|(span, _, _)| span.contains(&at)).collect();
            if enclosing.iter().any(|(_, _, is_test)| *is_test) {
                continue;
            }
            let mut base = file.module.clone();
            let mut inner: Vec<_> =
                enclosing.iter().map(|(span, name, _)| (span.start, name)).collect();
            inner.sort();
            base.extend(inner.into_iter().map(|(_, name)| name.clone()));
            let line = code[..at].matches('\n').count() + 1;
            for (segments, _) in paths_from(code, at) {
                let supers = segments.iter().take_while(|segment| *segment == "super").count();
                let absolute: Vec<String> = if segments[0] == "crate" {
                    segments[1..].to_vec()
                } else if supers <= base.len() {
                    base[..base.len() - supers].iter().chain(&segments[supers..]).cloned().collect()
                } else {
                    continue;
                };
                found.push((absolute, line));
            }
        }
    }
    found
}

/// The names a directory module's `mod.rs` brings in with `use` from its
/// own children (`pub use volume::Volume`): name -> child.
fn names_used_from_children(
    mod_rs: &SourceFile,
    children: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let code = &mod_rs.code;
    let bytes = code.as_bytes();
    let mut names = BTreeMap::new();
    for (at, _) in code.match_indices("use ") {
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue;
        }
        for (segments, name) in paths_from(code, at + 4) {
            let segments: Vec<&String> =
                segments.iter().skip_while(|segment| *segment == "self").collect();
            if segments.len() > 1 && children.contains(segments[0].as_str()) {
                names.insert(name, segments[0].clone());
            }
        }
    }
    names
}

/// Within each directory module (`vfs`, `cache`, `meta`, ...), the files and
/// subdirectories are nodes and a `super::x` or `crate::module::x` naming a
/// sibling is an edge: the graph must have no cycle, so each file can be
/// read knowing only those below it. A name its `mod.rs` re-exports counts
/// as the file that defines it; what `mod.rs` defines itself is left out
/// (it declares every child, so it is above all of them). Test modules are
/// left out: they may name anything.
#[test]
fn sibling_files_import_each_other_without_cycles() {
    let source_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for path in rust_files(&source_root) {
        let relative = path.strip_prefix(&source_root).unwrap().to_string_lossy().into_owned();
        let mut module: Vec<String> =
            relative.trim_end_matches(".rs").split('/').map(str::to_string).collect();
        if module.last().is_some_and(|last| last == "mod" || last == "lib") {
            module.pop();
        }
        let code = code_only(&std::fs::read_to_string(&path).unwrap());
        files.push(SourceFile { relative, module, code });
    }
    files.sort_by(|a, b| a.relative.cmp(&b.relative));
    let directories: BTreeSet<Vec<String>> = files
        .iter()
        .filter(|file| file.relative.ends_with("mod.rs"))
        .map(|file| file.module.clone())
        .collect();
    let references: Vec<_> = files.iter().map(absolute_references).collect();
    let mut failures = Vec::new();
    let mut allowed_seen = BTreeSet::new();
    for directory in &directories {
        let depth = directory.len();
        let name = directory.join("::");
        let inside = |module: &[String]| module.len() > depth && module[..depth] == directory[..];
        let children: BTreeSet<String> = files
            .iter()
            .filter(|file| inside(&file.module))
            .map(|file| file.module[depth].clone())
            .collect();
        let mod_rs =
            files.iter().find(|file| file.module == *directory).expect("a directory module");
        let re_exported = names_used_from_children(mod_rs, &children);
        // from -> to -> where the first reference is.
        let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (file, found) in files.iter().zip(&references) {
            if !inside(&file.module) {
                continue;
            }
            let from = &file.module[depth];
            for (absolute, line) in found {
                if absolute.len() <= depth || absolute[..depth] != directory[..] {
                    continue;
                }
                let named = &absolute[depth];
                let Some(to) = children.get(named).or_else(|| re_exported.get(named)) else {
                    continue;
                };
                if to == from {
                    continue;
                }
                let allowed =
                    CYCLE_EDGES_ALLOWED.iter().any(|&(module, allowed_from, allowed_to)| {
                        module == name && allowed_from == from && allowed_to == to
                    });
                if allowed {
                    allowed_seen.insert((name.clone(), from.clone(), to.clone()));
                    continue;
                }
                edges
                    .entry(from.clone())
                    .or_default()
                    .entry(to.clone())
                    .or_insert_with(|| format!("{}:{line}", file.relative));
            }
        }
        if std::env::var_os("LAYERING_PRINT_EDGES").is_some() {
            for (from, targets) in &edges {
                let targets: Vec<&String> = targets.keys().collect();
                eprintln!("{name}: {from} -> {targets:?}");
            }
        }
        let reaches = |from: &str, to: &str| -> Option<Vec<String>> {
            // A shortest path, by breadth-first search.
            let mut previous: BTreeMap<String, String> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([from.to_string()]);
            while let Some(node) = queue.pop_front() {
                for next in edges.get(&node).into_iter().flat_map(|targets| targets.keys()) {
                    if next == to {
                        let mut path = vec![to.to_string(), node.clone()];
                        while let Some(before) = previous.get(path.last().unwrap()) {
                            path.push(before.clone());
                        }
                        path.reverse();
                        return Some(path);
                    }
                    if next != from && !previous.contains_key(next) {
                        previous.insert(next.clone(), node.clone());
                        queue.push_back(next.clone());
                    }
                }
            }
            None
        };
        let mut reported = BTreeSet::new();
        for node in &children {
            if reported.contains(node) {
                continue;
            }
            if let Some(cycle) = reaches(node, node) {
                reported.extend(cycle.iter().cloned());
                let steps: Vec<String> = cycle
                    .windows(2)
                    .map(|pair| {
                        format!("{} -> {} ({})", pair[0], pair[1], edges[&pair[0]][&pair[1]])
                    })
                    .collect();
                failures
                    .push(format!("{name}: a cycle between sibling files: {}", steps.join(", ")));
            }
        }
        for &(module, from, to) in CYCLE_EDGES_ALLOWED {
            if module == name
                && allowed_seen.contains(&(name.clone(), from.into(), to.into()))
                && reaches(to, from).is_none()
            {
                failures.push(format!(
                    "{name}: {from} -> {to} closes no cycle now: remove it from CYCLE_EDGES_ALLOWED"
                ));
            }
        }
    }
    for &(module, from, to) in CYCLE_EDGES_ALLOWED {
        if !allowed_seen.contains(&(module.into(), from.into(), to.into())) {
            failures.push(format!(
                "{module}: {from} no longer names {to}: remove it from CYCLE_EDGES_ALLOWED"
            ));
        }
    }
    assert!(failures.is_empty(), "cycles between a module's files:\n{}", failures.join("\n"));
}
