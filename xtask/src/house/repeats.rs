//! Copied code: runs of [`RUN_LINES`] or more lines that stand to the letter in two places
//! of the workspace's sources (tests, benches, fixtures and inline `mod tests` left out).
//!
//! Lines are compared as `duplicates` compares them: white space folded; blank lines,
//! comment lines, `use` lines and lines of punctuation alone passed over. A run that stands
//! in more than [`TOO_COMMON`] places is a shape of the language, not a copy, and is not
//! reported; nor is a run of declarations and data alone (a signature a trait or an enum
//! dispatch repeats, a field list, a destructuring, a list of literals): the rule is that
//! no logic is written twice, and such a run holds none. Runs alike only in shape (other
//! names, other numbers) are not this check's business.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// How many kept lines make a copy.
pub const RUN_LINES: usize = 6;
/// A run standing in more places than this is too common to be a copy.
const TOO_COMMON: usize = 8;

/// One kept line: its text and its line number in the file (1-based).
struct Line {
    text: String,
    at: usize,
}

/// The lines of `code` that take part in the comparison.
fn kept_lines(code: &str) -> Vec<Line> {
    code.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let text = l.split_whitespace().collect::<Vec<_>>().join(" ");
            let thin = !text.chars().any(char::is_alphanumeric);
            let skip = thin
                || text.starts_with("//")
                || text.starts_with("use ")
                || text.starts_with("pub use ")
                || text.starts_with("pub(crate) use ");
            (!skip).then_some(Line { text, at: i + 1 })
        })
        .collect()
}

/// A line that declares or lists and does nothing: a signature's opening, receiver,
/// typed parameter or closing; a field; a name in a destructuring; a literal in a list.
fn is_declaration(line: &str) -> bool {
    let l = line
        .trim_start_matches("pub ")
        .trim_start_matches("pub(crate) ")
        .trim_start_matches("pub(super) ")
        .trim_start_matches("async ")
        .trim_start_matches("unsafe ");
    let ident = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_alphanumeric() || c == '_');
    let typed = |l: &str| {
        l.strip_suffix(',')
            .and_then(|b| b.split_once(": "))
            .is_some_and(|(name, ty)| ident(name) && !ty.contains(['(', '.', '"', '=', '!']))
    };
    let opening = |l: &str| {
        l.strip_suffix(" {").is_some_and(|h| {
            let h = h.trim_start_matches("let ").trim_start_matches("struct ");
            h.split("::").all(ident)
        })
    };
    let literal = |l: &str| {
        l.strip_suffix(',').unwrap_or(l).starts_with('"')
            && l.strip_suffix(',').unwrap_or(l).ends_with('"')
    };
    (l.starts_with("fn ") && l.ends_with('('))
        || matches!(l, "&self," | "&mut self," | "self," | "mut self,")
        || typed(l)
        || l.strip_suffix(',').is_some_and(ident)
        || (l.starts_with(") -> ") && (l.ends_with(" {") || l.ends_with(';')))
        || (l.starts_with("} = ") && l.ends_with(';'))
        || opening(l)
        || literal(l)
}

/// Every copied run between `files` (path, code), merged into maximal runs, as
/// `a.rs:10-24 ~ b.rs:40-54`.
pub fn copies(files: &[(PathBuf, String)]) -> Vec<String> {
    let kept: Vec<Vec<Line>> = files.iter().map(|(_, code)| kept_lines(code)).collect();
    let mut by_text: HashMap<Vec<&str>, Vec<(usize, usize)>> = HashMap::new();
    for (f, lines) in kept.iter().enumerate() {
        for (i, w) in lines.windows(RUN_LINES).enumerate() {
            let key: Vec<&str> = w.iter().map(|l| l.text.as_str()).collect();
            by_text.entry(key).or_default().push((f, i));
        }
    }
    // (file a, window a, file b, window b) for every pair of places of a run.
    let mut pairs = Vec::new();
    for at in by_text.values() {
        if at.len() < 2 || at.len() > TOO_COMMON {
            continue;
        }
        let (f, w) = at[0];
        if kept[f][w..w + RUN_LINES]
            .iter()
            .all(|l| is_declaration(&l.text))
        {
            continue;
        }
        for (x, &(fa, ia)) in at.iter().enumerate() {
            for &(fb, ib) in &at[x + 1..] {
                if fa == fb && ia.abs_diff(ib) < RUN_LINES {
                    continue; // a run overlapping itself (a repeated line)
                }
                pairs.push((fa, ia, fb, ib));
            }
        }
    }
    pairs.sort_unstable();
    let mut out = Vec::new();
    let mut i = 0;
    while i < pairs.len() {
        let (fa, ia, fb, ib) = pairs[i];
        let mut n = 1;
        while pairs[i + n..].first() == Some(&(fa, ia + n, fb, ib + n)) {
            n += 1;
        }
        let span = |f: usize, w: usize| {
            let l = &kept[f];
            format!(
                "{}:{}-{}",
                files[f].0.display(),
                l[w].at,
                l[w + n - 1 + RUN_LINES - 1].at
            )
        };
        out.push(format!("{} ~ {}", span(fa, ia), span(fb, ib)));
        // The windows merged into this run are done; a pair may still start inside it
        // against another place, so only skip the ones that continue this run.
        let done: Vec<_> = (0..n).map(|k| (fa, ia + k, fb, ib + k)).collect();
        pairs.retain(|p| !done[1..].contains(p));
        i += 1;
    }
    out
}

/// The workspace's non-test sources, relative to `root`, with inline tests cut off.
pub fn workspace_sources(root: &Path) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    for f in super::source_files(root)? {
        let rel = f.strip_prefix(root).unwrap_or(&f).to_path_buf();
        if super::is_test_path(&rel) {
            continue;
        }
        let code = std::fs::read_to_string(&f)?;
        out.push((rel, without_inline_tests(&code)));
    }
    Ok(out)
}

/// `code` with every inline `#[cfg(test)] mod x { ... }` block blanked line for line.
pub fn without_inline_tests(code: &str) -> String {
    let bare = super::strip_comments_and_strings(code);
    let mut blanked = vec![false; code.lines().count()];
    for (i, _) in bare.match_indices("#[cfg(") {
        let rest = &bare[i..];
        let Some(close) = rest.find(")]") else {
            continue;
        };
        let words: Vec<&str> = rest[close + 2..]
            .split_whitespace()
            .take_while(|w| !w.contains('{'))
            .collect();
        let is_mod = rest[..close].contains("test")
            && words.len() <= 3
            && words.iter().rev().nth(1).is_some_and(|w| *w == "mod")
            && words
                .first()
                .is_some_and(|w| w.starts_with("pub") || *w == "mod");
        let Some(open) = rest[close..].find('{').filter(|_| is_mod) else {
            continue;
        };
        let mut depth = 0usize;
        for (k, ch) in rest[close + open..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => continue,
            }
            if depth == 0 {
                let line = |at: usize| bare[..at].matches('\n').count();
                let (a, b) = (line(i), line(i + close + open + k));
                for l in blanked.iter_mut().take(b + 1).skip(a) {
                    *l = true;
                }
                break;
            }
        }
    }
    code.lines()
        .zip(blanked)
        .map(|(l, gone)| if gone { "" } else { l })
        .collect::<Vec<_>>()
        .join("\n")
}
