//! Keeps ARCHITECTURE.md true to the code it describes: the public names it
//! lists are the ones `src/lib.rs` exports, the number of logical records is
//! the number of `Record` variants, each module's paragraph names the
//! modules `tests/layering.rs` allows it, and every file and function it
//! cites exists. Plain string handling, as `tests/layering.rs` reads the
//! sources; paths in the documents are from the repository root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The documents whose citations are checked.
const DOCUMENTS: &[&str] =
    &["ARCHITECTURE.md", "crates/foliofs-fuse/ARCHITECTURE.md", "docs/metadata.md"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn architecture() -> String {
    read("ARCHITECTURE.md")
}

/// The words of the first fenced block after the line `heading`.
fn fenced_words(doc: &str, heading: &str) -> BTreeSet<String> {
    let mut lines = doc.lines().skip_while(|line| line.trim() != heading);
    assert!(
        lines.next().is_some(),
        "ARCHITECTURE.md has no `{heading}` heading; keep it, followed by a ```text block"
    );
    let mut lines = lines.skip_while(|line| !line.starts_with("```"));
    assert!(lines.next().is_some(), "ARCHITECTURE.md: no fenced block under `{heading}`");
    lines
        .take_while(|line| !line.starts_with("```"))
        .flat_map(|line| line.split_whitespace())
        .map(str::to_string)
        .collect()
}

/// What `lib.rs` makes public.
#[derive(Default)]
struct LibItems {
    uses: BTreeSet<String>,
    hidden_uses: BTreeSet<String>,
    mods: BTreeSet<String>,
    hidden_mods: BTreeSet<String>,
}

/// The name a `use` path brings in: its last segment, or what `as` renames it to.
fn used_name(path: &str) -> String {
    let path = path.trim();
    let name = path.rsplit(" as ").next().unwrap_or(path);
    name.rsplit("::").next().unwrap_or(name).trim().to_string()
}

fn lib_items() -> LibItems {
    let source = read("crates/foliofs/src/lib.rs");
    let code: String = source
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .map(|line| format!("{line}\n"))
        .collect();
    let mut items = LibItems::default();
    for statement in code.split(';') {
        let (keyword_at, is_use) = match (statement.find("pub use "), statement.find("pub mod ")) {
            (Some(at), _) => (at, true),
            (None, Some(at)) => (at, false),
            (None, None) => continue,
        };
        let hidden = statement[..keyword_at].contains("#[doc(hidden)]");
        let rest = statement[keyword_at + "pub use ".len()..].trim();
        if !is_use {
            let set = if hidden { &mut items.hidden_mods } else { &mut items.mods };
            set.insert(rest.to_string());
            continue;
        }
        let names: Vec<String> = match (rest.find('{'), rest.rfind('}')) {
            (Some(open), Some(close)) => {
                let inner = &rest[open + 1..close];
                assert!(!inner.contains('{'), "lib.rs: nested braces in `pub use {rest}`");
                inner.split(',').filter(|part| !part.trim().is_empty()).map(used_name).collect()
            }
            _ => vec![used_name(rest)],
        };
        let set = if hidden { &mut items.hidden_uses } else { &mut items.uses };
        set.extend(names);
    }
    items
}

fn assert_same(doc_heading: &str, listed: &BTreeSet<String>, code: &BTreeSet<String>, what: &str) {
    let missing: Vec<_> = code.difference(listed).collect();
    let extra: Vec<_> = listed.difference(code).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "ARCHITECTURE.md `{doc_heading}` disagrees with crates/foliofs/src/lib.rs's {what}: \
         add {missing:?} to the list, remove {extra:?} from it"
    );
}

#[test]
fn the_public_names_listed_are_the_ones_lib_rs_exports() {
    let doc = architecture();
    let code = lib_items();
    assert!(!code.uses.is_empty() && !code.hidden_mods.is_empty(), "lib.rs parsed to nothing");
    let checks = [
        ("### Re-exported names", &code.uses, "`pub use` (not hidden)"),
        ("### Hidden re-exports", &code.hidden_uses, "`#[doc(hidden)] pub use`"),
        ("### Public modules", &code.mods, "`pub mod` (not hidden)"),
        ("### Hidden modules", &code.hidden_mods, "`#[doc(hidden)] pub mod`"),
    ];
    for (heading, names, what) in checks {
        assert_same(heading, &fenced_words(&doc, heading), names, what);
    }
}

/// The variant names of `pub enum Record` in format/record.rs.
fn record_variants() -> Vec<String> {
    let source = read("crates/foliofs/src/format/record.rs");
    let start = source.find("pub enum Record {").expect("record.rs has `pub enum Record {`");
    let mut depth = 0i32;
    let mut variants = Vec::new();
    for line in source[start..].lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("//") || trimmed.starts_with('#') {
            continue;
        }
        if depth == 1 && trimmed.starts_with(|c: char| c.is_ascii_uppercase()) {
            let name: String =
                trimmed.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            variants.push(name);
        }
        depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
        if depth == 0 {
            break;
        }
    }
    variants
}

/// Backticked spans outside fenced blocks, with their byte ranges in the
/// returned text (fenced lines blanked, so positions stay comparable).
fn code_spans(doc: &str) -> (String, Vec<(usize, usize, String)>) {
    let mut text = String::new();
    let mut fenced = false;
    for line in doc.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            text.push('\n');
            continue;
        }
        if !fenced {
            text.push_str(line);
        }
        text.push('\n');
    }
    let mut spans = Vec::new();
    let mut at = 0;
    while let Some(open) = text[at..].find('`').map(|i| at + i) {
        let Some(close) = text[open + 1..].find('`').map(|i| open + 1 + i) else { break };
        spans.push((open, close + 1, text[open + 1..close].to_string()));
        at = close + 1;
    }
    (text, spans)
}

#[test]
fn the_record_count_is_the_number_of_record_variants() {
    let variants = record_variants();
    assert!(!variants.is_empty(), "no variants parsed from `pub enum Record`");
    let doc = architecture();
    let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut stated = 0;
    for (at, _) in flat.match_indices(" logical records") {
        let count = flat[..at].rsplit(' ').next().unwrap_or("");
        assert_eq!(
            count.parse::<usize>().ok(),
            Some(variants.len()),
            "ARCHITECTURE.md says `{count} logical records`; `enum Record` in \
             crates/foliofs/src/format/record.rs has {} variants: write the number in digits",
            variants.len()
        );
        stated += 1;
    }
    assert!(stated > 0, "ARCHITECTURE.md should say `N logical records: `A`, `B`, ...`");
    let listed_from = flat.find(" logical records: ").expect("list the records after a colon");
    let listed_text = &flat[listed_from..];
    let listed_text = &listed_text[..listed_text.find(". ").unwrap_or(listed_text.len())];
    let (_, spans) = code_spans(listed_text);
    let listed: BTreeSet<String> = spans.into_iter().map(|(_, _, name)| name).collect();
    let variants: BTreeSet<String> = variants.into_iter().collect();
    assert_same("logical records", &listed, &variants, "`enum Record` variants (record.rs)");
}

fn is_path(token: &str) -> bool {
    const EXTENSIONS: &[&str] = &[".rs", ".md", ".h", ".sh", ".toml", ".list"];
    let plain = !token.is_empty()
        && !token.starts_with('/')
        && !token.contains(|c: char| c.is_whitespace() || ":<>*{}()=#,".contains(c));
    plain && (token.contains('/') || EXTENSIONS.iter().any(|ext| token.ends_with(ext)))
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `keyword name` appears in `source` with `name` not continuing.
fn declares(source: &str, keyword: &str, name: &str) -> bool {
    let needle = format!("{keyword} {name}");
    source.match_indices(&needle).any(|(at, _)| {
        let after = source[at + needle.len()..].chars().next();
        let before = source[..at].chars().next_back();
        !after.is_some_and(is_ident_char) && !before.is_some_and(is_ident_char)
    })
}

/// Whether `cited` (a function, a type, or a literal snippet) is in `source`.
fn cited_in(source: &str, cited: &str) -> bool {
    if !cited.chars().all(|c| is_ident_char(c) || c == ':') {
        return source.contains(cited);
    }
    let name = cited.rsplit("::").next().unwrap_or(cited);
    if name.starts_with(|c: char| c.is_ascii_uppercase()) {
        ["struct", "enum", "trait", "type", "const", "static"]
            .iter()
            .any(|keyword| declares(source, keyword, name))
    } else {
        declares(source, "fn", name)
    }
}

/// Only spaces, commas and `and` between two citations of one file.
fn continues_citation(gap: &str) -> bool {
    gap.split_whitespace().all(|word| matches!(word.trim_matches(','), "" | "and"))
}

#[test]
fn every_cited_path_and_function_exists() {
    let root = repo_root();
    let mut problems = Vec::new();
    for document in DOCUMENTS {
        let (text, spans) = code_spans(&read(document));
        let mut citing: Option<(String, String)> = None;
        let mut previous_end = 0;
        for (start, end, token) in spans {
            let continues = continues_citation(&text[previous_end..start]);
            previous_end = end;
            if is_path(&token) {
                let path = root.join(&token);
                citing = None;
                if !path.exists() {
                    problems.push(format!("{document}: `{token}` does not exist; fix the path"));
                } else if path.is_file() {
                    citing = Some((token.clone(), std::fs::read_to_string(&path).unwrap()));
                }
                continue;
            }
            if !continues {
                citing = None;
            }
            if let Some((file, source)) = &citing {
                if !cited_in(source, &token) {
                    problems.push(format!(
                        "{document}: `{token}` is cited in `{file}`, which has no such \
                         function, type or text; rename the citation or cite the right file"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "stale citations:\n{}", problems.join("\n"));
}

/// `ALLOWED` of tests/layering.rs: module -> the modules it may name.
fn layering_rules() -> BTreeMap<String, BTreeSet<String>> {
    let source = read("crates/foliofs/tests/layering.rs");
    let start = source.find("const ALLOWED").expect("layering.rs has `const ALLOWED`");
    let body = &source[start..];
    let body = &body[..body.find("\n];").expect("ALLOWED ends with `];`")];
    let body: String = body
        .lines()
        .filter(|line| !line.trim().starts_with("//"))
        .flat_map(|line| line.chars().filter(|c| !c.is_whitespace()))
        .collect();
    let mut rules = BTreeMap::new();
    let mut rest = body.as_str();
    while let Some(open) = rest.find("(\"") {
        rest = &rest[open + 2..];
        let name_end = rest.find('"').expect("module name ends with a quote");
        let module = rest[..name_end].to_string();
        let list_start = rest.find("&[").expect("a module's list starts with `&[`") + 2;
        let list_end = list_start + rest[list_start..].find(']').expect("list ends with `]`");
        let allowed = rest[list_start..list_end]
            .split(',')
            .map(|name| name.trim().trim_matches('"').to_string())
            .filter(|name| !name.is_empty())
            .collect();
        rules.insert(module, allowed);
        rest = &rest[list_end..];
    }
    rules
}

/// Each `- **`module`** ...` paragraph of the library's code map, with the
/// modules after its `May name:`.
fn documented_rules(doc: &str) -> BTreeMap<String, BTreeSet<String>> {
    let section: Vec<&str> = doc
        .lines()
        .skip_while(|line| !line.starts_with("### The library"))
        .skip(1)
        .take_while(|line| !line.starts_with('#'))
        .collect();
    assert!(!section.is_empty(), "ARCHITECTURE.md has no `### The library` code map");
    let mut paragraphs: Vec<String> = Vec::new();
    for line in section {
        if line.starts_with("- ") {
            paragraphs.push(line.to_string());
        } else if line.trim().is_empty() {
            paragraphs.push(String::new());
        } else if let Some(last) = paragraphs.last_mut() {
            last.push(' ');
            last.push_str(line.trim());
        }
    }
    let mut rules = BTreeMap::new();
    for paragraph in paragraphs.iter().filter(|p| p.starts_with("- **`")) {
        let name_part = &paragraph["- **`".len()..];
        let module = name_part[..name_part.find("`**").expect("`**` closes the name")].to_string();
        let Some(at) = paragraph.find("May name:") else {
            panic!("ARCHITECTURE.md: the paragraph of `{module}` needs a `May name:` sentence");
        };
        let list = &paragraph[at + "May name:".len()..];
        let list = &list[..list.find('.').unwrap_or(list.len())];
        let (_, spans) = code_spans(list);
        rules.insert(module, spans.into_iter().map(|(_, _, name)| name).collect());
    }
    rules
}

#[test]
fn each_module_paragraph_names_what_layering_allows() {
    let code = layering_rules();
    assert!(code.len() > 10, "ALLOWED parsed to {} modules only", code.len());
    let doc = documented_rules(&architecture());
    let mut problems = Vec::new();
    for (module, allowed) in &code {
        match doc.get(module) {
            None => problems.push(format!("module `{module}` has no paragraph in the code map")),
            Some(listed) if listed != allowed => problems.push(format!(
                "`{module}`: the paragraph says it may name {listed:?}; tests/layering.rs \
                 allows {allowed:?}"
            )),
            Some(_) => {}
        }
    }
    for module in doc.keys().filter(|module| !code.contains_key(*module)) {
        problems.push(format!("`{module}` has a paragraph but is not in tests/layering.rs"));
    }
    assert!(problems.is_empty(), "ARCHITECTURE.md's code map:\n{}", problems.join("\n"));
}

#[test]
fn no_run_labels() {
    for document in DOCUMENTS {
        let text = read(document);
        let labels: BTreeSet<&str> = text
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|word| {
                word.len() > 1
                    && word.starts_with('r')
                    && word[1..].chars().all(|c| c.is_ascii_digit())
            })
            .collect();
        assert!(
            labels.is_empty(),
            "{document} names benchmark runs {labels:?}: describe the design, and cite dates \
             and commits; measurements belong in docs/BENCHMARKS.md"
        );
    }
}
