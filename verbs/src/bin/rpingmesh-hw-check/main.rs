//! rpingmesh-hw-check: for an operator on an RDMA host (or soft-RoCE:
//! `rdma link add rxe0 type rxe netdev <if>`). Opens every device, prints its GID tables,
//! timestamp support and clock, then runs a loopback probe (two RNICs, or two QPs on one)
//! with the 6-timestamp arithmetic and prints the RTT table. Exit 1 with one clear line
//! when there is no RDMA device.
//!
//! Usage: rpingmesh-hw-check [--port P] [--gid-index N[,M]] [--count N] [--interval-ms MS]
//!        [DEVICE ...]
//!        rpingmesh-hw-check --loopback [--port P] [--gid-index N] [--count N]
//!        [--sizes B[,B...]] [--numa-node N] [--gpu BUS_ID] [DEVICE ...]
//! (`--gid-index N,M`: the second endpoint on GID index M, e.g. two GIDs of one device;
//! `--interval-ms` spaces the probes as an agent does; 0 = back to back.)
//!
//! `--loopback`: the hostping loopback test on each device instead: an RC QP connected
//! to itself RDMA-WRITEs `--count` times (default 20) per size (default 1 and 262144
//! bytes) between two regions (on NUMA node `--numa-node` if given; the write region in
//! the memory of the GPU at PCI address `--gpu`, through libcuda, if given); prints min, median
//! and max post-to-completion times per size, Eq. 3's bandwidth from the medians of the
//! smallest and largest sizes, and how long each setup verb took. GID index 1 by default
//! (rxe's first RoCE v2 IPv4 GID).

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use rpingmesh_verbs::rdma::loopback::{run_loopback, LoopbackOptions, LoopbackResult};
use rpingmesh_verbs::rdma::{self, sysfs, RdmaEndpoint, RdmaOptions};
use rpingmesh_verbs::{Endpoint, SendId, SendParams, TransportEvent};

struct Args {
    port: u8,
    /// Default 0 for the probe, 1 for `--loopback`.
    gid_index: Option<u32>,
    /// GID index of the second endpoint (default: the same).
    peer_gid_index: Option<u32>,
    count: u32,
    interval_ms: u64,
    devices: Vec<String>,
    loopback: bool,
    /// `--sizes` (loopback; default 1 and 262144).
    sizes: Option<Vec<usize>>,
    numa_node: Option<u32>,
    gpu: Option<String>,
}

const USAGE: &str = "usage: rpingmesh-hw-check [--port P] [--gid-index N[,M]] [--count N] [--interval-ms MS] [DEVICE ...]\n       rpingmesh-hw-check --loopback [--port P] [--gid-index N] [--count N] [--sizes B[,B...]] [--numa-node N] [--gpu BUS_ID] [DEVICE ...]";

fn parse_args(argv: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        port: 1,
        gid_index: None,
        peer_gid_index: None,
        count: 20,
        interval_ms: 0,
        devices: Vec::new(),
        loopback: false,
        sizes: None,
        numa_node: None,
        gpu: None,
    };
    let mut it = argv.into_iter();
    while let Some(arg) = it.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            let v = it.next().ok_or_else(|| format!("{name} needs a value"))?;
            v.parse()
                .map_err(|_| format!("{name}: {v:?} is not a number"))
        };
        match arg.as_str() {
            "--port" => {
                a.port =
                    u8::try_from(num("--port")?).map_err(|_| "--port: out of range".to_string())?
            }
            "--gid-index" => {
                let v = it.next().ok_or("--gid-index needs a value")?;
                let idx = |t: &str| -> Result<u32, String> {
                    t.parse()
                        .map_err(|_| format!("--gid-index: {v:?} is not N or N,M"))
                };
                match v.split_once(',') {
                    Some((x, y)) => {
                        a.gid_index = Some(idx(x)?);
                        a.peer_gid_index = Some(idx(y)?);
                    }
                    None => a.gid_index = Some(idx(&v)?),
                }
            }
            "--count" => {
                a.count = u32::try_from(num("--count")?)
                    .map_err(|_| "--count: out of range".to_string())?
                    .max(1)
            }
            "--interval-ms" => a.interval_ms = num("--interval-ms")?.min(60_000),
            "--loopback" => a.loopback = true,
            "--gpu" => a.gpu = Some(it.next().ok_or("--gpu needs a PCI address")?),
            "--numa-node" => {
                a.numa_node = Some(
                    u32::try_from(num("--numa-node")?)
                        .map_err(|_| "--numa-node: out of range".to_string())?,
                )
            }
            "--sizes" => {
                let v = it.next().ok_or("--sizes needs a value")?;
                let sizes: Result<Vec<usize>, _> = v.split(',').map(str::parse).collect();
                a.sizes = Some(
                    sizes.map_err(|_| format!("--sizes: {v:?} is not a list of byte counts"))?,
                );
            }
            "-h" | "--help" => return Err(USAGE.into()),
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            d => a.devices.push(d.to_string()),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rpingmesh-hw-check: {e}");
            return ExitCode::from(2);
        }
    };
    if args.peer_gid_index.is_some() && args.loopback {
        eprintln!("rpingmesh-hw-check: --loopback takes one GID index (the QP is its own peer)");
        return ExitCode::from(2);
    }
    let devices = match rdma::list_devices(&args.devices) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("rpingmesh-hw-check: {e}");
            return ExitCode::from(1);
        }
    };
    if args.loopback {
        return loopback_report(&args, &devices);
    }
    report(args, devices)
}

/// The loopback options `args` ask for on `device`.
fn loopback_options(args: &Args, device: &str) -> LoopbackOptions {
    let mut o = LoopbackOptions::new(device);
    o.port = args.port;
    o.gid_index = args.gid_index.unwrap_or(1);
    o.samples = args.count;
    o.numa_node = args.numa_node;
    o.gpu = args.gpu.clone();
    if let Some(s) = &args.sizes {
        o.sizes = s.clone();
    }
    o
}

/// `--loopback`: runs the test on each device, stops at the first failure (exit 1).
fn loopback_report(args: &Args, devices: &[String]) -> ExitCode {
    for d in devices {
        match run_loopback(&loopback_options(args, d)) {
            Ok(r) => print!("{}", format_loopback(&r)),
            Err(e) => {
                eprintln!("rpingmesh-hw-check: loopback {d}: {e}");
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}

/// The loopback table of one device.
fn format_loopback(r: &LoopbackResult) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut place = match r.numa_node {
        Some(n) => format!("memory bound to NUMA node {n}"),
        None => "memory on the default NUMA policy".to_string(),
    };
    if let Some(g) = &r.gpu {
        place = format!("read region in host {place}, write region on GPU {g}");
    }
    let _ = writeln!(
        out,
        "== {} loopback: RC QP {} -> itself, GID {}, {place}",
        r.device, r.qpn, r.gid
    );
    let _ = writeln!(
        out,
        "   {:>10} {:>7} {:>12} {:>12} {:>12}",
        "size_B", "samples", "min_ns", "median_ns", "max_ns"
    );
    let sums = r.summaries();
    for s in &sums {
        let _ = writeln!(
            out,
            "   {:>10} {:>7} {:>12} {:>12.0} {:>12}",
            s.size, s.samples, s.min_ns, s.median_ns, s.max_ns
        );
    }
    let small = sums.iter().min_by_key(|s| s.size);
    let large = sums.iter().max_by_key(|s| s.size);
    if let Some(s) = small {
        let _ = writeln!(
            out,
            "   Eq.2 T_proc + Lat_host ({} B median): {:.2} us",
            s.size,
            s.median_ns / 1000.0
        );
    }
    match (small, large) {
        (Some(s), Some(l)) if l.size > s.size => match r.bandwidth_gbps() {
            Some(bw) => {
                let _ = writeln!(
                    out,
                    "   Eq.3 BW_host: {bw:.3} Gb/s = 8*({}-{}) bits / ({:.0}-{:.0}) ns",
                    l.size, s.size, l.median_ns, s.median_ns
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "   Eq.3 BW_host: none ({} B median {:.0} ns is not above {} B median {:.0} ns)",
                    l.size, l.median_ns, s.size, s.median_ns
                );
            }
        },
        _ => {
            let _ = writeln!(out, "   Eq.3 BW_host: needs two sizes");
        }
    }
    let verbs: Vec<String> = r
        .verbs
        .iter()
        .map(|v| format!("{} {:.1} us", v.verb, v.micros))
        .collect();
    let _ = writeln!(out, "   verbs: {}", verbs.join(", "));
    out
}

fn report(args: Args, devices: Vec<String>) -> ExitCode {
    let class = Path::new(sysfs::SYSFS_CLASS_DIR);
    for d in &devices {
        match rdma::device_info(d, class) {
            Ok(info) => {
                println!("== {d}");
                println!(
                    "   hca_core_clock {} kHz, completion_timestamp_mask {:#x}, raw clock now {}",
                    info.hca_core_clock_khz,
                    info.completion_timestamp_mask,
                    info.raw_clock
                        .map(|t| t.to_string())
                        .unwrap_or_else(|| "unsupported".into())
                );
                match &info.extended_cq_timestamps {
                    Ok(()) => println!("   NIC completion timestamps: supported (extended CQ)"),
                    Err(e) => println!("   NIC completion timestamps: unavailable ({e}); CLOCK_MONOTONIC software timestamps"),
                }
                for p in &info.ports {
                    match p {
                        Ok(p) => {
                            for line in sysfs::format_gid_table(p).lines() {
                                println!("   {line}");
                            }
                            if let Ok(e) = sysfs::select_gid(p, args.gid_index.unwrap_or(0)) {
                                if let Some(w) = sysfs::roce_v1_warning(p, e) {
                                    println!("   warning: {w}");
                                }
                            }
                        }
                        Err(e) => println!("   {e}"),
                    }
                }
            }
            Err(e) => println!("== {d}: {e}"),
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rpingmesh-hw-check: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // Two RNICs when there are two, else two QPs on the one.
    let (da, db) = (
        devices[0].clone(),
        devices
            .get(1)
            .cloned()
            .unwrap_or_else(|| devices[0].clone()),
    );
    let open = |d: &str, gid_index: u32| {
        let mut o = RdmaOptions::new(d);
        o.port = args.port;
        o.gid_index = gid_index;
        rdma::open_rdma_with(&o)
    };
    let gid_index = args.gid_index.unwrap_or(0);
    let peer_gid = args.peer_gid_index.unwrap_or(gid_index);
    let (a, b) = match (open(&da, gid_index), open(&db, peer_gid)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("rpingmesh-hw-check: loopback probe: {e}");
            return ExitCode::from(1);
        }
    };
    println!(
        "loopback {da} {} qpn {} ({:?}) -> {db} {} qpn {} ({:?})",
        a.ip_string(),
        a.local().qpn,
        a.timestamp_source(),
        b.ip_string(),
        b.local().qpn,
        b.timestamp_source()
    );
    let result = rt.block_on(probe_loop(
        &a,
        &b,
        args.count,
        Duration::from_millis(args.interval_ms),
    ));
    match result {
        Ok(mut rtts) => {
            rtts.sort_unstable();
            let pick = |q: f64| rtts[((rtts.len() - 1) as f64 * q).round() as usize];
            println!(
                "{:<10} {:>6} {:>10} {:>10} {:>10} {:>10}",
                "path", "probes", "min_ns", "p50_ns", "p99_ns", "max_ns"
            );
            println!(
                "{:<10} {:>6} {:>10} {:>10} {:>10} {:>10}",
                format!("{da}->{db}"),
                rtts.len(),
                rtts[0],
                pick(0.5),
                pick(0.99),
                rtts[rtts.len() - 1]
            );
            let s = a.stats();
            println!(
                "ah cache: hits {} misses {} evictions {}; event ring dropped {}",
                s.ah_hits, s.ah_misses, s.ah_evictions, s.event_ring_dropped
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rpingmesh-hw-check: loopback probe {da}->{db}: {e}");
            ExitCode::from(1)
        }
    }
}

/// Waits (bounded) for the send completion of `id` on `ep` and a receive from `from`.
async fn await_pair(
    ep: &RdmaEndpoint,
    id: Option<SendId>,
    from: Option<Endpoint>,
    buf: &mut Vec<TransportEvent>,
) -> Result<(Option<u64>, Option<u64>), String> {
    let (mut tx, mut rx) = (None, None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while (id.is_some() && tx.is_none()) || (from.is_some() && rx.is_none()) {
        buf.clear();
        match tokio::time::timeout_at(deadline, ep.wait_events(buf)).await {
            Err(_) => {
                return Err(format!(
                    "timed out on {} (send completion {}, receive {})",
                    ep.device_name(),
                    tx.is_some(),
                    rx.is_some()
                ))
            }
            Ok(Err(e)) => return Err(e.to_string()),
            Ok(Ok(())) => {}
        }
        for ev in buf.iter() {
            match *ev {
                TransportEvent::Sent { id: got, tx_ts_ns } if Some(got) == id => {
                    tx = Some(tx_ts_ns)
                }
                TransportEvent::Received {
                    from: f, rx_ts_ns, ..
                } if Some(f) == from => rx = rx_ts_ns,
                _ => {}
            }
        }
    }
    Ok((tx, rx))
}

async fn probe_loop(
    a: &RdmaEndpoint,
    b: &RdmaEndpoint,
    count: u32,
    interval: Duration,
) -> Result<Vec<u64>, String> {
    let params = SendParams::default();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let mut rtts = Vec::new();
    for seq in 0..count {
        if seq > 0 && !interval.is_zero() {
            tokio::time::sleep(interval).await;
        }
        let mut payload = [0u8; 40];
        payload[..4].copy_from_slice(&seq.to_be_bytes());
        let id = a
            .send(&b.local(), &params, &payload)
            .map_err(|e| e.to_string())?;
        let (t2, _) = await_pair(a, Some(id), None, &mut ea).await?;
        let (_, t3) = await_pair(b, None, Some(a.local()), &mut eb).await?;
        let ack = b
            .send(&a.local(), &params, &payload)
            .map_err(|e| e.to_string())?;
        let (t4, _) = await_pair(b, Some(ack), None, &mut eb).await?;
        let (_, t5) = await_pair(a, None, Some(b.local()), &mut ea).await?;
        let (t2, t3, t4, t5) = (
            t2.unwrap_or(0),
            t3.unwrap_or(0),
            t4.unwrap_or(0),
            t5.unwrap_or(0),
        );
        let rtt = (t5 as i128 - t2 as i128) - (t4 as i128 - t3 as i128);
        if rtt < 0 {
            return Err(format!(
                "probe {seq}: negative network RTT {rtt} ns (clock domain problem)"
            ));
        }
        rtts.push(rtt as u64);
    }
    Ok(rtts)
}

#[cfg(test)]
mod tests;
