//! gRPC services: `controller_agent.ControllerService` (agents) and
//! `rpingmesh.operator.v1.OperatorService` (operators), over one shared state.
//! Locks are std locks held only for synchronous sections, never across an await.
//!
//! Component findings (the localizer's) move in [`ControllerState::findings_tick`], which
//! the server runs every second: it localizes the settled windows, publishes every change
//! on a broadcast channel (WatchFindings) and writes the changed findings to the store.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::controller_service_server::ControllerService;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, AgentRegistrationResponse, HostHealthAck, HostHealthReport,
    PathSummary, PinglistRequest, PinglistResponse, PinglistType, ProbeAnalysisAck,
    ProbeAnalysisReport, RnicInfo, ServiceFlow, ServiceFlowAck, ServiceFlowReport,
};
use rpingmesh_proto::gid::normalize_gid;
use rpingmesh_proto::operator::operator_service_server::OperatorService;
use rpingmesh_proto::operator::{
    Finding, FindingEvent, GetHostRequest, HostHealth, ListFindingsRequest, ListFindingsResponse,
    ListHostsRequest, ListHostsResponse, ListPathsRequest, ListPathsResponse, ListRnicsRequest,
    ListRnicsResponse, ListServicePathsRequest, ListServicePathsResponse, ListTorPairsRequest,
    ListTorPairsResponse, ListViolationsRequest, ListViolationsResponse, RnicStatus, ServicePath,
    TorPairStats, Violation as ViolationMsg, WatchFindingsRequest,
};

use crate::analyzer::{Analyzer, PathFilter, ViolationKind};
use crate::config::{ControllerConfig, DatabaseUri};
use crate::ecmp;
use crate::focus::FocusPlanner;
use crate::leader::Leadership;
use crate::liveness::{heartbeat_interval_sec, StallWatch};
use crate::localize::{ComponentKind, Localizer};
use crate::pinglist::{self, PinglistParams};
use crate::registry::{
    self, AgentRecord, IndexedRegistry, Registry, RegistryError, RegistryIndex, RnicRecord,
};
use crate::service_paths::{ServicePathFilter, ServicePathParams, ServicePathTable, OTHER_SERVICE};
use crate::telemetry::AnalyzerMetrics;

/// Wall clock in Unix nanoseconds; injectable so tests can age registrations.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

pub fn system_clock() -> Clock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    })
}

/// What [`ControllerState::liveness_counts`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessCounts {
    pub rnics: u64,
    pub rnics_active: u64,
    pub agents: u64,
    pub agents_active: u64,
}

/// Finding changes a WatchFindings subscriber may fall behind by before it is cut off
/// with DATA_LOSS (it then calls again for a fresh snapshot). This bounds what the server
/// buffers per subscriber.
pub const FINDINGS_CHANNEL_CAPACITY: usize = 4096;

/// Resolved findings in a WatchFindings snapshot (the most recently resolved; every open
/// finding is in it).
pub const WATCH_SNAPSHOT_RESOLVED: usize = 100;

/// Changed findings kept for the next tick while the store fails to take them; past this
/// the oldest ids are given up (logged).
const UNSAVED_FINDINGS_CAP: usize = 10_000;

/// The store key of the gray detector's learned baseline, and how many windows it learns
/// between two writes (five minutes of 30 s windows).
pub const BASELINE_KEY: &str = "gray_baseline";
const BASELINE_SAVE_WINDOWS: u64 = 10;

/// Takes the stored baseline over, if there is one (a damaged one: logged, start cold).
fn restore_baseline(registry: &IndexedRegistry, a: &mut Analyzer) {
    match registry.load_state(BASELINE_KEY) {
        Ok(Some(json)) => match a.localizer_mut().restore_baseline(&json) {
            Ok(()) => tracing::info!(
                windows = a.localizer().baseline_windows(),
                "learned baseline restored from the store"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "the stored baseline cannot be read; learning anew")
            }
        },
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "cannot load the learned baseline; learning anew"),
    }
}

/// Hosts whose Hostping reports are kept (a report from one more is refused).
pub const MAX_HOSTS: usize = 200_000;
/// Bounds of one host report.
pub const MAX_HOST_TREE_BYTES: usize = 256 * 1024;
pub const MAX_HOST_REPORT_JSON_BYTES: usize = 2 * 1024 * 1024;
pub const MAX_HOST_FINDINGS: usize = 1024;
const MAX_HOST_FIELD_BYTES: usize = 4096;

/// A host report's one clear error, or nothing.
fn check_host_report(r: &HostHealthReport) -> Result<(), Status> {
    let bad = |m: String| Err(Status::invalid_argument(format!("host report: {m}")));
    if r.agent_id.trim().is_empty() {
        return bad("agent_id is empty".into());
    }
    if r.hostname.trim().is_empty() || r.hostname.len() > 255 {
        return bad(format!(
            "hostname {:?} is empty or longer than 255 bytes",
            r.hostname
        ));
    }
    if r.tree.len() > MAX_HOST_TREE_BYTES {
        return bad(format!(
            "tree of {} bytes (at most {MAX_HOST_TREE_BYTES})",
            r.tree.len()
        ));
    }
    if r.report_json.len() > MAX_HOST_REPORT_JSON_BYTES {
        return bad(format!(
            "report_json of {} bytes (at most {MAX_HOST_REPORT_JSON_BYTES})",
            r.report_json.len()
        ));
    }
    if r.findings.len() > MAX_HOST_FINDINGS {
        return bad(format!(
            "{} findings (at most {MAX_HOST_FINDINGS})",
            r.findings.len()
        ));
    }
    if !matches!(r.mode.as_str(), "" | "idle" | "busy" | "abnormal") {
        return bad(format!("mode {:?} (idle, busy or abnormal)", r.mode));
    }
    for (i, f) in r.findings.iter().enumerate() {
        if f.kind.trim().is_empty() {
            return bad(format!("finding {i} has no kind"));
        }
        if [&f.kind, &f.location, &f.detail]
            .iter()
            .any(|x| x.len() > MAX_HOST_FIELD_BYTES)
        {
            return bad(format!(
                "finding {i}: a field longer than {MAX_HOST_FIELD_BYTES} bytes"
            ));
        }
    }
    Ok(())
}

/// Everything the services share.
pub struct ControllerState {
    pub registry: IndexedRegistry,
    /// Who analyzes (always this controller with SQLite; the elected replica with etcd).
    pub leadership: Arc<Leadership>,
    /// The etcd endpoints when the store is shared (the server then campaigns).
    pub etcd_endpoints: Option<Vec<String>>,
    /// Whether this replica led at the last findings tick (a new leader first takes the
    /// stored findings over).
    led: AtomicBool,
    /// Channels to the leader, by address, for forwarded path reports.
    leader_clients: Mutex<HashMap<String, ControllerServiceClient<Channel>>>,
    /// `None` when `analyzer_enabled` is false.
    pub analyzer: Option<Mutex<Analyzer>>,
    /// Every finding change, as [`Self::findings_tick`] makes it (WatchFindings). Sent
    /// while the analyzer lock is held, so a subscriber that subscribes under that lock
    /// and lists the findings sees each change exactly once, after its snapshot.
    findings_tx: broadcast::Sender<FindingEvent>,
    /// Changed findings the store has not taken yet (a failed write), by id.
    findings_unsaved: Mutex<BTreeMap<u64, Finding>>,
    /// Baseline windows at its last write to the store (u64::MAX: none yet).
    baseline_saved: AtomicU64,
    /// Adaptive probing's FOCUS lists. Lock order: index, analyzer, then this.
    focus: Mutex<FocusPlanner>,
    /// Baseline windows when the FOCUS lists were last planned.
    focus_windows: AtomicU64,
    /// Set when the server shuts down: ends the WatchFindings streams (a graceful
    /// shutdown waits for every open call).
    stopping: watch::Sender<bool>,
    pub metrics: AnalyzerMetrics,
    pub pinglist: PinglistParams,
    pub pinglist_seed: Option<u64>,
    pub stale_threshold_sec: u64,
    /// Summaries dropped because of an invalid GID (counted, logged).
    pub dropped_summaries: AtomicU64,
    /// Live service paths. Lock order: registry index first, then this, then the analyzer.
    pub service_paths: Mutex<ServicePathTable>,
    /// Agent versions as they registered ("" = a Go agent); in memory only: every agent
    /// registers again within a heartbeat.
    agent_versions: Mutex<HashMap<String, String>>,
    /// Each host's newest Hostping report, by hostname (restored from the store).
    hosts: Mutex<BTreeMap<String, HostHealth>>,
    clock: Clock,
    /// The controller's own timeline (a monotonic clock: the injectable wall clock jumps
    /// in tests that age registrations), watched for stalls.
    stall: Mutex<StallWatch>,
    started: Instant,
}

impl ControllerState {
    /// Opens the store named by `database_uri` and loads the index from it.
    pub fn new(cfg: &ControllerConfig, metrics: AnalyzerMetrics) -> anyhow::Result<Self> {
        let db = cfg.database()?;
        let store =
            registry::open_store(&db, cfg.stale_threshold_sec).context("opening the registry")?;
        let mut st = Self::with_store(cfg, store, metrics, system_clock())?;
        if let DatabaseUri::Etcd(ep) = &db {
            st.etcd_endpoints = Some(registry::etcd_urls(ep));
            st.leadership = Arc::new(Leadership::follower());
            st.led = AtomicBool::new(false);
        }
        Ok(st)
    }

    /// The state over `store`: loads the index, and the findings into the analyzer (open
    /// ones continue, ids continue). Reads `analyzer_topology_file`.
    pub fn with_store(
        cfg: &ControllerConfig,
        store: Box<dyn Registry>,
        metrics: AnalyzerMetrics,
        clock: Clock,
    ) -> anyhow::Result<Self> {
        let topology = if cfg.analyzer_enabled {
            cfg.topology()?
        } else {
            None
        };
        let registry = IndexedRegistry::new(store).context("opening the registry")?;
        let analyzer = match cfg.analyzer_enabled {
            false => None,
            true => {
                let mut a = Analyzer::with_topology(cfg.analyzer_params(), topology);
                let findings = registry
                    .load_findings()
                    .context("loading the stored findings")?;
                if !findings.is_empty() {
                    let open = findings.iter().filter(|f| f.open).count();
                    tracing::info!(
                        open,
                        resolved = findings.len() - open,
                        "findings restored from the store"
                    );
                }
                a.localizer_mut().restore(findings);
                restore_baseline(&registry, &mut a);
                Some(Mutex::new(a))
            }
        };
        let hosts: BTreeMap<String, HostHealth> = registry
            .load_hosts()
            .context("loading the stored host reports")?
            .into_iter()
            .map(|h| (h.hostname.clone(), h))
            .collect();
        let now = clock() / 1_000_000_000;
        let n = registry
            .excuse(u64::MAX, now)
            .context("opening the registry")?;
        if n > 0 {
            tracing::info!(
                rnics = n,
                "registry loaded; its RNICs count as alive for one active threshold"
            );
        }
        Ok(Self {
            registry,
            leadership: Arc::new(Leadership::solo()),
            etcd_endpoints: None,
            led: AtomicBool::new(true),
            leader_clients: Mutex::new(HashMap::new()),
            analyzer,
            findings_tx: broadcast::channel(FINDINGS_CHANNEL_CAPACITY).0,
            findings_unsaved: Mutex::new(BTreeMap::new()),
            baseline_saved: AtomicU64::new(u64::MAX),
            focus: Mutex::new(FocusPlanner::new(cfg.focus_params())),
            focus_windows: AtomicU64::new(0),
            stopping: watch::channel(false).0,
            metrics,
            pinglist: PinglistParams {
                active_threshold_sec: cfg.active_threshold_sec,
                inter_tor_sample_size: cfg.inter_tor_sample_size as usize,
                flow_label_count: ecmp::flow_label_count(
                    cfg.ecmp_paths_assumed,
                    cfg.ecmp_coverage_probability,
                    cfg.ecmp_max_flow_labels,
                ),
            },
            pinglist_seed: cfg.pinglist_seed,
            stale_threshold_sec: cfg.stale_threshold_sec,
            dropped_summaries: AtomicU64::new(0),
            service_paths: Mutex::new(ServicePathTable::new(ServicePathParams {
                flow_ttl_sec: cfg.service_flow_ttl_sec,
                max_flows_per_agent: cfg.max_service_flows_per_agent as usize,
                max_services: cfg.max_services as usize,
            })),
            agent_versions: Mutex::new(HashMap::new()),
            hosts: Mutex::new(hosts),
            clock,
            stall: Mutex::new(StallWatch::default()),
            started: Instant::now(),
        })
    }

    pub fn now_ns(&self) -> u64 {
        (self.clock)()
    }

    pub fn now_sec(&self) -> u64 {
        self.now_ns() / 1_000_000_000
    }

    /// The time for a liveness decision. First excuses any time the controller itself
    /// did not run (see [`StallWatch`]): after a SIGSTOP the first pinglist request must
    /// not find every agent inactive because their heartbeats could not be heard. The
    /// watch lock is held while the registry catches up, so a concurrent decision waits
    /// for it. Also called every second by the server's watch tick.
    pub fn liveness_now_sec(&self) -> u64 {
        let mut watch = self.stall.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.now_sec();
        let mono = self.started.elapsed().as_nanos() as u64;
        if let Some(by) = watch.observe(mono) {
            match self.registry.excuse(by, now) {
                Ok(n) => tracing::warn!(
                    unwatched_sec = by,
                    rnics = n,
                    "the controller did not run for a while; that time does not count against agents' liveness"
                ),
                Err(e) => tracing::error!(error = %e, "excusing a controller stall failed"),
            }
        }
        now
    }

    pub(crate) fn analyzer(&self) -> Option<std::sync::MutexGuard<'_, Analyzer>> {
        self.analyzer
            .as_ref()
            .map(|a| a.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Per ToR pair, the latest window of each path still measured (gRPC ListTorPairs,
    /// the web matrix).
    pub fn tor_pairs(&self) -> Vec<TorPairStats> {
        let now = self.now_ns();
        self.analyzer()
            .map(|a| a.tor_pairs(now))
            .unwrap_or_default()
    }

    /// Latest (or every retained) window of the matching paths.
    pub fn paths(&self, filter: &PathFilter<'_>, all_windows: bool) -> Vec<PathSummary> {
        self.analyzer()
            .map(|a| a.paths(filter, all_windows))
            .unwrap_or_default()
    }

    /// Live service paths with their latest SERVICE window.
    pub fn service_paths(&self, filter: &ServicePathFilter<'_>) -> Vec<ServicePath> {
        let now = self.now_ns();
        let mut paths = {
            let idx = self.registry.index();
            self.service_table().list(&idx, filter, now)
        };
        if let Some(a) = self.analyzer() {
            for p in &mut paths {
                p.latest = a
                    .latest_service(&p.source_gid, &p.target_gid, &p.service)
                    .cloned();
            }
        }
        paths
    }

    /// Every RNIC (or one ToR's) with its liveness, sorted by (ToR, GID).
    pub fn rnic_statuses(&self, tor_id: &str) -> Vec<RnicStatus> {
        self.rnic_page(tor_id, 0, usize::MAX).0
    }

    /// One page (`offset`, `limit`) of [`Self::rnic_statuses`] and the number of RNICs:
    /// only the page is copied out of the index.
    pub fn rnic_page(&self, tor_id: &str, offset: usize, limit: usize) -> (Vec<RnicStatus>, usize) {
        let now = self.liveness_now_sec();
        let idx = self.registry.index();
        let mut rows: Vec<&RnicRecord> = if tor_id.is_empty() {
            idx.rnics().collect()
        } else {
            idx.tor_gids(tor_id)
                .iter()
                .filter_map(|g| idx.rnic(g))
                .collect()
        };
        let total = rows.len();
        let order =
            |a: &&RnicRecord, b: &&RnicRecord| (&a.tor_id, &a.gid).cmp(&(&b.tor_id, &b.gid));
        // Only the rows up to the page's end need their order: select, then sort those.
        let end = offset.saturating_add(limit).min(total);
        if end < total && end > 0 {
            rows.select_nth_unstable_by(end - 1, order);
            rows.truncate(end);
        }
        rows.sort_unstable_by(order);
        let page = rows
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(|r| RnicStatus {
                rnic: Some(RnicInfo {
                    gid: r.gid.clone(),
                    qpn: r.qpn,
                    ip_address: r.ip_address.clone(),
                    host_name: r.host_name.clone(),
                    tor_id: r.tor_id.clone(),
                    device_name: r.device_name.clone(),
                }),
                agent_id: r.agent_id.clone(),
                last_updated_unix_sec: r.last_updated,
                active: pinglist::is_active(r, now, self.pinglist.active_threshold_sec),
            })
            .collect();
        (page, total)
    }

    /// Localizes the windows that have settled (see [`Analyzer::tick`]), publishes the
    /// changes to WatchFindings and writes the changed findings to the store. The server
    /// calls it every second, off the async workers (the store write blocks). Returns the
    /// changes.
    pub fn findings_tick(&self) -> Vec<FindingEvent> {
        if !self.lead_now() {
            return Vec::new();
        }
        let now = self.now_ns();
        let events = self.step_findings(|a, idx| {
            let events = a.tick(now, idx);
            self.refocus(a, idx, now / 1_000_000_000);
            events
        });
        self.save_baseline();
        events
    }

    /// After a window was localized: the FOCUS lists follow the gray detector's suspects
    /// (adaptive probing). Runs under the index and analyzer locks (that order).
    fn refocus(&self, a: &Analyzer, idx: &RegistryIndex, now_sec: u64) {
        let windows = a.localizer().baseline_windows();
        if self.focus_windows.swap(windows, Ordering::Relaxed) == windows {
            return;
        }
        let mut f = self.focus.lock().unwrap_or_else(|e| e.into_inner());
        if f.update(
            a.localizer().suspects(),
            idx,
            a.localizer().topology(),
            now_sec,
        ) {
            tracing::info!(
                generation = f.generation(),
                targets = f.target_count(),
                focused = ?f.focused().collect::<Vec<_>>(),
                "FOCUS pinglists changed (adaptive probing)"
            );
        }
    }

    /// (FOCUS targets handed out now, FOCUS probes ingested so far): what adaptive
    /// probing costs.
    pub fn focus_stats(&self) -> (u64, u64) {
        let probes = self.analyzer().map_or(0, |a| a.focus_probes_total());
        let targets = self
            .focus
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .target_count();
        (targets as u64, probes)
    }

    /// The FOCUS lists' generation agents compare with theirs (acks carry it).
    pub fn focus_generation(&self) -> u64 {
        self.focus
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .generation()
    }

    /// Writes the gray detector's learned baseline to the store after its first window,
    /// then every `BASELINE_SAVE_WINDOWS` windows it learns (no lock held during the
    /// write).
    fn save_baseline(&self) {
        let Some(a) = self.analyzer() else { return };
        let windows = a.localizer().baseline_windows();
        let saved = self.baseline_saved.load(Ordering::Relaxed);
        // The first window learned is stored at once, then every few.
        if windows == 0
            || (saved != u64::MAX && windows < saved.saturating_add(BASELINE_SAVE_WINDOWS))
        {
            return;
        }
        let json = a.localizer().baseline_json();
        drop(a);
        match self.registry.save_state(BASELINE_KEY, &json) {
            Ok(()) => self.baseline_saved.store(windows, Ordering::Relaxed),
            Err(e) => {
                tracing::warn!(error = %e, "storing the learned baseline failed; retrying later")
            }
        }
    }

    /// Whether this replica analyzes now. At the first tick after it was elected, it takes
    /// over the stored findings (the previous leader's), so they continue with their ids
    /// and none is opened twice.
    fn lead_now(&self) -> bool {
        let leads = self.leadership.is_leader();
        let led = self.led.swap(leads, Ordering::SeqCst);
        if leads && !led {
            match self.registry.load_findings() {
                Ok(f) => {
                    let open = f.iter().filter(|f| f.open).count();
                    if let Some(mut a) = self.analyzer() {
                        a.localizer_mut().reset_to(f);
                        restore_baseline(&self.registry, &mut a);
                    }
                    tracing::info!(
                        open,
                        "analysis taken over; the stored findings continue here"
                    );
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot load the findings to take over analysis; retrying");
                    self.led.store(false, Ordering::SeqCst);
                    return false;
                }
            }
        }
        leads
    }

    /// Sends agents' path reports to the leader when another replica leads. None: this
    /// replica takes them (it leads, no leader is known, or the leader cannot be reached).
    pub async fn forward_to_leader(&self, req: &ProbeAnalysisReport) -> Option<ProbeAnalysisAck> {
        let addr = self.leadership.forward_to()?;
        let client = {
            let mut m = self
                .leader_clients
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match m.get(&addr) {
                Some(c) => c.clone(),
                None => {
                    let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                        .ok()?
                        .connect_timeout(Duration::from_secs(2))
                        .timeout(Duration::from_secs(5));
                    let c = ControllerServiceClient::new(ep.connect_lazy());
                    m.insert(addr.clone(), c.clone());
                    c
                }
            }
        };
        match client.clone().report_probe_analysis(req.clone()).await {
            Ok(r) => Some(r.into_inner()),
            Err(e) => {
                tracing::warn!(leader = %addr, error = %e, "forwarding a path report to the analysis leader failed; kept here");
                None
            }
        }
    }

    /// One step of the findings with `step` (the tick; tests and tools drive the
    /// localizer with their own blames through it): `step` runs under the registry index
    /// read lock and the analyzer lock (that order, as everywhere), its changes are
    /// published before the analyzer lock is released, and stored after, with no lock of
    /// the index or the analyzer held during the store write. A failed write is logged
    /// and the findings are written again at the next step.
    pub fn step_findings(
        &self,
        step: impl FnOnce(&mut Analyzer, &RegistryIndex) -> Vec<FindingEvent>,
    ) -> Vec<FindingEvent> {
        let Some(analyzer) = &self.analyzer else {
            return Vec::new();
        };
        let events = {
            let idx = self.registry.index();
            let mut a = analyzer.lock().unwrap_or_else(|e| e.into_inner());
            let events = step(&mut a, &idx);
            for e in &events {
                // No subscriber is not an error.
                let _ = self.findings_tx.send(e.clone());
            }
            events
        };
        for e in &events {
            let Some(f) = &e.finding else { continue };
            let detail = f.evidence.as_ref().map_or("", |v| v.detail.as_str());
            macro_rules! log {
                ($level:ident) => {
                    tracing::$level!(
                        change = %e.change,
                        id = f.id,
                        kind = %f.kind,
                        location = %f.location,
                        symptom = %f.symptom,
                        confidence = f.confidence,
                        detail = %detail,
                        "finding"
                    )
                };
            }
            // An open finding is updated by every window that still blames it.
            if e.change == "updated" {
                log!(debug);
            } else {
                log!(info);
            }
        }
        self.persist_findings(&events);
        events
    }

    /// Writes the findings of `events` (and any a failed write left) to the store.
    fn persist_findings(&self, events: &[FindingEvent]) {
        let mut unsaved = self
            .findings_unsaved
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for f in events.iter().filter_map(|e| e.finding.as_ref()) {
            unsaved.insert(f.id, f.clone());
        }
        if unsaved.is_empty() {
            return;
        }
        let batch: Vec<Finding> = unsaved.values().cloned().collect();
        match self.registry.save_findings(&batch) {
            Ok(()) => unsaved.clear(),
            Err(e) => {
                let mut given_up = 0;
                while unsaved.len() > UNSAVED_FINDINGS_CAP {
                    unsaved.pop_first();
                    given_up += 1;
                }
                tracing::error!(
                    error = %e,
                    pending = unsaved.len(),
                    given_up,
                    "storing findings failed; retrying at the next tick"
                );
            }
        }
    }

    /// Component findings: open ones (oldest first), then resolved ones (most recently
    /// resolved first, at most `resolved_limit`, 0 = all retained); `kind` "" = all.
    /// Unknown kinds are refused with the known ones named.
    pub fn findings(&self, resolved_limit: usize, kind: &str) -> Result<Vec<Finding>, Status> {
        check_finding_kind(kind)?;
        if !self.leadership.is_leader() {
            // A follower's analyzer is idle: the leader's findings are in the store.
            if let Some(a) = self.analyzer() {
                let mut l = Localizer::new(*a.localizer().params(), None);
                drop(a);
                l.restore(self.registry.load_findings().map_err(store_err)?);
                return Ok(l.list(resolved_limit, kind));
            }
        }
        Ok(self
            .analyzer()
            .map(|a| a.localizer().list(resolved_limit, kind))
            .unwrap_or_default())
    }

    /// Subscribes to finding changes and takes the snapshot under the analyzer lock, so
    /// the stream continues the snapshot exactly. The snapshot: every open finding and
    /// the [`WATCH_SNAPSHOT_RESOLVED`] most recently resolved, of `kind` ("" = all).
    pub fn watch_findings(
        &self,
        kind: &str,
    ) -> Result<(Vec<Finding>, broadcast::Receiver<FindingEvent>), Status> {
        check_finding_kind(kind)?;
        if !self.leadership.is_leader() {
            // A follower's findings do not move: only the leader's changes are live.
            return Err(Status::failed_precondition(
                match self.leadership.forward_to() {
                    Some(addr) => {
                        format!("this replica does not analyze; watch the leader at {addr}")
                    }
                    None => {
                        "this replica does not analyze and no leader is elected yet; retry".into()
                    }
                },
            ));
        }
        match self.analyzer() {
            Some(a) => {
                let rx = self.findings_tx.subscribe();
                Ok((a.localizer().list(WATCH_SNAPSHOT_RESOLVED, kind), rx))
            }
            None => Ok((Vec::new(), self.findings_tx.subscribe())),
        }
    }

    /// Ends every WatchFindings stream (UNAVAILABLE) and refuses new ones: the server is
    /// shutting down.
    /// Turns true when the server stops.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    pub fn stop_watches(&self) {
        self.stopping.send_replace(true);
    }

    /// Open component findings per kind (every kind, 0 when none); empty without the
    /// analyzer.
    pub fn open_findings_by_kind(&self) -> BTreeMap<&'static str, usize> {
        self.analyzer()
            .map(|a| a.localizer().open_by_kind())
            .unwrap_or_default()
    }

    /// Open findings per (source ToR, target ToR, kind).
    pub fn open_findings_by_tor_pair(
        &self,
    ) -> std::collections::BTreeMap<(String, String, ViolationKind), u64> {
        self.analyzer()
            .map(|a| a.finding_book().open_by_tor_pair())
            .unwrap_or_default()
    }

    /// (active, inactive) RNICs.
    pub fn rnic_counts(&self) -> (u64, u64) {
        let c = self.liveness_counts();
        (c.rnics_active, c.rnics - c.rnics_active)
    }

    /// RNICs and agents, and how many of each are active (an agent is active while any
    /// of its RNICs is), in one pass over the index.
    pub fn liveness_counts(&self) -> LivenessCounts {
        let now = self.liveness_now_sec();
        let idx = self.registry.index();
        let mut live_agents: std::collections::HashSet<&str> = Default::default();
        let mut rnics_active = 0;
        for r in idx.rnics() {
            if pinglist::is_active(r, now, self.pinglist.active_threshold_sec) {
                rnics_active += 1;
                live_agents.insert(&r.agent_id);
            }
        }
        LivenessCounts {
            rnics: idx.len() as u64,
            rnics_active,
            agents: idx.agent_count() as u64,
            agents_active: live_agents.len() as u64,
        }
    }

    /// Live service paths per (service, monitored).
    pub fn service_path_counts(&self) -> std::collections::BTreeMap<(String, bool), u64> {
        let mut m = std::collections::BTreeMap::new();
        for p in self.service_paths(&ServicePathFilter::default()) {
            *m.entry((p.service, p.monitored)).or_insert(0) += 1;
        }
        m
    }

    pub fn note_agent_version(&self, agent_id: &str, version: &str) {
        let mut v = self
            .agent_versions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if v.get(agent_id).map(String::as_str) != Some(version) {
            v.insert(agent_id.to_string(), version.to_string());
        }
    }

    pub fn agent_version(&self, agent_id: &str) -> Option<String> {
        let v = self
            .agent_versions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        v.get(agent_id).cloned()
    }

    /// The service-path table (poisoning is ignored: every update leaves it consistent).
    pub fn service_table(&self) -> std::sync::MutexGuard<'_, ServicePathTable> {
        self.service_paths.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the agent's whole flow set to the shared store, for the other replicas. A
    /// failure is logged: the flows still apply here, and the next report writes again.
    fn share_service_flows(&self, agent_id: &str, now_ns: u64) {
        let flows = self.service_table().agent_flows(agent_id, now_ns);
        let report = ServiceFlowReport {
            agent_id: agent_id.to_string(),
            full_sync: true,
            upserts: flows
                .into_iter()
                .map(|f| ServiceFlow {
                    local_gid: f.local_gid,
                    local_qpn: f.local_qpn,
                    remote_gid: f.remote_gid,
                    remote_qpn: f.remote_qpn,
                    flow_label: f.flow_label,
                    traffic_class: f.traffic_class,
                    service_level: f.service_level,
                    pid: f.pid,
                    comm: f.comm,
                    cgroup_id: f.cgroup_id,
                    first_seen_unix_ns: f.first_seen_unix_ns,
                    last_seen_unix_ns: f.last_seen_unix_ns,
                    service: f.service,
                })
                .collect(),
            removals: Vec::new(),
        };
        if let Err(e) = self.registry.save_service_flows(&report) {
            tracing::warn!(agent_id, error = %e, "sharing service flows with the other replicas failed");
        }
    }

    /// Takes an agent's flow set another replica (or this one) shared through the store.
    pub fn apply_shared_service_flows(&self, report: ServiceFlowReport) {
        let now = self.now_ns();
        let idx = self.registry.index();
        let agent_id = report.agent_id.clone();
        if idx.agent(&agent_id).is_none() {
            return;
        }
        self.service_table()
            .apply(&agent_id, idx.agent_gids(&agent_id), report, now);
    }

    /// Drops the service flows of agents silent past `service_flow_ttl_sec`.
    pub fn expire_service_flows(&self) -> usize {
        let now = self.now_ns();
        self.service_table().expire(now)
    }

    /// Takes a host's Hostping report: checked, kept as the host's newest, stored.
    pub fn report_host(&self, r: HostHealthReport) -> Result<(), Status> {
        check_host_report(&r)?;
        let h = HostHealth {
            hostname: r.hostname,
            agent_id: r.agent_id,
            checked_unix_ns: r.checked_unix_ns,
            received_unix_ns: self.now_ns(),
            tree: r.tree,
            mode: r.mode,
            findings: r.findings,
            report_json: r.report_json,
        };
        {
            let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
            if !hosts.contains_key(&h.hostname) && hosts.len() >= MAX_HOSTS {
                return Err(Status::resource_exhausted(format!(
                    "host report: {MAX_HOSTS} hosts known already; {:?} not taken",
                    h.hostname
                )));
            }
            hosts.insert(h.hostname.clone(), h.clone());
        }
        self.registry.save_host(&h).map_err(|e| {
            tracing::error!(hostname = %h.hostname, error = %e, "storing a host report failed");
            Status::unavailable(format!("host report: the store failed: {e}"))
        })?;
        self.note_alive(&h.agent_id);
        Ok(())
    }

    /// Every host's newest report (without its JSON), by hostname.
    pub fn hosts(&self, problems_only: bool) -> Vec<HostHealth> {
        let hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        hosts
            .values()
            .filter(|h| !problems_only || !h.findings.is_empty())
            .map(|h| HostHealth {
                report_json: String::new(),
                ..h.clone()
            })
            .collect()
    }

    /// One host's newest report.
    pub fn host(&self, hostname: &str) -> Option<HostHealth> {
        self.hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(hostname)
            .cloned()
    }

    /// (hostname, finding kind) -> findings, over the hosts with any (the metric).
    pub fn host_findings_by_kind(&self) -> BTreeMap<(String, String), u64> {
        let mut out = BTreeMap::new();
        for h in self
            .hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            for f in &h.findings {
                *out.entry((h.hostname.clone(), f.kind.clone())).or_default() += 1;
            }
        }
        out
    }

    /// Any agent RPC is a sign of life: refreshes the agent's `last_updated` (and its
    /// RNICs'), but writes to the store at most once per quarter of the active threshold,
    /// so frequent RPCs cost a read of the index, not a store write each.
    pub fn note_alive(&self, agent_id: &str) {
        let now = self.liveness_now_sec();
        let refresh_after = (self.pinglist.active_threshold_sec / 4).max(1);
        let due = match self.registry.index().agent(agent_id) {
            Some(a) => now.saturating_sub(a.last_updated) >= refresh_after,
            None => false,
        };
        if due {
            if let Err(e) = self.registry.touch(agent_id, now) {
                tracing::error!(agent_id, error = %e, "refreshing agent liveness failed");
            }
        }
    }

    /// One stale sweep; returns the RNICs removed.
    pub fn remove_stale(&self) -> Result<usize, RegistryError> {
        self.registry
            .remove_stale(self.liveness_now_sec(), self.stale_threshold_sec)
    }

    /// Per-request RNG: fresh entropy, or derived from `pinglist_seed` and the request
    /// so that a seeded controller answers the same request identically.
    fn request_rng(&self, requester: &str, ty: PinglistType) -> SmallRng {
        match self.pinglist_seed {
            None => SmallRng::from_rng(&mut rand::rng()),
            Some(seed) => {
                // FNV-1a: stable across runs and platforms, unlike std's hasher.
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for b in requester.bytes().chain([ty as u8]) {
                    h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
                }
                SmallRng::seed_from_u64(seed ^ h)
            }
        }
    }
}

/// True when `s` is already the full lowercase form (fast path: no allocation).
fn is_normalized_gid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 39
        && b.iter().enumerate().all(|(i, &c)| {
            if i % 5 == 4 {
                c == b':'
            } else {
                c.is_ascii_digit() || (b'a'..=b'f').contains(&c)
            }
        })
}

/// Normalizes in place; on error leaves the text untouched.
fn normalize_in_place(s: &mut String) -> bool {
    if is_normalized_gid(s) {
        return true;
    }
    match normalize_gid(s) {
        Ok(n) => {
            *s = n;
            true
        }
        Err(_) => false,
    }
}

fn gid_arg(field: &str, text: &str) -> Result<String, Status> {
    normalize_gid(text).map_err(|e| Status::invalid_argument(format!("{field}: {e}")))
}

fn shutting_down() -> Status {
    Status::unavailable("the controller is shutting down")
}

/// Hands one WatchFindings item to the response, unless the server stops first (then
/// UNAVAILABLE, when there is room for it) or the client went away. `false`: stop.
async fn forward(
    tx: &mpsc::Sender<Result<FindingEvent, Status>>,
    stopping: &mut watch::Receiver<bool>,
    item: Result<FindingEvent, Status>,
) -> bool {
    tokio::select! {
        r = tx.send(item) => r.is_ok(),
        _ = stopping.changed() => {
            let _ = tx.try_send(Err(shutting_down()));
            false
        }
    }
}

/// "" or one of the component kinds; otherwise InvalidArgument naming the known kinds.
fn check_finding_kind(kind: &str) -> Result<(), Status> {
    if kind.is_empty() || ComponentKind::parse(kind).is_some() {
        return Ok(());
    }
    let known: Vec<&str> = ComponentKind::ALL.iter().map(|k| k.as_str()).collect();
    Err(Status::invalid_argument(format!(
        "unknown finding kind {kind:?} (known: {})",
        known.join(", ")
    )))
}

fn store_err(e: RegistryError) -> Status {
    tracing::error!(error = %e, "registry store failure");
    Status::internal(e.to_string())
}

#[derive(Clone)]
pub struct ControllerSvc(pub Arc<ControllerState>);

#[derive(Clone)]
pub struct OperatorSvc(pub Arc<ControllerState>);

#[tonic::async_trait]
impl ControllerService for ControllerSvc {
    async fn report_host_health(
        &self,
        request: Request<HostHealthReport>,
    ) -> Result<Response<HostHealthAck>, Status> {
        let r = request.into_inner();
        let (host, n) = (r.hostname.clone(), r.findings.len());
        self.0.report_host(r)?;
        tracing::info!(hostname = %host, findings = n, "host report taken");
        Ok(Response::new(HostHealthAck { accepted: true }))
    }

    async fn report_service_flows(
        &self,
        request: Request<ServiceFlowReport>,
    ) -> Result<Response<ServiceFlowAck>, Status> {
        let req = request.into_inner();
        if req.agent_id.trim().is_empty() {
            return Err(Status::invalid_argument(
                "service flow report: agent_id is empty",
            ));
        }
        let st = &self.0;
        let agent_id = req.agent_id.clone();
        let (full_sync, n_up, n_rm) = (req.full_sync, req.upserts.len(), req.removals.len());
        let now = st.now_ns();
        let out = {
            let idx = st.registry.index();
            if idx.agent(&agent_id).is_none() {
                return Err(Status::not_found(format!(
                    "service flow report: agent {agent_id:?} is not registered (register first)"
                )));
            }
            st.service_table()
                .apply(&agent_id, idx.agent_gids(&agent_id), req, now)
        };
        st.note_alive(&agent_id);
        if st.registry.is_shared() {
            st.share_service_flows(&agent_id, now);
        }
        if out.dropped_bad_gid > 0 {
            tracing::warn!(
                agent_id = %agent_id,
                dropped = out.dropped_bad_gid,
                example = %out.example_bad_gid.as_deref().unwrap_or_default(),
                "dropped service flows with invalid GIDs"
            );
        }
        if let Some(g) = &out.first_foreign_source {
            // Once per agent: a tracer seeing other hosts' GIDs would otherwise flood.
            tracing::warn!(
                agent_id = %agent_id,
                local_gid = %g,
                "dropped service flows whose local GID is not one of the agent's registered RNICs (logged once per agent)"
            );
        }
        if out.rejected_over_limit > 0 {
            tracing::warn!(
                agent_id = %agent_id,
                rejected = out.rejected_over_limit,
                flows_known = out.flows_known,
                "service flows over max_service_flows_per_agent rejected"
            );
        }
        tracing::debug!(
            agent_id = %agent_id,
            full_sync,
            upserts = n_up,
            removals = n_rm,
            flows_known = out.flows_known,
            resync_required = out.resync_required,
            "service flows reported"
        );
        Ok(Response::new(ServiceFlowAck {
            accepted: true,
            resync_required: out.resync_required,
            flows_known: out.flows_known,
        }))
    }

    async fn register_agent(
        &self,
        request: Request<AgentRegistrationRequest>,
    ) -> Result<Response<AgentRegistrationResponse>, Status> {
        let req = request.into_inner();
        if req.agent_id.trim().is_empty() {
            return Err(Status::invalid_argument("registration: agent_id is empty"));
        }
        if req.tor_id.trim().is_empty() {
            return Err(Status::invalid_argument(format!(
                "registration of agent {:?}: tor_id is empty",
                req.agent_id
            )));
        }
        if req.rnics.is_empty() {
            return Err(Status::invalid_argument(format!(
                "registration of agent {:?} has no RNICs",
                req.agent_id
            )));
        }
        let mut rnics: Vec<RnicRecord> = Vec::with_capacity(req.rnics.len());
        for r in &req.rnics {
            let gid = normalize_gid(&r.gid).map_err(|e| {
                Status::invalid_argument(format!("registration of agent {:?}: {e}", req.agent_id))
            })?;
            if rnics.iter().any(|x| x.gid == gid) {
                return Err(Status::invalid_argument(format!(
                    "registration of agent {:?}: duplicate GID {gid}",
                    req.agent_id
                )));
            }
            rnics.push(RnicRecord {
                gid,
                qpn: r.qpn,
                ip_address: r.ip_address.clone(),
                host_name: if r.host_name.is_empty() {
                    req.hostname.clone()
                } else {
                    r.host_name.clone()
                },
                // RNICs inherit the agent's ToR unless they name their own (multi-rail).
                tor_id: if r.tor_id.is_empty() {
                    req.tor_id.clone()
                } else {
                    r.tor_id.clone()
                },
                device_name: r.device_name.clone(),
                agent_id: req.agent_id.clone(),
                last_updated: 0,
            });
        }
        let agent = AgentRecord {
            agent_id: req.agent_id.clone(),
            agent_ip: req.agent_ip.clone(),
            hostname: req.hostname.clone(),
            tor_id: req.tor_id.clone(),
            last_updated: 0,
        };
        let now = self.0.liveness_now_sec();
        self.0
            .registry
            .register_agent(&agent, &rnics, now)
            .map_err(store_err)?;
        self.0
            .note_agent_version(&agent.agent_id, &req.agent_version);
        tracing::info!(agent_id = %agent.agent_id, tor_id = %agent.tor_id, rnics = rnics.len(), "agent registered");
        Ok(Response::new(AgentRegistrationResponse {
            success: true,
            message: format!(
                "registered {} RNIC(s) for agent {}",
                rnics.len(),
                agent.agent_id
            ),
            heartbeat_interval_sec: heartbeat_interval_sec(self.0.pinglist.active_threshold_sec),
        }))
    }

    async fn get_pinglist(
        &self,
        request: Request<PinglistRequest>,
    ) -> Result<Response<PinglistResponse>, Status> {
        let req = request.into_inner();
        let ty = PinglistType::try_from(req.r#type).map_err(|_| {
            Status::invalid_argument(format!("unknown pinglist type {}", req.r#type))
        })?;
        let requester = if req.requester_gid.is_empty() {
            None
        } else {
            Some(gid_arg("requester_gid", &req.requester_gid)?)
        };
        let st = &self.0;
        let now = st.liveness_now_sec();
        let idx = st.registry.index();
        if !req.agent_id.is_empty() && idx.agent(&req.agent_id).is_none() {
            return Err(Status::not_found(format!(
                "agent {:?} is not registered",
                req.agent_id
            )));
        }
        let (tor, exclude): (String, Vec<&str>) = match &requester {
            Some(g) => {
                let r = idx.rnic(g).ok_or_else(|| {
                    Status::not_found(format!("requester GID {g} is not registered"))
                })?;
                (r.tor_id.clone(), vec![g.as_str()])
            }
            None if !req.agent_id.is_empty() => {
                let a = idx.agent(&req.agent_id).expect("checked above");
                (
                    a.tor_id.clone(),
                    idx.agent_gids(&req.agent_id)
                        .iter()
                        .map(String::as_str)
                        .collect(),
                )
            }
            None => {
                return Err(Status::invalid_argument(
                    "pinglist request names neither requester_gid nor agent_id",
                ))
            }
        };
        let requester_key = requester.as_deref().unwrap_or(&req.agent_id);
        let mut rng = st.request_rng(requester_key, ty);
        let targets = match ty {
            PinglistType::TorMesh => {
                pinglist::tor_mesh(&idx, &tor, &exclude, requester_key, now, &st.pinglist)
            }
            PinglistType::InterTor => {
                pinglist::inter_tor(&idx, &tor, requester_key, now, &st.pinglist, &mut rng)
            }
            PinglistType::Focus => {
                let f = st.focus.lock().unwrap_or_else(|e| e.into_inner());
                exclude
                    .iter()
                    .flat_map(|g| f.targets_for(g).iter().cloned())
                    .collect()
            }
            PinglistType::Service => {
                let sources: Vec<&str> = match &requester {
                    Some(g) => vec![g.as_str()],
                    None => exclude.clone(),
                };
                let now_ns = st.now_ns();
                let table = st.service_table();
                let mut out = Vec::new();
                for g in sources {
                    let Some(owner) = idx.rnic(g).map(|r| r.agent_id.as_str()) else {
                        continue;
                    };
                    out.extend(table.pinglist(
                        &idx,
                        owner,
                        g,
                        now_ns,
                        st.pinglist.active_threshold_sec,
                    ));
                }
                out
            }
        };
        let owner = match &requester {
            Some(g) => idx.rnic(g).map(|r| r.agent_id.clone()),
            None => Some(req.agent_id.clone()),
        };
        drop(idx);
        if let Some(agent) = owner {
            st.note_alive(&agent);
        }
        Ok(Response::new(PinglistResponse {
            targets,
            r#type: ty as i32,
        }))
    }

    async fn report_probe_analysis(
        &self,
        request: Request<ProbeAnalysisReport>,
    ) -> Result<Response<ProbeAnalysisAck>, Status> {
        let req = request.into_inner();
        let st = &self.0;
        st.note_alive(&req.agent_id);
        if let Some(ack) = st.forward_to_leader(&req).await {
            return Ok(Response::new(ack));
        }
        let Some(analyzer) = &st.analyzer else {
            return Ok(Response::new(ProbeAnalysisAck {
                accepted: false,
                sla_violations: 0,
                focus_generation: 0,
            }));
        };
        let total = req.summaries.len();
        let mut batch: Vec<PathSummary> = Vec::with_capacity(total);
        let mut first_bad: Option<String> = None;
        for mut s in req.summaries {
            let ok_src = normalize_in_place(&mut s.source_gid);
            let ok_dst = normalize_in_place(&mut s.target_gid);
            if ok_src && ok_dst {
                batch.push(s);
            } else if first_bad.is_none() {
                first_bad = Some(if ok_src { s.target_gid } else { s.source_gid });
            }
        }
        let dropped = total - batch.len();
        let now_ns = st.now_ns();
        let report = analyzer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ingest(batch, now_ns);
        st.metrics.summaries_ingested(report.ingested as u64);
        let has_service = report
            .violations
            .iter()
            .any(|v| v.summary.pinglist_type == PinglistType::Service as i32);
        // Agent-supplied names become metric attributes only when the table hands them out.
        let table = has_service.then(|| st.service_table());
        for v in &report.violations {
            let s = &v.summary;
            let service = match &table {
                Some(t) if s.pinglist_type == PinglistType::Service as i32 => {
                    Some(if t.is_known_service(&s.service) {
                        s.service.as_str()
                    } else {
                        OTHER_SERVICE
                    })
                }
                _ => None,
            };
            st.metrics
                .violation(&s.source_tor_id, &s.target_tor_id, v.kind, service);
            tracing::warn!(
                kind = v.kind.as_str(),
                source_gid = %s.source_gid,
                target_gid = %s.target_gid,
                source_tor = %s.source_tor_id,
                target_tor = %s.target_tor_id,
                window_start_unix_ns = s.window_start_unix_ns,
                probe_total = s.probe_total,
                probe_failed = s.probe_failed,
                network_rtt_p99_ns = s.network_rtt_p99_ns,
                service = %s.service,
                "SLA violation"
            );
        }
        drop(table);
        if dropped > 0 {
            st.dropped_summaries
                .fetch_add(dropped as u64, Ordering::Relaxed);
            tracing::warn!(
                agent_id = %req.agent_id,
                dropped,
                example_gid = ?first_bad.unwrap_or_default(),
                "dropped path summaries with invalid GIDs"
            );
        }
        Ok(Response::new(ProbeAnalysisAck {
            accepted: dropped == 0 || report.ingested > 0,
            sla_violations: report.violations.len() as u32,
            focus_generation: st.focus_generation(),
        }))
    }
}

fn optional_gid(field: &str, text: &str) -> Result<String, Status> {
    if text.is_empty() {
        Ok(String::new())
    } else {
        gid_arg(field, text)
    }
}

#[tonic::async_trait]
impl OperatorService for OperatorSvc {
    type WatchFindingsStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<FindingEvent, Status>> + Send>>;

    async fn list_hosts(
        &self,
        request: Request<ListHostsRequest>,
    ) -> Result<Response<ListHostsResponse>, Status> {
        let hosts = self.0.hosts(request.into_inner().problems_only);
        Ok(Response::new(ListHostsResponse { hosts }))
    }

    async fn get_host(
        &self,
        request: Request<GetHostRequest>,
    ) -> Result<Response<HostHealth>, Status> {
        let name = request.into_inner().hostname;
        self.0
            .host(&name)
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("host {name:?} has sent no Hostping report")))
    }

    async fn list_findings(
        &self,
        request: Request<ListFindingsRequest>,
    ) -> Result<Response<ListFindingsResponse>, Status> {
        let req = request.into_inner();
        let findings = self.0.findings(req.resolved_limit as usize, &req.kind)?;
        Ok(Response::new(ListFindingsResponse { findings }))
    }

    /// One "snapshot" event per current finding, then the live changes. What the server
    /// holds per subscriber is bounded by [`FINDINGS_CHANNEL_CAPACITY`]: a subscriber
    /// that falls further behind gets DATA_LOSS (which ends the call; calling again gives
    /// a fresh snapshot), never an unbounded buffer.
    async fn watch_findings(
        &self,
        request: Request<WatchFindingsRequest>,
    ) -> Result<Response<Self::WatchFindingsStream>, Status> {
        let kind = request.into_inner().kind;
        let mut stopping = self.0.stopping.subscribe();
        if *stopping.borrow_and_update() {
            return Err(shutting_down());
        }
        let (snapshot, mut changes) = self.0.watch_findings(&kind)?;
        // A small hand-off to the response: what waits for a slow client is the broadcast
        // receiver's backlog, bounded by the channel's capacity.
        let (tx, rx) = mpsc::channel::<Result<FindingEvent, Status>>(16);
        tokio::spawn(async move {
            for f in snapshot {
                let e = FindingEvent {
                    change: "snapshot".into(),
                    finding: Some(f),
                };
                if !forward(&tx, &mut stopping, Ok(e)).await {
                    return;
                }
            }
            loop {
                let next = tokio::select! {
                    r = changes.recv() => r,
                    _ = stopping.changed() => {
                        let _ = tx.try_send(Err(shutting_down()));
                        return;
                    }
                    _ = tx.closed() => return,
                };
                let out = match next {
                    Ok(e) if kind.is_empty() || e.finding.as_ref().is_some_and(|f| f.kind == kind) => {
                        Ok(e)
                    }
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(n)) => Err(Status::data_loss(format!(
                        "WatchFindings: this watcher fell {n} changes behind; call WatchFindings again for a fresh snapshot"
                    ))),
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let last = out.is_err();
                if !forward(&tx, &mut stopping, out).await || last {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
    async fn list_service_paths(
        &self,
        request: Request<ListServicePathsRequest>,
    ) -> Result<Response<ListServicePathsResponse>, Status> {
        let req = request.into_inner();
        let gid = optional_gid("gid", &req.gid)?;
        let paths = self.0.service_paths(&ServicePathFilter {
            service: &req.service,
            gid: &gid,
            source_tor_id: &req.source_tor_id,
            target_tor_id: &req.target_tor_id,
        });
        Ok(Response::new(ListServicePathsResponse { paths }))
    }

    async fn list_paths(
        &self,
        request: Request<ListPathsRequest>,
    ) -> Result<Response<ListPathsResponse>, Status> {
        let req = request.into_inner();
        let source_gid = optional_gid("source_gid", &req.source_gid)?;
        let target_gid = optional_gid("target_gid", &req.target_gid)?;
        let filter = PathFilter {
            source_tor_id: &req.source_tor_id,
            target_tor_id: &req.target_tor_id,
            source_gid: &source_gid,
            target_gid: &target_gid,
        };
        let paths = self.0.paths(&filter, req.all_windows);
        Ok(Response::new(ListPathsResponse { paths }))
    }

    async fn list_tor_pairs(
        &self,
        _request: Request<ListTorPairsRequest>,
    ) -> Result<Response<ListTorPairsResponse>, Status> {
        let pairs = self.0.tor_pairs();
        Ok(Response::new(ListTorPairsResponse { pairs }))
    }

    async fn list_rnics(
        &self,
        request: Request<ListRnicsRequest>,
    ) -> Result<Response<ListRnicsResponse>, Status> {
        let rnics = self.0.rnic_statuses(&request.into_inner().tor_id);
        Ok(Response::new(ListRnicsResponse { rnics }))
    }

    async fn list_violations(
        &self,
        request: Request<ListViolationsRequest>,
    ) -> Result<Response<ListViolationsResponse>, Status> {
        let limit = request.into_inner().limit as usize;
        let violations = match &self.0.analyzer {
            Some(a) => a
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .violations(limit)
                .into_iter()
                .map(|v| ViolationMsg {
                    kind: v.kind.as_str().to_string(),
                    summary: Some(v.summary),
                    detected_unix_ns: v.detected_unix_ns,
                })
                .collect(),
            None => Vec::new(),
        };
        Ok(Response::new(ListViolationsResponse { violations }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized_fast_path() {
        assert!(is_normalized_gid("fe80:0000:0000:0000:0001:0002:0003:0004"));
        assert!(!is_normalized_gid(
            "FE80:0000:0000:0000:0001:0002:0003:0004"
        ));
        assert!(!is_normalized_gid("fe80::1"));
        let mut s = "FE80::1:2:3:4".to_string();
        assert!(normalize_in_place(&mut s));
        assert_eq!(s, "fe80:0000:0000:0000:0001:0002:0003:0004");
        let mut bad = "garbage".to_string();
        assert!(!normalize_in_place(&mut bad));
        assert_eq!(bad, "garbage");
    }
}
