//! Embeds the eBPF object built by `cargo xtask build-ebpf` (its copy without DWARF) when
//! it exists; otherwise the tracer looks for it at run time (RPINGMESH_EBPF_OBJECT or a
//! configured path).
use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(rpingmesh_ebpf_embedded)");
    println!("cargo::rerun-if-env-changed=RPINGMESH_EBPF_OBJECT");
    let manifest =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let obj = std::env::var_os("RPINGMESH_EBPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            manifest.join("../target/bpfel-unknown-none/release/rpingmesh-agent-ebpf.o")
        });
    println!("cargo::rerun-if-changed={}", obj.display());
    let out =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("agent.bpf.o");
    if obj.is_file() && std::fs::copy(&obj, &out).is_ok() {
        println!("cargo::rustc-cfg=rpingmesh_ebpf_embedded");
    }
}
