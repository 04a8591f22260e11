//! Links the agent's binaries with packed relative relocations (DT_RELR, glibc >= 2.36):
//! a PIE's pointer fix-ups shrink from 24 bytes each (440 KiB in the agent, read at every
//! start and resident for its life) to a bitmap of a few KiB. ASLR is unchanged.
fn main() {
    println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}
