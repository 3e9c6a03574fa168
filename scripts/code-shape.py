#!/usr/bin/env python3
"""Measures the library's shape: functions, assertions and function length.

Walks crates/foliofs/src/**/*.rs and leaves out test code: items under a
`#[cfg(test)]` attribute (a `mod tests { ... }`, a helper `fn`, an `impl`),
`#[test]` functions, and files that are test-only modules (`#[cfg(test)]
mod tests;` in their parent, or `#![cfg(test)]` at their top). In the rest
it counts

  - functions: `fn` items with a body, methods and nested `fn`s included
    (trait methods without a body and `fn(..)` pointer types are not);
  - assertions: calls of `assert!`, `assert_eq!`, `assert_ne!`,
    `debug_assert!`, `debug_assert_eq!` and `debug_assert_ne!`;
  - each function's length, in lines from the line of `fn` to the line of
    its closing brace.

The scanner knows Rust's lexical rules where they matter for braces: line
and nested block comments, strings with escapes, raw strings (`r#"..."#`),
byte strings, char literals (`'{'`, `'\\''`, `'\\u{7f}'`) and lifetimes
(`'a`), so that a brace inside any of them counts for nothing.

Usage:
    scripts/code-shape.py             print totals, density, the files with
                                      the most functions and no assertion,
                                      and the functions over 70 lines
    scripts/code-shape.py --check     also exit 1 if the density is below
                                      0.25 assertions per function or a
                                      function is over 100 lines
    scripts/code-shape.py --files     also print every file's counts

Options: --root DIR (default crates/foliofs/src). Python 3 standard library
only.
"""

import argparse
import os
import sys

MIN_DENSITY = 0.25
MAX_LINES = 100
REPORT_LINES = 70
ASSERTS = {
    "assert",
    "assert_eq",
    "assert_ne",
    "debug_assert",
    "debug_assert_eq",
    "debug_assert_ne",
}

IDENT = "ident"
PUNCT = "punct"
LIT = "lit"


class Token:
    __slots__ = ("kind", "text", "line")

    def __init__(self, kind, text, line):
        self.kind = kind
        self.text = text
        self.line = line

    def __repr__(self):
        return f"{self.kind}:{self.text}@{self.line}"


def is_ident_start(c):
    return c == "_" or c.isalpha()


def is_ident_char(c):
    return c == "_" or c.isalnum()


def tokenize(src):
    """Rust source to identifiers, punctuation and opaque literals.

    Comments vanish; strings, raw strings and char literals become one
    `lit` token each; a lifetime becomes one `lit` token too. Numbers are
    identifiers (harmless: nothing below looks at them)."""
    tokens = []
    i = 0
    n = len(src)
    line = 1

    def count_lines(a, b):
        return src.count("\n", a, b)

    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
            continue
        if c.isspace():
            i += 1
            continue
        # Comments.
        if c == "/" and i + 1 < n and src[i + 1] == "/":
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if c == "/" and i + 1 < n and src[i + 1] == "*":
            depth = 1
            j = i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth += 1
                    j += 2
                elif src.startswith("*/", j):
                    depth -= 1
                    j += 2
                else:
                    j += 1
            line += count_lines(i, j)
            i = j
            continue
        # Raw strings and raw byte strings: r"..", r#".."#, br#".."#.
        if c in "rb":
            j = i
            if src[j] == "b" and j + 1 < n and src[j + 1] == "r":
                j += 1
            if src[j] == "r":
                k = j + 1
                hashes = 0
                while k < n and src[k] == "#":
                    hashes += 1
                    k += 1
                if k < n and src[k] == '"' and not (i > 0 and is_ident_char(src[i - 1])):
                    close = '"' + "#" * hashes
                    end = src.find(close, k + 1)
                    end = n if end < 0 else end + len(close)
                    tokens.append(Token(LIT, src[i:end], line))
                    line += count_lines(i, end)
                    i = end
                    continue
            # Byte strings and byte chars: b"..", b'..'.
            if c == "b" and i + 1 < n and src[i + 1] in "\"'":
                start = i
                i += 1
                c = src[i]
                if c == '"':
                    end = skip_string(src, i)
                else:
                    end = skip_char(src, i)
                    if end is None:
                        end = i + 1
                tokens.append(Token(LIT, src[start:end], line))
                line += count_lines(start, end)
                i = end
                continue
        if is_ident_start(c):
            j = i + 1
            while j < n and is_ident_char(src[j]):
                j += 1
            tokens.append(Token(IDENT, src[i:j], line))
            i = j
            continue
        if c.isdigit():
            j = i + 1
            while j < n and (is_ident_char(src[j]) or (src[j] == "." and j + 1 < n and src[j + 1].isdigit())):
                j += 1
            tokens.append(Token(IDENT, src[i:j], line))
            i = j
            continue
        if c == '"':
            end = skip_string(src, i)
            tokens.append(Token(LIT, src[i:end], line))
            line += count_lines(i, end)
            i = end
            continue
        if c == "'":
            end = skip_char(src, i)
            if end is not None:
                tokens.append(Token(LIT, src[i:end], line))
                i = end
                continue
            # A lifetime or a label: 'a, 'static, 'outer.
            j = i + 1
            while j < n and is_ident_char(src[j]):
                j += 1
            tokens.append(Token(LIT, src[i:j], line))
            i = j
            continue
        tokens.append(Token(PUNCT, c, line))
        i += 1
    return tokens


def skip_string(src, i):
    """The index past the string literal that opens at src[i] == '"'."""
    j = i + 1
    n = len(src)
    while j < n:
        if src[j] == "\\":
            j += 2
        elif src[j] == '"':
            return j + 1
        else:
            j += 1
    return n


def skip_char(src, i):
    """The index past a char literal at src[i] == "'", or None when it is a
    lifetime or label instead."""
    n = len(src)
    if i + 1 >= n:
        return None
    if src[i + 1] == "\\":
        # '\n', '\'', '\\', '\x7f', '\u{10ffff}'
        j = i + 3
        while j < n and src[j] != "'" and src[j] != "\n":
            j += 1
        return j + 1 if j < n and src[j] == "'" else None
    # 'x' (one char; Python strings index code points).
    if i + 2 < n and src[i + 2] == "'" and src[i + 1] != "\n":
        return i + 3
    return None


def matching(tokens, i):
    """The index of the bracket closing tokens[i] (one of ( [ {)."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    for j in range(i, len(tokens)):
        t = tokens[j]
        if t.kind != PUNCT:
            continue
        if t.text in pairs:
            stack.append(pairs[t.text])
        elif t.text in ")]}":
            if stack and stack[-1] == t.text:
                stack.pop()
                if not stack:
                    return j
    return len(tokens) - 1


def eval_cfg(tokens, i, end):
    """Evaluates the cfg predicate tokens[i:end] with `test` false.

    Returns (value, next index): value is False, True or None (unknown:
    a feature, a target, debug_assertions)."""
    t = tokens[i]
    if t.kind == IDENT and t.text in ("all", "any", "not") and i + 1 < end and tokens[i + 1].text == "(":
        close = matching(tokens, i + 1)
        args = []
        j = i + 2
        while j < close:
            value, j = eval_cfg(tokens, j, close)
            args.append(value)
            if j < close and tokens[j].text == ",":
                j += 1
        if t.text == "not":
            value = None if not args or args[0] is None else not args[0]
        elif t.text == "all":
            value = False if False in args else (None if None in args else True)
        else:
            value = True if True in args else (None if None in args else False)
        return value, close + 1
    if t.kind == IDENT and t.text == "test":
        return False, i + 1
    # Any other predicate: `unix`, `feature = "x"`, `debug_assertions`.
    j = i + 1
    while j < end and tokens[j].text != ",":
        j += 1
    return None, j


def attribute_is_test(tokens, start, close):
    """Whether the attribute tokens[start..=close] (`# [ ... ]`) marks test
    code: `#[test]` or a `#[cfg(..)]` false without `test`."""
    body = tokens[start + 2 : close]
    if not body:
        return False
    if len(body) == 1 and body[0].text == "test":
        return True
    if body[0].text == "cfg" and len(body) > 1 and body[1].text == "(":
        open_at = start + 3
        value, _ = eval_cfg(tokens, open_at + 1, matching(tokens, open_at))
        return value is False
    return False


def skip_item(tokens, i):
    """The index past the item (or statement) starting at tokens[i]: up to
    a `;` at depth 0, or the end of a `{ }` block at depth 0."""
    n = len(tokens)
    while i < n:
        t = tokens[i]
        if t.kind == PUNCT:
            if t.text == ";":
                return i + 1
            if t.text == "{":
                return matching(tokens, i) + 1
            if t.text in "([":
                i = matching(tokens, i) + 1
                continue
            if t.text in ")]}":
                # The end of an enclosing block: the item ended before it.
                return i
        i += 1
    return n


class Function:
    __slots__ = ("path", "name", "line", "end")

    def __init__(self, path, name, line, end):
        self.path = path
        self.name = name
        self.line = line
        self.end = end

    @property
    def lines(self):
        return self.end - self.line + 1


def scan(path, src):
    """(functions, assertions, test-only modules declared) of one file."""
    tokens = tokenize(src)
    functions = []
    assertions = 0
    test_modules = []
    n = len(tokens)
    i = 0
    # `#![cfg(test)]` at the top: the whole file is test code.
    while i + 1 < n and tokens[i].text == "#" and tokens[i + 1].text == "!":
        close = matching(tokens, i + 2)
        inner = [tokens[i]] + tokens[i + 2 : close + 1]
        if attribute_is_test(inner, 0, len(inner) - 1):
            return [], 0, []
        i = close + 1
    i = 0
    while i < n:
        t = tokens[i]
        if t.kind == PUNCT and t.text == "#" and i + 1 < n and tokens[i + 1].text == "[":
            close = matching(tokens, i + 1)
            if attribute_is_test(tokens, i, close):
                j = close + 1
                # Other attributes on the same item.
                while j + 1 < n and tokens[j].text == "#" and tokens[j + 1].text == "[":
                    j = matching(tokens, j + 1) + 1
                # `mod name;`: a test-only file.
                k = j
                if k < n and tokens[k].text == "pub":
                    k += 1
                    if k < n and tokens[k].text == "(":
                        k = matching(tokens, k) + 1
                if k + 2 < n and tokens[k].text == "mod" and tokens[k + 2].text == ";":
                    test_modules.append(tokens[k + 1].text)
                i = skip_item(tokens, j)
                continue
            i = close + 1
            continue
        if t.kind == IDENT and t.text in ASSERTS and i + 1 < n and tokens[i + 1].text == "!":
            # Not `macro_rules! assert`, and not a path like `x::assert!`.
            if not (i > 0 and tokens[i - 1].text == ":"):
                assertions += 1
            i += 2
            continue
        if t.kind == IDENT and t.text == "fn" and i + 1 < n and tokens[i + 1].kind == IDENT:
            name = tokens[i + 1].text
            j = i + 2
            while j < n:
                u = tokens[j]
                if u.kind == PUNCT and u.text in ";{":
                    break
                if u.kind == PUNCT and u.text in "([":
                    j = matching(tokens, j) + 1
                    continue
                j += 1
            if j < n and tokens[j].text == "{":
                end = matching(tokens, j)
                functions.append(Function(path, name, t.line, tokens[end].line))
                # Go on inside the body: nested fns, assertions.
                i = j + 1
                continue
            i = j + 1
            continue
        i += 1
    return functions, assertions, test_modules


def module_files(path, name):
    """The files `mod name;` in `path` may load."""
    directory = os.path.dirname(path)
    base = os.path.basename(path)
    if base not in ("mod.rs", "lib.rs", "main.rs"):
        directory = os.path.join(directory, base[: -len(".rs")])
    return [os.path.join(directory, name + ".rs"), os.path.join(directory, name, "mod.rs")]


def collect(root):
    paths = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".rs"):
                paths.append(os.path.join(directory, f))
    results = {}
    excluded = set()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            src = f.read()
        functions, assertions, test_modules = scan(path, src)
        results[path] = (functions, assertions)
        for name in test_modules:
            excluded.update(module_files(path, name))
    # A test-only module's own submodules are test code too.
    changed = True
    while changed:
        changed = False
        for path in paths:
            if path in excluded:
                continue
            for e in list(excluded):
                stem = e[: -len("mod.rs")] if e.endswith("mod.rs") else e[: -len(".rs")] + os.sep
                if path.startswith(stem) and path not in excluded:
                    excluded.add(path)
                    changed = True
    kept = {p: r for p, r in results.items() if p not in excluded}
    return kept, sorted(p for p in excluded if p in results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail below the floor")
    parser.add_argument("--files", action="store_true", help="print every file's counts")
    parser.add_argument("--root", default=None, help="the crate source (crates/foliofs/src)")
    args = parser.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = args.root or os.path.join(repo, "crates", "foliofs", "src")
    results, excluded = collect(root)

    def rel(p):
        return os.path.relpath(p, root)

    functions = [f for fs, _ in results.values() for f in fs]
    assertions = sum(a for _, a in results.values())
    density = assertions / len(functions) if functions else 0.0
    lengths = sorted(f.lines for f in functions)
    median = lengths[len(lengths) // 2] if lengths else 0
    print(f"{args.root or 'crates/foliofs/src'}: {len(results)} files "
          f"({len(excluded)} test-only left out)")
    print(f"functions:  {len(functions)}")
    print(f"assertions: {assertions}")
    print(f"density:    {density:.2f} assertions per function (floor {MIN_DENSITY})")
    print(f"length:     median {median} lines, longest {lengths[-1] if lengths else 0}")

    bare = sorted(
        ((len(fs), rel(p)) for p, (fs, a) in results.items() if a == 0 and fs),
        key=lambda x: (-x[0], x[1]),
    )
    print("\nfiles with the most functions and no assertion:")
    for count, p in bare[:10]:
        print(f"  {count:4} functions  {p}")
    if not bare:
        print("  none")

    long = sorted((f for f in functions if f.lines > REPORT_LINES), key=lambda f: -f.lines)
    print(f"\nfunctions over {REPORT_LINES} lines:")
    for f in long:
        mark = "  (over the limit)" if f.lines > MAX_LINES else ""
        print(f"  {f.lines:4} lines  {f.name}  {rel(f.path)}:{f.line}{mark}")
    if not long:
        print("  none")

    if args.files:
        print("\nper file (functions, assertions):")
        for p in sorted(results):
            fs, a = results[p]
            print(f"  {len(fs):4} {a:4}  {rel(p)}")

    if args.check:
        failures = []
        if density < MIN_DENSITY:
            failures.append(f"density {density:.2f} is below {MIN_DENSITY}")
        for f in long:
            if f.lines > MAX_LINES:
                failures.append(f"{rel(f.path)}:{f.line} `{f.name}` is {f.lines} lines (at most {MAX_LINES})")
        if failures:
            for failure in failures:
                print(f"code-shape: {failure}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
