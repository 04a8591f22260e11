//! Shared-memory backend benchmarks (JSON lines, medians of `--runs`):
//! - ring_round_trip_shm: depth-one echo through a ring pair between two processes,
//!   against two threads bouncing one cache line (the floor of any cross-core handoff);
//! - ring_throughput_shm: pipelined echoed messages per second through a 64 KiB ring,
//!   against the same messages (built and checked alike) through std's bounded channels
//!   between two threads.
//!
//! rc-ring-bench [--runs N] [--samples N] [--messages N]

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpingmesh_rc_ring::shm::ShmLink;
use rpingmesh_rc_ring::stress;
use rpingmesh_rc_ring::{Geometry, MAX_PAYLOAD};

const TIMEOUT: Duration = Duration::from_secs(120);

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// Runs `f` against a freshly spawned `rc-ring-shm serve` over a new shared file.
fn with_server<T>(
    budget: usize,
    f: impl FnOnce(&mut ShmLink) -> Result<T, String>,
) -> Result<T, String> {
    let dir = std::env::temp_dir();
    let path = dir.join(format!(
        "rc-ring-bench-{}-{}",
        std::process::id(),
        fastrand_u32()
    ));
    let geom = Geometry::for_budget(budget, page()).map_err(|e| e.to_string())?;
    let mut link = ShmLink::create(&path, geom).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let server = exe.with_file_name("rc-ring-shm");
    let mut child = Command::new(&server)
        .args(["serve", path.to_str().unwrap(), &budget.to_string(), "120"])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", server.display()))?;
    let r = f(&mut link);
    let status = child.wait().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&path);
    let out = r?;
    if !status.success() {
        return Err(format!("echo server exited with {status}"));
    }
    Ok(out)
}

fn fastrand_u32() -> u32 {
    Instant::now().elapsed().subsec_nanos() ^ std::process::id().rotate_left(16)
}

fn quantile(v: &mut [u64], q: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * q) as usize]
}

/// Two threads bounce a counter in one cache line: the round trip of a bare handoff.
fn cache_line_ping_pong(warmup: u64, samples: u64) -> Vec<u64> {
    #[repr(align(64))]
    struct Line(AtomicU64);
    let line = Arc::new(Line(AtomicU64::new(0)));
    let total = warmup + samples;
    let peer = {
        let line = line.clone();
        std::thread::spawn(move || {
            for i in 0..total {
                while line.0.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                line.0.store(2 * i + 2, Ordering::Release);
            }
        })
    };
    let mut out = Vec::with_capacity(samples as usize);
    for i in 0..total {
        let t0 = Instant::now();
        line.0.store(2 * i + 1, Ordering::Release);
        while line.0.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
        if i >= warmup {
            out.push(t0.elapsed().as_nanos() as u64);
        }
    }
    peer.join().unwrap();
    out
}

/// The same echo pipeline through std's bounded channels (256 deep, like the ring): the
/// same pattern messages, each checked on its return, so only the transport differs.
fn channel_pipeline(n: u64) -> f64 {
    type Msg = ([u8; MAX_PAYLOAD], usize);
    let (to_peer, peer_rx) = std::sync::mpsc::sync_channel::<Msg>(256);
    let (peer_tx, from_peer) = std::sync::mpsc::sync_channel::<Msg>(256);
    let peer = std::thread::spawn(move || {
        while let Ok(m) = peer_rx.recv() {
            if peer_tx.send(m).is_err() {
                break;
            }
        }
    });
    let t0 = Instant::now();
    let mut echoed = 0u64;
    let mut sent = 0u64;
    let mut want = [0u8; MAX_PAYLOAD];
    while echoed < n {
        while sent < n && sent - echoed < 256 {
            let mut m = [0u8; MAX_PAYLOAD];
            let len = stress::pattern(sent, &mut m);
            match to_peer.try_send((m, len)) {
                Ok(()) => sent += 1,
                Err(_) => break,
            }
        }
        while let Ok((m, len)) = from_peer.try_recv() {
            let wl = stress::pattern(echoed, &mut want);
            assert_eq!(&m[..len], &want[..wl], "channel echo {echoed}");
            echoed += 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    drop(to_peer);
    peer.join().unwrap();
    (2 * n) as f64 / secs
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut runs = 3;
    let mut samples = 200_000u64;
    let mut messages = 1_000_000u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().and_then(|v| v.parse::<u64>().ok());
        match (a.as_str(), v) {
            ("--runs", Some(v)) => runs = v as usize,
            ("--samples", Some(v)) => samples = v,
            ("--messages", Some(v)) => messages = v,
            _ => {
                eprintln!(
                    "rc-ring-bench: usage: rc-ring-bench [--runs N] [--samples N] [--messages N]"
                );
                std::process::exit(2);
            }
        }
    }
    let warmup = samples / 10;
    let (mut p50, mut p99, mut b50, mut b99) = (vec![], vec![], vec![], vec![]);
    let (mut ring_tp, mut chan_tp) = (vec![], vec![]);
    for _ in 0..runs {
        let mut rtt = with_server(64 * 1024, |l| {
            stress::depth_one_rtts(l, warmup, samples, TIMEOUT)
        })
        .unwrap_or_else(|e| fail(&e));
        p50.push(quantile(&mut rtt, 0.5) as f64);
        p99.push(quantile(&mut rtt, 0.99) as f64);
        let mut base = cache_line_ping_pong(warmup, samples);
        b50.push(quantile(&mut base, 0.5) as f64);
        b99.push(quantile(&mut base, 0.99) as f64);
        let tp = with_server(64 * 1024, |l| {
            let t0 = Instant::now();
            let c = stress::run_client(l, messages, None, TIMEOUT)?;
            Ok((c.sent + c.echoed) as f64 / t0.elapsed().as_secs_f64())
        })
        .unwrap_or_else(|e| fail(&e));
        ring_tp.push(tp);
        chan_tp.push(channel_pipeline(messages));
    }
    let (p50, p99, b50, b99) = (median(p50), median(p99), median(b50), median(b99));
    println!(
        "{{\"bench\":\"ring_round_trip_shm\",\"unit\":\"ns\",\"p50_ns\":{p50:.0},\"p99_ns\":{p99:.0},\
         \"baseline\":\"two threads, one cache line\",\"baseline_p50_ns\":{b50:.0},\"baseline_p99_ns\":{b99:.0},\
         \"ratio_to_baseline\":{:.2},\"samples\":{samples},\"runs\":{runs}}}",
        p50 / b50
    );
    let (r, c) = (median(ring_tp), median(chan_tp));
    println!(
        "{{\"bench\":\"ring_throughput_shm\",\"unit\":\"msgs/s\",\"msgs_per_sec\":{r:.0},\
         \"baseline\":\"std sync_channel(256) pair, two threads\",\"baseline_msgs_per_sec\":{c:.0},\
         \"ratio_to_baseline\":{:.2},\"messages\":{messages},\"ring_bytes\":65536,\"runs\":{runs}}}",
        r / c
    );
}

fn fail(e: &str) -> ! {
    eprintln!("rc-ring-bench: {e}");
    std::process::exit(1);
}
