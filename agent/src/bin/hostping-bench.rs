//! hostping-bench: JSON lines for `cargo xtask bench`.
//!
//! - `hostping_inference`: Algorithm 1 (link-state inference) over the randomized host
//!   suite of `rpingmesh_hostping::scenario` (hosts built as sysfs trees, discovered,
//!   loopback timings judged, 20 rounds each), precision and recall per fault kind.
//! - `hostping_cpu`: what Hostping adds to a running 4-RNIC agent: R2R probing between
//!   its four RNICs on the agent's own drivers (udp over loopback, one probe per RNIC per
//!   100 ms, 500 ms timeout) plus the Hostping monitor (R2R windows, four ports' counters
//!   once a second from a sysfs-shaped tree of real files). The process's CPU time as a
//!   share of one core, minus the same drivers running with nothing to probe for as long
//!   (the baseline, same run: what the agent pays without Hostping).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpingmesh_agent::config::AgentConfig;
use rpingmesh_agent::host_monitor;
use rpingmesh_agent::hostping::{r2r_targets, HostRnic, R2rPlan};
use rpingmesh_agent::rnic::{DriverParams, RnicDriver, StaticDriver};
use rpingmesh_agent::targets::Pinglists;
use rpingmesh_agent::telemetry::Metrics;
use rpingmesh_hostping::scenario::evaluate;
use rpingmesh_hostping::sysfs::RealSysfs;
use rpingmesh_verbs::udp::UdpEndpoint;
use serde_json::json;

/// (user, system) CPU seconds of the process so far.
fn cpu_seconds() -> (f64, f64) {
    // SAFETY: getrusage writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (tv(u.ru_utime), tv(u.ru_stime))
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
        focus_rate: 0.0,
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

/// (user, system) shares of one core the process used while `f` ran for `seconds`.
async fn share_over(seconds: u64, f: impl std::future::Future<Output = ()>) -> (f64, f64) {
    let (u0, s0) = cpu_seconds();
    let t = Instant::now();
    let _ = tokio::time::timeout(Duration::from_secs(seconds), f).await;
    let (u1, s1) = cpu_seconds();
    let wall = t.elapsed().as_secs_f64();
    ((u1 - u0) / wall, (s1 - s0) / wall)
}

/// What Hostping adds to a running 4-RNIC agent: the agent's four drivers run first with
/// nothing to probe (the baseline: what the agent pays anyway), then the same drivers get
/// the Host targets and the Hostping monitor runs beside them (R2R windows, four ports'
/// counters a second). The difference is Hostping's cost.
async fn cpu_phase(seconds: u64) -> serde_json::Value {
    let (tree, _ports) = counter_tree().expect("a temporary counter tree");
    let cfg = AgentConfig::default();
    let mut params = params();
    params.probe_timeout_ns = cfg.hostping_r2r_timeout_ms * 1_000_000;
    R2rPlan::from_config(&cfg).pace(&mut params, 4);
    let drivers: Vec<RnicDriver> = (0..4)
        .map(|i| {
            let ep = UdpEndpoint::bind(
                SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
                &format!("udp{i}"),
            )
            .expect("bind 127.0.0.1");
            RnicDriver::new(ep, params.clone(), Metrics::disabled())
        })
        .collect();
    let rnics: Vec<HostRnic> = drivers.iter().map(HostRnic::from).collect();
    let mut handles = Vec::new();
    let mut rxs = Vec::new();
    let mut stats = Vec::new();
    for d in drivers {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        stats.push(d.stats());
        handles.push(StaticDriver::spawn(d, Pinglists::default(), None, Some(tx)));
        rxs.push(rx);
    }
    // Baseline: the drivers with empty lists.
    let baseline = share_over(seconds, std::future::pending()).await;

    for (i, (h, _)) in handles.iter().enumerate() {
        let _ = h.pinglists.send(Arc::new(Pinglists {
            host: r2r_targets(&rnics, i),
            ..Default::default()
        }));
    }
    let (_rnics_tx, rnics_rx) = tokio::sync::watch::channel(rnics);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let monitor = host_monitor::run(
        Arc::new(cfg),
        host_monitor::HostMonitorIo {
            rnics: rnics_rx,
            outcomes: rxs,
            client: None,
            meter: Metrics::disabled().meter().clone(),
            shutdown: stop_rx,
            sysfs: RealSysfs::under(&tree.0),
        },
    );
    let sent0: u64 = stats.iter().map(|s| s.snapshot().probes_sent).sum();
    let with = share_over(seconds, monitor).await;
    let sent: u64 = stats.iter().map(|s| s.snapshot().probes_sent).sum::<u64>() - sent0;
    let failed: u64 = stats.iter().map(|s| s.snapshot().probe_failed).sum();
    let _ = stop_tx.send(true);
    for (h, t) in handles {
        h.stop();
        let _ = t.await;
    }
    let total = |x: (f64, f64)| x.0 + x.1;
    json!({
        "bench": "hostping_cpu",
        "rnics": 4,
        "seconds": seconds,
        "probes": sent,
        "timeouts": failed,
        "agent_drivers_share_of_core": total(baseline),
        "with_hostping_share_of_core": total(with),
        "cpu_share_of_core": (total(with) - total(baseline)).max(0.0),
        // The split: user space is the agent's own work (scheduler, prober, responder,
        // monitor); system time is mostly the kernel's UDP/IP path over loopback, which
        // an RNIC does in hardware on the rdma transport.
        "user_share_of_core": (with.0 - baseline.0).max(0.0),
        "system_share_of_core": (with.1 - baseline.1).max(0.0),
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
    let workers: usize = std::env::var("HOSTPING_BENCH_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a runtime");
    println!("{}", rt.block_on(cpu_phase(seconds)));
}
