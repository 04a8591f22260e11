//! The service-flow table: pure logic, fed with decoded `QpEvent`s, no I/O.
//!
//! A QP becomes a flow when it is moved to RTR with a GRH address vector; the flow is
//! keyed by (local GID, local QPN), the local GID coming from the caller's resolver
//! (device, port, sgid index). Destroy, a move to RESET/ERR, the process's exit or QPN
//! reuse removes it. Memory is bounded: at most `max_qps` QPs (and so flows) are kept,
//! the least recently active one is evicted, and evictions are counted.

use rpingmesh_agent_common::event::*;
use std::collections::{BTreeMap, HashMap, VecDeque};

pub type Gid = [u8; 16];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    pub local_gid: Gid,
    pub local_qpn: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventSource {
    Kprobe,
    Uprobe,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceFlow {
    pub key: FlowKey,
    pub device: String,
    pub port: u8,
    pub sgid_index: u8,
    pub remote_gid: Gid,
    pub remote_qpn: u32,
    pub flow_label: u32,
    pub sl: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub qp_type: u8,
    /// Process id (tgid) owning the QP.
    pub pid: u32,
    pub comm: String,
    pub cgroup_id: u64,
    /// CLOCK_BOOTTIME nanoseconds (as the eBPF side reports).
    pub first_seen_ns: u64,
    pub last_seen_ns: u64,
    pub source: EventSource,
}

impl ServiceFlow {
    /// Equal apart from the last-seen time (an update that needs no report).
    fn same_path(&self, o: &ServiceFlow) -> bool {
        let mut a = self.clone();
        a.last_seen_ns = o.last_seen_ns;
        a == *o
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlowChange {
    Upsert(ServiceFlow),
    Remove(FlowKey),
}

/// Maps a QP's (device, port, sgid index) to the local GID. Provided by the agent.
pub trait GidResolver: Send + Sync {
    fn local_gid(&self, device: &str, port: u8, sgid_index: u8) -> Option<Gid>;
}

impl<F: Fn(&str, u8, u8) -> Option<Gid> + Send + Sync> GidResolver for F {
    fn local_gid(&self, device: &str, port: u8, sgid_index: u8) -> Option<Gid> {
        self(device, port, sgid_index)
    }
}

/// Says which QPs are the agent's own probe QPs (excluded from the table).
pub trait QpFilter: Send + Sync {
    fn exclude(&self, tgid: u32, device: &str, qpn: u32) -> bool;
}

impl<F: Fn(u32, &str, u32) -> bool + Send + Sync> QpFilter for F {
    fn exclude(&self, tgid: u32, device: &str, qpn: u32) -> bool {
        self(tgid, device, qpn)
    }
}

/// Excludes the calling process's QPs (the agent's probe QPs).
pub struct ExcludePid(pub u32);
impl QpFilter for ExcludePid {
    fn exclude(&self, tgid: u32, _: &str, _: u32) -> bool {
        tgid == self.0
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    pub events: u64,
    pub malformed: u64,
    pub creates: u64,
    pub modifies: u64,
    /// QPs the kernel was asked about (ib_query_qp answers; also counted in `modifies`).
    pub queries: u64,
    pub destroys: u64,
    pub upserts: u64,
    pub removals: u64,
    /// QPs (with or without a flow) evicted because the table was full.
    pub evictions: u64,
    pub destroy_unknown: u64,
    /// Events older than what the table already knows (late, out of order).
    pub stale: u64,
    pub unresolved_local_gid: u64,
    pub no_grh: u64,
    pub filtered: u64,
    pub process_exits: u64,
    /// Exit events of traced processes (the kernel's sched_process_exit).
    pub exits: u64,
    /// Kernel-side ring-buffer drops (sum over CPUs, as last reported).
    pub ringbuf_drops: u64,
    pub read_errors: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct FlowTableConfig {
    /// QPs tracked at most (flows <= QPs).
    pub max_qps: usize,
    /// Destroyed-QP tombstones kept to reject late events.
    pub max_tombstones: usize,
}

impl Default for FlowTableConfig {
    fn default() -> Self {
        FlowTableConfig {
            max_qps: 65_536,
            max_tombstones: 16_384,
        }
    }
}

type QpId = ([u8; DEV_NAME_LEN], u32);

#[derive(Debug)]
struct QpState {
    tgid: u32,
    port: u8,
    created_ns: u64,
    last_ns: u64,
    flow: Option<FlowKey>,
    lru: u64,
}

pub struct FlowTable {
    cfg: FlowTableConfig,
    qps: HashMap<QpId, QpState>,
    /// Tracked QPs per owning process; and the processes that came or went since
    /// `take_tgid_changes` (the exit program's filter follows them).
    per_tgid: HashMap<u32, usize>,
    tgid_changes: Vec<(u32, bool)>,
    lru: BTreeMap<u64, QpId>,
    seq: u64,
    flows: HashMap<FlowKey, ServiceFlow>,
    tombstones: HashMap<QpId, u64>,
    tomb_order: VecDeque<QpId>,
    stats: FlowStats,
}

pub(crate) fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl FlowTable {
    pub fn new(cfg: FlowTableConfig) -> Self {
        let cfg = FlowTableConfig {
            max_qps: cfg.max_qps.max(1),
            max_tombstones: cfg.max_tombstones.max(1),
        };
        FlowTable {
            cfg,
            qps: HashMap::new(),
            per_tgid: HashMap::new(),
            tgid_changes: Vec::new(),
            lru: BTreeMap::new(),
            seq: 0,
            flows: HashMap::new(),
            tombstones: HashMap::new(),
            tomb_order: VecDeque::new(),
            stats: FlowStats::default(),
        }
    }

    pub fn stats(&self) -> &FlowStats {
        &self.stats
    }
    pub fn len(&self) -> usize {
        self.flows.len()
    }
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }
    pub fn tracked_qps(&self) -> usize {
        self.qps.len()
    }
    pub fn flows(&self) -> impl Iterator<Item = &ServiceFlow> {
        self.flows.values()
    }
    pub fn get(&self, key: &FlowKey) -> Option<&ServiceFlow> {
        self.flows.get(key)
    }
    /// Distinct processes owning tracked QPs (for the liveness check).
    pub fn tgids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.per_tgid.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Processes that started (true) or stopped (false) owning tracked QPs since the
    /// last call, in order.
    pub fn take_tgid_changes(&mut self) -> Vec<(u32, bool)> {
        std::mem::take(&mut self.tgid_changes)
    }

    /// Latest kernel counters (monotonic sums over CPUs).
    pub fn note_kernel_counters(&mut self, ringbuf_drops: u64, read_errors: u64) {
        self.stats.ringbuf_drops = ringbuf_drops;
        self.stats.read_errors = read_errors;
    }

    /// Decode and apply one ring-buffer record.
    pub fn apply_bytes(
        &mut self,
        b: &[u8],
        r: &dyn GidResolver,
        f: &dyn QpFilter,
        out: &mut Vec<FlowChange>,
    ) {
        match QpEvent::from_bytes(b) {
            Some(ev) => self.apply(&ev, r, f, out),
            None => self.stats.malformed += 1,
        }
    }

    pub fn apply(
        &mut self,
        ev: &QpEvent,
        r: &dyn GidResolver,
        f: &dyn QpFilter,
        out: &mut Vec<FlowChange>,
    ) {
        self.stats.events += 1;
        let id: QpId = (ev.dev_name, ev.qp_num);
        if let Some(&t) = self.tombstones.get(&id) {
            if ev.boot_ns <= t {
                self.stats.stale += 1;
                return;
            }
        }
        match ev.kind {
            KIND_CREATE => self.on_create(id, ev, out),
            KIND_MODIFY => self.on_modify(id, ev, r, f, out),
            // A query reports the QP's current state and path as a modify to it would.
            KIND_QUERY => {
                self.stats.queries += 1;
                self.on_modify(id, ev, r, f, out)
            }
            KIND_DESTROY => self.on_destroy(id, ev, out),
            KIND_EXIT => {
                self.stats.exits += 1;
                self.process_gone(ev.tgid, None, out);
            }
            _ => self.stats.malformed += 1,
        }
    }

    fn on_create(&mut self, id: QpId, ev: &QpEvent, out: &mut Vec<FlowChange>) {
        self.stats.creates += 1;
        if let Some(q) = self.qps.get_mut(&id) {
            if ev.boot_ns <= q.last_ns && q.tgid == ev.tgid {
                // Late create of a QP we already saw modified: only fill in.
                q.created_ns = q.created_ns.min(ev.boot_ns);
                if q.port == 0 {
                    q.port = ev.port;
                }
                return;
            }
            // A newer create for the same (device, QPN): the old QP is gone (missed
            // destroy, e.g. a ring-buffer drop) and the QPN was reused.
            self.forget_qp(id, out);
        }
        self.insert_qp(
            id,
            QpState {
                tgid: ev.tgid,
                port: ev.port,
                created_ns: ev.boot_ns,
                last_ns: ev.boot_ns,
                flow: None,
                lru: 0,
            },
            out,
        );
    }

    fn on_modify(
        &mut self,
        id: QpId,
        ev: &QpEvent,
        r: &dyn GidResolver,
        f: &dyn QpFilter,
        out: &mut Vec<FlowChange>,
    ) {
        self.stats.modifies += 1;
        match self.qps.get(&id) {
            Some(q) if ev.boot_ns < q.last_ns => {
                self.stats.stale += 1;
                return;
            }
            Some(q) if q.tgid != ev.tgid => {
                // Another process modifies this QPN: the old owner's QP is gone.
                self.forget_qp(id, out);
            }
            _ => {}
        }
        if !self.qps.contains_key(&id) {
            // Modify without a create (tracer started late, or the create was dropped).
            self.insert_qp(
                id,
                QpState {
                    tgid: ev.tgid,
                    port: 0,
                    created_ns: ev.boot_ns,
                    last_ns: ev.boot_ns,
                    flow: None,
                    lru: 0,
                },
                out,
            );
        }
        self.touch(id);
        let q = self.qps.get_mut(&id).expect("just inserted");
        q.last_ns = ev.boot_ns;
        if ev.attr_mask & QP_ATTR_PORT != 0 && ev.port != 0 {
            q.port = ev.port;
        }
        if ev.attr_mask & QP_ATTR_STATE == 0 {
            return;
        }
        match ev.qp_state {
            // RTR is where a connect sets the path; a query (or a path change) reports it
            // in any of the connected states.
            QPS_RTR | QPS_RTS | QPS_SQD | QPS_SQE if ev.attr_mask & QP_ATTR_AV != 0 => {
                self.connect(id, ev, r, f, out)
            }
            QPS_RESET | QPS_ERR => {
                if let Some(k) = self.qps.get_mut(&id).and_then(|q| q.flow.take()) {
                    self.remove_flow(k, out);
                }
            }
            _ => {}
        }
    }

    fn connect(
        &mut self,
        id: QpId,
        ev: &QpEvent,
        r: &dyn GidResolver,
        f: &dyn QpFilter,
        out: &mut Vec<FlowChange>,
    ) {
        let device = cstr(&ev.dev_name);
        let q = self.qps.get(&id).expect("caller inserted");
        let port = if ev.attr_mask & QP_ATTR_AV != 0 && ev.port != 0 {
            ev.port
        } else {
            q.port
        };
        let old = q.flow;
        let new_key = if f.exclude(ev.tgid, &device, ev.qp_num) {
            self.stats.filtered += 1;
            None
        } else if ev.flags & FLAG_GRH == 0 {
            self.stats.no_grh += 1;
            None
        } else {
            match r.local_gid(&device, port, ev.sgid_index) {
                Some(g) => Some(FlowKey {
                    local_gid: g,
                    local_qpn: ev.qp_num,
                }),
                None => {
                    self.stats.unresolved_local_gid += 1;
                    None
                }
            }
        };
        if let Some(o) = old {
            if Some(o) != new_key {
                self.remove_flow(o, out);
            }
        }
        self.qps.get_mut(&id).expect("present").flow = new_key;
        let Some(key) = new_key else { return };
        let first_seen_ns = self
            .flows
            .get(&key)
            .map_or(ev.boot_ns, |fl| fl.first_seen_ns);
        let flow = ServiceFlow {
            key,
            device,
            port,
            sgid_index: ev.sgid_index,
            remote_gid: ev.dgid,
            remote_qpn: ev.dest_qp_num,
            flow_label: ev.flow_label & 0xf_ffff,
            sl: ev.sl,
            traffic_class: ev.traffic_class,
            hop_limit: ev.hop_limit,
            qp_type: ev.qp_type,
            pid: ev.tgid,
            comm: cstr(&ev.comm),
            cgroup_id: ev.cgroup_id,
            first_seen_ns,
            last_seen_ns: ev.boot_ns,
            source: if ev.source == SOURCE_KPROBE {
                EventSource::Kprobe
            } else {
                EventSource::Uprobe
            },
        };
        match self.flows.get_mut(&key) {
            Some(cur) if cur.same_path(&flow) => cur.last_seen_ns = flow.last_seen_ns,
            _ => {
                self.flows.insert(key, flow.clone());
                self.stats.upserts += 1;
                out.push(FlowChange::Upsert(flow));
            }
        }
    }

    fn on_destroy(&mut self, id: QpId, ev: &QpEvent, out: &mut Vec<FlowChange>) {
        self.stats.destroys += 1;
        if self.tomb_order.len() >= self.cfg.max_tombstones {
            if let Some(old) = self.tomb_order.pop_front() {
                self.tombstones.remove(&old);
            }
        }
        if self.tombstones.insert(id, ev.boot_ns).is_none() {
            self.tomb_order.push_back(id);
        }
        match self.qps.get(&id) {
            Some(q) if q.last_ns > ev.boot_ns => self.stats.stale += 1, // destroy of an older incarnation
            Some(_) => self.forget_qp(id, out),
            None => self.stats.destroy_unknown += 1,
        }
    }

    /// The process `tgid` exited (`started_ns: None`), or a process with that pid now runs
    /// since `started_ns` (boot ns): QPs of the old incarnation are removed.
    pub fn process_gone(&mut self, tgid: u32, started_ns: Option<u64>, out: &mut Vec<FlowChange>) {
        let ids: Vec<QpId> = self
            .qps
            .iter()
            .filter(|(_, q)| q.tgid == tgid && started_ns.is_none_or(|s| q.created_ns < s))
            .map(|(id, _)| *id)
            .collect();
        if !ids.is_empty() {
            self.stats.process_exits += 1;
        }
        for id in ids {
            self.forget_qp(id, out);
        }
    }

    fn touch(&mut self, id: QpId) {
        if let Some(q) = self.qps.get_mut(&id) {
            self.lru.remove(&q.lru);
            self.seq += 1;
            q.lru = self.seq;
            self.lru.insert(self.seq, id);
        }
    }

    fn insert_qp(&mut self, id: QpId, mut st: QpState, out: &mut Vec<FlowChange>) {
        while self.qps.len() >= self.cfg.max_qps {
            let Some((_, victim)) = self.lru.pop_first() else {
                break;
            };
            self.stats.evictions += 1;
            self.forget_qp(victim, out);
        }
        self.seq += 1;
        st.lru = self.seq;
        self.lru.insert(self.seq, id);
        let n = self.per_tgid.entry(st.tgid).or_insert(0);
        if *n == 0 {
            self.tgid_changes.push((st.tgid, true));
        }
        *n += 1;
        self.qps.insert(id, st);
    }

    fn forget_qp(&mut self, id: QpId, out: &mut Vec<FlowChange>) {
        if let Some(q) = self.qps.remove(&id) {
            self.lru.remove(&q.lru);
            if let Some(n) = self.per_tgid.get_mut(&q.tgid) {
                *n -= 1;
                if *n == 0 {
                    self.per_tgid.remove(&q.tgid);
                    self.tgid_changes.push((q.tgid, false));
                }
            }
            if let Some(k) = q.flow {
                self.remove_flow(k, out);
            }
        }
    }

    fn remove_flow(&mut self, key: FlowKey, out: &mut Vec<FlowChange>) {
        if self.flows.remove(&key).is_some() {
            self.stats.removals += 1;
            out.push(FlowChange::Remove(key));
        }
    }
}

/// Coalesces changes between two reads by the reporter: the latest state per key wins,
/// and past `max_pending` keys it degrades to "send everything" (bounded memory).
#[derive(Debug)]
pub struct ChangeLog {
    pending: HashMap<FlowKey, Option<ServiceFlow>>,
    max_pending: usize,
    overflowed: bool,
}

/// What the reporter gets: either incremental changes, or (`full == true`) the complete
/// current flow set as upserts (replace everything previously reported).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ChangeBatch {
    pub full: bool,
    pub changes: Vec<FlowChange>,
}

impl ChangeLog {
    pub fn new(max_pending: usize) -> Self {
        ChangeLog {
            pending: HashMap::new(),
            max_pending: max_pending.max(1),
            overflowed: false,
        }
    }

    pub fn record(&mut self, changes: impl IntoIterator<Item = FlowChange>) {
        if self.overflowed {
            return;
        }
        for c in changes {
            match c {
                FlowChange::Upsert(f) => self.pending.insert(f.key, Some(f)),
                FlowChange::Remove(k) => self.pending.insert(k, None),
            };
        }
        if self.pending.len() > self.max_pending {
            self.pending.clear();
            self.overflowed = true;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty() && !self.overflowed
    }

    /// Take the pending changes; `table` supplies the full set after an overflow.
    pub fn drain(&mut self, table: &FlowTable) -> ChangeBatch {
        if std::mem::take(&mut self.overflowed) {
            self.pending.clear();
            let changes = table.flows().cloned().map(FlowChange::Upsert).collect();
            return ChangeBatch {
                full: true,
                changes,
            };
        }
        let mut changes: Vec<FlowChange> = self
            .pending
            .drain()
            .map(|(k, v)| match v {
                Some(f) => FlowChange::Upsert(f),
                None => FlowChange::Remove(k),
            })
            .collect();
        changes.sort_by_key(|c| match c {
            FlowChange::Upsert(f) => f.key,
            FlowChange::Remove(k) => *k,
        });
        ChangeBatch {
            full: false,
            changes,
        }
    }
}
