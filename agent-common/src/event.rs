//! QP lifecycle events emitted by the eBPF programs (agent-ebpf) and decoded by the
//! service tracer, plus the constants both halves must agree on.
//!
//! One fixed-size record (`QpEvent`, 136 bytes, 8-aligned, explicit padding) carries every
//! kind of event so the ring buffer and the decoder stay trivial; `kind` says which
//! fields are meaningful.

/// Event kinds (`QpEvent::kind`).
pub const KIND_CREATE: u8 = 1;
pub const KIND_MODIFY: u8 = 2;
pub const KIND_DESTROY: u8 = 3;
/// The kernel answered a query of the QP (`ib_query_qp`, e.g. for `rdma res show qp`):
/// its current state and address vector, with the owning process (not the querier) as
/// pid/comm. Lets the tracer learn QPs connected before it started.
pub const KIND_QUERY: u8 = 4;
/// A traced process exited (its last thread; `tgid`): its QPs are gone with it.
pub const KIND_EXIT: u8 = 5;

/// Where the event came from (`QpEvent::source`).
pub const SOURCE_KPROBE: u8 = 1;
pub const SOURCE_UPROBE: u8 = 2;
pub const SOURCE_TRACEPOINT: u8 = 3;

/// `QpEvent::flags` bits.
/// The AH attribute carried a GRH (is_global / IB_AH_GRH): dgid and flow label are valid.
pub const FLAG_GRH: u8 = 1 << 0;
/// Reading some of the attribute memory failed; fields may be partially zero.
pub const FLAG_READ_ERROR: u8 = 1 << 1;

/// Bits of `attr_mask` (identical in `enum ibv_qp_attr_mask` and the kernel's
/// `enum ib_qp_attr_mask`).
pub const QP_ATTR_STATE: u32 = 1 << 0;
pub const QP_ATTR_PORT: u32 = 1 << 5;
pub const QP_ATTR_AV: u32 = 1 << 7;
pub const QP_ATTR_DEST_QPN: u32 = 1 << 20;

/// QP states (`enum ibv_qp_state` == kernel `enum ib_qp_state`).
pub const QPS_RESET: u8 = 0;
pub const QPS_INIT: u8 = 1;
pub const QPS_RTR: u8 = 2;
pub const QPS_RTS: u8 = 3;
pub const QPS_SQD: u8 = 4;
pub const QPS_SQE: u8 = 5;
pub const QPS_ERR: u8 = 6;

pub const COMM_LEN: usize = 16;
pub const GID_LEN: usize = 16;
/// Device names are truncated to this many bytes (NUL-padded). RDMA names are short.
pub const DEV_NAME_LEN: usize = 32;

/// One QP lifecycle event. Layout is fixed (`size_of == QP_EVENT_SIZE`), all padding is
/// explicit so the eBPF side can zero it and the userspace decoder never reads garbage.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEvent {
    /// bpf_ktime_get_boot_ns() at the probe.
    pub boot_ns: u64,
    /// bpf_get_current_cgroup_id().
    pub cgroup_id: u64,
    /// Kernel `struct ib_device *` (kprobe) or user `struct ibv_context *` (uprobe).
    pub ctx: u64,
    /// Kernel `struct ib_qp *` or user `struct ibv_qp *`.
    pub qp_ptr: u64,
    /// Thread id (lower half of bpf_get_current_pid_tgid).
    pub pid: u32,
    /// Process id (upper half).
    pub tgid: u32,
    pub qp_num: u32,
    pub dest_qp_num: u32,
    pub attr_mask: u32,
    /// GRH flow label (20 bits).
    pub flow_label: u32,
    pub comm: [u8; COMM_LEN],
    /// Remote GID from the AH attribute's GRH (modify to RTR).
    pub dgid: [u8; GID_LEN],
    /// NUL-padded device name (ib_device.name / ibv_device.name); empty when unreadable.
    pub dev_name: [u8; DEV_NAME_LEN],
    pub kind: u8,
    pub source: u8,
    pub qp_type: u8,
    pub port: u8,
    pub qp_state: u8,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub sl: u8,
    pub flags: u8,
    /// With `FLAG_READ_ERROR`: the first field that could not be read (`field::*`).
    pub bad_field: u8,
    pub _pad: [u8; 5],
}

pub const QP_EVENT_SIZE: usize = 136;
const _: () = assert!(core::mem::size_of::<QpEvent>() == QP_EVENT_SIZE);
const _: () = assert!(core::mem::align_of::<QpEvent>() == 8);

impl QpEvent {
    pub const fn zeroed() -> Self {
        QpEvent {
            boot_ns: 0,
            cgroup_id: 0,
            ctx: 0,
            qp_ptr: 0,
            pid: 0,
            tgid: 0,
            qp_num: 0,
            dest_qp_num: 0,
            attr_mask: 0,
            flow_label: 0,
            comm: [0; COMM_LEN],
            dgid: [0; GID_LEN],
            dev_name: [0; DEV_NAME_LEN],
            kind: 0,
            source: 0,
            qp_type: 0,
            port: 0,
            qp_state: 0,
            sgid_index: 0,
            hop_limit: 0,
            traffic_class: 0,
            sl: 0,
            flags: 0,
            bad_field: 0,
            _pad: [0; 5],
        }
    }

    /// Decode from ring-buffer bytes (unaligned). `None` when the record is too short.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < QP_EVENT_SIZE {
            return None;
        }
        // SAFETY: length checked; every bit pattern is a valid QpEvent (integers/arrays only).
        Some(unsafe { core::ptr::read_unaligned(b.as_ptr() as *const QpEvent) })
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: repr(C) with explicit padding, so every byte is initialised.
        unsafe { core::slice::from_raw_parts(self as *const QpEvent as *const u8, QP_EVENT_SIZE) }
    }
}

/// Fields the programs read, by id (`QpEvent::bad_field`, and the programs' aya-log
/// diagnostics, which carry the id: a name string would cost the verifier a copy loop).
pub mod field {
    pub const IBV_QP__QP_NUM: u8 = 1;
    pub const IBV_QP__QP_TYPE: u8 = 2;
    pub const IBV_QP__CONTEXT: u8 = 3;
    pub const IBV_CONTEXT__DEVICE: u8 = 4;
    pub const IBV_DEVICE__NAME: u8 = 5;
    pub const IBV_QP_ATTR__QP_STATE: u8 = 6;
    pub const IBV_QP_ATTR__DEST_QP_NUM: u8 = 7;
    pub const IBV_QP_ATTR__PORT_NUM: u8 = 8;
    pub const IBV_AH_ATTR__SL: u8 = 9;
    pub const IBV_AH_ATTR__PORT_NUM: u8 = 10;
    pub const IBV_AH_ATTR__IS_GLOBAL: u8 = 11;
    pub const IBV_GLOBAL_ROUTE__DGID: u8 = 12;
    pub const IBV_GLOBAL_ROUTE__FLOW_LABEL: u8 = 13;
    pub const IBV_GLOBAL_ROUTE__SGID_INDEX: u8 = 14;
    pub const IBV_GLOBAL_ROUTE__HOP_LIMIT: u8 = 15;
    pub const IBV_GLOBAL_ROUTE__TRAFFIC_CLASS: u8 = 16;
    pub const IB_QP__QP_NUM: u8 = 17;
    pub const IB_QP__QP_TYPE: u8 = 18;
    pub const IB_QP__PORT: u8 = 19;
    pub const IB_QP__DEVICE: u8 = 20;
    pub const IB_DEVICE__NAME: u8 = 21;
    pub const IB_QP_ATTR__QP_STATE: u8 = 22;
    pub const IB_QP_ATTR__DEST_QP_NUM: u8 = 23;
    pub const IB_QP_ATTR__PORT_NUM: u8 = 24;
    pub const RDMA_AH_ATTR__SL: u8 = 25;
    pub const RDMA_AH_ATTR__PORT_NUM: u8 = 26;
    pub const RDMA_AH_ATTR__AH_FLAGS: u8 = 27;
    pub const IB_GLOBAL_ROUTE__DGID: u8 = 28;
    pub const IB_GLOBAL_ROUTE__FLOW_LABEL: u8 = 29;
    pub const IB_GLOBAL_ROUTE__SGID_INDEX: u8 = 30;
    pub const IB_GLOBAL_ROUTE__HOP_LIMIT: u8 = 31;
    pub const IB_GLOBAL_ROUTE__TRAFFIC_CLASS: u8 = 32;
    pub const IB_QP__RES__TASK: u8 = 33;
    pub const TASK_STRUCT__TGID: u8 = 34;
    pub const TASK_STRUCT__COMM: u8 = 35;
    pub const TASK_STRUCT__SIGNAL: u8 = 36;
    pub const SIGNAL_STRUCT__LIVE: u8 = 37;

    /// Every field by id - 1.
    pub const NAMES: [&str; 37] = [
        "ibv_qp.qp_num",
        "ibv_qp.qp_type",
        "ibv_qp.context",
        "ibv_context.device",
        "ibv_device.name",
        "ibv_qp_attr.qp_state",
        "ibv_qp_attr.dest_qp_num",
        "ibv_qp_attr.port_num",
        "ibv_ah_attr.sl",
        "ibv_ah_attr.port_num",
        "ibv_ah_attr.is_global",
        "ibv_global_route.dgid",
        "ibv_global_route.flow_label",
        "ibv_global_route.sgid_index",
        "ibv_global_route.hop_limit",
        "ibv_global_route.traffic_class",
        "ib_qp.qp_num",
        "ib_qp.qp_type",
        "ib_qp.port",
        "ib_qp.device",
        "ib_device.name",
        "ib_qp_attr.qp_state",
        "ib_qp_attr.dest_qp_num",
        "ib_qp_attr.port_num",
        "rdma_ah_attr.sl",
        "rdma_ah_attr.port_num",
        "rdma_ah_attr.ah_flags",
        "ib_global_route.dgid",
        "ib_global_route.flow_label",
        "ib_global_route.sgid_index",
        "ib_global_route.hop_limit",
        "ib_global_route.traffic_class",
        "ib_qp.res.task",
        "task_struct.tgid",
        "task_struct.comm",
        "task_struct.signal",
        "signal_struct.live",
    ];

    /// The name of field `id` ("?" for an unknown id).
    pub fn name(id: u8) -> &'static str {
        NAMES
            .get((id as usize).wrapping_sub(1))
            .copied()
            .unwrap_or("?")
    }
}

/// Indices into the per-CPU drop/error counter array (`QP_EVENT_STATS`).
pub const STAT_RINGBUF_DROPS: u32 = 0;
pub const STAT_READ_ERRORS: u32 = 1;
pub const STAT_COUNT: u32 = 2;

/// The ring buffer's size in the compiled object (a power of two, a multiple of the page
/// size). The loader sets the size the agent runs with (`TracerConfig::ring_bytes`).
pub const RINGBUF_BYTES: u32 = 1 << 20;

/// Kernel struct member offsets resolved from BTF at load time and passed to the kprobe
/// programs in the global `KOFFSETS: [u32; KOFF_COUNT]` (name: `KOFFSETS_GLOBAL`).
/// Nothing kernel-specific is compiled in: with `KOFF_VALID == 0` the kprobes emit nothing.
pub const KOFFSETS_GLOBAL: &str = "KOFFSETS";
pub const KOFF_VALID: usize = 0;
pub const KOFF_QP_DEVICE: usize = 1; // ib_qp.device (struct ib_device *)
pub const KOFF_QP_QP_NUM: usize = 2; // ib_qp.qp_num (u32)
pub const KOFF_QP_QP_TYPE: usize = 3; // ib_qp.qp_type (enum, low byte read)
pub const KOFF_QP_PORT: usize = 4; // ib_qp.port (u8 or u32 by kernel, low byte read)
pub const KOFF_DEVICE_NAME: usize = 5; // ib_device.name (char[64])
pub const KOFF_ATTR_QP_STATE: usize = 6; // ib_qp_attr.qp_state
pub const KOFF_ATTR_DEST_QP_NUM: usize = 7; // ib_qp_attr.dest_qp_num
pub const KOFF_ATTR_PORT_NUM: usize = 8; // ib_qp_attr.port_num
pub const KOFF_ATTR_AH_ATTR: usize = 9; // ib_qp_attr.ah_attr (struct rdma_ah_attr)
pub const KOFF_AH_GRH: usize = 10; // rdma_ah_attr.grh (struct ib_global_route)
pub const KOFF_AH_SL: usize = 11; // rdma_ah_attr.sl
pub const KOFF_AH_PORT_NUM: usize = 12; // rdma_ah_attr.port_num
pub const KOFF_AH_FLAGS: usize = 13; // rdma_ah_attr.ah_flags (IB_AH_GRH = 1)
pub const KOFF_GRH_DGID: usize = 14; // ib_global_route.dgid
pub const KOFF_GRH_FLOW_LABEL: usize = 15;
pub const KOFF_GRH_SGID_INDEX: usize = 16;
pub const KOFF_GRH_HOP_LIMIT: usize = 17;
pub const KOFF_GRH_TRAFFIC_CLASS: usize = 18;
pub const KOFF_QP_RES: usize = 19; // ib_qp.res (struct rdma_restrack_entry)
pub const KOFF_RES_TASK: usize = 20; // rdma_restrack_entry.task (owner; NULL for kernel QPs)
pub const KOFF_TASK_TGID: usize = 21; // task_struct.tgid
pub const KOFF_TASK_COMM: usize = 22; // task_struct.comm
pub const KOFF_TASK_SIGNAL: usize = 23; // task_struct.signal (struct signal_struct *)
pub const KOFF_SIGNAL_LIVE: usize = 24; // signal_struct.live (threads still running)
/// Set when the two above resolved (from vmlinux BTF, in either tracing mode): the exit
/// program then reports only the last thread; without them, the group leader's exit.
pub const KOFF_EXIT_VALID: usize = 25;
pub const KOFF_COUNT: usize = 26;

/// Processes whose exits the exit program reports (`TRACED_TGIDS` map, kept by userspace
/// to the owners of traced QPs).
pub const TRACED_TGIDS_MAP: &str = "TRACED_TGIDS";
pub const MAX_TRACED_TGIDS: u32 = 65_536;

/// Stable libibverbs user ABI (x86_64 / LP64), from `<infiniband/verbs.h>`.
/// Checked against the header by a userspace test that compiles `offsetof` with cc.
pub mod ibv {
    /// struct ibv_qp
    pub const QP_CONTEXT: usize = 0; // struct ibv_context *
    pub const QP_HANDLE: usize = 48;
    pub const QP_QP_NUM: usize = 52;
    pub const QP_STATE: usize = 56;
    pub const QP_QP_TYPE: usize = 60;
    pub const QP_SIZE: usize = 160;
    /// struct ibv_context
    pub const CONTEXT_DEVICE: usize = 0; // struct ibv_device *
    /// struct ibv_device
    pub const DEVICE_NAME: usize = 24; // char name[64]
    /// struct ibv_qp_attr
    pub const ATTR_QP_STATE: usize = 0;
    pub const ATTR_DEST_QP_NUM: usize = 28;
    pub const ATTR_AH_ATTR: usize = 56;
    pub const ATTR_PORT_NUM: usize = 129;
    pub const ATTR_SIZE: usize = 144;
    /// struct ibv_ah_attr (offsets within it)
    pub const AH_GRH: usize = 0;
    pub const AH_SL: usize = 26;
    pub const AH_IS_GLOBAL: usize = 29;
    pub const AH_PORT_NUM: usize = 30;
    pub const AH_SIZE: usize = 32;
    /// struct ibv_global_route (offsets within it)
    pub const GRH_DGID: usize = 0;
    pub const GRH_FLOW_LABEL: usize = 16;
    pub const GRH_SGID_INDEX: usize = 20;
    pub const GRH_HOP_LIMIT: usize = 21;
    pub const GRH_TRAFFIC_CLASS: usize = 22;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_bytes() {
        let mut e = QpEvent::zeroed();
        e.qp_num = 0x1234;
        e.dgid[15] = 9;
        e.flags = FLAG_GRH;
        let b = e.as_bytes();
        assert_eq!(b.len(), QP_EVENT_SIZE);
        assert_eq!(QpEvent::from_bytes(b), Some(e));
        assert_eq!(QpEvent::from_bytes(&b[..10]), None);
    }
}
