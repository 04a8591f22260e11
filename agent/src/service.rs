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
mod tests;
