//! Tests of `house.rs`: the rules on small made-up crates, then on this workspace.

use super::*;

fn krate(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (p, text) in files {
        let p = d.path().join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    d
}

#[test]
fn a_cycle_between_siblings_is_found_with_its_references() {
    let d = krate(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("src/a.rs", "use crate::b::Thing;\n"),
        ("src/b.rs", "pub struct Thing;\nfn f() { super::c::g() }\n"),
        (
            "src/c.rs",
            "use crate::{x::y, a::{self, Other}};\npub fn g() {}\n",
        ),
    ]);
    let cycles = module_cycles(&d.path().join("src/lib.rs")).unwrap();
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    for edge in [
        "a -> b (crate::b::Thing)",
        "b -> c (super::c::g)",
        "c -> a (crate::a::self)",
    ] {
        assert!(cycles[0].contains(edge), "{edge} in {}", cycles[0]);
    }
}

#[test]
fn parents_children_comments_strings_and_inline_tests_are_no_edges() {
    let d = krate(&[
        ("src/main.rs", "mod a;\nmod b;\nuse a::inner::X;\n"),
        ("src/a.rs", "pub mod inner;\n// crate::b::y in a comment\nconst S: &str = \"crate::b::y\";\nconst R: &str = r#\"crate::b\"#;\nfn f<'a>(x: &'a str) -> char { 'c' }\n"),
        ("src/a/inner.rs", "use super::super::a;\npub struct X;\nuse crate::b::Y;\n"),
        ("src/b.rs", "pub struct Y;\nuse crate::a::inner::X;\n#[cfg(test)]\nmod tests {\n    use crate::a::f;\n}\n"),
    ]);
    // a::inner -> b is the edge a -> b; b -> a is the other way: that is a cycle.
    let cycles = module_cycles(&d.path().join("src/main.rs")).unwrap();
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(cycles[0].contains("a -> b (crate::b::Y)"), "{}", cycles[0]);
    // Without the real reference from a::inner, nothing is left: the comment, the
    // strings and b's inline tests name a or b but are not code.
    std::fs::write(
        d.path().join("src/a/inner.rs"),
        "use super::super::a;\npub struct X;\n",
    )
    .unwrap();
    assert!(module_cycles(&d.path().join("src/main.rs"))
        .unwrap()
        .is_empty());
}

#[test]
fn use_trees_expand() {
    let code = strip_comments_and_strings(
        "use a::{b, c::{d, e as f}};\nuse std::io;\nlet x = crate::g::h(1);",
    );
    let mut got = referenced_paths(&code);
    got.sort();
    assert_eq!(
        got,
        ["a::b", "a::c::d", "a::c::e@f", "crate::g::h", "std::io"]
    );
}

/// Six lines of logic, as a copy would carry them.
const LOGIC: &str = "    let n = parts.len();
    if n == 0 {
        return None;
    }
    let mid = parts[n / 2];
    total += mid * weight;
    Some(total / n)
";

#[test]
fn logic_copied_to_the_letter_is_found_where_it_stands() {
    let a = format!("fn a(parts: &[u64]) -> Option<u64> {{\n    // a comment\n\n{LOGIC}}}\n");
    let b = format!("use x::y;\nfn b() {{}}\n\nfn c(parts: &[u64]) -> Option<u64> {{\n{LOGIC}}}\n");
    let copies = repeats::copies(&[("a.rs".into(), a), ("b.rs".into(), b)]);
    assert_eq!(copies, ["a.rs:4-10 ~ b.rs:5-11"]);
}

#[test]
fn declarations_inline_tests_and_the_shape_alone_are_no_copies() {
    let sig = "fn f(\n    &self,\n    agent: &AgentRecord,\n    rnics: &[RnicRecord],\n    now: u64,\n) -> Result<(), E> {\n";
    let fields = "pub struct S {\n    pub a_ns: u64,\n    pub b_ns: u64,\n    pub c_ns: u64,\n    pub d_ns: u64,\n    pub e_ns: u64,\n}\n";
    let tests =
        format!("#[cfg(test)]\npub(crate) mod tests {{\n    fn t() {{\n{LOGIC}    }}\n}}\n");
    let renamed = LOGIC.replace("parts", "items").replace("weight", "scale");
    let a = format!("{sig}}}\n{fields}{tests}");
    let b = format!("{sig}}}\n{fields}fn g() {{\n{renamed}}}\n");
    let files = [
        ("a.rs".into(), repeats::without_inline_tests(&a)),
        ("b.rs".into(), b),
    ];
    assert_eq!(repeats::copies(&files), Vec::<String>::new());
    // The same logic outside the test block is a copy.
    let c = format!("fn h() {{\n{LOGIC}}}\n");
    let files = [
        ("a.rs".into(), repeats::without_inline_tests(&a)),
        ("c.rs".into(), c.clone()),
        ("d.rs".into(), c),
    ];
    assert_eq!(repeats::copies(&files), ["c.rs:1-8 ~ d.rs:1-8"]);
}

#[test]
fn the_workspace_keeps_the_rules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let p = problems(root).unwrap();
    assert!(p.is_empty(), "house rules broken:\n{}", p.join("\n"));
}
