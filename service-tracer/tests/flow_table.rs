//! The flow table fed with recorded event sequences (no kernel needed).

use rpingmesh_agent_common::event::*;
use rpingmesh_service_tracer::flows::ChangeLog;
use rpingmesh_service_tracer::*;

const DEV: &str = "mlx5_0";
const LOCAL: Gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

fn resolver() -> impl GidResolver {
    // Port 1, sgid index 3 resolves; anything else is unknown.
    |dev: &str, port: u8, idx: u8| (dev == DEV && port == 1 && idx == 3).then_some(LOCAL)
}
fn no_filter() -> impl QpFilter {
    |_: u32, _: &str, _: u32| false
}

fn base(kind: u8, ts: u64, tgid: u32, qpn: u32) -> QpEvent {
    let mut e = QpEvent::zeroed();
    e.kind = kind;
    e.source = SOURCE_UPROBE;
    e.boot_ns = ts;
    e.pid = tgid;
    e.tgid = tgid;
    e.qp_num = qpn;
    e.comm[..5].copy_from_slice(b"train");
    e.dev_name[..DEV.len()].copy_from_slice(DEV.as_bytes());
    e.cgroup_id = 77;
    e.qp_type = 2;
    e
}
fn create(ts: u64, tgid: u32, qpn: u32) -> QpEvent {
    base(KIND_CREATE, ts, tgid, qpn)
}
fn to_init(ts: u64, tgid: u32, qpn: u32) -> QpEvent {
    let mut e = base(KIND_MODIFY, ts, tgid, qpn);
    e.attr_mask = QP_ATTR_STATE | QP_ATTR_PORT;
    e.qp_state = QPS_INIT;
    e.port = 1;
    e
}
fn to_rtr(ts: u64, tgid: u32, qpn: u32, remote_last: u8, dqpn: u32) -> QpEvent {
    let mut e = base(KIND_MODIFY, ts, tgid, qpn);
    e.attr_mask = QP_ATTR_STATE | QP_ATTR_AV | QP_ATTR_DEST_QPN;
    e.qp_state = QPS_RTR;
    e.flags = FLAG_GRH;
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
        0,
        0,
        0,
        remote_last,
    ];
    e.dest_qp_num = dqpn;
    e.flow_label = 0xabcde;
    e.sgid_index = 3;
    e.sl = 3;
    e.traffic_class = 106;
    e.port = 0; // AV without port: the INIT port applies
    e
}
fn destroy(ts: u64, tgid: u32, qpn: u32) -> QpEvent {
    base(KIND_DESTROY, ts, tgid, qpn)
}

struct T {
    t: FlowTable,
    out: Vec<FlowChange>,
}
impl T {
    fn new(max_qps: usize) -> T {
        T {
            t: FlowTable::new(FlowTableConfig {
                max_qps,
                max_tombstones: 1024,
            }),
            out: vec![],
        }
    }
    fn feed(&mut self, evs: &[QpEvent]) -> Vec<FlowChange> {
        let (r, f) = (resolver(), no_filter());
        for e in evs {
            self.t.apply_bytes(e.as_bytes(), &r, &f, &mut self.out);
        }
        std::mem::take(&mut self.out)
    }
}
fn key(qpn: u32) -> FlowKey {
    FlowKey {
        local_gid: LOCAL,
        local_qpn: qpn,
    }
}

#[test]
fn lifecycle_create_connect_destroy() {
    let mut t = T::new(100);
    let ch = t.feed(&[
        create(10, 500, 0x11),
        to_init(11, 500, 0x11),
        to_rtr(12, 500, 0x11, 2, 0x99),
    ]);
    assert_eq!(ch.len(), 1);
    let FlowChange::Upsert(f) = &ch[0] else {
        panic!("{ch:?}")
    };
    assert_eq!(f.key, key(0x11));
    assert_eq!(f.remote_gid[15], 2);
    assert_eq!(
        (f.remote_qpn, f.flow_label, f.sl, f.traffic_class, f.port),
        (0x99, 0xabcde, 3, 106, 1)
    );
    assert_eq!(
        (f.pid, f.comm.as_str(), f.cgroup_id, f.device.as_str()),
        (500, "train", 77, DEV)
    );
    assert_eq!((f.first_seen_ns, f.last_seen_ns), (12, 12));
    // RTS: no new report.
    let mut rts = base(KIND_MODIFY, 13, 500, 0x11);
    rts.attr_mask = QP_ATTR_STATE;
    rts.qp_state = QPS_RTS;
    assert!(t.feed(&[rts]).is_empty());
    // The same RTR again (idempotent): nothing reported, last seen refreshed.
    assert!(t.feed(&[to_rtr(14, 500, 0x11, 2, 0x99)]).is_empty());
    assert_eq!(t.t.get(&key(0x11)).unwrap().last_seen_ns, 14);
    assert_eq!(
        t.feed(&[destroy(20, 500, 0x11)]),
        vec![FlowChange::Remove(key(0x11))]
    );
    assert!(t.t.is_empty());
    assert_eq!(t.t.tracked_qps(), 0);
}

#[test]
fn out_of_order_events() {
    let mut t = T::new(100);
    // RTR seen before create and INIT (tracer started late / reordering): the flow exists
    // but the INIT port is unknown, so the local GID cannot be resolved yet.
    let ch = t.feed(&[to_rtr(12, 500, 0x21, 2, 0x99)]);
    assert!(ch.is_empty());
    assert_eq!(t.t.stats().unresolved_local_gid, 1);
    // Late INIT (older timestamp) is stale and ignored; late create only fills in.
    assert!(t
        .feed(&[to_init(11, 500, 0x21), create(10, 500, 0x21)])
        .is_empty());
    assert_eq!(t.t.stats().stale, 1);
    // With the port carried by the AV it resolves.
    let mut rtr = to_rtr(13, 500, 0x21, 2, 0x99);
    rtr.port = 1;
    assert_eq!(t.feed(&[rtr]).len(), 1);
    // A destroy followed by a late modify of the destroyed QP: the modify is rejected.
    assert_eq!(
        t.feed(&[destroy(30, 500, 0x21)]),
        vec![FlowChange::Remove(key(0x21))]
    );
    let mut late = to_rtr(29, 500, 0x21, 2, 0x99);
    late.port = 1;
    assert!(t.feed(&[late]).is_empty());
    assert!(t.t.is_empty());
    // QPN reused later by a new create: accepted again.
    let ch = t.feed(&[
        create(40, 501, 0x21),
        to_init(41, 501, 0x21),
        to_rtr(42, 501, 0x21, 5, 0x77),
    ]);
    assert_eq!(ch.len(), 1);
}

#[test]
fn destroy_without_create() {
    let mut t = T::new(100);
    assert!(t.feed(&[destroy(5, 500, 0x31)]).is_empty());
    assert_eq!(t.t.stats().destroy_unknown, 1);
    assert!(t.t.is_empty());
}

#[test]
fn pid_reuse_and_process_exit() {
    let mut t = T::new(100);
    t.feed(&[
        create(10, 600, 0x41),
        to_init(11, 600, 0x41),
        to_rtr(12, 600, 0x41, 2, 1),
    ]);
    t.feed(&[
        create(10, 601, 0x42),
        to_init(11, 601, 0x42),
        to_rtr(12, 601, 0x42, 2, 2),
    ]);
    assert_eq!(t.t.len(), 2);
    // pid 600 still runs but started after its QP was created: a new process reused the pid.
    let mut out = vec![];
    t.t.process_gone(600, Some(1_000), &mut out);
    assert_eq!(out, vec![FlowChange::Remove(key(0x41))]);
    // pid 601 alive and older than its QP: kept.
    out.clear();
    t.t.process_gone(601, Some(5), &mut out);
    assert!(out.is_empty());
    // pid 601 exits.
    t.t.process_gone(601, None, &mut out);
    assert_eq!(out, vec![FlowChange::Remove(key(0x42))]);
    // The same QPN taken over by another process (missed destroy): old flow replaced.
    let ch = t.feed(&[to_rtr(12, 700, 0x43, 2, 3), create(50, 701, 0x43)]);
    assert!(ch.is_empty(), "unresolved port, no flow yet: {ch:?}");
    let ch = t.feed(&[
        create(10, 800, 0x44),
        to_init(11, 800, 0x44),
        to_rtr(12, 800, 0x44, 2, 4),
        create(60, 801, 0x44),
    ]);
    assert_eq!(ch.last(), Some(&FlowChange::Remove(key(0x44))));
}

#[test]
fn ring_buffer_drops_are_recorded_and_recovered() {
    let mut t = T::new(100);
    t.feed(&[
        create(10, 900, 0x51),
        to_init(11, 900, 0x51),
        to_rtr(12, 900, 0x51, 2, 1),
    ]);
    // The destroy of 0x51 was dropped in the kernel; the kernel counters say so.
    t.t.note_kernel_counters(1, 0);
    assert_eq!(t.t.stats().ringbuf_drops, 1);
    // The QPN is reused by a new create: the stale flow goes away.
    let ch = t.feed(&[create(20, 900, 0x51)]);
    assert_eq!(ch, vec![FlowChange::Remove(key(0x51))]);
    // A truncated record is counted, not applied.
    let mut out = vec![];
    t.t.apply_bytes(&[1, 2, 3], &resolver(), &no_filter(), &mut out);
    assert_eq!(t.t.stats().malformed, 1);
}

#[test]
fn unknown_remote_gids_and_non_grh_paths() {
    let mut t = T::new(100);
    // A remote GID nobody registered is still a flow (the controller lists it unmonitored).
    let ch = t.feed(&[
        create(1, 1, 0x61),
        to_init(2, 1, 0x61),
        to_rtr(3, 1, 0x61, 0xee, 5),
    ]);
    assert_eq!(ch.len(), 1);
    // No GRH (IB LID routing): nothing to hash on, not a flow.
    let mut rtr = to_rtr(3, 1, 0x62, 2, 5);
    rtr.flags = 0;
    assert!(t
        .feed(&[create(1, 1, 0x62), to_init(2, 1, 0x62), rtr])
        .is_empty());
    assert_eq!(t.t.stats().no_grh, 1);
    // Unresolvable sgid index: counted.
    let mut rtr = to_rtr(3, 1, 0x63, 2, 5);
    rtr.sgid_index = 9;
    assert!(t
        .feed(&[create(1, 1, 0x63), to_init(2, 1, 0x63), rtr])
        .is_empty());
    assert_eq!(t.t.stats().unresolved_local_gid, 1);
}

#[test]
fn own_probe_qps_are_excluded() {
    let mut t = FlowTable::new(FlowTableConfig::default());
    let mut out = vec![];
    let own = ExcludePid(4242);
    for e in [
        create(1, 4242, 0x71),
        to_init(2, 4242, 0x71),
        to_rtr(3, 4242, 0x71, 2, 1),
    ] {
        t.apply(&e, &resolver(), &own, &mut out);
    }
    assert!(out.is_empty());
    assert_eq!(t.stats().filtered, 1);
}

#[test]
fn error_state_removes_flow() {
    let mut t = T::new(100);
    t.feed(&[
        create(1, 1, 0x81),
        to_init(2, 1, 0x81),
        to_rtr(3, 1, 0x81, 2, 1),
    ]);
    let mut err = base(KIND_MODIFY, 4, 1, 0x81);
    err.attr_mask = QP_ATTR_STATE;
    err.qp_state = QPS_ERR;
    assert_eq!(t.feed(&[err]), vec![FlowChange::Remove(key(0x81))]);
}

#[test]
fn flood_of_100k_qps_stays_bounded() {
    let cap = 4096;
    let mut t = T::new(cap);
    let mut log = ChangeLog::new(2 * cap);
    let (r, f) = (resolver(), no_filter());
    let mut out = vec![];
    let mut max_seen = 0;
    for i in 0..100_000u32 {
        let ts = 10 * i as u64;
        for e in [
            create(ts, 1000 + i % 50, i),
            to_init(ts + 1, 1000 + i % 50, i),
            to_rtr(ts + 2, 1000 + i % 50, i, 2, i),
        ] {
            t.t.apply(&e, &r, &f, &mut out);
        }
        log.record(out.drain(..));
        max_seen = max_seen.max(t.t.tracked_qps());
    }
    assert!(max_seen <= cap, "{max_seen}");
    assert_eq!(t.t.len(), cap);
    assert_eq!(t.t.stats().evictions, 100_000 - cap as u64);
    // The newest QPs survive (oldest evicted first).
    assert!(t.t.get(&key(99_999)).is_some());
    assert!(t.t.get(&key(0)).is_none());
    // The change log overflowed and degrades to one full resend of the bounded table.
    let batch = log.drain(&t.t);
    assert!(batch.full);
    assert_eq!(batch.changes.len(), cap);
    assert!(log.is_empty());
}

#[test]
fn change_log_coalesces() {
    let mut t = T::new(100);
    let mut log = ChangeLog::new(100);
    log.record(t.feed(&[
        create(1, 1, 0x91),
        to_init(2, 1, 0x91),
        to_rtr(3, 1, 0x91, 2, 1),
    ]));
    log.record(t.feed(&[destroy(4, 1, 0x91)]));
    log.record(t.feed(&[
        create(5, 1, 0x92),
        to_init(6, 1, 0x92),
        to_rtr(7, 1, 0x92, 2, 1),
    ]));
    let b = log.drain(&t.t);
    assert!(!b.full);
    assert_eq!(b.changes.len(), 2);
    assert_eq!(b.changes[0], FlowChange::Remove(key(0x91)));
    assert!(matches!(&b.changes[1], FlowChange::Upsert(f) if f.key == key(0x92)));
    assert!(log.drain(&t.t).changes.is_empty());
}

/// What the ib_query_qp probes emit: the QP's current state and path, attributed to its
/// owner, as for `rdma res show qp` run after the QP was connected.
fn query(ts: u64, tgid: u32, qpn: u32, state: u8) -> QpEvent {
    let mut e = to_rtr(ts, tgid, qpn, 2, 0x99);
    e.kind = KIND_QUERY;
    e.source = SOURCE_KPROBE;
    e.qp_state = state;
    e.port = 1;
    e.attr_mask = QP_ATTR_STATE | QP_ATTR_DEST_QPN | QP_ATTR_AV;
    e
}

#[test]
fn queries_learn_qps_connected_before_tracing() {
    let mut t = T::new(100);
    // Never seen created or connected: a query finds it in RTS.
    let ch = t.feed(&[query(50, 700, 0x21, QPS_RTS)]);
    let [FlowChange::Upsert(f)] = ch.as_slice() else {
        panic!("{ch:?}")
    };
    assert_eq!(f.key, key(0x21));
    assert_eq!((f.remote_qpn, f.pid, f.comm.as_str()), (0x99, 700, "train"));
    assert_eq!(t.t.stats().queries, 1);
    // Queried again unchanged: nothing to report. A QP still in INIT: no flow.
    assert!(t.feed(&[query(51, 700, 0x21, QPS_RTS)]).is_empty());
    assert!(t.feed(&[query(52, 700, 0x22, QPS_INIT)]).is_empty());
    // A query that finds it in ERR removes the flow; the destroy later is harmless.
    assert_eq!(
        t.feed(&[query(53, 700, 0x21, QPS_ERR)]),
        vec![FlowChange::Remove(key(0x21))]
    );
    assert!(t.feed(&[destroy(54, 700, 0x21)]).is_empty());
    // A late query of a destroyed QP (older than its destroy) changes nothing.
    assert!(t.feed(&[query(53, 700, 0x21, QPS_RTS)]).is_empty());
}
