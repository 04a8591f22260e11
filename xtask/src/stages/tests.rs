//! Tests of `stages.rs`.

use super::*;

#[test]
fn binaries_are_named_from_cargos_lines() {
    assert_eq!(
        binary_of("     Running tests/vm_rdma.rs (target/debug/deps/vm_rdma-e4a6)").as_deref(),
        Some("tests/vm_rdma.rs")
    );
    assert_eq!(
        binary_of("   Doc-tests rpingmesh_agent").as_deref(),
        Some("doc-tests rpingmesh_agent")
    );
    assert_eq!(binary_of("test foo ... ok"), None);
}

#[test]
fn the_table_lists_stages_and_the_slowest_binaries() {
    let mut s = Stages::default();
    s.add("build", Duration::from_secs(90));
    for i in 0..20 {
        s.binaries.push((format!("b{i}"), Duration::from_secs(i)));
    }
    let t = s.table();
    assert!(t.contains("90.0 s  build"), "{t}");
    assert!(t.contains("90.0 s  total"), "{t}");
    assert!(t.contains("19.0 s  b19"), "{t}");
    assert!(t.contains("the other 5 binaries"), "{t}");
}
