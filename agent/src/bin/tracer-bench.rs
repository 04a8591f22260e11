//! tracer-bench: the service tracer's costs, one JSON object per line on stdout, about
//! 23 s in total.
//!
//! (a) events/s through the userspace pipeline (ring-buffer-shaped `QpEvent` bytes ->
//!     decode -> `FlowTable` apply) on one core, against copying the same bytes into a
//!     Vec, interleaved in the same run; and again with each new flow resolved to its
//!     workload (64 Slurm jobs' cgroups, cached) and mapped to what the reporter sends;
//! (b) per-call cost of a traced function: this binary exports `ibv_create_qp`,
//!     `ibv_modify_qp` and `ibv_destroy_qp` with the libibverbs layouts, times
//!     `ibv_modify_qp` (INIT->RTR with a GRH, the heaviest probe path) untraced, then with
//!     the tracer's uprobes attached to /proc/self/exe; needs root (else a skip line);
//! (c) probing under a QP storm: two real drivers on 127.0.0.1 probe each other (and
//!     shared responders) at a fixed busy rate, quiet, then with a thread calling the traced create / modify(RTR) /
//!     destroy flat out, untraced and then with the tracer attached; completed probes/s
//!     and RTT / prober-delay percentiles from the outcome tap; needs root (else a skip
//!     line). About 10 s.
//!
//! Usage: tracer-bench [--seconds-per-run S] [--runs N] [--only pipeline|uprobe|storm]

use std::ffi::{c_int, c_void};
use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpingmesh_agent::rnic::{DriverParams, RnicDriver, StaticDriver, TargetOutcome};
use rpingmesh_agent::service::{to_proto_flow, ServiceNames};
use rpingmesh_agent::targets::{Pinglists, ProbeTarget};
use rpingmesh_agent::telemetry::Metrics;
use rpingmesh_agent::workload::{HostView, WorkloadResolver};
use rpingmesh_protocol::prober::ProbeResult;
use rpingmesh_protocol::PinglistKind;
use rpingmesh_verbs::udp::UdpEndpoint;

use rpingmesh_agent_common::event::*;
use rpingmesh_service_tracer::{
    FlowChange, FlowTable, FlowTableConfig, ServiceTracer, Started, TracerConfig, TracingMode,
};
use serde_json::json;

// ------------------------------------------------------------------ (a) pipeline

/// QPs alive at once in the generated stream.
const LIVE_QPS: u32 = 4096;
/// Records per pass (a fresh table each pass, so late-event tombstones never pile up).
const PASS_RECORDS: usize = 1 << 18;

/// A realistic lifecycle stream: per QP create, modify to INIT (port), modify to RTR
/// (AV with GRH: a flow), destroy; QPs interleaved so that `LIVE_QPS` are open at once.
fn generate() -> Vec<u8> {
    let mut out = Vec::with_capacity(PASS_RECORDS * QP_EVENT_SIZE);
    let mut t = 1_000u64;
    let mut ev = QpEvent::zeroed();
    ev.tgid = 4242;
    ev.pid = 4242;
    ev.cgroup_id = 7;
    ev.comm[..7].copy_from_slice(b"trainer");
    ev.dev_name[..9].copy_from_slice(b"mlx5_bond");
    ev.source = SOURCE_UPROBE;
    ev.qp_type = 2;
    let lifecycles = PASS_RECORDS / 4;
    // Step k: create QP k, INIT QP k-1, RTR QP k-2 ... destroy QP k-LIVE: a sliding window.
    let mut k = 0u32;
    while out.len() < PASS_RECORDS * QP_EVENT_SIZE {
        let mut push = |kind: u8, qpn: u32, f: &dyn Fn(&mut QpEvent)| {
            t += 100;
            let mut e = ev;
            e.boot_ns = t;
            e.kind = kind;
            e.qp_num = qpn;
            f(&mut e);
            if out.len() < PASS_RECORDS * QP_EVENT_SIZE {
                out.extend_from_slice(e.as_bytes());
            }
        };
        let qpn = |i: u32| 0x100 + (i % (lifecycles as u32 * 2));
        // QPs of 64 jobs (cgroups).
        let cg = 1000 + (k % 64) as u64;
        let mut push = |kind: u8, qpn: u32, f: &dyn Fn(&mut QpEvent)| {
            push(kind, qpn, &|e: &mut QpEvent| {
                e.cgroup_id = cg;
                f(e)
            })
        };
        push(KIND_CREATE, qpn(k), &|e| e.port = 1);
        if k >= 1 {
            push(KIND_MODIFY, qpn(k - 1), &|e| {
                e.attr_mask = QP_ATTR_STATE | QP_ATTR_PORT;
                e.qp_state = QPS_INIT;
                e.port = 1;
            });
        }
        if k >= 2 {
            let i = k - 2;
            push(KIND_MODIFY, qpn(i), &|e| {
                e.attr_mask = QP_ATTR_STATE | QP_ATTR_AV | QP_ATTR_DEST_QPN;
                e.qp_state = QPS_RTR;
                e.flags = FLAG_GRH;
                e.port = 1;
                e.sgid_index = 3;
                e.dest_qp_num = 0x9000 + i;
                e.dgid = [
                    0xfe,
                    0x80,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    (i >> 16) as u8,
                    (i >> 8) as u8,
                    i as u8,
                    1,
                ];
                e.flow_label = i & 0xf_ffff;
                e.traffic_class = 106;
                e.sl = 3;
                e.hop_limit = 64;
            });
        }
        if k >= LIVE_QPS {
            push(KIND_DESTROY, qpn(k - LIVE_QPS), &|_| {});
        }
        k += 1;
    }
    out
}

/// A host of 64 Slurm jobs' cgroups (ids 1000..1064), in memory: what the agent's
/// workload resolver reads, without the file system.
struct JobsHost;

impl HostView for JobsHost {
    fn proc_cgroup(&self, _pid: u32) -> Option<String> {
        None
    }
    fn cgroup_id(&self, path: &str) -> Option<u64> {
        let n: u64 = path.split("job_").nth(1)?.split('/').next()?.parse().ok()?;
        Some(1000 + n)
    }
    fn find_cgroup(&self, id: u64) -> Option<String> {
        (1000..1064).contains(&id).then(|| {
            format!(
                "/system.slice/slurmstepd.scope/job_{}/step_0/user/task_0",
                id - 1000
            )
        })
    }
    fn pod_names(&self, _uid: &str) -> Option<(String, String)> {
        None
    }
    fn slurm_job_name(&self, id: &str) -> Option<String> {
        Some(format!("job-{id}"))
    }
    fn alive(&self, _pid: u32) -> bool {
        true
    }
}

/// Events/s of decode + apply, one thread, for about `dur`; with `workloads`, each new
/// flow is also resolved to its workload and mapped to what the reporter sends (the
/// agent's per-flow cost of naming jobs). Returns (rate, flow changes).
fn pipeline(stream: &[u8], dur: Duration, workloads: bool) -> (f64, u64) {
    let local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];
    let resolver = move |_: &str, _: u8, _: u8| Some(local);
    let filter = |_: u32, _: &str, _: u32| false;
    let names = ServiceNames::default();
    let mut jobs = WorkloadResolver::new(JobsHost);
    let mut out: Vec<FlowChange> = Vec::with_capacity(1024);
    let mut events = 0u64;
    let mut changes = 0u64;
    let mut drain = |out: &mut Vec<FlowChange>, changes: &mut u64| {
        *changes += out.len() as u64;
        if workloads {
            for c in out.iter() {
                if let FlowChange::Upsert(f) = c {
                    let w = jobs.resolve(f.pid, f.cgroup_id, &f.comm);
                    black_box(to_proto_flow(f, &names, 0, &w));
                }
            }
        }
        out.clear();
    };
    let start = Instant::now();
    while start.elapsed() < dur {
        let mut table = FlowTable::new(FlowTableConfig::default());
        for rec in stream.chunks_exact(QP_EVENT_SIZE) {
            table.apply_bytes(rec, &resolver, &filter, &mut out);
            if out.len() >= 1024 {
                drain(&mut out, &mut changes);
            }
        }
        drain(&mut out, &mut changes);
        events += (stream.len() / QP_EVENT_SIZE) as u64;
        black_box(&table);
    }
    (events as f64 / start.elapsed().as_secs_f64(), changes)
}

/// Baseline: copy each record into a Vec (what any reader of the ring must do at least).
fn copy_baseline(stream: &[u8], dur: Duration) -> f64 {
    let mut sink: Vec<u8> = Vec::with_capacity(stream.len());
    let mut events = 0u64;
    let start = Instant::now();
    while start.elapsed() < dur {
        sink.clear();
        for rec in stream.chunks_exact(QP_EVENT_SIZE) {
            sink.extend_from_slice(black_box(rec));
        }
        black_box(&sink);
        events += (stream.len() / QP_EVENT_SIZE) as u64;
    }
    events as f64 / start.elapsed().as_secs_f64()
}

// ------------------------------------------------------------------ (b) uprobe overhead

/// Stands in for a provider: the "QP" created is whatever the caller passes as `pd`
/// (part (c) passes a `QpImage`, so the tracer's return probe reads a real `ibv_qp`;
/// part (b) passes null, a failed creation the tracer ignores).
///
/// # Safety
/// Pointers are only passed through.
#[no_mangle]
#[inline(never)]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut c_void, init: *mut c_void) -> *mut c_void {
    black_box(init);
    black_box(pd)
}

/// The traced function: what the caller pays is the call plus (traced) the uprobe.
///
/// # Safety
/// Pointers are only passed through.
#[no_mangle]
#[inline(never)]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut c_void, attr: *mut c_void, mask: c_int) -> c_int {
    black_box((qp, attr, mask));
    0
}

/// # Safety
/// Pointer only passed through.
#[no_mangle]
#[inline(never)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut c_void) -> c_int {
    black_box(qp);
    0
}

/// `struct ibv_qp`, `ibv_context`, `ibv_device` and `ibv_qp_attr` images with the
/// libibverbs layout (8-aligned byte buffers), so the uprobe reads real fields.
struct QpImage {
    device: Vec<u64>,
    context: Vec<u64>,
    qp: Vec<u64>,
    attr: Vec<u64>,
}

fn put<T: Copy>(buf: &mut [u64], off: usize, v: T) {
    let bytes = buf.as_mut_ptr() as *mut u8;
    assert!(off + std::mem::size_of::<T>() <= buf.len() * 8);
    // SAFETY: bounds checked above; unaligned write into our own buffer.
    unsafe { std::ptr::write_unaligned(bytes.add(off) as *mut T, v) }
}

impl QpImage {
    fn new() -> Box<QpImage> {
        let mut img = Box::new(QpImage {
            device: vec![0; 64],
            context: vec![0; 40],
            qp: vec![0; ibv::QP_SIZE / 8],
            attr: vec![0; ibv::ATTR_SIZE / 8],
        });
        for (i, b) in b"bench_dev0".iter().enumerate() {
            put(&mut img.device, ibv::DEVICE_NAME + i, *b);
        }
        let dev_ptr = img.device.as_ptr() as u64;
        put(&mut img.context, ibv::CONTEXT_DEVICE, dev_ptr);
        let ctx_ptr = img.context.as_ptr() as u64;
        put(&mut img.qp, ibv::QP_CONTEXT, ctx_ptr);
        put(&mut img.qp, ibv::QP_QP_NUM, 0x345u32);
        put(&mut img.qp, ibv::QP_QP_TYPE, 2u32);
        put(&mut img.attr, ibv::ATTR_QP_STATE, QPS_RTR as u32);
        put(&mut img.attr, ibv::ATTR_DEST_QP_NUM, 0x777u32);
        let ah = ibv::ATTR_AH_ATTR;
        put(
            &mut img.attr,
            ah + ibv::AH_GRH + ibv::GRH_DGID,
            [0xfeu8, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        );
        put(
            &mut img.attr,
            ah + ibv::AH_GRH + ibv::GRH_FLOW_LABEL,
            0x5a5a5u32,
        );
        put(&mut img.attr, ah + ibv::AH_GRH + ibv::GRH_SGID_INDEX, 1u8);
        put(&mut img.attr, ah + ibv::AH_GRH + ibv::GRH_HOP_LIMIT, 64u8);
        put(
            &mut img.attr,
            ah + ibv::AH_GRH + ibv::GRH_TRAFFIC_CLASS,
            96u8,
        );
        put(&mut img.attr, ah + ibv::AH_SL, 4u8);
        put(&mut img.attr, ah + ibv::AH_IS_GLOBAL, 1u8);
        put(&mut img.attr, ah + ibv::AH_PORT_NUM, 1u8);
        img
    }
}

/// The line of a bench that could not run here, and why.
fn skipped(bench: &str, why: String) {
    println!("{}", json!({"bench": bench, "skipped": why}));
}

/// This executable, when the tracer may attach uprobes to it (else why not).
fn traceable_self() -> Result<std::path::PathBuf, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root: attaching uprobes needs CAP_BPF + CAP_PERFMON".into());
    }
    std::fs::read_link("/proc/self/exe").map_err(|e| format!("/proc/self/exe: {e}"))
}

/// The tracer on `exe`'s libibverbs uprobes alone, every GID resolved to one link-local
/// address and no QP filtered out.
fn start_uprobe_tracer(rt: &tokio::runtime::Runtime, exe: std::path::PathBuf) -> Started {
    let cfg = TracerConfig {
        mode: TracingMode::Uprobe,
        discover_libibverbs: false,
        uprobe_targets: vec![exe],
        liveness_interval: Duration::from_millis(200),
        ..Default::default()
    };
    rt.block_on(async {
        ServiceTracer::start(
            cfg,
            Arc::new(|_: &str, _: u8, _: u8| {
                Some([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
            }),
            Arc::new(|_: u32, _: &str, _: u32| false),
        )
    })
}

/// ns per `ibv_modify_qp` call over `calls` calls.
fn time_calls(img: &mut QpImage, calls: u64) -> f64 {
    let f: unsafe extern "C" fn(*mut c_void, *mut c_void, c_int) -> c_int =
        black_box(ibv_modify_qp);
    let mask = (QP_ATTR_STATE | QP_ATTR_AV | QP_ATTR_DEST_QPN) as c_int;
    let (qp, attr) = (
        img.qp.as_mut_ptr() as *mut c_void,
        img.attr.as_mut_ptr() as *mut c_void,
    );
    let start = Instant::now();
    for _ in 0..calls {
        // SAFETY: the images outlive the calls; the function only passes pointers through.
        black_box(unsafe { f(black_box(qp), attr, mask) });
    }
    start.elapsed().as_nanos() as f64 / calls as f64
}

fn uprobe_bench(budget: Duration) {
    let skip = |why: String| skipped("uprobe_call_overhead", why);
    let exe = match traceable_self() {
        Ok(p) => p,
        Err(why) => return skip(why),
    };
    let mut img = QpImage::new();
    // Referenced, so the linker keeps the three symbols the tracer attaches to.
    // SAFETY: both only pass their arguments to black_box.
    unsafe {
        black_box(black_box(
            ibv_create_qp as unsafe extern "C" fn(*mut c_void, *mut c_void) -> *mut c_void,
        )(std::ptr::null_mut(), std::ptr::null_mut()));
        black_box(black_box(
            ibv_destroy_qp as unsafe extern "C" fn(*mut c_void) -> c_int,
        )(std::ptr::null_mut()));
    }
    // Warm up, then size the untraced run to about a quarter of the budget.
    time_calls(&mut img, 1_000_000);
    let probe = time_calls(&mut img, 1_000_000).max(0.1);
    let untraced_calls = ((budget.as_nanos() as f64 / 4.0) / probe).clamp(1e6, 5e8) as u64;
    let untraced = time_calls(&mut img, untraced_calls);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let tracer = match start_uprobe_tracer(&rt, exe) {
        Started::Running(t) => t,
        Started::Off(why) => return skip(why),
    };
    // The reader drains the ring on the runtime's worker while this thread calls.
    time_calls(&mut img, 10_000);
    let probe = time_calls(&mut img, 10_000).max(1.0);
    let traced_calls = ((budget.as_nanos() as f64 / 2.0) / probe).clamp(10_000.0, 5e6) as u64;
    let before = tracer.stats();
    let traced = time_calls(&mut img, traced_calls);
    // Let the reader catch up and the counters be read.
    std::thread::sleep(Duration::from_millis(600));
    let after = tracer.stats();
    let seen = after.events - before.events;
    let dropped = after.ringbuf_drops - before.ringbuf_drops;
    drop(tracer);
    drop(rt);
    println!(
        "{}",
        json!({"bench": "uprobe_call_overhead", "unit": "ns/call", "untraced": untraced, "traced": traced,
               "overhead_ns": traced - untraced, "ratio": if untraced > 0.0 { traced / untraced } else { 0.0 },
               "untraced_calls": untraced_calls, "traced_calls": traced_calls,
               "events_seen": seen, "ringbuf_dropped": dropped})
    );
}

// ------------------------------------------------------------------ (c) probing under a QP storm

/// Probes/s each of the two probing drivers sends: a busy agent (a thousand targets at
/// the default two probes/s each), spread over `STORM_TARGETS` targets so that the
/// per-kind token bucket (capacity = target count) rides over the runtime's 1 ms timer.
const STORM_PROBE_RATE: f64 = 2_000.0;
/// Targets per probing driver: the other prober plus responder-only drivers.
const STORM_TARGETS: usize = 8;

/// What one measured window of the two drivers gave.
struct ProbePhase {
    /// Completed (successful) probes/s, both drivers together.
    probes_per_sec: f64,
    failed_or_invalid: u64,
    rtt_p50: u64,
    rtt_p99: u64,
    delay_p50: u64,
    delay_p99: u64,
}

/// The `p` quantile (0..=1) of sorted `v`, nearest rank; 0 when empty.
fn quantile(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn bind_udp() -> UdpEndpoint {
    UdpEndpoint::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), "bench").expect("bind 127.0.0.1")
}

/// Two drivers probing each other (and `STORM_TARGETS - 1` shared responders) at
/// `STORM_PROBE_RATE` each for `dur` after a warm-up, on the current (multi-thread, as
/// in the agent) runtime.
async fn probe_phase(dur: Duration) -> ProbePhase {
    let per_target = STORM_PROBE_RATE / STORM_TARGETS as f64;
    let params = |tor: &str, responder_only: bool| DriverParams {
        source_tor: tor.into(),
        round_interval_ns: (1e9 / per_target) as u64,
        tor_mesh_rate: per_target,
        inter_tor_rate: per_target,
        service_rate: per_target,
        focus_rate: 0.0,
        host_rate: 0.0,
        host_round_ns: 1_000_000_000,
        probe_timeout_ns: 500_000_000,
        max_in_flight: 64,
        flow_label_rotation_period_sec: 3600,
        service_level: 0,
        traffic_class: 0,
        analysis_window_ns: Some(30_000_000_000),
        responder_only,
        seq_epoch: rand::random(),
        service_names: Default::default(),
        rate_multiplier: None,
    };
    let a = RnicDriver::new(bind_udp(), params("tor-a", false), Metrics::disabled());
    let b = RnicDriver::new(bind_udp(), params("tor-b", false), Metrics::disabled());
    let (la, lb) = (a.local(), b.local());
    let mut responders = Vec::new();
    let mut shared = Vec::new();
    for i in 1..STORM_TARGETS {
        let r = RnicDriver::new(bind_udp(), params("tor-r", true), Metrics::disabled());
        let l = r.local();
        shared.push(ProbeTarget::new(
            l.gid,
            l.qpn,
            &format!("tor-r{i}"),
            PinglistKind::TorMesh,
        ));
        responders.push(StaticDriver::spawn(r, Pinglists::default(), None, None));
    }
    let list = |gid, qpn, tor: &str| {
        let mut tor_mesh = vec![ProbeTarget::new(gid, qpn, tor, PinglistKind::TorMesh)];
        tor_mesh.extend(shared.iter().cloned());
        Pinglists {
            tor_mesh,
            ..Pinglists::default()
        }
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<TargetOutcome>();
    let (ha, ta) = StaticDriver::spawn(a, list(lb.gid, lb.qpn, "tor-b"), None, Some(tx.clone()));
    let (hb, tb) = StaticDriver::spawn(b, list(la.gid, la.qpn, "tor-a"), None, Some(tx));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Outcomes of the warm-up are dropped; the window's stay queued until the end.
    while rx.try_recv().is_ok() {}
    let (a0, b0) = (ha.stats.snapshot(), hb.stats.snapshot());
    let start = Instant::now();
    tokio::time::sleep(dur).await;
    let (a1, b1) = (ha.stats.snapshot(), hb.stats.snapshot());
    let secs = start.elapsed().as_secs_f64();
    ha.stop();
    hb.stop();
    let _ = ta.await;
    let _ = tb.await;
    for (h, t) in responders {
        h.stop();
        let _ = t.await;
    }
    let mut rtt = Vec::new();
    let mut delay = Vec::new();
    while let Ok(o) = rx.try_recv() {
        if let ProbeResult::Success(s) = o.outcome.result {
            rtt.push(s.network_rtt_ns);
            delay.push(s.prober_delay_ns);
        }
    }
    rtt.sort_unstable();
    delay.sort_unstable();
    let ok = (a1.probe_success - a0.probe_success) + (b1.probe_success - b0.probe_success);
    let bad = |s1: rpingmesh_agent::rnic::StatsSnapshot,
               s0: rpingmesh_agent::rnic::StatsSnapshot| {
        (s1.probe_failed + s1.probe_invalid) - (s0.probe_failed + s0.probe_invalid)
    };
    ProbePhase {
        probes_per_sec: ok as f64 / secs,
        failed_or_invalid: bad(a1, a0) + bad(b1, b0),
        rtt_p50: quantile(&rtt, 0.5),
        rtt_p99: quantile(&rtt, 0.99),
        delay_p50: quantile(&delay, 0.5),
        delay_p99: quantile(&delay, 0.99),
    }
}

/// A thread calling the traced create / modify(INIT->RTR, GRH) / destroy as fast as it
/// can, a fresh QP number each lifecycle, until `stop`; returns calls/s.
fn storm(stop: Arc<AtomicBool>, calls: Arc<AtomicU64>) -> std::thread::JoinHandle<f64> {
    std::thread::spawn(move || {
        let mut img = QpImage::new();
        let mask = (QP_ATTR_STATE | QP_ATTR_AV | QP_ATTR_DEST_QPN) as c_int;
        let create: unsafe extern "C" fn(*mut c_void, *mut c_void) -> *mut c_void =
            black_box(ibv_create_qp);
        let modify: unsafe extern "C" fn(*mut c_void, *mut c_void, c_int) -> c_int =
            black_box(ibv_modify_qp);
        let destroy: unsafe extern "C" fn(*mut c_void) -> c_int = black_box(ibv_destroy_qp);
        let start = Instant::now();
        let mut n = 0u64;
        let mut qpn = 0x1000u32;
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..256 {
                qpn = qpn.wrapping_add(1) & 0xff_ffff;
                put(&mut img.qp, ibv::QP_QP_NUM, qpn);
                let attr = img.attr.as_mut_ptr() as *mut c_void;
                // SAFETY: the image outlives the calls; the functions only pass pointers
                // through (create hands back the image it was given).
                unsafe {
                    let qp = create(black_box(img.qp.as_mut_ptr() as *mut c_void), attr);
                    black_box(modify(qp, attr, mask));
                    black_box(destroy(qp));
                }
                n += 3;
            }
            calls.store(n, Ordering::Relaxed);
        }
        n as f64 / start.elapsed().as_secs_f64()
    })
}

fn storm_bench(phase: Duration) {
    let skip = |why: String| skipped("probing_under_qp_storm", why);
    let exe = match traceable_self() {
        Ok(p) => p,
        Err(why) => return skip(why),
    };
    // Two workers, as the agent's runtime on this size of machine: drivers and the
    // tracer's reader share them.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let with_storm = |f: &dyn Fn() -> ProbePhase| {
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU64::new(0));
        let h = storm(stop.clone(), calls);
        let r = f();
        stop.store(true, Ordering::Relaxed);
        (r, h.join().expect("storm thread"))
    };
    let quiet = rt.block_on(probe_phase(phase));
    // The storm's CPU alone, untraced: separates contention from the tracer's cost.
    let (untraced, untraced_storm_rate) = with_storm(&|| rt.block_on(probe_phase(phase)));

    let tracer = match start_uprobe_tracer(&rt, exe) {
        Started::Running(t) => t,
        Started::Off(why) => return skip(why),
    };
    let before = tracer.stats();
    let (stormy, storm_rate) = with_storm(&|| rt.block_on(probe_phase(phase)));
    // Let the reader catch up and the drop counters be read.
    std::thread::sleep(Duration::from_millis(600));
    let after = tracer.stats();
    drop(tracer);
    drop(rt);
    let ratio = if quiet.probes_per_sec > 0.0 {
        stormy.probes_per_sec / quiet.probes_per_sec
    } else {
        0.0
    };
    println!(
        "{}",
        json!({"bench": "probing_under_qp_storm", "unit": "probes/s",
               "probes_per_sec_quiet": quiet.probes_per_sec,
               "probes_per_sec_storm": stormy.probes_per_sec,
               "probes_per_sec_storm_untraced": untraced.probes_per_sec,
               "ratio": ratio, "target": 0.9,
               "offered_probes_per_sec": 2.0 * STORM_PROBE_RATE, "targets_per_prober": STORM_TARGETS,
               "failed_or_invalid_quiet": quiet.failed_or_invalid,
               "failed_or_invalid_storm": stormy.failed_or_invalid,
               "network_rtt_p50_ns_quiet": quiet.rtt_p50, "network_rtt_p99_ns_quiet": quiet.rtt_p99,
               "network_rtt_p50_ns_storm": stormy.rtt_p50, "network_rtt_p99_ns_storm": stormy.rtt_p99,
               "prober_delay_p50_ns_quiet": quiet.delay_p50, "prober_delay_p99_ns_quiet": quiet.delay_p99,
               "prober_delay_p50_ns_storm": stormy.delay_p50, "prober_delay_p99_ns_storm": stormy.delay_p99,
               "prober_delay_p99_ns_storm_untraced": untraced.delay_p99,
               "network_rtt_p99_ns_storm_untraced": untraced.rtt_p99,
               "storm_calls_per_sec_untraced": untraced_storm_rate,
               "storm_calls_per_sec": storm_rate,
               "events_seen": after.events - before.events,
               "ringbuf_dropped": after.ringbuf_drops - before.ringbuf_drops,
               "ring_bytes": rpingmesh_service_tracer::DEFAULT_RING_BYTES,
               "seconds_per_phase": phase.as_secs_f64()})
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

fn usage(arg: &str) -> ! {
    eprintln!("tracer-bench: bad argument {arg:?}; usage: tracer-bench [--seconds-per-run S] [--runs N] [--only pipeline|uprobe|storm]");
    std::process::exit(2);
}

fn main() {
    let mut secs = 1.5f64;
    let mut runs = 3usize;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_else(|| usage(&a));
        match a.as_str() {
            "--seconds-per-run" => {
                secs = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s > 0.0 && *s <= 60.0)
                    .unwrap_or_else(|| usage(&v))
            }
            "--runs" => {
                runs = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=20).contains(n))
                    .unwrap_or_else(|| usage(&v))
            }
            "--only" if v == "pipeline" || v == "uprobe" || v == "storm" => only = Some(v),
            "--only" => usage(&v),
            _ => usage(&a),
        }
    }
    let dur = Duration::from_secs_f64(secs);
    let part = |p: &str| only.as_deref().is_none_or(|o| o == p);
    if part("pipeline") {
        let stream = generate();
        let mut base = Vec::new();
        let mut ours = Vec::new();
        let mut named = Vec::new();
        let mut changes = 0;
        // Interleaved so that machine noise hits all alike.
        for _ in 0..runs {
            base.push(copy_baseline(&stream, dur));
            let (r, c) = pipeline(&stream, dur, false);
            ours.push(r);
            changes += c;
            named.push(pipeline(&stream, dur, true).0);
        }
        let (b, a) = (median(base.clone()), median(ours.clone()));
        println!(
            "{}",
            json!({"bench": "tracer_copy_baseline", "unit": "events/s", "median": b, "runs": base.len(), "record_bytes": QP_EVENT_SIZE})
        );
        println!(
            "{}",
            json!({"bench": "tracer_pipeline", "unit": "events/s", "median": a, "min": ours.iter().cloned().fold(f64::INFINITY, f64::min),
                   "runs": ours.len(), "flow_changes": changes, "target": 1_000_000})
        );
        println!(
            "{}",
            json!({"bench": "tracer_pipeline_vs_copy", "ratio": if b > 0.0 { a / b } else { 0.0 }})
        );
        let w = median(named.clone());
        println!(
            "{}",
            json!({"bench": "tracer_pipeline_with_workloads", "unit": "events/s", "median": w,
                   "runs": named.len(), "jobs": 64, "target": 1_000_000,
                   "ratio_to_pipeline": if a > 0.0 { w / a } else { 0.0 }})
        );
    }
    if part("uprobe") {
        uprobe_bench(Duration::from_secs_f64(secs * 2.0));
    }
    if part("storm") {
        storm_bench(Duration::from_secs_f64((secs * 2.0).clamp(1.0, 4.0)));
    }
}
