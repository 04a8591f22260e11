//! The runner end to end: the `rpingmesh-sim` binary on every shipped per-kind scenario
//! must report exactly the injected fault, at the right place and time.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rpingmesh_sim::{ground_truth, FaultKind, Scenario};
use serde_json::Value;

const WINDOW_SEC: f64 = 30.0;
/// A finding opens within this long after its fault starts and resolves within this long
/// after it ends ("a few windows": K/M windows, the settle time, a window's timeouts).
const OPEN_WITHIN_SEC: f64 = 3.0 * WINDOW_SEC + 10.0;
const RESOLVE_WITHIN_SEC: f64 = 4.0 * WINDOW_SEC + 10.0;

fn scenario_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(name)
}

fn run_bin(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rpingmesh-sim"))
        .args(args)
        .output()
        .expect("run rpingmesh-sim")
}

/// Runs the binary on a shipped scenario; returns the findings it wrote.
fn findings_of(name: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("findings.jsonl");
    let path = scenario_path(name);
    let o = run_bin(&[
        "--scenario".as_ref(),
        path.as_os_str(),
        "--findings-out".as_ref(),
        out.as_os_str(),
        "--quiet".as_ref(),
    ]);
    assert!(
        o.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.stdout.is_empty(), "--quiet prints nothing");
    let text = std::fs::read_to_string(&out).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}")))
        .collect()
}

/// The one fault of a per-kind scenario gives exactly one finding, of its kind and at
/// its location, opened after the fault started and resolved after it ended.
fn check_kind(name: &str) {
    check_kind_of(name);
}

/// `check_kind`, returning the finding.
fn check_kind_of(name: &str) -> Value {
    let s = Scenario::from_yaml(&std::fs::read_to_string(scenario_path(name)).unwrap()).unwrap();
    assert_eq!(s.faults.len(), 1, "{name}: one fault");
    let fault = &s.faults[0];
    let truth = ground_truth(fault);
    let found = findings_of(name);
    let summary: Vec<String> = found
        .iter()
        .map(|f| {
            format!(
                "{} {} {} {}",
                f["kind"], f["location"], f["opened_sec"], f["resolved_sec"]
            )
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{name}: exactly one finding, got {summary:?}"
    );
    let f = &found[0];
    assert_eq!(f["kind"], truth.kind, "{name}: {summary:?}");
    assert_eq!(
        f["location"],
        truth.location.as_str(),
        "{name}: {summary:?}"
    );
    let opened = f["opened_sec"].as_f64().unwrap();
    assert!(
        opened > fault.start_sec && opened <= fault.start_sec + OPEN_WITHIN_SEC,
        "{name}: opened at {opened} s, fault from {} s",
        fault.start_sec
    );
    let resolved = f["resolved_sec"]
        .as_f64()
        .unwrap_or_else(|| panic!("{name}: still open at the end"));
    assert!(
        resolved > fault.end_sec && resolved <= fault.end_sec + RESOLVE_WITHIN_SEC,
        "{name}: resolved at {resolved} s, fault until {} s",
        fault.end_sec
    );
    let c = f["confidence"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&c));
    assert!(f["evidence"]["windows"].as_u64().unwrap() >= 1);
    assert!(f["evidence"]["id"].as_u64().is_some());
    assert!(f["evidence"]["symptom"].as_str().is_some());
    f.clone()
}

/// A gray fault: found as `check_kind` wants, degraded, its size estimated within a
/// factor of two of what was injected.
fn check_gray(name: &str, symptom: &str) {
    let f = check_kind_of(name);
    assert_eq!(f["severity"], "degraded", "{name}: {f}");
    assert_eq!(f["evidence"]["symptom"], symptom, "{name}: {f}");
    let s = Scenario::from_yaml(&std::fs::read_to_string(scenario_path(name)).unwrap()).unwrap();
    let e = &f["evidence"];
    let (got, want) = match s.faults[0].kind {
        FaultKind::LinkLoss { loss, .. } | FaultKind::RnicLoss { loss } => {
            (e["loss_ratio"].as_f64().unwrap(), loss)
        }
        FaultKind::LinkLatency { add_us, .. } => (e["excess_ns"].as_f64().unwrap() / 1e3, add_us),
        // The prober's delay takes two stall draws: its median about 1.7 x the mean.
        FaultKind::HostStall { delay_us } => {
            (e["excess_ns"].as_f64().unwrap() / 1e3, 1.7 * delay_us)
        }
        other => panic!("{name}: not a gray fault: {other:?}"),
    };
    assert!(
        got > want / 2.0 && got < want * 2.0,
        "{name}: estimated {got}, injected {want}: {f}"
    );
}

#[test]
fn a_gray_link_loss_is_found() {
    check_gray("gray_link_loss.yaml", "loss");
}

#[test]
fn a_gray_link_latency_is_found() {
    check_gray("gray_link_latency.yaml", "latency");
}

#[test]
fn a_gray_host_stall_is_found() {
    check_gray("gray_host_stall.yaml", "stall");
}

#[test]
fn a_gray_rnic_loss_is_found() {
    check_gray("gray_rnic_loss.yaml", "loss");
}

#[test]
fn a_fault_free_fabric_on_the_realistic_background_has_no_findings() {
    let found = findings_of("gray_fault_free.yaml");
    assert!(found.is_empty(), "{found:?}");
}

#[test]

fn rnic_down_is_found() {
    check_kind("rnic_down.yaml");
}

#[test]

fn rnic_flap_is_found() {
    check_kind("rnic_flap.yaml");
}

#[test]

fn host_stall_is_found() {
    check_kind("host_stall.yaml");
}

#[test]

fn tor_down_is_found() {
    check_kind("tor_down.yaml");
}

#[test]

fn link_loss_is_found() {
    check_kind("link_loss.yaml");
}

#[test]

fn link_down_is_found() {
    check_kind("link_down.yaml");
}

#[test]

fn link_latency_is_found() {
    check_kind("link_latency.yaml");
}

#[test]
fn a_fault_free_fabric_has_no_findings() {
    let found = findings_of("fault_free.yaml");
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_bad_scenario_exits_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    let text = std::fs::read_to_string(scenario_path("link_loss.yaml"))
        .unwrap()
        .replace("loss: 0.05", "loss: 1.5");
    std::fs::write(&bad, text).unwrap();
    let out = dir.path().join("f.jsonl");
    let o = run_bin(&[
        "--scenario".as_ref(),
        bad.as_os_str(),
        "--findings-out".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("faults[0] (link_loss): loss must be in (0, 1], got 1.5"),
        "{err}"
    );
    assert!(!out.exists(), "no findings file for a bad scenario");
    // A missing file is the same kind of failure.
    let o = run_bin(&[
        "--scenario".as_ref(),
        dir.path().join("nope.yaml").as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn every_shipped_scenario_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    for n in [
        "demo.yaml",
        "example.yaml",
        "fault_free.yaml",
        "gray_fault_free.yaml",
        "gray_host_stall.yaml",
        "gray_link_latency.yaml",
        "gray_link_loss.yaml",
        "gray_rnic_loss.yaml",
        "host_stall.yaml",
        "link_down.yaml",
        "link_latency.yaml",
        "link_loss.yaml",
        "rnic_down.yaml",
        "rnic_flap.yaml",
        "tor_down.yaml",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} is shipped");
    }
    for n in &names {
        let s = Scenario::from_yaml(&std::fs::read_to_string(dir.join(n)).unwrap())
            .unwrap_or_else(|e| panic!("{n}: {e}"));
        if n == "demo.yaml" {
            let rnics = s.fabric.tors * s.fabric.hosts_per_tor * s.fabric.rnics_per_host;
            assert!(rnics >= 64);
            assert_eq!(s.faults.len(), 2);
            assert!(
                s.faults[0].end_sec <= s.faults[1].start_sec,
                "one after the other"
            );
        }
    }
}

#[test]
fn the_summary_names_faults_findings_probes_and_time() {
    let path = scenario_path("fault_free.yaml");
    let o = run_bin(&["--scenario".as_ref(), path.as_os_str()]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    for want in ["faults: 0", "findings: 0", "probes: ", "virtual 605 s in "] {
        assert!(text.contains(want), "{want:?} in\n{text}");
    }
}
