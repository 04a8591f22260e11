//! `cargo xtask sim ARGS...`: builds the fabric simulator in release and runs it with
//! ARGS (`rpingmesh-sim --help`: `--scenario FILE [--findings-out FILE] [--quiet]
//! [--live MS]`), from the directory xtask was started in so relative paths mean what
//! they say. The simulator's exit code is passed on (2: a bad scenario).

use std::ffi::OsString;

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args)]
pub struct SimArgs {
    /// The simulator's arguments, as `rpingmesh-sim` takes them.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    args: Vec<OsString>,
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
    cmd.args(&a.args)
        .current_dir(std::env::current_dir().context("the current directory")?);
    let status = cmd
        .status()
        .context("starting cargo run --release -p rpingmesh-sim")?;
    if !status.success() {
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}
