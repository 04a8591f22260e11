//! Service-aware probing, agent side: starts the QP tracer (service-tracer), maps its
//! flows to `controller_agent.ServiceFlow`, and reports them with `ReportServiceFlows`
//! (incremental, full resend after a controller restart, empty heartbeat every interval).
//!
//! The pure parts (name mapping, the metric-name cap, flow mapping, the reporter's state
//! machine) have no I/O; `run_flow_reporter` is the loop around them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rpingmesh_proto::controller_agent::{
    ServiceFlow as ProtoFlow, ServiceFlowAck, ServiceFlowKey, ServiceFlowReport,
};
use rpingmesh_proto::gid::format_gid;
use rpingmesh_service_tracer::{
    ChangeBatch, ExcludePid, FlowChange, FlowKey, Gid, GidResolver, ServiceFlow, ServiceTracer,
    Started, TracerConfig, TracingMode,
};
use rpingmesh_verbs::rdma::sysfs;
use tokio::sync::watch;

use crate::cluster_monitor::Registrar;
use crate::config::{AgentConfig, ServiceTracingMode};
use crate::controller_client::ControllerClient;
use crate::telemetry::Metrics;
use crate::workload::host::RealHost;
use crate::workload::{Workload, WorkloadKind, WorkloadResolver};

/// Metric attribute value for service names past `max_service_names`.
pub const OTHER_SERVICE: &str = "other";
/// Metric attribute value for a SERVICE target without a name.
pub const UNKNOWN_SERVICE: &str = "unknown";

/// Process name (comm) -> configured service name; unmapped processes keep their comm.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceNames(BTreeMap<String, String>);

impl ServiceNames {
    pub fn new(map: BTreeMap<String, String>) -> Self {
        ServiceNames(map)
    }

    pub fn service_for<'a>(&'a self, comm: &'a str) -> &'a str {
        self.0.get(comm).map_or(comm, String::as_str)
    }
}

/// Bounds the distinct values of the `service` metric attribute: the first `max` names
/// seen keep their name, later ones become "other" (a metrics backend must not grow a
/// series per process name).
#[derive(Debug)]
pub struct ServiceNameCap {
    max: usize,
    names: HashSet<String>,
}

impl Default for ServiceNameCap {
    /// The `max_service_names` default.
    fn default() -> Self {
        Self::new(32)
    }
}

impl ServiceNameCap {
    pub fn new(max: usize) -> Self {
        ServiceNameCap {
            max,
            names: HashSet::new(),
        }
    }

    pub fn attribute(&mut self, service: &str) -> String {
        let s = if service.trim().is_empty() {
            UNKNOWN_SERVICE
        } else {
            service
        };
        if self.names.contains(s) {
            return s.to_string();
        }
        if self.names.len() < self.max {
            self.names.insert(s.to_string());
            return s.to_string();
        }
        OTHER_SERVICE.to_string()
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// CLOCK_REALTIME - CLOCK_BOOTTIME in ns: added to an eBPF boot-time stamp gives unix ns.
pub fn boot_to_unix_offset_ns() -> i64 {
    let read = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid out-pointer; both clocks exist on every Linux we run on.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec * 1_000_000_000 + ts.tv_nsec
    };
    let boot = read(libc::CLOCK_BOOTTIME);
    let real = read(libc::CLOCK_REALTIME);
    real - boot
}

fn boot_to_unix(boot_ns: u64, offset_ns: i64) -> u64 {
    (boot_ns as i128 + offset_ns as i128).clamp(0, u64::MAX as i128) as u64
}

fn gid_text(g: &Gid) -> String {
    format_gid(&Ipv6Addr::from(*g))
}

/// The service name of a QP: its workload's key when that names a job, pod, container or
/// unit; else a configured name for its process; else the cgroup path of no known
/// layout; else the process name.
pub fn service_name(w: &Workload, names: &ServiceNames, comm: &str) -> String {
    match w.kind {
        WorkloadKind::KubernetesPod
        | WorkloadKind::SlurmJob
        | WorkloadKind::Container
        | WorkloadKind::SystemdUnit => w.key.clone(),
        _ if names.0.contains_key(comm) => names.service_for(comm).to_string(),
        WorkloadKind::Cgroup => w.key.clone(),
        WorkloadKind::Process => comm.to_string(),
    }
}

/// A tracer flow as the controller wants it: GIDs in full form, unix timestamps, its
/// workload and the service name that follows from it ([`service_name`]).
pub fn to_proto_flow(
    f: &ServiceFlow,
    names: &ServiceNames,
    boot_to_unix_ns: i64,
    w: &Workload,
) -> ProtoFlow {
    ProtoFlow {
        local_gid: gid_text(&f.key.local_gid),
        local_qpn: f.key.local_qpn,
        remote_gid: gid_text(&f.remote_gid),
        remote_qpn: f.remote_qpn,
        flow_label: f.flow_label & 0xf_ffff,
        traffic_class: f.traffic_class as u32,
        service_level: f.sl as u32,
        pid: f.pid,
        comm: f.comm.clone(),
        cgroup_id: f.cgroup_id,
        first_seen_unix_ns: boot_to_unix(f.first_seen_ns, boot_to_unix_ns),
        last_seen_unix_ns: boot_to_unix(f.last_seen_ns, boot_to_unix_ns),
        service: service_name(w, names, &f.comm),
        workload: Some(w.to_proto()),
    }
}

pub fn to_proto_key(k: &FlowKey) -> ServiceFlowKey {
    ServiceFlowKey {
        local_gid: gid_text(&k.local_gid),
        local_qpn: k.local_qpn,
    }
}

/// How a `ReportServiceFlows` call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOutcome {
    Acked {
        resync_required: bool,
    },
    /// The controller does not know this agent: register again, then resend in full.
    NotFound,
    /// Transport error, timeout, other status: what this report carried is lost.
    Failed,
}

/// What the reporter does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterSend {
    /// Wait for the next interval.
    Wait,
    /// Send a full sync at once.
    ResendFull,
    /// Register again, then send a full sync.
    Reregister,
}

/// The reporter's state machine (pure): the first report, and every report after a lost
/// one, a resync request or a tracer overflow, is a full sync; otherwise the pending
/// changes (possibly none: the heartbeat).
#[derive(Debug)]
pub struct FlowReportState {
    need_full: bool,
    reports: u64,
    full_syncs: u64,
    /// When the controller last acknowledged a report (monotonic ns).
    last_acked_ns: Option<u64>,
}

/// An empty report is only a heartbeat: the controller expires an agent's flows after
/// minutes of silence (service_flow_ttl_sec, 120 s by default), so one every 30 s keeps
/// them alive while an idle agent stays near zero cost.
pub const HEARTBEAT_NS: u64 = 30_000_000_000;

impl Default for FlowReportState {
    fn default() -> Self {
        Self::new()
    }
}

impl FlowReportState {
    pub fn new() -> Self {
        FlowReportState {
            need_full: true,
            reports: 0,
            full_syncs: 0,
            last_acked_ns: None,
        }
    }

    /// Whether a report is worth sending now: anything to say, a pending full sync, or a
    /// heartbeat due (`heartbeat_ns` since the last acknowledged report).
    pub fn wants_send(&self, batch: &ChangeBatch, now_ns: u64, heartbeat_ns: u64) -> bool {
        self.need_full
            || batch.full
            || !batch.changes.is_empty()
            || self
                .last_acked_ns
                .is_none_or(|t| now_ns.saturating_sub(t) >= heartbeat_ns)
    }

    /// The next report must be a full sync (changes taken from the tracer were not sent).
    pub fn require_full(&mut self) {
        self.need_full = true;
    }

    /// Records that the controller acknowledged a report at `now_ns`.
    pub fn acked_at(&mut self, now_ns: u64) {
        self.last_acked_ns = Some(now_ns);
    }

    /// The next report. `batch` is what the tracer accumulated since the last call;
    /// `snapshot` (every current flow) is only called for a full sync.
    pub fn build(
        &mut self,
        agent_id: &str,
        batch: ChangeBatch,
        snapshot: impl FnOnce() -> Vec<ServiceFlow>,
        mut map: impl FnMut(&ServiceFlow) -> ProtoFlow,
    ) -> ServiceFlowReport {
        self.reports += 1;
        if self.need_full || batch.full {
            self.need_full = true; // until acknowledged
            self.full_syncs += 1;
            return ServiceFlowReport {
                agent_id: agent_id.to_string(),
                full_sync: true,
                upserts: snapshot().iter().map(&mut map).collect(),
                removals: Vec::new(),
            };
        }
        let mut upserts = Vec::new();
        let mut removals = Vec::new();
        for c in &batch.changes {
            match c {
                FlowChange::Upsert(f) => upserts.push(map(f)),
                FlowChange::Remove(k) => removals.push(to_proto_key(k)),
            }
        }
        ServiceFlowReport {
            agent_id: agent_id.to_string(),
            full_sync: false,
            upserts,
            removals,
        }
    }

    pub fn on_outcome(&mut self, o: SendOutcome) -> AfterSend {
        match o {
            SendOutcome::Acked {
                resync_required: false,
            } => {
                self.need_full = false;
                AfterSend::Wait
            }
            SendOutcome::Acked {
                resync_required: true,
            } => {
                self.need_full = true;
                AfterSend::ResendFull
            }
            SendOutcome::NotFound => {
                self.need_full = true;
                AfterSend::Reregister
            }
            SendOutcome::Failed => {
                // The changes it carried are gone from the tracer's log: resend everything.
                self.need_full = true;
                AfterSend::Wait
            }
        }
    }

    pub fn needs_full(&self) -> bool {
        self.need_full
    }
    pub fn reports(&self) -> u64 {
        self.reports
    }
    pub fn full_syncs(&self) -> u64 {
        self.full_syncs
    }
}

/// One of the agent's RNICs as the resolver sees it.
#[derive(Debug, Clone)]
pub enum LocalDevice {
    /// A udp pseudo-RNIC (`udp0`, ...): one GID whatever the port or GID index.
    Udp { gid: Ipv6Addr },
    /// An RDMA device: the GID is read from its sysfs GID table.
    Rdma,
}

/// Local GID of a traced QP: only for the agent's own RNICs (a QP on a device this agent
/// does not probe from has no SERVICE path to offer, so it resolves to nothing).
pub struct AgentGidResolver {
    devices: HashMap<String, LocalDevice>,
    sysfs_dir: PathBuf,
}

impl AgentGidResolver {
    pub fn new(devices: HashMap<String, LocalDevice>) -> Self {
        Self::with_sysfs(devices, PathBuf::from(sysfs::SYSFS_CLASS_DIR))
    }

    pub fn with_sysfs(devices: HashMap<String, LocalDevice>, sysfs_dir: PathBuf) -> Self {
        AgentGidResolver { devices, sysfs_dir }
    }
}

impl GidResolver for AgentGidResolver {
    fn local_gid(&self, device: &str, port: u8, sgid_index: u8) -> Option<Gid> {
        match self.devices.get(device)? {
            LocalDevice::Udp { gid } => Some(gid.octets()),
            LocalDevice::Rdma => {
                // One sysfs entry per connect, never the whole table: QP churn calls this
                // hundreds of times a second, on the tracer's task. Read each time (not
                // cached): a GID table changes with the host's IP addresses.
                sysfs::read_gid(
                    &self.sysfs_dir,
                    device,
                    port.max(1) as u32,
                    sgid_index as u32,
                )
                .ok()
                .flatten()
                .map(|g| g.octets())
            }
        }
    }
}

/// The tracer configuration from the agent's.
pub fn tracer_config(cfg: &AgentConfig) -> TracerConfig {
    TracerConfig {
        mode: match cfg.service_tracing_mode {
            ServiceTracingMode::Auto => TracingMode::Auto,
            ServiceTracingMode::Kprobe => TracingMode::Kprobe,
            ServiceTracingMode::Uprobe => TracingMode::Uprobe,
            ServiceTracingMode::Off => TracingMode::Off,
        },
        uprobe_targets: cfg
            .service_tracing_uprobe_targets
            .iter()
            .map(PathBuf::from)
            .collect(),
        ..TracerConfig::default()
    }
}

/// Starts the tracer (in the runtime's context; it blocks for the eBPF load, so the
/// agent calls it on a blocking thread). `None` when the mode is off (the caller says
/// so) or after logging exactly one line saying why tracing is off; probing goes on
/// either way.
pub fn start_tracer(
    cfg: &AgentConfig,
    devices: HashMap<String, LocalDevice>,
) -> Option<Arc<ServiceTracer>> {
    if cfg.service_tracing_mode == ServiceTracingMode::Off {
        return None;
    }
    let resolver = Arc::new(AgentGidResolver::new(devices));
    // The agent's own probe QPs are not services.
    let filter = Arc::new(ExcludePid(std::process::id()));
    let started = ServiceTracer::start(tracer_config(cfg), resolver, filter);
    // Loading parses the kernel's BTF (several MiB, freed right after); hand those pages
    // back so the agent's resident footprint stays what it needs for probing.
    release_freed_heap();
    match started {
        Started::Running(t) => {
            tracing::info!(mode = ?t.mode(), attachments = ?t.attachments(), "service tracing on");
            let t = Arc::new(t);
            // Service QPs connected before the agent started (a restart under running
            // jobs): ask the kernel about them. A blocking child process: off the workers.
            let learner = t.clone();
            tokio::task::spawn_blocking(move || {
                match learner.learn_existing_qps() {
                Ok(n) => tracing::info!(qps = n, "service tracing: asked the kernel about its existing QPs"),
                Err(why) => tracing::info!("service tracing: QPs connected before tracing began are learned when they reconnect ({why})"),
            }
            });
            Some(t)
        }
        Started::Off(why) => {
            tracing::warn!("{why}");
            None
        }
    }
}

/// Returns free heap pages to the kernel (glibc keeps them by default).
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

pub struct FlowReporterParams {
    pub agent_id: String,
    pub interval: Duration,
    pub names: ServiceNames,
    /// Where QPs' workloads are looked up.
    pub workloads: WorkloadResolver<RealHost>,
}

/// How often the workload cache forgets removed cgroups and exited processes.
const WORKLOAD_SWEEP: Duration = Duration::from_secs(30);

/// Sends the tracer's flows every `interval` (changes, or an empty heartbeat) until
/// shutdown. After an acknowledged report that changed something, bumps `kick` so the
/// cluster monitors fetch the SERVICE pinglist at once.
pub async fn run_flow_reporter(
    tracer: Arc<ServiceTracer>,
    client: ControllerClient,
    registrar: Arc<Registrar>,
    params: FlowReporterParams,
    metrics: Metrics,
    kick: watch::Sender<u64>,
    mut shutdown: watch::Receiver<bool>,
) {
    let FlowReporterParams {
        agent_id,
        interval,
        names,
        workloads,
    } = params;
    // Looking a workload up reads /proc and the cgroup tree, maybe runs scontrol: the
    // report is built on a blocking thread, with the resolver and the state moved there.
    let mut work = Some((FlowReportState::new(), workloads));
    let names = Arc::new(names);
    let mut last_sweep = std::time::Instant::now();
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let mut drops_exported = 0u64;
    let mut send_now = false;
    loop {
        if !send_now {
            tokio::select! {
                _ = tick.tick() => {}
                r = shutdown.wait_for(|s| *s) => { let _ = r; return; }
            }
        }
        send_now = false;
        let drops = tracer.stats().ringbuf_drops;
        metrics.record_tracer_ringbuf_dropped(drops.saturating_sub(drops_exported));
        drops_exported = drops_exported.max(drops);

        let batch = tracer.take_changes();
        let heartbeat_ns = HEARTBEAT_NS.max(interval.as_nanos() as u64);
        let (mut st, mut resolver) = work.take().expect("returned after every build");
        if !st.wants_send(&batch, rpingmesh_verbs::clock::monotonic_ns(), heartbeat_ns) {
            work = Some((st, resolver));
            continue;
        }
        if registrar.ensure_registered().await.is_err() {
            // The registrar logs; the full sync follows registration. The batch is not
            // lost: a failed registration leaves the controller without our flows, and
            // the full sync after it carries the whole table.
            st.require_full();
            work = Some((st, resolver));
            continue;
        }
        let offset = boot_to_unix_offset_ns();
        let sweep = last_sweep.elapsed() >= WORKLOAD_SWEEP;
        if sweep {
            last_sweep = std::time::Instant::now();
        }
        let (t, n, id) = (tracer.clone(), names.clone(), agent_id.clone());
        let built = tokio::task::spawn_blocking(move || {
            if sweep {
                resolver.sweep();
            }
            let report = st.build(
                &id,
                batch,
                || t.snapshot(),
                |f| {
                    let w = resolver.resolve(f.pid, f.cgroup_id, &f.comm);
                    to_proto_flow(f, &n, offset, &w)
                },
            );
            (st, resolver, report)
        })
        .await;
        let Ok((st, resolver, report)) = built else {
            tracing::error!("building the service flow report failed; service flow reports stop");
            return;
        };
        work = Some((st, resolver));
        let st = &mut work.as_mut().expect("just put back").0;
        let (full, n_up, n_rm) = (
            report.full_sync,
            report.upserts.len(),
            report.removals.len(),
        );
        let outcome = match client.report_service_flows(report).await {
            Ok(ServiceFlowAck {
                resync_required,
                flows_known,
                ..
            }) => {
                if failing {
                    tracing::info!("service flow reports accepted again");
                }
                failing = false;
                tracing::debug!(
                    full,
                    upserts = n_up,
                    removals = n_rm,
                    flows_known,
                    resync_required,
                    "service flows reported"
                );
                st.acked_at(rpingmesh_verbs::clock::monotonic_ns());
                SendOutcome::Acked { resync_required }
            }
            Err(e) if e.is_not_found() => SendOutcome::NotFound,
            Err(e) if e.is_unsupported() => {
                // A Go controller: no service paths there. Ending the reporter drops the
                // last handle of the tracer, which detaches its programs.
                tracing::info!(error = %e, "the controller does not take service flows (a Go controller?); service tracing off");
                return;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "service flow report failed; a full resend follows");
                }
                failing = true;
                SendOutcome::Failed
            }
        };
        if matches!(
            outcome,
            SendOutcome::Acked {
                resync_required: false
            }
        ) && (n_up > 0 || n_rm > 0)
        {
            kick.send_modify(|n| *n = n.wrapping_add(1));
        }
        match st.on_outcome(outcome) {
            AfterSend::Wait => {}
            AfterSend::ResendFull => {
                tracing::info!("controller asked for a full service flow resync");
                send_now = true;
            }
            AfterSend::Reregister => {
                tracing::warn!("controller does not know this agent (restarted?); registering again before a full service flow resend");
                registrar.invalidate().await;
                send_now = registrar.ensure_registered().await.is_ok();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpingmesh_service_tracer::EventSource;

    fn flow(qpn: u32, comm: &str) -> ServiceFlow {
        ServiceFlow {
            key: FlowKey {
                local_gid: std::net::Ipv4Addr::new(127, 0, 5, 1)
                    .to_ipv6_mapped()
                    .octets(),
                local_qpn: qpn,
            },
            device: "udp0".into(),
            port: 1,
            sgid_index: 0,
            remote_gid: "fe80::2".parse::<Ipv6Addr>().unwrap().octets(),
            remote_qpn: 0x777,
            flow_label: 0x5a5a5,
            sl: 4,
            traffic_class: 96,
            hop_limit: 64,
            qp_type: 2,
            pid: 4242,
            comm: comm.into(),
            cgroup_id: 99,
            first_seen_ns: 1_000,
            last_seen_ns: 2_000,
            source: EventSource::Uprobe,
        }
    }

    #[test]
    fn flow_mapping() {
        let mut m = BTreeMap::new();
        m.insert("python3".to_string(), "training".to_string());
        let names = ServiceNames::new(m);
        let proc_of = |f: &ServiceFlow| Workload::process(&f.comm);
        let f = flow(0x345, "python3");
        let p = to_proto_flow(&f, &names, 1_700_000_000_000_000_000, &proc_of(&f));
        assert_eq!(p.local_gid, "0000:0000:0000:0000:0000:ffff:7f00:0501");
        assert_eq!(p.remote_gid, "fe80:0000:0000:0000:0000:0000:0000:0002");
        assert_eq!(
            (p.local_qpn, p.remote_qpn, p.flow_label),
            (0x345, 0x777, 0x5a5a5)
        );
        assert_eq!((p.traffic_class, p.service_level), (96, 4));
        assert_eq!((p.pid, p.cgroup_id, p.comm.as_str()), (4242, 99, "python3"));
        assert_eq!(p.first_seen_unix_ns, 1_700_000_000_000_001_000);
        assert_eq!(p.last_seen_unix_ns, 1_700_000_000_000_002_000);
        assert_eq!(
            p.service, "training",
            "configured name wins over the process"
        );
        assert_eq!(p.workload.unwrap().kind, "process");
        let f = flow(1, "nccl");
        let p = to_proto_flow(&f, &names, 0, &proc_of(&f));
        assert_eq!(p.service, "nccl", "else the comm");
        // A negative offset never underflows.
        let f = flow(1, "x");
        assert_eq!(
            to_proto_flow(&f, &names, -5_000, &proc_of(&f)).first_seen_unix_ns,
            0
        );
        let k = to_proto_key(&flow(7, "x").key);
        assert_eq!(
            (k.local_gid.as_str(), k.local_qpn),
            ("0000:0000:0000:0000:0000:ffff:7f00:0501", 7)
        );
    }

    #[test]
    fn boot_offset_is_plausible() {
        let off = boot_to_unix_offset_ns();
        // Booted after 2020 and before now.
        assert!(off > 1_577_836_800_000_000_000, "{off}");
        assert!((off as u64) < rpingmesh_verbs::clock::realtime_ns());
    }

    #[test]
    fn service_name_cap() {
        let mut c = ServiceNameCap::new(2);
        assert_eq!(c.attribute("a"), "a");
        assert_eq!(c.attribute("b"), "b");
        assert_eq!(c.attribute("c"), OTHER_SERVICE);
        assert_eq!(c.attribute("a"), "a", "names already admitted stay");
        assert_eq!(c.attribute("d"), OTHER_SERVICE);
        assert_eq!(c.len(), 2);
        let mut c = ServiceNameCap::new(1);
        assert_eq!(c.attribute(" "), UNKNOWN_SERVICE);
        assert_eq!(c.attribute("x"), OTHER_SERVICE);
    }

    fn map(f: &ServiceFlow) -> ProtoFlow {
        to_proto_flow(f, &ServiceNames::default(), 0, &Workload::process(&f.comm))
    }

    #[test]
    fn a_job_names_the_service_and_a_configured_name_only_what_is_in_none() {
        let mut m = BTreeMap::new();
        m.insert("python3".to_string(), "training".to_string());
        let names = ServiceNames::new(m);
        let job = crate::workload::cgroup::parse_path(
            "/system.slice/slurmstepd.scope/job_12/step_0/user/task_0",
        )
        .unwrap();
        assert_eq!(service_name(&job, &names, "python3"), "slurm/12");
        let path = crate::workload::cgroup::parse_path("/batch/run7").unwrap();
        assert_eq!(service_name(&path, &names, "python3"), "training");
        assert_eq!(service_name(&path, &names, "bash"), "/batch/run7");
        let p = to_proto_flow(&flow(1, "python3"), &names, 0, &job);
        let w = p.workload.unwrap();
        assert_eq!(
            (
                p.service.as_str(),
                w.kind.as_str(),
                w.id.as_str(),
                w.part.as_str()
            ),
            ("slurm/12", "slurm_job", "12", "0")
        );
    }

    fn incr(changes: Vec<FlowChange>) -> ChangeBatch {
        ChangeBatch {
            full: false,
            changes,
        }
    }

    #[test]
    fn reporter_initial_full_then_incremental_and_heartbeat() {
        let mut st = FlowReportState::new();
        assert!(st.needs_full());
        // First report: full sync from the snapshot, whatever the batch says.
        let r = st.build(
            "a1",
            incr(vec![FlowChange::Upsert(flow(1, "x"))]),
            || vec![flow(1, "x"), flow(2, "y")],
            map,
        );
        assert!(r.full_sync);
        assert_eq!(r.agent_id, "a1");
        assert_eq!(
            r.upserts.iter().map(|u| u.local_qpn).collect::<Vec<_>>(),
            [1, 2]
        );
        assert!(r.removals.is_empty());
        assert_eq!(
            st.on_outcome(SendOutcome::Acked {
                resync_required: false
            }),
            AfterSend::Wait
        );
        assert!(!st.needs_full());
        // Then incremental: upserts and removals, no snapshot taken.
        let r = st.build(
            "a1",
            incr(vec![
                FlowChange::Upsert(flow(3, "z")),
                FlowChange::Remove(flow(1, "x").key),
            ]),
            || panic!("no snapshot for an incremental report"),
            map,
        );
        assert!(!r.full_sync);
        assert_eq!(r.upserts.len(), 1);
        assert_eq!(r.upserts[0].local_qpn, 3);
        assert_eq!(r.removals.len(), 1);
        assert_eq!(r.removals[0].local_qpn, 1);
        assert_eq!(
            st.on_outcome(SendOutcome::Acked {
                resync_required: false
            }),
            AfterSend::Wait
        );
        // Nothing changed: an empty heartbeat.
        let r = st.build("a1", ChangeBatch::default(), || panic!("no snapshot"), map);
        assert!(!r.full_sync && r.upserts.is_empty() && r.removals.is_empty());
        assert_eq!(
            st.on_outcome(SendOutcome::Acked {
                resync_required: false
            }),
            AfterSend::Wait
        );
        assert_eq!((st.reports(), st.full_syncs()), (3, 1));
    }

    #[test]
    fn empty_reports_go_out_only_as_heartbeats() {
        let hb = HEARTBEAT_NS;
        let mut st = FlowReportState::new();
        // Before the first full sync is acknowledged, always send.
        assert!(st.wants_send(&ChangeBatch::default(), 0, hb));
        st.build("a", ChangeBatch::default(), Vec::new, map);
        st.on_outcome(SendOutcome::Acked {
            resync_required: false,
        });
        st.acked_at(1_000);
        // Nothing to say and the heartbeat not due: skip.
        assert!(!st.wants_send(&ChangeBatch::default(), 1_000 + hb - 1, hb));
        // A change goes out at once; so does a full batch.
        assert!(st.wants_send(&incr(vec![FlowChange::Upsert(flow(1, "x"))]), 2_000, hb));
        assert!(st.wants_send(
            &ChangeBatch {
                full: true,
                changes: Vec::new()
            },
            2_000,
            hb
        ));
        // The heartbeat comes due.
        assert!(st.wants_send(&ChangeBatch::default(), 1_000 + hb, hb));
        // Changes taken but not sent (registration failed): a full sync is owed.
        st.require_full();
        assert!(st.wants_send(&ChangeBatch::default(), 1_001, hb));
        assert!(st.needs_full());
    }

    #[test]
    fn reporter_resyncs_on_request_not_found_failure_and_overflow() {
        let mut st = FlowReportState::new();
        st.build("a", ChangeBatch::default(), Vec::new, map);
        st.on_outcome(SendOutcome::Acked {
            resync_required: false,
        });

        // The controller restarted and lost our flows: resync at once.
        st.build("a", ChangeBatch::default(), || panic!(), map);
        assert_eq!(
            st.on_outcome(SendOutcome::Acked {
                resync_required: true
            }),
            AfterSend::ResendFull
        );
        let r = st.build("a", ChangeBatch::default(), || vec![flow(5, "x")], map);
        assert!(r.full_sync);
        assert_eq!(r.upserts.len(), 1);
        st.on_outcome(SendOutcome::Acked {
            resync_required: false,
        });

        // NotFound: re-register, then full.
        st.build(
            "a",
            incr(vec![FlowChange::Upsert(flow(6, "x"))]),
            || panic!(),
            map,
        );
        assert_eq!(st.on_outcome(SendOutcome::NotFound), AfterSend::Reregister);
        assert!(
            st.build(
                "a",
                ChangeBatch::default(),
                || vec![flow(5, "x"), flow(6, "x")],
                map
            )
            .full_sync
        );
        st.on_outcome(SendOutcome::Acked {
            resync_required: false,
        });

        // A lost report: its changes are gone, so the next one is full (and stays full
        // until one is acknowledged).
        st.build(
            "a",
            incr(vec![FlowChange::Remove(flow(5, "x").key)]),
            || panic!(),
            map,
        );
        assert_eq!(st.on_outcome(SendOutcome::Failed), AfterSend::Wait);
        assert!(
            st.build("a", ChangeBatch::default(), || vec![flow(6, "x")], map)
                .full_sync
        );
        assert_eq!(st.on_outcome(SendOutcome::Failed), AfterSend::Wait);
        let r = st.build("a", ChangeBatch::default(), || vec![flow(6, "x")], map);
        assert!(r.full_sync && r.upserts.len() == 1);
        st.on_outcome(SendOutcome::Acked {
            resync_required: false,
        });

        // The tracer's change log overflowed: full.
        let r = st.build(
            "a",
            ChangeBatch {
                full: true,
                changes: vec![],
            },
            || vec![flow(6, "x"), flow(7, "y")],
            map,
        );
        assert!(r.full_sync && r.upserts.len() == 2);
        st.on_outcome(SendOutcome::Acked {
            resync_required: false,
        });
        assert!(
            !st.build("a", ChangeBatch::default(), || panic!(), map)
                .full_sync
        );
    }

    #[test]
    fn resolver_knows_only_own_devices() {
        let dir = tempfile::tempdir().unwrap();
        // A fake sysfs tree: mlx5_0 port 1 with GID index 3.
        let gids = dir.path().join("mlx5_0/ports/1/gids");
        std::fs::create_dir_all(&gids).unwrap();
        for i in 0..4 {
            let g = if i == 3 {
                "0000:0000:0000:0000:0000:ffff:0a00:0001"
            } else {
                "0000:0000:0000:0000:0000:0000:0000:0000"
            };
            std::fs::write(gids.join(i.to_string()), format!("{g}\n")).unwrap();
        }
        std::fs::write(dir.path().join("mlx5_0/ports/1/state"), "4: ACTIVE\n").unwrap();
        let mut devs = HashMap::new();
        let udp_gid = std::net::Ipv4Addr::new(127, 0, 5, 1).to_ipv6_mapped();
        devs.insert("udp0".to_string(), LocalDevice::Udp { gid: udp_gid });
        devs.insert("mlx5_0".to_string(), LocalDevice::Rdma);
        let r = AgentGidResolver::with_sysfs(devs, dir.path().to_path_buf());
        assert_eq!(r.local_gid("udp0", 1, 0), Some(udp_gid.octets()));
        assert_eq!(r.local_gid("udp0", 2, 5), Some(udp_gid.octets()));
        assert_eq!(r.local_gid("udp1", 1, 0), None, "not one of ours");
        assert_eq!(r.local_gid("fake_dev0", 1, 1), None);
        let want: Ipv6Addr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(r.local_gid("mlx5_0", 1, 3), Some(want.octets()));
        assert_eq!(r.local_gid("mlx5_0", 1, 9), None, "no such GID index");
        assert_eq!(r.local_gid("mlx5_0", 2, 3), None, "no such port");
    }

    #[test]
    fn tracer_config_follows_agent_config() {
        let cfg = AgentConfig {
            tor_id: "t".into(),
            service_tracing_mode: ServiceTracingMode::Uprobe,
            service_tracing_uprobe_targets: vec!["/x/libibverbs.so.1".into()],
            ..AgentConfig::default()
        };
        let t = tracer_config(&cfg);
        assert_eq!(t.mode, TracingMode::Uprobe);
        assert_eq!(t.uprobe_targets, vec![PathBuf::from("/x/libibverbs.so.1")]);
    }

    #[tokio::test]
    async fn mode_off_starts_nothing() {
        let cfg = AgentConfig {
            tor_id: "t".into(),
            service_tracing_mode: ServiceTracingMode::Off,
            ..AgentConfig::default()
        };
        assert!(start_tracer(&cfg, HashMap::new()).is_none());
    }
}
