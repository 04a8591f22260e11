//! Project automation: `cargo xtask <deps|test|demo|bench>`.

mod bench;
mod demo;
mod procs;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "rpingmesh project automation")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install missing system packages (apt-get, when root) needed by tests and demo.
    Deps,
    /// deps, then build every target and run the whole test suite (e2e included).
    Test,
    /// Start a controller and N agents over udp on loopback and print a live ToR-pair table.
    Demo(demo::DemoArgs),
    /// Run the benchmarks (release) and write BENCHMARKS.md.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Deps => deps(),
        Cmd::Test => test(),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Bench(a) => bench::run(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}

/// Cargo's target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => {
            let p = PathBuf::from(d);
            if p.is_absolute() {
                p
            } else {
                root().join(p)
            }
        }
        None => root().join("target"),
    }
}

pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    c
}

/// Runs a command with inherited stdio; a failure names the command and its status.
pub fn run_streamed(mut cmd: Command, what: &str) -> Result<()> {
    eprintln!("xtask: {what}");
    let st = cmd.status().with_context(|| format!("starting: {what}"))?;
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// (tool, Debian package, why we need it)
const NEEDED: &[(&str, &str, &str)] = &[
    ("ip", "iproute2", "network namespaces, veth and bridges for the e2e mesh test"),
    ("nft", "nftables", "packet-loss injection in the e2e mesh test"),
    ("ps", "procps", "process inspection (ps, pgrep) for demo and bench debugging"),
];

fn have_tool(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .any(|d| d.join(tool).is_file())
}

/// Installs what is missing (root) or says how to (not root).
pub fn deps() -> Result<()> {
    let missing: Vec<&(&str, &str, &str)> = NEEDED.iter().filter(|(t, _, _)| !have_tool(t)).collect();
    if missing.is_empty() {
        eprintln!(
            "xtask deps: all system tools present ({})",
            NEEDED.iter().map(|(t, _, _)| *t).collect::<Vec<_>>().join(", ")
        );
        return Ok(());
    }
    let pkgs: Vec<&str> = missing.iter().map(|(_, p, _)| *p).collect();
    for (tool, pkg, why) in &missing {
        eprintln!("xtask deps: `{tool}` is missing: package {pkg} ({why})");
    }
    if !is_root() {
        eprintln!(
            "xtask deps: not root, installing nothing; run `sudo apt-get install -y {}` \
             (root-only tests are skipped meanwhile)",
            pkgs.join(" ")
        );
        return Ok(());
    }
    if !have_tool("apt-get") {
        bail!(
            "missing packages {} and no apt-get on this system: install them with your package manager",
            pkgs.join(" ")
        );
    }
    let mut update = Command::new("apt-get");
    update.arg("update").env("DEBIAN_FRONTEND", "noninteractive");
    run_streamed(update, "apt-get update")?;
    let mut install = Command::new("apt-get");
    install
        .args(["install", "-y", "--no-install-recommends"])
        .args(&pkgs)
        .env("DEBIAN_FRONTEND", "noninteractive");
    run_streamed(install, &format!("apt-get install -y {}", pkgs.join(" ")))?;
    for (tool, pkg, _) in &missing {
        if !have_tool(tool) {
            bail!("`{tool}` still missing after installing {pkg}");
        }
    }
    Ok(())
}

fn test() -> Result<()> {
    deps()?;
    let mut build = cargo();
    build.args(["build", "--workspace", "--all-targets"]);
    run_streamed(build, "cargo build --workspace --all-targets")?;
    let mut t = cargo();
    t.args(["test", "--workspace"]);
    // e2e tests find the binaries next to their own executable (target/debug).
    run_streamed(t, "cargo test --workspace")?;
    if !is_root() {
        eprintln!(
            "xtask test: note: not root, so the network-namespace e2e test was skipped \
             (see its SKIPPED line above)"
        );
    }
    Ok(())
}
