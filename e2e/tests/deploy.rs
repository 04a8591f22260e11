//! The shipped systemd units are valid (systemd-analyze verify, with ExecStart pointed at
//! the binaries of this build), and the agent's unit grants only the capabilities the agent
//! needs.

use std::path::Path;
use std::process::Command;

use rpingmesh_e2e::*;

fn unit(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/systemd")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn systemd_units_verify() {
    let analyze = Path::new("/usr/bin/systemd-analyze");
    if !analyze.is_file() {
        eprintln!("SKIP systemd_units_verify: systemd-analyze not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (name, bin_name) in [
        ("rpingmesh-agent.service", AGENT_BIN),
        ("rpingmesh-controller.service", CONTROLLER_BIN),
    ] {
        let text = unit(name).replace(
            &format!("/usr/bin/{bin_name}"),
            &bin(bin_name).display().to_string(),
        );
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        files.push(p);
    }
    let out = Command::new(analyze)
        .args(["verify", "--man=no"])
        .args(&files)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify:\n{stderr}"
    );
}

#[test]
fn agent_unit_grants_only_tracing_and_memlock_capabilities() {
    let text = unit("rpingmesh-agent.service");
    for key in ["CapabilityBoundingSet=", "AmbientCapabilities="] {
        let line = text
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("{key} missing"));
        let mut caps: Vec<&str> = line[key.len()..].split_whitespace().collect();
        caps.sort();
        assert_eq!(caps, ["CAP_BPF", "CAP_IPC_LOCK", "CAP_PERFMON"], "{line}");
    }
    assert!(text.contains("NoNewPrivileges=yes"));
}
