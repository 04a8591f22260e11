//! `cargo xtask soak --duration SECONDS`: the restart-and-fault soak of
//! e2e/src/soak.rs over release binaries; prints its report and fails on a missed target.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use rpingmesh_e2e::soak::{self, SoakReport};

#[derive(Args)]
pub struct SoakArgs {
    /// How long to run (one fault cycle is 60 s).
    #[arg(long, default_value_t = 600)]
    duration: u64,
}

pub fn run(a: SoakArgs) -> Result<()> {
    crate::cargo_release(
        &["rpingmesh-controller", "rpingmesh-agent"],
        &[],
        "controller, agent",
    )?;
    let report = measure(Duration::from_secs(a.duration))?;
    println!("{}", report.markdown());
    let failures = report.target_failures();
    if !failures.is_empty() {
        bail!("soak targets missed:\n{}", failures.join("\n"));
    }
    Ok(())
}

/// Runs the soak over the release binaries (already built); logs go to target/soak.
pub fn measure(duration: Duration) -> Result<SoakReport> {
    if !rpingmesh_e2e::is_root() {
        bail!("the soak needs root (network namespaces, nftables): not measured");
    }
    // Read by the e2e helpers that spawn the processes; set before any thread starts.
    std::env::set_var("RPINGMESH_BIN_DIR", crate::target_dir().join("release"));
    let dir = crate::target_dir().join("soak");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!(
        "xtask: soak for {} s (logs in {})",
        duration.as_secs(),
        dir.display()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(soak::run(&dir, duration))
}
