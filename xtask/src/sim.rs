//! `cargo xtask sim --scenario FILE --findings-out FILE [--quiet]`: builds the fabric
//! simulator in release and runs it (`cargo run --release -p rpingmesh-sim -- ...`).
//! The simulator's exit code is passed on (2: a bad scenario).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args)]
pub struct SimArgs {
    /// Scenario file (YAML; see sim/README.md and sim/scenarios/).
    #[arg(long)]
    scenario: PathBuf,
    /// Where to write the findings, one JSON object per line.
    #[arg(long)]
    findings_out: Option<PathBuf>,
    /// Print nothing but errors.
    #[arg(long)]
    quiet: bool,
}

/// Paths are taken from where xtask was started; cargo runs in the workspace root.
fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("path {}", p.display()))
}

/// `cargo run --release` of the simulator binary; its own arguments follow.
pub fn sim_command() -> std::process::Command {
    let mut cmd = crate::cargo();
    cmd.args([
        "run",
        "--quiet",
        "--release",
        "-p",
        "rpingmesh-sim",
        "--bin",
        "rpingmesh-sim",
        "--",
    ]);
    cmd
}

pub fn run(a: SimArgs) -> Result<()> {
    let mut cmd = sim_command();
    cmd.arg("--scenario").arg(absolute(&a.scenario)?);
    if let Some(out) = &a.findings_out {
        cmd.arg("--findings-out").arg(absolute(out)?);
    }
    if a.quiet {
        cmd.arg("--quiet");
    }
    let status = cmd
        .status()
        .context("starting cargo run --release -p rpingmesh-sim")?;
    if !status.success() {
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}
