//! One cycle of the restart-and-fault soak (e2e/src/soak.rs; root): a controller
//! restarted, down past the active threshold, frozen; an agent restarted, one cut off,
//! one killed. Nothing expected may be lost, every restart converges within a pinglist
//! refresh, and no agent drops a report (`SoakReport::target_failures`). `cargo xtask
//! soak` runs it longer, `cargo xtask bench` for ten minutes.

use std::time::Duration;

use rpingmesh_e2e::soak::{self, CYCLE};
use rpingmesh_e2e::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_fault_cycle_loses_nothing_and_converges() {
    if !is_root() {
        eprintln!("SKIP: the soak needs root (network namespaces, nftables)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let report = soak::run(dir.path(), CYCLE + Duration::from_secs(4))
        .await
        .unwrap();
    println!("{}", report.markdown());
    // Logs of a failed run stay for reading.
    let _keep = scopeguard_keep(dir);
    assert_eq!(report.events.len(), soak::SCHEDULE.len(), "{report:?}");
    assert!(report.windows_expected > 100, "{report:?}");
    assert!(
        report.probes_answered * 100 >= report.probes_sent * 90,
        "answered {} of {}",
        report.probes_answered,
        report.probes_sent
    );
    let failures = report.target_failures();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Keeps the run's directory (process logs) if the test panics after this point.
fn scopeguard_keep(dir: tempfile::TempDir) -> KeepOnPanic {
    KeepOnPanic(Some(dir))
}

struct KeepOnPanic(Option<tempfile::TempDir>);

impl Drop for KeepOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(d) = self.0.take() {
                eprintln!("soak logs kept in {}", d.keep().display());
            }
        }
    }
}
