//! The soft-RoCE VM tier, shared by both halves: the host test (`tests/vm_rdma.rs`) boots
//! Debian's stock kernel under qemu once and runs the guest runner
//! (`src/bin/rpingmesh-vm-guest.rs`) inside it; the runner drives the real binaries
//! through every scenario and writes what it observed as JSON into the shared results
//! directory, where the host test's assertions read it.
//!
//! This module holds what both halves must agree on: the address plan, the scenario
//! names and result files, and the timing parameters the assertions depend on.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// Scenario result files (`<results>/<name>.json`), in the order the runner runs them.
pub const SCENARIOS: [&str; 3] = ["ud_probing", "service_kprobe", "service_uprobe"];
/// Written by the runner when every scenario has finished (with or without errors).
pub const DONE_FILE: &str = "done";

/// UD probing: one rxe device carrying several GIDs of both families.
pub const UD_NETDEV: &str = "vud";
pub const UD_DEVICE: &str = "rxeu0";
pub const UD_V4: [Ipv4Addr; 4] = [
    Ipv4Addr::new(198, 18, 1, 1),
    Ipv4Addr::new(198, 18, 1, 2),
    Ipv4Addr::new(198, 18, 1, 3),
    Ipv4Addr::new(198, 18, 1, 4),
];
/// ToR of each `UD_V4` agent: two per ToR, so both ToR-mesh and inter-ToR paths exist.
pub const UD_V4_TORS: [&str; 4] = ["tor-a", "tor-a", "tor-b", "tor-b"];
pub const UD_V6: [&str; 2] = ["fd01::1", "fd01::2"];
pub const UD_V6_TOR: &str = "tor-c";
/// Seconds of probing after every agent registered.
pub const UD_PROBE_SECS: u64 = 20;
/// Rounds of (our endpoint, ibv_ud_pingpong) RTT measurements, alternated.
pub const ACCURACY_ROUNDS: u32 = 3;

/// Service tracing: two rxe devices behind a bridge ("ToR"), one agent each.
pub const SVC_DEVICES: [&str; 2] = ["rxes0", "rxes1"];
pub const SVC_NETDEVS: [&str; 2] = ["vs0", "vs1"];
pub const SVC_IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(198, 18, 2, 1), Ipv4Addr::new(198, 18, 2, 2)];
pub const SVC_TORS: [&str; 2] = ["tor-s0", "tor-s1"];
/// `service_flow_report_interval_ms` of the service-scenario agents.
pub const REPORT_INTERVAL_MS: u64 = 1000;
/// How often the tracer looks for exited processes (the tracer's default).
pub const LIVENESS_INTERVAL_MS: u64 = 2000;
/// Flow label of the first held pair of `rdma-qp-churn` (pair i uses this + i).
pub const CHURN_FLOW_LABEL: u32 = 0x1234;
pub const CHURN_PAIRS: u32 = 2;
pub const CHURN_CYCLES: u32 = 200;

/// The service programs each service scenario runs, by the key used in its JSON.
pub const SERVICE_PROGRAMS: [&str; 3] = ["rc_pingpong", "rping", "qp_churn"];

/// `<dir>/<scenario>.json`.
pub fn result_file(dir: &Path, scenario: &str) -> PathBuf {
    dir.join(format!("{scenario}.json"))
}

/// The GID text (full form) of an IPv4 address's RoCE v2 GID.
pub fn v4_gid(ip: Ipv4Addr) -> String {
    rpingmesh_proto::gid::format_gid(&ip.to_ipv6_mapped())
}

/// The GID text of an IPv6 address.
pub fn v6_gid(ip: &str) -> String {
    let a: std::net::Ipv6Addr = ip.parse().expect("a valid IPv6 literal");
    rpingmesh_proto::gid::format_gid(&a)
}
