//! hostping-bench: JSON lines for `cargo xtask bench`.
//!
//! - `hostping_inference`: Algorithm 1 (link-state inference) over the randomized host
//!   suite of `rpingmesh_hostping::scenario` (hosts built as sysfs trees, discovered,
//!   loopback timings judged, 20 rounds each), precision and recall per fault kind.
//! - `hostping_cpu`: what Hostping costs a 4-RNIC host: R2R probing between four RNICs
//!   (the agent's drivers on udp over loopback, one probe per RNIC per 100 ms, 500 ms
//!   timeout) plus the hardware monitor reading four ports' counters once a second from a
//!   sysfs-shaped tree of real files. The process's CPU time over the run as a share of
//!   one core, next to the same process idle for as long (the baseline, same run).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rpingmesh_agent::agent::OpenedRnic;
use rpingmesh_agent::hostping::{hw_monitor, r2r_run, R2rPlan};
use rpingmesh_agent::rnic::DriverParams;
use rpingmesh_hostping::scenario::evaluate;
use rpingmesh_hostping::sysfs::RealSysfs;
use rpingmesh_verbs::udp::UdpEndpoint;
use serde_json::json;

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// A directory removed when dropped.
struct TreeDir(std::path::PathBuf);

impl Drop for TreeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Four ports' counter directories, shaped like /sys/class/infiniband (mlx5's counters).
fn counter_tree() -> std::io::Result<(TreeDir, Vec<(String, u32)>)> {
    let dir = TreeDir(std::env::temp_dir().join(format!("hostping-bench-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let mut ports = Vec::new();
    for d in 0..4 {
        let name = format!("mlx5_{d}");
        for sub in ["counters", "hw_counters"] {
            let p = dir
                .0
                .join(format!("sys/class/infiniband/{name}/ports/1/{sub}"));
            std::fs::create_dir_all(&p)?;
            let names: &[&str] = if sub == "counters" {
                &[
                    "port_xmit_data",
                    "port_rcv_data",
                    "port_xmit_packets",
                    "port_rcv_packets",
                    "port_rcv_errors",
                    "port_xmit_discards",
                    "link_downed",
                    "symbol_error",
                ]
            } else {
                &[
                    "out_of_buffer",
                    "out_of_sequence",
                    "packet_seq_err",
                    "rx_icrc_encapsulated",
                    "np_cnp_sent",
                    "rp_cnp_handled",
                    "local_ack_timeout_err",
                    "implied_nak_seq_err",
                ]
            };
            for n in names {
                std::fs::write(p.join(n), "123456789\n")?;
            }
        }
        ports.push((name, 1));
    }
    Ok((dir, ports))
}

fn params() -> DriverParams {
    DriverParams {
        source_tor: "hostping".into(),
        round_interval_ns: 0,
        tor_mesh_rate: 0.0,
        inter_tor_rate: 1.0,
        service_rate: 1.0,
        host_rate: 0.0,
        host_round_ns: 1_000_000_000,
        probe_timeout_ns: 0,
        max_in_flight: 4096,
        flow_label_rotation_period_sec: 3600,
        service_level: 0,
        traffic_class: 0,
        analysis_window_ns: None,
        responder_only: false,
        seq_epoch: rand::random(),
        service_names: Default::default(),
        rate_multiplier: None,
    }
}

async fn cpu_phase(seconds: u64) -> serde_json::Value {
    // Baseline: the runtime with nothing to do, as long.
    let c0 = cpu_seconds();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let baseline = (cpu_seconds() - c0) / t0.elapsed().as_secs_f64();

    let (tree, ports) = counter_tree().expect("a temporary counter tree");
    let fs = RealSysfs::under(&tree.0);
    let opened: Vec<OpenedRnic> = (0..4)
        .map(|_| {
            OpenedRnic::from(
                UdpEndpoint::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), "hostping")
                    .expect("bind 127.0.0.1"),
            )
        })
        .collect();
    let plan = R2rPlan {
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(500),
        duration: Duration::from_secs(seconds),
        window: Duration::from_secs(20),
        timeout_th: 0.1,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let c1 = cpu_seconds();
    let t1 = Instant::now();
    let rates = Arc::new(Mutex::new(Vec::new()));
    // --only r2r | --only hwmon: one part alone (to see which costs what).
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let (run_r2r, run_mon) = match only.as_deref() {
        Some("r2r") => (true, false),
        Some("hwmon") => (false, true),
        _ => (true, true),
    };
    let r2r = async {
        let r = if run_r2r {
            r2r_run(opened, params(), &plan).await
        } else {
            tokio::time::sleep(plan.duration).await;
            Default::default()
        };
        let _ = stop_tx.send(true);
        r
    };
    let mon = async {
        if run_mon {
            let last = hw_monitor(&fs, &ports, Duration::from_secs(1), stop_rx).await;
            *rates.lock().unwrap() = last;
        }
    };
    let (report, ()) = tokio::join!(r2r, mon);
    let wall = t1.elapsed().as_secs_f64();
    let share = (cpu_seconds() - c1) / wall;
    json!({
        "bench": "hostping_cpu",
        "rnics": 4,
        "seconds": wall,
        "probes": report.probes,
        "timeouts": report.timeouts,
        "findings": report.findings.len(),
        "ports_sampled": rates.lock().unwrap().len(),
        "cpu_share_of_core": share,
        "baseline_idle_share_of_core": baseline,
        "target": 0.002,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let scenarios = if quick { 220 } else { 440 };
    let seconds = if quick { 5 } else { 60 };
    // --cpu-only: the CPU phase alone (for profiling it).
    let cpu_only = args.iter().any(|a| a == "--cpu-only");
    let t = Instant::now();
    let scores = if cpu_only {
        Vec::new()
    } else {
        evaluate(scenarios, 20261202, 0.2, 0.9)
    };
    let suite_sec = t.elapsed().as_secs_f64();
    let total: u32 = scores.iter().map(|k| k.scenarios).sum();
    for k in &scores {
        println!(
            "{}",
            json!({
                "bench": "hostping_inference",
                "fault_kind": k.kind,
                "scenarios": k.scenarios,
                "true_findings": k.true_findings,
                "false_findings": k.false_findings,
                "missed": k.missed,
                "redrawn_unidentifiable": k.redraws,
                "precision": k.precision,
                "recall": k.recall,
            })
        );
    }
    println!(
        "{}",
        json!({"bench": "hostping_suite", "scenarios": total, "seconds": suite_sec})
    );
    // As in the agent: two async workers.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    println!("{}", rt.block_on(cpu_phase(seconds)));
}
