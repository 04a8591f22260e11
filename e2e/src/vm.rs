//! The soft-RoCE VM tier, shared by both halves: the host test (`tests/vm_rdma.rs`) boots
//! Debian's stock kernel under qemu once and runs the guest runner
//! (`src/bin/rpingmesh-vm-guest/`) inside it; the runner drives the real binaries
//! through every scenario and writes what it observed as JSON into the shared results
//! directory, where the host test's assertions read it.
//!
//! This module holds what both halves must agree on: the address plan, the scenario
//! names and result files, and the timing parameters the assertions depend on.

use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Scenario result files (`<results>/<name>.json`), in the order the runner runs them.
pub const SCENARIOS: [&str; 7] = [
    "ud_probing",
    "service_kprobe",
    "service_uprobe",
    "rdma_faults",
    "hostping",
    "rc_ring",
    "rc_ring_peers",
];

/// One run of the rc_ring scenario: a server accepting `connections` connections in turn,
/// and a client running `scenario` (rpingmesh-rc-ring's arguments).
pub struct RcRingRun {
    pub name: &'static str,
    pub budget: usize,
    pub connections: u64,
    /// The server checks a one-way stream instead of echoing.
    pub sink: bool,
    pub scenario: &'static [&'static str],
}

/// Seed 001's validation list: a million pipelined messages over a 64 KiB ring (one way,
/// each checked by the receiver: an echo of each would double a TCG guest's minutes);
/// 100,000 in batches of 200 through a 16-slot (4 KiB) ring, each echoed; fragmented 8 KiB
/// messages; rapid reconnect cycles.
pub const RC_RING_RUNS: [RcRingRun; 4] = [
    RcRingRun {
        name: "pipeline",
        budget: 65536,
        connections: 1,
        sink: true,
        scenario: &["stream", "1000000"],
    },
    RcRingRun {
        name: "batches",
        budget: 4096,
        connections: 1,
        sink: false,
        scenario: &["batches", "100000", "200"],
    },
    RcRingRun {
        name: "fragmented",
        budget: 4096,
        connections: 1,
        sink: false,
        scenario: &["fragmented", "200", "8192"],
    },
    RcRingRun {
        name: "reconnect",
        budget: 4096,
        connections: RC_RING_RECONNECTS,
        sink: false,
        scenario: &["reconnect", "50", "100"],
    },
];
pub const RC_RING_RECONNECTS: u64 = 50;
/// rc_ring_peers: two agents with RC rings on their ToR mesh (the service devices), one
/// killed -9 while its ring is up and kept down this long (connect back-offs of 4, 8 and
/// 16 s fall inside it), after this long with both rings up.
pub const RC_PEERS_TOR: &str = "tor-rc";
pub const RC_PEERS_DOWN_SECS: u64 = 20;
pub const RC_PEERS_STEADY_SECS: u64 = 6;
/// Ring probe interval of the rc_ring_peers agents (ms): several probes per 2 s window.
pub const RC_PEERS_INTERVAL_MS: u64 = 250;
/// The benchmark scenario (`cargo xtask bench`); not part of the tests' run.
pub const BENCH_SCENARIO: &str = "bench_rdma";
/// Bench: rounds of (agent-bench --rdma, ibv_ud_pingpong), alternated.
pub const BENCH_ROUNDS: u32 = 3;
/// Bench: seconds of each agent-bench measurement.
pub const BENCH_SECONDS: u32 = 5;
/// Bench: the prober agent's probe rate in the load runs, to one target, their length,
/// and their ToR. 64 targets x 10/s (640/s) saturates the TCG guest's two vCPUs on rxe
/// (achieved 409/s on rdma, 376/s on udp): 200/s is what both transports sustain, so
/// that CPU and the dead peer's cost are compared at the rate asked for.
pub const LOAD_PROBES_PER_SEC: u32 = 200;
pub const LOAD_SECS: u64 = 10;
/// Bench: seconds of each ring-poller CPU measurement (no rings, then rings).
pub const RC_CPU_SECS: u64 = 20;
pub const BENCH_LOAD_TOR: &str = "tor-load";
/// Bench: connected pairs whose service-path latency is measured.
pub const BENCH_PAIRS: u32 = 8;
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

/// Service tracing: two rxe devices behind a bridge ("ToR"), one agent each.
pub const SVC_DEVICES: [&str; 2] = ["rxes0", "rxes1"];
pub const SVC_NETDEVS: [&str; 2] = ["vs0", "vs1"];
pub const SVC_IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(198, 18, 2, 1), Ipv4Addr::new(198, 18, 2, 2)];
pub const SVC_TORS: [&str; 2] = ["tor-s0", "tor-s1"];
/// `service_flow_report_interval_ms` of the service-scenario agents: twice the default,
/// so that the fixed costs of a TCG guest (RPCs, wake-ups: a few hundred ms) weigh less
/// against the "within two intervals" bound.
pub const REPORT_INTERVAL_MS: u64 = 2000;
/// The agents' default interval, which the bench measures the latency with.
pub const BENCH_REPORT_INTERVAL_MS: u64 = 1000;
/// Flow label of the first held pair of `rdma-qp-churn` (pair i uses this + i).
pub const CHURN_FLOW_LABEL: u32 = 0x1234;
pub const CHURN_PAIRS: u32 = 2;
pub const CHURN_CYCLES: u32 = 200;

/// Faults: three rxe devices behind a bridge. The multi-rail agent serves FAULT_DEVICES[0]
/// (ToR FAULT_TORS[0]) and FAULT_DEVICES[2] (FAULT_TORS[1], a rail of its own), plus
/// FAULT_NO_GID_DEVICE, whose netdev has no IPv4 address (no GID at the index: skipped);
/// the peer agent serves FAULT_DEVICES[1] in FAULT_TORS[0].
pub const FAULT_DEVICES: [&str; 3] = ["rxef0", "rxef1", "rxef2"];
pub const FAULT_NETDEVS: [&str; 3] = ["vf0", "vf1", "vf2"];
pub const FAULT_IPS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(198, 18, 3, 1),
    Ipv4Addr::new(198, 18, 3, 2),
    Ipv4Addr::new(198, 18, 3, 3),
];
pub const FAULT_TORS: [&str; 2] = ["tor-f0", "tor-f1"];
pub const FAULT_NO_GID_DEVICE: &str = "rxefx";
/// A registered RNIC that is on no fabric: its GID never answers ARP.
pub const FAULT_DEAD_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 99);
/// Pinglist refresh and analysis window of the fault agents (seconds).
pub const FAULT_REFRESH_SEC: u64 = 3;
pub const FAULT_WINDOW_SEC: u64 = 2;
/// Phases: a dead peer on the pinglist, then FAULT_NETDEVS[2] down, then up again.
pub const FAULT_DEAD_PHASE_SECS: u64 = 12;
pub const FAULT_DOWN_SECS: u64 = 8;
pub const FAULT_AFTER_UP_SECS: u64 = 12;
/// Bytes of the stray datagram (more than a receive slot: GRH 40 + 64).
pub const FAULT_OVERSIZE_BYTES: u32 = 1024;
/// Bytes of the datagram sent after the MTU is raised to 9000 (rxe: 4096): more than the
/// peer's receive slots hold (GRH + the 1024 of the MTU it opened with).
pub const FAULT_OVERFLOW_BYTES: u32 = 2048;
/// The peer agent's Prometheus endpoint in the fault scenario.
pub const FAULT_PEER_METRICS: &str = "127.0.0.1:9471";

/// Hostping: four rxe devices behind one bridge, the RNICs of one host, checked by
/// `rpingmesh-agent hostping --once`: healthy; one device's bridge port taken down
/// during the run; a third of one device's RoCE frames dropped at the bridge.
pub const HOST_DEVICES: [&str; 4] = ["rxeh0", "rxeh1", "rxeh2", "rxeh3"];
pub const HOST_NETDEVS: [&str; 4] = ["vh0", "vh1", "vh2", "vh3"];
pub const HOST_IPS: [Ipv4Addr; 4] = [
    Ipv4Addr::new(198, 18, 4, 1),
    Ipv4Addr::new(198, 18, 4, 2),
    Ipv4Addr::new(198, 18, 4, 3),
    Ipv4Addr::new(198, 18, 4, 4),
];
/// R2R windows of the VM runs (the paper's are 20 s) and the runs' lengths.
pub const HOST_WINDOW_SEC: u64 = 3;
/// The hostname the Hostping daemon run reports as.
pub const HOST_DAEMON_HOSTNAME: &str = "vm-host";
pub const HOST_HEALTHY_SEC: u64 = 6;
/// The port-down run: the port goes down HOST_DOWN_AT_SEC after R2R probing began (in
/// the second window) and stays down to the end.
pub const HOST_DOWN_RUN_SEC: u64 = 12;
pub const HOST_DOWN_AT_SEC: u64 = 4;
/// The device whose port goes down, and the one whose frames are partly dropped.
pub const HOST_DOWN_DEVICE: usize = 2;
pub const HOST_LOSSY_DEVICE: usize = 1;
/// Frames of the lossy device dropped at the bridge, in tenths.
pub const HOST_DROP_TENTHS: u32 = 3;

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

/// virtme-ng release the recipe was verified with (`cargo xtask vm-test` installs it).
pub const VIRTME_NG: &str = "virtme-ng==1.42";

/// `<workspace>/.tools/vng`: the virtualenv holding virtme-ng.
pub fn vng_venv(workspace: &Path) -> PathBuf {
    workspace.join(".tools/vng")
}

/// The newest /boot/vmlinuz-* whose modules include rdma_rxe: (image, version).
pub fn kernel_with_rxe() -> Option<(PathBuf, String)> {
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir("/boot")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let ver = name.strip_prefix("vmlinuz-")?.to_string();
            Path::new("/lib/modules")
                .join(&ver)
                .join("kernel/drivers/infiniband/sw/rxe")
                .is_dir()
                .then(|| (ver, e.path()))
        })
        .collect();
    found.sort();
    found.pop().map(|(v, p)| (p, v))
}

/// What boots the guest: virtme-ng and the kernel.
pub struct TestBed {
    pub vng: PathBuf,
    pub kernel: PathBuf,
    pub version: String,
}

impl TestBed {
    /// `$RPINGMESH_VNG` / `$RPINGMESH_VM_KERNEL` when set, else the venv under the
    /// workspace and the newest kernel with rdma_rxe; Err says what is missing.
    pub fn find(workspace: &Path) -> Result<TestBed, String> {
        let need = "the VM test bed is not installed: run `cargo xtask vm-test` \
                    (installs qemu-system-x86, linux-image-amd64, busybox-static, \
                    ibverbs-utils, rdmacm-utils and virtme-ng)";
        let vng = std::env::var_os("RPINGMESH_VNG")
            .map(PathBuf::from)
            .unwrap_or_else(|| vng_venv(workspace).join("bin/vng"));
        if !vng.is_file() {
            return Err(format!("{need}: no {}", vng.display()));
        }
        let (kernel, version) = match std::env::var_os("RPINGMESH_VM_KERNEL") {
            Some(k) => {
                let p = PathBuf::from(k);
                let v = p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_prefix("vmlinuz-"))
                    .unwrap_or("?")
                    .to_string();
                (p, v)
            }
            None => kernel_with_rxe()
                .ok_or_else(|| format!("{need}: no /boot/vmlinuz-* with rdma_rxe modules"))?,
        };
        Ok(TestBed {
            vng,
            kernel,
            version,
        })
    }

    /// Boots the guest under TCG with `rwdir` writable, runs `command` in it as root and
    /// waits; a guest still running after `timeout` is killed with everything qemu
    /// started (None). Console output goes to `<rwdir>/console.log`.
    pub fn run(
        &self,
        rwdir: &Path,
        command: &str,
        timeout: Duration,
    ) -> Result<Option<ExitStatus>, String> {
        let console = rwdir.join("console.log");
        let log =
            std::fs::File::create(&console).map_err(|e| format!("{}: {e}", console.display()))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        // vng runs virtme-run from its own bin directory.
        let bin_dir = self.vng.parent().unwrap_or(Path::new("."));
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = Command::new(&self.vng)
            .arg("-r")
            .arg(&self.kernel)
            // KVM guests hang at boot on these machines: TCG only.
            .args([
                "--disable-kvm",
                "--force-9p",
                "--memory",
                "2G",
                "--user",
                "root",
                "--rwdir",
            ])
            .arg(rwdir)
            .arg("--exec")
            .arg(command)
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            // Its own process group: a hung guest is killed with everything qemu started.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.vng.display()))?;
        let started = Instant::now();
        loop {
            if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
                return Ok(Some(st));
            }
            if started.elapsed() > timeout {
                // SAFETY: signalling the process group we created.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
