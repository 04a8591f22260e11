//! The house rules the suite keeps (`cargo xtask house`, and a test of this crate): no
//! source file outside tests, benches and fixtures past [`MAX_LINES`] lines counted whole,
//! and no cycle between the modules of a crate.
//!
//! A cycle is counted between siblings: when module `a::x` names `a::y::z`, that is an
//! edge from `a::x` to `a::y` (a parent naming its child, or a child its parent, is how
//! modules are built and never counts). Names are read from `use` trees and from
//! `crate::`, `super::` and `self::` paths in the code, with comments, strings and inline
//! `mod tests` blocks left out; files named `tests.rs` or `*_tests.rs` are tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

mod repeats;

/// The most lines a source file may have, its inline tests included.
pub const MAX_LINES: usize = 800;

/// What breaks a rule, one line each.
pub fn problems(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for f in source_files(root)? {
        let n = std::fs::read_to_string(&f)?.lines().count();
        if n > MAX_LINES && !is_test_path(Path::new(&rel(root, &f))) {
            out.push(format!(
                "{} has {n} lines (at most {MAX_LINES}): split it along its seams",
                rel(root, &f)
            ));
        }
    }
    for copy in repeats::copies(&repeats::workspace_sources(root)?) {
        out.push(format!("copied code: {copy}: say it once"));
    }
    for krate in crate_roots(root)? {
        for c in module_cycles(&krate)? {
            out.push(format!("{}: modules in a cycle: {}", rel(root, &krate), c));
        }
    }
    Ok(out)
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

/// Tests, benches and fixtures (`p` relative to the workspace root, or a file name).
fn is_test_path(p: &Path) -> bool {
    let s = format!("/{}", p.to_string_lossy());
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    ["/tests/", "/benches/", "/fixtures/"]
        .iter()
        .any(|d| s.contains(d))
        || name == "tests.rs"
        || name.ends_with("_tests.rs")
}

/// Every `.rs` file of the workspace's crates (target and the fuzz workspace's build
/// outputs left out).
fn source_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            if p.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "node_modules") {
                    stack.push(p);
                }
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The crate roots: every `src/lib.rs`, `src/main.rs` and `src/bin/*/main.rs`.
fn crate_roots(root: &Path) -> Result<Vec<PathBuf>> {
    Ok(source_files(root)?
        .into_iter()
        .filter(|p| {
            let s = p.to_string_lossy();
            !is_test_path(Path::new(&rel(root, p)))
                && (s.ends_with("/src/lib.rs")
                    || s.ends_with("/src/main.rs")
                    || (s.contains("/src/bin/") && s.ends_with("/main.rs")))
        })
        .collect())
}

type ModPath = Vec<String>;

/// The cycles among the modules of the crate rooted at `root_file`, each as
/// `a -> b -> a` with one example reference per edge.
pub fn module_cycles(root_file: &Path) -> Result<Vec<String>> {
    let mods = module_tree(root_file)?;
    let mut edges: BTreeMap<ModPath, BTreeMap<ModPath, String>> = BTreeMap::new();
    for (m, file) in &mods {
        if is_test_path(Path::new(file.file_name().unwrap_or_default())) {
            continue;
        }
        let code = without_tests(&strip_comments_and_strings(&std::fs::read_to_string(file)?));
        for path in referenced_paths(&code) {
            let Some(target) = resolve(&mods, m, &path) else {
                continue;
            };
            let common = m.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common == m.len() || common == target.len() {
                continue; // an ancestor or a descendant
            }
            edges
                .entry(m[..=common].to_vec())
                .or_default()
                .entry(target[..=common].to_vec())
                .or_insert(path);
        }
    }
    Ok(strongly_connected(&edges)
        .into_iter()
        .map(|comp| {
            let set: BTreeSet<&ModPath> = comp.iter().collect();
            let mut parts = Vec::new();
            for a in &comp {
                for (b, why) in &edges[a] {
                    if set.contains(b) {
                        parts.push(format!("{} -> {} ({why})", a.join("::"), b.join("::")));
                    }
                }
            }
            parts.join("; ")
        })
        .collect())
}

/// Module path -> file, following `mod x;` declarations from the crate root.
fn module_tree(root_file: &Path) -> Result<BTreeMap<ModPath, PathBuf>> {
    let mut mods = BTreeMap::new();
    let mut stack = vec![(Vec::new(), root_file.to_path_buf())];
    while let Some((m, file)) = stack.pop() {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let code = without_tests(&strip_comments_and_strings(&text));
        let stem = file
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let parent = file.parent().unwrap_or(Path::new("."));
        // lib.rs, main.rs and mod.rs own the folder they are in; x.rs owns x/.
        let dir = if m.is_empty() || stem == "mod" {
            parent.to_path_buf()
        } else {
            parent.join(&stem)
        };
        for name in declared_modules(&code) {
            for cand in [
                dir.join(format!("{name}.rs")),
                dir.join(&name).join("mod.rs"),
            ] {
                if cand.is_file() {
                    let mut child = m.clone();
                    child.push(name.clone());
                    stack.push((child, cand));
                    break;
                }
            }
        }
        mods.insert(m, file);
    }
    Ok(mods)
}

/// The names of `mod x;` declarations (inline `mod x { ... }` blocks are part of the file).
fn declared_modules(code: &str) -> Vec<String> {
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ';'))
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .filter(|w| w[0] == "mod" && w[1].ends_with(';'))
        .map(|w| w[1].trim_end_matches(';').to_string())
        .collect()
}

/// `code` up to an inline `#[cfg(test)] mod tests {` block (always the file's last item).
fn without_tests(code: &str) -> String {
    let mut at = None;
    for (i, _) in code.match_indices("#[cfg(") {
        let rest = &code[i..];
        let Some(close) = rest.find(")]") else {
            continue;
        };
        if !rest[..close].contains("test") {
            continue;
        }
        let after = rest[close + 2..].trim_start();
        if after.starts_with("mod tests")
            && after["mod tests".len()..].trim_start().starts_with('{')
        {
            at = Some(i);
            break;
        }
    }
    code[..at.unwrap_or(code.len())].to_string()
}

/// Comments removed; string and character literals emptied (a path in a string or a
/// comment is not a dependency). Line breaks are kept, so line numbers still hold.
pub fn strip_comments_and_strings(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let prev_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let skipped_to = if b[i..].starts_with(b"//") {
            src[i..].find('\n').map_or(b.len(), |j| i + j)
        } else if b[i..].starts_with(b"/*") {
            src[i + 2..].find("*/").map_or(b.len(), |j| i + 2 + j + 2)
        } else if (c == b'r' || c == b'b') && !prev_ident && raw_string_start(&b[i..]).is_some() {
            let (skip, hashes) = raw_string_start(&b[i..]).unwrap_or((0, 0));
            let end = format!("\"{}", "#".repeat(hashes));
            out.push_str("\"\"");
            src[i + skip..]
                .find(&end)
                .map_or(b.len(), |j| i + skip + j + end.len())
        } else if c == b'"' || (c == b'\'' && is_char_literal(&b[i..])) {
            let mut j = i + 1;
            while j < b.len() && b[j] != c {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            if c == b'"' {
                out.push_str("\"\"");
            }
            (j + 1).min(b.len())
        } else {
            // Copy one whole UTF-8 character.
            let len = src[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&src[i..i + len]);
            i += len;
            continue;
        };
        let skipped = &b[i..skipped_to.min(b.len())];
        out.extend(skipped.iter().filter(|&&x| x == b'\n').map(|_| '\n'));
        i = skipped_to;
    }
    out
}

/// `r"`, `r#"`, `br"`...: the bytes to skip to the content and the number of `#`.
fn raw_string_start(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = usize::from(b.first() == Some(&b'b'));
    if b.get(i) != Some(&b'r') {
        return None;
    }
    i += 1;
    let hashes = b[i..].iter().take_while(|&&c| c == b'#').count();
    (b.get(i + hashes) == Some(&b'"')).then_some((i + hashes + 1, hashes))
}

/// `'x'` or `'\n'` (a lifetime `'a` has no closing quote right after).
fn is_char_literal(b: &[u8]) -> bool {
    match b.get(1) {
        Some(b'\\') => true,
        Some(_) => {
            let len = std::str::from_utf8(&b[1..b.len().min(5)])
                .ok()
                .or_else(|| std::str::from_utf8(&b[1..b.len().min(2)]).ok())
                .and_then(|s| s.chars().next())
                .map_or(1, char::len_utf8);
            b.get(1 + len) == Some(&b'\'')
        }
        None => false,
    }
}

/// Every path a `use` tree names, expanded (`use a::{b, c::d}` is `a::b` and `a::c::d`),
/// and every `crate::`, `super::` or `self::` path in the code.
pub fn referenced_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = find_word(rest, "use") {
        let tail = &rest[i + 3..];
        let Some(end) = tail.find(';') else { break };
        // `x as y` keeps its rename apart as `x@y`; other blanks go.
        let tree = tail[..end].split_whitespace().collect::<Vec<_>>().join(" ");
        let tree = tree.replace(" as ", "@").replace(' ', "");
        expand_use("", &tree, &mut out);
        rest = &tail[end..];
    }
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        for (i, _) in code.match_indices(start) {
            if i > 0
                && (bytes[i - 1].is_ascii_alphanumeric()
                    || bytes[i - 1] == b'_'
                    || bytes[i - 1] == b':')
            {
                continue;
            }
            let len = code[i..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(code.len() - i);
            out.push(code[i..i + len].trim_end_matches(':').to_string());
        }
    }
    out
}

fn find_word(s: &str, w: &str) -> Option<usize> {
    let b = s.as_bytes();
    s.match_indices(w).map(|(i, _)| i).find(|&i| {
        let before = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let after = b.get(i + w.len()).is_some_and(|c| c.is_ascii_whitespace());
        before && after
    })
}

fn expand_use(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let mut depth = 0;
    let mut part = String::new();
    let mut parts = Vec::new();
    for c in tree.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            parts.push(std::mem::take(&mut part));
        } else {
            part.push(c);
        }
    }
    parts.push(part);
    for p in parts.into_iter().filter(|p| !p.is_empty()) {
        match (p.find('{'), p.rfind('}')) {
            (Some(open), Some(close)) => {
                expand_use(&format!("{prefix}{}", &p[..open]), &p[open + 1..close], out)
            }
            _ => out.push(format!("{prefix}{p}")),
        }
    }
}

/// The module a path names from module `from` (the longest prefix that is a module), or
/// None for a path outside the crate.
fn resolve(mods: &BTreeMap<ModPath, PathBuf>, from: &ModPath, path: &str) -> Option<ModPath> {
    let path = path.split('@').next().unwrap_or(path);
    let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: ModPath = match *segs.first()? {
        "crate" => {
            segs.remove(0);
            Vec::new()
        }
        "super" | "self" => {
            let mut b = from.clone();
            while let Some(&s) = segs.first() {
                match s {
                    "super" => {
                        b.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                segs.remove(0);
            }
            b
        }
        first => {
            // 2018 paths: a child module of this one by its bare name.
            let mut child = from.clone();
            child.push(first.to_string());
            if !mods.contains_key(&child) {
                return None;
            }
            from.clone()
        }
    };
    for s in segs {
        base.push(s.to_string());
        if !mods.contains_key(&base) {
            base.pop();
            break;
        }
    }
    Some(base)
}

/// Tarjan's strongly connected components of more than one node.
fn strongly_connected(g: &BTreeMap<ModPath, BTreeMap<ModPath, String>>) -> Vec<Vec<ModPath>> {
    struct T<'a> {
        g: &'a BTreeMap<ModPath, BTreeMap<ModPath, String>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on: BTreeSet<&'a ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a ModPath) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        if let Some(next) = t.g.get(v) {
            for w in next.keys() {
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(lw));
                } else if t.on.contains(w) {
                    let iw = t.index[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(iw));
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[cfg(test)]
mod tests;
