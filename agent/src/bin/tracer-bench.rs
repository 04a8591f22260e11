//! tracer-bench: the service tracer's costs, one JSON object per line on stdout, about
//! 12 s in total.
//!
//! (a) events/s through the userspace pipeline (ring-buffer-shaped `QpEvent` bytes ->
//!     decode -> `FlowTable` apply) on one core, against copying the same bytes into a
//!     Vec, interleaved in the same run;
//! (b) per-call cost of a traced function: this binary exports `ibv_create_qp`,
//!     `ibv_modify_qp` and `ibv_destroy_qp` with the libibverbs layouts, times
//!     `ibv_modify_qp` (INIT->RTR with a GRH, the heaviest probe path) untraced, then with
//!     the tracer's uprobes attached to /proc/self/exe; needs root (else a skip line).
//!
//! Usage: tracer-bench [--seconds-per-run S] [--runs N] [--only pipeline|uprobe]

use std::ffi::{c_int, c_void};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Events/s of decode + apply, one thread, for about `dur`. Returns (rate, flow changes).
fn pipeline(stream: &[u8], dur: Duration) -> (f64, u64) {
    let local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];
    let resolver = move |_: &str, _: u8, _: u8| Some(local);
    let filter = |_: u32, _: &str, _: u32| false;
    let mut out: Vec<FlowChange> = Vec::with_capacity(1024);
    let mut events = 0u64;
    let mut changes = 0u64;
    let start = Instant::now();
    while start.elapsed() < dur {
        let mut table = FlowTable::new(FlowTableConfig::default());
        for rec in stream.chunks_exact(QP_EVENT_SIZE) {
            table.apply_bytes(rec, &resolver, &filter, &mut out);
            if out.len() >= 1024 {
                changes += out.len() as u64;
                out.clear();
            }
        }
        changes += out.len() as u64;
        out.clear();
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

/// # Safety
/// `_pd` is unused; returns a QP the caller frees with `ibv_destroy_qp`.
#[no_mangle]
#[inline(never)]
pub unsafe extern "C" fn ibv_create_qp(_pd: *mut c_void, _init: *mut c_void) -> *mut c_void {
    black_box(std::ptr::null_mut())
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
    let skip = |why: String| {
        println!(
            "{}",
            json!({"bench": "uprobe_call_overhead", "skipped": why})
        );
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("not root: attaching uprobes needs CAP_BPF + CAP_PERFMON".into());
    }
    let exe = match std::fs::read_link("/proc/self/exe") {
        Ok(p) => p,
        Err(e) => return skip(format!("/proc/self/exe: {e}")),
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
    let cfg = TracerConfig {
        mode: TracingMode::Uprobe,
        discover_libibverbs: false,
        uprobe_targets: vec![exe.clone()],
        liveness_interval: Duration::from_millis(200),
        ..Default::default()
    };
    let started = rt.block_on(async {
        ServiceTracer::start(
            cfg,
            Arc::new(|_: &str, _: u8, _: u8| {
                Some([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
            }),
            Arc::new(|_: u32, _: &str, _: u32| false),
        )
    });
    let tracer = match started {
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

fn usage(arg: &str) -> ! {
    eprintln!("tracer-bench: bad argument {arg:?}; usage: tracer-bench [--seconds-per-run S] [--runs N] [--only pipeline|uprobe]");
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
            "--only" if v == "pipeline" || v == "uprobe" => only = Some(v),
            _ => usage(&a),
        }
    }
    let dur = Duration::from_secs_f64(secs);
    if only.as_deref() != Some("uprobe") {
        let stream = generate();
        let mut base = Vec::new();
        let mut ours = Vec::new();
        let mut changes = 0;
        // Interleaved so that machine noise hits both alike.
        for _ in 0..runs {
            base.push(copy_baseline(&stream, dur));
            let (r, c) = pipeline(&stream, dur);
            ours.push(r);
            changes += c;
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
    }
    if only.as_deref() != Some("pipeline") {
        uprobe_bench(Duration::from_secs_f64(secs * 2.0));
    }
}
