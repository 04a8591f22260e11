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

#[test]
fn the_workspace_keeps_the_rules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let p = problems(root).unwrap();
    assert!(p.is_empty(), "house rules broken:\n{}", p.join("\n"));
}
