//! `cargo xtask build-ebpf`: build the aya eBPF object (agent-ebpf) with nightly,
//! installing what is missing first (nightly, rust-src, bpf-linker linked against the
//! libLLVM shipped inside the nightly toolchain; see shared/notes/ebpf-toolchain.md).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const BPF_LINKER_VERSION: &str = "0.13.0";
const EBPF_TARGET: &str = "bpfel-unknown-none";
const EBPF_BIN: &str = "rpingmesh-agent-ebpf";
/// The object the agent embeds (service-tracer/build.rs): the linked one without its
/// DWARF. BTF and BTF.ext stay (aya and the verifier need them); the DWARF is 380 KiB of
/// the 480, and the agent reads the whole object at start, so it stayed resident.
pub const EMBEDDED_OBJECT: &str = "rpingmesh-agent-ebpf.o";

/// Builds agent-ebpf and returns the path of the object the agent embeds (an ELF with
/// every program). Tools go to `<root>/.tools`; the objects to
/// `<root>/target/bpfel-unknown-none/release/`.
pub fn build_ebpf(root: &Path) -> Result<PathBuf> {
    let tools = root.join(".tools");
    let cargo = rustup_cargo();
    ensure_nightly()?;
    ensure_rust_src()?;
    let linker = ensure_bpf_linker(&tools, &cargo)?;

    let crate_dir = root.join("agent-ebpf");
    if !crate_dir.join("Cargo.toml").is_file() {
        bail!(
            "{} not found (is {} the repository root?)",
            crate_dir.display(),
            root.display()
        );
    }
    let target_dir = root.join("target");
    let path = prepend_path(linker.parent().expect("linker has a parent dir"));
    eprintln!(
        "build-ebpf: cargo +nightly build --release ({})",
        crate_dir.display()
    );
    let started = std::time::Instant::now();
    let mut cmd = Command::new(&cargo);
    without_parent_cargo_env(&mut cmd)
        .current_dir(&crate_dir)
        .args([
            "+nightly",
            "build",
            "--release",
            "--target",
            EBPF_TARGET,
            "-Z",
            "build-std=core",
        ])
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", &target_dir)
        // BTF in the object lets aya relocate and the kernel check the programs.
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "-C\x1fdebuginfo=2\x1f-C\x1flink-arg=--btf",
        );
    run(&mut cmd, "cargo +nightly build (agent-ebpf)")?;
    let obj = target_dir.join(EBPF_TARGET).join("release").join(EBPF_BIN);
    if !obj.is_file() {
        bail!("eBPF build finished but {} is missing", obj.display());
    }
    let embedded = strip_debug(&obj)?;
    eprintln!(
        "build-ebpf: {} ({:.1}s)",
        embedded.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(embedded)
}

/// Writes `EMBEDDED_OBJECT` next to `obj` with the DWARF sections removed, using the
/// nightly toolchain's own objcopy (no system LLVM needed). The file is replaced only
/// when its bytes change: its mtime is service-tracer's rebuild trigger.
fn strip_debug(obj: &Path) -> Result<PathBuf> {
    let sysroot = rustc_nightly(&["--print", "sysroot"])?;
    let sysroot = Path::new(sysroot.trim());
    let host = rustc_nightly(&["--print", "host-tuple"])?;
    let objcopy = sysroot
        .join("lib/rustlib")
        .join(host.trim())
        .join("bin/rust-objcopy");
    let dir = obj.parent().expect("the object has a directory");
    let fresh = dir.join(format!("{EMBEDDED_OBJECT}.new"));
    run(
        Command::new(&objcopy)
            // rust-objcopy links the toolchain's libLLVM, which lives in the sysroot.
            .env("LD_LIBRARY_PATH", sysroot.join("lib"))
            .arg("--strip-debug")
            .arg(obj)
            .arg(&fresh),
        "rust-objcopy --strip-debug (the eBPF object)",
    )?;
    let embedded = dir.join(EMBEDDED_OBJECT);
    let new = std::fs::read(&fresh).with_context(|| format!("reading {}", fresh.display()))?;
    if std::fs::read(&embedded).ok().as_deref() == Some(&new[..]) {
        std::fs::remove_file(&fresh).with_context(|| format!("removing {}", fresh.display()))?;
    } else {
        std::fs::rename(&fresh, &embedded)
            .with_context(|| format!("writing {}", embedded.display()))?;
    }
    Ok(embedded)
}

/// Drops what the stable parent cargo leaks into a child cargo (its toolchain choice,
/// wrappers, flags, build target and target dir): the child, often `+nightly`, picks its
/// own. Set what the child needs after this.
pub(crate) fn without_parent_cargo_env(cmd: &mut Command) -> &mut Command {
    for var in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// The rustup proxy (understands `+nightly`), not the toolchain cargo running xtask.
pub(crate) fn rustup_cargo() -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    match home.map(|h| h.join("bin").join("cargo")) {
        Some(p) if p.is_file() => p,
        _ => PathBuf::from("cargo"),
    }
}

fn rustc_nightly(args: &[&str]) -> Result<String> {
    let out = Command::new("rustc")
        .arg("+nightly")
        .args(args)
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .context("running rustc +nightly (is rustup installed?)")?;
    if !out.status.success() {
        bail!(
            "rustc +nightly {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub(crate) fn ensure_nightly() -> Result<()> {
    if rustc_nightly(&["-V"]).is_ok() {
        return Ok(());
    }
    eprintln!("build-ebpf: installing the nightly toolchain (rustup toolchain install nightly)");
    run(
        Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]),
        "rustup toolchain install nightly",
    )
}

fn ensure_rust_src() -> Result<()> {
    let sysroot = PathBuf::from(rustc_nightly(&["--print", "sysroot"])?);
    if sysroot
        .join("lib/rustlib/src/rust/library/core/Cargo.toml")
        .is_file()
    {
        return Ok(());
    }
    eprintln!("build-ebpf: installing rust-src for nightly (needed by -Z build-std=core)");
    run(
        Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]),
        "rustup component add rust-src",
    )
}

/// Returns the bpf-linker binary, building it when missing or when it no longer runs
/// (its RUNPATH points into the nightly toolchain, so a nightly update breaks it).
fn ensure_bpf_linker(tools: &Path, cargo: &Path) -> Result<PathBuf> {
    let bin = tools.join("bin").join("bpf-linker");
    if bin.is_file() {
        let ok = Command::new(&bin)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return Ok(bin);
        }
        eprintln!(
            "build-ebpf: {} no longer runs (nightly changed?); rebuilding it",
            bin.display()
        );
    }
    let sysroot = PathBuf::from(rustc_nightly(&["--print", "sysroot"])?);
    let vv = rustc_nightly(&["-vV"])?;
    let major = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("rustc +nightly -vV printed no LLVM version")?
        .to_string();
    let libdir = sysroot.join("lib");
    let so = std::fs::read_dir(&libdir)
        .with_context(|| format!("reading {}", libdir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("libLLVM.so."))
        .min()
        .with_context(|| {
            format!(
                "no libLLVM.so.* in {} (nightly without LLVM dylib?)",
                libdir.display()
            )
        })?;
    // bpf-linker's build wants an LLVM prefix with lib/libLLVM.so: point it at nightly's.
    let prefix = tools.join("llvm");
    let plib = prefix.join("lib");
    std::fs::create_dir_all(&plib).with_context(|| format!("creating {}", plib.display()))?;
    for name in ["libLLVM.so", so.as_str()] {
        let link = plib.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(libdir.join(&so), &link)
            .with_context(|| format!("symlinking {}", link.display()))?;
    }
    eprintln!(
        "build-ebpf: building bpf-linker {BPF_LINKER_VERSION} against nightly's LLVM {major} into {} (about 2-4 minutes, once)",
        tools.display()
    );
    let started = std::time::Instant::now();
    let mut cmd = Command::new(cargo);
    without_parent_cargo_env(&mut cmd)
        .args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
            "--no-default-features",
        ])
        .args(["--features", &format!("llvm-{major}"), "--root"])
        .arg(tools)
        .env("LLVM_PREFIX", &prefix)
        .current_dir(tools);
    run(&mut cmd, "cargo install bpf-linker")?;
    eprintln!(
        "build-ebpf: bpf-linker built in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(bin)
}

fn prepend_path(dir: &Path) -> std::ffi::OsString {
    let mut parts = vec![dir.to_path_buf()];
    if let Some(p) = std::env::var_os("PATH") {
        parts.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(parts).unwrap_or_default()
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}
