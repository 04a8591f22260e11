//! eBPF programs tracing the RDMA queue-pair lifecycle.
//!
//! Two interchangeable families feed the same ring buffer with `QpEvent`s:
//! - kprobes on ib_uverbs/ib_core (`ib_create_qp_user` return, `ib_modify_qp_with_udata`,
//!   `ib_destroy_qp_user`, and `ib_query_qp` entry + return, which reports QPs that were
//!   connected before tracing began whenever the kernel is asked about them); kernel
//!   struct offsets come from BTF at load time through the `KOFFSETS` global, never
//!   compiled in;
//! - uprobes on libibverbs (`ibv_create_qp`/`ibv_create_qp_ex` return, `ibv_modify_qp`,
//!   `ibv_destroy_qp`) reading the stable user ABI (`agent_common::event::ibv`).
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel,
        bpf_probe_read_kernel_buf, bpf_probe_read_user, bpf_probe_read_user_buf,
    },
    macros::{kprobe, kretprobe, map, raw_tracepoint, uprobe, uretprobe},
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext},
};
use aya_log_ebpf::warn;
use rpingmesh_agent_common::event::*;

#[map(name = "QP_EVENTS")]
static QP_EVENTS: RingBuf = RingBuf::with_byte_size(RINGBUF_BYTES, 0);

#[map(name = "QP_EVENT_STATS")]
static QP_EVENT_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);

/// ib_query_qp's (qp, attr) arguments by thread, from its entry to its return. LRU: an
/// entry whose return never fired (probe detached midway) ages out instead of leaking.
#[map(name = "QUERY_ARGS")]
static QUERY_ARGS: LruHashMap<u64, [u64; 2]> = LruHashMap::with_max_entries(4096, 0);

/// Owners of traced QPs (written by userspace): the only exits worth an event.
#[map(name = "TRACED_TGIDS")]
static TRACED_TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_TRACED_TGIDS, 0);

/// Kernel member offsets (see `KOFF_*`), written by the loader from BTF.
#[no_mangle]
static KOFFSETS: [u32; KOFF_COUNT] = [0; KOFF_COUNT];

#[inline(always)]
fn koff(i: usize) -> u64 {
    // Volatile: the loader rewrites the value, the compiler must not fold the zero.
    unsafe { core::ptr::read_volatile(&KOFFSETS[i]) as u64 }
}

#[inline(always)]
fn bump(stat: u32) {
    if let Some(p) = QP_EVENT_STATS.get_ptr_mut(stat) {
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn header(kind: u8, source: u8) -> QpEvent {
    let mut ev = QpEvent::zeroed();
    let id = bpf_get_current_pid_tgid();
    ev.pid = id as u32;
    ev.tgid = (id >> 32) as u32;
    ev.comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
    ev.cgroup_id = unsafe { aya_ebpf::helpers::generated::bpf_get_current_cgroup_id() };
    // Boot time (includes suspend), as the userspace side expects.
    ev.boot_ns = unsafe { aya_ebpf::helpers::generated::bpf_ktime_get_boot_ns() };
    ev.kind = kind;
    ev.source = source;
    ev
}

#[inline(always)]
fn emit(ev: &QpEvent) {
    if ev.flags & FLAG_READ_ERROR != 0 {
        // One diagnostic per event, at one place per program (the agent names the field).
        warn!(&(), "rpingmesh: cannot read field {}", ev.bad_field);
    }
    match QP_EVENTS.reserve::<QpEvent>(0) {
        Some(mut slot) => {
            slot.write(*ev);
            slot.submit(0);
        }
        None => bump(STAT_RINGBUF_DROPS),
    }
}

/// A field could not be read (bad pointer, wrong offset at `addr`): flag the event,
/// count it, and keep the first such field for `emit` to name.
#[inline(always)]
fn read_err(what: u8, addr: u64, ev: &mut QpEvent) {
    let _ = addr;
    if ev.flags & FLAG_READ_ERROR == 0 {
        ev.bad_field = what;
    }
    ev.flags |= FLAG_READ_ERROR;
    bump(STAT_READ_ERRORS);
}

/// The memory a probe reads: the traced process's (uprobes) or the kernel's (kprobes).
trait Space {
    unsafe fn read<T>(src: *const T) -> Result<T, i32>;
    unsafe fn read_buf(src: *const u8, dst: &mut [u8]) -> Result<(), i32>;
}

struct User;
struct Kernel;

impl Space for User {
    #[inline(always)]
    unsafe fn read<T>(src: *const T) -> Result<T, i32> {
        unsafe { bpf_probe_read_user(src) }
    }
    #[inline(always)]
    unsafe fn read_buf(src: *const u8, dst: &mut [u8]) -> Result<(), i32> {
        unsafe { bpf_probe_read_user_buf(src, dst) }
    }
}

impl Space for Kernel {
    #[inline(always)]
    unsafe fn read<T>(src: *const T) -> Result<T, i32> {
        unsafe { bpf_probe_read_kernel(src) }
    }
    #[inline(always)]
    unsafe fn read_buf(src: *const u8, dst: &mut [u8]) -> Result<(), i32> {
        unsafe { bpf_probe_read_kernel_buf(src, dst) }
    }
}

/// Field `what` at `addr` in `S`; a failed read flags the event (see `read_err`).
#[inline(always)]
fn rd<S: Space, T>(addr: u64, what: u8, ev: &mut QpEvent) -> Option<T> {
    match unsafe { S::read(addr as *const T) } {
        Ok(v) => Some(v),
        Err(_) => {
            read_err(what, addr, ev);
            None
        }
    }
}

/// Byte field `what` at `addr` in `S` into the event (`field` picks it; a closure, not a
/// function pointer: BPF has no indirect calls).
#[inline(always)]
fn rd_bytes<S: Space>(
    addr: u64,
    what: u8,
    ev: &mut QpEvent,
    field: impl FnOnce(&mut QpEvent) -> &mut [u8],
) {
    if unsafe { S::read_buf(addr as *const u8, field(ev)) }.is_err() {
        read_err(what, addr, ev);
    }
}

/// Where a GRH's members lie (offsets from the GRH) and their field ids, in user and
/// kernel structs alike: dgid, flow label, sgid index, hop limit, traffic class.
struct GrhLayout {
    at: [u64; 5],
    what: [u8; 5],
}

/// Reads the global route header at `grh` (the remote GID and the flow's labels).
#[inline(always)]
fn read_grh<S: Space>(grh: u64, l: &GrhLayout, ev: &mut QpEvent) {
    rd_bytes::<S>(grh + l.at[0], l.what[0], ev, |e| &mut e.dgid);
    if let Some(f) = rd::<S, u32>(grh + l.at[1], l.what[1], ev) {
        ev.flow_label = f;
    }
    if let Some(v) = rd::<S, u8>(grh + l.at[2], l.what[2], ev) {
        ev.sgid_index = v;
    }
    if let Some(v) = rd::<S, u8>(grh + l.at[3], l.what[3], ev) {
        ev.hop_limit = v;
    }
    if let Some(v) = rd::<S, u8>(grh + l.at[4], l.what[4], ev) {
        ev.traffic_class = v;
    }
}

/// A modify call's (qp, attr, mask), libibverbs' and the kernel's alike; none when a
/// pointer is null.
#[inline(always)]
fn modify_args(ctx: &ProbeContext) -> Option<(u64, u64, u32)> {
    let (qp, attr, mask) = (ctx.arg::<u64>(0)?, ctx.arg::<u64>(1)?, ctx.arg::<u32>(2)?);
    (qp != 0 && attr != 0).then_some((qp, attr, mask))
}

// ---------------------------------------------------------------- user (libibverbs)

/// Fill qp_num, qp_type, state, context and device name from a user `struct ibv_qp *`.
#[inline(always)]
fn user_qp(qp: u64, ev: &mut QpEvent) {
    ev.qp_ptr = qp;
    if let Some(n) = rd::<User, u32>(qp + ibv::QP_QP_NUM as u64, field::IBV_QP__QP_NUM, ev) {
        ev.qp_num = n;
    }
    if let Some(t) = rd::<User, u32>(qp + ibv::QP_QP_TYPE as u64, field::IBV_QP__QP_TYPE, ev) {
        ev.qp_type = t as u8;
    }
    if let Some(ctx) = rd::<User, u64>(qp + ibv::QP_CONTEXT as u64, field::IBV_QP__CONTEXT, ev) {
        ev.ctx = ctx;
        if ctx != 0 {
            if let Some(dev) = rd::<User, u64>(ctx + ibv::CONTEXT_DEVICE as u64, field::IBV_CONTEXT__DEVICE, ev) {
                if dev != 0 {
                    let name = dev + ibv::DEVICE_NAME as u64;
                    rd_bytes::<User>(name, field::IBV_DEVICE__NAME, ev, |e| &mut e.dev_name);
                }
            }
        }
    }
}

#[inline(always)]
fn user_create_ret(ctx: &RetProbeContext) -> u32 {
    let qp: u64 = ctx.ret();
    if qp == 0 {
        return 0; // creation failed
    }
    let mut ev = header(KIND_CREATE, SOURCE_UPROBE);
    user_qp(qp, &mut ev);
    emit(&ev);
    0
}

#[uretprobe]
pub fn ibv_create_qp_ret(ctx: RetProbeContext) -> u32 {
    user_create_ret(&ctx)
}

#[uretprobe]
pub fn ibv_create_qp_ex_ret(ctx: RetProbeContext) -> u32 {
    user_create_ret(&ctx)
}

/// int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
#[uprobe]
pub fn ibv_modify_qp(ctx: ProbeContext) -> u32 {
    let Some((qp, attr, mask)) = modify_args(&ctx) else {
        return 0;
    };
    let mut ev = header(KIND_MODIFY, SOURCE_UPROBE);
    ev.attr_mask = mask;
    user_qp(qp, &mut ev);
    if let Some(s) = rd::<User, u32>(attr + ibv::ATTR_QP_STATE as u64, field::IBV_QP_ATTR__QP_STATE, &mut ev) {
        ev.qp_state = s as u8;
    }
    if mask & QP_ATTR_DEST_QPN != 0 {
        if let Some(d) = rd::<User, u32>(attr + ibv::ATTR_DEST_QP_NUM as u64, field::IBV_QP_ATTR__DEST_QP_NUM, &mut ev) {
            ev.dest_qp_num = d;
        }
    }
    if mask & QP_ATTR_PORT != 0 {
        if let Some(p) = rd::<User, u8>(attr + ibv::ATTR_PORT_NUM as u64, field::IBV_QP_ATTR__PORT_NUM, &mut ev) {
            ev.port = p;
        }
    }
    if mask & QP_ATTR_AV != 0 {
        let ah = attr + ibv::ATTR_AH_ATTR as u64;
        if let Some(sl) = rd::<User, u8>(ah + ibv::AH_SL as u64, field::IBV_AH_ATTR__SL, &mut ev) {
            ev.sl = sl;
        }
        // The AV's port wins over QP_ATTR_PORT: it is the port the path leaves from.
        if let Some(p) = rd::<User, u8>(ah + ibv::AH_PORT_NUM as u64, field::IBV_AH_ATTR__PORT_NUM, &mut ev) {
            if p != 0 {
                ev.port = p;
            }
        }
        if let Some(g) = rd::<User, u8>(ah + ibv::AH_IS_GLOBAL as u64, field::IBV_AH_ATTR__IS_GLOBAL, &mut ev) {
            if g != 0 {
                ev.flags |= FLAG_GRH;
            }
        }
        let grh = GrhLayout {
            at: [
                ibv::GRH_DGID,
                ibv::GRH_FLOW_LABEL,
                ibv::GRH_SGID_INDEX,
                ibv::GRH_HOP_LIMIT,
                ibv::GRH_TRAFFIC_CLASS,
            ]
            .map(|o| o as u64),
            what: [
                field::IBV_GLOBAL_ROUTE__DGID,
                field::IBV_GLOBAL_ROUTE__FLOW_LABEL,
                field::IBV_GLOBAL_ROUTE__SGID_INDEX,
                field::IBV_GLOBAL_ROUTE__HOP_LIMIT,
                field::IBV_GLOBAL_ROUTE__TRAFFIC_CLASS,
            ],
        };
        read_grh::<User>(ah + ibv::AH_GRH as u64, &grh, &mut ev);
    }
    emit(&ev);
    0
}

/// int ibv_destroy_qp(struct ibv_qp *qp)
#[uprobe]
pub fn ibv_destroy_qp(ctx: ProbeContext) -> u32 {
    let Some(qp) = ctx.arg::<u64>(0) else { return 0 };
    if qp == 0 {
        return 0;
    }
    let mut ev = header(KIND_DESTROY, SOURCE_UPROBE);
    user_qp(qp, &mut ev);
    emit(&ev);
    0
}

// ---------------------------------------------------------------- kernel (ib_uverbs)

/// Fill qp_num, qp_type, port, device pointer and name from a kernel `struct ib_qp *`.
/// Enums and ports are read by their low byte: correct on little-endian whether the
/// kernel declares them u8 or u32 (ib_qp.port widened in 5.13).
#[inline(always)]
fn kernel_qp(qp: u64, ev: &mut QpEvent) {
    ev.qp_ptr = qp;
    if let Some(n) = rd::<Kernel, u32>(qp + koff(KOFF_QP_QP_NUM), field::IB_QP__QP_NUM, ev) {
        ev.qp_num = n;
    }
    if let Some(t) = rd::<Kernel, u8>(qp + koff(KOFF_QP_QP_TYPE), field::IB_QP__QP_TYPE, ev) {
        ev.qp_type = t;
    }
    if let Some(p) = rd::<Kernel, u8>(qp + koff(KOFF_QP_PORT), field::IB_QP__PORT, ev) {
        ev.port = p;
    }
    if let Some(dev) = rd::<Kernel, u64>(qp + koff(KOFF_QP_DEVICE), field::IB_QP__DEVICE, ev) {
        ev.ctx = dev;
        if dev != 0 {
            let name = dev + koff(KOFF_DEVICE_NAME);
            rd_bytes::<Kernel>(name, field::IB_DEVICE__NAME, ev, |e| &mut e.dev_name);
        }
    }
}

#[inline(always)]
fn is_err_or_null(p: u64) -> bool {
    // IS_ERR_OR_NULL: errno pointers live in the last page of the address space.
    p == 0 || p >= (-4095i64) as u64
}

/// struct ib_qp *ib_create_qp_user(...): the returned QP carries everything we need.
#[kretprobe]
pub fn ib_create_qp_user_ret(ctx: RetProbeContext) -> u32 {
    if koff(KOFF_VALID) == 0 {
        return 0;
    }
    let qp: u64 = ctx.ret();
    if is_err_or_null(qp) {
        return 0;
    }
    let mut ev = header(KIND_CREATE, SOURCE_KPROBE);
    kernel_qp(qp, &mut ev);
    emit(&ev);
    0
}

/// int ib_modify_qp_with_udata(struct ib_qp *qp, struct ib_qp_attr *attr, int mask, ...)
#[kprobe]
pub fn ib_modify_qp_with_udata(ctx: ProbeContext) -> u32 {
    if koff(KOFF_VALID) == 0 {
        return 0;
    }
    let Some((qp, attr, mask)) = modify_args(&ctx) else {
        return 0;
    };
    let mut ev = header(KIND_MODIFY, SOURCE_KPROBE);
    ev.attr_mask = mask;
    kernel_qp(qp, &mut ev);
    if let Some(s) = rd::<Kernel, u8>(attr + koff(KOFF_ATTR_QP_STATE), field::IB_QP_ATTR__QP_STATE, &mut ev) {
        ev.qp_state = s;
    }
    if mask & QP_ATTR_DEST_QPN != 0 {
        if let Some(d) = rd::<Kernel, u32>(attr + koff(KOFF_ATTR_DEST_QP_NUM), field::IB_QP_ATTR__DEST_QP_NUM, &mut ev) {
            ev.dest_qp_num = d;
        }
    }
    if mask & QP_ATTR_PORT != 0 {
        if let Some(p) = rd::<Kernel, u8>(attr + koff(KOFF_ATTR_PORT_NUM), field::IB_QP_ATTR__PORT_NUM, &mut ev) {
            ev.port = p;
        }
    }
    // Only the transition to RTR carries the path (AV) we care about.
    if mask & QP_ATTR_STATE != 0 && ev.qp_state == QPS_RTR && mask & QP_ATTR_AV != 0 {
        kernel_av(attr, &mut ev);
    }
    emit(&ev);
    0
}

/// Reads the address vector of a kernel `struct ib_qp_attr` (the part a connect sets).
#[inline(always)]
fn kernel_av(attr: u64, ev: &mut QpEvent) {
    let ah = attr + koff(KOFF_ATTR_AH_ATTR);
    if let Some(sl) = rd::<Kernel, u8>(ah + koff(KOFF_AH_SL), field::RDMA_AH_ATTR__SL, ev) {
        ev.sl = sl;
    }
    if let Some(p) = rd::<Kernel, u8>(ah + koff(KOFF_AH_PORT_NUM), field::RDMA_AH_ATTR__PORT_NUM, ev) {
        if p != 0 {
            ev.port = p;
        }
    }
    if let Some(f) = rd::<Kernel, u8>(ah + koff(KOFF_AH_FLAGS), field::RDMA_AH_ATTR__AH_FLAGS, ev) {
        if f & 1 != 0 {
            ev.flags |= FLAG_GRH; // IB_AH_GRH
        }
    }
    let grh = GrhLayout {
        at: [
            koff(KOFF_GRH_DGID),
            koff(KOFF_GRH_FLOW_LABEL),
            koff(KOFF_GRH_SGID_INDEX),
            koff(KOFF_GRH_HOP_LIMIT),
            koff(KOFF_GRH_TRAFFIC_CLASS),
        ],
        what: [
            field::IB_GLOBAL_ROUTE__DGID,
            field::IB_GLOBAL_ROUTE__FLOW_LABEL,
            field::IB_GLOBAL_ROUTE__SGID_INDEX,
            field::IB_GLOBAL_ROUTE__HOP_LIMIT,
            field::IB_GLOBAL_ROUTE__TRAFFIC_CLASS,
        ],
    };
    read_grh::<Kernel>(ah + koff(KOFF_AH_GRH), &grh, ev);
}

/// int ib_query_qp(struct ib_qp *qp, struct ib_qp_attr *attr, int mask, ...): remember
/// the arguments; the return probe reads what the driver filled in.
#[kprobe]
pub fn ib_query_qp_entry(ctx: ProbeContext) -> u32 {
    if koff(KOFF_VALID) == 0 {
        return 0;
    }
    let (Some(qp), Some(attr)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) else {
        return 0;
    };
    if qp == 0 || attr == 0 {
        return 0;
    }
    let _ = QUERY_ARGS.insert(&bpf_get_current_pid_tgid(), &[qp, attr], 0);
    0
}

/// A successful query: the QP's current state and address vector, attributed to the
/// process that owns the QP (from its restrack entry), not to the querier. Kernel-owned
/// QPs (no owner task) are skipped.
#[kretprobe]
pub fn ib_query_qp_ret(ctx: RetProbeContext) -> u32 {
    let key = bpf_get_current_pid_tgid();
    let Some(&[qp, attr]) = (unsafe { QUERY_ARGS.get(&key) }) else {
        return 0;
    };
    let _ = QUERY_ARGS.remove(&key);
    let ret: i32 = ctx.ret();
    if ret != 0 {
        return 0;
    }
    let mut ev = header(KIND_QUERY, SOURCE_KPROBE);
    let task = match rd::<Kernel, u64>(qp + koff(KOFF_QP_RES) + koff(KOFF_RES_TASK), field::IB_QP__RES__TASK, &mut ev) {
        Some(t) if t != 0 => t,
        _ => return 0,
    };
    match rd::<Kernel, i32>(task + koff(KOFF_TASK_TGID), field::TASK_STRUCT__TGID, &mut ev) {
        Some(t) if t > 0 => {
            ev.tgid = t as u32;
            ev.pid = t as u32;
        }
        _ => return 0,
    }
    let comm = task + koff(KOFF_TASK_COMM);
    rd_bytes::<Kernel>(comm, field::TASK_STRUCT__COMM, &mut ev, |e| &mut e.comm);
    ev.cgroup_id = 0; // the querier's cgroup would be wrong; the owner's is not at hand
    kernel_qp(qp, &mut ev);
    // Everything a query returns counts as given: state, remote QPN and path.
    ev.attr_mask = QP_ATTR_STATE | QP_ATTR_DEST_QPN | QP_ATTR_AV;
    if let Some(s) = rd::<Kernel, u8>(attr + koff(KOFF_ATTR_QP_STATE), field::IB_QP_ATTR__QP_STATE, &mut ev) {
        ev.qp_state = s;
    }
    if let Some(d) = rd::<Kernel, u32>(attr + koff(KOFF_ATTR_DEST_QP_NUM), field::IB_QP_ATTR__DEST_QP_NUM, &mut ev) {
        ev.dest_qp_num = d;
    }
    kernel_av(attr, &mut ev);
    emit(&ev);
    0
}

/// int ib_destroy_qp_user(struct ib_qp *qp, struct ib_udata *udata)
#[kprobe]
pub fn ib_destroy_qp_user(ctx: ProbeContext) -> u32 {
    if koff(KOFF_VALID) == 0 {
        return 0;
    }
    let Some(qp) = ctx.arg::<u64>(0) else { return 0 };
    if qp == 0 {
        return 0;
    }
    let mut ev = header(KIND_DESTROY, SOURCE_KPROBE);
    kernel_qp(qp, &mut ev);
    emit(&ev);
    0
}

// ---------------------------------------------------------------- process exit

/// sched_process_exit, for processes owning traced QPs: their QPs die with them (the
/// kernel destroys them as the files close, which libibverbs uprobes never see). Runs in
/// the exiting task. Only the group's last thread counts (signal->live already reached
/// 0 here); without its offsets, the group leader's exit.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(_ctx: RawTracePointContext) -> i32 {
    let id = bpf_get_current_pid_tgid();
    let (pid, tgid) = (id as u32, (id >> 32) as u32);
    if unsafe { TRACED_TGIDS.get(&tgid) }.is_none() {
        return 0;
    }
    let mut ev = header(KIND_EXIT, SOURCE_TRACEPOINT);
    if koff(KOFF_EXIT_VALID) != 0 {
        let task = unsafe { aya_ebpf::helpers::generated::bpf_get_current_task() };
        let Some(signal) = rd::<Kernel, u64>(task + koff(KOFF_TASK_SIGNAL), field::TASK_STRUCT__SIGNAL, &mut ev) else {
            return 0;
        };
        match rd::<Kernel, i32>(signal + koff(KOFF_SIGNAL_LIVE), field::SIGNAL_STRUCT__LIVE, &mut ev) {
            Some(0) => {}
            _ => return 0, // other threads still run
        }
    } else if pid != tgid {
        return 0;
    }
    emit(&ev);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
